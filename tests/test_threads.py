"""Concurrency: many threads calling one optimized function (and `optimize` itself) at once."""
import concurrent.futures as cf
import threading

import jax
import jax.numpy as jnp
import numpy as np

import jaxrewrite
from jaxrewrite.testing import assert_bitwise_equal

SHAPES = [(3,), (4, 4), (2, 3), (8,)]


def program(x):
    inner = jax.jit(lambda v: jnp.sin(v) * 2)
    y = inner(x)[::-1] + inner(x)[::-1]
    flat = y.ravel()
    return flat[np.arange(flat.size)[::-1].copy()].reshape(x.shape) + jnp.cos(x)


def test_sixteen_threads_one_function_several_shapes():
    g = jaxrewrite.optimize(program)
    ref = jax.jit(program)
    inputs = [jnp.arange(np.prod(s), dtype=jnp.float32).reshape(s) / 7 for s in SHAPES]
    want = [ref(x) for x in inputs]
    barrier = threading.Barrier(16)

    def worker(t):
        barrier.wait()  # all threads trace/dispatch at the same moment
        out = []
        for k in range(8):
            i = (t + k) % len(inputs)
            out.append((i, g(inputs[i])))
        return out

    with cf.ThreadPoolExecutor(16) as pool:
        results = list(pool.map(worker, range(16)))
    for res in results:
        for i, got in res:
            assert_bitwise_equal(got, want[i])


def test_sixteen_threads_calling_optimize_afresh():
    """The training-loop habit, from many threads: `optimize(f)(x)` every step."""
    calls = []

    def f(x):
        calls.append(1)
        return x * 3 + 1

    barrier = threading.Barrier(16)

    def worker(t):
        barrier.wait()
        x = jnp.full((t % 3 + 1,), t, jnp.float32)
        return [(x, jaxrewrite.optimize(f, cse=bool(t % 2))(x)) for _ in range(4)]

    with cf.ThreadPoolExecutor(16) as pool:
        results = list(pool.map(worker, range(16)))
    traced = len(calls)
    for res in results:
        for x, got in res:
            assert_bitwise_equal(got, jax.jit(f)(x))
    # 3 shapes x 2 option sets, each traced once: the wrapper cache hands every thread the
    # same jitted object (it used to race: two threads could each make one and trace again)
    assert traced == 3 * 2


def test_last_report_is_per_thread():
    def f(x):
        return x + 1

    seen = {}

    def worker(t):
        jaxrewrite.optimize(f, fold=bool(t % 2))(jnp.ones(t + 1))
        seen[t] = jaxrewrite.last_report()

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert all(seen[t] is not None for t in range(8))
    assert len({id(r) for r in seen.values()}) == 8
