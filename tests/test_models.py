"""`optimize(step, reroll=True)` on training steps written with real libraries (bench/models.py).

Skipped where the `models` extra (Flax, Haiku, Equinox, optax) is not installed.

Tolerance, in terms of training: over 100 adam steps on one batch, every step's loss with
reroll=True is within `LOSS_RTOL` (relative) of jax.jit's (measured, 4 layers, the backward
recomputing on the CPU: at most 4.6e-5 Haiku; 3.0e-6 Flax; 1.0e-6 Equinox). The scan sums in the
same order as the unrolled program, but XLA fuses a loop body differently, so float results differ
in the last bits and adam, which divides by the square root of small second moments, amplifies
that over the steps.
"""
import os
import sys

import jax
import numpy as np
import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bench"))
import models as M  # noqa: E402

import jaxrewrite  # noqa: E402

LOSS_RTOL = 1e-3          # every step of a 100-step loss curve, relative to jax.jit's
LOSS_RTOL_1 = 1e-5        # the loss of one step
GRAD_RTOL = 1e-4          # gradients (adam's moments) of one step, relative to their largest
LAYERS = 4


def _needs(model):
    absent = M.missing(model)
    if absent:
        pytest.skip(f"needs {absent} (the `models` extra)")


@pytest.mark.parametrize("model", M.MODELS)
def test_every_layer_rolls_one_per_trip_and_one_step_matches(model):
    _needs(model)
    step, args = M.build(model, LAYERS)
    res = jaxrewrite.rewrite_jaxpr_with_report(jax.make_jaxpr(step)(*args), reroll=True,
                                               target="cpu")
    # forward and backward: one scan each, one layer per trip, every layer
    assert sorted(res.report.stats["reroll.lengths"]) == [LAYERS, LAYERS]
    # on the CPU the backward loop recomputes the forward's residuals (passes/recompute.py);
    # remat blocks already do, and are left as they are
    assert res.report.counts["reroll.recomputed"] == (0 if model == "linen_remat" else 1)
    loss_j, p_j, o_j = jax.jit(step)(*args)
    loss_o, p_o, o_o = jaxrewrite.optimize(step, reroll=True)(*args)
    np.testing.assert_allclose(loss_o, loss_j, rtol=LOSS_RTOL_1)
    # adam's moments are the gradients (first) and their squares (second), scaled: within
    # GRAD_RTOL of the largest over all leaves (some leaves' gradients are zero up to rounding:
    # attention key biases, which softmax ignores). The parameters are compared only within
    # one step: adam's first step moves each by lr * g / (|g| + eps), so such a gradient that
    # rounds differently moves its parameter by a different fraction of lr.
    flat = [np.concatenate([np.ravel(np.asarray(x, np.float64)) for x in
                            jax.tree_util.tree_leaves(o)]) for o in (o_o, o_j)]
    np.testing.assert_allclose(flat[0], flat[1], rtol=0,
                               atol=GRAD_RTOL * float(np.max(np.abs(flat[1]))))
    for a, b in zip(jax.tree_util.tree_leaves(p_o), jax.tree_util.tree_leaves(p_j)):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-3)      # within one step (lr)


@pytest.mark.slow
@pytest.mark.parametrize("model", M.MODELS)
def test_100_step_loss_curve_tracks_jax_jit(model):
    _needs(model)
    ref, opt = M.loss_curves(model, LAYERS, steps=100)
    assert ref[-1] < ref[0] / 10                       # it trains
    np.testing.assert_allclose(opt, ref, rtol=LOSS_RTOL)


# --- with the libraries' own ways of jitting ---------------------------------------------------------

def test_equinox_partitioned_model():
    """Where users write `eqx.filter_jit(step)`: partition the model into arrays and the rest,
    and optimize a function of the arrays (the rest is closed over, static)."""
    _needs("equinox")
    import equinox as eqx

    model = eqx.nn.MLP(8, 8, 16, 3, key=jax.random.key(0))
    params, static = eqx.partition(model, eqx.is_array)
    x = np.linspace(-1, 1, 8, dtype=np.float32)

    def f(p, x):
        return eqx.combine(p, static)(x)
    np.testing.assert_allclose(jaxrewrite.optimize(f)(params, x), eqx.filter_jit(model)(x),
                               rtol=1e-6)


def test_nnx_split_merge():
    """Where users write `nnx.jit(step)`: split the module into its graph and state, and
    optimize a function of the state (the graph is closed over)."""
    _needs("nnx")
    from flax import nnx

    model = nnx.Linear(8, 8, rngs=nnx.Rngs(0))
    graphdef, state = nnx.split(model)
    x = np.ones((2, 8), np.float32)

    def f(state, x):
        return nnx.merge(graphdef, state)(x)
    np.testing.assert_allclose(jaxrewrite.optimize(f)(state, x), nnx.jit(lambda m, x: m(x))(model, x),
                               rtol=1e-6)


def test_haiku_transformed_apply():
    """A Haiku transformed function's `apply` is a plain function of (params, rng, inputs)."""
    _needs("haiku")
    import haiku as hk

    net = hk.transform(lambda x: hk.nets.MLP([16, 8])(x))
    x = np.ones((2, 8), np.float32)
    params = net.init(jax.random.key(0), x)
    np.testing.assert_allclose(jaxrewrite.optimize(net.apply)(params, None, x),
                               jax.jit(net.apply)(params, None, x), rtol=1e-6)
