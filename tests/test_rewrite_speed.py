"""The rewrite's own cost: the pipeline does not re-run a pass on a program it already left
unchanged without recording anything, and does re-run one that recorded something; a change
wakes only the passes it can create work for (`PassSpec.enables`)."""
import jax
import jax.numpy as jnp

from jaxrewrite import _pipeline
from jaxrewrite._options import Options
from jaxrewrite._report import Report
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
