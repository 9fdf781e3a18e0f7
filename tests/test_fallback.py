"""Failure containment: a pass that raises never breaks the user's program.

A deliberately broken test pass is appended to the pipeline (through `extra_passes`, or by
patching `enabled_passes` for `optimize`). The original program runs, with exactly one warning
naming the pass and the error; `strict=True` re-raises the pass's own exception.

A pass whose program fails to lower or compile (`inject_lowering_failure`) is dropped: what
the other passes made runs, with one warning naming the passes dropped (issue 44).
"""
import contextlib
import warnings

import jax
import jax.numpy as jnp
import pytest

import jaxrewrite
from jaxrewrite import _compat, _pipeline
from jaxrewrite._options import Options
from jaxrewrite.testing import (assert_bitwise_equal, inject_lowering_failure,
                                primitive_counts)

# The witness that the other passes' work survives a dropped pass is the gathers pass making
# `take`'s static reverse a `rev`: the CPU's row (the TPU's keeps a minor-axis reverse of 8 a
# gather, bench/tpu_costs.py), so the file decides as on the CPU on any host.
pytestmark = pytest.mark.default_target("cpu")


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


# --- a program that fails to lower or compile: the pass laid at it is dropped (issue 44) ---------
#
# JAX < 0.9 has no hook where lowering can be guarded: there, such a program raises as the
# program would (the declared floor's smoke run skips these with that reason).
needs_guard = pytest.mark.skipif(
    not _compat.has_lowering_guard(),
    reason="this JAX (< 0.9) has no lowering hook: a program that fails to lower raises")
#
# `inject_lowering_failure(pass, stage)` has a pass of the pipeline pass its first output through
# a primitive that JAX cannot lower (or XLA compile). The gathers pass makes `take`'s static
# indices a reverse: where a later pass fails, the program that runs still has no gather.

def h(x):
    return jnp.take(x, jnp.array([3, 2, 1, 0, 7, 6, 5, 4]), axis=0) * 2 + 1


X = jnp.arange(8.0)
ENDS = ("running the program the other passes made", "running the original program")


def _fresh():
    return lambda v: h(v)


def _one_warning(record, stage="lowered"):
    said = _jaxrewrite_warnings(record)
    assert len(said) == 1, [str(w.message) for w in said]
    text = str(said[0].message)
    assert f"could not be {stage} (" in text, text
    return text


def _ran(traced):
    """What was lowered in place of the jit's traced program (None: the program itself)."""
    from jaxrewrite import _compat as C
    return C.lowered_instead(traced.jaxpr)


def _the_others_program(ran):
    counts = primitive_counts(ran)
    assert "gather" not in counts and "rev" in counts, counts  # the gathers pass's form
    assert not any(p.startswith("jaxrewrite_fails") for p in counts), counts


@needs_guard
@pytest.mark.parametrize("stage", ["lowered", "compiled"])
def test_a_failing_last_pass_is_dropped_and_the_others_kept(stage):
    assert "gather" in primitive_counts(jax.make_jaxpr(h)(X))
    with pytest.warns(RuntimeWarning) as record, inject_lowering_failure("kernel", stage):
        g = jaxrewrite.optimize(_fresh())
        traced = g.trace(X)
        out = g(X)
        out2 = g(X)
    text = _one_warning(record, stage)
    assert text.endswith("); dropped pass 'kernel', running the program the other passes made")
    assert_bitwise_equal(out, jax.jit(h)(X))
    assert_bitwise_equal(out2, jax.jit(h)(X))
    _the_others_program(_ran(traced))
    report = jaxrewrite.last_report()
    assert report.stats["fallback"] == {"dropped": ["kernel"], "original": False}
    assert len(report.errors) == 1 and "dropped pass 'kernel'" in report.errors[0]


@needs_guard
def test_the_program_lowered_in_place_is_the_pipelines_without_that_pass():
    cj = jax.make_jaxpr(h)(X)
    with pytest.warns(RuntimeWarning), inject_lowering_failure("kernel"):
        traced = jaxrewrite.optimize(_fresh()).trace(X)
        traced.lower()
    without = _pipeline.rewrite(cj, Options.make(), without=frozenset({"kernel"}))
    assert without.report.stats["without"] == ["kernel"]
    assert primitive_counts(_ran(traced)) == primitive_counts(without.jaxpr)


@needs_guard
@pytest.mark.parametrize("stage", ["lowered", "compiled"])
def test_two_failing_passes_fall_back_twice(stage):
    with pytest.warns(RuntimeWarning) as record, inject_lowering_failure("kernel", stage), \
            inject_lowering_failure("literals", stage):
        traced = jaxrewrite.optimize(_fresh()).trace(X)
        out = traced.lower().compile()(X)
    text = _one_warning(record, stage)
    assert text.endswith("dropped passes 'literals', 'kernel', running the program the other "
                         "passes made"), text
    assert_bitwise_equal(out, jax.jit(h)(X))
    _the_others_program(_ran(traced))
    report = jaxrewrite.last_report()
    assert len(report.errors) == 2 and "without 'literals' could not be" in report.errors[1]


@needs_guard
def test_when_every_program_without_a_pass_fails_the_original_runs():
    """The failure is gathers': without literals it fails too; without gathers nothing else
    changes the program, so the original runs."""
    with pytest.warns(RuntimeWarning) as record, inject_lowering_failure("gathers"), \
            inject_lowering_failure("literals"):
        traced = jaxrewrite.optimize(_fresh()).trace(X)
        out = traced.lower().compile()(X)
    text = _one_warning(record)
    assert text.endswith("dropped pass 'literals', still failing; running the original program")
    assert_bitwise_equal(out, jax.jit(h)(X))
    assert primitive_counts(_ran(traced)) == primitive_counts(jax.make_jaxpr(h)(X))
    assert jaxrewrite.last_report().stats["fallback"] == {"dropped": ["literals"],
                                                          "original": True}


@needs_guard
def test_at_most_three_programs_are_made_again_then_the_original():
    with contextlib.ExitStack() as stack:
        record = stack.enter_context(pytest.warns(RuntimeWarning))
        for name in ("gathers", "tile", "kernel", "literals"):
            stack.enter_context(inject_lowering_failure(name))
        traced = jaxrewrite.optimize(_fresh()).trace(X)
        out = traced.lower().compile()(X)
    text = _one_warning(record)
    assert text.endswith("dropped passes 'literals', 'kernel', 'tile', still failing; running "
                         "the original program"), text
    assert_bitwise_equal(out, jax.jit(h)(X))
    assert primitive_counts(_ran(traced)) == primitive_counts(jax.make_jaxpr(h)(X))
    assert len(jaxrewrite.last_report().errors) == 4


@pytest.mark.parametrize("stage", ["lowered", "compiled"])
def test_strict_raises_the_first_error(stage):
    error = NotImplementedError if stage == "lowered" else jax.errors.JaxRuntimeError
    with warnings.catch_warnings(), inject_lowering_failure("kernel", stage):
        warnings.simplefilter("error")
        with pytest.raises(error, match="jaxrewrite_fails_to_be_lowered|jaxrewrite_no_such"):
            jaxrewrite.optimize(_fresh(), strict=True)(X)


@needs_guard
def test_aot_lower_alone_warns_once_and_lowers_the_others_program():
    with pytest.warns(RuntimeWarning) as record, inject_lowering_failure("kernel"):
        traced = jaxrewrite.optimize(_fresh()).trace(X)
        lowered = traced.lower()
    _one_warning(record)
    _the_others_program(_ran(traced))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # lowered once: no second warning, no second fallback
        assert_bitwise_equal(lowered.compile()(X), jax.jit(h)(X))
        traced.lower()


@needs_guard
@pytest.mark.parametrize("stage", ["lowered", "compiled"])
def test_the_switch_drops_the_pass_too(stage):
    with pytest.warns(RuntimeWarning) as record, inject_lowering_failure("kernel", stage), \
            jaxrewrite.enabled():
        f_ = jax.jit(_fresh())
        traced = f_.trace(X)
        out = f_(X)
    assert "dropped pass 'kernel'" in _one_warning(record, stage)
    assert_bitwise_equal(out, jax.jit(h)(X))
    _the_others_program(_ran(traced))


@needs_guard
def test_explain_shows_the_dropped_pass():
    with pytest.warns(RuntimeWarning) as record, inject_lowering_failure("kernel"):
        e = jaxrewrite.explain(_fresh(), gpu_target=None)(X)
    _one_warning(record)
    assert any("dropped pass 'kernel'" in err for err in e.errors)
    assert any("without 'kernel'" in n for n in e.notes), e.notes
    _the_others_program(e.jaxpr)  # the program that ran
    assert "dropped pass 'kernel'" in str(e)


@needs_guard
def test_a_rewritten_program_inside_another_jit_drops_the_pass_where_it_sits():
    inner = jaxrewrite.optimize(_fresh())
    with pytest.warns(RuntimeWarning) as record, inject_lowering_failure("kernel"):
        outer = jax.jit(lambda v: inner(v) * 3)
        traced = outer.trace(X)
        out = outer(X)
    assert "dropped pass 'kernel'" in _one_warning(record)
    assert_bitwise_equal(out, jax.jit(lambda v: h(v) * 3)(X))
    _the_others_program(_ran(traced))


def test_a_program_that_cannot_be_staged_drops_the_pass_too(monkeypatch):
    from jaxrewrite import _compat as C
    real = C.eval_jaxpr
    failing = C.failing_identity("lowered")

    def eval_jaxpr(cj, *args):
        if failing.name in primitive_counts(cj):
            raise TypeError("injected: cannot be staged")
        return real(cj, *args)

    monkeypatch.setattr(C, "eval_jaxpr", eval_jaxpr)
    with pytest.warns(RuntimeWarning) as record, inject_lowering_failure("kernel"):
        traced = jaxrewrite.optimize(_fresh()).trace(X)
        out = traced.lower().compile()(X)
    text = _one_warning(record, "staged")
    assert text.endswith("dropped pass 'kernel', running the program the other passes made")
    assert_bitwise_equal(out, jax.jit(h)(X))
    assert _ran(traced) is None  # staged without it: nothing failed to lower
    _the_others_program(traced.jaxpr)


def test_rewrite_without_leaves_the_passes_out():
    cj = jax.make_jaxpr(h)(X)
    res = _pipeline.rewrite(cj, Options.make(), without=frozenset({"gathers"}))
    assert "gather" in primitive_counts(res.jaxpr) and "gathers" not in res.report.stats[
        "changed_by"]
    assert res.report.stats["without"] == ["gathers"]


def test_a_pass_of_then_that_is_left_out_is_passed_over():
    """reroll's `then` (flatten, scalarize) with flatten off: reroll's change is kept."""
    def rounds(x):
        for _ in range(4):
            x = jax.jit(lambda y: jnp.sin(y) * 2)(x)
        return x
    x = jnp.arange(3.0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        cj = jaxrewrite.make_jaxpr(rounds, reroll=True, flatten=False)(x)
        res = _pipeline.rewrite(jax.make_jaxpr(rounds)(x), Options.make(reroll=True),
                                without=frozenset({"flatten"}))
    assert "scan" in primitive_counts(cj) and "scan" in primitive_counts(res.jaxpr)


@needs_guard
def test_a_program_that_lowered_in_place_then_fails_to_compile_warns_no_more():
    """literals' program cannot be lowered; without it, kernel's cannot be compiled: one
    warning (the first failure's), both failures in the report."""
    with pytest.warns(RuntimeWarning) as record, inject_lowering_failure("kernel", "compiled"), \
            inject_lowering_failure("literals", "lowered"):
        traced = jaxrewrite.optimize(_fresh()).trace(X)
        out = traced.lower().compile()(X)
    assert "dropped pass 'literals'" in _one_warning(record, "lowered")
    assert_bitwise_equal(out, jax.jit(h)(X))
    _the_others_program(_ran(traced))
    report = jaxrewrite.last_report()
    assert report.stats["fallback"] == {"dropped": ["literals", "kernel"], "original": False}
    assert "could not be compiled either" in report.errors[1]


# --- which pass a failure is laid at ----------------------------------------------------------

def test_a_failure_in_a_kernel_is_laid_at_the_pass_that_emits_kernels():
    by = ("fold", "flatten", "kernel", "literals")
    assert _pipeline.laid_at(by, in_kernel=True) == "kernel"
    assert _pipeline.laid_at(by, in_kernel=False) == "literals"
    assert _pipeline.laid_at(("fold", "literals"), in_kernel=True) == "literals"
    assert _pipeline.laid_at((), in_kernel=True) is None


@needs_guard
@pytest.mark.skipif(jax.default_backend() == "tpu",
                    reason="Mosaic lowers the kernel on a TPU: the failure is the CPU's")
def test_a_kernel_that_cannot_be_lowered_is_dropped_before_the_pass_after_it():
    """The seed author's ChaCha20 beside a repeated table: the kernel pass makes the rounds a
    kernel emitted for Mosaic, then 'literals' makes the table a broadcast. Here (no TPU) Pallas
    refuses to lower the kernel; the failure is the kernel's, so 'kernel' is dropped first and
    the program that runs keeps the literals pass's broadcast: one program made again, not two."""
    import os
    import sys
    import numpy as np
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "bench"))
    import author_chacha
    import permutations
    from jaxrewrite.backend import mosaic

    blk = jax.vmap(author_chacha.fresh_copy().block)
    x = permutations._blocks(4096)
    table = np.tile(np.arange(16, dtype=np.uint32), (4096, 1)).reshape(4096, 4, 4)

    def f(x):
        return blk(x), x + table

    with mosaic.emit_for("tpu"), pytest.warns(RuntimeWarning) as record:
        g = jaxrewrite.optimize(f, target="tpu", kernel=True)
        traced = g.trace(x)
        out = g(x)
    text = _one_warning(record)
    assert "dropped pass 'kernel', running the program the other passes made" in text, text
    report = jaxrewrite.last_report()
    assert report.stats["changed_by"][-2:] == ["kernel", "literals"]
    assert report.stats["fallback"] == {"dropped": ["kernel"], "original": False}
    counts = primitive_counts(_ran(traced))
    assert "pallas_call" not in counts and "broadcast_in_dim" in counts, counts
    assert_bitwise_equal(out, jax.jit(f)(x))
