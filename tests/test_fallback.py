"""Failure containment: a pass that raises never breaks the user's program.

A deliberately broken test pass is appended to the pipeline (through `extra_passes`, or by
patching `enabled_passes` for `optimize`). The original program runs, with exactly one warning
naming the pass and the error; `strict=True` re-raises the pass's own exception.
"""
import warnings

import jax
import jax.numpy as jnp
import pytest

import jaxrewrite
from jaxrewrite import _pipeline
from jaxrewrite._options import Options
from jaxrewrite.testing import assert_bitwise_equal, primitive_counts


class Boom(ValueError):
    pass


BROKEN = _pipeline.PassSpec("broken_for_test", "dedup", True)


def broken(cj, ctx):
    raise Boom("deliberately broken")


def renaming_then_broken(cj, ctx):
    """Changes nothing the first time, raises the second: the error may come late."""
    ctx.report.count("broken_for_test.calls")
    if ctx.report.counts["broken_for_test.calls"] > 1:
        raise Boom("broken on round 2")
    return cj, True


def f(x):
    return jnp.sin(x)[::-1] * 2 + jax.jit(lambda y: y + 1)(x)


@pytest.fixture
def with_broken_pass(monkeypatch):
    orig = _pipeline.enabled_passes

    def patched(options, extra=()):
        return orig(options, tuple(extra) + ((BROKEN, broken),))

    monkeypatch.setattr(_pipeline, "enabled_passes", patched)


def _jaxrewrite_warnings(record):
    return [w for w in record if "jaxrewrite" in str(w.message)]


def test_rewrite_falls_back_with_one_warning_naming_the_pass():
    cj = jax.make_jaxpr(f)(jnp.arange(3.0))
    with pytest.warns(RuntimeWarning) as record:
        res = _pipeline.rewrite(cj, Options.make(), extra_passes=((BROKEN, broken),))
    msgs = _jaxrewrite_warnings(record)
    assert len(msgs) == 1
    assert "broken_for_test" in str(msgs[0].message) and "deliberately broken" in str(msgs[0].message)
    assert res.fell_back and not res.changed
    assert res.jaxpr is cj  # the original program, untouched
    assert res.report.errors and "broken_for_test" in res.report.errors[0]


def test_late_failure_discards_earlier_rounds():
    cj = jax.make_jaxpr(f)(jnp.arange(3.0))
    with pytest.warns(RuntimeWarning, match="broken on round 2"):
        res = _pipeline.rewrite(cj, Options.make(), extra_passes=((BROKEN, renaming_then_broken),))
    assert res.fell_back and res.jaxpr is cj


def test_strict_reraises_the_pass_error():
    cj = jax.make_jaxpr(f)(jnp.arange(3.0))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # and no warning on the way
        with pytest.raises(Boom, match="deliberately broken"):
            _pipeline.rewrite(cj, Options.make(strict=True), extra_passes=((BROKEN, broken),))


def test_optimize_runs_the_original_program_with_one_warning(with_broken_pass):
    g = jaxrewrite.optimize(f)
    x = jnp.arange(3.0)
    with pytest.warns(RuntimeWarning) as record:
        out = g(x)
        out2 = g(x)  # cached: no second trace, no second warning
    msgs = _jaxrewrite_warnings(record)
    assert len(msgs) == 1, [str(m.message) for m in msgs]
    assert "broken_for_test" in str(msgs[0].message)
    assert_bitwise_equal(out, jax.jit(f)(x))
    assert_bitwise_equal(out2, jax.jit(f)(x))
    report = jaxrewrite.last_report()
    assert report is not None and report.errors


def test_optimize_fallback_program_is_the_original(with_broken_pass):
    x = jnp.arange(3.0)
    with pytest.warns(RuntimeWarning, match="broken_for_test"):
        traced = jaxrewrite.optimize(f, cse=False).trace(x)
    assert primitive_counts(traced.jaxpr) == primitive_counts(jax.jit(f).trace(x).jaxpr)


def test_optimize_strict_raises(with_broken_pass):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(Boom, match="deliberately broken"):
            jaxrewrite.optimize(f, strict=True)(jnp.arange(3.0))


def test_grad_of_fallback_is_jax_jits(with_broken_pass):
    x = jnp.arange(3.0)
    with pytest.warns(RuntimeWarning, match="broken_for_test"):
        got = jax.grad(lambda v: jaxrewrite.optimize(f, fold=False)(v).sum())(x)
    assert_bitwise_equal(got, jax.grad(lambda v: jax.jit(f)(v).sum())(x))


def test_a_pass_returning_an_ill_typed_jaxpr_is_caught_under_debug_checks():
    def ill_typed(cj, ctx):
        eqn = cj.jaxpr.eqns[0]
        bad = eqn.replace(invars=list(eqn.invars)[:1])  # drops an operand of a binary op
        return cj.replace(jaxpr=cj.jaxpr.replace(eqns=[bad, *cj.jaxpr.eqns[1:]])), True

    cj = jax.make_jaxpr(lambda x, y: x * y + 1)(1.0, 2.0)
    with pytest.warns(RuntimeWarning, match="broken_for_test"):
        res = _pipeline.rewrite(cj, Options.make(debug_checks=True),
                                extra_passes=((BROKEN, ill_typed),))
    assert res.fell_back and res.jaxpr is cj
