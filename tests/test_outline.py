"""Outlining repeated inline code into calls of one body (used by reroll)."""
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np

from jaxrewrite import _compat as C
from jaxrewrite import _walk
from jaxrewrite.passes import outline
from jaxrewrite.analysis.structural import Keyer
from jaxrewrite.testing import assert_bitwise_equal, primitive_counts

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bench"))
import permutations as P  # noqa: E402  (ChaCha20, as bench/permutations.py writes it)


def _layer(x, w):
    for _ in range(3):
        x = jnp.tanh(x @ w) + x * 0.5
    return x


def _stack(x, ws):
    for w in ws:
        x = _layer(x, w)
    return x.sum()


X = np.linspace(-1, 1, 32, dtype=np.float32).reshape(4, 8)
WS = [np.eye(8, dtype=np.float32) * (i + 1) / 4 for i in range(6)]


def _eval(j, consts, *args):
    return jax.jit(lambda *a: jax.core.eval_jaxpr(j, consts, *a)[0])(*args)


def test_a_run_of_inline_layers_becomes_calls_of_one_body():
    cj = jax.make_jaxpr(_stack)(X, WS)
    j, bodies = outline.outline_level(cj.jaxpr, Keyer(), 3)
    calls = [e for e in j.eqns if C.is_jit(e)]
    assert len(calls) == 6 and len(bodies) == 1                # one call per layer
    assert len({id(e.params["jaxpr"]) for e in calls}) == 1    # one shared body object
    assert primitive_counts(calls[0].params["jaxpr"]) == {"dot_general": 3, "tanh": 3,
                                                           "mul": 3, "add": 3}
    C.check_jaxpr(j)
    assert_bitwise_equal(_eval(j, cj.consts, X, *WS), jax.jit(_stack)(X, WS))


def test_calls_not_rolled_are_inlined_back():
    cj = jax.make_jaxpr(_stack)(X, WS)
    j, bodies = outline.outline_level(cj.jaxpr, Keyer(), 3)
    back = outline.inline_outlined(j, bodies)
    assert [e.primitive for e in back.eqns] == [e.primitive for e in cj.jaxpr.eqns]
    C.check_jaxpr(back)
    assert_bitwise_equal(_eval(back, cj.consts, X, *WS), jax.jit(_stack)(X, WS))


def test_segments_that_differ_are_not_a_run():
    def f(x, ws):
        for act, w in zip((jnp.sin, jnp.tanh, jnp.cos, jnp.exp), ws):  # every layer differs
            for _ in range(3):
                x = act(x @ w) + x * 0.5
        return x

    j, bodies = outline.outline_level(jax.make_jaxpr(f)(X, WS[:4]).jaxpr, Keyer(), 3)
    assert not bodies and not any(C.is_jit(e) for e in j.eqns)


def test_segments_that_differ_in_a_scalar_literal_are_calls_of_their_own_bodies():
    """Layers that differ only in a scalar constant (a round constant, a per-layer scale):
    outlined as calls of one skeleton, each with its own body holding its literal (reroll lifts
    the literals into the scan's xs); bit for bit as they were."""
    scales = (0.5, 0.25, 0.125, 2.0, 4.0, 8.0)

    def f(x, ws):
        for s, w in zip(scales, ws):
            for _ in range(3):
                x = jnp.tanh(x @ w) + x * s
        return x

    cj = jax.make_jaxpr(f)(X, WS)
    j, bodies = outline.outline_level(cj.jaxpr, Keyer(), 3)
    calls = [e for e in j.eqns if C.is_jit(e)]
    assert len(calls) == 6 and len(bodies) == 6          # one body per layer: its own literal
    literals = [[float(C.literal_value(a)) for e in c.params["jaxpr"].jaxpr.eqns
                 for a in e.invars if C.is_literal(a)] for c in calls]
    assert [set(v) for v in literals] == [{s} for s in scales]
    C.check_jaxpr(j)
    assert_bitwise_equal(_eval(j, cj.consts, X, *WS), jax.jit(f)(X, WS))


def test_effects_are_never_outlined():
    def f(x, ws):
        for w in ws:
            x = _layer(x, w)
            jax.debug.print("{}", x.sum(), ordered=True)
        return x

    cj = jax.make_jaxpr(f)(X, WS)
    j, bodies = outline.outline_level(cj.jaxpr, Keyer(), 3)
    # the layers between the prints may be outlined, never a print
    assert all(not e.effects for e in j.eqns if C.is_jit(e))
    assert sum(1 for e in j.eqns if e.effects) == len(WS)


def test_too_short_a_run_is_left_alone():
    def f(x, ws):  # 2 layers of 2 blocks: 16 equations, fewer than 3 segments of 8
        for w in ws:
            for _ in range(2):
                x = jnp.tanh(x @ w) + x * 0.5
        return x

    cj = jax.make_jaxpr(f)(X, WS[:2])
    j, bodies = outline.outline_level(cj.jaxpr, Keyer(), 3)
    assert not bodies and j is cj.jaxpr


# --- through reroll ---------------------------------------------------------------------------------

RTOL = 1e-5  # reroll's stated tolerance for float32 (a loop may fuse differently)


def _close(a, b):
    for u, v in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)):
        np.testing.assert_allclose(u, v, rtol=RTOL, atol=RTOL)


def _top(cj, name):
    return sum(1 for e in cj.jaxpr.eqns if e.primitive.name == name)


def test_inline_jit_loop_is_outlined_and_rolled():
    """The seed's `jax.jit(body, inline=True)` in a loop: no call is left to roll but the
    inlined code repeats; reroll=True outlines it and rolls it into one scan."""
    import jaxrewrite

    def body(s):
        for _ in range(8):
            s = jnp.sin(s) * 1.5 + s
        return s

    def f(x):
        for _ in range(10):
            x = jax.jit(body, inline=True)(x)
        return x

    x = np.linspace(-2, 2, 4, dtype=np.float32)
    res = jaxrewrite.rewrite_jaxpr_with_report(jax.make_jaxpr(f)(x), reroll=True)
    # (a body without contraction is rolled forward only: its scan sits in a custom_jvp)
    assert _top(res.jaxpr, "custom_jvp_call") == 1
    assert res.report.counts["reroll.outlined_runs_rolled"] == 1
    assert primitive_counts(res.jaxpr)["sin"] < 80
    _close(jaxrewrite.optimize(f, reroll=True)(x), jax.jit(f)(x))
    plain = jaxrewrite.rewrite_jaxpr(jax.make_jaxpr(f)(x))  # reroll off: nothing outlined
    assert _top(plain, "scan") == 0 and not any(C.is_jit(e) for e in plain.jaxpr.eqns)


def test_forward_chain_of_a_differentiated_checkpoint_stack_is_rolled():
    """`optimize(jax.grad(f), reroll=True)`: JAX inlines the checkpointed layers' forward pass;
    it is outlined and rolled beside the backward chain of remat calls."""
    import jaxrewrite

    def layer(w, x):
        return jnp.tanh(x @ w) + jnp.sin(x) * 0.5

    def stack(ws, x):
        for w in ws:
            x = jax.checkpoint(layer)(w, x)
        return (x * x).sum()

    # 8 layers: the backward chain has 4+ trips (`backend.cost.REROLL_MIN_TRIPS`)
    ws = [np.eye(4, dtype=np.float32) * (0.5 + 0.05 * i) for i in range(8)]
    x = np.linspace(-1, 1, 8, dtype=np.float32).reshape(2, 4)
    g = jax.grad(stack)
    res = jaxrewrite.rewrite_jaxpr_with_report(jax.make_jaxpr(g)(ws, x), reroll=True)
    assert res.report.counts["reroll.outlined_runs_rolled"] == 1
    assert res.report.counts["reroll.chains"] == 2          # forward and backward
    _close(jaxrewrite.optimize(g, reroll=True)(ws, x), jax.jit(g)(ws, x))


# --- property: random repeated segments ------------------------------------------------------------

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

_UNARY = {
    "sin": jnp.sin, "tanh": jnp.tanh, "neg": jnp.negative, "half": lambda v: v * 0.5,
    "inc": lambda v: v + 1.0, "sq": lambda v: jnp.tanh(v * v), "rev": lambda v: v[::-1],
}


@settings(max_examples=15, deadline=None, derandomize=True, database=None)
@given(ops=st.lists(st.sampled_from(sorted(_UNARY)), min_size=8, max_size=12),
       k=st.integers(3, 5), weights=st.sampled_from(["none", "shared", "per-layer"]))
def test_random_repeated_segments_roll_within_tolerance(ops, k, weights):
    import jaxrewrite

    def f(x, ws):
        for i in range(k):
            for name in ops:
                x = _UNARY[name](x)
            if weights == "shared":
                x = x + ws[0]
            elif weights == "per-layer":
                x = x + ws[i]
        return x

    x = np.linspace(-1, 1, 8, dtype=np.float32)
    ws = [np.full(8, 0.1 * (i + 1), np.float32) for i in range(k)]
    res = jaxrewrite.rewrite_jaxpr_with_report(jax.make_jaxpr(f)(x, ws), reroll=True)
    C.check_jaxpr(res.jaxpr)
    if "rev" not in ops:  # (rev pairs cancel, across segment boundaries too: equivalence only)
        assert res.report.counts["reroll.outlined_runs_rolled"] >= 1
    _close(jaxrewrite.optimize(f, reroll=True)(x, ws), jax.jit(f)(x, ws))
    _close(jax.grad(lambda *a: jaxrewrite.optimize(f, reroll=True)(*a).sum())(x, ws),
           jax.grad(lambda *a: jax.jit(f)(*a).sum())(x, ws))


def test_split_chacha_double_rounds_roll():
    """After scalarize makes the 16 words separate arrays, one quarter round repeats 32 times
    and one round 8 times, but only the double round carries its state alike from copy to copy
    (columns and diagonals wire the words differently): outline must pick it, and reroll rolls
    the 4 double rounds into one scan of 4 trips, bit for bit."""
    import jaxrewrite

    x = np.random.default_rng(0).integers(0, 2 ** 32, (64, 4, 4), dtype=np.uint32)
    f = jax.vmap(lambda s: P.chacha_take(s, rounds=4))  # 4 double rounds, diagonals by take
    res = jaxrewrite.rewrite_jaxpr_with_report(jax.make_jaxpr(f)(x), reroll=True, target="gpu")
    assert res.report.counts["scalarize.applied"] >= 1
    assert res.report.stats["reroll.lengths"] == [4]
    scans = [e for e in res.jaxpr.jaxpr.eqns if e.primitive.name == "scan"]
    assert len(scans) == 1 and scans[0].params["length"] == 4
    assert_bitwise_equal(jaxrewrite.optimize(f, reroll=True, target="gpu")(x), jax.jit(f)(x))


# --- one layer per trip, every layer, no nesting -----------------------------------------------------

def _block(x, w, b):
    h = jnp.tanh(x @ w + b) * 0.5 + x
    return h - jnp.mean(h, -1, keepdims=True)


def test_a_loop_of_identical_layers_is_one_scan_of_one_layer_per_trip():
    """A forward loop of L identical inline layers rolls into one scan of L trips whose body is
    one layer, for every L: the L outlined calls are never outlined again in groups of 8 (which
    gave a scan of 3 trips of 8 layers at L = 24, 4 x 8 at 32)."""
    import jaxrewrite

    def f(x, ws, bs):
        for w, b in zip(ws, bs):
            x = _block(x, w, b)
        return x

    x = np.linspace(-1, 1, 32, dtype=np.float32).reshape(4, 8)
    for L in (8, 16, 24, 32, 64, 128):
        ws = [np.eye(8, dtype=np.float32) * (0.9 + 0.001 * i) for i in range(L)]
        bs = [np.full(8, 0.01 * i, np.float32) for i in range(L)]
        cj = jax.make_jaxpr(f)(x, ws, bs)
        res = jaxrewrite.rewrite_jaxpr_with_report(cj, reroll=True)
        assert res.report.stats["reroll.lengths"] == [L], L
        scans = [e for e in _walk.iter_eqns(res.jaxpr) if e.primitive.name == "scan"]
        assert [s.params["length"] for s in scans] == [L], L
        # the trip is one layer: as many equations of each kind as one layer has
        per_layer = primitive_counts(jax.make_jaxpr(_block)(x, ws[0], bs[0]))
        inner = primitive_counts(scans[0].params["jaxpr"])
        assert all(inner.get(p, 0) == n for p, n in per_layer.items()), (L, inner)
        if L == 8:
            _close(jaxrewrite.optimize(f, reroll=True)(x, ws, bs), jax.jit(f)(x, ws, bs))


def test_training_step_rolls_one_layer_per_trip_every_layer():
    """A training step: forward, backward and an adam-like update per parameter leaf. The
    update's short blocks align more equations over the level than the layers do, so periods
    are ranked by their longest periodic stretch (a layer); the mask every layer builds from
    constants is left by cse in the first layer only and is hoisted, so every layer rolls,
    forward and backward."""
    import jaxrewrite

    L = 6

    def layer(x, p):
        mask = jnp.tril(jnp.ones((8, 8), bool))
        a = jnp.where(mask, x @ x.T, -1e9)
        h = jax.nn.softmax(a, axis=-1) @ x
        return x + jnp.tanh(h @ p["w"] + p["b"]) * 0.5

    def loss(params, x):
        x = x @ params[0]["w"]  # (an embedding: the first layer's input is differentiated too)
        for p in params:
            x = layer(x, p)
        return (x * x).mean()

    def step(params, m, v, x):
        g = jax.grad(loss)(params, x)
        leaves, tree = jax.tree_util.tree_flatten(params)
        out = []
        for p, gi, mi, vi in zip(leaves, jax.tree_util.tree_leaves(g),
                                 jax.tree_util.tree_leaves(m), jax.tree_util.tree_leaves(v)):
            mi = 0.9 * mi + 0.1 * gi
            vi = 0.999 * vi + 0.001 * gi * gi
            out.append(p - 1e-3 * mi / (jnp.sqrt(vi) + 1e-8))
        return jax.tree_util.tree_unflatten(tree, out)

    rng = np.random.default_rng(0)
    params = [{"w": rng.normal(0, 0.3, (8, 8)).astype(np.float32),
               "b": rng.normal(0, 0.1, (8,)).astype(np.float32)} for _ in range(L)]
    zeros = jax.tree_util.tree_map(np.zeros_like, params)
    x = rng.normal(0, 1, (8, 8)).astype(np.float32)
    res = jaxrewrite.rewrite_jaxpr_with_report(jax.make_jaxpr(step)(params, zeros, zeros, x),
                                               reroll=True)
    assert sorted(res.report.stats["reroll.lengths"]) == [L, L]   # forward and backward
    _close(jaxrewrite.optimize(step, reroll=True)(params, zeros, zeros, x),
           jax.jit(step)(params, zeros, zeros, x))
