"""One Pallas kernel for a region of integer work on split pieces (passes/kernel.py).

Without a TPU (CI): kernels run in Pallas's interpreter (`backend.mosaic.interpret()`), bit for
bit against jax.jit and RFC 8439's ChaCha20 block; `target="tpu"` structure (which regions
become kernels, the loop inside, declines); and the emitted kernels lowered to Mosaic for the
TPU on this host (`lower(lowering_platforms=("tpu",))`, Pallas's TPU lowering rules). On a TPU
the same tests compile and run the kernels with Mosaic, the bits checked on the chip.
"""
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import jaxrewrite
from jaxrewrite import _compat as C
from jaxrewrite import _walk
from jaxrewrite.backend import cost as _cost
from jaxrewrite.backend import mosaic
from jaxrewrite.backend import xla as _xla
from jaxrewrite.testing import (assert_bitwise_equal, assert_equivalent, primitive_counts,
                                tpu_custom_calls)

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "bench"))
import author_chacha as A  # noqa: E402
import permutations as P  # noqa: E402

TPU = dict(target="tpu", kernel=True, strict=True)


def _rewrite(fn, *args, **opts):
    return jaxrewrite.rewrite_jaxpr_with_report(jax.make_jaxpr(fn)(*args), **{**TPU, **opts})


def _kernels(cj) -> list:
    return [e for e in _walk.iter_eqns(cj) if e.primitive.name == "pallas_call"]


def _outside(cj) -> dict:
    """Primitive counts of the program, not looking inside kernels."""
    counts: dict = {}

    def walk(j):
        for e in (j.jaxpr if isinstance(j, C.ClosedJaxpr) else j).eqns:
            counts[e.primitive.name] = counts.get(e.primitive.name, 0) + 1
            if e.primitive.name != "pallas_call":
                for _, _, sub in C.params_jaxprs(e.params):
                    walk(sub)
    walk(cj)
    return counts


def _inside(kernel_eqn) -> dict:
    return primitive_counts(C.closed(kernel_eqn.params["jaxpr"], ()))


def _events(report, applied=True):
    return [e for e in (report.rewrites if applied else report.declines)
            if e.pass_name == "kernel"]


def _no_kernel_reasons(report):
    """Why no kernel: the kernel pass's declines, or flatten's where it kept a loop unsplit
    after the kernel route was refused (the loop never reached the kernel pass as pieces)."""
    return [e.reason for e in report.declines if e.pass_name == "kernel"
            or (e.pass_name == "flatten" and "not kept rolled for a kernel" in e.reason)]


def _lowers_for_tpu(fn, *args, **opts):
    """The rewritten program, its kernels emitted for Mosaic, lowered for the TPU here: the
    custom calls in the lowered module (walked, not read as text)."""
    with mosaic.emit_for("tpu"):
        cj = jaxrewrite.make_jaxpr(fn, **{**TPU, **opts})(*args)
    assert all(not e.params["interpret"] for e in _kernels(cj))
    targets = tpu_custom_calls(cj, *args)
    return cj, targets


# --- ChaCha20: bits, the RFC block, structure -------------------------------------------------

@pytest.mark.parametrize("n", [4096, 5120])   # (5,120: 40 rows, the last block of 16 partial)
def test_chacha_author_form_is_one_kernel_with_the_loop_inside(n):
    f = jax.vmap(P.chacha_loop("fori"))
    x = P._blocks(n)
    out = jaxrewrite.optimize(f, **TPU)(x)
    assert_bitwise_equal(out, jax.jit(f)(x))
    np.testing.assert_array_equal(np.asarray(out)[0], P.RFC_OUT)   # RFC 8439 section 2.3.2
    res = _rewrite(f, x)
    (k,) = _kernels(res.jaxpr)
    assert "scan" not in _outside(res.jaxpr) and "while" not in _outside(res.jaxpr)
    inside = _inside(k)
    assert inside["scan"] == 1 and inside["get"] == 16 and inside["swap"] == 16
    loop = next(e for e in k.params["jaxpr"].eqns if e.primitive.name == "scan")
    assert loop.params["length"] == 10
    (stats,) = res.report.stats["kernel"]
    rows = _cost.costs("tpu").kernel_tile_rows
    # the loop and the feed-forward's 16 adds, done on the pieces (`kernel._epilogues`)
    # (the state read and written in place where the grid's blocks are whole: 4,096)
    whole = 16 * (n % (128 * rows) == 0)
    assert stats == dict(elements=n, rows=rows, grid=-(-n // 128 // rows), pieces_in=16,
                         scalars_in=0, pieces_out=16, eqns=1 + 16, work=stats["work"],
                         trips=[10], interpret=mosaic.interpret(), in_place_in=whole,
                         in_place_out=whole)
    # flatten kept the loop rolled for the kernel: its body once, not 10 times
    assert res.report.counts["flatten.carries_split_for_kernel"] == 1
    assert stats["work"] > 10 * 150


def test_chacha_python_loop_is_a_loop_kernel_and_the_hand_form_a_straight_line_one():
    """The Python loop of the author's double round is rolled into the loop it is (`rounds`),
    which runs inside the kernel; the hand-written 16-word form, no permutation to roll for,
    is one straight-line kernel."""
    x = P._blocks(4096)
    for f, rolled in ((jax.vmap(P.chacha_loop("python")), True), (jax.vmap(P.chacha_words),
                                                                  False)):
        out = jaxrewrite.optimize(f, **TPU)(x)
        assert_bitwise_equal(out, jax.jit(f)(x))
        np.testing.assert_array_equal(np.asarray(out)[0], P.RFC_OUT)
        (k,) = _kernels(_rewrite(f, x).jaxpr)
        inside = _inside(k)
        if rolled:   # one double round's 2 x 16 adds, inside a scan of 10 trips, + the
            assert inside["scan"] == 1 and inside["add"] == 2 * 16 + 16    # feed-forward
        else:        # 20 rounds x 16, + the feed-forward
            assert "scan" not in inside and inside["add"] == 16 * 21


def test_kernel_program_is_equivalent_under_vmap_and_idempotent():
    f = jax.vmap(P.chacha_loop("fori", rounds=2))
    x = P._blocks(4096)
    cj = assert_equivalent(f, x, bitwise=True, debug_checks=True, **TPU)
    again = jaxrewrite.rewrite_jaxpr(cj, **TPU)
    assert len(_kernels(again)) == len(_kernels(cj)) == 1


# --- the default: the TPU's cost row decides; other targets unchanged ---------------------------

def test_auto_takes_large_batches_on_the_tpu_only():
    f = jax.vmap(P.chacha_loop("fori"))
    big = jax.ShapeDtypeStruct((_cost.costs("tpu").kernel_min_elements, 4, 4), np.uint32)
    small = jax.ShapeDtypeStruct((16384, 4, 4), np.uint32)
    cj = jax.make_jaxpr(f)(big)
    assert len(_kernels(jaxrewrite.rewrite_jaxpr(cj, target="tpu"))) == 1
    for target in ("cpu", "gpu"):
        auto = jaxrewrite.rewrite_jaxpr(cj, target=target)
        assert not _kernels(auto)
        assert primitive_counts(auto) == primitive_counts(
            jaxrewrite.rewrite_jaxpr(cj, target=target, kernel=False))
    # below the row's minimum: the program the TPU target makes without kernels (rolled, split)
    cj = jax.make_jaxpr(f)(small)
    res = jaxrewrite.rewrite_jaxpr_with_report(cj, target="tpu")
    assert primitive_counts(res.jaxpr) == primitive_counts(
        jaxrewrite.rewrite_jaxpr(cj, target="tpu", kernel=False))
    (why,) = [e.reason for e in _events(res.report, applied=False)]
    assert "kernel_min_elements" in why


def test_tile_rows_come_from_the_cost_row():
    f = jax.vmap(P.chacha_loop("fori"))
    x = jax.ShapeDtypeStruct((8192, 4, 4), np.uint32)
    for rows in (8, 32):
        with _cost.override_row("tpu", kernel_tile_rows=rows):
            (k,) = _kernels(_rewrite(f, x).jaxpr)
        (block,) = {m.block_shape for m in k.params["grid_mapping"].block_mappings}
        # (the (N, 4, 4) state in place: its 4 slabs, `rows` tiles of 4 sublanes each)
        assert [getattr(d, "block_size", d) for d in block] == [4, 4 * rows, 128]
        assert k.params["grid_mapping"].grid == (8192 // 128 // rows,)
    assert _cost.costs("tpu").kernel_tile_rows == 16   # (restored)


# --- declines -------------------------------------------------------------------------------

def _float_words(x, loop: bool):
    """Four float words (pieces of the batch), rounds as a Python loop or in a `fori_loop`."""
    def round_(s):
        a, b, c, d = s
        return a * b + c, b - d, c * 0.5, d + a
    s = tuple(x[i] for i in range(4))
    for _ in range(4 if not loop else 0):
        s = round_(s)
    if loop:
        s = lax.fori_loop(0, 4, lambda i, s: round_(s), s)
    return jnp.stack(s)


@pytest.mark.parametrize("loop", [False, True])
def test_float_regions_are_declined_with_the_reason(loop):
    x = jnp.asarray(np.random.default_rng(0).standard_normal((4, 4096)), jnp.float32)
    f = lambda x: _float_words(x, loop)  # noqa: E731
    res = _rewrite(f, x)
    assert not _kernels(res.jaxpr)
    reasons = [e.reason for e in _events(res.report, applied=False)]
    assert len(reasons) == 1 and mosaic.dtype_reason(np.float32) in reasons[0]
    assert_bitwise_equal(jaxrewrite.optimize(f, **TPU)(x), jax.jit(f)(x))


def _with_division(x):
    a, b = x[0], x[1]
    for _ in range(3):
        a, b = a + b, (b ^ a) << np.uint32(3)
    c = a // np.uint32(7)               # not in the kernel's table: the region is cut here
    for _ in range(3):
        c, b = c + b, (b ^ c) >> np.uint32(5)
    return jnp.stack([c, b])


def test_an_unsupported_primitive_cuts_the_region():
    x = jnp.asarray(np.random.default_rng(1).integers(0, 2**32, (4096, 2), dtype=np.uint32))
    f = jax.vmap(_with_division)
    res = _rewrite(f, x)
    assert len(_kernels(res.jaxpr)) == 2 and _outside(res.jaxpr)["div"] == 1
    reasons = [e.reason for e in _events(res.report, applied=False)]
    assert any(mosaic.DECLINED_PRIMITIVES["div"] in r for r in reasons)
    assert_bitwise_equal(jaxrewrite.optimize(f, **TPU)(x), jax.jit(f)(x))


def test_an_unsupported_primitive_in_a_loop_keeps_the_loop_xla_s():
    def rounds(x):
        return lax.fori_loop(0, 3, lambda i, s: (s[0] // (s[1] | 1), s[1] + s[0]), (x[0], x[1]))
    x = jnp.asarray(np.random.default_rng(2).integers(0, 2**32, (2, 4096), dtype=np.uint32))
    res = _rewrite(rounds, x)
    assert not _kernels(res.jaxpr)
    (why,) = [e.reason for e in _events(res.report, applied=False)]
    assert why.startswith("scan on pieces") and mosaic.DECLINED_PRIMITIVES["div"] in why
    assert_bitwise_equal(jaxrewrite.optimize(rounds, **TPU)(x), jax.jit(rounds)(x))


@pytest.mark.parametrize("n", [4100, 5000])
def test_batches_that_do_not_tile_are_declined(n):
    f = jax.vmap(P.chacha_loop("fori", rounds=2))
    x = P._blocks(n)
    res = _rewrite(f, x)
    assert not _kernels(res.jaxpr)
    reasons = _no_kernel_reasons(res.report)
    assert reasons and all(mosaic.tile_reason(n, 16) in r for r in reasons)
    assert_bitwise_equal(jaxrewrite.optimize(f, **TPU)(x), jax.jit(f)(x))


def test_64_bit_lanes_are_declined():
    with jax.enable_x64(True), mosaic.emit_for("interpreter"):  # (x64: no Mosaic kernels)
        x = jnp.asarray(np.random.default_rng(3).integers(0, 2**63, (4096, 4), dtype=np.uint64))

        rot = np.array([1, 2, 3, 0])

        def rounds(s):   # two permutations a trip: the TPU splits the loop's carry
            return lax.fori_loop(0, 8, lambda i, s: (s[rot] ^ (s << np.uint64(33)))[rot] + s,
                                 s)
        res = _rewrite(jax.vmap(rounds), x)
    assert not _kernels(res.jaxpr)
    reasons = _no_kernel_reasons(res.report)
    # (the lanes' uint64, or the loop counter's int64 that x64 gives the fori_loop)
    assert reasons and all(mosaic.dtype_reason(np.uint64) in r
                           or mosaic.dtype_reason(np.int64) in r for r in reasons)


# --- the seed author's code, as written -------------------------------------------------------

@pytest.mark.parametrize("x64", [False, True])
@pytest.mark.parametrize("n", [4096, 1 << 20])
def test_the_author_s_chacha_as_written_is_one_kernel(n, x64):
    """bench/author_chacha.py: a `jnp.ndarray` subclass re-wrapping the state (a `copy`),
    `jnp.array([...], dtype=...)` re-stacking, asserts, `ravel()[idx]`, a `fori_loop` of jitted
    double rounds (an int64 counter under x64): one kernel, nothing in it that Mosaic does not
    lower, RFC 8439's block and jax.jit's bits."""
    if n > 4096 and jax.default_backend() != "tpu":
        pytest.skip("1,048,576 blocks in Pallas's interpreter: the chip's size, run there")
    with jax.enable_x64(x64):
        f = jax.vmap(A.fresh_copy().block)   # (one per x64 setting)
        x = P._blocks(n)
        res = _rewrite(f, x)
        (k,) = _kernels(res.jaxpr)
        assert set(_inside(k)) <= set(mosaic.KERNEL_PRIMITIVES) | {"scan", "get", "swap"}
        # (the wrapper's copy of the whole state, before it is split, stays XLA's: a no-op there)
        assert _inside(k)["scan"] == 1 and "scan" not in _outside(res.jaxpr)
        out = jaxrewrite.optimize(f, **TPU)(x)     # (strict: no fallback)
        assert_bitwise_equal(out, jax.jit(f)(x))
        np.testing.assert_array_equal(np.asarray(out)[0], P.RFC_OUT)
        _, targets = _lowers_for_tpu(f, x)
    assert targets == ["tpu_custom_call"]


# --- what a kernel body holds -----------------------------------------------------------------

_UNARY = {"neg": lax.neg, "not": lax.bitwise_not}
_COMPARE = {"eq", "ne", "lt", "le", "gt", "ge"}


def _one_primitive(name, dtype):
    """(a function of two pieces and a predicate binding primitive `name` on operands of
    `dtype`, its operands) for every row of the table."""
    rng = np.random.default_rng(7)
    if dtype == "bool":
        a, b = (jnp.asarray(rng.integers(0, 2, 4096).astype(bool)) for _ in range(2))
    else:
        a, b = (jnp.asarray(rng.integers(0, 2**32, 4096, dtype=np.uint32).view(dtype))
                for _ in range(2))
    p = jnp.asarray(rng.integers(0, 2, 4096).astype(bool))
    if name in _UNARY:
        return (lambda a, b, p: _UNARY[name](a)), (a, b, p)
    op = getattr(lax, {"and": "bitwise_and", "or": "bitwise_or", "xor": "bitwise_xor"}.get(name,
                                                                                        name))
    if name == "select_n":
        return (lambda a, b, p: lax.select_n(p, a, b)), (a, b, p)
    if name == "convert_element_type":
        outs = [d for d in ("int32", "uint32", "bool") if d != dtype]
        return (lambda a, b, p: tuple(lax.convert_element_type(a, d) for d in outs)), (a, b, p)
    if name in mosaic.SHIFTS:
        return (lambda a, b, p: (op(a, b & 31), op(a, b))), (a, b, p)
    return (lambda a, b, p: op(a, b)), (a, b, p)


_ROWS = [(name, dt) for name, dts in mosaic.KERNEL_PRIMITIVES.items() for dt in dts]


@pytest.mark.parametrize("name,dtype", _ROWS, ids=[f"{n}-{d}" for n, d in _ROWS])
def test_every_row_of_the_table_lowers_for_mosaic_and_is_bit_exact(name, dtype):
    """Each primitive of `backend.mosaic.KERNEL_PRIMITIVES`, on each dtype its row admits, alone
    in a kernel: lowered through Pallas's TPU rules here; compiled by Mosaic and run on the
    chip where the suite runs on a TPU (interpreted elsewhere), bit for bit jax.jit's."""
    f, args = _one_primitive(name, dtype)
    res = _rewrite(f, *args)
    (k,) = _kernels(res.jaxpr)
    # (a select between masks is computed with logic ops: `kernel._select`)
    want = {"and", "or", "not"} if (name, dtype) == ("select_n", "bool") else {name}
    assert want <= set(_inside(k))
    assert_bitwise_equal(jaxrewrite.optimize(f, **TPU)(*args), jax.jit(f)(*args))
    _, targets = _lowers_for_tpu(f, *args)
    assert targets == ["tpu_custom_call"]


def _wrapped(a, b):
    """What real code puts around integer work: copies, conversions to the dtype a value has,
    a custom_jvp and a custom_vjp function, a jit."""
    @jax.custom_jvp
    def mix(x, y):
        return (x ^ y) + (x << np.uint32(3))
    mix.defjvp(lambda primals, tangents: (mix(*primals), tangents[0]))

    @jax.custom_vjp
    def spin(x):
        return x + (x >> np.uint32(5))
    spin.defvjp(lambda x: (spin(x), None), lambda _, g: (g,))

    c = jnp.array(a) + b.copy()
    c = jnp.asarray(c, jnp.uint32) ^ lax.convert_element_type(b, np.uint32)
    return jax.jit(spin)(mix(c, b))


def test_copies_conversions_and_custom_rules_are_taken_as_what_they_compute():
    rng = np.random.default_rng(8)
    a, b = (jnp.asarray(rng.integers(0, 2**32, 4096, dtype=np.uint32)) for _ in range(2))
    res = _rewrite(_wrapped, a, b)
    (k,) = _kernels(res.jaxpr)
    assert not set(_inside(k)) - set(mosaic.KERNEL_PRIMITIVES) - {"get", "swap"}
    names = {e.primitive.name for e in _walk.iter_eqns(jax.make_jaxpr(_wrapped)(a, b))}
    assert {"copy", "custom_jvp_call", "custom_vjp_call"} <= names     # (what was taken in)
    assert_bitwise_equal(jaxrewrite.optimize(_wrapped, **TPU)(a, b), jax.jit(_wrapped)(a, b))
    _, targets = _lowers_for_tpu(_wrapped, a, b)
    assert targets == ["tpu_custom_call"]


def _every_op(a, b, k):
    """Every primitive of the table on pieces: words of both signs, booleans, a scalar from
    SMEM (`k`), shifts by amounts of 0..63 (XLA's result beyond 31), an iota along the piece."""
    i = lax.convert_element_type(a, np.int32)
    j = lax.convert_element_type(b, np.int32)
    d = b & np.uint32(63)
    n = lax.iota(np.uint32, a.shape[0])
    u = (a + b) * (a - b) ^ (a | k) & ~b
    u = u + lax.shift_left(a, d) + lax.shift_right_logical(b, d) + (a << np.uint32(7))
    v = lax.shift_right_arithmetic(i, lax.convert_element_type(d, np.int32)) + (-j)
    m = (a < b) | (i >= j) ^ (a == n) & (i != j) | (a <= k) & ~(j > i)
    # (max/min on signed words only: Mosaic did not legalize the unsigned ones on a TPU v5e)
    w = lax.select(m, lax.max(i, j), lax.min(i, j)).astype(np.uint32) + lax.max(i, j).astype(
        np.uint32)
    w = w + lax.min(i, j).astype(np.uint32) + m.astype(np.uint32)
    return u ^ w ^ v.astype(np.uint32) ^ n, m, (i > j) != m


def test_every_table_primitive_is_bit_exact_and_lowers_for_the_tpu():
    rng = np.random.default_rng(4)
    a, b = (jnp.asarray(rng.integers(0, 2**32, 4096, dtype=np.uint32)) for _ in range(2))
    k = jnp.uint32(0x9E3779B9)
    f = _every_op
    assert_bitwise_equal(jaxrewrite.optimize(f, **TPU)(a, b, k), jax.jit(f)(a, b, k))
    res = _rewrite(f, a, b, k)
    (kern,) = _kernels(res.jaxpr)
    inside = set(_inside(kern))
    # (copies and stop_gradient do not appear in a traced program; the rest all do)
    assert set(mosaic.KERNEL_PRIMITIVES) - {"copy", "copy_p", "stop_gradient"} <= inside
    (stats,) = res.report.stats["kernel"]
    assert (stats["pieces_in"], stats["scalars_in"], stats["pieces_out"]) == (2, 1, 3)
    cj, targets = _lowers_for_tpu(f, a, b, k)
    assert targets == ["tpu_custom_call"] and len(_kernels(cj)) == 1


_DEVICELESS = pytest.mark.skipif(
    not _xla.tpu_compile_available(),
    reason="compiles for a TPU v5e: needs libtpu (the tpu-aot extra), or a v5e host")


def _one_op_kernel(op, dtype):
    """A Pallas kernel applying `op` to two (16, 128) tiles a grid step: the table's question
    (does Mosaic compile this primitive on this dtype?) asked with nothing else in the kernel."""
    from jax.experimental import pallas as pl

    def body(a_ref, b_ref, o_ref):
        o_ref[...] = op(a_ref[...], b_ref[...]).astype(o_ref.dtype)

    spec = pl.BlockSpec((16, 128), lambda i: (i, 0))
    return pl.pallas_call(body, out_shape=jax.ShapeDtypeStruct((64, 128), dtype), grid=(4,),
                          in_specs=[spec, spec], out_specs=spec)


@_DEVICELESS
@pytest.mark.parametrize("op", [lax.max, lax.min], ids=["max", "min"])
def test_mosaic_compiles_signed_max_and_refuses_unsigned_as_the_table_says(op):
    """Why the table admits max/min on int32 only, checked by Mosaic's own compile for a TPU v5e
    on this host: the signed kernel compiles, the unsigned one is refused, as on the chip on
    Dec 6. If a newer libtpu compiles it, the table's row can be widened (after the bits are
    checked on the chip)."""
    assert mosaic.KERNEL_PRIMITIVES[op.__name__] == ("int32",)
    spec = jax.ShapeDtypeStruct((64, 128), np.int32)
    assert _xla.launches(_xla.tpu_compile(_one_op_kernel(op, np.int32), spec, spec)) == {
        "custom-call": 1}
    uspec = jax.ShapeDtypeStruct((64, 128), np.uint32)
    with pytest.raises(Exception):
        _xla.tpu_compile(_one_op_kernel(op, np.uint32), uspec, uspec)


_UNCHECKED_OPS = {"population_count": lax.population_count, "clz": lax.clz, "abs": lax.abs,
                  "integer_pow": lambda a: lax.integer_pow(a, 3)}


@pytest.mark.skipif(not _xla.tpu_aot_available() and jax.default_backend() != "tpu",
                    reason="needs Mosaic: a TPU, or libtpu (the tpu-aot extra) to compile for one")
@pytest.mark.parametrize("name", sorted(mosaic.COMPILED_UNCHECKED))
def test_what_mosaic_compiles_but_the_table_has_not_checked(name):
    """`mosaic.COMPILED_UNCHECKED`, each alone in a kernel on int32 words: compiled by Mosaic
    for a TPU v5e where there is none; on a TPU, run, and its bits compared with XLA's on
    words of every kind (the chip's answer decides whether the row joins the table)."""
    op = _UNCHECKED_OPS[name]
    assert name in mosaic.DECLINED_PRIMITIVES and name not in mosaic.KERNEL_PRIMITIVES
    kernel = _one_op_kernel(lambda a, b: op(a) + b, np.int32)
    if jax.default_backend() != "tpu":
        spec = jax.ShapeDtypeStruct((64, 128), np.int32)
        assert _xla.launches(_xla.tpu_compile(kernel, spec, spec)) == {"custom-call": 1}
        return
    rng = np.random.default_rng(3)
    a = rng.integers(-2**31, 2**31, (64, 128), dtype=np.int64).astype(np.int32)
    a[0, :8] = [0, -1, 1, -2**31, 2**31 - 1, 2**16, -2**16, 3]
    b = np.zeros_like(a)
    assert_bitwise_equal(jax.jit(kernel)(a, b), jax.jit(lambda a, b: op(a) + b)(a, b))


@_DEVICELESS
def test_mosaic_refuses_a_select_between_masks_that_the_pass_writes_as_logic():
    """`kernel._select` computes a select between booleans with and/or/not because Mosaic does
    not compile a select of masks: refused here as on the chip; the pass's form compiles."""
    spec = jax.ShapeDtypeStruct((64, 128), np.int32)
    between_masks = lambda a, b: jnp.where(a > b, a < 5, b < 7)            # noqa: E731
    as_logic = lambda a, b: ((a > b) & (a < 5)) | (~(a > b) & (b < 7))       # noqa: E731
    with pytest.raises(Exception):
        _xla.tpu_compile(_one_op_kernel(between_masks, np.int32), spec, spec)
    assert _xla.launches(_xla.tpu_compile(_one_op_kernel(as_logic, np.int32), spec, spec)) == {
        "custom-call": 1}


@_DEVICELESS
def test_the_author_s_code_compiles_for_the_tpu_with_x64_on_and_off():
    """bench/author_chacha.py as written, through optimize with the defaults for the TPU, and
    compiled by XLA:TPU and Mosaic for a TPU v5e here: the kernel, reading and writing the
    state in place, is the program's only launch, with x64 off and on (int64 grid index maps
    failed Mosaic's compile on the chip)."""
    for x64 in (False, True):
        with jax.enable_x64(x64):
            f = jaxrewrite.optimize(jax.vmap(A.fresh_copy().block), target="tpu")
            n = 1 << 16          # (from `kernel_min_elements`: the default takes the kernel)
            compiled = _xla.tpu_compile(f, jax.ShapeDtypeStruct((n, 4, 4), np.uint32))
            assert _xla.launches(compiled) == {"custom-call": 1}, x64


def test_chacha_kernels_lower_for_the_tpu():
    x = P._blocks(4096)
    for form in ("fori", "python"):
        cj, targets = _lowers_for_tpu(jax.vmap(P.chacha_loop(form)), x)
        assert targets == ["tpu_custom_call"]


def test_a_while_loop_runs_inside_the_kernel():
    def rounds(s):
        def body(c):
            i, a, b = c
            return i + 1, a + (b ^ lax.convert_element_type(i, np.uint32)), b ^ (a << np.uint32(9))
        return lax.while_loop(lambda c: c[0] < 5, body, (0, s[0], s[1]))[1:]
    x = jnp.asarray(np.random.default_rng(5).integers(0, 2**32, (2, 4096), dtype=np.uint32))
    f = lambda x: rounds(x)  # noqa: E731 - (the carry is pieces already: nothing to split)
    assert_bitwise_equal(jaxrewrite.optimize(f, **TPU)(x), jax.jit(f)(x))
    (k,) = _kernels(_rewrite(f, x).jaxpr)
    assert _inside(k)["while"] == 1
    _lowers_for_tpu(f, x)


@pytest.mark.skipif(jax.default_backend() == "tpu", reason="Mosaic kernels lower on a TPU")
def test_a_kernel_that_cannot_lower_falls_back_with_one_warning(monkeypatch):
    """Emitted for Mosaic on a CPU-only process, the kernel cannot be lowered here: the kernel
    pass is dropped and the split form the passes before it made runs (the lowering guard,
    `_api._lowering_failed`)."""
    monkeypatch.setattr(mosaic, "interpret", lambda: False)
    f = jax.vmap(P.chacha_loop("fori", rounds=2))
    x = P._blocks(4096)
    g = jaxrewrite.optimize(f, target="tpu", kernel=True)
    with pytest.warns(RuntimeWarning, match="could not be lowered .*dropped pass 'kernel', "
                                            "running the program the other passes made"):
        traced = g.trace(x)
        out = g(x)
    assert_bitwise_equal(out, jax.jit(f)(x))
    ran = C.lowered_instead(traced.jaxpr)
    assert "pallas_call" in primitive_counts(traced.jaxpr)
    assert ran is not None and "pallas_call" not in primitive_counts(ran)
    assert jaxrewrite.last_report().stats["fallback"] == {"dropped": ["kernel"], "original": False}


def test_scalar_words_carried_in_the_loop_live_in_smem():
    """Philox-4x32-10 with counters vmapped and one key: the key's two words are scalars,
    carried (and bumped every round) inside the kernel's loop."""
    import tpu_kernel as B
    ctr = np.zeros((4096, 4), np.uint32)
    ctr[:, 0] = np.arange(4096)
    ctr[1], ctr[2] = B.PHILOX_KAT[0][0], B.PHILOX_KAT[1][0]
    key = np.array([0x12345678, 0x9ABCDEF0], np.uint32)
    f = jax.vmap(B.philox, in_axes=(0, None))
    out = np.asarray(jaxrewrite.optimize(f, **TPU)(ctr, key))
    np.testing.assert_array_equal(out, B.philox_np(ctr, key))
    assert_bitwise_equal(out, jax.jit(f)(ctr, key))
    for c, k, want in B.PHILOX_KAT:        # Random123's known answers
        np.testing.assert_array_equal(B.philox_np(np.array([c], np.uint32), k)[0], want)
    res = _rewrite(f, ctr, key)
    (stats,) = res.report.stats["kernel"]
    assert (stats["pieces_in"], stats["scalars_in"], stats["trips"]) == (4, 2, [10])
    _lowers_for_tpu(f, ctr, key)


def test_kernels_with_x64_on_count_trips_in_int32():
    """`jax_enable_x64` (JAX MD, most science code): the fori_loop's int64 trip counter is
    carried as int32 in the kernel, the grid's block indices are int32, and the kernel lowers
    for Mosaic."""
    f = jax.vmap(P.chacha_loop("fori", rounds=2))
    with jax.enable_x64(True):
        x = P._blocks(4096)
        res = _rewrite(f, x)
        (k,) = _kernels(res.jaxpr)
        (loop,) = [e for e in _walk.iter_eqns(C.closed(k.params["jaxpr"], ()))
                   if e.primitive.name == "scan"]
        assert not [v for v in (*loop.invars, *loop.outvars)
                    if np.dtype(C.aval_of(v).dtype).itemsize == 8]
        assert_bitwise_equal(jaxrewrite.optimize(f, **TPU)(x), jax.jit(f)(x))
        _, targets = _lowers_for_tpu(f, x)
    assert targets == ["tpu_custom_call"]


def test_a_64_bit_counter_read_as_a_word_is_narrowed_and_one_that_may_overflow_is_not():
    def rounds(s, start):
        return lax.fori_loop(start, start + 6, lambda i, s: (s[0] + s[1] ^ i.astype(np.uint32),
                                                             s[1] + s[0]), s)
    with jax.enable_x64(True):
        x = jnp.asarray(np.random.default_rng(6).integers(0, 2**32, (2, 4096), dtype=np.uint32))
        for start, kernels in ((3, 1), (2**31 - 4, 0)):
            f = lambda x: rounds((x[0], x[1]), start)  # noqa: E731, B023
            res = _rewrite(f, x)
            assert len(_kernels(res.jaxpr)) == kernels
            if not kernels:
                assert any(mosaic.dtype_reason(np.int64) in r for r in _no_kernel_reasons(
                    res.report))
            assert_bitwise_equal(jaxrewrite.optimize(f, **TPU)(x), jax.jit(f)(x))


@pytest.mark.parametrize("target", ["cpu", "gpu"])
def test_kernel_true_applies_on_any_target(target):
    f = jax.vmap(lambda x: P.chacha_words(x, rounds=2))
    x = P._blocks(4096)
    opts = dict(target=target, kernel=True, strict=True)
    assert_bitwise_equal(jaxrewrite.optimize(f, **opts)(x), jax.jit(f)(x))
    assert len(_kernels(jaxrewrite.make_jaxpr(f, **opts)(x))) == 1


def test_explain_shows_the_kernel():
    f = jax.vmap(P.chacha_loop("fori", rounds=2))
    e = jaxrewrite.explain(f, **TPU)(P._blocks(4096))
    ev, ff = [ev for ev in e.rewrites if ev.pass_name == "kernel"][::-1]
    assert ev.after == ("pallas_call",) and ev.before == ("scan",)
    # first the feed-forward add on the re-joined state, done on its pieces for the kernel
    assert ff.before == ("add",) and ff.after.count("add") == 16 and "stack" in ff.after
    (stats,) = e.report.stats["kernel"]
    assert (stats["rows"], stats["grid"], stats["trips"]) == (16, 2, [2])


def test_short_regions_left_to_xla_do_not_hide_a_long_one():
    """`"auto"`: twenty one-equation regions (each cut off by a division) stay XLA's; the long
    region after them is still found."""
    def f(x):
        a, b = x[0], x[1]
        for _ in range(20):
            a = (a + b) // np.uint32(3)
        for _ in range(40):
            a, b = a + b, (b ^ a) << np.uint32(3)
        return jnp.stack([a, b])
    x = jax.ShapeDtypeStruct((2, _cost.costs("tpu").kernel_min_elements), np.uint32)
    res = jaxrewrite.rewrite_jaxpr_with_report(jax.make_jaxpr(f)(x), target="tpu")
    (k,) = _kernels(res.jaxpr)
    assert _inside(k)["add"] == 40 and _outside(res.jaxpr)["add"] == 20
    assert res.report.counts["kernel.short_regions"] == 20
