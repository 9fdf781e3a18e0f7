"""Static-index gathers, scatters and dynamic slices become structural data movement.

Where an index operand is a literal (constant folding made it one), the operation's source map
(`analysis.indexmap.gather_map`) says where every output element comes from;
`analysis.indexmap.decompose` writes that map as slices, reverses, transposes, reshapes and
broadcasts, checked on an index-tagged operand before it is used. Rules (one per primitive, table
`RULES`):

    gather x [[3],[2],[1],[0]]  (PROMISE_IN_BOUNDS/CLIP)      ->  rev[dimensions=(0,)] x
    gather x idx  (FILL_OR_DROP, some windows out of range)   ->  select_n(mask, full(fill), moved)
    dynamic_slice x 1 2  (literal starts; XLA clamps them)     ->  slice x (1,2) (1+h,2+w)
    scatter / dynamic_update_slice (static indices), where the target's cost row takes the
    select form (the GPU; see `passes/_updates.py`)           ->  select_n(hit, x, moved(v))
    a gather or scatter kept as it is, its indices the same along a batching dim (a vmapped
    `switch` branch's table)                                  ->  the same op, the batch a
                                                                  window dim, one row of table

Preconditions and declines (recorded with a reason, the original kept):
* PROMISE_IN_BOUNDS with an out-of-range static index: implementation-defined;
* a map that needs `concatenate` (a roll, a per-row rotation): only with `gathers="all"`, and
  then at most `PIECE_BUDGET` pieces. The default never adds a concatenate or pad: XLA GPU
  counts them against a per-fusion budget (measured worse than the gather);
* a map of one window above `fold_limit` elements (no index map is materialized): operand
  and output sizes are counted without the batch dims that pass through, so a vmapped gather
  over 65,536 rows maps one row. Index tables above `fold_limit` (fold leaves them as
  equations) are assembled in numpy here (`ASSEMBLY`, up to `ASSEMBLY_FACTOR` times the limit)
  for analysis only, never emitted;
* an index computed from constants that is still not static here (a floating-point step, a
  table above the assembly limit, `fold=False`): recorded, so no static gather is left silent;
* a static update on a target that updates in place (the CPU): kept, with the estimate,
  unless it writes every operand element once (then it is its updates moved, no select);
* fills for extended dtypes (PRNG keys); a scatter whose result depends on the order of
  duplicate indices (set, floating add/mul); integer add, min and max with duplicates are kept
  exact by applying one layer of unique targets after another.
* mask permutations (`sum(x[..., None] * M, axis)` or `x @ M` with a constant 0/1 matrix `M`
  with one 1 per column), integer or boolean only (0 * inf is NaN for floats), become the
  gather they are, which the gather rule then turns into data movement.
"""
from __future__ import annotations

import functools

import numpy as np
from jax import lax

from .. import _compat as C
from ..backend import cost as _cost
from ..analysis import indexmap as IM
from ..analysis import exact as _exact
from ..analysis import repeats
from .. import _walk
from .._memo import array_key, memo
from .._memo import gather_map as memoised_gather_map
from ..report.records import Decline
from . import _updates as U

NAME = "gathers"
PIECE_BUDGET = 32
SHARED_FORM_SIZE = 4096   # maps up to this many entries key the shared trace cache by value
# Operand dims above this size that every window takes whole (a vmapped gather's batch) are left
# out of the index map and passed through: the map stays the size of one window's permutation.
WIDE_DIM = U.WIDE_DIM
# A scatter whose batch cannot be cut to one row is checked whole only up to this size.
SCATTER_CHECK_LIMIT = 1 << 16


LAX_OPS = U.LAX_OPS
# (shared with passes/scalarize.py's use of static updates: passes/_updates.py)
_size = U.size
_check_aval = U.check_aval
_is_extended = C.is_extended_dtype
_reduced_mask = U.reduced_mask
_tagged = U.tagged
_clamped_starts = U.clamped_starts


def _program(operand_shape, smap, ctx, concat_pieces: int = 0, concat_ok: bool = True):
    """The structural program of `smap`. Concatenate forms: with gathers="all" (up to
    PIECE_BUDGET pieces), else only where the caller's cost-model row allows `concat_pieces`;
    never where `concat_ok` is False."""
    allow = concat_ok and (ctx.options.gathers == "all" or concat_pieces > 0)
    budget = PIECE_BUDGET if ctx.options.gathers == "all" else concat_pieces
    # what the decline says when no concatenate form is searched: the true reason
    why = ("gathers='all' allows it" if concat_ok else
           f"concatenate forms are searched only up to {IM.SPLIT_MAX_ELEMENTS} elements, "
           "whole batch included")
    return memo(getattr(ctx, "cache", None), "gathers.program",
                (tuple(operand_shape), array_key(smap), allow, budget, concat_ok),
                lambda: IM.decompose(operand_shape, smap, allow_concat=allow,
                                     piece_budget=budget, no_concat_reason=why))


def _moved(x, prog, fill_mask, fill_value, lead: int = 0):
    """The program applied to `x`; FILL positions replaced by `fill_value` as JAX does. `lead`:
    leading dims of `x` the program (and the fill mask) applies to each element of."""
    y = IM.apply_program(x, IM.lift_program(prog, x.shape[:lead]), LAX_OPS)
    if fill_mask is not None:
        small, dims = _reduced_mask(~fill_mask)
        inb = lax.broadcast_in_dim(small, y.shape,
                                   tuple(d + lead for d in dims))  # the lead dims: new
        y = lax.select(inb, y, lax.full_like(y, fill_value))
    return y


# --- static values ---------------------------------------------------------------------------------

# Primitives whose result is not a function of their operands' values (per-device, stateful).
NOT_CONSTANT = frozenset({"axis_index", "rng_uniform"})


def _iota(vals, p):
    shape, dim = tuple(p["shape"]), p["dimension"]
    r = np.arange(shape[dim], dtype=p["dtype"]).reshape(
        [shape[dim] if d == dim else 1 for d in range(len(shape))])
    return np.broadcast_to(r, shape)


# How an index table is assembled from smaller constants: primitive -> (numpy function of
# (values, params), a view that costs no memory?). Evaluated here, never emitted: fold leaves
# tables above `fold_limit` as equations (`x[np.arange(n)[:, None], P]` over 65,536 rows is a
# broadcast row iota concatenated with a broadcast P: 4M entries, one row's map of 32).
ASSEMBLY = {
    "iota": (_iota, True),
    "broadcast_in_dim": (lambda v, p: IM.NUMPY_OPS.broadcast_in_dim(
        v[0], tuple(p["shape"]), tuple(p["broadcast_dimensions"])), True),
    "concatenate": (lambda v, p: repeats.concatenate(v, p["dimension"]), False),
    "reshape": (lambda v, p: np.reshape(v[0], tuple(p["new_sizes"]))
                if p.get("dimensions") is None else None, False),
    "squeeze": (lambda v, p: np.squeeze(v[0], tuple(p["dimensions"])), False),
}
# Index tables assembled here are at most this many times `fold_limit` (views: any size).
ASSEMBLY_FACTOR = 16


class _Statics:
    """Values of atoms known now: literals, the level's numpy constants (those above
    `fold_limit` stay constants, already in memory), index tables assembled from them
    (`ASSEMBLY`: splats and iotas that folding kept as equations, tables above `fold_limit`),
    and `pvary`s of those (inside `shard_map` bodies). `from_constants` holds the vars computed
    from constants alone (no operand of the level, no effects), known or not: a gather indexed
    by one that has no value here was not made static, and says so (`_unfolded_index`)."""

    def __init__(self, consts: dict | None = None, limit: int = 1 << 20, eqns=(), outvars=()):
        self.eqns, self.outvars = list(eqns), outvars    # the level's, as given
        self.producers: dict = {}
        self.consts = consts or {}
        self.from_constants: set = set(self.consts)
        self.limit = ASSEMBLY_FACTOR * limit
        self.known: dict = {}

    def see(self, eqn):
        for v in eqn.outvars:
            self.producers[v] = eqn
        if not eqn.effects and eqn.primitive.name not in NOT_CONSTANT and all(
                C.is_literal(a) or a in self.from_constants for a in eqn.invars):
            self.from_constants.update(eqn.outvars)

    def producer(self, atom):
        return None if C.is_literal(atom) else self.producers.get(atom)

    @functools.cached_property
    def uses(self) -> dict:
        """`_walk.uses` of the level: made at the first static update asked about."""
        return _walk.uses(self.eqns, self.outvars)

    def only_used_by(self, var, name: str) -> bool:
        """Every use of `var` in the level is a `name` equation (an output of the level is not)."""
        at = self.uses.get(var)
        return bool(at) and all(i < len(self.eqns) and self.eqns[i].primitive.name == name
                                for i in at)

    def value(self, atom):
        if C.is_literal(atom):
            return np.asarray(C.literal_value(atom), dtype=C.aval_of(atom).dtype)
        if atom in self.known:
            return self.known[atom]
        eqn = self.producers.get(atom)
        if eqn is None:
            c = self.consts.get(atom)
            return None if c is None else np.asarray(c)
        if eqn.primitive.name == "pvary":  # a type change (varying manual axes), same values
            return self.value(eqn.invars[eqn.outvars.index(atom)])
        row = ASSEMBLY.get(eqn.primitive.name)
        if row is None or atom not in self.from_constants:
            return None
        fn, view = row
        out = None
        if C.replicated(eqn.params.get("sharding")) and (view or _size(atom.aval) <= self.limit):
            vals = [self.value(a) for a in eqn.invars]
            if all(v is not None for v in vals):
                out = fn(vals, eqn.params)
        if out is not None and (out.shape != tuple(atom.aval.shape)
                                or out.dtype != atom.aval.dtype):
            out = None
        self.known[atom] = out
        return out


# --- rules -------------------------------------------------------------------------------------

def _gather(eqn, ctx, statics):
    x, idx_atom = eqn.invars
    idx = statics.value(idx_atom)
    if idx is None:
        return None  # dynamic indices: nothing to do (not a decline)
    xa, out = C.aval_of(x), eqn.outvars[0].aval
    p = eqn.params
    dn = p["dimension_numbers"]
    # the map without a batch read row for row, nor the dims every window takes whole (those
    # pass through)
    rows, xs, idx = IM.gather_batch_core(xa.shape, idx, dn, p["slice_sizes"], WIDE_DIM)
    wide, xs, ss = IM.window_core(xs, dn, p["slice_sizes"], WIDE_DIM)
    wide = {**rows, **wide}
    # fold_limit bounds what is materialised: the core's map and tagged operand, not the
    # passthrough dims (a sorting network's x[:, PERM] over 65,536 rows maps 32 entries)
    limit = ctx.options.fold_limit
    through = int(np.prod([xa.shape[d] for d in wide], dtype=np.int64))
    if _size(xa) // through > limit or _size(out) // through > limit:
        raise Decline(f"operand or output above fold_limit={limit} elements "
                      "(passthrough batch dims not counted)")
    smap = memoised_gather_map(getattr(ctx, "cache", None), xs, idx, dn, ss, p["mode"]).copy()
    if not wide:
        return _emit_moved(eqn, ctx, x, xa, smap, p.get("fill_value"))
    core_out = [s for j, s in enumerate(smap.shape) if j not in wide.values()]
    core_in = tuple(s for d, s in enumerate(xa.shape) if d not in wide)
    return _emit_moved(eqn, ctx, x, xa, smap.reshape(core_out), p.get("fill_value"),
                       passthrough=(wide, core_in))


def _emit_moved(eqn, ctx, x, xa, smap, fill_value, passthrough=None):
    """Emit the structural form of source map `smap`. `passthrough` = (wide, core shape): the
    map covers only the core dims, and the operand dims in `wide` (operand dim → output dim)
    pass through whole: the core program is applied under `vmap` over them.

        before:  y = gather[65,536 x 16 map] x          (x: (65536, 16), rows pass through)
        after:   y = vmap(program on a 16-entry map) x  (the same slices/revs, batched)
    """
    fills = smap < 0
    fill_mask = fills if fills.any() else None
    if fill_mask is not None:
        if _is_extended(xa.dtype):
            raise Decline("fill value of an extended dtype")
        if fill_value is None:
            raise Decline("FILL_OR_DROP gather without a fill value")
    if passthrough is None:
        prog = _program(xa.shape, smap, ctx)
        form = (prog, fill_mask, fill_value, None)
    else:
        wide, core_in = passthrough
        # Concatenate forms are searched for gathers of at most IM.SPLIT_MAX_ELEMENTS in all (a
        # vmapped gather over a large batch is none: seed program x 65,536 with gathers="all",
        # concatenates took H200 kernels 11 -> 32 where splitting the axis gives 1).
        concat_ok = int(np.prod(xa.shape)) <= IM.SPLIT_MAX_ELEMENTS
        prog = _program(core_in, smap, ctx, concat_ok=concat_ok)
        form = (prog, fill_mask, fill_value, (wide, len(xa.shape)))
    em = _walk.Emitter(eqn)
    if smap.size <= SHARED_FORM_SIZE:
        # Repeated gathers (a circuit's 48 gates, an unrolled loop) trace their form once. The
        # program is a function of the map, the operand shape and the options: that is the key.
        # (the fill value by its bits: -0.0 == 0.0 and they hash alike, NaN != NaN)
        fill = None if fill_value is None else array_key(np.asarray(fill_value, xa.dtype))
        key = (array_key(smap), tuple(xa.shape), fill, ctx.options.gathers,
               None if passthrough is None else (tuple(sorted(wide.items())), concat_ok))
        y, = em.call_shared(_moved_form, x, static=(_Keyed(key, form),))
    else:
        y, = em.call(lambda v: _moved_form(v, _Keyed(None, form)), x)
    why = _cost.movement_form_decision(
        [(e.primitive.name, e.invars[0].aval.shape, e.outvars[0].aval.shape,
          [e.outvars[0].aval.shape[d] for d in e.params.get("dimensions", ())]
          if e.primitive.name == "rev" else ()) for e in em.eqns], ctx.target)
    if why is not None:
        raise Decline(f"structural form kept out: {why}")
    _check_aval(eqn.outvars[0], y)
    ctx.report.applied(NAME, eqn, after=[e.primitive.name for e in em.eqns])
    return em.replacement([y])


class _Keyed:
    """A static argument that hashes and compares by `key` (what determines `value`)."""
    __slots__ = ("key", "value")

    def __init__(self, key, value):
        self.key, self.value = key, value

    def __hash__(self):
        return hash(self.key)

    def __eq__(self, other):
        return isinstance(other, _Keyed) and self.key == other.key


def _moved_form(v, keyed: _Keyed):
    """A gather's structural form applied to `v` (module level: traced once per form)."""
    prog, fill_mask, fill_value, batched = keyed.value
    if batched is None:
        return _moved(v, prog, fill_mask, fill_value)
    return _batched(lambda u, lead: _moved(u, prog, fill_mask, fill_value, lead), *batched)(v)


def _batched(fn, wide: dict, rank: int):
    """`fn(v, lead)` on the core dims, applied along the operand dims in `wide` (→ their output
    dims), which are moved in front: `lead` of them."""
    pairs = sorted(wide.items(), key=lambda dj: dj[1])   # by output position
    front = [d for d, _ in pairs]
    perm_in = front + [d for d in range(rank) if d not in wide]

    def mapped(v):
        if perm_in != list(range(rank)):
            v = lax.transpose(v, perm_in)
        y = fn(v, len(pairs))
        n = y.ndim
        core = [j for j in range(n) if j not in wide.values()]
        perm_out = [0] * n           # output dim j takes result dim perm_out[j]
        for k, (_, j) in enumerate(pairs):
            perm_out[j] = k
        for k, j in enumerate(core):
            perm_out[j] = len(pairs) + k
        return y if perm_out == list(range(n)) else lax.transpose(y, perm_out)
    return mapped


def _dynamic_slice(eqn, ctx, statics):
    """dynamic_slice x s0 s1 ... (literal starts) -> slice. XLA clamps starts to [0, dim - size]."""
    x, *starts = eqn.invars
    vals = [statics.value(s) for s in starts]
    if any(v is None for v in vals):
        return None
    xa = C.aval_of(x)
    sizes = tuple(eqn.params["slice_sizes"])
    lo = _clamped_starts(vals, xa.shape, sizes)
    hi = tuple(a + k for a, k in zip(lo, sizes))
    em = _walk.Emitter(eqn)
    if tuple(lo) == (0,) * len(lo) and hi == tuple(xa.shape):
        ctx.report.applied(NAME, eqn, after=())
        return _walk.forward(eqn, [x])
    y, = em.call(lambda v: lax.slice(v, tuple(lo), hi), x)
    _check_aval(eqn.outvars[0], y)
    ctx.report.applied(NAME, eqn, after=["slice"])
    return em.replacement([y])


def _update(eqn, ctx, statics):
    """Static scatter / dynamic_update_slice -> select against the constant hit mask, where the
    target's cost row takes that form (`backend.cost.update_form`); else kept, with the reason.

    XLA updates a buffer in place: the update costs the elements it writes. The select form reads
    and writes the whole operand; it pays where it fuses away a kernel (the GPU) or where
    scalarize splits the updated axis (then it is renaming: `passes/scalarize.py` takes it there
    itself, so it is not made here for that). An update that writes every element once is taken
    on every target: nothing of the operand is kept, so there is no select, only the moved
    updates, which fuse where the scatter is a loop of its own (Jumanji's Sudoku writes its 81
    cells back box by box: `x.at[BOX_IDX].set(v)` -> `v` transposed).
    """
    if any(statics.value(a) is None for a in U.index_atoms(eqn)):
        return None  # dynamic indices: nothing to do (not a decline)
    operand, updated = U.sizes(eqn)
    feeds_selects = statics.only_used_by(eqn.outvars[0], "select_n")
    why = _cost.update_form_decision(ctx.target, operand, updated, ctx.options.gathers == "all",
                                     feeds_selects)
    if why is not None and updated < operand:
        raise Decline(why)  # (it cannot write every element)
    try:
        u = U.static_update(eqn, statics.value, ctx.options.fold_limit,
                            getattr(ctx, "cache", None))
    except Decline:
        if why is not None:
            raise Decline(why) from None
        raise
    if why is not None and not U.overwrites_all(u):
        raise Decline(why)
    concat = _cost.costs(ctx.target).scatter_concat_pieces  # the target's default (GPU: some)
    concat_ok = not u.lead or operand <= IM.SPLIT_MAX_ELEMENTS  # as the full map's
    rep = U.emit_select(eqn, u, lambda shape, m: _program(shape, m, ctx, concat, concat_ok),
                        LAX_OPS)
    ctx.report.applied(NAME, eqn, after=[e.primitive.name for e in rep.eqns])
    return rep


# --- mask permutations --------------------------------------------------------------------------

def _one_hot_source(mask: np.ndarray, axis: int):
    """For a 0/1 mask, the index along `axis` of each fiber's single 1 (-1: all zeros), or None."""
    if mask.dtype.kind not in "iub" or not np.all((mask == 0) | (mask == 1)):
        return None
    ones = np.sum(mask != 0, axis=axis)
    if np.any(ones > 1):
        return None
    return np.where(ones == 1, np.argmax(mask != 0, axis=axis), -1)


def _emit_permutation(eqn, ctx, x, smap):
    """`smap` from `x`, zeros where -1: structural if it can be, else the gather it is."""
    xa = C.aval_of(x)
    try:
        return _emit_moved(eqn, ctx, x, xa, smap, 0)
    except Decline:
        pass
    em = _walk.Emitter(eqn)
    n = _size(xa)
    idx = np.where(smap < 0, n, smap).astype(np.int32 if n < 2 ** 31 - 1 else np.int64)[..., None]
    dn = lax.GatherDimensionNumbers(offset_dims=(), collapsed_slice_dims=(0,), start_index_map=(0,))
    y, = em.call(lambda v: lax.gather(lax.reshape(v, (n,)), idx, dn, (1,),
                                      mode=lax.GatherScatterMode.FILL_OR_DROP, fill_value=0), x)
    _check_aval(eqn.outvars[0], y)
    ctx.report.applied(NAME, eqn, after=["gather"])
    return em.replacement([y])


def _dot_general(eqn, ctx, statics):
    """x @ M (or M @ x), M a constant 0/1 matrix with at most one 1 per output column, integer
    dtype: out = x[..., src] (0 where the column is empty); exact, since x * 0 == 0 and x + 0 == x."""
    (lc, rc), (lb, rb) = eqn.params["dimension_numbers"]
    if lb or rb or len(lc) != 1:
        return None
    lhs, rhs = eqn.invars
    out = eqn.outvars[0].aval
    for const_side, (m_atom, x_atom, mc, xc) in enumerate(((rhs, lhs, rc[0], lc[0]),
                                                           (lhs, rhs, lc[0], rc[0]))):
        m = statics.value(m_atom)
        if m is None or m.ndim != 2 or statics.value(x_atom) is not None:
            continue
        xa = C.aval_of(x_atom)
        if np.dtype(out.dtype).kind not in "iu" or out.dtype != xa.dtype:
            raise Decline("mask permutation of a floating or converted dtype (0 * inf is NaN)")
        src = _one_hot_source(m, mc)
        if src is None:
            return None
        t = _tagged(xa.shape)
        moved = np.take(t, np.maximum(src, 0), axis=xc)
        smap = np.moveaxis(moved, xc, -1 if const_side == 0 else 0)
        fills = np.moveaxis(np.broadcast_to(
            np.expand_dims(src < 0, tuple(d for d in range(xa.ndim) if d != xc)), moved.shape),
            xc, -1 if const_side == 0 else 0)
        smap = np.where(fills, IM.FILL, smap)
        if smap.shape != tuple(out.shape):
            return None
        return _emit_permutation(eqn, ctx, x_atom, smap)
    return None


def _reduce_sum(eqn, ctx, statics):
    """sum(P * M, axes), M a constant 0/1 mask with at most one 1 per reduced fiber, integer
    dtype: out = P at that 1 (0 where none); P itself read through its broadcast, if any."""
    prod = statics.producer(eqn.invars[0])
    if prod is None or prod.primitive.name != "mul":
        return None
    axes = tuple(eqn.params["axes"])
    a, b = prod.invars
    m = statics.value(b)
    p_atom = a
    if m is None:
        m, p_atom = statics.value(a), b
    if m is None or statics.value(p_atom) is not None:
        return None
    pa = C.aval_of(p_atom)
    if np.dtype(pa.dtype).kind not in "iu" or eqn.outvars[0].aval.dtype != pa.dtype:
        raise Decline("mask permutation of a floating dtype (0 * inf is NaN)")
    shape = tuple(prod.outvars[0].aval.shape)  # mul broadcasts size-1 dims of its operands
    if len(pa.shape) != len(shape) or np.ndim(m) != len(shape):
        return None
    m = np.broadcast_to(m, shape)
    keep = [d for d in range(len(shape)) if d not in axes]
    mt = np.transpose(m, keep + list(axes)).reshape([shape[d] for d in keep] + [-1])
    src = _one_hot_source(mt, mt.ndim - 1)
    if src is None:
        return None
    tp = np.broadcast_to(_tagged(pa.shape), shape)
    t = np.transpose(tp, keep + list(axes)).reshape(mt.shape)
    smap = np.take_along_axis(t, np.maximum(src, 0)[..., None], axis=-1)[..., 0]
    smap = np.where(src < 0, IM.FILL, smap)
    # Read through a broadcast of x: compose with the broadcast's own source map.
    x_atom, bprod = p_atom, statics.producer(p_atom)
    if bprod is not None and bprod.primitive.name == "broadcast_in_dim" and \
            C.replicated(bprod.params.get("sharding")):
        src_x = bprod.invars[0]
        sa = C.aval_of(src_x)
        bmap = IM.NUMPY_OPS.broadcast_in_dim(_tagged(sa.shape), tuple(pa.shape),
                                             tuple(bprod.params["broadcast_dimensions"]))
        smap = np.where(smap < 0, IM.FILL, bmap.reshape(-1)[np.maximum(smap, 0)])
        x_atom = src_x
    return _emit_permutation(eqn, ctx, x_atom, smap)


RULES = {
    "gather": _gather,
    "dot_general": _dot_general,
    "reduce_sum": _reduce_sum,
    "dynamic_slice": _dynamic_slice,
    **{name: _update for name in U.UPDATES},
}


def _unbatched(eqn, ctx, statics):
    """A gather or scatter the rules left as it was, whose static indices are the same along a
    batching dim (a vmapped `switch` branch's table, or a table broadcast over the batch): the
    same operation with the batch as a window dim and one row of the table. XLA then reads no
    batch-sized index: on the CPU a turn of 4,096 cubes ran 0.33x the broadcast table's time
    and 0.6x the constant table's, and compiles without a constant of the batch's size.

        before:  y = gather x T      T: i32[4096,12,3], every row the same; batching dims (0, 0)
        after:   y = gather x T0     T0: i32[12,3]; offset_dims=(0,), slice_sizes=(4096,1,1,1)
    """
    name = eqn.primitive.name
    if name != "gather" and name not in U.SCATTERS or _exact.on(ctx):
        return None
    idx_atom = eqn.invars[1]
    idx = statics.value(idx_atom)
    if idx is None or idx.ndim < 2:
        return None
    repeated = [d for d in repeats.equal_axes(idx) if d < idx.ndim - 1]
    if not repeated:
        return None
    p = eqn.params
    xa = C.aval_of(eqn.invars[0])
    if name == "gather":
        r = IM.gather_unbatched(xa.shape, idx.shape, p["dimension_numbers"], p["slice_sizes"],
                                repeated)
        if r is None or not _gather_defined(eqn, repeats.core(idx, repeated)):
            return None
        dn, sizes, gone = r
        params = {**p, "dimension_numbers": dn, "slice_sizes": sizes}
    else:
        r = IM.scatter_unbatched(xa.shape, idx.shape, C.aval_of(eqn.invars[2]).shape,
                                 p["dimension_numbers"], repeated)
        if r is None or not _one_write_each(eqn, idx):
            return None
        dn, gone = r
        params = {**p, "dimension_numbers": dn}
    table = repeats.row(idx, gone)
    new_idx = C.literal(table, C.aval_of(idx_atom).update(shape=table.shape))
    invars = [eqn.invars[0], new_idx, *eqn.invars[2:]]
    outs = C.abstract_eval(eqn.primitive, [C.aval_of(a) for a in invars], **params)
    if [(o.shape, o.dtype) for o in outs] != [(v.aval.shape, v.aval.dtype) for v in eqn.outvars]:
        return None    # (not expected: the dimension numbers say the same shapes)
    ctx.report.applied(NAME, eqn, after=[f"{name} (the batch a window, one row of the table)"])
    return _walk.Replacement([eqn.replace(invars=invars, params=params)], list(eqn.outvars))


def _gather_defined(eqn, idx) -> bool:
    """Whether a gather's result is defined for `idx`: a PROMISE_IN_BOUNDS start out of range is
    implementation-defined (JAX's result is not ours to reproduce in another form)."""
    p = eqn.params
    if IM.mode_name(p["mode"]) != "promise":
        return True
    shape, sizes = C.aval_of(eqn.invars[0]).shape, p["slice_sizes"]
    start_map = p["dimension_numbers"].start_index_map
    return all(bool(np.all((idx[..., k] >= 0) & (idx[..., k] <= shape[m] - sizes[m])))
               for k, m in enumerate(start_map))


def _one_write_each(eqn, idx) -> bool:
    """Whether a scatter's result is defined and writes each element at most once (one batch
    row's map). With duplicate targets, which update wins is XLA's choice; an integer sum would
    be exact in any order, but no real program has needed it, and it stays batched as written.
    (The map declines a PROMISE_IN_BOUNDS index out of range.)"""
    xa, ua = C.aval_of(eqn.invars[0]), C.aval_of(eqn.invars[2])
    dn, mode = eqn.params["dimension_numbers"], eqn.params["mode"]
    batch = IM.scatter_batch_core(xa.shape, ua.shape, idx, dn, 0)
    if batch is None and U.size(xa) > SCATTER_CHECK_LIMIT:
        return False    # (a batch not leading: its map would be the whole batch's)
    try:
        target = (IM.scatter_map(batch[1], batch[2], batch[3], dn, mode) if batch
                  else IM.scatter_map(xa.shape, ua.shape, idx, dn, mode))
    except Decline:
        return False
    return U.written_once(target) is not None


def _unfolded_index(eqn, ctx, statics):
    """A gather or update whose index is computed from constants but is no literal: a
    `Decline` saying why, so that no static gather or update is left in silence."""
    atoms = U.index_atoms(eqn) if eqn.primitive.name in U.UPDATES else eqn.invars[1:2]
    idx = next((a for a in atoms if not C.is_literal(a) and a in statics.from_constants
                and statics.value(a) is None), None)
    if idx is None:
        return
    n = _size(C.aval_of(idx))
    limit = ctx.options.fold_limit
    if n > limit:
        raise Decline(f"index computed from constants, {n} elements: above fold_limit={limit}, "
                      "not folded")
    if not ctx.options.fold:
        raise Decline("index computed from constants, not folded (fold=False)")
    raise Decline("index computed from constants that folding did not evaluate (a floating-point "
                  "step, or a value folding keeps as an equation and passes to a call)")


def _level(cj, ctx):
    if not any(e.primitive.name in RULES for e in cj.jaxpr.eqns):
        return cj  # nothing this pass rewrites at this level
    # numpy index tables only: already in host memory (a jax Array might be a device's weights)
    statics = _Statics({v: c for v, c in zip(cj.jaxpr.constvars, cj.consts)
                        if isinstance(c, (np.ndarray, np.generic)) and c.dtype.kind in "iub"},
                       ctx.options.fold_limit, cj.jaxpr.eqns, cj.jaxpr.outvars)

    def rule(eqn):
        statics.see(eqn)
        fn = RULES.get(eqn.primitive.name)
        if fn is None:
            return None
        try:
            # exact=True: a float gather with static indices keeps XLA's fusion around it (checked
            # before the rule, which records what it applies)
            if _exact.on(ctx) and any(statics.value(a) is not None for a in eqn.invars[1:]):
                _exact.check(ctx, _exact.eqn_atoms(eqn), "rewriting a gather/scatter of")
            if eqn.primitive.name == "gather" or eqn.primitive.name in U.UPDATES:
                _unfolded_index(eqn, ctx, statics)
            return fn(eqn, ctx, statics)
        except Decline as d:
            ctx.report.declined(NAME, eqn, str(d))
        try:
            return _unbatched(eqn, ctx, statics)
        except Decline as d:
            ctx.report.declined(NAME, eqn, f"its batch not made a window: {d}")
            return None

    j, changed = _walk.rewrite_eqns(cj.jaxpr, rule)
    if not changed:
        return cj
    return C.closed(j, cj.consts)


def run(cj: C.ClosedJaxpr, ctx) -> tuple[C.ClosedJaxpr, bool]:
    """Rewrite static gathers/scatters/dynamic slices at every level."""
    flag = {"changed": False}

    def fn(c):
        out = _level(c, ctx)
        if out is not c:
            flag["changed"] = True
        return out

    out = _walk.map_jaxprs(cj, fn)
    return out, flag["changed"]
