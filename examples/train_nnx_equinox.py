"""A training script that knows nothing of jaxrewrite: a Flax NNX and an Equinox model, each
trained with its library's own jit and an optax optimizer.

    python examples/train_nnx_equinox.py                     # as written
    python -m jaxrewrite examples/train_nnx_equinox.py       # every outermost jit rewritten
"""
import sys

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

FLIP = np.arange(8)[::-1]  # the features in reverse order: a gather of static indices


class NNXModel(nnx.Module):
    def __init__(self, rngs):
        self.l1 = nnx.Linear(8, 32, rngs=rngs)
        self.l2 = nnx.Linear(32, 1, rngs=rngs)

    def __call__(self, x):
        return self.l2(jax.nn.relu(self.l1(x[:, FLIP])))


@nnx.jit
def nnx_step(model, opt, x, y):
    loss, grads = nnx.value_and_grad(lambda m: jnp.mean((m(x) - y) ** 2))(model)
    opt.update(model, grads)
    return loss


tx = optax.adam(1e-2)


@eqx.filter_jit
def eqx_step(model, opt_state, x, y):
    loss, grads = eqx.filter_value_and_grad(
        lambda m: jnp.mean((jax.vmap(m)(x[:, FLIP]) - y) ** 2))(model)
    updates, opt_state = tx.update(grads, opt_state, eqx.filter(model, eqx.is_array))
    return loss, eqx.apply_updates(model, updates), opt_state


def main(steps):
    x = jax.random.normal(jax.random.key(0), (64, 8))
    y = jnp.sin(x.sum(axis=1, keepdims=True))
    model = NNXModel(nnx.Rngs(0))
    opt = nnx.Optimizer(model, optax.adam(1e-2), wrt=nnx.Param)
    emodel = eqx.nn.MLP(8, 1, 32, 2, key=jax.random.key(1))
    estate = tx.init(eqx.filter(emodel, eqx.is_array))
    for step in range(steps):
        nnx_loss = nnx_step(model, opt, x, y)
        eqx_loss, emodel, estate = eqx_step(emodel, estate, x, y)
    print(f"after {steps} steps: nnx loss {float(nnx_loss):.5f}, "
          f"equinox loss {float(eqx_loss):.5f}")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 20)
