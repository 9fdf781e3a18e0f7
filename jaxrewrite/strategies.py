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


# --- performance programs: the kinds users write, for "never worse" properties -----------------
#
# tests/test_never_worse.py times each against `jax.jit`. A recipe is plain data (hypothesis
# shrinks it field by field); `fn` and `args` are built from it, so a failure prints a program.

WORD_SHAPES = ((4, 4), (5, 5), (25,), (8,), (2, 8))
_DIAG = np.array([0, 1, 2, 3, 5, 6, 7, 4, 10, 11, 8, 9, 15, 12, 13, 14])  # (4,4) diagonals


def _rot(x, n: int, bits: int):
    n %= bits
    if n == 0:
        return x
    t = x.dtype.type
    return (x << t(n)) | (x >> t(bits - n))


@dataclasses.dataclass(frozen=True)
class ArxRecipe:
    """An ARX round function on a state of `shape` words, vmapped over `batch` blocks.

    Each round: a static permutation `perm` of the state (`jnp.take` of the raveled state,
    undone with `argsort` when `undo`), add / xor / rotate mixing of the state with its permuted
    self, and (`message`) words of a 16-word message picked by a static schedule in which each
    word is used `fanout` times. `quarter` ((4,4) only): quarter rounds on the columns and on
    the diagonals (a 4x4 hash compression). `out`: "state", "xor" (state ^ input) or "fold"
    (first half ^ second half: fewer words re-joined). `wrap`: "jit" (each round a jitted helper)
    or "fori" (a `fori_loop` over rounds) or "" (unrolled by Python)."""
    shape: tuple = (4, 4)
    dtype: str = "uint32"
    rounds: int = 2
    batch: int = 1024
    seed: int = 0
    message: bool = True
    fanout: int = 2
    quarter: bool = True
    undo: bool = True
    out: str = "state"
    wrap: str = ""

    @property
    def args(self):
        r = np.random.default_rng(self.seed)
        dt = np.dtype(self.dtype)
        hi = np.iinfo(dt).max
        s = r.integers(0, hi, (self.batch,) + tuple(self.shape), dtype=dt, endpoint=True)
        m = r.integers(0, hi, (self.batch, 16), dtype=dt, endpoint=True)
        return (jnp.asarray(s), jnp.asarray(m))

    def _tables(self):
        r = np.random.RandomState(self.seed % (2 ** 31))
        n = math.prod(self.shape)
        perms = [r.permutation(n) for _ in range(self.rounds)]
        # each message word used `fanout` times per round, in a static order
        scheds = [np.concatenate([r.permutation(16) for _ in range(self.fanout)])
                  for _ in range(self.rounds)]
        rots = [tuple(int(v) for v in r.randint(1, 31, 4)) for _ in range(self.rounds)]
        return perms, scheds, rots

    @property
    def fn(self) -> Callable:
        perms, scheds, rots = self._tables()
        shape, bits = tuple(self.shape), np.dtype(self.dtype).itemsize * 8
        n = math.prod(shape)
        quarter = self.quarter and shape == (4, 4)

        def mix4(s, w, rot):  # quarter rounds on the columns of a (4,4) state (rows a,b,c,d)
            a, b, c, d = s[0], s[1], s[2], s[3]
            a = a + b + w[0]; d = _rot(d ^ a, rot[0], bits)  # noqa: E702
            c = c + d + w[1 % len(w)]; b = _rot(b ^ c, rot[1], bits)  # noqa: E702
            a = a + b + w[2 % len(w)]; d = _rot(d ^ a, rot[2], bits)  # noqa: E702
            c = c + d + w[3 % len(w)]; b = _rot(b ^ c, rot[3], bits)  # noqa: E702
            return jnp.stack([a, b, c, d])

        def one_round(s, m, k):
            perm, sched, rot = perms[k], scheds[k], rots[k]
            if quarter:
                w = jnp.take(m, sched[:16]).reshape(4, 4) if self.message else \
                    jnp.zeros((4, 4), s.dtype)
                s = mix4(s, w, rot)
                s = jnp.take(s.ravel(), _DIAG).reshape(4, 4)
                w = jnp.take(m, sched[-16:]).reshape(4, 4) if self.message else w
                s = mix4(s, w, rot[::-1])
                return jnp.take(s.ravel(), np.argsort(_DIAG)).reshape(4, 4) if self.undo else s
            flat = s.ravel()
            t = jnp.take(flat, perm)
            if self.message:
                t = t + jnp.take(m, sched[np.arange(n) % len(sched)])
            flat = _rot((flat + t) ^ _rot(t, rot[0], bits), rot[1], bits)
            if self.undo:
                flat = jnp.take(flat, np.argsort(perm)) ^ t
            return flat.reshape(shape)

        def block(s0, m):
            s = s0
            if self.wrap == "fori":
                # one body for every trip: the round tables of round 0
                s = jax.lax.fori_loop(0, self.rounds, lambda k, s: one_round(s, m, 0), s)
            else:
                for k in range(self.rounds):
                    s = (jax.jit(one_round, static_argnums=2) if self.wrap == "jit"
                         else one_round)(s, m, k)
            if self.out == "xor":
                return s ^ s0
            if self.out == "fold":
                f = s.ravel()
                h = f.size // 2
                return f[:h] ^ f[h:2 * h]
            return s

        def program(s, m):
            return jax.vmap(block)(s, m)

        program.__qualname__ = program.__name__ = "arx_program"
        return program


@dataclasses.dataclass(frozen=True)
class FieldRecipe:
    """A stencil on a batch of small fields (`shape` per element, float32): each step adds a
    weighted sum of `jnp.roll`s of the field along its small axes (periodic neighbours)."""
    shape: tuple = (8,)
    steps: int = 2
    batch: int = 1024
    seed: int = 0

    @property
    def args(self):
        x = np.random.default_rng(self.seed).uniform(-1, 1, (self.batch,) + tuple(self.shape))
        return (jnp.asarray(x.astype(np.float32)),)

    @property
    def fn(self) -> Callable:
        shape = tuple(self.shape)

        def block(f):
            for _ in range(self.steps):
                nb = sum(jnp.roll(f, sh, axis=ax) for ax in range(len(shape)) for sh in (1, -1))
                f = f + np.float32(0.125) * nb - np.float32(0.5) * f
            return f

        def program(x):
            return jax.vmap(block)(x)

        program.__qualname__ = program.__name__ = "field_program"
        return program


# batches around each threshold of the cost model: the CPU's minimum piece (4,096 elements)
BATCHES = (16, 256, 1024, 4095, 4096, 4097, 65536)


def arx_recipes(max_batch: int = 65536, max_rounds: int = 24) -> st.SearchStrategy:
    """ARX round functions: word states of every shape in `WORD_SHAPES`, uint32 and uint64,
    static permutation schedules, messages with fan-out, 1..`max_rounds` rounds, vmapped.

    "uint64" asks for 64-bit words; without `jax_enable_x64` (JAX's default, and how the tests
    run) JAX makes them uint32 and a shift by 32 or more gives 0, so those programs are uint32
    ones with partly vanishing rotations. XLA:CPU can run such a program far faster than its
    uint32 twin (8 words, 6 rounds, 16,384 blocks, seed 931: `jax.jit` 0.12 ms against 1.6 ms),
    and the split form does not keep that."""
    return st.builds(
        ArxRecipe,
        shape=st.sampled_from(WORD_SHAPES),
        dtype=st.sampled_from(["uint32", "uint64"]),
        rounds=st.integers(1, max_rounds),
        batch=st.sampled_from([b for b in BATCHES if b <= max_batch]),
        seed=st.integers(0, 1000),
        message=st.booleans(),
        fanout=st.integers(1, 3),
        quarter=st.booleans(),
        undo=st.booleans(),
        out=st.sampled_from(["state", "xor", "fold"]),
        wrap=st.sampled_from(["", "jit", "fori"]))


def field_recipes(max_batch: int = 65536, max_steps: int = 8) -> st.SearchStrategy:
    return st.builds(FieldRecipe, shape=st.sampled_from([(8,), (4, 4), (5, 5), (16,), (2, 8)]),
                     steps=st.integers(1, max_steps),
                     batch=st.sampled_from([b for b in BATCHES if b <= max_batch]),
                     seed=st.integers(0, 1000))


def perf_programs(max_batch: int = 65536, max_rounds: int = 24) -> st.SearchStrategy:
    """ARX round functions and stencils, as users write them (tests/test_never_worse.py)."""
    return st.one_of(arx_recipes(max_batch, max_rounds), field_recipes(max_batch))


# --- beyond ARX: what real programs do (issue 23) ----------------------------------------------
#
# Static `.at[]` updates of small states (environment steps, cipher and PRNG registers), mode
# switches of state machines, and group convolutions over a lattice's symmetry group, the kinds
# of data movement the corpus (bench/corpus.py) found in real libraries; integer and float.

_DTYPES = ("int8", "uint32", "float32")


def _mix(a, b):
    """A cheap non-linear mix of two words: xor-rotate for integers, a multiply-add for floats."""
    if jnp.issubdtype(a.dtype, jnp.floating):
        return a * np.float32(0.75) + b * np.float32(0.5)
    bits = a.dtype.itemsize * 8
    return (a ^ _rot(b, 3, bits)) + a.dtype.type(1)


@dataclasses.dataclass(frozen=True)
class ScatterRecipe:
    """`steps` static-index updates of a small state, vmapped over `batch` elements (or written
    on a leading batch axis: `vmap=False`). `kind`:
    - "face": a (6, 3, 3) cube of stickers; a step turns one face with `rot90` and writes it back
      with `.at[f].set`, and swaps a row of two other faces (a Rubik's-cube face turn);
    - "shift": a register of `size` words shifted with `jnp.roll(s, -1).at[k].set(new)`, `new` a
      mix of two words (registers of ciphers and PRNGs written from their specification);
    - "column": a (2, size // 2) state, one column rewritten with `.at[:, j].set`;
    - "add": `.at[i].add(...)` then `.at[j].mul(...)` at static indices.
    Indices come from a static schedule drawn from `seed`. `wrap`: "" (unrolled by Python),
    "jit" (each step a jitted helper) or "fori" (a `fori_loop` whose body is step 0)."""
    kind: str = "shift"
    dtype: str = "uint32"
    size: int = 8
    steps: int = 2
    batch: int = 1024
    seed: int = 0
    vmap: bool = True
    wrap: str = ""

    @property
    def _state_shape(self) -> tuple:
        return {"face": (6, 3, 3), "column": (2, self.size // 2)}.get(self.kind, (self.size,))

    @property
    def args(self):
        r = np.random.default_rng(self.seed)
        shape = (self.batch,) + self._state_shape
        if self.dtype == "float32":
            return (jnp.asarray(r.uniform(-1, 1, shape).astype(np.float32)),)
        dt = np.dtype(self.dtype)
        return (jnp.asarray(r.integers(np.iinfo(dt).min, np.iinfo(dt).max, shape, dtype=dt,
                                       endpoint=True)),)

    @property
    def fn(self) -> Callable:
        r = np.random.RandomState(self.seed % (2 ** 31))
        n = self._state_shape[-1] if self.kind == "column" else self._state_shape[0]
        picks = [tuple(int(v) for v in r.choice(n, 3, replace=False)) for _ in range(self.steps)]
        pre = () if self.vmap else (slice(None),)     # the leading batch axis, when written out

        def step(s, k):
            i, j, h = picks[k]
            if self.kind == "face":
                turned = jnp.rot90(s[pre + (i,)], k=-1, axes=(-2, -1))
                s = s.at[pre + (i,)].set(turned)
                row_j, row_h = s[pre + (j, 0)], s[pre + (h, 0)]
                return s.at[pre + (j, 0)].set(row_h).at[pre + (h, 0)].set(row_j)
            if self.kind == "shift":
                new = _mix(s[pre + (i,)], s[pre + (j,)])
                return jnp.roll(s, -1, axis=-1).at[pre + (h,)].set(new)
            if self.kind == "column":
                col = (slice(None),)
                new = _mix(s[pre + col + (i,)], s[pre + col + (j,)])
                return s.at[pre + col + (h,)].set(new)
            s = s.at[pre + (i,)].add(s[pre + (j,)])
            return s.at[pre + (h,)].mul(s[pre + (i,)])

        def block(s):
            if self.wrap == "fori":
                return jax.lax.fori_loop(0, self.steps, lambda _, s: step(s, 0), s)
            for k in range(self.steps):
                s = (jax.jit(step, static_argnums=1) if self.wrap == "jit" else step)(s, k)
            return s

        program = jax.vmap(block) if self.vmap else block
        return _named(program, "scatter_program")


@dataclasses.dataclass(frozen=True)
class SwitchRecipe:
    """A state machine stepped `steps` times, vmapped over `batch` machines: each machine's mode
    picks one of `branches` branches, with `lax.switch` (`form="switch"`: vmapped, a select of
    every branch) or with `jnp.select` over all branches' results (`form="select"`). A branch
    permutes the (size,) state by a static table, updates one word at a static index, and the
    next mode comes from a static transition table."""
    size: int = 16
    branches: int = 3
    steps: int = 2
    dtype: str = "uint32"
    form: str = "switch"
    batch: int = 1024
    seed: int = 0

    @property
    def args(self):
        (s,) = ScatterRecipe(dtype=self.dtype, size=self.size, batch=self.batch,
                             seed=self.seed).args
        mode = np.random.default_rng(self.seed + 1).integers(0, self.branches, self.batch)
        return (s, jnp.asarray(mode, jnp.int32))

    @property
    def fn(self) -> Callable:
        r = np.random.RandomState(self.seed % (2 ** 31))
        perms = [r.permutation(self.size) for _ in range(self.branches)]
        spots = [tuple(int(v) for v in r.choice(self.size, 2, replace=False))
                 for _ in range(self.branches)]
        nxt = jnp.asarray(r.randint(0, self.branches, self.branches), jnp.int32)

        def branch(b):
            def go(s):
                t = jnp.take(s, perms[b])
                i, j = spots[b]
                return t.at[i].set(_mix(t[i], t[j]))
            return go

        def machine(s, mode):
            for _ in range(self.steps):
                if self.form == "switch":
                    s = lax.switch(mode, [branch(b) for b in range(self.branches)], s)
                else:
                    s = jnp.select([mode == b for b in range(self.branches)],
                                   [branch(b)(s) for b in range(self.branches)], s)
                mode = nxt[mode]
            return s, mode

        return _named(jax.vmap(machine), "switch_program")


def _lattice_group(side: int, group: str) -> np.ndarray:
    """The permutations of a side x side torus's sites: its translations, or (`"space"`) the
    translations composed with the square's 8 rotations and reflections. (|G|, side**2) ints."""
    i, j = np.meshgrid(np.arange(side), np.arange(side), indexing="ij")
    points = [(i, j)]
    if group == "space":
        points = []
        for a, b in ((i, j), (j, i)):                          # identity, reflection
            for _ in range(4):                                  # then the 4 rotations
                points.append((a, b))
                a, b = b, (-a) % side
    perms = {tuple((((a + x) % side) * side + (b + y) % side).ravel())
             for a, b in points for x in range(side) for y in range(side)}
    return np.array(sorted(perms))


@dataclasses.dataclass(frozen=True)
class SymmetryRecipe:
    """Group convolutions over a lattice's symmetry group, as a symmetric network's layers do:
    the (side**2,) float32 input is read through the group's permutation table (|G| x sites:
    16 to 1,296 entries) into one feature per group element, then `layers` group convolutions
    each read the features through the group's (|G|, |G|) product table, a tanh between; the
    output is the mean feature. Vmapped over `batch` inputs; the weights are an argument."""
    side: int = 4
    group: str = "translations"
    layers: int = 2
    batch: int = 256
    seed: int = 0

    @property
    def args(self):
        r = np.random.default_rng(self.seed)
        g = len(_lattice_group(self.side, self.group))
        x = r.uniform(-1, 1, (self.batch, self.side ** 2)).astype(np.float32)
        w0 = r.normal(0, 0.5, self.side ** 2).astype(np.float32)
        ws = r.normal(0, 1 / np.sqrt(g), (self.layers, g)).astype(np.float32)
        return (jnp.asarray(w0), jnp.asarray(ws), jnp.asarray(x))

    @property
    def fn(self) -> Callable:
        perms = _lattice_group(self.side, self.group)
        index = {tuple(p): k for k, p in enumerate(perms)}
        # product[g, h]: the element g∘h, so layer features read f[product[g]] per output g
        product = np.array([[index[tuple(p[q])] for q in perms] for p in perms])

        def net(w0, ws, x):
            f = jnp.tanh(x[perms] @ w0)                      # (|G|,): lift to the group
            for k in range(self.layers):
                f = jnp.tanh(f[product] @ ws[k])             # group convolution
            return jnp.mean(f)

        return _named(jax.vmap(net, in_axes=(None, None, 0)), "symmetry_program")


def _named(fn, name):
    fn.__qualname__ = fn.__name__ = name
    return fn


def scatter_recipes(max_batch: int = 65536, max_steps: int = 6) -> st.SearchStrategy:
    return st.builds(ScatterRecipe, kind=st.sampled_from(["face", "shift", "column", "add"]),
                     dtype=st.sampled_from(_DTYPES), size=st.sampled_from([8, 16]),
                     steps=st.integers(1, max_steps),
                     batch=st.sampled_from([1] + [b for b in BATCHES if b <= max_batch]),
                     seed=st.integers(0, 1000), vmap=st.booleans(),
                     wrap=st.sampled_from(["", "jit", "fori"]))


def switch_recipes(max_batch: int = 65536, max_steps: int = 4) -> st.SearchStrategy:
    return st.builds(SwitchRecipe, size=st.sampled_from([8, 16]), branches=st.integers(2, 4),
                     steps=st.integers(1, max_steps), dtype=st.sampled_from(_DTYPES),
                     form=st.sampled_from(["switch", "select"]),
                     batch=st.sampled_from([b for b in BATCHES if b <= max_batch]),
                     seed=st.integers(0, 1000))


# (side, group) whose permutation table has 16 to 1,296 entries
SYMMETRY_GROUPS = tuple((side, group) for side in range(2, 7) for group in ("translations", "space")
                        if 16 <= len(_lattice_group(side, group)) * side ** 2 <= 1296)


def symmetry_recipes(max_batch: int = 4096, max_layers: int = 3) -> st.SearchStrategy:
    return st.builds(lambda sg, **kw: SymmetryRecipe(side=sg[0], group=sg[1], **kw),
                     sg=st.sampled_from(SYMMETRY_GROUPS), layers=st.integers(1, max_layers),
                     batch=st.sampled_from([b for b in (16, 256, 1024, 4096) if b <= max_batch]),
                     seed=st.integers(0, 1000))


def real_code_recipes(max_batch: int = 65536) -> st.SearchStrategy:
    """Static `.at[]` updates (vmapped and on a leading axis), switch and select state machines,
    and symmetry-group convolutions; integer and float programs (tests/test_never_worse.py)."""
    return st.one_of(scatter_recipes(max_batch), switch_recipes(max_batch),
                     symmetry_recipes(min(max_batch, 4096)))
