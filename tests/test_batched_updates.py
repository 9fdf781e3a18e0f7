"""Scatters with batching dims (vmapped `dynamic_update_slice`, `.at[i].set` at per-example
indices) become selects on iota masks on the TPU target, bit for bit with `jax.jit`; the CPU and
GPU targets keep them (passes/batched_updates.py, backend/cost.py `batched_update_*`).

The rewritten programs run here on the CPU: `optimize(f, target="tpu")` is the TPU's form.
"""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import jax
import jax.numpy as jnp
from jax import lax

import jaxrewrite
from jaxrewrite import _compat as C
from jaxrewrite import _walk
from jaxrewrite.backend import cost
from jaxrewrite.testing import (assert_bitwise_equal, assert_equivalent, assert_value_equal,
                                primitive_counts)

SCATTERS = {"scatter", "scatter-add", "scatter_add", "scatter-mul", "scatter_mul",
            "scatter-min", "scatter_min", "scatter-max", "scatter_max"}
TPU = dict(target="tpu", strict=True)
FEW = max(6, settings.default.max_examples // 4)

dus = jax.vmap(lax.dynamic_update_slice)               # jax-ml/jax#21367's program
dus_tuple = jax.vmap(lambda x, u, i: lax.dynamic_update_slice(x, u, (i,)))
set_fill = jax.vmap(lambda x, v, i: x.at[i].set(v))
set_clip = jax.vmap(lambda x, v, i: x.at[i].set(v, mode="clip"))


def _rewrite(fn, *args, **opts):
    return jaxrewrite.rewrite_jaxpr_with_report(jax.make_jaxpr(fn)(*args), **opts)


def _scatters(cj) -> int:
    return sum(n for p, n in primitive_counts(cj).items() if p in SCATTERS)


def _selects(cj, shape) -> int:
    """select_n equations over the whole operand (JAX's own index arithmetic selects over
    per-example starts; the form's masks are compares)."""
    return sum(1 for e in _walk.iter_eqns(cj) if e.primitive.name == "select_n"
               and tuple(e.outvars[0].aval.shape) == tuple(shape))


def _events(report, kind="rewrites"):
    return [e for e in getattr(report, kind) if e.pass_name == "batched_updates"]


def _bits(rng, shape, dtype):
    """Random values of `dtype` from random bits: floats with NaN payloads (quiet and
    signaling), infinities, -0.0 and +0.0 among them."""
    dt = jnp.dtype(dtype)
    if dt == jnp.bool_:
        return jnp.asarray(rng.integers(0, 2, shape).astype(bool))
    if dt.kind == "c":
        return lax.complex(_bits(rng, shape, jnp.float32), _bits(rng, shape, jnp.float32))
    n = dt.itemsize
    raw = rng.integers(0, 2 ** (8 * n), shape, dtype=np.uint64).astype(f"u{n}")
    if dt.kind == "f" or dt == jnp.bfloat16:
        sign = 1 << (8 * n - 1)
        exp = {"float16": 0x7C00, "bfloat16": 0x7F80, "float32": 0x7F800000}[dt.name]
        quiet = exp >> 1 & ~exp
        specials = np.array([exp | 1, exp | quiet | 5, sign, 0, exp, sign | exp], f"u{n}")
        flat = raw.reshape(-1)     # signaling NaN, quiet NaN with a payload, -0, +0, +-inf
        flat[: min(len(specials), flat.size)] = specials[: flat.size]
        raw = rng.permutation(flat).reshape(shape)
    return jnp.asarray(raw).view(dt)


# --- structure ---------------------------------------------------------------------------------

@pytest.mark.parametrize("B,N,w", [(100, 32, 2), (100, 32, 8), (8192, 256, 8)])
def test_issue_21367_program_becomes_selects(B, N, w):
    """jax-ml/jax#21367: `jit(vmap(lax.dynamic_update_slice))` with starts of shape (B, 1): no
    scatter is left, one select per window position, and the result is jax.jit's bit for bit,
    starts out of range (clamped) included."""
    rng = np.random.default_rng(B + w)
    x = _bits(rng, (B, N), jnp.float32)
    u = _bits(rng, (B, w), jnp.float32)
    s = jnp.asarray(rng.integers(-2 * N, 2 * N, (B, 1)), jnp.int32)
    res = _rewrite(dus, x, u, s, **TPU)
    counts = primitive_counts(res.jaxpr)
    assert _scatters(jax.make_jaxpr(dus)(x, u, s)) == 1
    assert _scatters(res.jaxpr) == 0
    assert _selects(res.jaxpr, (B, N)) == w and counts["iota"] == 1   # one per position
    assert res.report.counts["batched_updates.applied"] == 1
    assert_bitwise_equal(jaxrewrite.optimize(dus, target="tpu")(x, u, s), jax.jit(dus)(x, u, s))


@pytest.mark.parametrize("fn", [set_fill, set_clip, dus_tuple], ids=["set", "set-clip", "dus"])
def test_vmapped_updates_become_selects_in_nested_jaxprs(fn):
    """Inside a scan body and a jitted helper the scatter is rewritten too, and a second rewrite
    finds nothing left to do (idempotent)."""
    helper = jax.jit(fn)

    def prog(x, us, ss):
        def body(c, t):
            return helper(c, t[0], t[1]), None
        return lax.scan(body, x, (us, ss))[0]

    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.standard_normal((16, 12)), jnp.float32)
    width = 3 if fn is dus_tuple else None
    us = jnp.asarray(rng.standard_normal((4, 16) + ((width,) if width else ())), jnp.float32)
    ss = jnp.asarray(rng.integers(-15, 15, (4, 16)), jnp.int32)
    res = _rewrite(prog, x, us, ss, **TPU)
    assert _scatters(res.jaxpr) == 0 and len(_events(res.report)) == 1
    again = jaxrewrite.rewrite_jaxpr_with_report(res.jaxpr, **TPU)
    assert not _events(again.report) and not _events(again.report, "declines")
    assert_equivalent(prog, x, us, ss, bitwise=True, **TPU)


def test_window_on_several_dims_and_nested_vmap():
    """A 2-D window (one select per position of both moving dims), the batch on axis 1, a
    window covering a dim whole (start 0 there), and vmap of vmap (two batching dims)."""
    rng = np.random.default_rng(1)
    two = jax.vmap(lambda x, u, i, j: lax.dynamic_update_slice(x, u, (i, j)))
    x, u = _bits(rng, (7, 6, 5), jnp.float32), _bits(rng, (7, 2, 3), jnp.float32)
    i, j = (jnp.asarray(rng.integers(-3, 8, 7), jnp.int32) for _ in range(2))
    res = _rewrite(two, x, u, i, j, **TPU)
    assert _scatters(res.jaxpr) == 0 and _selects(res.jaxpr, x.shape) == 2 * 3
    assert_equivalent(two, x, u, i, j, bitwise=True, **TPU)

    axis1 = jax.vmap(lambda x, u, i: lax.dynamic_update_slice_in_dim(x, u, i, axis=0),
                     in_axes=(1, 1, 0), out_axes=1)  # the issue's (3, 4, 5) case, batch moved
    x3, u3 = _bits(rng, (4, 3, 5), jnp.float32), _bits(rng, (2, 3, 5), jnp.float32)
    s3 = jnp.asarray([-1, 3, 1], jnp.int32)
    res = _rewrite(axis1, x3, u3, s3, **TPU)
    assert _scatters(res.jaxpr) == 0 and _selects(res.jaxpr, (3, 4, 5)) == 2  # (vmap: batch first)
    assert_equivalent(axis1, x3, u3, s3, bitwise=True, **TPU)

    nested = jax.vmap(dus_tuple)
    x6, u6 = _bits(rng, (3, 4, 10), jnp.float32), _bits(rng, (3, 4, 3), jnp.float32)
    s6 = jnp.asarray(rng.integers(-5, 12, (3, 4)), jnp.int32)
    assert _scatters(_rewrite(nested, x6, u6, s6, **TPU).jaxpr) == 0
    assert_equivalent(nested, x6, u6, s6, bitwise=True, **TPU)


# Float words the form moves, written out: -0.0, a signaling NaN, quiet NaNs with payloads (one
# negative), and their neighbours +0.0 and the infinities, as float32 bits.
SPECIALS = np.array([0x80000000, 0x7F800001, 0x7FC00005, 0xFFC0BEEF, 0x00000000, 0x7F800000,
                     0xFF800000, 0x7FBFFFFF], np.uint32)


def _float_operands(cj):
    """(primitive, dtype) of every equation, at any depth, with a float or complex operand or
    result."""
    def inexact(v):
        return np.dtype(v.aval.dtype).kind in "fc"
    return {(e.primitive.name, str(v.aval.dtype)) for e in _walk.iter_eqns(cj)
            for v in list(e.invars) + list(e.outvars) if hasattr(v, "aval") and inexact(v)}


@pytest.mark.parametrize("dtype", ["float32", "complex64"])
def test_float_values_move_only_as_their_words(dtype):
    """The TPU form selects float operands as unsigned words: the only equations that see a
    float are the bitcasts in and out (complex: real/imag/complex around them), and the
    custom_jvp_call that holds them; every select over the operand is on u32 words.
    (passes/batched_updates.py `_as_words`: on a v5e, float selects of this form gave +0.0 for
    -0.0 and quieted NaN payloads, which the CPU does not show.)"""
    rng = np.random.default_rng(6)
    nested = jax.vmap(dus_tuple)
    x, u = _bits(rng, (3, 4, 10), dtype), _bits(rng, (3, 4, 3), dtype)
    s = jnp.asarray(rng.integers(-5, 12, (3, 4)), jnp.int32)
    res = _rewrite(nested, x, u, s, **TPU)
    assert _scatters(res.jaxpr) == 0
    allowed = {"bitcast_convert_type", "custom_jvp_call", "real", "imag", "complex"}
    assert {p for p, _ in _float_operands(res.jaxpr)} <= allowed
    selects = [e for e in _walk.iter_eqns(res.jaxpr) if e.primitive.name == "select_n"
               and tuple(e.outvars[0].aval.shape) == x.shape]
    assert len(selects) == 3 * (2 if dtype == "complex64" else 1)
    assert {str(e.outvars[0].aval.dtype) for e in selects} == {"uint32"}
    assert_equivalent(nested, x, u, s, bitwise=True, **TPU)


def test_negative_zero_and_nan_payloads_keep_their_bits():
    """The issue 45 case on any backend: -0.0 and NaN payloads in the updates and in the
    operand come out with their bits, against numpy's update and jax.jit's, for the nested vmap
    that showed it on the chip, a single vmap, and `.at[i].set`."""
    rng = np.random.default_rng(7)
    x = rng.integers(0, 2 ** 32, (3, 4, 10), dtype=np.uint64).astype(np.uint32)
    u = np.resize(SPECIALS, (3, 4, 3))
    x.reshape(-1)[::7] = np.resize(SPECIALS, x.reshape(-1)[::7].shape)
    s = rng.integers(-5, 12, (3, 4)).astype(np.int32)
    want = x.copy()
    for b in np.ndindex(3, 4):
        k = min(max(int(s[b]) + (10 if s[b] < 0 else 0), 0), 7)   # JAX wraps once, XLA clamps
        want[b][k:k + 3] = u[b]
    xf, uf = jnp.asarray(x).view(jnp.float32), jnp.asarray(u).view(jnp.float32)
    nested = jax.vmap(dus_tuple)
    got = jaxrewrite.optimize(nested, **TPU)(xf, uf, jnp.asarray(s))
    np.testing.assert_array_equal(np.asarray(got).view(np.uint32), want)
    assert_bitwise_equal(got, jax.jit(nested)(xf, uf, jnp.asarray(s)))
    flat = (xf.reshape(12, 10), uf.reshape(12, 3), jnp.asarray(s).reshape(12))
    assert_bitwise_equal(jaxrewrite.optimize(dus_tuple, **TPU)(*flat), jax.jit(dus_tuple)(*flat))
    row = (xf.reshape(12, 10), uf.reshape(12, 3)[:, 0], jnp.asarray(s).reshape(12))
    assert_bitwise_equal(jaxrewrite.optimize(set_fill, **TPU)(*row), jax.jit(set_fill)(*row))


def test_row_update_is_one_select():
    """`.at[i].set(row)` per example on (B, T, D): one select, whatever D is."""
    rng = np.random.default_rng(2)
    x, v = _bits(rng, (9, 6, 16), jnp.float32), _bits(rng, (9, 16), jnp.float32)
    i = jnp.asarray(rng.integers(-8, 8, 9), jnp.int32)
    for fn in (set_fill, set_clip):
        res = _rewrite(fn, x, v, i, **TPU)
        assert _scatters(res.jaxpr) == 0 and _selects(res.jaxpr, x.shape) == 1
        assert_equivalent(fn, x, v, i, bitwise=True, **TPU)


def test_integer_combines_with_colliding_rows():
    """Integer add/mul/min/max are exact in any order: several index rows per example, some
    colliding, some out of range, are taken (one select per row)."""
    rng = np.random.default_rng(3)
    x = jnp.asarray(rng.integers(-100, 100, (20, 8)), jnp.int32)
    v = jnp.asarray(rng.integers(-100, 100, (20, 3)), jnp.int32)
    i = jnp.asarray(rng.integers(-10, 10, (20, 3)), jnp.int32).at[:, 1].set(2).at[:, 2].set(2)
    for op in ("add", "multiply", "min", "max"):
        fn = jax.vmap(lambda x, v, i, op=op: getattr(x.at[i], op)(v))
        res = _rewrite(fn, x, v, i, **TPU)
        assert _scatters(res.jaxpr) == 0, op
        assert _selects(res.jaxpr, x.shape) == 3, op
        assert_equivalent(fn, x, v, i, bitwise=True, **TPU)


# --- declines ----------------------------------------------------------------------------------

def _declined(fn, *args):
    res = _rewrite(fn, *args, **TPU)
    assert _scatters(res.jaxpr) == 1 and not _events(res.report)
    reasons = [e.reason for e in _events(res.report, "declines")]
    assert len(reasons) == 1, reasons
    return reasons[0]


def test_declines_large_windows():
    row = cost.costs("tpu")
    positions, work = row.batched_update_max_positions, row.batched_update_max_work
    i = jnp.zeros(8, jnp.int32)
    wide = _declined(dus_tuple, jnp.zeros((8, 256)), jnp.zeros((8, positions + 1)), i)
    assert f"{positions + 1} positions" in wide and f"above {positions}" in wide
    n = work // 8 + 8            # 8 positions over a row just past the work limit
    long = _declined(dus_tuple, jnp.zeros((8, n)), jnp.zeros((8, 8)), i)
    assert f"over {n} elements" in long and f"above {work}" in long
    # at the limits it is taken
    assert not _events(_rewrite(dus_tuple, jnp.zeros((8, work // 8)), jnp.zeros((8, 8)), i,
                                **TPU).report, "declines")


def test_declines_undefined_and_order_dependent_cases():
    x, v = jnp.zeros((16, 8)), jnp.ones((16, 2))
    i = jnp.arange(16, dtype=jnp.int32) % 9
    promise = _declined(jax.vmap(lambda x, v, i: x.at[i].set(v[0], mode="promise_in_bounds")),
                        x, v, i)
    assert "PROMISE_IN_BOUNDS" in promise
    collide = _declined(jax.vmap(lambda x, v, i: x.at[jnp.stack([i, i // 2])].set(v)), x, v, i)
    assert "2 index rows per example" in collide and "implementation-defined" in collide
    fadd = _declined(jax.vmap(lambda x, v, i: x.at[i].add(v[0])), x, v, i)
    assert "scatter-add of float32" in fadd
    exact = _rewrite(set_fill, x, v[:, 0], i, exact=True, **TPU)
    assert _scatters(exact.jaxpr) == 1
    assert "exact=True" in _events(exact.report, "declines")[0].reason


@pytest.mark.parametrize("target", ["cpu", "gpu"])
def test_other_targets_keep_the_scatter(target):
    """The CPU updates in place and the GPU makes one scatter kernel: nothing changes there,
    and nothing is recorded."""
    x, u = jnp.zeros((100, 32)), jnp.ones((100, 8))
    s = jnp.arange(100, dtype=jnp.int32).reshape(100, 1) - 50
    for fn, args in ((dus, (x, u, s)), (set_fill, (x, u[:, 0], s[:, 0]))):
        before = jax.make_jaxpr(fn)(*args)
        res = _rewrite(fn, *args, target=target, strict=True)
        assert _scatters(res.jaxpr) == 1
        assert not _events(res.report) and not _events(res.report, "declines")
        assert primitive_counts(res.jaxpr).get("iota", 0) == primitive_counts(before).get("iota", 0)


# --- bit for bit, random cases -----------------------------------------------------------------

# Gradients of the random cases are compared on the CPU only: on a TPU v5e (Dec 6) jax.jit's own
# gradient of a vmapped dynamic_update_slice of one of these dtypes aborted the whole process
# (in jax.vjp of jax.jit's program, before the rewrite's was run; the dtype was not isolated).
GRAD = None if jax.default_backend() == "cpu" else False

DTYPES = ["float32", "bfloat16", "float16", "int8", "uint32", "bool", "complex64"]


def _scatters_left(dtype) -> int:
    """Scatters the rewrite keeps: 16-bit floats are declined (jax.jit's bits for a signaling
    NaN are the backend's: XLA:CPU scatters them through f32, quieting it)."""
    return int(np.dtype(dtype).kind == "f" and np.dtype(dtype).itemsize < 4)
INDEX_DTYPES = ["int32", "int8", "int16", "uint8", "uint32"]


@settings(max_examples=FEW)
@given(B=st.integers(1, 12), N=st.integers(1, 20), w=st.integers(1, 6),
       dtype=st.sampled_from(DTYPES), index_dtype=st.sampled_from(INDEX_DTYPES),
       seed=st.integers(0, 2 ** 16))
def test_dynamic_update_slice_bitwise(B, N, w, dtype, index_dtype, seed):
    """vmap(dynamic_update_slice) with random starts, negative and past the end included (JAX
    wraps negatives once, XLA clamps into [0, N - w]): jax.jit's bits, gradients by value, and
    the same under a further vmap."""
    w = min(w, N)
    rng = np.random.default_rng(seed)
    x, u = _bits(rng, (B, N), dtype), _bits(rng, (B, w), dtype)
    info = np.iinfo(index_dtype)
    s = jnp.asarray(rng.integers(max(info.min, -3 * N), min(info.max, 3 * N) + 1, B), index_dtype)
    res = _rewrite(dus_tuple, x, u, s, **TPU)
    assert _scatters(res.jaxpr) == _scatters_left(dtype)
    assert_equivalent(dus_tuple, x, u, s, bitwise=True, grad=GRAD, **TPU)


@settings(max_examples=FEW)
@given(B=st.integers(1, 12), N=st.integers(1, 20), D=st.integers(0, 3),
       dtype=st.sampled_from(DTYPES), index_dtype=st.sampled_from(INDEX_DTYPES),
       mode=st.sampled_from(["fill", "clip"]), seed=st.integers(0, 2 ** 16))
def test_at_set_bitwise(B, N, D, dtype, index_dtype, mode, seed):
    """`.at[i].set(v)` per example, FILL_OR_DROP (out-of-range rows dropped) and CLIP, a scalar
    or a row of D elements per example."""
    rng = np.random.default_rng(seed)
    tail = (D,) if D else ()
    x, v = _bits(rng, (B, N) + tail, dtype), _bits(rng, (B,) + tail, dtype)
    info = np.iinfo(index_dtype)
    i = jnp.asarray(rng.integers(max(info.min, -3 * N), min(info.max, 3 * N) + 1, B), index_dtype)
    fn = set_clip if mode == "clip" else set_fill
    res = _rewrite(fn, x, v, i, **TPU)
    assert _scatters(res.jaxpr) == _scatters_left(dtype)
    assert_equivalent(fn, x, v, i, bitwise=True, grad=GRAD, **TPU)


@settings(max_examples=FEW)
@given(B=st.integers(1, 6), N=st.integers(1, 8), M=st.integers(1, 6), w=st.integers(1, 8),
       m=st.integers(1, 6), mode=st.sampled_from(["fill", "clip"]),
       dtype=st.sampled_from(["float32", "int8"]), seed=st.integers(0, 2 ** 16))
def test_lax_scatter_windows_bitwise(B, N, M, w, m, mode, dtype, seed):
    """`lax.scatter` with a (w, m) window per example, vmapped: FILL_OR_DROP drops a window
    that leaves the operand anywhere (partly in range included), along a dim it covers whole
    unless its start is 0; CLIP moves it back in."""
    w, m = min(w, N), min(m, M)
    rng = np.random.default_rng(seed)
    dn = lax.ScatterDimensionNumbers(update_window_dims=(0, 1), inserted_window_dims=(),
                                     scatter_dims_to_operand_dims=(0, 1))
    fn = jax.vmap(lambda x, u, i: lax.scatter(x, i, u, dn, mode=mode))
    x, u = _bits(rng, (B, N, M), dtype), _bits(rng, (B, w, m), dtype)
    i = jnp.asarray(np.stack([rng.integers(-N - 2, N + 3, B), rng.integers(-2, M + 3, B)], -1)
                    .astype(np.int32))
    res = _rewrite(fn, x, u, i, **TPU)
    assert _scatters(res.jaxpr) == _scatters_left(dtype)
    positions = (w if w < N else 1) * (m if m < M else 1)
    whole = mode == "clip" and w == N and m == M     # every example overwritten: no select
    assert _selects(res.jaxpr, (B, N, M)) == (0 if whole else positions)
    assert_equivalent(fn, x, u, i, bitwise=True, grad=GRAD, **TPU)


def test_int64_indices_under_x64():
    """64-bit and unsigned starts far out of int32's range: clamped and dropped as jax.jit does
    (the bounds are computed in the index dtype, then converted)."""
    rng = np.random.default_rng(4)
    with jax.enable_x64(True):
        # (float32 data: 64-bit floats are declined, `test_64_bit_floats_are_declined`)
        x, u = (jnp.asarray(rng.standard_normal(s), jnp.float32) for s in ((30, 16), (30, 4)))
        for dt, lo in (("int64", -2 ** 40), ("uint64", 0), ("uint32", 0)):
            s = rng.integers(lo, 2 ** 40 if dt != "uint32" else 2 ** 32, 30)
            s[:10] = rng.integers(0, 14, 10)
            s = jnp.asarray(s.astype(dt))
            for fn, upd in ((dus_tuple, u), (set_fill, u[:, 0]), (set_clip, u[:, 0])):
                assert _scatters(_rewrite(fn, x, upd, s, **TPU).jaxpr) == 0
                assert_bitwise_equal(jaxrewrite.optimize(fn, **TPU)(x, upd, s),
                                     jax.jit(fn)(x, upd, s))


@pytest.mark.parametrize("dtype", ["float64", "complex128"])
def test_64_bit_floats_are_declined(dtype):
    """XLA:TPU emulates 64-bit floats: the words the selects would move are not IEEE's (a
    float64 window came back wrong in every element on a v5e). The scatter is kept."""
    rng = np.random.default_rng(9)
    with jax.enable_x64(True):
        # traced from numpy arrays: on a TPU, even jnp.asarray of a complex128 array compiles a
        # copy that XLA:TPU fails (a RET_CHECK in xprecision_emitters.cc), before any rewrite
        x = rng.standard_normal((30, 16)).astype(dtype)
        u = rng.standard_normal((30, 4)).astype(dtype)
        s = rng.integers(0, 14, 30).astype(np.int32)
        res = _rewrite(dus_tuple, x, u, s, **TPU)
        assert _scatters(res.jaxpr) == 1
        assert any("64-bit floats" in e.reason for e in res.report.declines
                   if e.pass_name == "batched_updates")
        if dtype == "complex128" and jax.default_backend() == "tpu":
            pytest.skip("XLA:TPU's compiler aborts on jax.jit's own complex128 program "
                        "(xprecision_rewriter.cc, seen compiling for a v5e with libtpu): no "
                        "bits to compare; the decline is checked above")
        assert_bitwise_equal(jaxrewrite.optimize(dus_tuple, **TPU)(x, u, s),
                             jax.jit(dus_tuple)(x, u, s))


def test_gradient_by_value_and_gradient_program():
    """jax.grad through the rewritten program equals jax.jit's by value; and the gradient
    program, whose transposed scatter is batched too, rewritten, gives jax.jit's bits."""
    rng = np.random.default_rng(5)
    x = jnp.asarray(rng.standard_normal((64, 32)), jnp.float32)
    u = jnp.asarray(rng.standard_normal((64, 8)), jnp.float32)
    s = jnp.asarray(rng.integers(-40, 40, (64, 1)), jnp.int32)
    weights = jnp.asarray(rng.standard_normal((64, 32)), jnp.float32)

    def loss(update):
        return lambda x, u, s: jnp.sum(jnp.sin(update(x, u, s)) * weights)

    grad = jax.grad(loss(dus), argnums=(0, 1))
    through = jax.grad(loss(jaxrewrite.optimize(dus, target="tpu")), argnums=(0, 1))
    assert_value_equal(through(x, u, s), jax.jit(grad)(x, u, s))
    res = _rewrite(grad, x, u, s, **TPU)
    assert _scatters(jax.make_jaxpr(grad)(x, u, s)) == 2 and _scatters(res.jaxpr) == 0
    assert_bitwise_equal(jaxrewrite.optimize(grad, target="tpu")(x, u, s), jax.jit(grad)(x, u, s))


def test_form_is_well_typed():
    cj = jaxrewrite.make_jaxpr(dus, target="tpu")(jnp.zeros((8, 16)), jnp.zeros((8, 3)),
                                                   jnp.zeros((8, 1), jnp.int32))
    C.check_jaxpr(cj)
    assert _scatters(cj) == 0


def test_bench_quick_row():
    """bench/batched_updates.py runs here: the issue's row, every variant jax.jit's bits, the
    TPU's form made by optimize(target="tpu") and nothing by the CPU's default."""
    import importlib.util
    import os
    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench",
                        "batched_updates.py")
    spec = importlib.util.spec_from_file_location("bench_batched_updates", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    name, fn, hand, args = bench.programs(quick=True)[0]
    assert name == "dus (100, 32) 2 wide"
    row = bench.measure(name, fn, hand, args, quick=True)
    # (`opt_tpu` only where the backend is not the TPU: there `opt` is the TPU's form)
    want = {"opt": True, "jit_again": True, "hand": True}
    if jax.default_backend() != "tpu":
        want["opt_tpu"] = True
    assert row["bitwise"] == want
    # "opt" is optimize's default target: the TPU's form where that is the TPU (a TPU host, or
    # JAXREWRITE_TEST_TARGET=tpu)
    from jaxrewrite._options import Options
    default_tpu = Options().resolved_target() == "tpu"
    on_tpu = jax.default_backend() == "tpu"
    assert row["rewritten"] == ({"opt": True} if on_tpu else {"opt": default_tpu, "opt_tpu": True})
    assert row["run_us_jit"] > 0 and row["compile_ms_jit"] > 0
    assert row["ratio_opt" if on_tpu else "ratio_opt_tpu"] > 0
    assert "met" not in str(bench.verdicts([row], "cpu"))
