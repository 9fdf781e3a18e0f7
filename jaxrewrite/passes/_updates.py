"""Static-index updates (scatters, `dynamic_update_slice` with literal starts) and their select form.

Shared by two passes, which decide differently whether to take the form:

* `passes/gathers.py` takes it on targets whose cost row says a select is cheaper than the update
  (`backend.cost.TargetCosts.update_form == "select"`: the GPU, where the select fuses with its
  neighbours and the scatter is a kernel of its own);
* `passes/scalarize.py` takes it, on the other targets, only inside a level it splits: there the
  select along a split axis is renaming, and where it declines the update stays as it was.

The form (one layer per duplicate depth; unique targets give one layer):

    y = scatter x idx v        (.at[idx].set)   ->  y = select_n(hit, x, moved(v))
    y = scatter-add x idx v    (integers)       ->  y = x + select_n(hit, 0, moved(v))
    y = scatter x perm v       (every element written once)  ->  y = moved(v)   (no select)
    y = scatter-mul/min/max x idx v (integers)  ->  y = select_n(hit, x, x ⊕ moved(v))
    y = dynamic_update_slice x u 1 2            ->  y = select_n(window, x, moved(u))

`hit` is a constant mask, broadcast from the axes along which it varies; `moved(v)` places the
updates with slices, reverses, transposes, reshapes and broadcasts (`analysis.indexmap`).
"""
from __future__ import annotations

import dataclasses
from typing import Callable

import numpy as np
from jax import lax

from .. import _compat as C
from .. import _walk
from ..analysis import indexmap as IM
from .._memo import array_key, memo
from ..report.records import Decline

# Operand dims above this size that every update window covers whole (a vmapped update's batch)
# are left out of the index map: the layers are applied under `vmap` over them.
WIDE_DIM = 64


class _LaxOps:
    """`analysis.indexmap.apply_program`'s operations as lax calls (they emit equations)."""
    reshape = staticmethod(lambda x, shape: lax.reshape(x, tuple(shape)))
    slice = staticmethod(lambda x, s, l, k: lax.slice(x, tuple(s), tuple(l), tuple(k)))
    rev = staticmethod(lambda x, dims: lax.rev(x, tuple(dims)))
    transpose = staticmethod(lambda x, perm: lax.transpose(x, tuple(perm)))
    broadcast_in_dim = staticmethod(
        lambda x, shape, dims: lax.broadcast_in_dim(x, tuple(shape), tuple(dims)))
    concatenate = staticmethod(lambda xs, axis: lax.concatenate(list(xs), axis))


LAX_OPS = _LaxOps()


def _combine_add(a, b):
    return lax.add(a, b)


def _combine_mul(a, b):
    return lax.mul(a, b)


def _additive_identity(dtype):
    kind = np.dtype(dtype).kind
    if kind == "f" or dtype == np.dtype("bfloat16") or kind == "V":
        return -0.0
    if kind == "c":
        return complex(-0.0, -0.0)
    return 0


_INT = lambda dt: np.dtype(dt).kind in "iub"  # noqa: E731
_ANY = lambda dt: True  # noqa: E731
_NEVER = lambda dt: False  # noqa: E731

# scatter primitive -> (combine(old, new), None for set; exact with duplicate targets for which
# dtypes; rewritten for which dtypes). Floating min/max are kept: JAX's scatter-min/max gradient
# rule (ties, clipped indices) is not lax.min's; floating mul too: the exact form would use the
# operand twice (gradient summed in another order) or multiply by 1 (quiets signaling NaNs).
SCATTERS = {
    "scatter": (None, _NEVER, _ANY),
    # Floating add is kept as a scatter: fuzzing found `scatter-add(x, i, v) + x` differing by an
    # ulp from `x + select(hit, v, -0.0) + x` once compiled by XLA:CPU (tests/test_regressions).
    "scatter-add": (_combine_add, _INT, _INT),
    "scatter_add": (_combine_add, _INT, _INT),
    "scatter-mul": (_combine_mul, _INT, _INT),
    "scatter_mul": (_combine_mul, _INT, _INT),
    "scatter-min": (lax.min, _ANY, _INT),
    "scatter_min": (lax.min, _ANY, _INT),
    "scatter-max": (lax.max, _ANY, _INT),
    "scatter_max": (lax.max, _ANY, _INT),
}
UPDATES = frozenset(SCATTERS) | {"dynamic_update_slice"}


@dataclasses.dataclass(frozen=True)
class Update:
    """A static update: `target` maps each (core) update element to its flat operand index
    (-1: dropped); the `lead` leading dims of operand and updates pass through whole."""
    x: object
    upd: object
    target: np.ndarray
    combine: Callable | None
    dup_ok: Callable
    lead: int = 0


def size(aval) -> int:
    return int(np.prod(aval.shape, dtype=np.int64))


is_extended = C.is_extended_dtype


def tagged(shape):
    return np.arange(int(np.prod(shape, dtype=np.int64)), dtype=np.int64).reshape(shape)


def reduced_mask(mask: np.ndarray):
    """(small mask, broadcast dims): `mask` kept only along the axes where it varies."""
    dims = tuple(d for d in range(mask.ndim)
                 if mask.shape[d] > 1 and not np.all(mask == np.take(mask, [0], axis=d)))
    small = mask[tuple(slice(None) if d in dims else 0 for d in range(mask.ndim))]
    return np.array(small), dims  # (ascontiguousarray would make a 0-d mask 1-d)


def clamped_starts(vals, shape, sizes):
    """XLA's dynamic-slice start clamping to [0, dim - size]."""
    lo = []
    for v, n, k in zip(vals, shape, sizes):
        dt = np.asarray(v).dtype
        v = int(np.asarray(v).item())
        bound = n - k
        if (v < 0 or v > bound) and bound > np.iinfo(dt).max:
            raise Decline("clamp bound not representable in the start index dtype")
        lo.append(min(max(v, 0), bound))
    return lo


def index_atoms(eqn) -> list:
    """The operands that say where `eqn` (a scatter or dynamic_update_slice) writes."""
    return list(eqn.invars[2:] if eqn.primitive.name == "dynamic_update_slice" else eqn.invars[1:2])


def sizes(eqn) -> tuple[int, int]:
    """(operand elements, update elements) of a scatter or dynamic_update_slice."""
    return size(C.aval_of(eqn.invars[0])), size(C.aval_of(
        eqn.invars[1] if eqn.primitive.name == "dynamic_update_slice" else eqn.invars[2]))


def static_update(eqn, value_of: Callable, fold_limit: int, cache=None) -> Update | None:
    """The `Update` of a scatter or `dynamic_update_slice` whose indices `value_of` knows; None
    where they are not known; `Decline` where the select form would not be exact."""
    if eqn.primitive.name == "dynamic_update_slice":
        return _dynamic_update_slice(eqn, value_of, fold_limit)
    x, idx_atom, upd = eqn.invars
    idx = value_of(idx_atom)
    if idx is None:
        return None
    combine, dup_ok, dtype_ok = SCATTERS[eqn.primitive.name]
    p = eqn.params
    if eqn.primitive.name == "scatter" and p.get("update_jaxpr") is not None:
        raise Decline("scatter with a custom update computation")
    xa, ua = C.aval_of(x), C.aval_of(upd)
    if is_extended(xa.dtype):
        raise Decline("scatter into an extended dtype")
    if not dtype_ok(xa.dtype):
        raise Decline(f"{eqn.primitive.name} of {xa.dtype}: JAX's gradient rule differs from the "
                      "elementwise form's")
    dn = p["dimension_numbers"]
    # the map of one window: leading dims every update window covers whole pass through
    lead, xs, us = IM.scatter_window_core(xa.shape, ua.shape, dn, WIDE_DIM)
    if not lead and (batch := IM.scatter_batch_core(xa.shape, ua.shape, idx, dn, WIDE_DIM)):
        lead, xs, us, idx = batch  # (RubiksCube's vmapped face turns: 221,184 entries -> 54)
    # (the limit bounds the map, which leaves those dims out: a vmapped `.at[0].set` of
    # 65,536 x 25 lanes maps 25)
    if np.prod(xs, dtype=np.int64) > fold_limit or np.prod(us, dtype=np.int64) > fold_limit:
        raise Decline(f"operand or updates above fold_limit={fold_limit} elements")
    target = memo(cache, "updates.scatter_map", (xs, us, array_key(idx), dn, p["mode"]),
                  lambda: IM.scatter_map(xs, us, idx, dn, p["mode"]))
    return Update(x, upd, target, combine, dup_ok, lead)


def _dynamic_update_slice(eqn, value_of, fold_limit):
    x, upd, *starts = eqn.invars
    vals = [value_of(s) for s in starts]
    if any(v is None for v in vals):
        return None
    xa, ua = C.aval_of(x), C.aval_of(upd)
    if is_extended(xa.dtype):
        raise Decline("dynamic_update_slice of an extended dtype")
    if size(xa) > fold_limit:
        raise Decline(f"operand above fold_limit={fold_limit} elements")
    lo = clamped_starts(vals, xa.shape, ua.shape)
    # leading dims the update covers whole (start 0) pass through, as a scatter's
    lead = 0
    while lead < len(lo) and ua.shape[lead] == xa.shape[lead] < 2 ** 31:
        lead += 1
    if int(np.prod(xa.shape[:lead], dtype=np.int64)) <= WIDE_DIM:
        lead = 0
    xs = (1,) * lead + tuple(xa.shape[lead:])
    window = tuple(slice(a, a + (1 if d < lead else k))
                   for d, (a, k) in enumerate(zip(lo, ua.shape)))
    return Update(x, upd, tagged(xs)[window], None, _NEVER, lead)


def hit_mask(u: Update) -> np.ndarray:
    """The operand elements (of one window's core) the update writes."""
    xs = tuple(C.aval_of(u.x).shape[u.lead:])
    hit = np.zeros(int(np.prod(xs, dtype=np.int64)), bool)
    t = u.target.reshape(-1)
    hit[t[t >= 0]] = True
    return hit.reshape(xs)


def written_once(target: np.ndarray) -> np.ndarray | None:
    """The flat operand indices a scatter map writes (-1: dropped), where each is written at
    most once; None where some element is written twice."""
    t = target[target >= 0]
    return t if np.unique(t).size == t.size else None


def overwrites_all(u: Update) -> bool:
    """Whether `u` writes every operand element exactly once (its result is the moved updates,
    combined with the operand where it combines)."""
    t = written_once(u.target)
    return t is not None and t.size == int(np.prod(C.aval_of(u.x).shape[u.lead:],
                                                   dtype=np.int64))


def layers(u: Update) -> list:
    """Operand-shaped maps into the flat updates (-1: not hit), one per duplicate depth: layer k
    takes each target's k-th update in update order."""
    xa = C.aval_of(u.x)
    xs = tuple(xa.shape[u.lead:])
    n_x = int(np.prod(xs, dtype=np.int64))
    flat_t = u.target.reshape(-1)
    src = np.flatnonzero(flat_t >= 0)
    if not src.size:
        return []
    hit = flat_t[src]
    depth = int(np.bincount(hit, minlength=n_x).max())
    if depth > 1 and not u.dup_ok(xa.dtype):
        raise Decline("duplicate static scatter indices: the result depends on their order")
    order = np.argsort(hit, kind="stable")
    t_sorted = hit[order]
    rank = np.arange(t_sorted.size) - np.searchsorted(t_sorted, t_sorted, side="left")
    maps = np.full((depth, n_x), IM.FILL, np.int64)
    maps[rank, t_sorted] = src[order]
    return [m.reshape(xs) for m in maps]


def emit_select(eqn, u: Update, program: Callable, ops=LAX_OPS) -> _walk.Replacement:
    """The select form of `u` replacing `eqn`; `program(core_update_shape, layer_map)` gives the
    structural program that places the updates (it raises `Decline` where there is none).

        before:  y = scatter x [3 1] v            (x: (65536, 4, 4), v: (65536, 3))
        after:   y = vmap(select(hit, moved(v), x) on one (4, 4) window) x v

    Traced once per form (`Emitter.call_shared`): a step that turns the same face 36 times
    traces it once, not 36 times.
    """
    us = tuple(C.aval_of(u.upd).shape[u.lead:])
    layers_ = []
    for m in layers(u):
        small, dims = reduced_mask(m >= 0)
        layers_.append((program(us, m), small.shape, small.tobytes(), dims))
    em = _walk.Emitter(eqn)
    y, = em.call_shared(_select_form, u.x, u.upd,
                        static=(tuple(layers_), u.combine, u.lead, ops))
    check_aval(eqn.outvars[0], y)
    return em.replacement([y])


def _select_form(xv, uv, layers_, combine, lead, ops):
    """The layers on the core dims, applied along the `lead` leading dims by lifting each
    program onto them (`indexmap.lift_program`: what `vmap` would trace, without tracing it)."""
    def build(xv, uv):
        y = xv
        for prog, mask_shape, mask_bytes, dims in layers_:
            moved = IM.apply_program(uv, IM.lift_program(prog, uv.shape[:lead]), ops)
            small = np.frombuffer(mask_bytes, dtype=bool).reshape(mask_shape)
            if small.all():  # every element written: nothing of `y` is kept
                y = moved if combine is None else combine(y, moved)
                continue
            hit_b = lax.broadcast_in_dim(small, y.shape, tuple(d + lead for d in dims))
            if combine is _combine_add:
                # y + select(hit, moved, -0.0): adding -0.0 is the exact identity (signed zeros
                # and NaNs kept), and `y` is used once, so its cotangents are summed as JAX sums
                # the scatter-add's (reusing `y` in a select reorders that sum by an ulp).
                y = lax.add(y, lax.select(hit_b, moved, lax.full_like(moved, _additive_identity(
                    moved.dtype))))
            else:
                new = moved if combine is None else combine(y, moved)
                y = lax.select(hit_b, new, y)
        return y

    return build(xv, uv)


def check_aval(old, new_atom):
    """`Decline` unless the rewritten value has the old one's shape, dtype and weak type."""
    a, b = old.aval, C.aval_of(new_atom)
    if (a.shape, a.dtype, getattr(a, "weak_type", False)) != \
            (b.shape, b.dtype, getattr(b, "weak_type", False)):
        raise Decline(f"rewritten form has aval {b}, not {a}")
