"""Where XLA's GPU fusion cuts a long split region: optimization barriers at the narrowest points
(scalarize's GPU row, `backend.cost.TargetCosts.segment_eqns`; issue 25).

XLA's GPU fusion makes a split region one multi-output loop fusion, each thread computing every
piece of its element, up to a size. Past it, the region is cut where XLA's fusion order leaves
it, with many values crossing each cut. Deviceless H200, hand-written 25-word Keccak-f[1600],
16,384 states: 8 rounds (about 1,700 elementwise equations) one kernel, 9 rounds two, 24 rounds
5 kernels with 43-47 values crossing each cut; through scalarize 7. A barrier over the live
values every `segment_eqns` compute equations, where the fewest are live (the state between
two rounds), and one before the final re-join: 4 (3 segments and the re-join). ChaCha20's 16
words, 10 double rounds (about 1,600), is one segment and is left as it is.

The size does not predict XLA's fusion of the cut form, though: the same cut took ChaCha20 with
20 double rounds from 3 kernels to 22, and Keccak's unrolled `fori_loop` from 7 to 6. So scalarize
proposes the cut and takes it only where compiling both forms counts fewer launches
(`autotune=True`); by default it records a decline.

    before:  s1 = round(s0) ; ... ; s24 = round(s23) ; out = stack(s24)       (s: 25 pieces)
    after:   s1 = round(s0) ; ... ; s8' = optimization_barrier(s8) ; s9 = round(s8') ; ...
             s24' = optimization_barrier(s24) ; out = stack(s24')

A barrier is the identity on its operands, so values are unchanged.
"""
from __future__ import annotations

import math

from .. import _compat as C
from ..analysis.pieces import shape_of


def _uses(eqns, outvars, compute) -> tuple[dict, dict]:
    """Each computed value used later (one a compute equation made, or data movement of one):
    the index of the equation that made it, and of its last use (len(eqns) for the level's
    outputs). Data movement of the level's inputs alone is left out: XLA reads it in place in
    every kernel, where a barrier would copy it (ChaCha20's input words: 3 -> 24 kernels); so are
    scalars (a loop counter unrolled: XLA folds or recomputes it in each kernel)."""
    n = len(eqns)
    made, last = {}, {}
    for i, e in enumerate(eqns):
        computed = e.primitive.name in compute
        for a in e.invars:
            if not C.is_literal(a) and a in made:
                last[a] = i
                computed = True
        if computed:
            for v in e.outvars:
                if not C.is_dropvar(v) and math.prod(shape_of(v)) > 1:
                    made[v] = i
    for a in outvars:
        if not C.is_literal(a) and a in made:
            last[a] = n
    return {v: made[v] for v in last}, last


def _live_counts(eqns, outvars, compute) -> list[int]:
    """Per boundary i (before equation i): how many computed values made earlier are used at or
    after it."""
    made, last = _uses(eqns, outvars, compute)
    delta = [0] * (len(eqns) + 2)
    for v, j in made.items():
        delta[j + 1] += 1
        delta[last[v] + 1] -= 1
    counts, live = [], 0
    for i in range(len(eqns) + 1):
        live += delta[i]
        counts.append(live)
    return counts


def cut_points(eqns, outvars, max_eqns: int, compute) -> list[int]:
    """Boundaries to put a barrier at. Each segment holds at most `max_eqns` compute equations
    (primitive names in `compute`) and ends at the boundary with the fewest live values past its
    first half (the latest of equals); then one before the trailing data movement (the final
    re-join), where anything was cut."""
    is_compute = [e.primitive.name in compute for e in eqns]
    if max_eqns <= 0 or sum(is_compute) <= max_eqns:
        return []
    counts = _live_counts(eqns, outvars, compute)
    cuts: list[int] = []
    ops, best = 0, None                 # best: (live values, -boundary) so far this segment
    for i, step in enumerate(is_compute):
        if ops * 2 >= max_eqns and counts[i] and (best is None or (counts[i], -i) <= best):
            best = (counts[i], -i)
        if step and ops + 1 > max_eqns and best is not None:
            b = -best[1]
            cuts.append(b)
            ops, best = sum(is_compute[b:i]), None
        ops += step
    end = max(i for i, c in enumerate(is_compute) if c) + 1
    if cuts and end < len(eqns) and counts[end] > 1:
        cuts.append(end)
    return cuts


def insert_barriers(jaxpr, cuts: list[int], compute):
    """`jaxpr` with one optimization barrier over the computed values live at each boundary in
    `cuts`."""
    barrier = C.lax_primitive("optimization_barrier")
    eqns = jaxpr.eqns
    made, last = _uses(eqns, jaxpr.outvars, compute)
    at = set(cuts)
    rename: dict = {}
    out: list = []

    def sub(a):
        return a if C.is_literal(a) else rename.get(a, a)

    for i, e in enumerate(eqns):
        live = [v for v, j in made.items() if j < i <= last[v]] if i in at else ()
        if live:
            ins = [sub(v) for v in live]
            outs = [C.new_var(C.aval_of(a)) for a in ins]
            out.append(C.new_eqn(ins, outs, barrier, {}, source_info=e.source_info))
            rename.update(zip(live, outs))
        new_in = [sub(a) for a in e.invars]
        out.append(e if all(x is y for x, y in zip(new_in, e.invars))
                   else e.replace(invars=new_in))
    return C.replace_jaxpr(jaxpr, eqns=out, outvars=[sub(a) for a in jaxpr.outvars])
