"""The switch: every outermost `jax.jit` rewritten, with no change to the program.

A static reversal `x[:, REV]` is a `gather` under `jax.jit` and a `rev` once rewritten, so the
jaxpr `jax.jit(...).trace(x)` stages says whether the switch rewrote a function.
"""
import os
import pickle
import subprocess
import sys
import textwrap
import threading
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import export

import jaxrewrite
from jaxrewrite import _pipeline, _switch
from jaxrewrite.testing import assert_bitwise_equal, primitive_counts

from jaxrewrite import _compat as C

# the switch hooks JAX >= 0.9's jit trace (tests/test_api.py checks what older JAX says); the
# witness of a rewrite, REV's gather made a rev, is the CPU's row (the TPU keeps a rev of more
# than 2 elements a gather, bench/tpu_costs.py): the switch decides for the CPU on any host
pytestmark = [
    pytest.mark.skipif(not C.has_jit_trace_hook(), reason="the switch needs jax >= 0.9"),
    pytest.mark.default_target("cpu"),
]

REV = np.array([3, 2, 1, 0])
X = jnp.arange(16.0).reshape(4, 4) / 7


def program(x):
    return jnp.tanh(x[:, REV]) * 2


def fresh():
    """A new function object: JAX caches traces per function, across jit objects and tests."""
    return lambda x: program(x)


def _rewritten(jitted, *args) -> bool:
    """Whether `jitted`'s staged program is the rewritten one (its gather became a rev)."""
    counts = primitive_counts(jitted.trace(*args).jaxpr)
    assert counts.get("gather", 0) + counts.get("rev", 0) >= 1  # one form or the other
    return counts.get("gather", 0) == 0 and counts.get("rev", 0) >= 1


@pytest.fixture(autouse=True)
def switch_off_after():
    yield
    jaxrewrite.disable()


@pytest.fixture
def rewrites(monkeypatch):
    """The programs the pipeline was given, in order (one per rewrite)."""
    seen, real = [], _pipeline.rewrite

    def spy(cj, options, **kw):
        seen.append(cj)
        return real(cj, options, **kw)

    monkeypatch.setattr(_pipeline, "rewrite", spy)
    return seen


def test_enable_disable_and_results_unchanged():
    f = jax.jit(fresh())
    want = f(X)
    assert not _rewritten(f, X)
    jaxrewrite.enable()
    assert jaxrewrite.is_enabled()
    assert _rewritten(f, X)
    assert_bitwise_equal(f(X), want)  # data movement: bit for bit
    jaxrewrite.disable()
    assert not jaxrewrite.is_enabled()
    assert not _rewritten(f, X)
    assert_bitwise_equal(f(X), want)


def test_switch_is_part_of_the_cache_key(rewrites):
    f = jax.jit(fresh())
    f(X)                                   # compiled plain
    with jaxrewrite.enabled():
        f(X)                               # traced again, rewritten
        f(X)                               # cached
    assert len(rewrites) == 1
    f(X)                                   # the plain program, cached from before
    assert len(rewrites) == 1
    with jaxrewrite.enabled():
        f(X)                               # the rewritten one, cached
    assert len(rewrites) == 1


def test_context_manager_nesting_restores_outer_options():
    f = jax.jit(fresh())
    with jaxrewrite.enabled():
        assert _rewritten(f, X)
        with jaxrewrite.enabled(gathers=False):
            assert not _rewritten(f, X)
        assert _rewritten(f, X)
    assert not _rewritten(f, X)
    jaxrewrite.enable()
    with jaxrewrite.enabled(gathers=False):  # a block's options win over enable()'s
        assert not _rewritten(f, X)
    assert _rewritten(f, X)


def test_enable_rejects_unknown_and_jit_keywords():
    with pytest.raises(TypeError, match="donate_argnums"):
        jaxrewrite.enable(donate_argnums=0)
    with pytest.raises(ValueError):
        jaxrewrite.enable(dedup="off")
    assert not jaxrewrite.is_enabled()


def test_enabled_block_is_per_thread():
    f = jax.jit(fresh())
    inside, outside = threading.Barrier(2), {}

    def other():
        inside.wait()                      # the main thread is inside its block now
        outside["rewritten"] = _rewritten(f, X)
        inside.wait()

    t = threading.Thread(target=other)
    t.start()
    with jaxrewrite.enabled():
        inside.wait()
        mine = _rewritten(f, X)
        inside.wait()
    t.join()
    assert mine and not outside["rewritten"]


def test_many_threads_under_enable(rewrites):
    jaxrewrite.enable()
    shapes = [(4, 4), (2, 4), (8, 4)]
    f = jax.jit(fresh())
    barrier = threading.Barrier(8)
    errors = []

    def worker(i):
        try:
            barrier.wait()
            for k in range(6):
                x = jnp.ones(shapes[(i + k) % 3]) * i
                assert_bitwise_equal(f(x), program(x))
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert 3 <= len(rewrites) <= 8 * 3  # at least one rewrite per shape; never more than calls


def test_inner_jits_and_jits_made_while_tracing_are_not_rewritten_again(rewrites):
    inner = jax.jit(fresh())

    @jax.jit
    def outer(x):
        made_here = jax.jit(lambda y: y[:, REV] + 1)
        return inner(x) + made_here(x)

    with jaxrewrite.enabled():
        got = outer(X)
    assert len(rewrites) == 1              # the outermost one, with its inner jits in it
    assert_bitwise_equal(got, jax.jit(outer)(X))


def test_optimize_and_jaxrewrite_internals_are_not_wrapped_twice(rewrites):
    g = jaxrewrite.optimize(program)
    with jaxrewrite.enabled():
        g(X)
        assert len(rewrites) == 1
        e = jaxrewrite.explain(program, gpu_target=None)(X)  # its baseline stays jax.jit's
    plain = jaxrewrite.explain(program, gpu_target=None)(X)
    assert e.eqns_before == plain.eqns_before and e.eqns_after == plain.eqns_after
    assert e.counts.get("gathers.applied") == 1


def test_eager_jax_operations_are_not_rewritten(rewrites):
    with jaxrewrite.enabled():
        jnp.sin(X), jnp.take(X, jnp.array([1, 0]), axis=0), X[:, REV]
    assert rewrites == []


def test_a_jax_function_that_calls_yours_is_your_program(rewrites):
    """JAX's test utilities jit a wrapper (defined in JAX) of the test's function."""
    user = fresh()

    def wrapper(x):
        return user(x)

    wrapper.__module__ = "jax._src.test_util"
    with jaxrewrite.enabled():
        assert _rewritten(jax.jit(wrapper), X)


def test_skip_a_jit_object_or_the_function_it_traces():
    with jaxrewrite.enabled():
        assert not _rewritten(jaxrewrite.skip(jax.jit(fresh())), X)
        assert not _rewritten(jax.jit(jaxrewrite.skip(lambda x: program(x))), X)
        assert _rewritten(jax.jit(lambda x: program(x)), X)


def test_skip_a_function_the_program_calls_leaves_the_program_as_traced():
    helper = jaxrewrite.skip(lambda x: x + 1)

    def uses_helper(x):
        return helper(program(x))

    with jaxrewrite.enabled():
        assert not _rewritten(jax.jit(uses_helper), X)
        assert _rewritten(jax.jit(lambda x: program(x) + 1), X)


def test_aot_attributes_work_as_before():
    f = jax.jit(fresh())
    want = f(X)
    with jaxrewrite.enabled():
        assert jax.jit(fresh()).eval_shape(X) == jax.ShapeDtypeStruct(X.shape, X.dtype)
        compiled = f.lower(X).compile()
        assert_bitwise_equal(compiled(X), want)
        assert primitive_counts(f.trace(X).jaxpr).get("gather", 0) == 0


def test_clear_cache_retraces_as_without_the_switch():
    traces = []

    def counted(x):
        traces.append(1)
        return program(x)

    f = jax.jit(counted)
    with jaxrewrite.enabled():
        f(X), f(X)
        assert len(traces) == 1
        f.clear_cache()
        f(X)
        assert len(traces) == 2


def test_donation_and_static_arguments():
    with jaxrewrite.enabled():
        f = jax.jit(lambda a, n: a[:, REV] * n, donate_argnums=0, static_argnums=1)
        a = jnp.array(X)
        out = f(a, 3)
        assert a.is_deleted()
        assert_bitwise_equal(out, program(X) * 0 + X[:, REV] * 3)
        assert _rewritten(jax.jit(lambda a, n: a[:, REV] * n, static_argnums=1), X, 3)


def test_shardings_given_to_jit():
    s = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    f = jax.jit(fresh(), in_shardings=s, out_shardings=s)
    with jaxrewrite.enabled():
        out = f(X)
        assert _rewritten(f, X)
    assert out.sharding == s
    assert_bitwise_equal(out, jax.jit(fresh())(X))


def test_export_of_an_enabled_function():
    f = jax.jit(fresh())
    plain = export.export(f)(X)
    with jaxrewrite.enabled():
        exp = export.export(f)(X)
    assert exp.in_avals == plain.in_avals and exp.out_avals == plain.out_avals
    assert_bitwise_equal(exp.call(X), plain.call(X))


def _module_level(x):
    return x * 2


@jaxrewrite.skip
def skipped_module_level(x):  # decorated: pickled by name, like any module-level function
    return x * 2


def test_pickling_behaves_as_without_the_switch():
    def pickling_error(obj):
        try:
            pickle.dumps(obj)
        except Exception as e:  # noqa: BLE001 - the error is what is compared
            return type(e)
        return None

    plain = pickling_error(jax.jit(_module_level))
    with jaxrewrite.enabled():
        f = jax.jit(_module_level)
        f(X)
        assert pickling_error(f) is plain
        back = pickle.loads(pickle.dumps(skipped_module_level))
    assert back is skipped_module_level
    assert pickle.loads(pickle.dumps(jax.jit(fresh())(X))).shape == X.shape


def test_a_failed_rewrite_runs_the_original_and_warns_once(monkeypatch):
    def broken(cj, options, **kw):
        raise RuntimeError("deliberately broken")

    monkeypatch.setattr(_pipeline, "rewrite", broken)

    def failing_program(x):
        return program(x)

    f = jax.jit(failing_program)
    fell_back = _switch.STATS["fell_back"]
    with jaxrewrite.enabled():
        with warnings.catch_warnings(record=True) as record:
            warnings.simplefilter("always")
            got = [f(X), f(X[:2]), f(X[:3])]
        ours = [w for w in record if "jaxrewrite" in str(w.message)]
        assert len(ours) == 1 and "failing_program" in str(ours[0].message)
        assert _switch.STATS["fell_back"] == fell_back + 3  # counted for the plugin's summary
        assert issubclass(ours[0].category, RuntimeWarning)
        assert not _rewritten(f, X)
    for x, g in zip([X, X[:2], X[:3]], got):
        assert_bitwise_equal(g, jax.jit(fresh())(x))
    with jaxrewrite.enabled(strict=True):
        with pytest.raises(RuntimeError, match="deliberately broken"):
            jax.jit(lambda x: program(x))(X)


def test_errors_of_the_program_itself_are_raised_as_jax_raises_them():
    def bad(x):
        if x.sum() > 0:  # a tracer used as a bool
            return x
        return -x

    with pytest.raises(jax.errors.TracerBoolConversionError) as plain:
        jax.jit(bad)(X)
    with jaxrewrite.enabled(), warnings.catch_warnings():
        warnings.simplefilter("error")  # no fallback warning: the error is the program's
        with pytest.raises(jax.errors.TracerBoolConversionError) as switched:
            jax.jit(bad)(X)
    assert type(switched.value) is type(plain.value)


# Integer data: the child runs on the CPU (JAX_PLATFORMS=cpu: on a TPU host the parent holds the
# chip), the parent on its default backend, and an integer result is the same bits on every one.
SCRIPT = """
import sys
import jax, jax.numpy as jnp, numpy as np

REV = np.array([3, 2, 1, 0])

@jax.jit
def step(x):
    return (x[:, REV] * 3) ^ x

print(sys.argv[1:], int(step(jnp.arange(16, dtype=jnp.int32).reshape(4, 4)).sum()))
"""


def _script_program(x):
    return (x[:, REV] * 3) ^ x


def _run_module(tmp_path, *args, log=True):
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(SCRIPT))
    env = dict(os.environ, JAXREWRITE_LOG="1" if log else "0", JAX_PLATFORMS="cpu")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    cmd = [sys.executable, "-m", "jaxrewrite", *args, str(script), "a", "--b"]
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300, cwd=tmp_path)


def test_python_m_jaxrewrite_runs_a_script_with_the_switch_on(tmp_path):
    done = _run_module(tmp_path)
    assert done.returncode == 0, done.stderr
    lines = [ln for ln in done.stderr.splitlines() if ln.startswith("jaxrewrite: ")]
    assert len(lines) == 1 and lines[0].startswith("jaxrewrite: step(i32[4,4])")
    assert "gathers 1" in lines[0]
    want = int(jax.jit(_script_program)(jnp.arange(16, dtype=jnp.int32).reshape(4, 4)).sum())
    assert done.stdout.split() == ["['a',", "'--b']", repr(want)]


def test_python_m_jaxrewrite_options(tmp_path):
    done = _run_module(tmp_path, "--option", "gathers=False", "-o", "scalarize=auto")
    assert done.returncode == 0, done.stderr
    lines = [ln for ln in done.stderr.splitlines() if ln.startswith("jaxrewrite: step(")]
    assert len(lines) == 1 and "gathers 1" not in lines[0]
    bad = _run_module(tmp_path, "--option", "nonsense=1", log=False)
    assert bad.returncode == 2 and "nonsense" in bad.stderr


@pytest.mark.parametrize("workers", [1, 2])
def test_the_pytest_plugin_counts_the_programs_of_every_worker(tmp_path, workers):
    """`-p jaxrewrite.testing_switch` turns the switch on in each process pytest runs, xdist's
    workers included (tests/clients/library_suites.py runs Haiku's and Optax's suites with
    `-n 2`), and the summary line counts the programs of all of them, not the controller's 0."""
    if workers > 1:
        pytest.importorskip("xdist")
    for i in range(4):   # four shapes: four programs, each a reversal that the switch rewrites
        (tmp_path / f"test_{i}.py").write_text(textwrap.dedent(f"""
            import jax, jax.numpy as jnp, numpy as np
            def test_{i}():
                x = jnp.arange({i + 4}.0)
                y = jax.jit(lambda x: x[np.arange({i + 3}, -1, -1)] * 2)(x)
                assert (np.asarray(y) == np.arange({i + 3}, -1, -1) * 2).all()
            """))
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p",
           "jaxrewrite.testing_switch", "-c", str(tmp_path / "pytest.ini"),
           "--rootdir", str(tmp_path), str(tmp_path)]
    if workers > 1:
        cmd[3:3] = ["-n", str(workers)]
    env = dict(os.environ, JAX_PLATFORMS="cpu", JAXREWRITE_SWITCH_OPTIONS="target=cpu")
    done = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    line = [x for x in done.stdout.splitlines() if x.startswith("jaxrewrite switch:")]
    assert line == ["jaxrewrite switch: 4 programs traced through a rewrite, 4 changed by it, "
                    "0 fell back"], done.stdout[-2000:]
