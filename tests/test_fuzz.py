"""Program fuzzing: random programs through `optimize`, every rewrite option on and off.

Each drawn program (`jaxrewrite.strategies.programs`) must give `jax.jit`'s result by the
foundation rule (`assert_equivalent`: bits forward, values for gradients, vmap too), with
`strict=True` (a pass that raises is a failure here, not a silent fallback) and `debug_checks`
(every pass's output is type-checked). The options come from `jaxrewrite.OPTIONS` at run time,
so passes added later are fuzzed without editing this file.

Budget: the default run is derandomized and small (about a minute on 2 cores). The long run is
time-bounded: `JAXREWRITE_FUZZ_SECONDS=600 pytest -m slow tests/test_fuzz.py` (.ci/run).
Every bug found here becomes a named test in tests/test_regressions.py.
"""
import os
import time
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, given, settings

import jaxrewrite
from jaxrewrite import strategies as S
from jaxrewrite.testing import assert_equivalent, primitive_counts

# When an example fails, hypothesis's pytest plugin imports `hypothesis.extra._patching`, whose
# libcst import warns (DeprecationWarning from mypy_extensions); with warnings as errors that
# becomes an INTERNALERROR that hides the failing program. Import it once here, warnings off.
with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    try:
        import hypothesis.extra._patching  # noqa: F401
    except ImportError:
        pass

_CHECKS = dict(strict=True, debug_checks=True)
_SUPPRESS = [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much]
# Hypothesis's `explain` phase imports a module that warns (DeprecationWarning), which pytest's
# warnings-as-errors turns into an INTERNALERROR hiding the failing example: skip that phase.
_PHASES = [Phase.explicit, Phase.reuse, Phase.generate, Phase.shrink]
# (counts capped by the loaded profile's: `HYPOTHESIS_PROFILE=tpu` draws fewer, tests/conftest.py)
_CAP = settings.default.max_examples
_FAST = settings(max_examples=min(12, _CAP), deadline=None, derandomize=True, database=None,
                 suppress_health_check=_SUPPRESS, phases=_PHASES)


# Gradients: the house rule is equality by value. Rewrites that change how often a value is
# used change the order its cotangents are summed in, which moves float gradients by an ulp
# (tests/test_regressions.py pins the known cases as strict xfails). By default the fuzzer
# allows that (at most `_GRAD_ULPS` ulps) so it keeps finding other bugs; set
# JAXREWRITE_FUZZ_EXACT_GRADS=1 to demand exact gradients.
_GRAD_ULPS = 0 if os.environ.get("JAXREWRITE_FUZZ_EXACT_GRADS") else 4


def _grads(f, args):
    out, pull = jax.vjp(f, *args)
    ct = jax.tree_util.tree_map(
        lambda y: jnp.ones_like(y) if jnp.issubdtype(y.dtype, jnp.inexact)
        else np.zeros(np.shape(y), jax.dtypes.float0), out)
    return pull(ct)


def _check(prog, options):
    fn, args = prog.fn, prog.args
    rtol = 1e-5 if options.get("reroll") else None  # re-rolling's documented tolerance
    if _GRAD_ULPS == 0:
        assert_equivalent(fn, *args, rtol=rtol, **options, **_CHECKS, bitwise=True)
        return
    # forward bits, vmap bits, check_jaxpr; then gradients within a few ulps
    assert_equivalent(fn, *args, rtol=rtol, grad=False, **options, **_CHECKS, bitwise=True)
    try:
        want = _grads(jax.jit(fn), args)
    except Exception:  # noqa: BLE001 - not differentiable (a while loop): nothing to compare
        return
    got = _grads(jaxrewrite.optimize(fn, **options, **_CHECKS), args)
    for g, w in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)):
        g, w = np.asarray(g), np.asarray(w)
        assert g.shape == w.shape and g.dtype == w.dtype
        if w.dtype == jax.dtypes.float0:
            continue
        if rtol is not None:
            np.testing.assert_allclose(g, w, rtol=rtol, atol=rtol)
        else:
            np.testing.assert_array_max_ulp(g, w, maxulp=_GRAD_ULPS)


def test_rewrite_options_are_discovered():
    values = S.rewrite_option_values()
    names = {n for n, _, _ in jaxrewrite.OPTIONS}
    assert {"dedup", "cse", "fold", "gathers"} <= set(values) <= names
    for name, vals in values.items():
        assert len(vals) >= 2, name


@settings(_FAST, max_examples=min(20, _CAP))
@given(prog=S.programs(max_ops=12), options=S.option_sets())
def test_fuzz_programs_equal_jax_jit(prog, options):
    _check(prog, options)


@settings(_FAST, max_examples=min(5, _CAP))
@given(prog=S.programs(max_ops=6, names=list(S.MOVEMENT) + ["add", "mul", "neg"], depth=0))
def test_fuzz_data_movement_every_option(prog):
    """Data movement and indexing (what the gather/movement passes see), each option toggled:
    the full rule with the defaults, forward bits and well-typed jaxprs for every toggle."""
    _check(prog, {})
    for name, vals in S.rewrite_option_values().items():
        for v in vals[1:]:
            assert_equivalent(prog.fn, *prog.args, grad=False, vmap=False, **{name: v}, **_CHECKS, bitwise=True)


@settings(max_examples=min(6, _CAP), deadline=None, derandomize=True, database=None,
          suppress_health_check=_SUPPRESS, phases=_PHASES)
@given(prog=S.programs(max_ops=10, depth=1))
def test_fuzz_rewrite_is_idempotent(prog):
    cj = jax.make_jaxpr(prog.fn)(*prog.args)
    once = jaxrewrite.rewrite_jaxpr(cj, **_CHECKS)
    twice = jaxrewrite.rewrite_jaxpr(once, **_CHECKS)
    assert primitive_counts(twice) == primitive_counts(once)


# --- the long, time-bounded run (.ci/run's extended step) ---------------------------------------

_SECONDS = float(os.environ.get("JAXREWRITE_FUZZ_SECONDS", "0") or 0)


@pytest.mark.slow
@pytest.mark.skipif(_SECONDS <= 0, reason="set JAXREWRITE_FUZZ_SECONDS for the long fuzz run")
def test_fuzz_long_time_bounded():
    """Batches of fresh random examples (deeper, longer programs) until the time is spent."""
    deadline = time.monotonic() + _SECONDS
    seen = {"n": 0}

    @settings(max_examples=10, deadline=None, database=None, derandomize=False,
              suppress_health_check=_SUPPRESS, phases=_PHASES)
    @given(prog=S.programs(max_ops=20, depth=2), options=S.option_sets())
    def batch(prog, options):
        seen["n"] += 1
        _check(prog, options)

    while time.monotonic() < deadline:
        batch()
    assert seen["n"] > 0
