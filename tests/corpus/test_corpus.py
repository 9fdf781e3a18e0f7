"""The corpus (bench/corpus.py: Jumanji, Gymnax, NetKet, e3nn-jax, qujax, dm-pix programs)
through `optimize(..., strict=True)`, under the defaults and under `reroll=True`:

- within the contract against `jax.jit` (`clients.assert_result`), with no fallback;
- never worse (issue 23's promise): run <= 1.05x jax.jit, compile (trace + rewrite + lower +
  compile, fresh caches) <= 1.10x unless the run is >= 1.5x faster. Measured in paired rounds
  with a second `jax.jit` as the A/A control; each bound is widened by how far the A/A control
  was from 1 in the same rounds, run samples go round every compilation made, and a miss is
  measured again, twice (a run's first by sampling again, without compiling): it counts only
  if every measurement misses.

Each program and direction is compiled and measured once (all four variants in the same rounds)
and the contract is checked on the executables measured: the whole step has to stay within a
few minutes on a 2-core machine.
"""
import pytest

import corpus  # bench/corpus.py, put on sys.path by conftest.py

pytestmark = [pytest.mark.corpus,
              # the libraries' own warnings, the same under jax.jit (bench/corpus.quiet)
              pytest.mark.filterwarnings("ignore::DeprecationWarning"),
              pytest.mark.filterwarnings("ignore::FutureWarning"),
              pytest.mark.filterwarnings("ignore:Explicitly requested dtype:UserWarning")]

# Rows that miss the promise today, each with its open cause (xfail, strict=False: an XPASS is
# not an error). None today. Fixed and no longer listed: NetKet GCNN and e3nn gradient with
# reroll=True (`backend.cost.reroll_body` declines those bodies); RubiksCube's compile
# 1.85-1.92x from the rewrite itself (`indexmap.scatter_batch_core`, one scalarize run per
# round); the Jumanji and Gymnax compile 1.11-1.48x that appeared only in a full run of this
# file: building the NetKet program sets a global mesh, and constant folding declined the
# replicated shardings every op then carries (`_compat.replicated`); RubiksCube's compile
# 1.09-1.17x from the cold rewrite and its 33 index tables of 4,096 rows compiled in as
# constants (each vmapped turn's gather and scatter now reads one row of its table, the batch a
# window: `gathers._unbatched`); Sudoku's run 1.02-1.03x from its box transposes, beside a
# box write-back scatter kept in place (a scatter that writes every element once is now its
# updates moved: `_updates.overwrites_all`).
KNOWN_SLOW: dict[tuple[str, str, str], str] = {}

ROWS = [(make, direction, options) for make in corpus.PROGRAMS
        for direction in corpus.directions(make) for options in corpus.OPTIONS]

_built: dict = {}
_measured: dict = {}


def program(make):
    if make not in _built:
        _built[make] = make()
    return _built[make]


def measured(make, direction, again: str = ""):
    """The variants' times and executables for one program and direction (corpus.QUICK);
    `again="run"`: their run times sampled again, twice as many, nothing compiled;
    `again="compile"`: everything measured again with corpus.FULL's rounds."""
    key = (make, direction)
    if again == "run":
        _measured[key] = corpus.resample(_measured[key], 2 * corpus.QUICK[1])
    elif again or key not in _measured:
        _measured.pop(key, None)
        _measured[key] = corpus.measure(program(make), direction,
                                        *(corpus.FULL if again else corpus.QUICK))
    return _measured[key]


def _param(make, direction, options):
    reason = KNOWN_SLOW.get((make.__name__, direction, options))
    marks = pytest.mark.xfail(reason=reason, strict=False) if reason else ()
    return pytest.param(make, direction, options, id=f"{make.__name__}-{direction}-{options}",
                        marks=marks)


def test_rows_cover_every_program_and_direction():
    """ROWS (from `corpus.directions`, without building) are the built programs' own
    directions, both options sets."""
    expected = {(make, d, o) for make in corpus.PROGRAMS for d in program(make).directions()
                for o in corpus.OPTIONS}
    assert set(ROWS) == expected and len(ROWS) == len(expected)
    assert len(corpus.PROGRAMS) >= 8
    assert len({program(make).library for make in corpus.PROGRAMS}) >= 4


@pytest.mark.parametrize("make,direction,options",
                         [pytest.param(*r, id=f"{r[0].__name__}-{r[1]}-{r[2]}") for r in ROWS])
def test_within_contract(make, direction, options, record_property):
    """Checked on the measured executables: no fallback, something rewritten, results within
    the contract."""
    p = program(make)
    c = corpus.check(p, direction, options, measured(make, direction))
    record_property("rewrites", dict(c["rewrites"]))
    assert c["rewrites"], f"{p.name} {direction} {options}: nothing rewritten, nothing compared"
    assert c["diff_eps"] <= corpus.clients.testing.CONTRACT_ULPS


@pytest.mark.parametrize("make,direction,options", [_param(*r) for r in ROWS])
def test_never_worse(make, direction, options, record_property):
    """Within the promise, the A/A spread as slack; a miss is measured again, twice, and
    counts only if every measurement misses (rows in KNOWN_SLOW are not: their miss is known).
    A run that missed is first sampled again over the same compilations; a compile that
    missed, and a run that missed twice, are compiled again with more rounds.
    On this 2-core machine one compilation of a program ran up to 10% faster or slower than
    another of the same program; Snake's defaults and reroll rows, the same HLO, once read
    1.00x and 1.08x, twice. A real regression misses every time."""
    r = corpus.ratios(measured(make, direction), options)
    known = (make.__name__, direction, options) in KNOWN_SLOW
    seen = [r]
    while (missed := corpus.verdict(r, slack=True)) != "ok" and not known and len(seen) < 3:
        # a run that missed is sampled again first (no compile); a compile that missed, and a
        # run that missed twice (its compilations may all be slow ones), compiled again
        again = "compile" if "compile" in missed or len(seen) == 2 else "run"
        r = corpus.ratios(measured(make, direction, again=again), options)
        seen.append(r)
    record_property("ratios", seen)
    miss = corpus.verdict(r, slack=True)
    assert miss == "ok", (f"{program(make).name} {direction} {options}: {miss} in each of "
                          f"{len(seen)} measurements ("
                          + "; ".join(f"{corpus.verdict(x, slack=True)}, A/A run "
                                      f"{x['run_aa']:.2f}x, compile {x['compile_aa']:.2f}x"
                                      for x in seen) + ")")
