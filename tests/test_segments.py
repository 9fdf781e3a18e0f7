"""Kernel cuts in a long split region on the GPU target (passes/_segments.py, issue 25).

XLA's GPU fusion keeps a split region one multi-output fusion up to a size and cuts a longer one
where many values cross; scalarize's GPU row puts optimization barriers at the narrowest points
instead. Checked here without a GPU: where the cuts go (jaxpr structure), that the values are
unchanged (bit for bit against `jax.jit`), and that the CPU is never cut. Kernel counts are in
tests/test_kernels_gpu.py (deviceless H200).
"""
import dataclasses
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxrewrite
from jaxrewrite import _compat as C
from jaxrewrite.backend import cost as _cost
from jaxrewrite.passes import _segments
from jaxrewrite.passes.scalarize import ELEMENTWISE
from jaxrewrite.testing import primitive_counts

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bench"))
import permutations as P  # noqa: E402

OPS_PER_ROUND = 10


def _rotl(x, n):
    return (x << np.uint32(n)) | (x >> np.uint32(32 - n))


def words(rounds):
    """Four separate words, `rounds` add-rotate-xor rounds (10 compute equations each), the
    state stacked at the end."""
    def f(x):                                   # x: (N, 4) uint32
        a, b, c, d = (x[:, i] for i in range(4))
        for _ in range(rounds):
            a = a + b
            d = _rotl(d ^ a, 16)
            c = c + d
            b = _rotl(b ^ c, 12)
            a, b, c, d = b, c, d, a
        return jnp.stack([a, b, c, d], axis=1)
    return f


def _x(n=256):
    return np.random.default_rng(0).integers(0, 2 ** 32, (n, 4), dtype=np.uint32)


def _compute_before(eqns, i):
    return sum(e.primitive.name in ELEMENTWISE for e in eqns[:i])


def test_cuts_at_round_boundaries_and_before_the_rejoin():
    cj = jax.make_jaxpr(words(12))(_x())
    eqns = cj.jaxpr.eqns
    cuts = _segments.cut_points(eqns, cj.jaxpr.outvars, 4 * OPS_PER_ROUND, ELEMENTWISE)
    live = _segments._live_counts(eqns, cj.jaxpr.outvars, ELEMENTWISE)
    # every 4 rounds, where only the 4 words are live; then before the stack
    assert [_compute_before(eqns, c) for c in cuts[:-1]] == [40, 80]
    assert [live[c] for c in cuts] == [4, 4, 4]
    assert eqns[cuts[-1]].primitive.name == "stack"
    assert _compute_before(eqns, cuts[-1]) == 12 * OPS_PER_ROUND


def test_barriers_hold_the_live_words_and_change_no_value():
    cj = jax.make_jaxpr(words(12))(_x())
    cuts = _segments.cut_points(cj.jaxpr.eqns, cj.jaxpr.outvars, 4 * OPS_PER_ROUND, ELEMENTWISE)
    new = _segments.insert_barriers(cj.jaxpr, cuts, ELEMENTWISE)
    assert len(cuts) == 3
    barriers = [e for e in new.eqns if e.primitive.name == "optimization_barrier"]
    assert [len(e.invars) for e in barriers] == [4, 4, 4]
    # the input's slices are read where they are used, never held by a barrier
    slices = {v for e in new.eqns if e.primitive.name in ("slice", "squeeze")
              for v in e.outvars}
    assert not any(a in slices for e in barriers for a in e.invars)
    C.check_jaxpr(new)
    x = _x()
    got = C.eval_jaxpr(C.closed(new, cj.consts), x)[0]
    np.testing.assert_array_equal(np.asarray(got), np.asarray(jax.jit(words(12))(x)))


def test_a_region_within_the_bound_is_not_cut():
    cj = jax.make_jaxpr(words(3))(_x())
    assert _segments.cut_points(cj.jaxpr.eqns, cj.jaxpr.outvars, 4 * OPS_PER_ROUND,
                                ELEMENTWISE) == []
    assert _segments.cut_points(cj.jaxpr.eqns, cj.jaxpr.outvars, 0, ELEMENTWISE) == []


@pytest.fixture
def short_gpu_segments(monkeypatch):
    """The GPU row with segments of 400 compute equations (2.5 ChaCha20 double rounds)."""
    monkeypatch.setitem(_cost.COSTS, "gpu", dataclasses.replace(_cost.COSTS["gpu"],
                                                                segment_eqns=400))


@pytest.fixture
def cuts_win(monkeypatch):
    """autotune's compile of both forms counting fewer launches for the cut one (that needs the
    deviceless GPU compiler: tests/test_kernels_gpu.py runs it for real)."""
    from jaxrewrite.backend import autotune as _autotune

    def choose(ctx, pass_name, original, build, model_go, model_why, key_extra=()):
        if pass_name != "scalarize.cuts":       # (the split itself: the cost model's verdict)
            return model_go, model_why, None
        return True, "autotune: fewer launches (simulated)", build()
    monkeypatch.setattr(_autotune, "choose", choose)


def _barrier_widths(cj):
    from jaxrewrite._walk import iter_eqns
    return [len(e.invars) for e in iter_eqns(cj) if e.primitive.name == "optimization_barrier"]


CHACHA8 = jax.vmap(lambda x: P.chacha_take(x, rounds=8))


def _blocks(n=512):
    return np.random.default_rng(1).integers(0, 2 ** 32, (n, 4, 4), dtype=np.uint32)


def test_split_chacha_cut_where_autotune_counts_fewer_launches_bit_for_bit(short_gpu_segments,
                                                                          cuts_win):
    x = _blocks()
    cj = jaxrewrite.make_jaxpr(CHACHA8, target="gpu", autotune=True)(x)
    widths = _barrier_widths(cj)
    # 8 double rounds of 160 compute equations: a cut every 2 (the 16 words live), and one
    # before the re-join
    assert len(widths) == 4 and all(w == 16 for w in widths), widths
    assert not primitive_counts(cj).get("gather")
    report = jaxrewrite.rewrite_jaxpr_with_report(jax.make_jaxpr(CHACHA8)(x), target="gpu",
                                                  autotune=True).report
    assert report.counts["scalarize.kernel_cuts"] == 4
    np.testing.assert_array_equal(
        np.asarray(jaxrewrite.optimize(CHACHA8, target="gpu", autotune=True)(x)),
        np.asarray(jax.jit(CHACHA8)(x)))


def test_cuts_not_measured_are_a_recorded_decline(short_gpu_segments):
    x = _blocks()
    res = jaxrewrite.rewrite_jaxpr_with_report(jax.make_jaxpr(CHACHA8)(x), target="gpu")
    assert _barrier_widths(res.jaxpr) == []
    assert not primitive_counts(res.jaxpr).get("gather")       # split all the same
    reasons = [d.reason for d in res.report.declines if d.pass_name == "scalarize"]
    assert any("4 kernel cut(s)" in r and "autotune=True" in r for r in reasons), reasons


def test_default_rows_cut_neither_chacha20_on_the_gpu_nor_anything_on_the_cpu(cuts_win):
    fn = jax.vmap(P.chacha_take)         # 10 double rounds: one segment (1,616 equations)
    x = np.zeros((4096, 4, 4), np.uint32)
    assert _barrier_widths(jaxrewrite.make_jaxpr(fn, target="gpu", autotune=True)(x)) == []
    long = jax.vmap(lambda x: P.chacha_take(x, rounds=20))
    assert _barrier_widths(jaxrewrite.make_jaxpr(long, target="gpu", autotune=True)(x)) == [16, 16]
    assert _barrier_widths(jaxrewrite.make_jaxpr(long, target="cpu", autotune=True)(x)) == []
