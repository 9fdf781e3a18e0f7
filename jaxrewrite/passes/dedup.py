"""Structurally identical inner jaxprs become one object, so JAX lowers each body once.

    before:  b = jit[name=body, jaxpr={ lambda ; x. let y = sin x in (y,) }] a
             c = jit[name=body, jaxpr={ lambda ; u. let v = sin u in (v,) }] b   # another object
    after:   b = jit[name=body, jaxpr=J] a
             c = jit[name=body, jaxpr=J] b                                        # the same J

JAX's `jit` lowering caches on (name, jaxpr object, shardings, layouts): fresh closures,
lambdas and `functools.partial`s of one body are traced to distinct-but-equal jaxprs and each is
lowered to its own `func.func`; once they are one object they lower to one. Identity is the
structural key of `jaxrewrite.analysis.structural` (alpha-equivalence; params including `name`,
literals, avals with weak types, effects, constants by content, tracer constants never).

What sharing buys, per kind of nested jaxpr (measured in bench/dedup.py, 50 fresh closures of
an 8-step body, CPU):

| where the jaxpr lives       | survives into jax.jit's trace? | what sharing saves                    |
|-----------------------------|--------------------------------|---------------------------------------|
| `jit` body                  | yes (bound as a param)         | one `func.func` per body (51 -> 2);   |
|                             |                                | under `jax.grad`, JAX's jvp/partial-  |
|                             |                                | eval/transpose caches (keyed on the   |
|                             |                                | object) hit: 103 -> 6 functions,      |
|                             |                                | trace+lower 0.38x                     |
| `checkpoint`/remat body     | yes                            | lowers inline (no functions saved);   |
|                             |                                | under `jax.grad` the same caches hit: |
|                             |                                | trace+lower 0.38x                     |
| scan/while/cond bodies      | yes                            | lowers inline: our own passes' memo   |
| custom_jvp/vjp, closed_call | no (re-traced when re-bound)   | our own passes' memo only; but a body |
|                             |                                | *containing* them merges (the JVP     |
|                             |                                | rule behind JAX's per-trace thunk is  |
|                             |                                | compared, see `analysis.structural`)  |

All kinds are merged (merging is always correct: the programs are identical); the report counts
`jit` bodies, where the saving shows in the lowered module.

Preconditions: none beyond structural equality. Never merged: jaxprs closing over tracers of an
outer trace, jaxprs whose params hold different callables (callbacks compared by identity).
"""
from __future__ import annotations

from .. import _compat as C
from .. import _walk
from ..report.records import current_call_site
from ..analysis.structural import shared_keyer

NAME = "dedup"


def run(cj: C.ClosedJaxpr, ctx) -> tuple[C.ClosedJaxpr, bool]:
    keyer = shared_keyer(ctx)
    canonical: dict = {}      # StructKey -> the first ClosedJaxpr seen with that structure
    merged = [0]

    def canon(c: C.ClosedJaxpr) -> C.ClosedJaxpr:
        key = keyer(c)
        first = canonical.setdefault(key, c)
        if first is not c and first.jaxpr is not c.jaxpr:
            merged[0] += 1
            site = current_call_site()  # the equation holding `c`: its user line is reported
            if ctx is not None and site is not None:  # (the count comes with the event)
                ctx.report.applied(NAME, site, after=(site.primitive.name,))
        return first

    out = _walk.map_jaxprs(cj, canon, nested_only=True)  # the program itself is never keyed
    changed = out is not cj
    _report(ctx, cj, out, merged[0])
    return out, changed


def _jit_bodies(cj) -> tuple[int, int]:
    """(jit equations, distinct jit body objects) at every level."""
    calls, bodies = 0, set()
    for j in _walk.iter_jaxprs(cj):
        j = j.jaxpr if isinstance(j, C.ClosedJaxpr) else j
        for i, _ in _walk.nested_eqns(j):  # (cached per jaxpr: only equations holding jaxprs)
            e = j.eqns[i]
            if C.is_jit(e):
                calls += 1
                bodies.add(id(e.params["jaxpr"]))
    return calls, len(bodies)


def _report(ctx, before, after, merged: int) -> None:
    if ctx is None or (not merged and "dedup.calls" in ctx.report.stats):
        return
    calls, n_before = _jit_bodies(before)
    n_after = n_before if after is before else _jit_bodies(after)[1]
    r = ctx.report
    r.stats["dedup.calls"] = calls
    r.stats.setdefault("dedup.bodies_before", n_before)
    r.stats["dedup.bodies_after"] = n_after
    if merged:
        r.count("dedup.merged", merged)
        r.count("dedup.jit_bodies_merged", n_before - n_after)
