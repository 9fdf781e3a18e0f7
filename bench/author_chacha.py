"""The seed author's ChaCha20 block function, as the author wrote it (issue 44).

Not a form made to suit the rewrite: the state is re-wrapped at every double round by a
`jnp.ndarray` subclass whose `__new__` checks shape and dtype and returns `jnp.array(state)`
(of an array, a copy); the jitted quarter round re-stacks its four words with
`jnp.array([...], dtype=jnp.uint32)`; the diagonals are taken as `state.ravel()[idx]` with
shape and dtype asserts; the 10 jitted double rounds run in a `lax.fori_loop`.

    block(state)                  # state: (4, 4) uint32, RFC 8439's layout
    jax.vmap(block)(states)       # (N, 4, 4)
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

# diagonals into columns: row r rotated left by r (DIAG), and back (UNDIAG)
_R, _C = np.meshgrid(np.arange(4), np.arange(4), indexing="ij")
DIAG_MAP = (_R * 4 + (_R + _C) % 4).ravel()
UNDIAG_MAP = (_R * 4 + (_C - _R) % 4).ravel()


class ChaChaState(jnp.ndarray):
    """A 4x4 matrix of uint32 words; checks what it is given and hands back an array."""

    def __new__(cls, state):
        if state.shape != (4, 4):
            raise ValueError(f"a ChaCha state is 4x4 words, got {state.shape}")
        if state.dtype != jnp.uint32:
            raise TypeError(f"a ChaCha state is uint32, got {state.dtype}")
        return jnp.array(state)


def _rotl(x, n):
    return (x << n) | (x >> (32 - n))


@jax.jit
def quarter_round(words):
    a, b, c, d = words
    a = a + b
    d = _rotl(d ^ a, 16)
    c = c + d
    b = _rotl(b ^ c, 12)
    a = a + b
    d = _rotl(d ^ a, 8)
    c = c + d
    b = _rotl(b ^ c, 7)
    return jnp.array([a, b, c, d], dtype=jnp.uint32)


_columns = jax.vmap(quarter_round, in_axes=1, out_axes=1)


@jax.jit
def double_round(state):
    state = ChaChaState(state)
    state = _columns(state)
    assert state.shape == (4, 4) and state.dtype == jnp.uint32
    diagonals = state.ravel()[DIAG_MAP].reshape(4, 4)
    assert diagonals.shape == (4, 4)
    diagonals = _columns(diagonals)
    return ChaChaState(diagonals.ravel()[UNDIAG_MAP].reshape(4, 4))


@jax.jit
def block(state):
    state = ChaChaState(state)
    mixed = jax.lax.fori_loop(0, 10, lambda i, s: double_round(s), state)
    return mixed + state


def fresh_copy():
    """This module imported anew, with jitted functions of its own. JAX 0.10.2's jit, having
    traced `x.ravel()[idx]` (a numpy idx) with x64 off, fails to trace it again under
    `jax.enable_x64(True)` ("lax.add requires arguments to have the same dtypes"; plain
    `jax.jit` too): a process that measures both settings takes one copy for each, as a process
    with one setting has."""
    import importlib.util
    spec = importlib.util.spec_from_file_location(f"{__name__}_copy", __file__)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
