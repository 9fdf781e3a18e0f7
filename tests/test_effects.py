"""Effects: callbacks and debug prints keep their number and order; random draws from different
keys are never merged (and draws from one key are merged only as jax.jit itself would)."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import jaxrewrite
from jaxrewrite.testing import assert_bitwise_equal, assert_equivalent, primitive_counts


def _run_both(fn, *args):
    """Run jax.jit(fn) and optimize(fn), returning what each run's callbacks recorded."""
    logs = {}
    for name, wrap in (("jit", jax.jit), ("opt", jaxrewrite.optimize)):
        log.clear()
        out = wrap(fn)(*args)
        jax.effects_barrier()
        logs[name] = (list(log), out)
    return logs


log: list = []


def _record(tag):
    def cb(*vals):
        log.append((tag, tuple(np.asarray(v).tolist() for v in vals)))
    return cb


def test_ordered_callbacks_keep_number_and_order():
    def f(x):
        # the same callback on the same value three times: CSE must not merge them
        jax.debug.callback(_record("a"), x, ordered=True)
        jax.debug.callback(_record("a"), x, ordered=True)
        y = jnp.sin(x)[::-1]
        jax.debug.callback(_record("b"), y, ordered=True)
        jax.debug.callback(_record("a"), x, ordered=True)
        return y * 2

    logs = _run_both(f, jnp.arange(3.0))
    assert [t for t, _ in logs["opt"][0]] == ["a", "a", "b", "a"]
    assert logs["opt"][0] == logs["jit"][0]
    assert_bitwise_equal(logs["opt"][1], logs["jit"][1])


def test_unordered_callbacks_keep_their_number():
    def f(x):
        for k in range(4):
            jax.debug.callback(_record("u"), x + 0 * k)  # identical operands after folding
        return x + 1

    logs = _run_both(f, jnp.arange(3.0))
    assert len(logs["opt"][0]) == len(logs["jit"][0]) == 4
    assert sorted(logs["opt"][0]) == sorted(logs["jit"][0])


def test_callbacks_in_nested_jit_cond_scan_keep_number_and_order():
    inner = jax.jit(lambda v: (jax.debug.callback(_record("inner"), v, ordered=True), v * 2)[1])

    def f(x):
        x = inner(x)
        x = inner(x)  # the shared inner function: both calls run its callback
        x = lax.cond(x.sum() > 0, lambda v: inner(v), lambda v: v, x)

        def step(c, _):
            jax.debug.callback(_record("scan"), c, ordered=True)
            return c + 1, None

        x, _ = lax.scan(step, x, None, length=3)
        return x

    logs = _run_both(f, jnp.ones(2))
    assert [t for t, _ in logs["opt"][0]] == ["inner"] * 3 + ["scan"] * 3
    assert logs["opt"][0] == logs["jit"][0]


def test_debug_print_keeps_number_and_order(capfd):
    def f(x):
        jax.debug.print("first {}", x, ordered=True)
        jax.debug.print("first {}", x, ordered=True)
        jax.debug.print("second {}", x[::-1], ordered=True)
        return x

    outs = {}
    for name, wrap in (("jit", jax.jit), ("opt", jaxrewrite.optimize)):
        capfd.readouterr()
        wrap(f)(jnp.arange(3))
        jax.effects_barrier()
        outs[name] = capfd.readouterr().out.splitlines()
    assert outs["opt"] == outs["jit"]
    assert [line.split()[0] for line in outs["opt"]] == ["first", "first", "second"]


def test_io_callback_ordered_results_and_order():
    counter = {"n": 0}

    def tick(x):
        counter["n"] += 1
        return np.asarray(x * counter["n"], np.float32)

    def f(x):
        a = jax.experimental.io_callback(tick, jax.ShapeDtypeStruct(x.shape, x.dtype), x,
                                         ordered=True)
        b = jax.experimental.io_callback(tick, jax.ShapeDtypeStruct(x.shape, x.dtype), x,
                                         ordered=True)
        return a, b  # identical calls with identical operands: never merged

    x = jnp.arange(3.0)
    # (blocked before the counter is reset: on a TPU a call returns before its callbacks ran)
    counter["n"] = 0
    want = jax.block_until_ready(jax.jit(f)(x))
    counter["n"] = 0
    got = jax.block_until_ready(jaxrewrite.optimize(f)(x))
    assert counter["n"] == 2
    assert_bitwise_equal(got, want)
    assert not np.array_equal(got[0], got[1])


@pytest.mark.parametrize("impl", ["threefry2x32", "rbg"])
def test_random_draws_from_different_keys_are_never_merged(impl):
    def f(x):
        k1 = jax.random.key(0, impl=impl)
        k2 = jax.random.key(1, impl=impl)
        a = jax.random.normal(k1, x.shape)
        b = jax.random.normal(k2, x.shape)
        c = jax.random.normal(jax.random.fold_in(k1, 1), x.shape)
        return x + a, x + b, x + c

    x = jnp.zeros(4)
    got = jaxrewrite.optimize(f)(x)
    assert_bitwise_equal(got, jax.jit(f)(x))
    assert not np.array_equal(got[0], got[1])
    assert not np.array_equal(got[0], got[2])
    assert_equivalent(f, x, vmap=False, bitwise=True)


def test_random_draws_from_dynamic_keys_are_never_merged():
    def f(key, x):
        k1, k2 = jax.random.split(key)
        return jax.random.uniform(k1, x.shape) + x, jax.random.uniform(k2, x.shape) + x

    key = jax.random.key(3)
    got = jaxrewrite.optimize(f)(key, jnp.zeros(5))
    assert_bitwise_equal(got, jax.jit(f)(key, jnp.zeros(5)))
    assert not np.array_equal(got[0], got[1])


def test_stateful_rng_uniform_is_never_merged():
    def f(x):
        a = lax.rng_uniform(0.0, 1.0, x.shape)
        b = lax.rng_uniform(0.0, 1.0, x.shape)
        return a, b

    cj = jaxrewrite.make_jaxpr(f)(jnp.zeros(3))
    assert primitive_counts(cj)["rng_uniform"] == 2


def test_same_key_draws_match_jax_jit():
    def f(x):
        k = jax.random.key(7)
        return jax.random.normal(k, x.shape) + x, jax.random.normal(k, x.shape) * x

    assert_equivalent(f, jnp.ones(3), vmap=False, bitwise=True)
