"""No crash, ever (issue 38): whatever a pass gets wrong, the user's program runs as written.

Every pass is broken in turn (`jaxrewrite.testing.inject_fault`: a wrong shape, a wrong dtype, a
dropped or duplicated variable, an invalid parameter, an exception), and the program must still
return `jax.jit`'s result bit for bit, with one warning, under `optimize` and under the switch.
What catches each fault: the bindings check after each pass that changed the program (a later
pass that rebuilds by renaming would make a well-formed wrong program of a variable bound twice:
scalarize on the TPU's row), the pipeline's final check (signature, bindings), the lowering
guard (a program that fails to lower or compile: it is made again without the last pass that
changed it, then the one before, then the original runs), or the pass's own exception. A
lowering or compile failure injected into one pass (`inject_lowering_failure`) costs that
pass's gain only.
"""
import os
import sys
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import jaxrewrite
from jaxrewrite import _pipeline
from jaxrewrite._options import Options
from jaxrewrite import _compat as C
from jaxrewrite.testing import (FAULTS, assert_bitwise_equal, inject_fault,
                                inject_lowering_failure, primitive_counts)

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bench"))
import blake2s as B  # noqa: E402  (bench/blake2s.py: BLAKE2s written plainly from RFC 7693)
import seed as S  # noqa: E402

PASSES = tuple(spec.name for spec in _pipeline.PASSES)
OPTIONS = dict(reroll=True)   # every pass of the pipeline runs (reroll and rounds included)


def _seed_program():
    fn = S.rounds_program(S.col_mix, S.perm_take)
    ms = jnp.asarray(np.random.default_rng(1).integers(0, 2**32, (64, 4, 4), dtype=np.uint32))
    return fn, (ms,)


def _blake2s_program(n=64):
    words, lengths, _ = B.messages(n)
    return B.hash_all, (jnp.asarray(words), jnp.asarray(lengths))


def _jaxrewrite_warnings(record):
    return [w for w in record if "jaxrewrite" in str(w.message)]


def _run(mode, fn, args):
    """`fn` through `optimize` or the switch, a fresh function each time (nothing cached)."""
    fresh = lambda *a: fn(*a)  # noqa: E731
    if mode == "optimize":
        return jaxrewrite.optimize(fresh, **OPTIONS)(*args)
    with jaxrewrite.enabled(**OPTIONS):
        return jax.jit(fresh)(*args)


def _check_contained(program, pass_name, kind, mode):
    fn, args = program()
    expected = jax.jit(fn)(*args)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        with inject_fault(pass_name, kind):
            got = _run(mode, fn, args)
    assert_bitwise_equal(got, expected)
    said = _jaxrewrite_warnings(record)
    report = jaxrewrite.last_report()
    if not said:
        # the damage never reached the program: only an enabling pass (fold, literals) changed
        # it, and the pipeline returned the program as it came
        assert report is not None and report.counts.get("pipeline.enabling_dropped"), (
            f"{pass_name}/{kind}/{mode}: no warning, and the damage was not discarded")
    else:
        assert len(said) == 1, [str(w.message) for w in said]
        text = str(said[0].message)
        if "running the program the other passes made" in text:
            # it failed to lower or compile, and ran without the passes it names: the damaged
            # one among them
            assert f"'{pass_name}'" in text.rsplit("); ", 1)[-1], text
        else:
            assert "running the original program" in text
            # it names the pass that failed, or the last one to change the program
            assert any(f"'{p}'" in text for p in PASSES), text


@pytest.mark.parametrize("mode", ["optimize", "switch"])
@pytest.mark.parametrize("kind", FAULTS)
@pytest.mark.parametrize("pass_name", PASSES)
def test_every_fault_of_every_pass_runs_the_program_as_written(pass_name, kind, mode):
    _check_contained(_seed_program, pass_name, kind, mode)


@pytest.mark.slow
@pytest.mark.parametrize("kind", FAULTS)
@pytest.mark.parametrize("pass_name", PASSES)
def test_every_fault_of_every_pass_on_blake2s(pass_name, kind):
    """(under `optimize`: the switch's path is the seed program's above)"""
    _check_contained(_blake2s_program, pass_name, kind, "optimize")


# --- a lowering failure in one pass costs that pass's gain only (issue 44) ----------------------

def _traced(mode, fn, args):
    """(`fn` traced through `optimize` or the switch, fresh; its result, lowered and compiled
    ahead of time)."""
    fresh = lambda *a: fn(*a)  # noqa: E731
    if mode == "optimize":
        traced = jaxrewrite.optimize(fresh, **OPTIONS).trace(*args)
        return traced, traced.lower().compile()(*args)
    with jaxrewrite.enabled(**OPTIONS):
        traced = jax.jit(fresh).trace(*args)
        return traced, traced.lower().compile()(*args)


@pytest.mark.parametrize("stage", ["lowered", "compiled"])
@pytest.mark.parametrize("pass_name", PASSES)
def test_a_lowering_failure_in_any_pass_runs_with_one_warning(pass_name, stage):
    """Whichever pass emits what cannot be lowered (compiled): `jax.jit`'s result, one
    warning; where that pass was the last to change the program, only it is dropped."""
    fn, args = _seed_program()
    expected = jax.jit(fn)(*args)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        with inject_lowering_failure(pass_name, stage):
            traced, got = _traced("optimize", fn, args)
    assert_bitwise_equal(got, expected)
    said = _jaxrewrite_warnings(record)
    assert len(said) == 1, [str(w.message) for w in said]
    text = str(said[0].message)
    assert f"could not be {stage}" in text, text
    changed_by = jaxrewrite.last_report().stats["changed_by"]
    if changed_by[-1] == pass_name:
        assert text.endswith(f"dropped pass '{pass_name}', running the program the other "
                             f"passes made"), text
    elif "running the program the other passes made" in text:
        assert f"'{pass_name}'" in text.rsplit("); ", 1)[-1], text
    else:  # more passes changed it after this one than are dropped: the original program ran
        assert "running the original program" in text, text


@pytest.mark.parametrize("mode", ["optimize", "switch"])
@pytest.mark.parametrize("stage", ["lowered", "compiled"])
def test_a_lowering_failure_injected_into_the_last_pass_keeps_the_others_rewrites(stage, mode):
    """The issue's case: the kernel pass emits what Mosaic cannot lower. What runs is what the
    other passes made (the seed's rounds rolled into a scan), bit for bit `jax.jit`'s result."""
    fn, args = _seed_program()
    expected = jax.jit(fn)(*args)
    original = jax.make_jaxpr(fn)(*args)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        with inject_lowering_failure("kernel", stage):
            traced, got = _traced(mode, fn, args)
    assert_bitwise_equal(got, expected)
    said = _jaxrewrite_warnings(record)
    assert len(said) == 1, [str(w.message) for w in said]
    assert str(said[0].message).endswith(
        "dropped pass 'kernel', running the program the other passes made"), said[0].message
    ran = C.lowered_instead(traced.jaxpr)
    assert ran is not None
    others = _pipeline.rewrite(original, Options.make(**OPTIONS), without={"kernel"}).jaxpr
    assert primitive_counts(ran) == primitive_counts(others)
    # the chain of jitted rounds that reroll made one scan is still one scan
    before, after = primitive_counts(original), primitive_counts(ran)
    assert "scan" not in before and after["scan"] == 1 and after["jit"] < before["jit"]
    report = jaxrewrite.last_report()
    assert report.stats["fallback"] == {"dropped": ["kernel"], "original": False}
    assert any("dropped pass 'kernel'" in e for e in report.errors)


# --- the final check, the lowering guard, and where they hold ------------------------------------

def f(x):
    return jnp.sin(x)[::-1] * 2 + jax.jit(lambda y: y + 1)(x)


def _bad_broadcast(cj, ctx):
    """A pass that emits the broadcast the literals pass emitted before 0.2.0: a (1,) operand
    with `broadcast_dimensions=()` (well formed as a jaxpr, rejected by MLIR's verifier)."""
    from jaxrewrite import _compat as C
    j = cj.jaxpr
    out = j.outvars[0]
    core = C.literal(np.ones((1,), out.aval.dtype))
    new = C.new_var(out.aval)
    b = C.new_eqn([core], [new], lax.broadcast_in_dim_p,
                  dict(shape=tuple(out.aval.shape), broadcast_dimensions=(), sharding=None))
    add = C.new_eqn([out, new], [C.new_var(out.aval)], lax.add_p, {})
    return C.closed(j.replace(eqns=[*j.eqns, b, add], outvars=[add.outvars[0], *j.outvars[1:]]),
                    cj.consts), True


BAD = _pipeline.PassSpec("bad_broadcast", "dedup", False)


@pytest.fixture
def with_bad_pass(monkeypatch):
    real = _pipeline.enabled_passes
    monkeypatch.setattr(_pipeline, "enabled_passes",
                        lambda options, extra=(): real(options, tuple(extra) + ((BAD, _bad_broadcast),)))


def _one_warning(record, what="could not be lowered"):
    said = _jaxrewrite_warnings(record)
    assert len(said) == 1 and what in str(said[0].message), [str(w.message) for w in said]
    assert "bad_broadcast" in str(said[0].message)


def test_a_program_that_fails_to_lower_runs_as_written(with_bad_pass):
    x = jnp.arange(8.0)
    expected = jax.jit(f)(x)
    with pytest.warns(RuntimeWarning) as record:
        got = jaxrewrite.optimize(lambda v: f(v))(x)
    _one_warning(record)
    assert_bitwise_equal(got, expected)
    # the replacement is remembered: no second warning for the same program
    g = jaxrewrite.optimize(lambda v: f(v))
    with pytest.warns(RuntimeWarning):
        g(x)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert_bitwise_equal(g.lower(x).compile()(x), expected)


def test_aot_lower_switch_and_explain_fall_back_too(with_bad_pass):
    x = jnp.arange(8.0)
    expected = jax.jit(f)(x)
    with pytest.warns(RuntimeWarning) as record:
        compiled = jaxrewrite.optimize(lambda v: f(v)).trace(x).lower().compile()
    _one_warning(record)
    assert_bitwise_equal(compiled(x), expected)
    with pytest.warns(RuntimeWarning) as record, jaxrewrite.enabled():
        got = jax.jit(lambda v: f(v))(x)
    _one_warning(record)
    assert_bitwise_equal(got, expected)
    with pytest.warns(RuntimeWarning) as record:
        e = jaxrewrite.explain(lambda v: f(v))(x)
    _one_warning(record)
    assert any("could not be lowered" in err for err in e.errors)


def test_a_rewritten_program_inside_another_jit_falls_back_where_it_sits(with_bad_pass):
    x = jnp.arange(8.0)
    inner = jaxrewrite.optimize(lambda v: f(v))
    outer = jax.jit(lambda v: inner(v) * 3)
    with pytest.warns(RuntimeWarning) as record:
        got = outer(x)
    _one_warning(record)
    assert_bitwise_equal(got, jax.jit(lambda v: f(v) * 3)(x))


def test_strict_raises_the_lowering_error(with_bad_pass):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(ValueError, match="broadcast_dimensions"):
            jaxrewrite.optimize(lambda v: f(v), strict=True)(jnp.arange(8.0))


def test_make_jaxpr_type_checks_what_it_returns(with_bad_pass):
    x = jnp.arange(8.0)
    with pytest.warns(RuntimeWarning, match="final check") as record:
        cj = jaxrewrite.make_jaxpr(f)(x)
    assert len(_jaxrewrite_warnings(record)) == 1
    assert "broadcast_in_dim" not in primitive_counts(cj)        # the program as traced


def _wrong_shape(cj, ctx):
    j = cj.jaxpr
    return C_closed(j.replace(outvars=[j.invars[1], *j.outvars[1:]]), cj.consts), True


def C_closed(j, consts):
    from jaxrewrite import _compat as C
    return C.closed(j, consts)


def test_final_check_catches_a_changed_signature():
    def g(x, y):
        return x * 2, y
    args = (jnp.arange(3.0), jnp.arange(4, dtype=jnp.int32))
    cj = jax.make_jaxpr(g)(*args)
    spec = _pipeline.PassSpec("wrong_shape", "dedup", False)
    with pytest.warns(RuntimeWarning, match="final check.*output 0.*wrong_shape"):
        res = _pipeline.rewrite(cj, Options.make(), extra_passes=((spec, _wrong_shape),))
    assert res.fell_back and res.jaxpr is cj
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(_pipeline.PassError, match="final check"):
            _pipeline.rewrite(cj, Options.make(strict=True), extra_passes=((spec, _wrong_shape),))


@pytest.mark.parametrize("kind", ["drop", "duplicate"])
def test_final_check_catches_unbound_and_twice_bound_variables(kind):
    from jaxrewrite import _walk
    from jaxrewrite.testing import _damage
    cj = jax.make_jaxpr(lambda x: jnp.sin(x) * 2 + 1)(jnp.arange(3.0))
    assert _walk.binding_error(cj) is None
    bad = _damage(cj, kind)
    assert _walk.binding_error(bad) is not None
    # nested levels are checked too
    outer = jax.make_jaxpr(lambda x: jax.jit(lambda y: jnp.sin(y) * 2 + 1)(x))(jnp.arange(3.0))
    eqn = outer.jaxpr.eqns[0]
    inner = eqn.params["jaxpr"]
    broken = outer.jaxpr.replace(eqns=[eqn.replace(params={**eqn.params,
                                                           "jaxpr": _damage(inner, kind)})])
    assert _walk.binding_error(C_closed(broken, outer.consts)) is not None
