"""The rewrite's own cost: the pipeline does not re-run a pass on a program it already left
unchanged without recording anything, and does re-run one that recorded something; a change
wakes only the passes it can create work for (`PassSpec.enables`)."""
import dataclasses

import jax
import jax.numpy as jnp

from jaxrewrite import _pipeline
from jaxrewrite._options import Options
from jaxrewrite.report.records import Report
from jaxrewrite._walk import count_eqns

QUIET = _pipeline.PassSpec("quiet_for_test", "dedup", True)
NOISY = _pipeline.PassSpec("noisy_for_test", "dedup", True)
_NO_PASSES = dict(fold=False, gathers=False, movement=False, scalarize=False, dedup=False,
                  cse=False, reroll=False)


def _program():
    return jax.make_jaxpr(lambda x: jnp.sin(x) * 2)(jnp.ones(3))


def _passes(seen):
    def quiet(cj, ctx):
        seen.append(("quiet", cj))
        return cj, False

    def noisy(cj, ctx):
        seen.append(("noisy", cj))
        ctx.report.count("noisy.looked")
        return cj, False

    return quiet, noisy


def test_a_quiet_pass_runs_once_per_program_object():
    seen = []
    quiet, noisy = _passes(seen)
    opts = Options.make(**_NO_PASSES)
    # Run the pipeline loop directly twice over one object: the second visit is skipped for the
    # quiet pass only.
    ctx = _pipeline.Context(opts, Report())
    cj = _program()
    passes = [(QUIET, quiet), (NOISY, noisy)]
    _pipeline._run(cj, ctx, passes)
    _pipeline._run(cj, ctx, passes)
    assert [k for k, _ in seen] == ["quiet", "noisy", "noisy"]
    assert ctx.report.counts["noisy.looked"] == 2


def test_rewrite_result_and_report_unchanged_by_the_skip():
    seen = []
    quiet, noisy = _passes(seen)
    cj = _program()
    res = _pipeline.rewrite(cj, Options.make(**_NO_PASSES),
                            extra_passes=((QUIET, quiet), (NOISY, noisy)))
    assert not res.changed and count_eqns(res.jaxpr) == count_eqns(cj)
    assert res.report.counts["noisy.looked"] == 1 and res.report.counts["pipeline.rounds"] == 1


def _wake_passes(enables):
    """A counting pass, a pass that changes the program once (waking `enables`), a counter."""
    runs = {"first": 0, "changer": 0, "last": 0}

    def first(cj, ctx):
        runs["first"] += 1
        return cj, False

    def changer(cj, ctx):
        runs["changer"] += 1
        if runs["changer"] == 1:  # a new program object, as a real rewrite makes
            return jax.make_jaxpr(lambda x: jnp.sin(x) * 3)(jnp.ones(3)), True
        return cj, False

    def last(cj, ctx):
        runs["last"] += 1
        return cj, False

    specs = [_pipeline.PassSpec("first_for_test", "dedup", True),
             _pipeline.PassSpec("changer_for_test", "dedup", True, enables=enables),
             _pipeline.PassSpec("last_for_test", "dedup", True)]
    return runs, list(zip(specs, (first, changer, last)))


def test_a_change_wakes_only_the_passes_it_can_create_work_for():
    runs, passes = _wake_passes(enables=("last_for_test",))
    ctx = _pipeline.Context(Options.make(**_NO_PASSES), Report())
    _pipeline._run(_program(), ctx, passes)
    # the change woke `last` (after it, same round); `first` and `changer` did not run again
    assert runs == {"first": 1, "changer": 1, "last": 1}
    assert ctx.report.counts["pipeline.rounds"] == 1


def test_a_change_by_default_wakes_every_pass():
    runs, passes = _wake_passes(enables=None)
    ctx = _pipeline.Context(Options.make(**_NO_PASSES), Report())
    _pipeline._run(_program(), ctx, passes)
    # round 2: `first` (before the change) and `changer` (its own output) run again; `last`
    # already ran after the change, and nothing changed since
    assert runs == {"first": 2, "changer": 2, "last": 1}
    assert ctx.report.counts["pipeline.rounds"] == 2


def test_a_pass_at_its_own_fixed_point_wakes_every_other_pass_but_not_itself():
    runs, passes = _wake_passes(enables=None)
    passes[1] = (dataclasses.replace(passes[1][0], own_fixpoint=True), passes[1][1])
    ctx = _pipeline.Context(Options.make(**_NO_PASSES), Report())
    _pipeline._run(_program(), ctx, passes)
    # round 2: `first` (before the change) runs again; `changer` does not re-check itself
    assert runs == {"first": 2, "changer": 1, "last": 1}


def test_a_pass_that_makes_no_dead_code_is_not_followed_by_dce(monkeypatch):
    """`PassSpec.makes_dead_code=False` (dedup: sharing removes nothing) skips the DCE walk."""
    from jaxrewrite import _walk
    dce_calls = []
    monkeypatch.setattr(_walk, "dce_closed", lambda cj: dce_calls.append(cj) or cj)
    for makes_dead_code, expected in ((False, 0), (True, 1)):
        dce_calls.clear()
        runs, passes = _wake_passes(enables=())
        passes[1] = (dataclasses.replace(passes[1][0], makes_dead_code=makes_dead_code),
                     passes[1][1])
        _pipeline._run(_program(), _pipeline.Context(Options.make(**_NO_PASSES), Report()),
                       passes)
        assert len(dce_calls) == expected


def test_fold_runs_once_when_only_fold_changes(monkeypatch):
    """The real pipeline on a program where only fold has work: fold folds the index arithmetic
    of a static `x[perm]` once and does not run again on its own output."""
    import numpy as np
    from jaxrewrite.passes import fold
    calls = []
    real = fold.run
    monkeypatch.setattr(fold, "run", lambda cj, ctx: calls.append(1) or real(cj, ctx))
    perm = np.array([2, 0, 1])
    cj = jax.make_jaxpr(lambda x: jnp.sin(x)[perm])(jnp.ones(3))
    res = _pipeline.rewrite(cj, Options.make(gathers=False, movement=False, scalarize=False,
                                             dedup=False, cse=False))
    assert res.report.counts["fold.folded"] >= 1
    assert len(calls) == 1 and res.report.counts["pipeline.rounds"] == 1


def test_scalarize_declines_small_pieces_without_linking(monkeypatch):
    """On the CPU ("auto": pieces of at least 1024 elements) a level whose movers hold no value
    that could give such a piece is declined before any equation is linked; the GPU row (no
    minimum) and autotune (which measures that verdict) still analyse it."""
    import numpy as np
    import jaxrewrite
    from jaxrewrite.passes import scalarize
    linked = []
    real = scalarize.analyse
    monkeypatch.setattr(scalarize, "analyse", lambda *a, **k: linked.append(1) or real(*a, **k))
    perm = np.array([3, 0, 2, 1])
    cj = jax.make_jaxpr(lambda x: (x * 2)[:, perm] + 1)(jnp.ones((8, 4), jnp.int32))
    res = jaxrewrite.rewrite_jaxpr_with_report(cj, target="cpu")
    assert not linked
    assert any(d.pass_name == "scalarize" and "pieces of at most 8 elements" in d.reason
               for d in res.report.declines)
    jaxrewrite.rewrite_jaxpr_with_report(cj, target="gpu")
    assert linked
