"""Common-subexpression elimination: identical pure equations on identical operands, once.

    before:  b = sin a;  c = sin a;  d = add b c
    after:   b = sin a;               d = add b b

    before:  y = jit[name=f, jaxpr=J1] x;  z = jit[name=f, jaxpr=J2] x     # J1, J2 alike
    after:   y = jit[name=f, jaxpr=J1] x;  (z is y)

An equation's key is (primitive, params with nested jaxprs by structural key, operands after
substitution, output avals, effects, equation context): two equations with equal keys compute
the same values. Within one jaxpr level, in program order, a later equation whose key was seen
is dropped and its outputs renamed to the earlier one's.

Never merged (the table below; each hit is recorded as a decline with its reason):

| condition                                   | why                                            |
|---------------------------------------------|------------------------------------------------|
| the equation has effects                    | effects keep their count and order             |
| stateful primitive (`rng_uniform`, …),      | each call draws from hidden state: two draws   |
|   here or anywhere in a nested body         |   are two different values                     |
| `checkpoint` with `prevent_cse=True`        | the user asked XLA not to share it             |
| fresh mutable refs, user callbacks          | identity / call count is observable            |
| the program is partitioned over devices     | a merged value wanted in two shardings is      |
|   (`Context.devices` > 1; the whole pass)   |   resharded: communication jax.jit lacked      |
| `exact=True` and a floating-point result    | jax.grad sums the merged value's cotangents    |
|                                             |   in another order (`analysis.exact`)          |

Random draws (`random_bits`, `threefry2x32`) are pure functions of their key: draws from the
same key are the same value and merge; draws from different keys have different operands and
never do.
"""
from __future__ import annotations

from .. import _compat as C
from ..analysis import exact as _exact
from .. import _walk
from ..analysis.structural import Keyer, shared_keyer

NAME = "cse"

# Primitive names never merged, with the reason recorded when an identical one is found.
NEVER: dict[str, str] = {
    "mutable_array": "creates a fresh mutable ref",
    "ref": "creates a fresh mutable ref",
    "new_ref": "creates a fresh mutable ref",
    "empty_ref": "creates a fresh mutable ref",
    "pure_callback": "user callback: its call count is observable",
    "io_callback": "user callback: its call count is observable",
    "debug_callback": "user callback: its call count is observable",
}


def _unmergeable(eqn, stateful_inside) -> str | None:
    """Why `eqn` may not be merged with an identical one (None: it may)."""
    if C.has_effects(eqn):
        return "has effects"
    if C.is_stateful(eqn):
        return f"stateful primitive {eqn.primitive.name}"
    reason = NEVER.get(eqn.primitive.name)
    if reason:
        return reason
    if eqn.primitive is C.remat_p and eqn.params.get("prevent_cse", False):
        return "checkpoint with prevent_cse=True"
    if any(stateful_inside(sub) for _, _, sub in C.params_jaxprs(eqn.params)):
        return "a nested body draws from a stateful primitive"
    return None


PARTITIONED = ("the program is partitioned over {n} devices: XLA's SPMD partitioner picks a "
               "sharding per use, and one merged value wanted in two shardings is resharded "
               "(an all-gather where jax.jit recomputed; tests/test_sharding.py)")


def run(cj: C.ClosedJaxpr, ctx) -> tuple[C.ClosedJaxpr, bool]:
    devices = getattr(ctx, "devices", 1)
    if devices > 1:
        if ctx.report.counts.get(f"{NAME}.declined", 0) == 0:
            ctx.report.declined(NAME, None, PARTITIONED.format(n=devices))
        return cj, False
    keyer = shared_keyer(ctx)
    cache = getattr(ctx, "cache", None)  # per rewrite: a pure function of the jaxpr object
    memo: dict = {} if cache is None else cache.setdefault("cse.stateful", {})

    def stateful_inside(j) -> bool:
        hit = memo.get(id(j))
        if hit is not None and hit[0] is j:
            return hit[1]
        jaxpr = j.jaxpr if isinstance(j, C.ClosedJaxpr) else j
        out = any(C.is_stateful(e) or NEVER.get(e.primitive.name) is not None
                  or any(stateful_inside(s) for _, _, s in C.params_jaxprs(e.params))
                  for e in jaxpr.eqns)
        memo[id(j)] = (j, out)
        return out

    out, hits = _walk.map_levels(cj, lambda j: _cse_level(j, keyer, stateful_inside, ctx))
    if hits and ctx is not None:
        ctx.report.count("cse.hits", hits)
    return out, hits > 0


def _cse_level(jaxpr, keyer: Keyer, stateful_inside, ctx):
    env: dict = {}
    seen: dict = {}
    eqns = []
    hits = 0
    Lit, literal_key = C.Literal, keyer.literal   # (this loop sees every equation)
    for eqn in jaxpr.eqns:
        eqn = _walk.rename_operands(eqn, env)
        # A variable is its own key (jax's Var hashes and compares by identity); literals by value.
        in_keys = tuple(literal_key(a) if isinstance(a, Lit) else a for a in eqn.invars)
        # Bucketed by (primitive, operands) first: most equations share that with none before
        # them, and their full key (params, avals, ...) is then never needed.
        bucket = seen.get((eqn.primitive, in_keys))
        if bucket is None:
            seen[(eqn.primitive, in_keys)] = [eqn, in_keys]  # full key computed if ever needed
            eqns.append(eqn)
            continue
        if isinstance(bucket, list):
            lone, lone_in = bucket
            bucket = seen[(eqn.primitive, in_keys)] = {
                keyer.eqn_key(lone, lone_in, drops=False): lone}
        key = keyer.eqn_key(eqn, in_keys, drops=False)
        first = bucket.get(key)
        if first is None:
            bucket[key] = eqn
            eqns.append(eqn)
            continue
        if any(C.is_dropvar(a) and not C.is_dropvar(b) for a, b in zip(first.outvars, eqn.outvars)):
            bucket[key] = eqn  # the earlier one dropped outputs this one needs: later ones use this
            eqns.append(eqn)
            continue
        reason = _unmergeable(eqn, stateful_inside) or _exact.reason(
            ctx, eqn.outvars, "merging")  # exact=True: gradients' summation order kept
        if reason is not None:
            if ctx is not None:
                ctx.report.declined(NAME, eqn, reason)
            eqns.append(eqn)
            continue
        hits += 1
        if ctx is not None:
            ctx.report.applied(NAME, eqn)
        for old, new in zip(eqn.outvars, first.outvars):
            if not C.is_dropvar(old):
                env[old] = new
    if not hits:
        return jaxpr, 0
    outvars = [_walk.substitute(a, env) for a in jaxpr.outvars]
    return C.replace_jaxpr(jaxpr, eqns=eqns, outvars=outvars), hits
