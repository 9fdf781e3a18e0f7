"""The switch on Flax NNX and Equinox programs written as their users write them.

The programs below use `nnx.jit` and `eqx.filter_jit` and know nothing of jaxrewrite. Each model
reads its input columns reversed (`x[:, REV]`: a gather under `jax.jit`, a `rev` once rewritten),
so the rewrite's report says whether the switch reached the library's jit. A 20-step training
loop under the switch keeps its losses within 1e-3 (relative) of the plain run at every step.
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxrewrite
from jaxrewrite import _pipeline

pytestmark = pytest.mark.clients

REV = np.arange(8)[::-1].copy()
STEPS = 20


def data(step):
    x = jax.random.normal(jax.random.key(step), (32, 8))
    return x, jnp.sin(x.sum(axis=1, keepdims=True))


def nnx_program():
    import optax
    from flax import nnx

    class Model(nnx.Module):
        def __init__(self, rngs):
            self.l1 = nnx.Linear(8, 16, rngs=rngs)
            self.l2 = nnx.Linear(16, 1, rngs=rngs)

        def __call__(self, x):
            return self.l2(jax.nn.relu(self.l1(x[:, REV])))

    @nnx.jit
    def step(model, opt, x, y):
        def loss_fn(m):
            return jnp.mean((m(x) - y) ** 2)
        loss, grads = nnx.value_and_grad(loss_fn)(model)
        opt.update(model, grads)
        return loss

    def train():
        model = Model(nnx.Rngs(0))
        opt = nnx.Optimizer(model, optax.adam(1e-2), wrt=nnx.Param)
        return [float(step(model, opt, *data(0))) for _ in range(STEPS)]

    return train


def eqx_program():
    import equinox as eqx
    import optax

    class Model(eqx.Module):
        mlp: eqx.nn.MLP

        def __init__(self, key):
            self.mlp = eqx.nn.MLP(8, 1, 16, 2, key=key)

        def __call__(self, x):
            return jax.vmap(self.mlp)(x[:, REV])

    tx = optax.adam(1e-2)

    @eqx.filter_jit
    def step(model, opt_state, x, y):
        def loss_fn(m):
            return jnp.mean((m(x) - y) ** 2)
        loss, grads = eqx.filter_value_and_grad(loss_fn)(model)
        updates, opt_state = tx.update(grads, opt_state, eqx.filter(model, eqx.is_array))
        return loss, eqx.apply_updates(model, updates), opt_state

    def train():
        model = Model(jax.random.key(1))
        state = tx.init(eqx.filter(model, eqx.is_array))
        losses = []
        for i in range(STEPS):
            loss, model, state = step(model, state, *data(0))
            losses.append(float(loss))
        return losses

    return train


@pytest.fixture
def reports(monkeypatch):
    seen, real = [], _pipeline.rewrite

    def spy(cj, options, **kw):
        result = real(cj, options, **kw)
        seen.append(result.report)
        return result

    monkeypatch.setattr(_pipeline, "rewrite", spy)
    return seen


@pytest.mark.parametrize("make", [nnx_program, eqx_program], ids=["nnx.jit", "eqx.filter_jit"])
def test_library_jit_rewritten_and_training_unchanged(make, reports):
    train = make()
    plain = train()
    assert reports == []
    with jaxrewrite.enabled():
        switched = train()
    # the training step was traced once, through the rewrite, and its static reversal became a
    # `rev` (the gradient is taken with respect to the parameters only: no scatter)
    assert len(reports) == 1
    assert [(e.before, e.after) for e in reports[0].rewrites
            if e.pass_name == "gathers"] == [(("gather",), ("rev",))]
    assert not reports[0].errors
    rel = np.abs(np.array(switched) - np.array(plain)) / np.abs(np.array(plain))
    assert len(switched) == STEPS and rel.max() <= 1e-3, rel
    assert plain[-1] < plain[0]  # it trains


def test_the_readme_example_under_python_m_jaxrewrite():
    """`JAXREWRITE_LOG=1 python -m jaxrewrite examples/train_nnx_equinox.py`: the script's own
    output as without the switch, and one log line per training step function."""
    import os
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    script = os.path.join(root, "examples", "train_nnx_equinox.py")
    env = dict(os.environ, JAX_PLATFORMS="cpu", JAXREWRITE_LOG="1",
               PYTHONPATH=root + os.pathsep + os.environ.get("PYTHONPATH", ""))
    plain = subprocess.run([sys.executable, script, "5"], capture_output=True, text=True,
                           env=dict(env, JAXREWRITE_LOG="0"), timeout=600)
    switched = subprocess.run([sys.executable, "-m", "jaxrewrite", script, "5"],
                              capture_output=True, text=True, env=env, timeout=600)
    assert plain.returncode == 0 and switched.returncode == 0, switched.stderr[-3000:]
    assert plain.stdout.startswith("after 5 steps: nnx loss ")
    assert switched.stdout == plain.stdout  # printed to 5 digits
    logged = [ln for ln in switched.stderr.splitlines() if ln.startswith("jaxrewrite: ")]
    assert [ln.split("(")[0] for ln in logged] == ["jaxrewrite: nnx_step", "jaxrewrite: eqx_step"]
    assert all("gathers 1" in ln for ln in logged)


def test_skip_with_library_jits(reports):
    """`@jaxrewrite.skip` above `@nnx.jit`, below `@eqx.filter_jit`: the step is not rewritten."""
    import equinox as eqx
    from flax import nnx

    x = jnp.ones((4, 8))

    @jaxrewrite.skip
    @nnx.jit
    def nnx_f(x):
        return x[:, REV] * 2

    @eqx.filter_jit
    @jaxrewrite.skip
    def eqx_f(x):
        return x[:, REV] * 2

    with jaxrewrite.enabled():
        a, b = nnx_f(x), eqx_f(x)
    assert reports == []  # neither program went through the pipeline
    np.testing.assert_array_equal(a, x[:, REV] * 2)
    np.testing.assert_array_equal(b, x[:, REV] * 2)
    with jaxrewrite.enabled():
        eqx.filter_jit(lambda x: x[:, REV] * 2)(x)  # the same without skip: rewritten
    assert [e.after for e in reports[-1].rewrites if e.pass_name == "gathers"] == [("rev",)]
