"""Scalar replacement of small static axes: permutations along them become renaming.

An axis of small static size (at most `max_axis` elements, or `cost_axis` where the fused-code
estimate allows; at most `max_pieces` pieces per value, per `backend.cost`) whose values are only
sliced, indexed, combined elementwise and permuted statically is split into separate arrays,
one per position. A static gather, a stack or a concatenate along such an axis then picks
pieces: no equation at all. This derives the hand-written "16 separate
words" form of ChaCha20 from the 4x4-state-and-`jnp.take` form:

    before:  b:u32[N,16] = reshape a ; c:u32[N,16] = gather[perm] b ; d:u32[N,4,4] = reshape c
             e:u32[N,1,4] = slice[row 0] d ; f:u32[N,4] = squeeze e ; g = add f ...
    after:   a0..a15:u32[N] (pieces)  ;  g0 = add a<perm[0]> ... (gather, reshapes, slices gone)

Re-joining (a `stack`) happens only where a consumer needs the whole array (an output, a call,
a reduction); splitting a whole array is `unstack` (slices, free for XLA).

How it decides:
0. Inline: small plain `jit` calls holding a static gather (`jnp.take`'s `_take`, a function
   called 7 times in a loop) are inlined bottom-up, so one region holds the permutations;
   so are small calls whose every equation has a rule (`jnp.where`'s `_where`, a `reduce`),
   at levels that move data along a small axis (`inline_split_calls`).
   If no level is then split, the original program is returned untouched.
1. Link: each rule in `RULES` says which (value, axis) pairs must be split together (an add
   links the same axis of its operands and result; a reshape links the axes it merges; a
   transpose links permuted axes) and which are *seeds* (axes a static gather, stack,
   concatenate or rev moves data along). Links form classes (union-find).
2. Choose: classes holding a seed are split, greedily, while no value exceeds `max_pieces`.
3. Cost: `backend.cost.scalarize_decision` weighs permutations removed vs re-joins added (per
   target), equations after vs before (compile time), the piece size (CPU: a loop per piece), and
   declines where a float value would be used both whole and in pieces (its cotangent would be
   summed in another order); every decline is reported with its reason. With `autotune=True`
   the soft verdicts (piece size, re-joins vs permutations) are checked by compiling both forms
   (`backend.autotune.choose`, `backend.cost.pick_by_counts`); the hard limits
   (`backend.cost.scalarize_limit`) stand. On the CPU the emitted form is measured too
   (`_join_cones`, `backend.cost.join_model`): each re-join's pieces' producer cones, which
   XLA:CPU compiles once per piece, and their paths, which its concatenate fusion computes; a
   re-join that would recompute is kept out of that fusion, and a split whose fused code grows
   past the limit is declined (compile time).
4. Emit: every equation is rebuilt per piece by its rule; an equation without a rule, or whose
   rule cannot use the pieces it is given, gets whole operands (re-joined on demand).

Exactness: pieces are computed by the same primitives on the same elements, so results are
bit-for-bit those of the original. Only primitives that compute each element independently and
exactly (integer, bitwise, comparison, selection, conversion and IEEE-exact float arithmetic)
are split; transcendental floats are boundaries (XLA's vectorised and scalar code paths could
round differently).
"""
from __future__ import annotations

import dataclasses
import math
from typing import Callable, Sequence

import numpy as np

from .. import _compat as C
from ..backend import autotune as _autotune
from ..backend import cost as _cost
from ..backend import mosaic as _mosaic
from ..analysis import exact as _exact
from .. import _walk
from ..analysis.indexmap import decompose, gather_batch_core, gather_source_coords, window_core
from ..analysis.pieces import (Builder, each_piece, literal_like, objarray, rest_positions,
                               rest_shape, shape_of)
from .._memo import array_key, memo
from .._memo import gather_map as memoised_gather_map
from ..report.records import Decline
from . import _segments, _updates

PASS = "scalarize"

_prim = C.lax_primitive

# Computed element by element, exactly, whatever the array around it: safe to split.
ELEMENTWISE = frozenset({
    "add", "sub", "mul", "div", "rem", "max", "min", "neg", "abs", "sign", "sqrt",
    "and", "or", "xor", "not", "shift_left", "shift_right_logical", "shift_right_arithmetic",
    "population_count", "clz", "eq", "ne", "lt", "le", "gt", "ge", "select_n",
    "convert_element_type", "floor", "ceil", "round", "is_finite", "nextafter", "copy", "copy_p",
    "integer_pow", "square", "real", "imag", "conj", "complex", "reduce_precision",
})


# --- rules: links (analysis) and emit (rebuild) ----------------------------------------------------

@dataclasses.dataclass(slots=True)   # (one per equation of a level: kept small and cheap)
class Links:
    groups: list            # lists of nodes (var, axis) that are split together
    seeds: Sequence = ()    # nodes whose split removes a mover
    info: object = None     # passed on to emit (e.g. a gather's source map)


class _NodeFilter:
    """Which (var, axis) may be split; carries what the rules' analyses need (the size limit of
    a static index map, and the rewrite's memo tables)."""

    def __init__(self, costs, limit: int = 1 << 20, cache: dict | None = None):
        self.max_axis = max(costs.max_axis, costs.cost_axis)
        self.limit = limit
        self.cache = cache
        self._axes: dict = {}   # var -> the axes it may be split along (asked once per var)

    def __call__(self, atom, d):
        return (atom, d) if d in self.axes(atom) else None

    def axes(self, atom) -> tuple:
        """The axes `atom` may be split along (none for a literal)."""
        if isinstance(atom, C.Literal):  # (literals are unhashable)
            return ()
        axes = self._axes.get(atom)
        if axes is None:
            axes = self._axes[atom] = self._splittable(atom)
        return axes

    def _splittable(self, var) -> tuple:
        if C.is_dropvar(var):
            return ()
        aval = C.aval_of(var)
        return tuple(d for d, s in enumerate(shape_of(var))
                     if 1 < s <= self.max_axis and not _sharded(aval, d))


def _sharded(aval, d) -> bool:
    """Whether dim `d` is partitioned over a mesh axis: never split (no new cross-device moves)."""
    spec = getattr(getattr(aval, "sharding", None), "spec", None)
    try:
        return spec is not None and d < len(spec) and spec[d] is not None
    except TypeError:
        return False


def _clean(groups):
    out = []
    for g in groups:
        g = [n for n in g if n is not None]
        if len(g) >= 1:
            out.append(g)
    return out


def _full_operands(eqn):
    out_shape = shape_of(eqn.outvars[0])
    return [a for a in eqn.invars if shape_of(a) == out_shape]


def elementwise_links(eqn, node) -> Links | None:
    """add(x, y) links axis d of x, y and the result, for every d."""
    out = eqn.outvars[0]
    shape = shape_of(out)
    full = [out]
    for a in eqn.invars:
        s = shape_of(a)
        if s == shape or _broadcasts(s, shape):
            full.append(a)
        elif s != ():
            return None
    if eqn.primitive.name == "bitcast_convert_type" and shape_of(eqn.invars[0]) != shape:
        return None
    if not shape:  # rank 0 (e.g. the pieces of an already split level): no axis to link
        return Links([])
    axes = node.axes
    groups = []
    for d in range(len(shape)):
        # (an operand of size 1 along d is broadcast there: a piece of it serves every piece)
        g = [(a, d) for a in full if d in axes(a) and shape_of(a)[d] == shape[d]]
        if g:
            groups.append(g)
    return Links(groups)


def _broadcasts(s: tuple, shape: tuple) -> bool:
    """Whether an operand of shape `s` is broadcast along its size-1 dims to `shape` (what
    `vmap` makes of an unbatched per-lane table: `x << ROT` with ROT of shape (1, 25))."""
    return len(s) == len(shape) and all(a == b or a == 1 for a, b in zip(s, shape))


def elementwise_emit(b: Builder, eqn, info):
    """add(x, y) → add(x_i, y_i) for each piece i (rank-0 operands shared); a select whose
    predicate piece is one constant is that case's piece (a static update's select form along a
    split axis: renaming)."""
    out = eqn.outvars[0]
    axes = b.chosen.get(out, ())
    shape = shape_of(out)
    ins = [b.get_parts(a, axes) if shape_of(a) == shape and shape != () else None
           for a in eqn.invars]
    wide = {k: _broadcast_operand(b, a, axes, shape) for k, a in enumerate(eqn.invars)
            if ins[k] is None and shape_of(a) != () and shape_of(a) != shape}
    select = eqn.primitive.name == "select_n"

    def piece(idx):
        atoms = [p[idx] if p is not None else a for p, a in zip(ins, eqn.invars)]
        for k, pick in wide.items():
            atoms[k] = pick(idx)
        if select and (case := b.uniform(atoms[0])) is not None:
            return atoms[1 + int(case)]
        return b.bind1(eqn.primitive, atoms, **eqn.params)
    return [(axes, each_piece([shape[d] for d in axes], piece))]


def _broadcast_operand(b: Builder, a, axes, shape) -> Callable:
    """Piece `idx` (over the result's split `axes`) of an operand broadcast along its size-1
    dims: its own piece where it has the axis, itself where it is broadcast; a constant piece
    of one value is a scalar literal.

        before:  y:u64[N,25] = shift_left x r        (r: u64[1,25] literal, x split along 1)
        after:   y_i:u64[N] = shift_left x_i r[0,i]  (r[0,i]: u64[] literal)
    """
    sa = shape_of(a)
    own = tuple(d for d in axes if sa[d] == shape[d])
    P = b.get_parts(a, own)
    at = [axes.index(d) for d in own]
    rest = rest_shape(sa, axes)

    def pick(idx):
        p = b.reshape(P[tuple(idx[k] for k in at)], rest)
        if C.is_literal(p) and (v := b.uniform(p)) is not None:
            return literal_like(np.asarray(v), C.aval_of(p))
        return p
    return pick


def slice_links(eqn, node):
    x, = eqn.invars
    return Links(_clean([[node(x, d), node(eqn.outvars[0], d)] for d in range(len(shape_of(x)))]))


def slice_emit(b: Builder, eqn, info):
    """slice[rows 1:3](x) with rows split → pieces x_1, x_2 (renaming); other dims per piece."""
    x, = eqn.invars
    # a literal operand (a constant table: fold's) is cut along its result's axes, the same ones
    axes = b.chosen.get(eqn.outvars[0] if C.is_literal(x) else x, ())
    shape = shape_of(x)
    start = eqn.params["start_indices"]
    limit = eqn.params["limit_indices"]
    strides = eqn.params["strides"] or (1,) * len(shape)
    P = b.get_parts(x, axes)
    if axes:  # (indexing a 0-d object array by () would return its atom, not an array)
        P = P[tuple(slice(start[d], limit[d], strides[d]) for d in axes)]
    rest = [d for d in range(len(shape)) if d not in axes]
    full = all(start[d] == 0 and limit[d] == shape[d] and strides[d] == 1 for d in rest)
    Q = each_piece(P.shape, lambda idx: P[idx] if full else b.bind1(
        eqn.primitive, [P[idx]],
        start_indices=tuple(start[d] for d in rest),
        limit_indices=tuple(limit[d] for d in rest),
        strides=tuple(strides[d] for d in rest) if eqn.params["strides"] else None))
    return [(axes, Q)]


def squeeze_links(eqn, node):
    x, = eqn.invars
    out = eqn.outvars[0]
    dims = set(eqn.params["dimensions"])
    kept = [d for d in range(len(shape_of(x))) if d not in dims]
    return Links(_clean([[node(x, d), node(out, j)] for j, d in enumerate(kept)]))


def squeeze_emit(b: Builder, eqn, info):
    """squeeze(x) with x split → squeeze(x_i) (a reshape per piece; renaming when rank-1 → 0)."""
    x, = eqn.invars
    out = eqn.outvars[0]
    dims = set(eqn.params["dimensions"])
    kept = [d for d in range(len(shape_of(x))) if d not in dims]
    out_axes = b.chosen.get(out, ())
    in_axes = tuple(kept[j] for j in out_axes)
    P = b.get_parts(x, in_axes)
    rest_out = rest_shape(shape_of(out), out_axes)
    return [(out_axes, each_piece(P.shape, lambda idx: b.reshape(P[idx], rest_out)))]


def _reshape_regions(in_shape, out_shape):
    """(prefix, suffix) lengths of dims a row-major reshape leaves as they are."""
    p = 0
    while p < min(len(in_shape), len(out_shape)) and in_shape[p] == out_shape[p]:
        p += 1
    s = 0
    while (s < min(len(in_shape), len(out_shape)) - p
           and in_shape[len(in_shape) - 1 - s] == out_shape[len(out_shape) - 1 - s]):
        s += 1
    return p, s


def reshape_links(eqn, node):
    """reshape (N,4,4) → (N,16): the merged axes 4,4 and 16 are split together."""
    if eqn.params.get("dimensions") is not None:
        return None
    x, = eqn.invars
    out = eqn.outvars[0]
    ins, outs = shape_of(x), shape_of(out)
    p, s = _reshape_regions(ins, outs)
    groups = [[node(x, d), node(out, d)] for d in range(p)]
    groups += [[node(x, len(ins) - 1 - k), node(out, len(outs) - 1 - k)] for k in range(s)]
    mid_in = [d for d in range(p, len(ins) - s) if ins[d] > 1]
    mid_out = [d for d in range(p, len(outs) - s) if outs[d] > 1]
    mid = [node(x, d) for d in mid_in] + [node(out, d) for d in mid_out]
    if mid and all(n is not None for n in mid):
        groups.append(mid)
    return Links(_clean(groups), info=(p, s))


def reshape_emit(b: Builder, eqn, info):
    x, = eqn.invars
    out = eqn.outvars[0]
    ins, outs = shape_of(x), shape_of(out)
    p, s = info
    out_axes = b.chosen.get(out, ())
    mid_in = [d for d in range(p, len(ins) - s) if ins[d] > 1]
    mid_out = [d for d in range(p, len(outs) - s) if outs[d] > 1]
    mid_split = [d for d in out_axes if p <= d < len(outs) - s]
    if mid_split and mid_split != mid_out:
        return None
    shift = len(ins) - len(outs)
    in_axes = tuple([d for d in out_axes if d < p] + (mid_in if mid_split else [])
                    + [d + shift for d in out_axes if d >= len(outs) - s])
    P = b.get_parts(x, in_axes)
    Q = P.reshape([outs[d] for d in out_axes])
    rest_out = rest_shape(outs, out_axes)
    return [(out_axes, each_piece(Q.shape, lambda idx: b.reshape(Q[idx], rest_out)))]


def broadcast_links(eqn, node):
    x, = eqn.invars
    out = eqn.outvars[0]
    if not C.replicated(eqn.params.get("sharding")):
        return None
    bd = eqn.params["broadcast_dimensions"]
    xs, os_ = shape_of(x), shape_of(out)
    return Links(_clean([[node(x, i), node(out, bd[i])] for i in range(len(xs))
                         if xs[i] == os_[bd[i]]]))


def broadcast_emit(b: Builder, eqn, info):
    """broadcast_in_dim(x) with x split → broadcast_in_dim(x_i); new axes repeat a piece."""
    x, = eqn.invars
    out = eqn.outvars[0]
    if not C.replicated(eqn.params.get("sharding")):
        return None
    bd = eqn.params["broadcast_dimensions"]
    xs, os_ = shape_of(x), shape_of(out)
    out_axes = b.chosen.get(out, ())
    in_axes = tuple(i for i in range(len(xs)) if bd[i] in out_axes and xs[i] == os_[bd[i]])
    P = b.get_parts(x, in_axes)
    opos = rest_positions(len(os_), out_axes)
    keep = [i for i in range(len(xs)) if i not in in_axes and bd[i] not in out_axes]
    squeeze_to = tuple(xs[i] for i in keep)
    rest_out = rest_shape(os_, out_axes)
    Q = objarray([os_[d] for d in out_axes])
    for idx in np.ndindex(Q.shape):
        at = dict(zip(out_axes, idx))
        piece = P[tuple(at[bd[i]] for i in in_axes)]
        piece = b.reshape(piece, squeeze_to)
        dims = tuple(opos[bd[i]] for i in keep)
        if squeeze_to == rest_out:
            Q[idx] = piece
        else:
            Q[idx] = b.bind1(eqn.primitive, [piece], shape=rest_out, broadcast_dimensions=dims,
                             sharding=None)
    return [(out_axes, Q)]


def concatenate_links(eqn, node):
    out = eqn.outvars[0]
    dim = eqn.params["dimension"]
    groups = [[node(out, d)] + [node(a, d) for a in eqn.invars] for d in range(len(shape_of(out)))]
    seeds = [node(out, dim)] if node(out, dim) is not None else []
    return Links(_clean(groups), seeds=seeds)


def concatenate_emit(b: Builder, eqn, info):
    """concatenate[d](x, y) with d split → the pieces of x then y (renaming)."""
    out = eqn.outvars[0]
    dim = eqn.params["dimension"]
    axes = b.chosen.get(out, ())
    Ps = [b.get_parts(a, axes) for a in eqn.invars]
    if dim in axes:
        return [(axes, np.concatenate(Ps, axis=axes.index(dim)))]
    pos = rest_positions(len(shape_of(out)), axes)[dim]
    return [(axes, each_piece(Ps[0].shape, lambda idx: b.bind1(
        eqn.primitive, [P[idx] for P in Ps], dimension=pos)))]


def stack_links(eqn, node):
    out = eqn.outvars[0]
    axis = eqn.params["axis"]
    r = len(shape_of(out))
    groups = [[node(out, d)] + [node(a, d if d < axis else d - 1) for a in eqn.invars]
              for d in range(r) if d != axis]
    groups.append([node(out, axis)])
    return Links(_clean(groups), seeds=[n for n in [node(out, axis)] if n is not None])


def stack_emit(b: Builder, eqn, info):
    """stack[axis](a, b, c) with axis split → pieces a, b, c (renaming)."""
    out = eqn.outvars[0]
    axis = eqn.params["axis"]
    out_axes = b.chosen.get(out, ())
    in_axes = tuple(d if d < axis else d - 1 for d in out_axes if d != axis)
    Ps = [b.get_parts(a, in_axes) for a in eqn.invars]
    if axis in out_axes:
        return [(out_axes, np.stack(Ps, axis=out_axes.index(axis)))]
    pos = rest_positions(len(shape_of(out)), out_axes)[axis]
    return [(out_axes, each_piece(Ps[0].shape, lambda idx: b.bind1(
        eqn.primitive, [P[idx] for P in Ps], axis=pos)))]


def transpose_links(eqn, node):
    x, = eqn.invars
    out = eqn.outvars[0]
    perm = eqn.params["permutation"]
    return Links(_clean([[node(out, j), node(x, perm[j])] for j in range(len(perm))]))


def transpose_emit(b: Builder, eqn, info):
    """transpose(x) with x split → the pieces reordered (renaming); rest dims per piece."""
    x, = eqn.invars
    out = eqn.outvars[0]
    perm = eqn.params["permutation"]
    out_axes = b.chosen.get(out, ())
    in_axes = tuple(sorted(perm[j] for j in out_axes))
    P = b.get_parts(x, in_axes)
    P = np.transpose(P, [in_axes.index(perm[j]) for j in out_axes]) if P.ndim else P
    ipos = rest_positions(len(perm), in_axes)
    rest_perm = tuple(ipos[perm[j]] for j in range(len(perm)) if j not in out_axes)
    same = rest_perm == tuple(range(len(rest_perm)))
    return [(out_axes, each_piece(P.shape, lambda idx: P[idx] if same else b.bind1(
        eqn.primitive, [P[idx]], permutation=rest_perm)))]


def rev_links(eqn, node):
    x, = eqn.invars
    out = eqn.outvars[0]
    seeds = [node(out, d) for d in eqn.params["dimensions"]]
    return Links(_clean([[node(x, d), node(out, d)] for d in range(len(shape_of(x)))]),
                 seeds=[n for n in seeds if n is not None])


def rev_emit(b: Builder, eqn, info):
    """rev[d](x) with d split → pieces in reverse order (renaming); other dims per piece."""
    x, = eqn.invars
    out = eqn.outvars[0]
    axes = b.chosen.get(out, ())
    dims = eqn.params["dimensions"]
    P = b.get_parts(x, axes)
    if axes:  # (as in slice_emit: a 0-d object array stays an array)
        P = P[tuple(slice(None, None, -1) if d in dims else slice(None) for d in axes)]
    pos = rest_positions(len(shape_of(x)), axes)
    rest = tuple(pos[d] for d in dims if d not in axes)
    return [(axes, each_piece(P.shape, lambda idx: b.bind1(
        eqn.primitive, [P[idx]], dimensions=rest) if rest else P[idx]))]


@dataclasses.dataclass
class _GatherInfo:
    coords: list          # operand coordinate of each output element, per operand dim
    valid: np.ndarray     # False where the output takes the fill value
    xs: tuple             # operand shape of the map (wide window dims shrunk to 1)
    os: tuple             # output shape of the map (likewise)
    wide: dict            # operand dim → output dim, taken whole by every window, not mapped


def gather_links(eqn, node):
    """A gather with literal indices: passthrough dims link 1:1; moved dims are one seed group."""
    x, idx = eqn.invars
    if not C.is_literal(idx):
        return None
    out = eqn.outvars[0]
    dn, ss, mode = eqn.params["dimension_numbers"], eqn.params["slice_sizes"], eqn.params["mode"]
    # a batch read row for row with one table (a vmapped gather) passes through, as the dims
    # every window takes whole do: the map is one row's
    rows, xs, idx_val = gather_batch_core(shape_of(x), np.asarray(C.literal_value(idx)), dn, ss,
                                          node.max_axis)
    wide, xs, ss = window_core(xs, dn, ss, node.max_axis)
    wide = {**rows, **wide}
    os_ = tuple(1 if j in wide.values() else s for j, s in enumerate(shape_of(out)))
    if math.prod(os_) > node.limit or math.prod(os_) == 0:
        return None
    try:
        coords, valid, pairs = memo(node.cache, "scalarize.gather_pairs",
                                    (xs, os_, array_key(idx_val), dn, ss, mode),
                                    lambda: _gather_pairs(xs, os_, memoised_gather_map(
                                        node.cache, xs, idx_val, dn, ss, mode)))
    except Decline:
        return None
    paired_in = {o for o, _ in pairs}
    used_out = {j for _, j in pairs}
    moved = ([node(x, o) for o in range(len(xs)) if o not in paired_in and xs[o] > 1]
             + [node(out, j) for j in range(len(os_)) if j not in used_out and os_[j] > 1])
    groups = [[node(x, o), node(out, j)] for o, j in pairs]
    seeds = []
    if moved and all(n is not None for n in moved):
        groups.append(moved)
        seeds = [moved[-1]]
    return Links(_clean(groups), seeds=seeds, info=_GatherInfo(coords, valid, xs, os_, wide))


def _gather_pairs(xs, os_, M):
    """(source coords, valid mask, passthrough (operand dim, output dim) pairs) of a static
    gather of source map `M`: a pure function of shapes, params and index values (memoised by
    the caller)."""
    coords = gather_source_coords(xs, M)
    valid = M >= 0
    pairs, used_out = [], set()
    for o in range(len(xs)):
        for j in range(len(os_)):
            if j in used_out or xs[o] != os_[j]:
                continue
            io = np.arange(os_[j]).reshape([-1 if k == j else 1 for k in range(len(os_))])
            if np.all((coords[o] == io) | ~valid):
                pairs.append((o, j))
                used_out.add(j)
                break
    return coords, valid, tuple(pairs)


def gather_emit(b: Builder, eqn, info: _GatherInfo):
    """gather[static map](x) with the moved axes split → the pieces it picks (renaming).

    Each output piece must be one operand piece, element for element (or all fill).
    """
    x, _ = eqn.invars
    out = eqn.outvars[0]
    xs, os_ = info.xs, info.os
    B = b.chosen.get(out, ())
    if not B or any(j in info.wide.values() for j in B):
        return None
    R = [j for j in range(len(os_)) if j not in B]
    at0 = tuple(slice(None) if j in B else slice(0, 1) for j in range(len(os_)))
    valid, coords = info.valid, info.coords
    if not np.all(valid == valid[at0]):
        return None
    A = tuple(o for o in range(len(xs)) if xs[o] > 1 and np.all(
        (coords[o] == coords[o][at0]) | ~valid))
    Q_in = [o for o in range(len(xs)) if o not in A and xs[o] > 1]
    R_out = [j for j in R if os_[j] > 1]
    if len(Q_in) != len(R_out):
        return None
    for o, j in zip(Q_in, R_out):
        io = np.arange(os_[j]).reshape([-1 if k == j else 1 for k in range(len(os_))])
        if xs[o] != os_[j] or not np.all((coords[o] == io) | ~valid):
            return None
    order = sorted(list(zip(Q_in, R_out)) + list(info.wide.items()))
    if [j for _, j in order] != sorted(j for _, j in order):
        return None  # the rest dims would come out transposed
    P = b.get_parts(x, A)
    rest_out = rest_shape(shape_of(out), B)
    Qo = objarray([os_[j] for j in B])
    zero = tuple(0 if j not in B else None for j in range(len(os_)))
    for pidx in np.ndindex(Qo.shape):
        at = list(zero)
        for j, i in zip(B, pidx):
            at[j] = i
        at = tuple(at)
        if not valid[at]:
            fill = eqn.params.get("fill_value")
            if fill is None:
                return None
            lit = literal_like(np.full((), fill, dtype=C.aval_of(out).dtype), C.aval_of(out))
            Qo[pidx] = b.bind1(_prim("broadcast_in_dim"), [lit], shape=rest_out,
                               broadcast_dimensions=(), sharding=None) if rest_out else lit
            continue
        src = tuple(int(coords[o][at]) for o in A)
        Qo[pidx] = b.reshape(P[src], rest_out)
    return [(B, Qo)]


# Reductions whose pieces combine exactly in any order (integers and booleans): reduce -> the
# binary primitive that combines two partial results.
REDUCES = {"reduce_xor": "xor", "reduce_and": "and", "reduce_or": "or", "reduce_max": "max",
           "reduce_min": "min", "reduce_sum": "add", "reduce_prod": "mul"}


def _reduce_exact(eqn) -> bool:
    dt = C.aval_of(eqn.invars[0]).dtype
    return np.dtype(dt).kind in "iub"


def reduce_links(eqn, node):
    """reduce_xor[axes](x): the kept dims link x and the result; a reduced dim split elsewhere
    (x's producer) is combined piece by piece (integers: any order gives the same bits)."""
    if not _reduce_exact(eqn):
        return None
    x, = eqn.invars
    out = eqn.outvars[0]
    red = set(int(d) for d in eqn.params["axes"])
    kept = [d for d in range(len(shape_of(x))) if d not in red]
    return Links(_clean([[node(x, d), node(out, j)] for j, d in enumerate(kept)]))


def reduce_emit(b: Builder, eqn, info):
    """reduce_xor[axes=(2,)](x) with x split along 1 and 2 →
    per kept piece i: x_i0 ^ x_i1 ^ x_i2 ^ x_i3 ^ x_i4 (the reduced pieces combined);
    reduced dims that are not split are reduced in each piece first."""
    x, = eqn.invars
    out = eqn.outvars[0]
    xs = shape_of(x)
    red = sorted(set(int(d) for d in eqn.params["axes"]))
    kept = [d for d in range(len(xs)) if d not in red]
    out_axes = b.chosen.get(out, ())
    red_split = [] if C.is_literal(x) else [d for d in b.chosen.get(x, ()) if d in red]
    in_axes = tuple(sorted([kept[j] for j in out_axes] + red_split))
    P = b.get_parts(x, in_axes)
    pos = rest_positions(len(xs), in_axes)
    inner = tuple(pos[d] for d in red if d not in red_split)
    combine = _prim(REDUCES[eqn.primitive.name])
    rest_out = rest_shape(shape_of(out), out_axes)

    def piece(idx):
        at = dict(zip((kept[j] for j in out_axes), idx))
        acc = None
        for ridx in np.ndindex(*[xs[d] for d in red_split]):
            at.update(zip(red_split, ridx))
            p = P[tuple(at[d] for d in in_axes)]
            if inner:
                p = b.bind1(eqn.primitive, [p], **{**eqn.params, "axes": inner})
            acc = p if acc is None else b.bind1(combine, [acc, p])
        return b.reshape(acc, rest_out)
    return [(out_axes, each_piece([shape_of(out)[d] for d in out_axes], piece))]


@dataclasses.dataclass(frozen=True)
class Rule:
    links: Callable
    emit: Callable
    mover: bool = False     # the equation is data movement that splitting turns into renaming
    moves: bool = False     # data movement: along split axes it is renaming (no equation)


RULES: dict[str, Rule] = {
    **{name: Rule(elementwise_links, elementwise_emit) for name in ELEMENTWISE},
    "slice": Rule(slice_links, slice_emit, moves=True),
    "squeeze": Rule(squeeze_links, squeeze_emit, moves=True),
    "reshape": Rule(reshape_links, reshape_emit, moves=True),
    "broadcast_in_dim": Rule(broadcast_links, broadcast_emit, moves=True),
    "concatenate": Rule(concatenate_links, concatenate_emit, mover=True),
    "stack": Rule(stack_links, stack_emit, mover=True),
    "transpose": Rule(transpose_links, transpose_emit, moves=True),
    "rev": Rule(rev_links, rev_emit, mover=True),
    "gather": Rule(gather_links, gather_emit, mover=True),
    **{name: Rule(reduce_links, reduce_emit) for name in REDUCES},
}


# --- analysis -----------------------------------------------------------------------------------

class _UnionFind:
    def __init__(self):
        self.parent: dict = {}

    def find(self, n):
        p = self.parent.setdefault(n, n)
        while p != n:
            self.parent[n] = self.parent.setdefault(p, p)
            n, p = p, self.parent[p]
        return n

    def union(self, nodes):
        nodes = list(nodes)
        r = self.find(nodes[0])
        for n in nodes[1:]:
            q = self.find(n)
            if q != r:
                self.parent[q] = r


@dataclasses.dataclass
class Analysis:
    chosen: dict            # var → split axes
    links: dict             # eqn index → Links
    plan: _cost.ScalarizePlan | None


def analyse(jaxpr, costs, limit, cache: dict | None = None) -> Analysis:
    # Only a mover can seed a split: a level without one (most levels, and every level a
    # previous round left with nothing to split) is done without linking its equations.
    if not any((r := RULES.get(e.primitive.name)) is not None and r.mover for e in jaxpr.eqns):
        return Analysis({}, {}, None)
    node = _NodeFilter(costs, limit, cache)
    uf = _UnionFind()
    union = uf.union
    links, seeds = {}, []
    get_rule = RULES.get
    for i, eqn in enumerate(jaxpr.eqns):
        rule = get_rule(eqn.primitive.name)
        if rule is None or eqn.effects:
            continue
        lk = rule.links(eqn, node)
        if lk is None:
            continue
        links[i] = lk
        for g in lk.groups:
            if len(g) > 1:  # a group of one links nothing
                union(g)
        seeds.extend(lk.seeds)
    members: dict = {}
    for g in (g for lk in links.values() for g in lk.groups if len(g) == 1):
        uf.find(g[0])  # lone nodes are components of their own
    for n in list(uf.parent):
        members.setdefault(uf.find(n), []).append(n)
    accepted, rejected, pieces = set(), set(), {}
    for s in seeds:
        r = uf.find(s)
        if r in accepted or r in rejected:
            continue  # (pieces only grow: a class too big once stays too big)
        grow: dict = {}
        for var, d in members[r]:
            grow[var] = grow.get(var, 1) * shape_of(var)[d]
        if all(pieces.get(v, 1) * g <= costs.max_pieces for v, g in grow.items()):
            accepted.add(r)
            for v, g in grow.items():
                pieces[v] = pieces.get(v, 1) * g
        else:
            rejected.add(r)
    chosen: dict = {}
    for r in accepted:
        for var, d in members[r]:
            chosen.setdefault(var, set()).add(d)
    chosen = {v: tuple(sorted(a)) for v, a in chosen.items()}
    if not chosen:
        return Analysis({}, links, None)
    return Analysis(chosen, links, _plan(jaxpr, chosen, links))


def largest_piece(jaxpr, costs) -> int:
    """The biggest piece any split of this level could make (0: none can split).

    Every split class holds a seed: an axis of 2..`max_axis` (or `cost_axis`) elements of a mover's operand or
    result (`Links.seeds`). That value is cut at least along it, so every split makes a piece
    no bigger than the value's size over its smallest such axis.
    """
    best = 0
    Lit, Drop = C.Literal, C.DropVar
    for eqn in jaxpr.eqns:
        rule = RULES.get(eqn.primitive.name)
        if rule is None or not rule.mover:
            continue
        for v in (*eqn.invars, *eqn.outvars):
            if isinstance(v, (Lit, Drop)):
                continue
            shape = shape_of(v)
            axes = [s for s in shape if 1 < s <= max(costs.max_axis, costs.cost_axis)]
            if axes:
                best = max(best, math.prod(shape) // min(axes))
    return best


def _plan(jaxpr, chosen, links) -> _cost.ScalarizePlan:
    """Count what splitting would do. A mover counts as removed only if pieces flow through it
    (its result is used in pieces, or its operand is computed in pieces): a stack of whole values
    whose result goes on whole is a re-join, not a permutation. A value used both whole and in
    pieces is `mixed` (its cotangent would be summed in another order)."""
    after = 0
    split_eqns = []          # (ins, outs, kind) with kind 'mover', 'moves' or 'compute'
    piece_use, whole_use = set(), set()
    Lit, Drop = C.Literal, C.DropVar   # (isinstance inline: this loop sees every equation)
    # how many pieces each split value is cut into
    npieces = {v: math.prod([shape_of(v)[d] for d in a]) for v, a in chosen.items()}
    eqns = jaxpr.eqns
    for i, eqn in enumerate(eqns):
        ins = [a for a in eqn.invars if not isinstance(a, Lit)]
        if i not in links:
            after += 1
            whole_use.update(ins)
            continue
        outs = [v for v in eqn.outvars if not isinstance(v, Drop)]
        out_split = any(v in npieces for v in outs)
        if out_split or any(a in npieces for a in ins):
            rule = RULES[eqn.primitive.name]
            kind = "mover" if rule.mover and out_split else "moves" if rule.moves else "compute"
            split_eqns.append((ins, outs, kind))
            if kind == "compute":
                after += max([npieces.get(v, 1) for v in outs], default=1)
            piece_use.update(ins)
        else:
            after += 1
            whole_use.update(ins)
    whole_use.update(a for a in jaxpr.outvars if not isinstance(a, Lit))
    # Pieces computed (forward through data movement) and pieces computed on (backward).
    made, used = set(), set()
    for ins, outs, kind in split_eqns:
        if kind == "compute" or any(a in made for a in ins):
            made.update(outs)
    for ins, outs, kind in reversed(split_eqns):
        if kind == "compute" or any(v in used for v in outs):
            used.update(ins)
    movers = sum(1 for ins, outs, kind in split_eqns if kind == "mover"
                 and (any(v in used for v in outs) or any(a in made for a in ins)))
    joins = sum(1 for v in chosen if v in whole_use)
    inexact: dict = {}       # dtype -> floating or complex (np.issubdtype is slow)
    mixed = 0
    for v in piece_use & whole_use:
        dt = v.aval.dtype
        f = inexact.get(dt)
        if f is None:
            f = inexact[dt] = bool(np.issubdtype(dt, np.inexact))
        mixed += f
    smallest = min((math.prod(shape_of(v)) // max(1, n) for v, n in npieces.items()), default=0)
    tiles = all(_mosaic.dtype_reason(v.aval.dtype) is None for v in chosen)
    return _cost.ScalarizePlan(len(jaxpr.eqns), after, movers, joins, mixed, smallest, tiles)


# --- calls ---------------------------------------------------------------------------------------

def _has_static_gather(cj) -> bool:
    """A static gather, or a static move that scalarize makes renaming (`jnp.roll`'s slices and
    concatenate, in its `_roll_static` call)."""
    return any((e.primitive.name == "gather" and C.is_literal(e.invars[1]))
               or e.primitive.name in ("concatenate", "rev") for e in cj.jaxpr.eqns)


def inline_gather_calls(jaxpr, max_eqns: int = 128):
    """Inline small plain `jit` calls whose body holds a static gather (jnp.take's `_take`).

        before:  c = jit[_take]{ gather[literal indices] a ... } b
        after:   c = gather[literal indices] b
    A nested call is only a call: inlining it inside the same `jax.jit` changes no value.
    """
    def inline(eqn):
        inner = eqn.params["jaxpr"]
        return (_walk.plain_call(eqn) and len(inner.jaxpr.eqns) <= max_eqns
                and _has_static_gather(inner))
    return _walk.inline_calls(jaxpr, inline)


def _piecewise(cj) -> bool:
    """Every equation of the body has a rule here (jnp.where's `_where`, a `reduce` helper):
    inlined, it is split with its caller instead of re-joining its operands."""
    return all(e.primitive.name in RULES and not e.effects for e in cj.jaxpr.eqns)


def _moves_small_axis(jaxpr, max_axis: int) -> bool:
    """Whether the level holds a mover along an axis scalarize could split."""
    for e in jaxpr.eqns:
        rule = RULES.get(e.primitive.name)
        if rule is not None and rule.mover and any(
                1 < s <= max_axis for v in e.outvars for s in shape_of(v)):
            return True
    return False


def inline_split_calls(jaxpr, max_axis: int, max_eqns: int = 32):
    """Inline small plain `jit` calls whose every equation has a rule here, at a level that
    moves data along a small axis (the only levels scalarize splits).

        before:  p = jit[reduce]{ reduce_xor[axes=(2,)] o } o ; w = jit[_where]{ select_n ... }
        after:   p = reduce_xor[axes=(2,)] o ; w = select_n ...
    Where the level is not split after all, `run` returns the program it was given.
    """
    if not _moves_small_axis(jaxpr, max_axis):
        return jaxpr

    def inline(eqn):
        inner = eqn.params["jaxpr"]
        return (_walk.plain_call(eqn) and len(inner.jaxpr.eqns) <= max_eqns and _piecewise(inner))
    return _walk.inline_calls(jaxpr, inline)


def inline_for_split(jaxpr, max_axis: int):
    """The calls scalarize inlines at a level before splitting it: static-gather calls
    (`inline_gather_calls`), then small piecewise ones (`inline_split_calls`)."""
    return inline_split_calls(inline_gather_calls(jaxpr), max_axis)


# --- driver -------------------------------------------------------------------------------------

# Data movement XLA fuses without computing (its cost is the cone it passes through).
_MOVES = frozenset({"reshape", "squeeze", "expand_dims", "slice", "unstack", "broadcast_in_dim",
                    "transpose", "rev", "concatenate", "stack", "bitcast_convert_type"})


def _join_cones(eqns, join_pieces: dict) -> list:
    """Measure each re-join of an emitted level for `backend.cost.join_model`: per piece, its
    producer cone (compute equations up to the level's fusion boundaries, each once) and its paths
    (the same counted once per path). Cones are bitsets over equation indices, dropped after their
    value's last use.

        a = x + y ; l = a << 7 ; r = a >> 25 ; b = l ^ r ; piece = b + a
        cone: 5 equations; paths: a 1, l 2, r 2, b 1+2+2 = 5, piece 1+5+1 = 7
    """
    compute = ELEMENTWISE
    last: dict = {}
    for i, e in enumerate(eqns):
        for a in e.invars:
            if not C.is_literal(a):
                last[a] = i
    wanted = {v for ps in join_pieces.values() for v in ps if not C.is_literal(v)}
    cone: dict = {}
    paths: dict = {}
    kept_cone, kept_paths = {}, {}
    for i, e in enumerate(eqns):
        name = e.primitive.name
        ins = [a for a in e.invars if not C.is_literal(a)]
        if name in compute:
            c = 1 << i
            t = 1.0
            for a in ins:
                c |= cone.get(a, 0)
                t += paths.get(a, 0.0)
        elif name in _MOVES:
            c = 0
            t = 0.0
            for a in ins:
                c |= cone.get(a, 0)
                t = max(t, paths.get(a, 0.0))
        else:  # a fusion boundary (a call, a reduction, a dynamic gather, ...)
            c, t = 0, 0.0
        for v in e.outvars:
            if c or t:
                cone[v] = c
                paths[v] = t
            if v in wanted:
                kept_cone[v], kept_paths[v] = c, t
        for a in ins:
            if last.get(a) == i:
                cone.pop(a, None)
                paths.pop(a, None)
    out = []
    for ps in join_pieces.values():
        vs = [v for v in ps if not C.is_literal(v)]
        union = 0
        for v in vs:
            union |= kept_cone.get(v, 0)
        out.append(_cost.JoinCone(len(ps), tuple(kept_cone.get(v, 0).bit_count() for v in vs),
                                  tuple(min(kept_paths.get(v, 0.0), 1e300) for v in vs),
                                  union.bit_count()))
    return out


def _split(jaxpr, an, costs, apart=()):
    """Emit the split form of one level: (new jaxpr, re-joins, re-joined pieces by old var).
    `apart`: old vars whose re-join stays out of a concatenate fusion."""
    b = Builder(an.chosen, costs.join_form, apart, costs.concat_fuse_max + 1)
    chosen, native, whole, links = an.chosen, b.native, b.whole, an.links
    is_drop, is_lit = C.is_dropvar, C.is_literal
    for i, eqn in enumerate(jaxpr.eqns):
        b.src = eqn
        outs = [v for v in eqn.outvars if not is_drop(v)]
        res = None
        if i in links and (any(v in chosen for v in outs)
                           or any(not is_lit(a) and a in native and a not in whole
                                  for a in eqn.invars)):
            res = RULES[eqn.primitive.name].emit(b, eqn, links[i].info)
        if res is not None:
            for v, (axes, P) in zip(eqn.outvars, res):
                if not is_drop(v):
                    b.set_parts(v, axes, P)
            continue
        new_in = [b.get_whole(a) for a in eqn.invars]
        new = eqn.replace(invars=new_in) if any(x is not y for x, y in
                                                zip(new_in, eqn.invars)) else eqn
        b.eqns.append(new)
        for v in outs:
            whole[v] = v
    outvars = [b.get_whole(a) for a in jaxpr.outvars]
    return C.replace_jaxpr(jaxpr, eqns=b.eqns, outvars=outvars), b.joins, b.join_pieces


def _fused_code(jaxpr, an, target, costs, built):
    """XLA:CPU's fused code for the split form `built` (`backend.cost.join_model`): (the form to
    keep, the model); re-emitted with the re-joins that would recompute kept apart."""
    if not costs.concat_fuse_max:
        return built, None
    pieces = built[2]
    lanes = max((math.prod(v.aval.shape[d] for d in axes) for v, axes in an.chosen.items()),
                default=1)
    model = _cost.join_model(_join_cones(built[0].eqns, pieces), len(jaxpr.eqns), target, lanes)
    if model.apart:
        olds = list(pieces)
        built = _split(jaxpr, an, costs, apart={olds[k] for k in model.apart})
    return built, model


def _cut_for_kernels(jaxpr, consts, ctx, costs) -> tuple:
    """GPU: the split level with optimization barriers at its narrowest points, one kernel per
    `segment_eqns` compute equations (`passes/_segments.py`); (level, barriers). Taken only where
    compiling both forms counts fewer launches (`autotune=True`): how XLA fuses a cut region was
    not predictable from its size (deviceless H200: Keccak-f[1600]'s Python loop 7 -> 4 kernels,
    its fori_loop unrolled 7 -> 6, ChaCha20 with 20 double rounds 3 -> 22)."""
    cuts = _segments.cut_points(jaxpr.eqns, jaxpr.outvars, costs.segment_eqns, ELEMENTWISE)
    if not cuts:
        return jaxpr, 0
    first = jaxpr.eqns[0]
    if not ctx.options.autotune:
        ctx.report.declined(PASS, first, (
            f"{len(cuts)} kernel cut(s) of this {ctx.target} region (more than "
            f"{costs.segment_eqns} compute equations) not tried: how XLA fuses a cut region is "
            "measured, never estimated (autotune=True compiles both)"))
        return jaxpr, 0
    made: list = []

    def build():
        made.append(_segments.insert_barriers(jaxpr, cuts, ELEMENTWISE))
        return C.closed(made[0], list(consts))

    go, why, _ = _autotune.choose(ctx, f"{PASS}.cuts", C.closed(jaxpr, list(consts)), build,
                                  False, "kernel cuts are measured, not estimated")
    ctx.report.stats.setdefault("autotune.choices", []).append(why)
    if not go:
        ctx.report.declined(PASS, first, f"{len(cuts)} kernel cut(s): {why}")
        return jaxpr, 0
    return (made[0] if made else _segments.insert_barriers(jaxpr, cuts, ELEMENTWISE)), len(cuts)


def _update_program(cache):
    def program(shape, smap):
        return memo(cache, "scalarize.update_program", (tuple(shape), array_key(smap)),
                    lambda: decompose(shape, smap))
    return program


def expand_updates(jaxpr, ctx, only=None):
    """The level with its static updates in their select form (`passes/_updates.py`) and, for
    each, its position in `jaxpr` and the axes a split must cut for its select to be renaming
    ({result var: (position, axes)}); None where it has none worth it. `only`: the positions
    of the equations to expand (None: all). On targets that keep updates in place (the CPU;
    the TPU below its minimum operand), the select is taken only here: split along the updated
    axis it is renaming; where the level is not split, the update stays as it was.

        before:  k:u32[N,8] = scatter[...] b 7 i            (b: a register shifted by a roll)
        after:   k = select_n(broadcast(hit), b, broadcast(i))   → pieces: k_7 = i, k_j = b_j
    """
    costs = _cost.costs(ctx.target)
    made = costs.update_form == "select" and not costs.update_select_min_elements
    if not ctx.options.gathers or made or not any(
            e.primitive.name in _updates.UPDATES for e in jaxpr.eqns):
        return None   # (gathers=False: updates as written; `made`: the gathers pass made them all)
    if not any((r := RULES.get(e.primitive.name)) is not None and r.mover for e in jaxpr.eqns):
        # no permutation for a split to turn into renaming: one seeded by the updates alone would
        # trade in-place writes for pieces (and emitting their forms cost MinAtar Breakout's
        # rewrite 14 of its 19 ms in this pass)
        return None
    cache = getattr(ctx, "cache", None)
    program = _update_program(cache)
    small = max(costs.max_axis, costs.cost_axis)
    position = iter(range(len(jaxpr.eqns)))   # (`rule` sees each equation once, in order)
    needs: dict = {}

    def value_of(atom):
        return (np.asarray(C.literal_value(atom), dtype=C.aval_of(atom).dtype)
                if C.is_literal(atom) else None)

    def rule(eqn):
        i = next(position)
        if eqn.primitive.name not in _updates.UPDATES or eqn.effects:
            return None
        if only is not None and i not in only:
            return None
        try:
            u = _updates.static_update(eqn, value_of, ctx.options.fold_limit, cache)
            if u is None:
                return None
            hit = _updates.hit_mask(u)
            _, dims = _updates.reduced_mask(hit)
            if not dims or any(hit.shape[d] > small for d in dims):
                return None   # no small axis it varies along: no split would take it
            rep = _updates.emit_select(eqn, u, program)
            needs[rep.outs[0]] = (i, frozenset(u.lead + d for d in dims))
            return rep
        except Decline as d:
            ctx.report.declined(PASS, eqn, f"static update not taken into pieces: {d}")
            return None

    j, changed = _walk.rewrite_eqns(jaxpr, rule)
    return (j, needs) if changed else None


def _unsplit_updates(an, needs: dict) -> set:
    """The positions of the expanded updates whose select the chosen split leaves a select:
    an axis their hit mask varies along is not cut (a cube's six faces past `max_pieces`)."""
    return {i for v, (i, axes) in needs.items() if not axes <= set(an.chosen.get(v, ()))}


def scalarize_jaxpr(jaxpr, ctx, mode, consts=(), loop_body: bool = False) -> tuple:
    """One level: (new jaxpr, changed); its static updates are taken in their select form where
    that form is split into renaming (`expand_updates`), else kept. `loop_body`: the level is
    a rolled loop's body (`_loop_body_joins`).

    An update whose select the split would leave a select along an uncut axis stays the update
    it is (on the CPU that select was 1.9-3.6x slower and compiled 20x slower: a vmapped cube
    step of 18 turns, its six faces past `max_pieces`); the level is analysed again without it.
    """
    # (the expanded form is what this pass saw when the gathers pass made every static update
    # a select: one attempt on it, and the original back where it declines)
    only = None
    costs = _cost.costs(ctx.target)
    for _ in range(3):   # (each round expands fewer updates; where 3 do not settle it, none)
        expanded = expand_updates(jaxpr, ctx, only)
        if expanded is None:
            break
        level, needs = expanded
        an = analyse(level, costs, ctx.options.fold_limit, getattr(ctx, "cache", None))
        bad = _unsplit_updates(an, needs) if an.plan is not None else set()
        if not bad:
            new, changed = _scalarize_level(level, ctx, mode, consts, an, loop_body)
            return (new, True) if changed else (jaxpr, False)
        ctx.report.declined(PASS, jaxpr.eqns[min(bad)], (
            f"{len(bad)} static update(s) kept in place: the split would cut "
            "none or only some of the axes their writes vary along, leaving a select of the "
            "whole array (slower than the update on this target)"))
        only = {i for i, _ in needs.values()} - bad
        if not only:
            break
    new, changed = _scalarize_level(jaxpr, ctx, mode, consts, None, loop_body)
    return (new, True) if changed else (jaxpr, False)


def _loop_body_joins(jaxpr, an, target, mode) -> str | None:
    """Why a rolled loop's body is not split where the split would re-join its results (None: it
    may be). Its results are the next trip's carry, so that re-join runs every trip; where the
    target splits carries instead (`backend.cost.LoopCosts.split_carry`, CPU), flatten decides
    the loop, and a body split under a whole carry measured no faster, its compile time paid
    (CPU, paired, 4x4 quarter rounds with a message, 65,536 blocks, compile / run vs jax.jit: 2
    trips 3.1-3.5x / 0.99-1.0x; with `flatten=False`, 4 trips 3.1x / 1.12x, 3 trips at 4,096
    blocks 2.9x / 0.94x; 12 trips, its rows re-joined by the user's own `jnp.stack`, 2.95x /
    1.69x)."""
    if mode != "auto" or not _cost.loop_costs(target).split_carry:
        return None
    joined = sum(1 for v in jaxpr.outvars if not C.is_literal(v) and v in an.chosen)
    if not joined:
        return None
    return (f"a rolled loop's body: {joined} of its results would be re-joined every trip "
            f"(on {target} its carry is split by flatten, or not at all)")


def _scalarize_level(jaxpr, ctx, mode, consts=(), an=None, loop_body=False) -> tuple:
    """One level: (new jaxpr, changed). With `autotune`, the cost model's soft verdicts (piece
    size, re-joins vs permutations) are checked by compiling both forms (`backend.autotune.choose`);
    its hard limits (`backend.cost.scalarize_limit`) always stand. `an`: the level's analysis,
    where the caller made it."""
    target = ctx.target
    costs = _cost.costs(target)
    if costs.min_piece_elements and not ctx.options.autotune:
        # (autotune measures the piece-size verdict instead of taking it)
        reason = _cost.scalarize_piece_bound(largest_piece(jaxpr, costs), target, mode)
        if reason is not None:
            ctx.report.declined(PASS, jaxpr.eqns[0], reason)
            return jaxpr, False
    if an is None:
        an = analyse(jaxpr, costs, ctx.options.fold_limit, getattr(ctx, "cache", None))
    if an.plan is None:
        return jaxpr, False
    if (why := _exact.reason(ctx, an.chosen, "splitting")) is not None:
        ctx.report.declined(PASS, jaxpr.eqns[0], why)  # exact=True: float pieces fuse otherwise
        return jaxpr, False
    if loop_body and (why := _loop_body_joins(jaxpr, an, target, mode)) is not None:
        ctx.report.declined(PASS, jaxpr.eqns[0], why)
        return jaxpr, False
    first = jaxpr.eqns[0] if jaxpr.eqns else None
    built: list = []                      # the split form, once made
    hard = _cost.scalarize_limit(an.plan, target)   # no measurement overrides these
    reason = hard or _cost.scalarize_decision(an.plan, target, mode, ctx.options.kernel)
    if hard is None and ctx.options.autotune:
        def build():
            built.append(_fused_code(jaxpr, an, target, costs, _split(jaxpr, an, costs)))
            return C.closed(built[0][0][0], list(consts))

        go, why, _ = _autotune.choose(ctx, PASS, C.closed(jaxpr, list(consts)), build,
                                      reason is None, reason or "cost model goes ahead",
                                      key_extra=(str(mode),))
        ctx.report.stats.setdefault("autotune.choices", []).append(why)
        reason = None if go else why
    if reason is not None:
        ctx.report.declined(PASS, first, reason)
        return jaxpr, False
    form, model = built[0] if built else _fused_code(jaxpr, an, target, costs,
                                                     _split(jaxpr, an, costs))
    new, joins, _ = form
    if model is not None and (why := _cost.fused_limit(model, target, an.plan)) is not None:
        ctx.report.declined(PASS, first, why)
        return jaxpr, False
    if joins > an.plan.joins and not ctx.options.autotune:
        # The plan estimates re-joins before emitting; where emitting needed more (values passed
        # whole into calls), decide again on the real count (seed shift program with
        # `lax.gather`: 1 planned, 7 made, 1.6x slower on the CPU when split anyway).
        reason = hard or _cost.scalarize_decision(dataclasses.replace(an.plan, joins=joins),
                                                  target, mode, ctx.options.kernel)
        if reason is not None:
            ctx.report.declined(PASS, first, reason)
            return jaxpr, False
    new, cuts = _cut_for_kernels(new, consts, ctx, costs)
    summary = model.summary if model is not None else ""   # (empty: no re-join to model)
    after = ("renaming",) + ((f"({model.summary})",) if summary else ())
    if cuts:
        ctx.report.count(f"{PASS}.kernel_cuts", cuts)
        after += (f"({cuts} optimization barrier(s) on {target}: a kernel per "
                  f"<= {costs.segment_eqns} compute equations, cut where the fewest values "
                  "are live, and the re-join apart)",)
    ctx.report.applied(PASS, list(jaxpr.eqns[:1]), n=an.plan.movers_removed, after=after)
    if summary:
        ctx.report.stats.setdefault(f"{PASS}.fused_code", []).append(model.summary)
    ctx.report.count(f"{PASS}.joins", joins)
    note = _cost.trade(an.plan, target)
    if note is not None:
        ctx.report.count(f"{PASS}.fusion_trade")
        trades = ctx.report.stats.setdefault(f"{PASS}.trades", [])
        if note not in trades:
            trades.append(note)
    return new, True


def run(cj, ctx):
    """Inline small calls that hold static gathers (bottom-up, so a call of a call of `_take`
    is inlined too: the permutations of a function called 7 times then live in one region),
    then split each level. If no level splits, the program is returned as it was."""
    mode = ctx.options.scalarize
    if mode is False or mode is None:
        return cj, False
    if _prim("stack") is None or _prim("unstack") is None:  # older JAX: nothing to split with
        return cj, False
    changed = False

    costs = _cost.costs(ctx.target)
    small = max(costs.max_axis, costs.cost_axis)

    def inline(c):
        j = inline_for_split(c.jaxpr, small)
        return c if j is c.jaxpr else C.closed(j, c.consts)

    def level(c, owner):
        nonlocal changed
        j, ch = scalarize_jaxpr(c.jaxpr, ctx, mode, c.consts,
                                loop_body=owner in ("scan", "while"))
        if not ch:
            return c
        changed = True
        return C.closed(j, c.consts)

    out = _walk.map_jaxprs(_walk.map_jaxprs(cj, inline), level, owner=True)
    return (out, True) if changed else (cj, False)
