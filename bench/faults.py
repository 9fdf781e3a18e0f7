"""Every pass broken in turn: what catches each fault, and that the program still runs (issue 38).

    python bench/faults.py [--quick]

For each pass of the pipeline and each kind of damage (`jaxrewrite.testing.FAULTS`: a wrong
shape, a wrong dtype, a dropped or duplicated variable, an invalid parameter, an exception),
`optimize(program, reroll=True)` (every pass runs) on the seed's mix rounds (bench/seed.py, 64
blocks) and, without --quick, a vmapped BLAKE2s of 64 messages (bench/blake2s.py). Columns:
what caught the fault (`pass raised`: the pass's own exception; `final check`: the rewritten
program's signature or bindings; `lowering`, `compile`: the lowering guard; `discarded`: only an
enabling pass changed the program, which was returned as it came), the jaxrewrite warnings
the call gave, and whether the result is `jax.jit`'s bit for bit. Two more columns inject a
failure where JAX lowers (`lowered`) or XLA compiles (`compiled`) the pass's output
(`jaxrewrite.testing.inject_lowering_failure`: a Pallas kernel Mosaic cannot lower, say): the
passes dropped before a program ran (`dropped 'kernel'`: the others' rewrites kept), or
`original`. tests/test_faults.py asserts the same on every row (under the switch too).
"""
from __future__ import annotations

import os
import sys
import warnings

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _common  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import jaxrewrite  # noqa: E402
from jaxrewrite import _pipeline  # noqa: E402
from jaxrewrite.testing import FAULTS, inject_fault, inject_lowering_failure  # noqa: E402

NAME = "faults"
STAGES = ("lowered", "compiled")
COLUMNS = ("program", "pass", *FAULTS, *STAGES)

CAUGHT = (("fails the final check", "final check"), ("could not be lowered", "lowering"),
          ("could not be compiled", "compile"), ("could not be staged", "staging"),
          ("failed (", "pass raised"))


def programs(quick: bool):
    import seed
    ms = jnp.asarray(np.random.default_rng(1).integers(0, 2**32, (64, 4, 4), dtype=np.uint32))
    out = [("seed mix rounds", seed.rounds_program(seed.col_mix, seed.perm_take), (ms,))]
    if not quick:
        import blake2s
        words, lengths, _ = blake2s.messages(64)
        out.append(("BLAKE2s", blake2s.hash_all, (jnp.asarray(words), jnp.asarray(lengths))))
    return out


def outcome(fn, args, pass_name: str, kind: str) -> str:
    expected = jax.jit(fn)(*args)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        with inject_fault(pass_name, kind):
            got = jaxrewrite.optimize(lambda *a: fn(*a), reroll=True)(*args)
    said = [str(w.message) for w in record if "jaxrewrite" in str(w.message)]
    exact = all(np.array_equal(np.asarray(a), np.asarray(b)) for a, b in
                zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(expected)))
    report = jaxrewrite.last_report()
    if not said:
        what = ("discarded" if report is not None
                and report.counts.get("pipeline.enabling_dropped") else "not caught")
    else:
        what = next((name for key, name in CAUGHT if key in said[0]), "warned")
    return f"{what}{'' if exact else ', WRONG RESULT'}{'' if len(said) <= 1 else f', {len(said)} warnings'}"


def fallback(fn, args, pass_name: str, stage: str) -> str:
    """What ran where `pass_name`'s output could not be `stage`: the passes dropped first."""
    expected = jax.jit(fn)(*args)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        with inject_lowering_failure(pass_name, stage):
            got = jaxrewrite.optimize(lambda *a: fn(*a), reroll=True)(*args)
    said = [str(w.message) for w in record if "jaxrewrite" in str(w.message)]
    exact = all(np.array_equal(np.asarray(a), np.asarray(b)) for a, b in
                zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(expected)))
    report = jaxrewrite.last_report()
    ran = report.stats.get("fallback") if report is not None else None
    if not said or ran is None:
        what = "not caught" if said else "no warning"
    elif ran["original"]:
        what = "original"
    else:
        what = "dropped " + ", ".join(f"'{p}'" for p in ran["dropped"])
    warned = "" if len(said) <= 1 else f", {len(said)} warnings"
    return f"{what}{'' if exact else ', WRONG RESULT'}{warned}"


def main(quick: bool = False) -> list[dict]:
    rows = []
    for name, fn, args in programs(quick):
        for spec in _pipeline.PASSES:
            row = {"program": name, "pass": spec.name}
            for kind in FAULTS:
                row[kind] = outcome(fn, args, spec.name, kind)
            for stage in STAGES:
                row[stage] = fallback(fn, args, spec.name, stage)
            rows.append(row)
    return rows


if __name__ == "__main__":
    _common.cli(NAME, main, COLUMNS)
