"""XLA options a rewritten program is compiled with: one table of rules.

XLA's defaults suit the programs `jax.jit` usually gets. Some forms the passes make run faster
under an option that is off by default; a rule names the option, the target, the report count
that says the form is in the program, and why (measured). `optimize` and the switch add what
`wanted` returns to the jit's own `compiler_options` (an option the user gave is left as given).

Before → after (a loop whose carry flatten split, CPU):

    while body: copy(p0) ... copy(p15); fusions read the copies; ROOT tuple(new p0 .. p15)
    → while body: fusions read p0 .. p15;                          ROOT tuple(new p0 .. p15)

XLA:CPU's default copy insertion copies every carried piece at the top of the body (it cannot
show that each piece is read before its new value is written). Region-based analysis can: the
16 copies a trip of ChaCha20's split double round go (35 -> 18 in the module), and split
loops ran 0.52-0.87x their time with the copies, for 2-7% more compile time
(docs/measurements.md, "Copies of split loop carries").
"""
from __future__ import annotations

import dataclasses
from typing import Mapping


@dataclasses.dataclass(frozen=True)
class Rule:
    option: str       # an XLA DebugOptions field
    value: object
    target: str       # the target it applies to
    counts: tuple     # the report counts (any > 0) that say the program has the form
    why: str


RULES: tuple[Rule, ...] = (
    # (reroll: a run of rounds that scalarize split, rolled, carries the pieces; ChaCha20's
    # Python loop of double rounds at 65,536 blocks ran 0.63x the hand form without the option)
    Rule("xla_cpu_copy_insertion_use_region_analysis", True, "cpu",
         ("flatten.carries_split", "reroll.carries_pieces"),
         "loops with split carries: region-based copy insertion drops the copy of each carried "
         "piece every trip"),
)


def wanted(counts: Mapping[str, int], target: str) -> dict:
    """{option: value} for the rules whose form is in a program with these report `counts`."""
    return {r.option: r.value for r in RULES
            if r.target == target and any(counts.get(c, 0) for c in r.counts)}


def reasons(options: Mapping) -> list[str]:
    """One line per option in `options` that a rule asked for: `option=value: why`."""
    return [f"{r.option}={r.value}: {r.why}" for r in RULES if options.get(r.option) == r.value]
