"""JAX's Threefry draws opened into their rounds and made one Pallas kernel (passes/threefry.py).

Without a TPU (CI): the kernels run in Pallas's interpreter (`backend.mosaic.interpret()`), bit
for bit against `jax.jit` for many keys and shapes; structure (one `pallas_call`, no
`random_bits`/`threefry2x32` left, the uniform's shift and or inside the kernel); declines with
their reasons; and the emitted kernel lowered to Mosaic for the TPU on this host
(`jax.export` with `platforms=["tpu"]`). On a TPU the same tests run the kernels with Mosaic.
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import jaxrewrite
from jaxrewrite import _compat as C
from jaxrewrite import _walk
from jaxrewrite.backend import cost as _cost
from jaxrewrite.backend import mosaic
from jaxrewrite.testing import (assert_bitwise_equal, assert_equivalent, primitive_counts,
                                tpu_custom_calls)

TPU = dict(target="tpu", kernel=True, strict=True)
_FEW = settings(max_examples=6, deadline=None, derandomize=True, database=None)

# (8, 128) tiles: 1, 2, 8 and 16 of them, in shapes of 1 to 3 axes
SHAPES = [(1024,), (8, 128), (2, 1024), (4, 8, 256), (16384,)]

DRAWS = {
    "bits": lambda k, s: jax.random.bits(k, s),
    "uniform": lambda k, s: jax.random.uniform(k, s, minval=-2.0, maxval=3.0),
    "bernoulli": lambda k, s: jax.random.bernoulli(k, 0.3, s),
    "normal": lambda k, s: jax.random.normal(k, s),
    "split": lambda k, s: jax.random.key_data(jax.random.split(k, s)),
    "dropout": lambda k, s: jnp.where(jax.random.bernoulli(k, 0.9, s), 1 / 0.9, 0.0).astype(
        jnp.bfloat16),
}


def _key(words):
    return jax.random.wrap_key_data(np.asarray(words, np.uint32), impl="threefry2x32")


def _rewrite(fn, *args, **opts):
    return jaxrewrite.rewrite_jaxpr_with_report(jax.make_jaxpr(fn)(*args), **{**TPU, **opts})


def _kernels(cj) -> list:
    return [e for e in _walk.iter_eqns(cj) if e.primitive.name == "pallas_call"]


def _reasons(report, pass_name="threefry"):
    return [e.reason for e in report.declines if e.pass_name == pass_name]


# --- bit for bit --------------------------------------------------------------------------------

@_FEW
@given(draw=st.sampled_from(sorted(DRAWS)), shape=st.sampled_from(SHAPES),
       keys=st.lists(st.tuples(st.integers(0, 2**32 - 1), st.integers(0, 2**32 - 1)),
                     min_size=3, max_size=3))
def test_draws_are_bit_for_bit_jax_jit_for_many_keys_and_shapes(draw, shape, keys):
    f = lambda k: DRAWS[draw](k, shape)  # noqa: E731
    opt, ref = jaxrewrite.optimize(f, **TPU), jax.jit(f)
    for words in keys:
        k = _key(words)
        assert_bitwise_equal(opt(k), ref(k))


@pytest.mark.parametrize("dtype", [jnp.uint8, jnp.uint16])
def test_narrow_bits_are_jax_s_own_epilogue_after_the_kernel(dtype):
    f = lambda k: jax.random.bits(k, (4, 1024), dtype)  # noqa: E731
    k = jax.random.key(11)
    assert_bitwise_equal(jaxrewrite.optimize(f, **TPU)(k), jax.jit(f)(k))
    assert len(_kernels(_rewrite(f, k).jaxpr)) == 1


def test_64_bit_draws_under_x64():
    with jax.enable_x64(True), mosaic.emit_for("interpreter"):  # (x64: no Mosaic kernels)
        f = lambda k: jax.random.bits(k, (2, 1024), jnp.uint64)  # noqa: E731
        k = jax.random.key(12)
        assert_bitwise_equal(jaxrewrite.optimize(f, **TPU)(k), jax.jit(f)(k))
        assert len(_kernels(_rewrite(f, k).jaxpr)) == 1


def test_draws_with_x64_on_are_one_kernel_that_lowers_for_mosaic():
    """`jax_enable_x64` (the kernel's block indices are int32): the draw is opened, one
    kernel, bit for bit, and it lowers for the TPU here."""
    f = lambda k: jax.random.bits(k, (2, 1024))  # noqa: E731
    with jax.enable_x64(True):
        k = jax.random.key(0)
        assert_bitwise_equal(jaxrewrite.optimize(f, **TPU)(k), jax.jit(f)(k))
        with mosaic.emit_for("tpu"):
            res = _rewrite(f, k)
            assert len(_kernels(res.jaxpr)) == 1 and "random_bits" not in primitive_counts(
                res.jaxpr)
            assert tpu_custom_calls(res.jaxpr, k) == ["tpu_custom_call"]


@pytest.mark.parametrize("draw", sorted(DRAWS))
def test_each_draw_is_one_kernel_with_nothing_of_threefry_left(draw):
    k = jax.random.key(2026)
    f = lambda k: DRAWS[draw](k, (4, 2048))  # noqa: E731
    assert_bitwise_equal(jaxrewrite.optimize(f, **TPU)(k), jax.jit(f)(k))
    res = _rewrite(f, k)
    (kern,) = _kernels(res.jaxpr)
    counts = primitive_counts(res.jaxpr)
    for gone in ("random_bits", "random_split", "threefry2x32", "iota_2x32_shape"):
        assert gone not in counts
    (stats,) = res.report.stats["threefry"]
    assert stats["elements"] == 8192 and stats["shape"] == (4, 2048)
    # nothing read but the key: its two words and the third key word, scalars in SMEM
    (kstats,) = res.report.stats["kernel"]
    assert (kstats["pieces_in"], kstats["scalars_in"]) == (0, 3)
    assert kstats["pieces_out"] == (2 if draw == "split" else 1)
    inside = primitive_counts(C.closed(kern.params["jaxpr"], ()))
    assert inside["program_id"] == 1          # the counters: an iota of the grid step
    if draw in ("uniform", "bernoulli", "normal", "dropout"):
        # uniform's integer epilogue (>> 9, | 0x3F800000) runs in the kernel, its float one after
        assert stats["epilogue"] == ["shift_right_logical", "or"]
        assert inside["or"] == 21 and inside["shift_right_logical"] == 21
    assert not [r for r in _reasons(res.report)]


def test_a_draw_s_kernel_takes_the_generator_rows_of_the_cost_row():
    """A kernel that reads no piece only writes: its grid steps are `kernel_generator_rows`
    rows (at most the piece's own), not the `kernel_tile_rows` of kernels that read pieces
    (structure only: nothing runs)."""
    gen = _cost.costs("tpu").kernel_generator_rows
    assert gen > _cost.costs("tpu").kernel_tile_rows
    for n, rows in ((1 << 20, gen), (8192, 64), (1024, 8)):
        res = _rewrite(lambda k: jax.random.bits(k, (n,)), jax.random.key(0))
        (stats,) = res.report.stats["kernel"]
        assert (stats["rows"], stats["grid"]) == (rows, n // 128 // rows)
    with _cost.override_row("tpu", kernel_generator_rows=0):
        res = _rewrite(lambda k: jax.random.bits(k, (1 << 20,)), jax.random.key(0))
    assert res.report.stats["kernel"][0]["rows"] == _cost.costs("tpu").kernel_tile_rows


@pytest.mark.parametrize("sampler", [
    lambda k: jax.random.uniform(k, (4, 1024), jnp.bfloat16),        # 16-bit draws
    lambda k: jax.random.randint(k, (4, 1024), -7, 1000),            # two draws
    lambda k: jax.random.truncated_normal(k, -2.0, 2.0, (8, 128)),
    lambda k: jax.random.permutation(k, 4096),
])
def test_other_samplers_are_bit_for_bit(sampler):
    k = jax.random.key(21)
    assert_bitwise_equal(jaxrewrite.optimize(sampler, **TPU)(k), jax.jit(sampler)(k))
    cj = jaxrewrite.make_jaxpr(sampler, **TPU)(k)
    assert _kernels(cj) and "random_bits" not in primitive_counts(cj)


def test_the_bits_are_the_cpu_s_bits_for_the_same_key():
    """The rounds are JAX's own: the draw equals JAX's on the CPU (its rolled-loop lowering)."""
    k = jax.random.key(123)
    f = lambda k: jax.random.bits(k, (2, 4096))  # noqa: E731
    out = np.asarray(jaxrewrite.optimize(f, **TPU)(k))
    with jax.default_device(jax.devices("cpu")[0]):
        want = np.asarray(jax.jit(f)(jax.random.key(123)))
    np.testing.assert_array_equal(out, want)


@pytest.mark.parametrize("draw", ["bits", "dropout"])
def test_equivalent_under_vmap_over_keys_and_checked(draw):
    f = lambda k: DRAWS[draw](k, (8, 128))  # noqa: E731
    cj = assert_equivalent(f, jax.random.key(6), bitwise=True, debug_checks=True, **TPU)
    assert len(_kernels(cj)) == 1


def test_a_training_step_with_dropout():
    """The mask's kernel inside a gradient step: the draw is the same, the step's floats within
    the contract (they are XLA's, fused around the kernel)."""
    def loss(w, x, k):
        h = jnp.tanh(x @ w)
        keep = jax.random.bernoulli(k, 0.9, h.shape)
        return jnp.mean(jnp.where(keep, h / 0.9, 0.0) ** 2)

    def step(w, x, k):
        return w - 0.1 * jax.grad(loss)(w, x, k)
    rng = np.random.default_rng(0)
    w = jnp.asarray(rng.standard_normal((128, 256)), jnp.float32) * 0.1
    x = jnp.asarray(rng.standard_normal((32, 128)), jnp.float32)
    cj = assert_equivalent(step, w, x, jax.random.key(4), grad=False, vmap=False, **TPU)
    assert len(_kernels(cj)) == 1 and "random_bits" not in primitive_counts(cj)


def test_the_rewrite_is_idempotent_and_the_same_under_jit():
    f = lambda k: jax.random.uniform(k, (8, 1024))  # noqa: E731
    k = jax.random.key(5)
    cj = jaxrewrite.make_jaxpr(f, **TPU)(k)
    again = jaxrewrite.rewrite_jaxpr(cj, **TPU)
    assert len(_kernels(again)) == len(_kernels(cj)) == 1
    assert_bitwise_equal(jax.jit(lambda k: jaxrewrite.optimize(f, **TPU)(k))(k), jax.jit(f)(k))


# --- declines -----------------------------------------------------------------------------------

def test_small_key_derivations_are_left_alone_and_the_draw_after_them_opened():
    """fold_in (one pair of counters) and split(key) (two keys) are counted, not declined."""
    def f(k):
        return jax.random.bits(jax.random.fold_in(jax.random.split(k)[1], 7), (1024,))
    k = jax.random.key(9)
    assert_bitwise_equal(jaxrewrite.optimize(f, **TPU)(k), jax.jit(f)(k))
    res = _rewrite(f, k)
    assert len(_kernels(res.jaxpr)) == 1
    counts = primitive_counts(res.jaxpr)
    assert counts["random_fold_in"] == counts["random_split"] == 1
    assert res.report.counts["threefry.small_key_derivations"] == 2
    assert not _reasons(res.report)


def test_vmapped_keys_are_declined():
    f = lambda k: jax.vmap(lambda kk: jax.random.bits(kk, (1024,)))(  # noqa: E731
        jax.random.split(k, 8))
    k = jax.random.key(1)
    assert_bitwise_equal(jaxrewrite.optimize(f, **TPU)(k), jax.jit(f)(k))
    res = _rewrite(f, k)
    assert not _kernels(res.jaxpr) and primitive_counts(res.jaxpr)["random_bits"] == 1
    reasons = _reasons(res.report)
    assert len(reasons) == 1 and "a key array of shape (8,)" in reasons[0]


@pytest.mark.parametrize("shape", [(1000,), (3, 100), (8, 100)])
def test_shapes_that_do_not_tile_are_declined(shape):
    f = lambda k: jax.random.bits(k, shape)  # noqa: E731
    k = jax.random.key(3)
    res = _rewrite(f, k)
    assert not _kernels(res.jaxpr) and primitive_counts(res.jaxpr)["random_bits"] == 1
    (why,) = _reasons(res.report)
    assert mosaic.tile_reason(int(np.prod(shape)), 16) in why
    assert_bitwise_equal(jaxrewrite.optimize(f, **TPU)(k), jax.jit(f)(k))


def test_other_generators_are_declined():
    f = lambda k: jax.random.bits(k, (8, 128))  # noqa: E731
    for impl in ("rbg", "unsafe_rbg"):
        res = _rewrite(f, jax.random.key(0, impl=impl))
        assert not _kernels(res.jaxpr)
        (why,) = _reasons(res.report)
        assert "not Threefry" in why


def test_without_partitionable_counters_the_draw_is_declined():
    f = lambda k: jax.random.bits(k, (8, 128))  # noqa: E731
    k = jax.random.key(4)
    with jax.threefry_partitionable(False):
        res = _rewrite(f, k)
        assert not _kernels(res.jaxpr)
        (why,) = _reasons(res.report)
        assert "jax_threefry_partitionable is off" in why
        assert_bitwise_equal(jaxrewrite.optimize(f, **TPU)(k), jax.jit(f)(k))


def test_auto_opens_no_draw_by_default_and_a_row_s_minimum_decides():
    """`kernel="auto"`: the TPU row opens no draw (measured: no faster than XLA's fusion), with
    the reason; a row with a minimum opens large draws on the TPU only (structure only)."""
    big = jax.make_jaxpr(lambda k: jax.random.bits(k, (256, 1024)))(jax.random.key(0))
    res = jaxrewrite.rewrite_jaxpr_with_report(big, target="tpu")
    assert not _kernels(res.jaxpr) and primitive_counts(res.jaxpr)["random_bits"] == 1
    (why,) = _reasons(res.report)
    assert "not by default" in why
    with _cost.override_row("tpu", threefry_min_elements=262_144):
        assert len(_kernels(jaxrewrite.rewrite_jaxpr(big, target="tpu"))) == 1
        for target in ("cpu", "gpu"):
            assert not _kernels(jaxrewrite.rewrite_jaxpr(big, target=target))
        small = jax.make_jaxpr(lambda k: jax.random.bits(k, (8, 1024)))(jax.random.key(0))
        res = jaxrewrite.rewrite_jaxpr_with_report(small, target="tpu")
        assert not _kernels(res.jaxpr)
        (why,) = _reasons(res.report)
        assert "threefry_min_elements" in why
    # below the kernel's own minimum, whatever this row says: the draw is kept, not opened
    with _cost.override_row("tpu", threefry_min_elements=1024):
        res = jaxrewrite.rewrite_jaxpr_with_report(small, target="tpu")
    assert primitive_counts(res.jaxpr)["random_bits"] == 1
    (why,) = _reasons(res.report)
    assert "kernel_min_elements" in why


def test_the_switch_opens_draws_in_jax_jit():
    f = lambda k: jax.random.normal(k, (4, 1024))  # noqa: E731
    k = jax.random.key(3)
    ref = jax.jit(f)(k)
    with jaxrewrite.enabled(**TPU):
        out = jax.jit(lambda k: f(k))(k)
    assert_bitwise_equal(out, ref)
    assert jaxrewrite.last_report().counts["threefry.applied"] == 1


def test_no_draws_opened_without_kernels():
    f = lambda k: jax.random.bits(k, (8, 1024))  # noqa: E731
    cj = jax.make_jaxpr(f)(jax.random.key(0))
    for opts in (dict(target="tpu", kernel=False), dict(target="cpu")):
        res = jaxrewrite.rewrite_jaxpr_with_report(cj, **opts)
        assert primitive_counts(res.jaxpr)["random_bits"] == 1
        assert "threefry" not in res.report.stats


def test_a_draw_in_a_loop_body_is_declined():
    def f(k):
        return jax.lax.fori_loop(0, 2, lambda i, a: a ^ jax.random.bits(
            jax.random.fold_in(k, i), (1024,)), jnp.zeros(1024, jnp.uint32))
    k = jax.random.key(8)
    res = _rewrite(f, k)
    assert primitive_counts(res.jaxpr)["random_bits"] == 1 and "threefry" not in res.report.stats
    assert any("in a 'scan' body stays XLA's" in r for r in _reasons(res.report))
    assert_bitwise_equal(jaxrewrite.optimize(f, **TPU)(k), jax.jit(f)(k))


# --- explain, and the kernel lowered for the TPU -------------------------------------------------

def test_explain_shows_the_threefry_kernel():
    e = jaxrewrite.explain(lambda k: jax.random.bits(k, (8, 1024)), **TPU)(jax.random.key(0))
    (fry,) = [ev for ev in e.rewrites if ev.pass_name == "threefry"]
    assert fry.before == ("random_bits",) and "20 rounds" in fry.reason
    (kern,) = [ev for ev in e.rewrites if ev.pass_name == "kernel"]
    assert kern.after == ("pallas_call",)
    assert "3 scalar(s) in SMEM" in kern.reason


@pytest.mark.parametrize("draw", ["bits", "uniform", "split"])
def test_the_kernel_lowers_for_the_tpu(draw):
    """Emitted for Mosaic, exported for the TPU on this host: Pallas's TPU lowering runs."""
    k = jax.random.key(0)
    f = lambda k: DRAWS[draw](k, (8, 2048))  # noqa: E731
    with mosaic.emit_for("tpu"):
        cj = jaxrewrite.make_jaxpr(f, **TPU)(k)
    (kern,) = _kernels(cj)
    assert not kern.params["interpret"]
    assert tpu_custom_calls(cj, k) == ["tpu_custom_call"]
    assert "threefry2x32" not in primitive_counts(cj)
