"""Rounds: a Python loop of identical rounds becomes the loop it is (`reroll="auto"`, on
targets whose loops keep their carry split: CPU, TPU).

    before:  s1 = round s0 ; s2 = round s1 ; ... ; s10 = round s9
             (calls of one body, or repeats of inline code: a Python `for` over rounds; bodies
             that differ only in a scalar literal, a round constant, count as one)
    after:   s10 = scan[length=10]{ s -> round s } s0

only where flatten then carries that loop split (`flatten.carry_split_reason`: a carry
whose small axes the body permutes, enough work to pay for the split): the pipeline goes on as
for the `fori_loop` the rounds could have been written as, its carry split into pieces, its body
compiled once, tiled where the state outgrows the cache. Unrolled, the same rounds are split as
one straight-line region, whose every output fusion recomputes its whole cone (CPU, paired
medians, 65,536 ChaCha20 blocks as a Python loop of the author's jitted double round: 0.86-0.94x
the hand-written 16-word form, compile 1.8-1.9 s; rolled and split, see CHANGELOG). Everything
else stays as written and is not recorded but as a count (`reroll.left_as_written`): a network's
layers, float rounds (flatten splits only exact bodies), rounds whose loop would not be split.

It runs in the fixed-point loop just before flatten, so the rounds it sees are folded and their
gathers made structural, as a `fori_loop` body is when flatten sees it; `reroll=True` rolls
every chain, at the end of the pipeline (`passes/reroll.py`, whose machinery this uses).
"""
from __future__ import annotations

from .. import _walk
from ..analysis.structural import Keyer
from ..backend import cost as _cost
from . import flatten, reroll


def run(cj, ctx):
    option = ctx.options.reroll
    if option is False or option is None or ctx.options.flatten != "auto" \
            or not _cost.loop_costs(ctx.target).split_carry:
        return cj, False
    min_len = reroll.DEFAULT_MIN_LENGTH if option == "auto" else reroll.min_length(option)
    keyer = Keyer()
    fewest = _cost.loop_costs(ctx.target).min_body_permutations

    def level(j):
        if not _may_hold_rounds(j, fewest):
            return j, 0
        return reroll.outline_and_reroll(
            j, keyer, min_len, ctx, keep=lambda scan: flatten.carry_split_reason(scan, ctx))
    out, rolled = _walk.map_levels(cj, level)
    return (out, True) if rolled else (cj, False)


def _may_hold_rounds(jaxpr, fewest: int) -> bool:
    """Cheap, before any chain is looked for: whether the level can hold rounds that flatten
    would carry split. Its equations exact (integer results, or float data movement only: a
    network's level is not) and at least `fewest` data movers at or below it (flatten splits
    a carry moved that often a trip). Outlining a 32-layer training step to find nothing took
    1.1-1.9 s."""
    if flatten.inexact_body(jaxpr, integers_exact=True) is not None:
        return False
    movers = 0
    for e in _walk.iter_eqns(jaxpr):
        if e.primitive.name in flatten.MOVERS and not any(
                flatten.is_float(v) for v in e.outvars):
            movers += 1
            if movers >= fewest:
                return True
    return False
