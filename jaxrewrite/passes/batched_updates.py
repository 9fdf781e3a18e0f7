"""Scatters with batching dims become selects on iota masks, where the target loops over the batch.

`jax.vmap` of `lax.dynamic_update_slice`, and of `.at[i].set(v)` at a per-example index, is a
scatter with `operand_batching_dims`. XLA:TPU runs that scatter as a while loop over the batch,
one trip per example (jax-ml/jax#21367, openxla/xla#12982). Written as one select per window
position, it is elementwise code that XLA fuses into one loop over the operand:

    y:f32[B,N] = scatter[operand_batching_dims=(0,), scatter_indices_batching_dims=(0,),
                         update_window_dims=(1,), scatter_dims_to_operand_dims=(1,), mode=CLIP]
                 x s:i32[B,1] u:f32[B,w]
  ->
    c:i32[B,1] = clamp 0 s (N - w)             FILL_OR_DROP: c = select_n(in_bounds, N, s)
    d:i32[B,N] = sub (iota[B,N] 1) (broadcast c)
    y1 = select_n (eq d 0) x  (broadcast u[:, 0:1])
    y2 = select_n (eq d 1) y1 (broadcast u[:, 1:2])
    ...                                        w selects: one per window position
    y  = select_n (eq d (w-1)) y(w-1) (broadcast u[:, w-1:w])

In general: the starts are read per example along every indexed operand dim; a dim the window
covers whole has start 0 (CLIP) or drops the window unless it is 0 (FILL_OR_DROP); along the dims
the start moves along, one select per window position (product of their window sizes), its mask
the conjunction of `d_k == offset_k`. `scatter-add/mul/min/max` of integers: `select_n(hit, y,
y op v)` (exact in any order, so several index rows per example are taken too, one select per
row and position).

Bit for bit: a select moves bits (NaN payloads, -0.0), and float operands are selected as their
unsigned words (`bitcast_convert_type` in, selects on the words, `bitcast_convert_type` out;
complex: its two parts' words), so no float value meets any other equation: XLA:TPU changed
the bits of float words this form moved (-0.0 to +0.0, NaN payloads quieted, seen on a v5e)
where XLA:CPU did not. The clamp is `_clamp_scatter_indices`'s
(0 <= start <= N - w, per example), FILL_OR_DROP drops a whole window with any start out of
[0, N - w] (the sentinel start N hits no element); the clamp and the bounds are computed in the
index dtype, before the (then value-preserving) conversion to int32. Gradients: a custom JVP,
the float select form on the tangents (those of select, broadcast and slice), by value the
scatter's (a written element's cotangent goes to its
update, the others' to the operand).

Preconditions and declines (recorded with a reason, the scatter kept):
* the target's cost row takes the form (`backend.cost.batched_update_decision`): the TPU; the CPU
  updates in place and the GPU makes one scatter kernel, so there the pass does nothing at all;
* window positions at most `batched_update_max_positions`, and one example's operand elements
  times positions at most `batched_update_max_work` (every select reads the whole operand);
* mode CLIP or FILL_OR_DROP (PROMISE_IN_BOUNDS out of range is implementation-defined);
* `scatter` (set) with one index row per example; several rows may write one element, and which
  wins is implementation-defined. Floating add/mul/min/max are kept (`passes/_updates.py`'s
  reasons: an FMA where the sum fuses with a product, JAX's own gradient rules), so are custom
  update computations, extended dtypes, 16-bit floats (jax.jit's bits for a signaling NaN are
  the backend's), 64-bit floats (XLA:TPU emulates them: their words are not IEEE's), a window that leaves a non-indexed dim partly unwritten,
  a program partitioned over several devices, and float values under `exact=True` (the
  select's fusion with its neighbours, as the gathers pass).
"""
from __future__ import annotations

import dataclasses
import functools
import itertools

import jax
import numpy as np
from jax import lax

from .. import _compat as C
from .. import _walk
from ..analysis import exact as _exact
from ..analysis import indexmap as IM
from ..backend import cost as _cost
from ..report.records import Decline
from . import _updates as U

NAME = "batched_updates"

_INT = frozenset("iu")  # dtypes whose add/mul/min/max are exact in any order (bool has no add)

# Why a floating combine stays a scatter (as in passes/_updates.py).
_FLOAT_ADD = ("a float sum may be contracted with a product feeding it into one FMA where the "
              "select form fuses with it (not bit for bit)")
_FLOAT_MUL = ("the exact form would use the operand twice (its gradient summed in another "
              "order) or multiply by 1 (quieting signaling NaNs)")
_FLOAT_MINMAX = "JAX's scatter-min/max gradient rule (ties) is not lax.min/max's"

# primitive -> (combine(old, new): None for set; dtype kinds it is taken for; why others are kept)
RULES = {
    "scatter": (None, None, None),
    "scatter-add": (lax.add, _INT, _FLOAT_ADD), "scatter_add": (lax.add, _INT, _FLOAT_ADD),
    "scatter-mul": (lax.mul, _INT, _FLOAT_MUL), "scatter_mul": (lax.mul, _INT, _FLOAT_MUL),
    "scatter-min": (lax.min, _INT, _FLOAT_MINMAX), "scatter_min": (lax.min, _INT, _FLOAT_MINMAX),
    "scatter-max": (lax.max, _INT, _FLOAT_MINMAX), "scatter_max": (lax.max, _INT, _FLOAT_MINMAX),
}


@dataclasses.dataclass(frozen=True)
class Plan:
    """How one scatter with batching dims is written as selects (hashable: a traced form's key).

    `idx_perm`/`upd_perm`: transposes to (batch dims in operand order, row dims, index vector)
    and (row dims, then one dim per operand dim); `canon`: the update's shape after that (the
    rows as one dim where there are several, size 1 at inserted dims); `starts`: per operand
    dim, (index component, window size, dim size, moving) for indexed dims, else None; `rows`:
    index rows per example."""
    shape: tuple
    batch_dims: tuple          # operand batching dims, ascending
    idx_perm: tuple
    upd_perm: tuple
    canon: tuple
    starts: tuple
    rows: int
    clip: bool
    combine: object


def _plan(eqn, ctx) -> Plan | None:
    """The plan of `eqn`, None where it is no batched scatter, `Decline` where the form is not
    taken."""
    name = eqn.primitive.name
    p = eqn.params
    dn = p["dimension_numbers"]
    if name not in RULES or not dn.operand_batching_dims:
        return None
    x, idx, upd = eqn.invars
    xa, ia, ua = C.aval_of(x), C.aval_of(idx), C.aval_of(upd)
    if 0 in xa.shape or 0 in ua.shape:
        return None        # (writes nothing)
    mode = IM.mode_name(p["mode"])
    if mode == "promise":
        raise Decline("PROMISE_IN_BOUNDS: an index out of range is implementation-defined")
    combine, kinds, why = RULES[name]
    if name == "scatter" and p.get("update_jaxpr") is not None:
        raise Decline("scatter with a custom update computation")
    if C.is_extended_dtype(xa.dtype):
        raise Decline("scatter into an extended dtype")
    if np.dtype(xa.dtype).kind in "fc" and np.dtype(xa.dtype).itemsize < 4:
        # XLA:CPU scatters 16-bit floats through f32 (its float normalization), which quiets a
        # signaling NaN: jax.jit's bits there are the backend's, not the data's
        raise Decline(f"scatter of {xa.dtype}: jax.jit's result for a signaling NaN depends "
                      "on the backend (XLA:CPU quiets it)")
    if np.dtype(xa.dtype).kind in "fc" and _float_part_bytes(xa.dtype) == 8:
        # XLA:TPU emulates 64-bit floats: their bitcast to u64 is not the IEEE words (every
        # element of a float64 window came back wrong on a v5e, Dec 7), so the word form
        # cannot move them; the float form was not checked there
        raise Decline(f"scatter of {xa.dtype}: the TPU emulates 64-bit floats, whose words "
                      "the selects would move are not IEEE's")
    if kinds is not None and np.dtype(xa.dtype).kind not in kinds:
        raise Decline(f"{name} of {xa.dtype}: {why}")
    if ctx.devices > 1:
        raise Decline(f"program partitioned over {ctx.devices} devices")
    if max(xa.shape) >= 2 ** 31 - 1:
        raise Decline("an operand dim of 2**31 - 1 or more elements (int32 positions)")
    _exact.check(ctx, _exact.eqn_atoms(eqn), "rewriting a batched scatter of")

    R, ivd = len(xa.shape), len(ia.shape) - 1
    obd, sibd = tuple(dn.operand_batching_dims), tuple(dn.scatter_indices_batching_dims)
    sdod, iwd, uwd = (tuple(dn.scatter_dims_to_operand_dims), tuple(dn.inserted_window_dims),
                      tuple(dn.update_window_dims))
    row_dims = tuple(d for d in range(ivd) if d not in sibd)
    rows = int(np.prod([ia.shape[d] for d in row_dims], dtype=np.int64))
    if rows > 1 and combine is None:
        raise Decline(f"{rows} index rows per example may write the same element: which one "
                      "wins is implementation-defined")
    batch_dims = tuple(sorted(obd))
    idx_perm = tuple(sibd[obd.index(d)] for d in batch_dims) + row_dims + (ivd,)
    # the update: scatter dims (the index dims in order), window dims (operand dims in order)
    scatter_upd = [d for d in range(len(ua.shape)) if d not in uwd]
    window_op = [d for d in range(R) if d not in iwd and d not in obd]
    of_index = dict(zip([d for d in range(ivd)], scatter_upd))   # index dim -> update dim
    upd_of_op = {d: of_index[sibd[obd.index(d)]] for d in obd}
    upd_of_op.update(zip(window_op, uwd))
    upd_perm = tuple(of_index[d] for d in row_dims) + tuple(
        upd_of_op[d] for d in range(R) if d in upd_of_op)
    window = [1 if (d in iwd or d in obd) else ua.shape[upd_of_op[d]] for d in range(R)]
    canon = ((rows,) if rows > 1 else ()) + tuple(
        xa.shape[d] if d in obd else window[d] for d in range(R))

    starts, positions = [], rows
    for d in range(R):
        if d in obd:
            starts.append(None)
        elif d in sdod:
            moving = window[d] < xa.shape[d]
            starts.append((sdod.index(d), window[d], xa.shape[d], moving))
            positions *= window[d] if moving else 1
        elif window[d] != xa.shape[d]:
            raise Decline(f"the window covers {window[d]} of {xa.shape[d]} elements of the "
                          f"non-indexed dim {d} (a pad)")
        else:
            starts.append(None)
    example = int(np.prod([xa.shape[d] for d in range(R) if d not in obd], dtype=np.int64))
    reason = _cost.batched_update_decision(ctx.target, positions, example)
    if reason is not None:
        raise Decline(reason)
    return Plan(tuple(xa.shape), batch_dims, idx_perm, upd_perm, canon, tuple(starts), rows,
                mode == "clip", combine)


def _start(s, window: int, n: int, clip: bool):
    """(start as int32, in bounds or None): XLA's clamp to [0, n - window] (CLIP), or the start
    and whether the window lies in [0, n) (FILL_OR_DROP), computed in the index dtype."""
    info = np.iinfo(s.dtype)
    signed = info.min < 0
    bound = n - window
    scalar = np.dtype(s.dtype).type      # (a scalar operand: no broadcast equation)
    if clip:
        if signed:
            s = lax.max(s, scalar(0))
        s = lax.min(s, scalar(min(bound, info.max)))
        return lax.convert_element_type(s, np.int32), None
    ok = None
    if signed:
        ok = lax.ge(s, scalar(0))
    if bound < info.max:
        le = lax.le(s, scalar(bound))
        ok = le if ok is None else lax.bitwise_and(ok, le)
    # (an out-of-range start wraps here; it is replaced where the window is dropped)
    return lax.convert_element_type(s, np.int32), ok


def _permuted(a, perm, shape):
    """`a` transposed by `perm` and reshaped to `shape`; a transpose that keeps the order of
    the dims larger than 1 is a reshape."""
    if [d for d in perm if a.shape[d] != 1] != [d for d in range(a.ndim) if a.shape[d] != 1]:
        a = lax.transpose(a, perm)
    return a if a.shape == shape else lax.reshape(a, shape)


def _form(x, idx, upd, plan: Plan):
    """The select form of one batched scatter (module level: traced once per plan); float
    values move as their integer words (`_as_words`)."""
    if np.dtype(x.dtype).kind in "fc":
        return _as_words(x, idx, upd, plan)
    return _selects(x, idx, upd, plan)


def _float_part_bytes(dtype) -> int:
    dt = np.dtype(dtype)
    return dt.itemsize // 2 if dt.kind == "c" else dt.itemsize


def _words(a):
    """The unsigned words of a float array (complex: of its real and imaginary parts)."""
    if np.dtype(a.dtype).kind == "c":
        return _words(lax.real(a)) + _words(lax.imag(a))
    return [lax.bitcast_convert_type(a, np.dtype(f"u{np.dtype(a.dtype).itemsize}"))]


def _floats(words, dtype):
    """`_words` undone."""
    if np.dtype(dtype).kind == "c":
        part = np.dtype(f"f{np.dtype(dtype).itemsize // 2}")
        return lax.complex(*[lax.bitcast_convert_type(w, part) for w in words])
    return lax.bitcast_convert_type(words[0], dtype)


@functools.partial(jax.custom_jvp, nondiff_argnums=(3,))
def _as_words(x, idx, upd, plan: Plan):
    """The selects on the words of `x` and `upd`: no float value is an operand of any equation
    but a bitcast. (The float form, slices, broadcasts and selects only, gave +0.0 for -0.0 and
    a canonical NaN for NaNs with payloads on a TPU v5e, Dec 6: 3 of 120 elements of a nested
    vmap; XLA:CPU kept them. Which of XLA:TPU's lowerings does it was not isolated; an unsigned
    word has no -0.0 and no NaN, whatever instructions move it.) Its tangent is the float
    select form on the tangents (the bitcasts have none)."""
    return _floats([_selects(xw, idx, uw, plan) for xw, uw in zip(_words(x), _words(upd))],
                   x.dtype)


@_as_words.defjvp
def _as_words_jvp(plan, primals, tangents):
    x, idx, upd = primals
    tx, _, tu = tangents
    return _as_words(x, idx, upd, plan), _selects(tx, idx, tu, plan)


def _selects(x, idx, upd, plan: Plan):
    """One select per window position and index row (the module docstring's form)."""
    R = len(plan.shape)
    every = tuple(range(R))
    # per-example values keep the batch dims in place and size 1 elsewhere (broadcast_in_dim
    # expands them to the operand's shape)
    per_example = tuple(n if d in plan.batch_dims else 1 for d, n in enumerate(plan.shape))
    bshape = tuple(plan.shape[d] for d in plan.batch_dims)
    idx = _permuted(idx, plan.idx_perm, bshape + (plan.rows, idx.shape[-1]))
    upd = _permuted(upd, plan.upd_perm, plan.canon)
    y = x
    for r in range(plan.rows):
        rel, ok = {}, None
        for d, st in enumerate(plan.starts):
            if st is None:
                continue
            comp, window, n, moving = st
            nb = len(bshape)
            s = lax.reshape(lax.slice(idx, (0,) * nb + (r, comp), bshape + (r + 1, comp + 1)),
                            per_example)
            s, in_bounds = _start(s, window, n, plan.clip)
            if in_bounds is not None:
                ok = in_bounds if ok is None else lax.bitwise_and(ok, in_bounds)
            if moving:
                rel[d] = s
        if ok is not None:
            # a dropped window starts at n along each dim it moves along: it hits nothing
            rel = {d: lax.select(ok, s, lax.full_like(s, plan.shape[d])) for d, s in rel.items()}
        rel = {d: lax.sub(lax.broadcasted_iota(np.int32, plan.shape, d),
                          lax.broadcast_in_dim(s, plan.shape, every)) for d, s in rel.items()}
        moving = sorted(rel)
        row = upd if plan.rows == 1 else lax.reshape(
            lax.slice_in_dim(upd, r, r + 1, axis=0), plan.canon[1:])
        for offsets in itertools.product(*[range(plan.starts[d][1]) for d in moving]):
            lo, hi = [0] * R, list(row.shape)
            for d, k in zip(moving, offsets):
                lo[d], hi[d] = k, k + 1
            v = lax.broadcast_in_dim(lax.slice(row, lo, hi), plan.shape, every)
            hit = None
            for d, k in zip(moving, offsets):
                eq = lax.eq(rel[d], np.int32(k))
                hit = eq if hit is None else lax.bitwise_and(hit, eq)
            if hit is None and ok is not None:   # nothing moves: the example, where it is kept
                hit = lax.broadcast_in_dim(ok, plan.shape, every)
            new = v if plan.combine is None else plan.combine(y, v)
            y = new if hit is None else lax.select(hit, new, y)
    return y


def _rule(eqn, ctx):
    plan = _plan(eqn, ctx)
    if plan is None:
        return None
    em = _walk.Emitter(eqn)
    y, = em.call_shared(_form, *eqn.invars, static=(plan,))
    U.check_aval(eqn.outvars[0], y)
    positions = plan.rows * int(np.prod([st[1] for st in plan.starts if st and st[3]]))
    ctx.report.applied(NAME, eqn, after=[e.primitive.name for e in em.eqns],
                       note=f"{positions} select(s) over the operand in place of a loop over "
                            "the batch")
    return em.replacement([y])


def _level(cj, ctx):
    if not any(e.primitive.name in RULES for e in cj.jaxpr.eqns):
        return cj

    def rule(eqn):
        if eqn.primitive.name not in RULES:
            return None
        try:
            return _rule(eqn, ctx)
        except Decline as d:
            ctx.report.declined(NAME, eqn, str(d))
            return None

    j, changed = _walk.rewrite_eqns(cj.jaxpr, rule)
    return C.closed(j, cj.consts) if changed else cj


def run(cj: C.ClosedJaxpr, ctx) -> tuple[C.ClosedJaxpr, bool]:
    """Rewrite batched scatters at every level, on targets whose cost row takes the form."""
    if not _cost.costs(ctx.target).batched_update_max_positions:
        return cj, False
    out = _walk.map_jaxprs(cj, lambda c: _level(c, ctx))   # (the same object where unchanged)
    return out, out is not cj
