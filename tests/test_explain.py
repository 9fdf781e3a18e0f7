"""`explain()` and `JAXREWRITE_LOG`: the figures are there, plausible, and point at the user's line.

The rewrite-location checks use a small test pass (`sin` -> `cos`, recorded in the report like
every pass records its rewrites), so they do not depend on which passes exist yet; where a real
pass is installed (dedup, gathers) it is checked too.
"""
import importlib.util
import inspect
import json
import logging
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import jaxrewrite
from jaxrewrite import _compat as C
from jaxrewrite.report import log as _log
from jaxrewrite import _pipeline
from jaxrewrite import _walk as W
from jaxrewrite._explain import Explanation, count_fusions, explain

SIN2COS = _pipeline.PassSpec("sin2cos", "dedup", True)


def sin2cos(cj, ctx):
    """Test pass: sin(x) -> cos(x) at every level, recorded with `report.applied`."""
    changed = []

    def rule(eqn):
        if eqn.primitive is not lax.sin_p:
            return None
        em = W.Emitter(eqn)
        (y,) = em.call(jnp.cos, eqn.invars[0])
        ctx.report.applied("sin2cos", eqn, em.eqns)
        return em.replacement([y])

    def level(c):
        j, ch = W.rewrite_eqns(c.jaxpr, rule)
        changed.append(ch)
        return C.closed(j, c.consts) if ch else c

    return W.map_jaxprs(cj, level), any(changed)


@pytest.fixture
def with_sin2cos(monkeypatch):
    """Every pipeline run (also inside `optimize`) ends with the test pass."""
    orig = _pipeline.enabled_passes
    monkeypatch.setattr(_pipeline, "enabled_passes",
                        lambda options, extra=(): orig(options, extra) + [(SIN2COS, sin2cos)])


def _line_of(marker_fn) -> int:
    """The line in this file where `marker_fn`'s body calls `jnp.sin`."""
    src, start = inspect.getsourcelines(marker_fn)
    return start + next(i for i, s in enumerate(src) if "jnp.sin(" in s)


def program(x):
    y = x * 2.0
    for _ in range(3):
        y = jax.jit(lambda v: v + 1.0)(y)   # three fresh closures: three inner jaxprs
    return jnp.sin(y).sum()


def test_fields_present_and_plausible():
    x = jnp.arange(12.0).reshape(3, 4)
    e = explain(program)(x)
    assert isinstance(e, Explanation)
    assert e.name == "program" and e.shapes == "f32[3,4]" and e.backend == jax.default_backend()
    for k in ("trace", "rewrite", "restage", "lower", "compile", "total"):
        assert 0.0 <= e.timings[k] < 60.0, k
    for k in ("trace", "lower", "compile", "total"):
        assert 0.0 < e.baseline_timings[k] < 60.0, k
    assert e.timings["compile"] > 0.0 and e.timings["lower"] > 0.0
    assert e.timings["total"] >= e.timings["compile"] + e.timings["lower"]
    # the un-rewritten program: mul, 3 jit calls each holding an add, sin, reduce_sum
    assert e.eqns_before >= 8 and e.eqns_after >= 1
    assert e.jaxprs_before == 3
    assert e.functions_before is not None and e.functions_before >= 2
    assert e.fusions_before is not None and e.fusions_before >= 1
    assert e.fusions_after is not None and e.fusions_after >= 1
    assert e.kernels_after is None or e.kernels_after >= 1
    # the compiled program is the optimized one and computes what jax.jit computes
    np.testing.assert_array_equal(e.compiled(x), jax.jit(program)(x))
    d = e.to_dict()
    json.dumps(d)
    assert d["eqns_before"] == e.eqns_before and d["timings"] == e.timings
    text = str(e)
    for label in ("equations", "inner jaxprs", "compile ms", "jax.jit", "optimize"):
        assert label in text


def test_rewrite_listed_with_the_users_line(with_sin2cos):
    def f(x):
        a = x + 1.0
        return jnp.sin(a) * 3.0

    line = _line_of(f)
    e = explain(f, dedup=True)(jnp.ones((4,), jnp.float32))
    mine = [ev for ev in e.rewrites if ev.pass_name == "sin2cos"]
    assert len(mine) == 1
    assert mine[0].before == ("sin",) and mine[0].after == ("cos",)
    assert mine[0].location == f"{os.path.basename(__file__)}:{line}"
    assert e.counts["sin2cos.applied"] == 1
    assert "pass.sin2cos" in e.timings and e.timings["pass.sin2cos"] >= 0.0
    assert f"test_explain.py:{line}" in str(e)
    assert e.to_dict()["rewrites"][0]["location"].endswith(f":{line}")
    np.testing.assert_array_equal(e.compiled(jnp.ones(4)), jnp.cos(jnp.ones(4) + 1.0) * 3.0)


def test_rewrite_inside_nested_jit_keeps_the_line(with_sin2cos):
    def f(x):
        return jax.jit(lambda v: jnp.sin(v))(x) + 1.0

    line = _line_of(f)
    e = explain(f, baseline=False)(jnp.ones(3))
    locs = [ev.location for ev in e.rewrites if ev.pass_name == "sin2cos"]
    assert locs == [f"test_explain.py:{line}"]
    assert e.baseline_timings == {} and e.fusions_before is None


def test_static_args_and_kwargs():
    def f(x, n, *, scale):
        return x * n * scale

    e = explain(f, static_argnums=1)(jnp.ones(2), 3, scale=jnp.float32(2.0))
    assert e.shapes.startswith("f32[2]") and e.eqns_after >= 1
    np.testing.assert_array_equal(e.compiled(jnp.ones(2), scale=jnp.float32(2.0)), jnp.full(2, 6.0))


def test_bad_input():
    with pytest.raises(TypeError):
        explain(3)
    with pytest.raises(TypeError, match="rewrite option"):
        explain(lambda x: x, no_such_option=True)


@pytest.mark.skipif(importlib.util.find_spec("jaxrewrite.passes.dedup") is None,
                    reason="dedup pass not installed")
def test_dedup_shows_fewer_inner_jaxprs():
    e = explain(program)(jnp.ones((3, 4)))
    assert e.jaxprs_before == 3
    assert e.jaxprs_after < e.jaxprs_before
    assert any(ev.pass_name == "dedup" for ev in e.rewrites)


@pytest.mark.skipif(importlib.util.find_spec("jaxrewrite.passes.gathers") is None,
                    reason="gathers pass not installed")
def test_gather_rewrite_listed_with_its_line():
    idx = np.array([3, 2, 1, 0])

    def f(x):
        y = x * 2.0
        return y[idx] + 1.0   # a reverse, as a gather with static indices

    src, start = inspect.getsourcelines(f)
    line = start + next(i for i, s in enumerate(src) if "y[idx]" in s)
    # (the CPU's row: the TPU keeps a rev of more than 2 elements a gather, bench/tpu_costs.py)
    e = explain(f, baseline=False, target="cpu")(jnp.arange(4.0))
    gathers = [ev for ev in e.rewrites if ev.pass_name == "gathers"]
    assert gathers, (e.rewrites, e.declines)
    assert all(ev.location == f"test_explain.py:{line}" for ev in gathers)
    assert any("gather" in ev.before for ev in gathers)
    assert f"test_explain.py:{line}" in str(e)


def test_count_fusions_on_hlo_text():
    hlo = """HloModule m

%fused_computation (p: f32[3]) -> f32[3] {
  %p = f32[3]{0} parameter(0)
  %fusion.9 = f32[3]{0} fusion(f32[3]{0} %p), kind=kLoop, calls=%inner_body
  ROOT %m = f32[3]{0} multiply(%fusion.9, %fusion.9)
}

%inner_body (q: f32[3]) -> f32[3] {
  ROOT %q = f32[3]{0} parameter(0)
}

ENTRY %main (a: f32[3]) -> (f32[3], f32[3]) {
  %a = f32[3]{0} parameter(0)
  %fusion = f32[3]{0} fusion(f32[3]{0} %a), kind=kLoop, calls=%fused_computation
  %fusion.2 = (f32[3]{0}, f32[3]{0}) fusion(%fusion), kind=kLoop, calls=%fused_computation
  ROOT %t = (f32[3]{0}, f32[3]{0}) tuple(%fusion, %fusion)
}
"""
    assert count_fusions(hlo) == 2
    assert count_fusions("") == 0


# --- logging -------------------------------------------------------------------------------------

def _fresh_fn():
    def logged_fn(x):
        return jnp.cos(x) + 1.0
    return logged_fn


def _lines(caplog):
    return [r.getMessage() for r in caplog.records
            if r.name == "jaxrewrite" and "rewrites:" in r.getMessage()]


def test_log_line_under_env_var(monkeypatch, caplog):
    monkeypatch.setenv(_log.ENV, "1")
    caplog.set_level(logging.WARNING, logger="jaxrewrite")
    f = jaxrewrite.optimize(_fresh_fn())
    f(jnp.ones((2, 3)))
    f(jnp.ones((2, 3)))          # cached: no second line
    lines = _lines(caplog)
    assert len(lines) == 1, lines
    line = lines[0]
    assert line.startswith("jaxrewrite: logged_fn(f32[2,3]) rewrites:")
    for phase in ("trace", "rewrite", "jit_trace", "lower", "compile"):
        assert f" {phase} " in line, (phase, line)
    f(jnp.ones(5))               # new shape: a new line
    assert len(_lines(caplog)) == 2 and "logged_fn(f32[5])" in _lines(caplog)[1]


def test_log_line_names_applied_rewrites(monkeypatch, caplog, with_sin2cos):
    monkeypatch.setenv(_log.ENV, "1")
    caplog.set_level(logging.WARNING, logger="jaxrewrite")

    def with_sin(x):
        return jnp.sin(x)

    jaxrewrite.optimize(with_sin)(jnp.ones(3))
    (line,) = _lines(caplog)
    assert "rewrites: sin2cos 1" in line and " sin2cos " in line.split("| ms:")[1]


def test_silent_without_env_var(monkeypatch, caplog):
    monkeypatch.delenv(_log.ENV, raising=False)
    caplog.set_level(logging.DEBUG, logger="jaxrewrite")
    jaxrewrite.optimize(_fresh_fn())(jnp.ones(4))
    assert _lines(caplog) == []
    assert not [r for r in caplog.records if r.name == "jaxrewrite" and r.levelno >= logging.WARNING]
    monkeypatch.setenv(_log.ENV, "0")
    jaxrewrite.optimize(_fresh_fn())(jnp.ones(4))
    assert _lines(caplog) == []


def test_env_var_in_a_fresh_process():
    """The way a user runs it: no logging configured, the line reaches stderr."""
    code = ("import jax.numpy as jnp, jaxrewrite\n"
            "def step(x):\n    return x * 2\n"
            "jaxrewrite.optimize(step)(jnp.ones(3))\n")
    env = dict(os.environ, JAXREWRITE_LOG="1", JAX_PLATFORMS="cpu")
    on = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                        timeout=120)
    assert on.returncode == 0, on.stderr
    assert "jaxrewrite: step(f32[3]) rewrites:" in on.stderr and " compile " in on.stderr
    env.pop("JAXREWRITE_LOG")
    off = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=120)
    assert off.returncode == 0 and "jaxrewrite:" not in off.stderr
