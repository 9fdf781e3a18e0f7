"""JAX's own Threefry draws opened into their rounds, for the kernel pass to make one kernel of.

`jax.random` draws bits with a primitive on a typed key (`random_bits` on `key<fry>[]`), whose
Threefry implementation makes a 64-bit iota of the output's shape as (high, low) counter words
(`iota_2x32_shape`) and hashes them with `threefry2x32`, whose own definition is 20 rounds of
32-bit adds, rotates and xors. XLA runs it as its own fusions; here the draw is opened into
that definition on 1-D pieces of N = prod(shape) elements, which `passes/kernel.py` then makes
one Pallas kernel of: the counters from the grid step, nothing read from HBM but the key.

    before:  b:u32[16,256] = random_bits[bit_width=32 shape=(16, 256)] k
    after:   kd:u32[2] = random_unwrap k ; k1 = squeeze (slice kd 0:1) ; k2 = ...
             hi:u32[4096] = broadcast_in_dim 0 ; lo:u32[4096] = iota     (`iota_2x32_shape`)
             x1, x2 = the 20 rounds on (k1, k2, hi, lo)                    (`threefry2x32`)
             y:u32[4096] = xor x1 x2                        (JAX's own random_bits epilogue)
             b:u32[16,256] = reshape y
    then (kernel pass): y = pallas_call{ iota of the grid step ; rounds ; xor }(k1, k2, ...)

Both definitions are JAX's own, read through `_compat`: the draw is the key implementation's
`random_bits` (or `split`) traced on the key's words at shape (N,), then evaluated with its
`threefry2x32` replaced by `_compat.threefry2x32_rounds` (JAX's `_threefry2x32_lowering`,
unrolled, as JAX lowers it on the TPU) and its `iota_2x32_shape` by the two words it stands for
(`_counters`: for N < 2**32 the high word is 0 and the low word the iota). Bit for bit
`jax.jit`'s: Threefry is elementwise in its counters, and element i of the (N,) draw is element
i of the shape's draw in row-major order (the 64-bit iota of the shape is the reshaped iota).

Elementwise integer consumers of the bits (`jax.random.uniform`'s shift and or before its
bitcast to float) are taken onto the piece too (`_EPILOGUE`), so they run in the kernel;
the float epilogues stay XLA's (`backend/mosaic.py` holds no float primitive).

`random_split` to a shape S is opened the same way (its words as two pieces, stacked and
wrapped by XLA after the kernel). `random_fold_in` (one pair of counters) and a split into
fewer keys than a (8, 128) tile holds (`split(key)`: 2) are left as they are, counted
(`threefry.small_key_derivations`), not declined: keys for later draws, never a kernel's worth.
Declined with the reason, the draw kept as it is:
- a key array (`key<fry>[B]`: vmapped keys, one key a row): its key words would be pieces read
  from HBM, not done; keys of another implementation (`rbg`, `unsafe_rbg`);
- `jax_threefry_partitionable` off (the counters are halves of one 32-bit iota);
- N not a whole number of (8, 128) tiles, or 2**31 or more (the kernel's iota is int32);
- with `kernel="auto"`, N below the target's `threefry_min_elements` (`backend/cost.py`) or
  where the kernel pass would decline the region (`kernel_decision`);
- a draw inside a loop or cond body: the kernel pass makes kernels at the top level and in
  `jit` bodies only, and opened rounds left to XLA gain nothing.
Enabled where the kernel pass emits kernels (`kernel.enabled`); run once, just before it.
"""
from __future__ import annotations

import math

import jax
import numpy as np
from jax import lax

from .. import _compat as C
from .. import _walk
from ..backend import cost as _cost
from ..backend import mosaic
from . import kernel as _kernel

NAME = "threefry"
_CALLS = frozenset({"jit", "pjit"})
# Elementwise integer consumers of the bits taken onto the piece, each with a scalar literal
# as its other operand (uniform's `shift_right_logical b 9 ; or _ 0x3F800000`): in the kernel's
# table (`backend.mosaic.KERNEL_PRIMITIVES`) on 32-bit words.
_EPILOGUE = frozenset({"shift_right_logical", "shift_left", "or", "and", "xor"})


# --- JAX's definition of a draw, opened ---------------------------------------------------------

def _counters(e, vals):
    """`iota_2x32_shape[shape=(N,)]`: a 64-bit iota as (high, low) words; for N < 2**32 the
    high word is 0 and the low word the 32-bit iota (what `iota_2x32_shape_lowering` computes:
    convert(iota >> 32), convert(iota))."""
    (n,) = e.params["shape"]
    if n >= 2 ** 32:   # (`_reason` opens fewer than 2**31)
        raise ValueError(f"iota_2x32_shape of {n} elements: the high word is not 0")
    return [lax.full((n,), 0, np.uint32), lax.iota(np.uint32, n)]


def _rounds(e, vals):
    return list(C.threefry2x32_rounds(*vals))


def _inline(e, vals):
    body = e.params["jaxpr"]
    return _open(body.jaxpr, body.consts, vals)


_OPEN_RULES = {"threefry2x32": _rounds, "iota_2x32_shape": _counters,
               "jit": _inline, "pjit": _inline}


def _open(jaxpr, consts, args) -> list:
    """`eval_jaxpr` of a draw's definition with its Threefry primitives opened (`_OPEN_RULES`),
    the rest bound as it is."""
    env = dict(zip(jaxpr.constvars, consts))
    env.update(zip(jaxpr.invars, args))

    def read(a):
        return C.literal_value(a) if C.is_literal(a) else env[a]

    for e in jaxpr.eqns:
        vals = [read(a) for a in e.invars]
        rule = _OPEN_RULES.get(e.primitive.name)
        if rule is not None:
            outs = rule(e, vals)
        else:
            outs = e.primitive.bind(*vals, **e.params)
            outs = list(outs) if e.primitive.multiple_results else [outs]
        env.update(zip(e.outvars, outs))
    return [read(a) for a in jaxpr.outvars]


def _definition(impl, what: str, n: int, bit_width: int | None):
    """The implementation's draw on the key's words at shape (N,), traced (a ClosedJaxpr of
    `kd:u32[2]`)."""
    words = C.ShapedArray(tuple(impl.key_shape), np.dtype(np.uint32))
    if what == "random_bits":
        return C.trace_avals(lambda kd: [impl.random_bits(kd, bit_width, (n,))], [words])
    return C.trace_avals(lambda kd: [impl.split(kd, (n,))], [words])


def _opened_draw(eqn, n: int, epilogue: list):
    """A function of the key: the draw of `eqn` opened on pieces of `n` (then `epilogue`'s
    consumers on the piece), reshaped and, for a split, wrapped as keys again."""
    what = eqn.primitive.name
    impl = C.key_impl(C.aval_of(eqn.invars[0]))
    out_aval = C.aval_of(eqn.outvars[0] if not epilogue else epilogue[-1].outvars[0])
    definition = _definition(impl, what, n, eqn.params.get("bit_width"))

    def fun(key):
        (flat,) = _open(definition.jaxpr, definition.consts, [jax.random.key_data(key)])
        for e in epilogue:
            flat = _apply_epilogue(e, flat)
        if what == "random_bits":
            return lax.reshape(flat, out_aval.shape)
        words = lax.reshape(flat, (*eqn.params["shape"], *impl.key_shape))
        return jax.random.wrap_key_data(words, impl=impl.name)
    return fun


def _apply_epilogue(e, piece):
    """Consumer `e` (`_EPILOGUE`: one operand the bits, the other a scalar literal), on the
    piece."""
    vals = [piece if not C.is_literal(a) else C.literal_value(a) for a in e.invars]
    return e.primitive.bind(*vals, **e.params)


# --- what is opened ----------------------------------------------------------------------------

def _reason(eqn, ctx, mode) -> str | None:
    """Why the draw `eqn` is not opened (None: it is)."""
    name = eqn.primitive.name
    key = C.aval_of(eqn.invars[0])
    impl = C.key_impl(key)
    if not C.is_threefry(impl):
        return (f"keys of the '{impl}' implementation: not Threefry's rounds (XLA's own "
                f"generator or another hash)")
    if key.shape:
        return (f"a key array of shape {key.shape} (vmapped keys, one key a row): the key "
                f"words would be pieces read from HBM, not done")
    if not C.threefry_partitionable():
        return ("jax_threefry_partitionable is off: the counters are halves of one 32-bit "
                "iota, not an iota of the output (not done)")
    n = math.prod(eqn.params["shape"])
    if n >= 2 ** 31:
        return f"{n} elements: the kernel's iota is int32 (fewer than 2**31 elements)"
    rows = _cost.costs(ctx.target).kernel_tile_rows
    return (_cost.threefry_decision(n, mode, ctx.target)
            or mosaic.tile_reason(n, rows))


def _small_keys(eqn) -> bool:
    """A `random_fold_in`, or a `random_split` into fewer keys than one (8, 128) tile holds."""
    if eqn.primitive.name == "random_fold_in":
        return True
    return math.prod(eqn.params["shape"]) < mosaic.SUBLANES * mosaic.LANES


def _epilogue_of(eqn, uses) -> list:
    """The chain of `_EPILOGUE` consumers after a draw of bits, each the only use of the value
    before it (so it moves onto the piece with the draw)."""
    chain, v = [], eqn.outvars[0]
    while True:
        users = uses.get(v, ())
        if len(users) != 1:
            return chain
        e = users[0]
        if (e is None or e.primitive.name not in _EPILOGUE or len(e.invars) != 2
                or C.aval_of(e.outvars[0]) != C.aval_of(v)
                or np.dtype(C.aval_of(v).dtype) != np.dtype(np.uint32)):
            return chain
        other = e.invars[1] if e.invars[0] is v else e.invars[0]
        if not C.is_literal(other) or np.ndim(C.literal_value(other)):
            return chain
        chain.append(e)
        v = e.outvars[0]


def _level(cj, ctx, mode, memo):
    """(the level with its draws opened, changed), and the same in the bodies of the `jit`
    calls made here (where the kernel pass looks)."""
    hit = memo.get(id(cj.jaxpr))
    if hit is not None and hit[0] is cj:
        return hit[1]
    j = cj.jaxpr
    uses: dict = {}
    for e in j.eqns:
        for a in e.invars:
            if not C.is_literal(a):
                uses.setdefault(a, []).append(e)
    for a in j.outvars:
        if not C.is_literal(a):
            uses.setdefault(a, []).append(None)
    eqns, env, taken, changed = [], {}, set(), False
    for e in j.eqns:
        if id(e) in taken:
            continue
        e = _walk.rename_operands(e, env)
        name = e.primitive.name
        if name in _CALLS:
            body, ch = _level(e.params["jaxpr"], ctx, mode, memo)
            if ch:
                e = e.replace(params={**e.params, "jaxpr": body})
                changed = True
        elif name in ("random_bits", "random_split", "random_fold_in"):
            new = _draw(e, ctx, mode, uses)
            if new is not None:
                new_eqns, last, out, absorbed = new
                eqns.extend(new_eqns)
                env[last] = out
                taken.update(id(x) for x in absorbed)
                changed = True
                continue
        elif _walk.has_subjaxprs(e):
            _say_nested(e, ctx)
        eqns.append(e)
    out = cj, False
    if changed:
        outvars = [_walk.substitute(a, env) for a in j.outvars]
        out = C.closed(C.replace_jaxpr(j, eqns=eqns, outvars=outvars), cj.consts), True
    memo[id(cj.jaxpr)] = (cj, out)
    return out


def _draw(eqn, ctx, mode, uses):
    """(new equations, the var they replace, its new atom, consumers taken) or None (declined,
    recorded)."""
    if eqn.primitive.name != "random_bits" and _small_keys(eqn):
        # (a program's `split(key)` and `fold_in`: keys for later draws, never a kernel's worth;
        # counted, not declined, as the kernel pass counts its short regions)
        ctx.report.count(f"{NAME}.small_key_derivations")
        return None
    why = _reason(eqn, ctx, mode)
    if why is not None:
        what = (f"{eqn.primitive.name} of {eqn.params['shape']}" if "shape" in eqn.params
                else eqn.primitive.name)
        ctx.report.declined(NAME, eqn, f"{what} stays XLA's: {why}")
        return None
    n = math.prod(eqn.params["shape"])
    epilogue = _epilogue_of(eqn, uses) if eqn.primitive.name == "random_bits" else []
    em = _walk.Emitter(eqn)
    (out,) = em.call(_opened_draw(eqn, n, epilogue), eqn.invars[0])
    work = sum(1 for e in em.eqns if len(_walk_shape(e)) == 1)
    why = _cost.kernel_decision(n, work, 0, mode, ctx.target)
    if why is not None:   # (the kernel pass would leave the rounds to XLA: keep the draw)
        ctx.report.declined(NAME, eqn, f"{eqn.primitive.name} of {eqn.params['shape']} stays "
                                       f"XLA's: {why}")
        return None
    last = (epilogue[-1] if epilogue else eqn).outvars[0]
    taken = [f"{e.primitive.name}" for e in epilogue]
    ctx.report.applied(NAME, eqn, after=("iota", "threefry rounds"), note=(
        f"{n} counters as an iota, 20 rounds on pieces of {n} "
        f"({work} equations){'; then ' + ', '.join(taken) + ' on the piece' if taken else ''}"))
    ctx.report.stats.setdefault(NAME, []).append(dict(
        primitive=eqn.primitive.name, shape=tuple(eqn.params["shape"]), elements=n,
        bit_width=eqn.params.get("bit_width"), eqns=work, epilogue=taken))
    return em.eqns, last, out, epilogue


def _walk_shape(e) -> tuple:
    return tuple(getattr(C.aval_of(e.outvars[0]), "shape", ()))


def _say_nested(eqn, ctx) -> None:
    """A draw in a loop's or a branch's body stays XLA's: the kernel pass looks at the top
    level and `jit` bodies only."""
    for sub in C.params_jaxprs(eqn.params):
        for e in _walk.iter_eqns(sub[2]):
            if e.primitive.name in ("random_bits", "random_split"):
                ctx.report.declined(NAME, e, f"{e.primitive.name} in a '{eqn.primitive.name}' "
                                             f"body stays XLA's: kernels are made at the top "
                                             f"level and in jit bodies only")


def run(cj, ctx):
    """Threefry draws are opened into their rounds where the kernel pass takes them (module
    docstring)."""
    if not _kernel.enabled(ctx):
        return cj, False
    return _level(cj, ctx, ctx.options.kernel, {})
