"""Check that a rewrite changed nothing: `assert_equivalent(fn, *args, **options)`.

The rule is the README's exactness contract (public, so users can test their own programs):
* integer, boolean and PRNG-key outputs of `optimize(fn, **options)` equal `jax.jit(fn)`'s bit
  for bit, with the same shapes, dtypes, weak types and shardings;
* floating outputs have NaN and infinities exactly where `jax.jit`'s have them, and every other
  element within `ulps` (default `CONTRACT_ULPS`) units of the dtype's epsilon times the largest
  finite magnitude of that output: XLA rounds float arithmetic by the fusion it lands in (an
  FMA here, two roundings there), so a rewrite that moves a fusion boundary may move a result
  by an ulp of its operands, as `jax.jit` of the same program grouped differently does;
* `bitwise=True` (the default under `exact=True`) is the strict form: forward outputs bit for bit
  (bit patterns compared, so NaN payloads and -0.0 count), gradients equal by value (+0.0 equals
  -0.0, NaN equals NaN);
* gradients (a VJP with all-ones cotangents) and `jax.vmap` (the arguments stacked twice) are
  checked the same way; the rewritten jaxpr passes `check_jaxpr`.
`rtol` relaxes forward and gradient comparisons for floating outputs (loop re-rolling only).
"""
from __future__ import annotations

import contextlib
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from . import _api
from . import _compat as C
from . import _pipeline


def bits(x) -> np.ndarray:
    """The bit pattern of an array (PRNG keys by their key data) as unsigned integers."""
    if hasattr(x, "dtype") and jnp.issubdtype(x.dtype, jax.dtypes.prng_key):
        x = jax.random.key_data(x)
    a = np.asarray(x)
    if a.dtype == np.bool_:
        return a.view(np.uint8)
    if a.dtype.itemsize in (1, 2, 4, 8) and a.dtype.kind not in "c":
        return a.view({1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[a.dtype.itemsize])
    if a.dtype.kind == "c":
        return bits(a.real), bits(a.imag)
    return a  # sub-byte types (int4): compare values


def _weak(x):
    try:
        return jax.typeof(x).weak_type
    except Exception:  # noqa: BLE001 - non-array leaves have no weak type
        return None


def assert_bitwise_equal(actual, expected, *, rtol: float | None = None, what="output"):
    la, ta = jax.tree_util.tree_flatten(actual)
    le, te = jax.tree_util.tree_flatten(expected)
    assert ta == te, f"{what}: pytree structure differs: {ta} vs {te}"
    for i, (a, e) in enumerate(zip(la, le)):
        assert np.shape(a) == np.shape(e), f"{what}[{i}]: shape {np.shape(a)} vs {np.shape(e)}"
        assert a.dtype == e.dtype, f"{what}[{i}]: dtype {a.dtype} vs {e.dtype}"
        assert _weak(a) == _weak(e), f"{what}[{i}]: weak_type {_weak(a)} vs {_weak(e)}"
        sa, se = getattr(a, "sharding", None), getattr(e, "sharding", None)
        if sa is not None and se is not None:
            assert sa.is_equivalent_to(se, np.ndim(a)), f"{what}[{i}]: sharding {sa} vs {se}"
        if rtol is not None and jnp.issubdtype(e.dtype, jnp.inexact):
            np.testing.assert_allclose(np.asarray(a), np.asarray(e), rtol=rtol, atol=rtol,
                                       err_msg=f"{what}[{i}]")
            continue
        ba, be = bits(a), bits(e)
        if isinstance(ba, tuple):
            for x, y in zip(ba, be):
                np.testing.assert_array_equal(x, y, err_msg=f"{what}[{i}] (bits)")
        else:
            np.testing.assert_array_equal(ba, be, err_msg=f"{what}[{i}] (bits)")


# The float tolerance of the contract, in units of epsilon times the output's largest magnitude.
# Measured: the rewrites' fusion-dependent differences are below 1 of these units on the cases in
# tests/test_contract.py (0.42 forward, 0.86 for a gradient); 32 leaves room for error growth
# through longer programs (reroll, a different summation order, is checked by `rtol`).
CONTRACT_ULPS = 32


def assert_contract_equal(actual, expected, *, ulps: float = CONTRACT_ULPS, what="output",
                          meta: bool = True):
    """Equal under the exactness contract (module doc): non-float leaves bit for bit; float
    leaves with NaN/inf where `expected` has them and otherwise within `ulps` * eps * the largest
    finite magnitude of that leaf. `meta`: also compare weak types and shardings."""
    la, ta = jax.tree_util.tree_flatten(actual)
    le, te = jax.tree_util.tree_flatten(expected)
    assert ta == te, f"{what}: pytree structure differs: {ta} vs {te}"
    for i, (a, e) in enumerate(zip(la, le)):
        if not _inexact(e) or (meta and not _inexact(a)):
            if meta:
                assert_bitwise_equal([a], [e], what=f"{what}[{i}]")
            else:
                assert_value_equal([a], [e], what=f"{what}[{i}]")
            continue
        if meta:
            assert _weak(a) == _weak(e), f"{what}[{i}]: weak_type {_weak(a)} vs {_weak(e)}"
            sa, se = getattr(a, "sharding", None), getattr(e, "sharding", None)
            if sa is not None and se is not None:
                assert sa.is_equivalent_to(se, np.ndim(a)), f"{what}[{i}]: sharding {sa} vs {se}"
        a, e = np.asarray(a), np.asarray(e)
        assert a.shape == e.shape and a.dtype == e.dtype, \
            f"{what}[{i}]: {a.dtype}{a.shape} vs {e.dtype}{e.shape}"
        parts = [(a.real, e.real), (a.imag, e.imag)] if a.dtype.kind == "c" else [(a, e)]
        for x, y in parts:
            _within_contract(x, y, ulps, f"{what}[{i}]")


def _within_contract(a: np.ndarray, e: np.ndarray, ulps: float, what: str):
    finfo = jnp.finfo(e.dtype)
    a64, e64 = a.astype(np.float64), e.astype(np.float64)
    np.testing.assert_array_equal(np.isnan(a64), np.isnan(e64), err_msg=f"{what}: NaN positions")
    inf = np.isinf(e64)
    np.testing.assert_array_equal(np.isinf(a64), inf, err_msg=f"{what}: infinite positions")
    np.testing.assert_array_equal(a64[inf], e64[inf], err_msg=f"{what}: infinities")
    fin = np.isfinite(e64)
    if not fin.any():
        return
    scale = max(float(np.max(np.abs(e64[fin]))), float(finfo.tiny))
    err = float(np.max(np.abs(a64[fin] - e64[fin])))
    assert err <= ulps * float(finfo.eps) * scale, (
        f"{what}: differs from jax.jit by {err:.3g} = {err / (float(finfo.eps) * scale):.3g} "
        f"eps x the largest magnitude {scale:.3g}; the contract allows {ulps}")


def assert_value_equal(actual, expected, *, rtol: float | None = None, what="gradient"):
    """Equal by value: +0.0 == -0.0 and NaN == NaN; `rtol` for re-rolled loops."""
    la, ta = jax.tree_util.tree_flatten(actual)
    le, te = jax.tree_util.tree_flatten(expected)
    assert ta == te, f"{what}: pytree structure differs"
    for i, (a, e) in enumerate(zip(la, le)):
        a, e = np.asarray(a), np.asarray(e)
        assert a.shape == e.shape and a.dtype == e.dtype, f"{what}[{i}]: {a.dtype}{a.shape} vs {e.dtype}{e.shape}"
        if a.dtype == jax.dtypes.float0:
            continue
        if rtol is None:
            np.testing.assert_array_equal(a, e, err_msg=f"{what}[{i}]")
        else:
            np.testing.assert_allclose(a, e, rtol=rtol, atol=rtol, err_msg=f"{what}[{i}]")


def _inexact(x) -> bool:
    return hasattr(x, "dtype") and jnp.issubdtype(x.dtype, jnp.inexact)


def assert_equivalent(fn: Callable, *args, grad: bool | None = None, vmap: bool | None = None,
                      rtol: float | None = None, bitwise: bool | None = None,
                      ulps: float = CONTRACT_ULPS, check_jaxpr: bool = True, **options):
    """Assert `optimize(fn, **options)` is equivalent to `jax.jit(fn)` on `args` (module doc).

    The default check is the contract (floats within `ulps`); `bitwise=True` is the strict form,
    and the default when `exact=True` is among the options. `grad`/`vmap` default to "where
    defined": grad when some argument and output are inexact, vmap always (both on by default;
    pass False to skip). Returns the rewritten ClosedJaxpr.
    """
    if bitwise is None:
        bitwise = bool(options.get("exact", False))

    def same(actual, expected, what="output"):
        if bitwise or rtol is not None:
            assert_bitwise_equal(actual, expected, rtol=rtol, what=what)
        else:
            assert_contract_equal(actual, expected, ulps=ulps, what=what)

    def same_grad(actual, expected):
        if bitwise or rtol is not None:
            assert_value_equal(actual, expected, rtol=rtol)
        else:
            assert_contract_equal(actual, expected, ulps=ulps, what="gradient", meta=False)

    ref_fn, opt_fn = jax.jit(fn), _api.optimize(fn, **options)
    expected = ref_fn(*args)
    actual = opt_fn(*args)
    same(actual, expected)

    cj = _api.rewrite_jaxpr(jax.make_jaxpr(fn)(*args), **options)
    if check_jaxpr:
        C.check_jaxpr(cj)

    leaves = jax.tree_util.tree_leaves(args)
    out_leaves = jax.tree_util.tree_leaves(expected)
    grad_requested = bool(grad)
    if grad is None:
        grad = any(_inexact(x) for x in leaves) and any(_inexact(y) for y in out_leaves)
    if grad:
        def vjp_of(f):
            out, pull = jax.vjp(f, *args)
            ct = jax.tree_util.tree_map(
                lambda y: jnp.ones_like(y) if _inexact(y) else np.zeros(np.shape(y), jax.dtypes.float0), out)
            return pull(ct)
        try:
            expected_g = vjp_of(ref_fn)
        except Exception:  # noqa: BLE001 - not differentiable (a while loop): nothing to compare
            if grad_requested:
                raise
        else:
            same_grad(vjp_of(opt_fn), expected_g)

    if vmap is None or vmap:
        try:
            stacked = jax.tree_util.tree_map(lambda x: jnp.stack([x, x]), args)
            expected_v = jax.jit(jax.vmap(fn))(*stacked)
        except Exception:  # noqa: BLE001 - vmap not defined for this program: nothing to compare
            if vmap:
                raise
        else:
            same(jax.vmap(opt_fn)(*stacked), expected_v, what="vmap")
    return cj


# --- fault injection: the fallback holds for every pass -----------------------------------------

# What `inject_fault` does to a pass's output: the kinds of damage a buggy pass can do.
FAULTS = ("shape", "dtype", "drop", "duplicate", "param", "raise")


class InjectedFault(RuntimeError):
    """Raised by a pass that `inject_fault(name, "raise")` broke."""


@contextlib.contextmanager
def inject_fault(pass_name: str, kind: str):
    """`with inject_fault("literals", "shape"):` every program rewritten in this block has the
    pass `pass_name` damage its output (and say it changed the program), as a buggy pass would:

    | kind        | the pass's output                                                       |
    | ----------- | ----------------------------------------------------------------------- |
    | "shape"     | its first output replaced by an input (or a constant) of another shape   |
    | "dtype"     | the first equation on its data path binds a variable of another dtype    |
    |             | in place of its result (whose uses are kept)                             |
    | "drop"      | that equation removed                                                    |
    | "duplicate" | a later equation's result renamed to that one's (bound twice)            |
    | "param"     | the first such equation with a shape or axis parameter given an invalid  |
    |             | one                                                                      |

    (its data path: equations that read the program's inputs, whose results are read)
    | "raise"     | an exception raised after the pass ran                                   |

    The damage is done the first time the pass runs in a rewrite. The program must still return
    `jax.jit`'s result, with one warning (`tests/test_faults.py`). Passes are looked up when a
    rewrite starts (`_pipeline.enabled_passes`): the damage applies to rewrites that start in
    the block, in any thread."""
    if kind not in FAULTS:
        raise ValueError(f"inject_fault: kind {kind!r} is not one of {FAULTS}")
    real = _pipeline._load

    def load(spec):
        fn = real(spec)
        if spec.name != pass_name:
            return fn

        def damaged(cj, ctx):
            out, changed = fn(cj, ctx)
            if ctx.cache.get("fault.injected"):   # once a rewrite: a second damage could undo
                return out, changed               # the first (an output swapped back)
            ctx.cache["fault.injected"] = True
            if kind == "raise":
                raise InjectedFault(f"injected into pass '{pass_name}'")
            return _damage(out, kind), True
        return damaged

    _pipeline._load = load
    try:
        yield
    finally:
        _pipeline._load = real


@contextlib.contextmanager
def inject_lowering_failure(pass_name: str, stage: str = "lowered"):
    """`with inject_lowering_failure("kernel"):` every program rewritten in this block has the
    pass `pass_name` pass its first output through a primitive that JAX cannot lower
    (`stage="compiled"`: that XLA cannot compile; `_compat.failing_identity`), and say it
    changed the program, as a pass that emits what the backend lacks would (a Pallas kernel
    that Mosaic cannot lower):

        { lambda ; a. let b = sin a in (b) }
        -> { lambda ; a. let b = sin a; c = jaxrewrite_fails_to_be_lowered b in (c) }

    Once a rewrite, the first time the pass runs; looked up, and undone, as `inject_fault` is.
    Blocks nest: `with inject_lowering_failure("kernel"), inject_lowering_failure("literals"):`
    breaks both.
    The program must return `jax.jit`'s result with one warning, and run what the other passes
    made (`tests/test_faults.py`, `tests/test_fallback.py`)."""
    prim = C.failing_identity(stage)
    real = _pipeline._load

    def load(spec):
        fn = real(spec)
        if spec.name != pass_name:
            return fn

        def failing(cj, ctx):
            out, changed = fn(cj, ctx)
            if ctx.cache.get(("lowering_failure", pass_name)):
                return out, changed
            ctx.cache[("lowering_failure", pass_name)] = True
            return _pass_through(out, prim), True
        return failing

    _pipeline._load = load
    try:
        yield
    finally:
        _pipeline._load = real


def _pass_through(cj, prim):
    """`cj` with its first array output passed through `prim` (an identity)."""
    j = cj.jaxpr
    k = next((k for k, a in enumerate(j.outvars) if isinstance(C.aval_of(a), C.ShapedArray)), None)
    if k is None:
        return cj
    out = C.new_var(C.aval_of(j.outvars[k]))
    eqn = C.new_eqn([j.outvars[k]], [out], prim, {})
    outvars = list(j.outvars)
    outvars[k] = out
    return C.closed(j.replace(eqns=[*j.eqns, eqn], outvars=outvars), cj.consts)


def _damage(cj, kind: str):
    j = cj.jaxpr
    eqns, outvars = list(j.eqns), list(j.outvars)
    reads = {a for e in eqns for a in e.invars if isinstance(a, C.Var)} | {
        a for a in outvars if isinstance(a, C.Var)}
    # the first equation on the data path (it reads the inputs, its results are read): damage
    # to a constant's equation may be folded away before it matters
    live = set(j.invars)
    path = []
    for k, e in enumerate(eqns):
        if any(isinstance(a, C.Var) and a in live for a in e.invars):
            live.update(e.outvars)
            if any(v in reads for v in e.outvars):
                path.append(k)
    first = path[0] if path else None
    if kind == "shape" or first is None:
        shape = tuple(outvars[0].aval.shape)
        other = next((v for v in j.invars if tuple(v.aval.shape) != shape), None)
        if other is None:
            other = C.literal(np.zeros(shape + (2,), np.float32))
        outvars[0] = other
    elif kind == "dtype":
        e = eqns[first]
        old = next(v for v in e.outvars if v in reads)
        dtype = np.int32 if jnp.issubdtype(old.aval.dtype, jnp.floating) else np.float32
        new = C.new_var(old.aval.update(dtype=np.dtype(dtype), weak_type=False))
        eqns[first] = e.replace(outvars=[new if v is old else v for v in e.outvars])
    elif kind == "drop":
        del eqns[first]
    elif kind == "duplicate":
        # a later equation's result renamed to the first one's: one variable bound twice, with
        # two values (an equation merely repeated, a later pass merges away, harmless)
        v = next(v for v in eqns[first].outvars if v in reads)
        later = next(((k, w) for k in range(first + 1, len(eqns)) for w in eqns[k].outvars
                      if isinstance(w, C.Var) and not C.is_dropvar(w) and w.aval == v.aval),
                     None)
        if later is None:
            eqns.insert(first + 1, eqns[first])
        else:
            k, w = later
            swap = {w: v}
            eqns[k:] = [e.replace(invars=[swap.get(a, a) if isinstance(a, C.Var) else a
                                          for a in e.invars],
                                  outvars=[swap.get(o, o) for o in e.outvars]) for e in eqns[k:]]
            outvars = [swap.get(a, a) if isinstance(a, C.Var) else a for a in outvars]
    elif kind == "param":
        # a shape, dimensions or axis parameter made invalid (an elementwise equation has none,
        # and its lowering ignores a parameter it does not know: harmless)
        def corruptible(e):
            return next((k for k, v in e.params.items() if (isinstance(v, tuple) and v and all(
                isinstance(x, int) for x in v)) or (type(v) is int)), None)
        k = next((k for k in path if corruptible(eqns[k]) is not None), first)
        e = eqns[k]
        params, name = dict(e.params), corruptible(e)
        if name is None:
            params["jaxrewrite_fault"] = True
        elif isinstance(params[name], tuple):
            params[name] = params[name] + (99,)
        else:
            params[name] = -7
        eqns[k] = e.replace(params=params)
    return C.closed(j.replace(eqns=eqns, outvars=outvars), cj.consts)


def primitive_counts(cj) -> dict[str, int]:
    """How many equations of each primitive, at every nesting level (structure, never text)."""
    from ._walk import iter_eqns
    counts: dict[str, int] = {}
    for e in iter_eqns(cj):
        counts[e.primitive.name] = counts.get(e.primitive.name, 0) + 1
    return counts


def tpu_custom_calls(cj, *args) -> list[str]:
    """The custom calls (their targets, in order) of `cj` lowered for the TPU on this host:
    Pallas's TPU lowering runs for every kernel emitted for Mosaic (`backend.mosaic.emit_for`),
    and raises where it has no rule for a primitive the kernel holds. The module is walked,
    not read as text.

    Where libtpu is installed and this host has no TPU (the `tpu-aot` extra), `cj` is also
    compiled for a TPU v5e (`backend.xla.tpu_compile`): Mosaic compiles every kernel and raises
    where the chip's compile would (on a TPU host the tests run the kernels themselves)."""
    from .backend import xla as _xla
    fn = jax.jit(lambda *a: C.eval_jaxpr(cj, *a))
    lowered = fn.trace(*args).lower(lowering_platforms=("tpu",))
    if _xla.tpu_aot_available() and jax.default_backend() != "tpu":
        _xla.tpu_compile(fn, *args)
    targets = []

    def visit(op):
        if op.name == "stablehlo.custom_call":
            targets.append(str(op.attributes["call_target_name"]).strip('"'))
        for region in op.regions:
            for block in region.blocks:
                for inner in block.operations:
                    visit(inner.operation)

    for op in lowered.compiler_ir("stablehlo").body.operations:
        visit(op.operation)
    return targets
