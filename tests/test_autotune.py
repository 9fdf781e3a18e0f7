"""`autotune=` (jaxrewrite/backend/autotune.py): choices made by compiling the candidate forms,
cached on disk by a stable structural digest, reused by a fresh process without compiling."""
import json
import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxrewrite
from jaxrewrite.backend import autotune as _autotune
from jaxrewrite._api import rewrite_jaxpr_with_report
from jaxrewrite.testing import assert_equivalent, primitive_counts

BENCH = os.path.join(os.path.dirname(__file__), "..", "bench")
sys.path.insert(0, BENCH)
import permutations as P  # noqa: E402

PERM = np.array([3, 0, 2, 1])


def lone(x):
    return x[:, PERM] + 1


X = jnp.arange(32, dtype=jnp.int32).reshape(8, 4)

# autotune compiles candidate forms on the local backend only (`autotune.compiler_for`): the tests
# of the CPU's compiled choices need the CPU to be this process's default backend (on a TPU host
# target='cpu' has no compiler in-process, and the model decides, uncached)
cpu_compiler = pytest.mark.skipif(
    _autotune.compiler_for("cpu")[0] != "local",
    reason="compiles the candidate forms for target='cpu', which autotune does only where the "
           "CPU is the default backend (autotune.compiler_for)")


# the tests that write the cache compile for this process's backend, named (not the default
# target, which JAXREWRITE_TEST_TARGET may set to one without a compiler here)
LOCAL = jax.default_backend()


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("JAXREWRITE_CACHE_DIR", str(tmp_path))
    return tmp_path


def _entries(cache_dir):
    with open(cache_dir / "autotune.json") as f:
        return json.load(f)


def test_option_validated():
    with pytest.raises(ValueError):
        jaxrewrite.optimize(lone, autotune="yes")
    assert jaxrewrite.optimize(lone, autotune="time") is not None


@cpu_compiler
def test_choice_made_and_cached(cache_dir):
    before = _autotune.COMPILES
    res = rewrite_jaxpr_with_report(jax.make_jaxpr(lone)(X), autotune=True, target="cpu")
    assert _autotune.COMPILES == before + 2                 # both forms, once
    assert res.report.counts["autotune.compiles"] == 2
    choices = res.report.stats["autotune.choices"]
    assert "launches on cpu" in choices[0]
    entries = _entries(cache_dir)
    assert len(entries) == 1
    (rec,) = entries.values()
    assert rec["split"] is False and len(rec["launches"]) == 2
    # same program, same shapes: the cache answers, nothing compiles
    again = rewrite_jaxpr_with_report(jax.make_jaxpr(lone)(X), autotune=True, target="cpu")
    assert _autotune.COMPILES == before + 2
    assert again.report.counts["autotune.cached"] >= 1
    assert primitive_counts(again.jaxpr) == primitive_counts(res.jaxpr)
    # other shapes: another entry
    rewrite_jaxpr_with_report(jax.make_jaxpr(lone)(jnp.zeros((16, 4), jnp.int32)),
                              autotune=True, target="cpu")
    assert len(_entries(cache_dir)) == 2


def test_digest_stable_and_shape_sensitive():
    a = _autotune.digest(jax.make_jaxpr(lone)(X))
    assert a == _autotune.digest(jax.make_jaxpr(lone)(X + 1))
    assert a != _autotune.digest(jax.make_jaxpr(lone)(jnp.zeros((16, 4), jnp.int32)))
    assert a != _autotune.digest(jax.make_jaxpr(lambda x: x[:, PERM[::-1]] + 1)(X))


def test_bit_exact_and_reused_in_fresh_process(cache_dir):
    f = jax.vmap(lambda x: P.chacha_take(x, rounds=1))
    keys = jnp.asarray(np.random.default_rng(0).integers(0, 2**32, (8, 4, 4), dtype=np.uint32))
    assert_equivalent(f, keys, autotune=True, target="gpu", bitwise=True)   # no GPU compiler here: model
    assert_equivalent(lone, X, autotune=True, bitwise=True, target=LOCAL)
    n = len(_entries(cache_dir))
    assert n >= 1
    # the child runs on the CPU (on a TPU host this process holds the chip) and asks for this
    # process's target, whose choice it reads from the cache: nothing compiled
    target = LOCAL
    script = textwrap.dedent(f"""
        import sys, jax, jax.numpy as jnp, numpy as np
        sys.path.insert(0, {BENCH!r})
        import jaxrewrite
        from jaxrewrite.backend import autotune as _autotune
        PERM = np.array([3, 0, 2, 1])
        f = lambda x: x[:, PERM] + 1
        x = jnp.arange(32, dtype=jnp.int32).reshape(8, 4)
        out = jaxrewrite.optimize(f, autotune=True, target={target!r})(x)
        assert np.array_equal(np.asarray(out), np.asarray(jax.jit(f)(x)))
        print("COMPILES", _autotune.COMPILES)
        print("CACHED", jaxrewrite.last_report().counts.get("autotune.cached", 0))
    """)
    env = dict(os.environ, JAXREWRITE_CACHE_DIR=str(cache_dir), JAX_PLATFORMS="cpu")
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "COMPILES 0" in out.stdout and "CACHED 0" not in out.stdout
    assert len(_entries(cache_dir)) == n


@cpu_compiler
def test_split_taken_on_cpu_matches_jit(cache_dir):
    # pieces of 4096: the model goes ahead on the CPU; compiling confirms (fusions within 4x)
    f = jax.vmap(lambda x: P.chacha_take(x, rounds=2))
    big = jnp.asarray(np.random.default_rng(1).integers(0, 2**32, (4096, 4, 4), dtype=np.uint32))
    cj = assert_equivalent(f, big, vmap=False, autotune=True, target="cpu", bitwise=True)
    assert "gather" not in primitive_counts(cj)
    assert any(r["split"] for r in _entries(cache_dir).values())


def test_no_compiler_for_target_uses_model_and_caches_nothing(cache_dir):
    other = next(t for t in ("tpu", "cpu") if _autotune.compiler_for(t)[0] is None)  # not here
    res = rewrite_jaxpr_with_report(jax.make_jaxpr(lone)(X), autotune=True, target=other)
    assert res.report.counts["autotune.model_only"] >= 1
    assert not (cache_dir / "autotune.json").exists()


@cpu_compiler
def test_unreadable_cache_is_ignored(cache_dir):
    (cache_dir / "autotune.json").write_text("{not json")
    res = rewrite_jaxpr_with_report(jax.make_jaxpr(lone)(X), autotune=True, target="cpu")
    assert res.report.counts["autotune.compiles"] == 2
    assert len(_entries(cache_dir)) == 1


def test_time_mode_opt_in(cache_dir):
    assert_equivalent(lone, X, autotune="time", bitwise=True, target=LOCAL)
    (rec,) = _entries(cache_dir).values()
    assert rec["why"].startswith("timed")


def test_pick_by_counts_rows():
    from jaxrewrite.backend import cost as _cost
    # GPU: fewer kernels wins either way; a tie goes to the model
    assert _cost.pick_by_counts(5, 3, False, "no gain", "gpu")[0] is True
    assert _cost.pick_by_counts(3, 5, True, None, "gpu")[0] is False
    assert _cost.pick_by_counts(3, 3, True, None, "gpu")[0] is True
    # CPU: the model decides; counts only veto a split whose fusions grow past the limit
    assert _cost.pick_by_counts(20, 16, False, "no gain", "cpu")[0] is False
    assert _cost.pick_by_counts(7, 16, True, None, "cpu")[0] is True
    go, why = _cost.pick_by_counts(16, 149, True, None, "cpu")
    assert go is False and "compile time" in why


def test_cpu_split_records_its_trade():
    f = jax.vmap(lambda x: P.chacha_take(x, rounds=2))
    big = jax.ShapeDtypeStruct((4096, 4, 4), jnp.uint32)
    res = rewrite_jaxpr_with_report(jax.make_jaxpr(f)(big), target="cpu")
    assert "gather" not in primitive_counts(res.jaxpr)
    (note,) = res.report.stats["scalarize.trades"]
    assert note.startswith("CPU: splitting trades compile time")
    assert res.report.counts["scalarize.fusion_trade"] >= 1


# --- reroll, decided by measured compile and run time (autotune="time") -------------------------

def _layer(w, x):
    return jnp.tanh(x @ w)


def _chain(ws, x):
    for w in ws:
        x = jax.jit(_layer)(w, x)
    return (x * x).sum()


WS = [jnp.asarray(np.random.default_rng(k).normal(size=(8, 8)), jnp.float32) for k in range(4)]
XS = jnp.ones((4, 8), jnp.float32)


def _scans(cj):
    return primitive_counts(cj).get("scan", 0)


def test_reroll_measured_rows():
    from jaxrewrite.backend import cost as _cost
    most_compile, most_run = _cost.REROLL_TIMED["cpu"]
    assert _cost.reroll_measured(0.5, 1.0, "cpu")[0] is True
    go, why = _cost.reroll_measured(most_compile + 0.1, 0.9, "cpu")
    assert go is False and "compile" in why
    go, why = _cost.reroll_measured(0.5, most_run + 0.1, "cpu")
    assert go is False and "run" in why


@cpu_compiler
def test_reroll_declined_where_rolling_measured_slower(cache_dir, monkeypatch):
    from jaxrewrite.backend import cost as _cost
    monkeypatch.setitem(_cost.REROLL_TIMED, "cpu", (0.0, 0.0))     # nothing can win
    cj = jax.make_jaxpr(_chain)(WS, XS)
    before = _autotune.COMPILES
    res = rewrite_jaxpr_with_report(cj, reroll=True, autotune="time", target="cpu")
    assert _autotune.COMPILES == before + 2                 # the unrolled and the rolled program
    assert _scans(res.jaxpr) == 0
    assert res.report.counts["reroll.declined_measured"] == 1
    assert not res.report.stats.get("reroll.lengths")      # the rolling it measured is taken back
    assert not [e for e in res.report.rewrites if e.pass_name == "reroll"]
    (why,) = [d.reason for d in res.report.declines if "rolling must compile" in (d.reason or "")]
    assert why.startswith("autotune: rolled: compile")
    (rec,) = _entries(cache_dir).values()
    assert rec["split"] is False and len(rec["compile_s"]) == 2 and len(rec["run_s"]) == 2
    np.testing.assert_array_equal(jaxrewrite.optimize(_chain, reroll=True, autotune="time")(WS, XS),
                                  jax.jit(_chain)(WS, XS))


@cpu_compiler
def test_reroll_kept_where_measured_faster_and_the_choice_cached(cache_dir, monkeypatch):
    from jaxrewrite.backend import cost as _cost
    monkeypatch.setitem(_cost.REROLL_TIMED, "cpu", (float("inf"), float("inf")))
    cj = jax.make_jaxpr(_chain)(WS, XS)
    res = rewrite_jaxpr_with_report(cj, reroll=True, autotune="time", target="cpu")
    assert _scans(res.jaxpr) == 1 and res.report.stats["reroll.lengths"] == [4]
    # a second rewrite (or a fresh process) reads the choice: nothing compiled
    before = _autotune.COMPILES
    again = rewrite_jaxpr_with_report(cj, reroll=True, autotune="time", target="cpu")
    assert _autotune.COMPILES == before and _scans(again.jaxpr) == 1
    assert any(c.startswith("autotune (cached)") for c in again.report.stats["autotune.choices"])


def test_reroll_not_measured_without_time_mode(cache_dir):
    before = _autotune.COMPILES
    res = rewrite_jaxpr_with_report(jax.make_jaxpr(_chain)(WS, XS), reroll=True, autotune=True,
                                    target="cpu")
    assert _autotune.COMPILES == before and _scans(res.jaxpr) == 1


@cpu_compiler
def test_reroll_with_an_open_ended_loop_decided_by_compile_time_alone(cache_dir, monkeypatch):
    """A program with a loop whose trips depend on the data is not run on zeros (it might not
    end there): compile time alone decides."""
    from jaxrewrite.backend import cost as _cost
    monkeypatch.setitem(_cost.REROLL_TIMED, "cpu", (float("inf"), 0.0))   # any run would lose

    def f(ws, x):
        x = jax.lax.while_loop(lambda c: c.sum() < 100.0, lambda c: c * 2.0 + 1.0, x)
        return _chain(ws, x)
    res = rewrite_jaxpr_with_report(jax.make_jaxpr(f)(WS, XS), reroll=True, autotune="time",
                                    target="cpu")
    assert _scans(res.jaxpr) == 1
    (rec,) = _entries(cache_dir).values()
    assert rec["split"] is True and rec["run_s"] == [None, None]
    assert "run not measured" in rec["why"]
