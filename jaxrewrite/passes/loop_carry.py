"""A loop's carry split along its small axes, the loop kept rolled (flatten's CPU form).

Unrolling a loop lets scalarize split its body, but multiplies what XLA compiles by the trip
count: on the CPU, where a rolled loop costs no launches, ChaCha20's `fori_loop` of 10 double
rounds unrolled and split compiled 21-28x jax.jit's time. Here the loop stays a loop and its
carry is carried as separate pieces, so each permutation in the body is renaming and XLA
compiles the body once:

    before:  _, s = scan[length=10, num_carry=2]{ (i, c:u32[N,4,4]) -> (i + 1, f(c)) } 0 x
    after:   x0..x15 = pieces of x (slices)
             _, s0..s15 = scan[length=10, num_carry=17]{
                 (i, c0..c15:u32[N]) -> c = join(c0..c15) ; d = f(c) ; (i + 1, pieces of d) } 0 x0..x15
             s = join(s0..s15)

A loop constant batched as the carry is (a message of N x 16 words read by every trip) is cut
the same way, once, before the loop (`const_axes`), and joined at the body's entry; whole, each
piece's fusion would read its words as strided columns every trip:

    before:  scan[num_consts=1]{ (m:u32[N,16], i, c) -> ... m[:, 3] ... } m 0 x
    after:   m0..m15 = pieces of m
             scan[num_consts=16]{ (m0..m15, i, c0..c15) -> m = join(m0..m15) ; ... } m0..m15 0 ..

`join` is a stack (then reshape and transpose back) and `pieces of` are slices, so scalarize,
which then splits the body level, sees the stack at the body's entry and the slices at its exit
as renaming: the body computes on pieces from end to end. Whether it does is asked before
anything changes (`split_loop` runs scalarize on the new body with a scratch report): a carry
that the split body would still re-join each trip is not split (a stack per trip for nothing).

The carry is carried as its pieces. Kept as one array instead, cut at the body's entry and
joined at its exit (XLA:CPU then updates it in place), Keccak-f[1600]'s 25 lanes ran 0.80-0.96x
the pieces' form at 4,096-8,192 states until split loops were compiled with region-based copy
insertion (`backend/compile_options.py`), and 1.26-1.40x since (paired, CPU, Dec 6), so that
form is gone.

A `while` that counts by 1 between literals (`fori_loop` whose bounds became literals) is
re-emitted as a `scan` of its trip count: same body, same order, no condition to evaluate.
"""
from __future__ import annotations

import dataclasses
import math

import jax.numpy as jnp
import numpy as np
from jax import lax

from .. import _compat as C
from .. import _walk
from ..backend import cost as _cost
from .._memo import same_bits
from . import fold


def carry_axes(atom, max_axis: int, max_pieces: int) -> tuple:
    """The small axes `atom` would be split along (() where it is not split): every axis of
    2..max_axis elements, if their product is at most `max_pieces`."""
    aval = C.aval_of(atom)
    shape = getattr(aval, "shape", ())
    axes = tuple(d for d, s in enumerate(shape) if 1 < s <= max_axis)
    if not axes or math.prod(shape[d] for d in axes) > max_pieces:
        return ()
    return axes


def _pieces(x, axes: tuple) -> list:
    """x's pieces along `axes`, row-major over them: transpose them to the front, merge them,
    slice each one out."""
    if not axes:
        return [x]
    rest = tuple(d for d in range(x.ndim) if d not in axes)
    y = lax.transpose(x, axes + rest) if axes + rest != tuple(range(x.ndim)) else x
    y = y.reshape((-1,) + tuple(x.shape[d] for d in rest))
    return [lax.index_in_dim(y, k, keepdims=False) for k in range(y.shape[0])]


def _const_pieces(x: np.ndarray, axes: tuple) -> list:
    """`_pieces` of a constant (a literal initial carry: fold's broadcast state), cut at trace
    time: a piece holding one value is a broadcast of it, not a constant of the batch's size
    (a 65,536-block state would otherwise be a 4 MiB constant the tiles slice)."""
    rest = tuple(d for d in range(x.ndim) if d not in axes)
    y = np.transpose(x, axes + rest).reshape((-1,) + tuple(x.shape[d] for d in rest))
    return [jnp.full(p.shape, p.flat[0], p.dtype) if _one_value(p) else p for p in y]


def _one_value(p: np.ndarray) -> bool:
    """Every element the same bits (so 0.0 beside -0.0 is two values), and not a NaN (whose
    payload a broadcast need not keep)."""
    if not p.size or (p.dtype.kind in "fc" and np.isnan(p.flat[0])):
        return False
    return same_bits(p, np.full(p.shape, p.flat[0], p.dtype))


def _join(pieces: list, shape: tuple, axes: tuple):
    """The inverse of `_pieces`: stack, un-merge, transpose back."""
    if not axes:
        return pieces[0]
    if axes == tuple(range(axes[0], axes[0] + len(axes))):
        # adjacent axes: stacked in place, no transpose (a copy of the whole state after the
        # loop: Keccak's 65,536 x 25 lanes)
        return jnp.stack(pieces, axis=axes[0]).reshape(shape)
    rest = tuple(d for d in range(len(shape)) if d not in axes)
    y = jnp.stack(pieces).reshape(tuple(shape[d] for d in axes) + tuple(shape[d] for d in rest))
    perm = axes + rest
    if perm == tuple(range(len(shape))):
        return y
    inverse = tuple(perm.index(d) for d in range(len(shape)))
    return lax.transpose(y, inverse)


@dataclasses.dataclass(frozen=True)
class Loop:
    """A loop with a static trip count, as flatten reads it (`_scan_loop` / `_while_loop`)."""
    trips: int
    body: object           # ClosedJaxpr: consts + carry (+ x) -> carry (+ y)
    consts: list
    init: list
    xs: list = dataclasses.field(default_factory=list)
    reverse: bool = False
    unroll: int = 1


def _n_pieces(shape: tuple, axes: tuple) -> int:
    return math.prod(shape[d] for d in axes) if axes else 1


def emit(eqn, loop: Loop, layout: list,
         const_layout: list | None = None) -> tuple[list, list, object]:
    """(equations, results, the new scan equation) of `loop` with carry k carried as its pieces
    along `layout[k]` (() = whole). `const_layout[k]`: loop constant k cut into pieces along
    those axes before the loop and joined at the body's entry, where scalarize makes the join
    renaming (`const_axes`)."""
    nk, nc = len(loop.init), len(loop.consts)
    shapes = [tuple(C.aval_of(v).shape) for v in loop.init]
    const_layout = const_layout or [()] * nc

    def regroup(flat):
        out, i = [], 0
        for shape, axes in zip(shapes, layout):
            n = _n_pieces(shape, axes)
            out.append(_join(list(flat[i:i + n]), shape, axes))
            i += n
        return out

    def split(wholes):
        return [p for v, axes in zip(wholes, layout)
                for p in (_const_pieces(v, axes) if isinstance(v, np.ndarray) and axes
                          else _pieces(v, axes))]

    # literal operands (constants fold made: a gather's indices) stay literals in the new body,
    # where scalarize and gathers need to see them; the others are traced
    atoms = [*loop.consts, *loop.init, *loop.xs]
    traced = [a for a in atoms if not C.is_literal(a)]

    def whole_loop(*vals):
        it = iter(vals)
        args = [np.asarray(C.literal_value(a)) if C.is_literal(a) else next(it) for a in atoms]
        consts, init, xs = args[:nc], args[nc:nc + nk], args[nc + nk:]
        cut = [_pieces(c, axes) if axes else None for c, axes in zip(consts, const_layout)]

        def step(pieces, x):
            # (the join inside the step: lax.scan takes the pieces as its constants)
            body_consts = [c if p is None else _join(p, tuple(jnp.shape(c)), axes)
                           for c, p, axes in zip(consts, cut, const_layout)]
            outs = C.eval_jaxpr(loop.body, *body_consts, *regroup(pieces), *(x or ()))
            return split(outs[:nk]), list(outs[nk:])

        carry, ys = lax.scan(step, split(init), list(xs) if xs else None, length=loop.trips,
                             reverse=loop.reverse, unroll=loop.unroll)
        return regroup(carry) + list(ys)

    em = _walk.Emitter(eqn)
    outs = em.call(whole_loop, *traced)
    (k,) = [i for i, e in enumerate(em.eqns) if e.primitive.name == "scan"]
    # lax.scan hoists the body's constants (a gather's indices) into operands, which the
    # Emitter made literals: substituted into the body, as fold's specialisation does, so the
    # body's gathers are static where scalarize looks at them
    scan = em.eqns[k]
    body = scan.params["jaxpr"]
    subs = {i: a for i, a in enumerate(scan.invars[:scan.params["num_consts"]])
            if C.is_literal(a)}
    if subs:
        body = C.closed(fold.substitute_invars(body.jaxpr, subs, drop=False), body.consts)
        scan = em.eqns[k] = scan.replace(params={**scan.params, "jaxpr": body})
    return em.eqns, outs, scan


def const_axes(loop: Loop, elements: int, max_axis: int, max_pieces: int) -> list:
    """The axes each loop constant is cut along (() = kept whole): a traced constant of the
    carry pieces' size along small axes (a message read by every trip). Whole, its words are
    strided reads in each piece's fusion every trip: a 25-word loop reading two of a message's
    16 columns per word ran 1.45x slower than with the message cut once before the loop."""
    out = []
    for c in loop.consts:
        axes = () if C.is_literal(c) else carry_axes(c, max_axis, max_pieces)
        shape = tuple(C.aval_of(c).shape)
        out.append(axes if axes and math.prod(shape) // _n_pieces(shape, axes) == elements
                   else ())
    return out


def split_loop(eqn, loop: Loop, ctx, max_axis: int, max_pieces: int, scalarize_split,
               permutations: int = 0, accept=None):
    """(Replacement, what was split) or (None, why not); `permutations`: of carried data, per
    trip (`backend.cost.split_pays`). `scalarize_split(ctx, jaxpr, consts)`:
    scalarize's split of one level, asked without recording it ((split level, None) or
    (None, its reason)). `accept(scan, split body)`: None to take the split, else why not
    (the kernel pass's verdict on the loop it would get, where flatten splits for it)."""
    layout = [carry_axes(v, max_axis, max_pieces) for v in loop.init]
    if not any(layout):
        return None, "no small axis in the carry"
    # the cost first: it needs only the layout, not the split body (traced and analysed below)
    shapes = [tuple(C.aval_of(v).shape) for v in loop.init]
    n = sum(1 for axes in layout if axes)
    total = sum(_n_pieces(s, axes) for s, axes in zip(shapes, layout) if axes)
    state = sum(math.prod(s) * np.dtype(C.aval_of(v).dtype).itemsize
                for v, s, axes in zip(loop.init, shapes, layout) if axes)
    elements = max(math.prod(s) // _n_pieces(s, axes) for s, axes in zip(shapes, layout) if axes)
    too_little = _cost.split_pays(loop.trips, len(loop.body.jaxpr.eqns), total, permutations,
                                  state, state // max(elements, 1), bool(ctx.options.tile),
                                  ctx.target)
    if too_little is not None:
        return None, too_little
    flags = [bool(axes) for shape, axes in zip(shapes, layout)
             for _ in range(_n_pieces(shape, axes))]
    cut = const_axes(loop, elements, max_axis, max_pieces)
    for const_layout in ([cut, None] if any(cut) else [None]):
        eqns, outs, scan = emit(eqn, loop, layout, const_layout=const_layout)
        body = scan.params["jaxpr"]
        split_body, why = scalarize_split(ctx, body.jaxpr, body.consts)
        if split_body is None:
            why = f"scalarize would not split the body ({why})"
            continue
        # the carried pieces, as the new body receives them: a stack of them left in the split
        # body is a re-join every trip (of cut constants too: then they stay whole)
        first = scan.params["num_consts"]
        pieces = {v for v, f in zip(body.jaxpr.invars[first:first + len(flags)], flags) if f}
        if const_layout:
            pieces |= set(body.jaxpr.invars[:first])
        rejoined = sum(1 for e in split_body.eqns if e.primitive.name == "stack"
                       and any(not C.is_literal(a) and a in pieces for a in e.invars))
        if not rejoined:
            why = accept(scan, split_body) if accept is not None else None
            if why is None:
                break
            continue
        why = f"the split body would re-join carried pieces {rejoined} time(s) every trip"
    else:
        return None, why
    cuts = f"; {sum(map(bool, const_layout))} loop constant(s) cut into pieces" \
        if const_layout else ""
    how = f"{n} carried value(s) as {total} pieces"
    after = len(split_body.eqns)
    return _walk.Replacement(eqns, outs), (
        f"{how}{cuts}; body {len(loop.body.jaxpr.eqns)} -> {after} "
        f"equations, compiled once (unrolled: {loop.trips * after}, compile time)")
