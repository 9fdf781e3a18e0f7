"""XLA options a rewritten program asks for (`backend/compile_options.py`): a loop whose carry
was split on the CPU is compiled with region-based copy insertion, which drops the copy of each
carried piece at the top of every trip. The option reaches the outermost jit only (JAX rejects
options on a nested one), a user's own setting wins, and results stay bit for bit jax.jit's."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxrewrite
from jaxrewrite import _compat as C
from jaxrewrite import strategies as S
from jaxrewrite.backend import compile_options as CO
from jaxrewrite.backend import xla as X

pytestmark = [
    pytest.mark.skipif(jax.default_backend() != "cpu", reason="a CPU rule"),
    pytest.mark.default_target("cpu"),     # (XLA:CPU's option: the CPU's row, whatever the
                                           # JAXREWRITE_TEST_TARGET)
    pytest.mark.skipif(not C.has_jit_trace_hook(), reason="options reach the jit through its "
                       "trace hook (jax >= 0.9)"),
]

REGION = "xla_cpu_copy_insertion_use_region_analysis"


def _program():
    """A 16-word ARX state, 9 rounds in a fori_loop over 4,096 blocks: flatten splits its carry
    on the CPU (its words permuted every round)."""
    r = S.ArxRecipe(shape=(4, 4), rounds=9, batch=4096, seed=29, message=False, fanout=1,
                    quarter=False, undo=True, out="state", wrap="fori")
    return r.fn, r.args


def _copies(compiled) -> int:
    return X.launches(compiled).get("copy", 0)


def test_a_split_loop_is_compiled_without_a_copy_of_each_piece_per_trip():
    f, a = _program()
    opt = jaxrewrite.optimize(f)
    compiled = opt.lower(*a).compile()
    report = jaxrewrite.last_report()
    assert report.counts["flatten.carries_split"] == 1
    assert report.stats["compile_options"] == {REGION: True}
    # the same rewrite with the option off, as the user may set it: XLA's default copies
    without = jaxrewrite.optimize(f, compiler_options={REGION: False}).lower(*a).compile()
    assert _copies(compiled) < _copies(without)
    notes = jaxrewrite.explain(f, gpu_target=None, baseline=False,
                               compiler_options={REGION: False})(*a).notes
    assert any("jit's own" in n for n in notes)
    assert not any(n.startswith("compiled with") for n in notes)
    ref = np.asarray(jax.jit(f)(*a))
    np.testing.assert_array_equal(np.asarray(compiled(*a)), ref)
    np.testing.assert_array_equal(np.asarray(opt(*a)), ref)
    assert any(REGION in n for n in jaxrewrite.explain(f, gpu_target=None, baseline=False)(*a).notes)


def test_a_jit_used_at_top_level_and_nested_works_both_ways():
    """The options live on the outermost call's params only: the cached trace is shared with a
    nested use, where JAX would reject them."""
    f, a = _program()
    opt = jaxrewrite.optimize(f)
    ref = np.asarray(jax.jit(f)(*a))
    np.testing.assert_array_equal(np.asarray(opt(*a)), ref)  # top level first: options on
    outer = jax.jit(lambda *b: opt(*b) + 1)
    np.testing.assert_array_equal(np.asarray(outer(*a)), ref + 1)
    np.testing.assert_array_equal(np.asarray(opt(*a)), ref)
    # a nested rewrite asks for nothing: the outer module keeps XLA's defaults
    assert _copies(outer.lower(*a).compile()) == _copies(
        jaxrewrite.optimize(f, compiler_options={REGION: False}).lower(*a).compile())


def test_a_jit_first_traced_nested_gets_the_option_at_top_level():
    """Whether the jit's trace ran nested or top level first, its own options are the same."""
    f, a = _program()
    opt = jaxrewrite.optimize(f)
    ref = np.asarray(jax.jit(f)(*a))
    np.testing.assert_array_equal(np.asarray(jax.jit(lambda *b: opt(*b) ^ 1)(*a)), ref ^ 1)
    report = jaxrewrite.last_report()
    compiled = opt.lower(*a).compile()
    assert jaxrewrite.last_report() is report  # JAX's cached trace from the nested use
    without = jaxrewrite.optimize(f, compiler_options={REGION: False}).lower(*a).compile()
    assert _copies(compiled) < _copies(without)
    np.testing.assert_array_equal(np.asarray(opt(*a)), ref)


def test_the_switch_compiles_a_split_loop_with_the_option():
    f, a = _program()
    with jaxrewrite.enabled():
        compiled = jax.jit(lambda *b: f(*b)).lower(*a).compile()
    without = jaxrewrite.optimize(f, compiler_options={REGION: False}).lower(*a).compile()
    assert _copies(compiled) < _copies(without)
    np.testing.assert_array_equal(np.asarray(compiled(*a)), np.asarray(jax.jit(f)(*a)))


def test_a_program_without_a_split_loop_asks_for_nothing():
    x = jnp.arange(64 * 16, dtype=jnp.uint32).reshape(64, 16)
    jaxrewrite.optimize(lambda s: s[:, ::-1] + 1)(x)
    assert "compile_options" not in jaxrewrite.last_report().stats
    assert CO.wanted({"flatten.carries_split": 1}, "gpu") == {}
    assert CO.wanted({}, "cpu") == {}


def test_an_option_this_xla_does_not_know_is_not_asked_for():
    assert C.compile_option_supported(REGION, True)
    with pytest.warns(RuntimeWarning, match="xla_jaxrewrite_no_such_option"):
        assert not C.compile_option_supported("xla_jaxrewrite_no_such_option", True)
    assert not C.compile_option_supported("xla_jaxrewrite_no_such_option", True)  # asked once


def test_a_rule_whose_option_this_xla_lacks_leaves_the_program_compiling(monkeypatch):
    unknown = CO.Rule("xla_jaxrewrite_unknown_rule_option", True, "cpu",
                      ("flatten.carries_split",), "a rule this XLA cannot follow")
    monkeypatch.setattr(CO, "RULES", CO.RULES + (unknown,))
    f, a = _program()
    with pytest.warns(RuntimeWarning, match=unknown.option):
        out = jaxrewrite.optimize(f)(*a)
    assert jaxrewrite.last_report().stats["compile_options"] == {REGION: True, unknown.option: True}
    np.testing.assert_array_equal(np.asarray(out), np.asarray(jax.jit(f)(*a)))
