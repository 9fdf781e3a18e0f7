"""Hypothesis strategies for random JAX programs (needs the `test` extra: hypothesis).

    from hypothesis import given
    from jaxrewrite.strategies import programs

    @given(programs())
    def test_mine(prog):
        jaxrewrite.testing.assert_equivalent(prog.fn, *prog.args)

A program is drawn as a *recipe*, a list of `Op`s, and `Program.fn` interprets the recipe when
JAX traces it. Recipes are plain data: hypothesis shrinks them op by op and prints them as
readable pseudo-code (`Program.__repr__`), so a failing example reads like the program it is.

Each op takes its operands from the values computed so far (`a`, `b` count back from the newest
value) and a parameter `p` that picks shapes, axes, indices and seeds from the operands' actual
shapes at trace time; a result whose shape does not suit its consumer is fitted with data
movement (`fit`), so every recipe is a valid program. Ops mix elementwise math, reshapes and
transposes, static and dynamic gathers and scatters, nested `jit` (one shared object and fresh
closures), `cond`, `scan`, `while`, `custom_jvp`, `custom_vjp`, `checkpoint`, random draws and
debug callbacks; the control-flow ops carry a small body recipe of their own.
"""
from __future__ import annotations

import dataclasses
import functools
import math
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
from hypothesis import strategies as st
from jax import lax

# --- helpers used by the interpreter ----------------------------------------------------------


def fit(r, shape):
    """`r` as an array of `shape`: reshaped when the size matches, else tiled/truncated."""
    r = jnp.asarray(r)
    if r.shape == tuple(shape):
        return r
    size = math.prod(shape)
    flat = r.ravel()
    if flat.size == 0:
        return jnp.zeros(shape, r.dtype)
    if flat.size < size:
        flat = jnp.concatenate([flat] * (-(-size // flat.size)))
    return flat[:size].reshape(shape)


def _rng(p: int) -> np.random.RandomState:
    return np.random.RandomState(p % (2 ** 31))


def _factorizations(n: int) -> list[tuple[int, ...]]:
    out = [(n,)]
    for a in range(2, n):
        if n % a == 0:
            out.append((a, n // a))
            for b in range(2, n // a):
                if (n // a) % b == 0:
                    out.append((a, b, n // a // b))
    return out


def _sink(*_):  # the debug callback: observes values, changes nothing
    return None


# --- ops: name -> implementation(values, op, i, body) -> new value ---------------------------


@dataclasses.dataclass(frozen=True)
class Op:
    name: str
    a: int = 0           # operand: values[-1 - a % len(values)]
    b: int = 0           # second operand, same rule
    p: int = 0           # parameter: shapes, axes, indices, seeds
    body: tuple = ()     # a small recipe (tuple of Op) for control flow and calls

    def __repr__(self):
        body = f", body={list(self.body)}" if self.body else ""
        return f"Op({self.name!r}, a={self.a}, b={self.b}, p={self.p}{body})"


def _pick(values, k):
    return values[-1 - (k % len(values))]


def _nd(fn):
    """Movement ops index axes: a scalar operand is first made a 1-element vector."""
    def run(vs, op, i, env):
        x = _pick(vs, op.a)
        if x.ndim == 0:
            vs = [*vs[:-1 - (op.a % len(vs))], x.reshape(1), *vs[len(vs) - (op.a % len(vs)):]]
        return fn(vs, op, i, env)
    return run


def _unary(fn):
    return lambda vs, op, i, env: fn(_pick(vs, op.a), op.p)


def _binary(fn):
    def run(vs, op, i, env):
        x = _pick(vs, op.a)
        y = fit(_pick(vs, op.b), x.shape)
        return fn(x, y, op.p)
    return run


def _axis(x, p):
    return p % max(x.ndim, 1)


def _perm_idx(n, p, repeats=False):
    r = _rng(p)
    return (r.randint(0, n, size=n) if repeats else r.permutation(n)).astype(np.int32)


def _reshape(x, p):
    opts = _factorizations(x.size)
    return x.reshape(opts[p % len(opts)])


def _transpose(x, p):
    if x.ndim < 2:
        return x[::-1]
    return jnp.transpose(x, tuple(_rng(p).permutation(x.ndim)))


def _static_gather(x, p):
    ax = _axis(x, p)
    n = x.shape[ax]
    kind = (p // 7) % 6
    if kind == 0:  # a permutation along an axis
        return jnp.take(x, _perm_idx(n, p), axis=ax)
    if kind == 1:  # indices with repeats
        return jnp.take(x, _perm_idx(n, p, repeats=True), axis=ax)
    if kind == 2:  # out-of-range indices, filled
        idx = np.array([0, n, n - 1, -1], np.int32)
        return jnp.take(x, idx, axis=ax, mode="fill", fill_value=-7.0)
    if kind == 3:  # clipped
        return jnp.take(x, np.array([n + 2, 0, 1], np.int32) % (n + 3), axis=ax, mode="clip")
    if kind == 4:  # the seed shuffle: diagonals into columns
        if x.ndim < 2:
            return x[_perm_idx(n, p)]
        r, c = x.shape[-2], x.shape[-1]
        rows = np.arange(r)[:, None]
        cols = (np.arange(r)[:, None] + np.arange(c)[None, :]) % c
        return x[..., rows, cols]
    flat = x.ravel()  # ravel - index - reshape
    return flat[_perm_idx(flat.size, p)].reshape(x.shape)


def _static_scatter(x, y, p):
    ax0 = x.shape[0] if x.ndim else 1
    x = x if x.ndim else x.reshape(1)
    kind = (p // 5) % 4
    idx = _perm_idx(ax0, p)[: max(1, ax0 // 2)]
    upd = fit(y, (len(idx),) + x.shape[1:])
    if kind == 0:
        return x.at[idx].set(upd)
    if kind == 1:
        return x.at[idx].add(upd)
    if kind == 2:
        return x.at[idx].max(upd)
    return x.at[np.array([0, ax0 + 3], np.int32)].set(fit(y, (2,) + x.shape[1:]), mode="drop")


def _slice(x, p):
    kind = p % 4
    if kind == 0:
        return x[1:] if x.shape and x.shape[0] > 1 else x
    if kind == 1:
        return x[::2]
    if kind == 2:
        return jnp.concatenate([x, x[::-1]], axis=_axis(x, p // 4))
    return lax.rev(x, (_axis(x, p // 4),)) if x.ndim else x


def _dyn_gather(vs, op, i, env):
    x = _pick(vs, op.a)
    if x.ndim == 0:
        return x
    n = x.shape[0]
    kind = op.p % 3
    if kind == 0:
        return x[i % n]
    if kind == 1:
        return lax.dynamic_slice_in_dim(x, i, max(1, n // 2), axis=0)
    return jnp.take(x, (i + np.arange(n, dtype=np.int32)) % n, axis=0)


def _dyn_scatter(vs, op, i, env):
    x = _pick(vs, op.a)
    y = _pick(vs, op.b)
    if x.ndim == 0:
        return x + y.sum()
    n = x.shape[0]
    if op.p % 2 == 0:
        return x.at[i % n].set(fit(y, x.shape[1:]))
    return lax.dynamic_update_slice_in_dim(x, fit(y, (1,) + x.shape[1:]), i, axis=0)


def _reduce(x, p):
    ax = _axis(x, p)
    r = x.max(axis=ax) if p % 2 else x.sum(axis=ax)
    return jnp.expand_dims(r, ax) * jnp.ones_like(x) if p % 3 == 0 else r


def _int_path(x, p):
    k = jnp.floor(x * 4).astype(jnp.int32)
    return ((k // 3 + (k % 5)) ^ (p % 8)).astype(x.dtype)


def _random(vs, op, i, env):
    x = _pick(vs, op.a)
    key = jax.random.key(op.p % 4)  # few seeds: equal keys do occur, as they should
    if (op.p // 4) % 2:
        key = jax.random.fold_in(key, i)
    draw = jax.random.uniform if (op.p // 8) % 2 else jax.random.normal
    return x + draw(key, x.shape, x.dtype)


def _callback(vs, op, i, env):
    x = _pick(vs, op.a)
    jax.debug.callback(_sink, x, ordered=False)
    return x * 1.5


def _block_fn(body, i, env):
    """The body recipe as a function of one value, with the shape it was given."""
    def fn(x):
        vals = [x]
        for sub in body:
            vals.append(OPS[sub.name](vals, sub, i, env))
        return fit(vals[-1], x.shape).astype(x.dtype)
    return fn


def _jit_shared(vs, op, i, env):
    key = ("shared", op.body, op.p % 2)
    if key not in env:  # one jitted object per program, called at every occurrence
        env[key] = jax.jit(_block_fn(op.body, i, env), inline=bool(op.p % 2))
    return env[key](_pick(vs, op.a))


def _jit_fresh(vs, op, i, env):
    body = _block_fn(op.body, i, env)
    fresh = jax.jit(functools.partial(lambda k, x: body(x) * k, 1.0 + op.p % 3))
    return fresh(_pick(vs, op.a))


def _cond(vs, op, i, env):
    x = _pick(vs, op.a)
    pred = (x.sum() > 0) if op.p % 2 else (i % 2 == 0)
    return lax.cond(pred, _block_fn(op.body, i, env), lambda v: -v, x)


def _scan(vs, op, i, env):
    x = _pick(vs, op.a)
    body = _block_fn(op.body, i, env)
    xs = jnp.stack([x, x * 2, x[::-1] if x.ndim else x])

    def step(c, row):
        c = body(c + row)
        return c, c.sum()

    c, ys = lax.scan(step, x, xs)
    return c + ys.sum()


def _while(vs, op, i, env):
    x = _pick(vs, op.a)
    body = _block_fn(op.body, i, env)
    n = 1 + op.p % 3
    _, y = lax.while_loop(lambda s: s[0] < n, lambda s: (s[0] + 1, body(s[1])), (0, x))
    return y


def _custom_jvp(vs, op, i, env):
    fn = _block_fn(op.body, i, env)
    h = jax.custom_jvp(fn)
    h.defjvp(lambda p, t: (fn(p[0]), t[0] * 3.0))
    return h(_pick(vs, op.a))


def _custom_vjp(vs, op, i, env):
    fn = _block_fn(op.body, i, env)
    h = jax.custom_vjp(fn)
    h.defvjp(lambda x: (fn(x), x), lambda res, g: (g * jnp.cos(res),))
    return h(_pick(vs, op.a))


def _checkpoint(vs, op, i, env):
    policy = (None, jax.checkpoint_policies.nothing_saveable,
              jax.checkpoint_policies.everything_saveable)[op.p % 3]
    f = jax.checkpoint(_block_fn(op.body, i, env), prevent_cse=bool((op.p // 3) % 2),
                       policy=policy)
    return f(_pick(vs, op.a))


# Elementwise ops are kept to those XLA computes the same way in any fusion.
ELEMENTWISE = {
    "neg": _unary(lambda x, p: -x),
    "sin": _unary(lambda x, p: jnp.sin(x)),
    "tanh": _unary(lambda x, p: jnp.tanh(x)),
    "square": _unary(lambda x, p: x * x),
    "abs": _unary(lambda x, p: jnp.abs(x)),
    "scale": _unary(lambda x, p: x * (p % 5 - 2) + 0.5),
    "add": _binary(lambda x, y, p: x + y),
    "mul": _binary(lambda x, y, p: x * y),
    "sub": _binary(lambda x, y, p: x - y),
    "max": _binary(lambda x, y, p: jnp.maximum(x, y)),
    "where": _binary(lambda x, y, p: jnp.where(x > y, x, -0.0 * y)),
    "int_path": _unary(_int_path),
}
MOVEMENT_RAW = {
    "reshape": _unary(_reshape),
    "transpose": _unary(_transpose),
    "slice": _unary(_slice),
    "static_gather": _unary(_static_gather),
    "static_scatter": _binary(lambda x, y, p: _static_scatter(x, y, p)),
    "dyn_gather": _dyn_gather,
    "dyn_scatter": _dyn_scatter,
    "reduce": _unary(_reduce),
}
MOVEMENT = {k: _nd(v) for k, v in MOVEMENT_RAW.items()}
EFFECTS = {"random": _random, "callback": _callback}
CALLS = {
    "jit_shared": _jit_shared,
    "jit_fresh": _jit_fresh,
    "cond": _cond,
    "scan": _scan,
    "while": _while,
    "custom_jvp": _custom_jvp,
    "custom_vjp": _custom_vjp,
    "checkpoint": _checkpoint,
}
OPS: dict[str, Callable] = {**ELEMENTWISE, **MOVEMENT, **EFFECTS, **CALLS}


# --- programs ----------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Program:
    """A drawn program: `fn(x, i)` on `args = (x, i)`; `outputs` values are returned."""
    shape: tuple
    ops: tuple
    index: int
    outputs: int = 1

    @property
    def args(self):
        x = np.asarray(_rng(sum(self.shape) + 17).uniform(-2, 2, self.shape), np.float32)
        return (jnp.asarray(x), jnp.int32(self.index))

    @property
    def fn(self) -> Callable:
        ops, outputs = self.ops, self.outputs

        def program(x, i):
            env: dict = {}
            vals = [x]
            for op in ops:
                vals.append(OPS[op.name](vals, op, i, env))
            return tuple(vals[-outputs:])

        program.__qualname__ = program.__name__ = "fuzzed_program"
        return program

    def __repr__(self):
        lines = [f"Program(shape={self.shape}, index={self.index}, outputs={self.outputs}, ops=["]
        lines += [f"    {op!r}," for op in self.ops]
        return "\n".join(lines + ["])"])


_SIMPLE = sorted({**ELEMENTWISE, **MOVEMENT})


def ops(names=None, max_body: int = 3, depth: int = 1) -> st.SearchStrategy:
    """One `Op`; calls and control flow get a body recipe of up to `max_body` ops."""
    names = sorted(OPS) if names is None else sorted(names)
    simple = [n for n in names if n not in CALLS]
    call = [n for n in names if n in CALLS]
    small = st.integers(0, 5)
    param = st.integers(0, 200)
    leaf = st.builds(Op, st.sampled_from(simple or _SIMPLE), small, small, param)
    if not call or depth <= 0:
        return leaf
    body = st.lists(ops(names, max_body, depth - 1), min_size=1, max_size=max_body).map(tuple)
    node = st.builds(Op, st.sampled_from(call), small, small, param, body)
    return st.one_of(leaf, node)


@st.composite
def programs(draw, min_ops: int = 1, max_ops: int = 20, names=None, depth: int = 1) -> Program:
    """A random program of `min_ops`..`max_ops` recipe ops (about 1-60 jaxpr equations)."""
    shape = draw(st.sampled_from([(4,), (2, 3), (4, 4), (3, 4), (2, 2, 3), (6,)]))
    recipe = draw(st.lists(ops(names, depth=depth), min_size=min_ops, max_size=max_ops))
    index = draw(st.integers(-3, 5))
    outputs = draw(st.integers(1, 3))
    return Program(shape, tuple(recipe), index, outputs)


def rewrite_option_values() -> dict[str, list]:
    """Each rewrite option (from `jaxrewrite.OPTIONS`) with the values worth trying: its default
    and its opposite (`'auto'` -> True and False; `gathers` also 'all'). Tuning knobs (limits,
    targets, caps) and `strict`/`debug_checks` are left out."""
    from ._options import OPTIONS
    out = {}
    for name, default, _doc in OPTIONS:
        if name in ("strict", "debug_checks"):
            continue
        if isinstance(default, bool):
            out[name] = [default, not default]
        elif default == "auto":
            out[name] = ["auto", True, False]
        elif name == "gathers":
            out[name] = [default, False, "all"]
    if "gathers" in out and "all" not in out["gathers"]:
        out["gathers"].append("all")
    return out


@st.composite
def option_sets(draw) -> dict:
    """Rewrite options to run with: one option toggled, or all off, or all on."""
    values = rewrite_option_values()
    mode = draw(st.sampled_from(["defaults", "one", "all_off", "all_on"]))
    if mode == "defaults":
        return {}
    if mode == "all_off":
        return {k: False for k in values}
    if mode == "all_on":
        return {k: v[-1] if k == "gathers" else True for k, v in values.items()}
    name = draw(st.sampled_from(sorted(values)))
    return {name: draw(st.sampled_from(values[name][1:]))}
