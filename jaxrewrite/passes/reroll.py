"""Re-rolling: a chain of calls of one body, each feeding the next, becomes one `lax.scan`.

    before:  c1 = jit[jaxpr=J] c0 w1 s          (option `reroll=True`, or an int: the
             c2 = jit[jaxpr=J] c1 w2 s           shortest chain worth rolling; `unroll=`
             c3 = jit[jaxpr=J] c2 w3 s           passes through to the scan)
    after:   W  = stack w1 w2 w3                 (per-iteration operands: stacked xs)
             c3 = scan[length=3, jaxpr={ c, w ; s. c' = jit[jaxpr=J] c w s }] c0 W  (s invariant)

A call is a `jit` or `checkpoint` equation without effects; "one body" is structural identity of
the primitive and all its params (dedup makes equal bodies one object first, so the scan body
still calls the shared function). Per operand position, across the chain:

| position                                | becomes                                        |
|-----------------------------------------|------------------------------------------------|
| fed by output q of the previous call    | carry (init from the first call); types must   |
|                                         | match exactly (dtype, weak type, sharding)     |
| the same atom in every call             | loop-invariant (closed over by the body)       |
| anything else (same aval by structure)  | scanned xs: stacked (literals: one literal)    |

Bodies that differ only in scalar literals at their top level (what `fold` makes of a call
with a per-layer index) chain too: the differing literals become trailing operands of one
generalized body and are scanned as a stacked literal.

Outputs of the chain used outside it (residuals under `jax.grad`, intermediate activations)
come out of the scan as stacked ys and are indexed where they were used. A chain is cut where
an intermediate result is used before the chain ends. When a chain's per-iteration operands are
exactly the ys of a chain rolled before it (in order, or in reverse: a backward pass consuming
forward residuals), the scan reads those ys directly (`reverse=True` for the reverse order)
instead of stacking a copy.

Tolerance: the scan computes the same operations in the same order; XLA may fuse a loop body
differently from an unrolled program, so float results can differ in the last bits (measured
in `bench/dedup.py`; the tests use rtol 1e-5 for float32). Integer programs are exact.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from .. import _compat as C
from .. import _walk
from .._report import Decline
from .._structural import Keyer, literal_key

NAME = "reroll"
DEFAULT_MIN_LENGTH = 3


def _min_length(opt) -> int | None:
    if opt is False or opt is None:
        return None
    if opt is True:
        return DEFAULT_MIN_LENGTH
    return max(2, int(opt))


def _is_call(eqn) -> bool:
    return (C.is_jit(eqn) or eqn.primitive is C.remat_p) and not C.has_effects(eqn)


@dataclasses.dataclass
class Chain:
    eqns: list                       # the calls, in program order
    idx: list                        # their positions in the level's equation list
    carry: tuple = ()                # ((input position p, output position q), ...)


def run(cj: C.ClosedJaxpr, ctx) -> tuple[C.ClosedJaxpr, bool]:
    min_len = _min_length(ctx.options.reroll)
    if min_len is None:
        return cj, False
    keyer = Keyer()
    out, rolled = _walk.map_levels(cj, lambda j: _reroll_level(j, keyer, min_len, ctx))
    return out, rolled > 0


# --- finding chains ----------------------------------------------------------------------------

# --- per-iteration literals inside bodies ---------------------------------------------------------
# `fold` specialises a call whose operand is a literal (a layer index) into a body holding that
# literal, so the layers' bodies differ only in literal values. Chains are found on the
# *skeleton* of the body (scalar literals at its top level keyed by aval only); where the values
# differ along a chain, they become new operands of one generalized body (scanned xs).

def _body_of(eqn):
    return eqn.params["jaxpr"]


def _scalar_literals(body) -> list[tuple[int, int]]:
    j = body.jaxpr if isinstance(body, C.ClosedJaxpr) else body
    return [(n, p) for n, e in enumerate(j.eqns) for p, a in enumerate(e.invars)
            if C.is_literal(a) and getattr(C.aval_of(a), "shape", None) == ()]


def _skeleton_key(eqn, keyer: Keyer):
    body = _body_of(eqn)
    j = body.jaxpr if isinstance(body, C.ClosedJaxpr) else body
    spots = set(_scalar_literals(body))
    env: dict = {}
    for v in (*j.constvars, *j.invars):
        env[v] = (len(env), keyer.aval(v.aval))
    ek = []
    for n, e in enumerate(j.eqns):
        ins = tuple(("lit?", keyer.aval(C.aval_of(a))) if (n, p) in spots else keyer.atom(a, env)
                    for p, a in enumerate(e.invars))
        ek.append(keyer.eqn_key(e, ins))
        for v in e.outvars:
            if not C.is_dropvar(v):
                env[v] = (len(env), keyer.aval(v.aval))
    rest = {k: v for k, v in eqn.params.items() if k != "jaxpr"}
    consts = tuple(keyer(body).key[2]) if isinstance(body, C.ClosedJaxpr) else ()
    return (eqn.primitive, keyer.params(rest), tuple(ek), tuple(keyer.atom(a, env) for a in j.outvars),
            consts, frozenset(j.effects))


def _generalize(chain: Chain, keyer: Keyer) -> Chain:
    """`chain` with body literals that differ along it lifted into trailing operands."""
    bodies = [_body_of(e) for e in chain.eqns]
    if all(b is bodies[0] for b in bodies):
        return chain
    spots = _scalar_literals(bodies[0])
    jj = [b.jaxpr if isinstance(b, C.ClosedJaxpr) else b for b in bodies]
    lifted = [(n, p) for n, p in spots
              if not all(keyer.atom(j.eqns[n].invars[p], {}) == keyer.atom(jj[0].eqns[n].invars[p], {})
                         for j in jj[1:])]
    b0, j0 = bodies[0], jj[0]
    new_vars = [C.new_var(C.aval_of(j0.eqns[n].invars[p])) for n, p in lifted]
    where = dict(zip(lifted, new_vars))
    eqns = [e if not any((n, p) in where for p in range(len(e.invars))) else
            e.replace(invars=[where.get((n, p), a) for p, a in enumerate(e.invars)])
            for n, e in enumerate(j0.eqns)]
    di = j0.debug_info
    if di is not None and di.arg_names is not None:
        di = di._replace(arg_names=tuple(di.arg_names) + ("",) * len(new_vars))
    gj = C.replace_jaxpr(j0, invars=[*j0.invars, *new_vars], eqns=eqns, debug_info=di)
    new_eqns = []
    for e, j in zip(chain.eqns, jj):
        extra = [j.eqns[n].invars[p] for n, p in lifted]
        if C.is_jit(e):
            params = C.jit_params_append_args(e.params, len(extra))
            params["jaxpr"] = C.closed(gj, b0.consts)
        else:
            params = dict(e.params, jaxpr=gj)
        new_eqns.append(e.replace(invars=[*e.invars, *extra], params=params))
    # one generalized body object for the whole chain (the jit lowering cache keys on it)
    shared = new_eqns[0].params["jaxpr"]
    new_eqns = [e.replace(params=dict(e.params, jaxpr=shared)) for e in new_eqns]
    return Chain(new_eqns, chain.idx, chain.carry)


def _find_chains(eqns, keyer: Keyer) -> list[Chain]:
    producer: dict = {}              # var -> (eqn index, output position)
    open_tail: dict = {}             # eqn index -> the Chain it ends
    chains: list[Chain] = []
    call_key: dict = {}
    for i, e in enumerate(eqns):
        if _is_call(e):
            call_key[i] = _skeleton_key(e, keyer)
            links = {}
            for p, a in enumerate(e.invars):
                if C.is_literal(a) or a not in producer:
                    continue
                j, q = producer[a]
                if j in open_tail and call_key.get(j) == call_key[i]:
                    links.setdefault(j, []).append((p, q))
            chain = None
            for j, pairs in links.items():
                ch = open_tail[j]
                pairs = tuple(pairs)
                ok_map = len({q for _, q in pairs}) == len(pairs)
                if ok_map and (len(ch.eqns) == 1 or ch.carry == pairs):
                    chain = ch
                    del open_tail[j]
                    ch.carry = pairs
                    ch.eqns.append(e)
                    ch.idx.append(i)
                    break
            if chain is None:
                chain = Chain([e], [i])
                chains.append(chain)
            open_tail[i] = chain
        for q, v in enumerate(e.outvars):
            if not C.is_dropvar(v):
                producer[v] = (i, q)
    return [c for c in chains if len(c.eqns) > 1]


def _users(eqns, outvars) -> dict:
    users: dict = {}
    for i, e in enumerate(eqns):
        for a in e.invars:
            if not C.is_literal(a):
                users.setdefault(a, []).append(i)
    for a in outvars:
        if not C.is_literal(a):
            users.setdefault(a, []).append(len(eqns))
    return users


def _cut(chain: Chain, users: dict) -> list[Chain]:
    """Split `chain` where a call's result is used (outside the chain) before the chain ends."""
    pieces, cur = [], Chain([chain.eqns[0]], [chain.idx[0]], chain.carry)
    for k in range(1, len(chain.eqns)):
        prev, end = cur.eqns[-1], chain.idx[-1]
        nxt = chain.idx[k]
        early = any(u < end and u != nxt for v in prev.outvars if not C.is_dropvar(v)
                    for u in users.get(v, ()))
        if early:
            pieces.append(cur)
            cur = Chain([chain.eqns[k]], [chain.idx[k]], chain.carry)
        else:
            cur.eqns.append(chain.eqns[k])
            cur.idx.append(chain.idx[k])
    pieces.append(cur)  # (cutting only moves ends earlier, so no new early use can appear)
    return pieces


# --- rolling one chain ---------------------------------------------------------------------------

def _same_atom(atoms) -> bool:
    a0 = atoms[0]
    if C.is_literal(a0):
        return all(C.is_literal(a) for a in atoms) and all(
            literal_key(a) == literal_key(a0) for a in atoms[1:])
    return all(a is a0 for a in atoms)


def _plan(chain: Chain, users: dict, ys_origin: dict):
    """Classify operand positions and outputs; raise Decline when the chain cannot roll."""
    first, k = chain.eqns[0], len(chain.eqns)
    carry_in = dict(chain.carry)                   # p -> q
    for p, q in chain.carry:
        ia, oa = C.aval_of(first.invars[p]), first.outvars[q].aval
        if C.aval_key(ia) != C.aval_key(oa):
            raise Decline(f"carry type differs: input {p} is {ia.str_short()}, output {q} is "
                          f"{oa.str_short()} (dtype/weak type/sharding must match exactly)")
    invariant, xs = [], []
    for p in range(len(first.invars)):
        if p in carry_in:
            continue
        atoms = [e.invars[p] for e in chain.eqns]
        (invariant if _same_atom(atoms) else xs).append(p)
    carried_q = set(carry_in.values())
    ys = []
    for q in range(len(first.outvars)):
        outs = [e.outvars[q] for e in chain.eqns]
        if q in carried_q:
            used = any(len([u for u in users.get(v, ()) if u != chain.idx[i + 1]]) > 0
                       for i, v in enumerate(outs[:-1]) if not C.is_dropvar(v))
        else:
            used = any(not C.is_dropvar(v) and users.get(v) for v in outs)
        if used:
            ys.append(q)
    # per-iteration operands that are exactly a previous scan's ys (a contiguous run of them, in
    # order, or reversed: a backward pass consuming forward residuals) are read from those ys
    reverse = False
    direct = {}
    for p in xs:
        src = [None if C.is_literal(e.invars[p]) else ys_origin.get(e.invars[p])
               for e in chain.eqns]
        if any(s is None for s in src) or len({id(s[0]) for s in src}) != 1:
            continue
        order = [s[1] for s in src]
        lo = min(order)
        if order == list(range(lo, lo + k)):
            direct[p] = (src[0][0], lo, src[0][2], False)
        elif order == list(range(lo + k - 1, lo - 1, -1)):
            direct[p] = (src[0][0], lo, src[0][2], True)
    if direct and len({d[3] for d in direct.values()}) == 1:
        reverse = next(iter(direct.values()))[3]
    else:
        direct = {}
    return carry_in, invariant, xs, ys, direct, reverse


def _roll(chain: Chain, users: dict, ys_origin: dict, unroll):
    """Replacement equations for `chain` and the substitution of its outputs."""
    from jax import lax
    import jax.numpy as jnp

    carry_in, invariant, xs, ys, direct, reverse = _plan(chain, users, ys_origin)
    first, last, k = chain.eqns[0], chain.eqns[-1], len(chain.eqns)
    order = list(range(k - 1, -1, -1)) if reverse else list(range(k))   # scan index -> element
    em = _walk.Emitter(last)
    carry_ps = sorted(carry_in)
    xs_atoms = []
    produced = []    # (atom, (stacked array, scan index, length)): later chains may read these
    for p in xs:
        if p in direct:
            y, lo, total, _ = direct[p]
            if lo == 0 and total == k:
                xs_atoms.append(y)
            else:
                xs_atoms.append(em.call(lambda a, lo=lo: lax.slice_in_dim(a, lo, lo + k), y)[0])
            continue
        atoms = [chain.eqns[i].invars[p] for i in order]
        if all(C.is_literal(a) for a in atoms):
            vals = np.stack([np.asarray(C.literal_value(a), C.aval_of(a).dtype) for a in atoms])
            aval = C.aval_of(atoms[0])
            xs_atoms.append(C.literal(vals, C.ShapedArray(vals.shape, vals.dtype,
                                                          weak_type=aval.weak_type)))
        else:
            stacked_x = em.call(lambda *vs: jnp.stack(vs), *atoms)[0]
            xs_atoms.append(stacked_x)
            produced.extend((a, (stacked_x, s, k)) for s, a in enumerate(atoms)
                            if not C.is_literal(a))

    one = _one_eqn_jaxpr(first)
    n_in = len(first.invars)
    n_c, n_inv = len(carry_ps), len(invariant)

    def rolled(*args):
        init, inv, xv = args[:n_c], args[n_c:n_c + n_inv], args[n_c + n_inv:]

        def body(carry, x):
            ins = [None] * n_in
            for p, v in zip(carry_ps, carry):
                ins[p] = v
            for p, v in zip(invariant, inv):
                ins[p] = v
            for p, v in zip(xs, x):
                ins[p] = v
            outs = C.eval_jaxpr(one, *ins)
            return [outs[carry_in[p]] for p in carry_ps], [outs[q] for q in ys]

        c, y = lax.scan(body, list(init), list(xv), length=k, reverse=reverse, unroll=unroll)
        return [*c, *y]

    args = ([first.invars[p] for p in carry_ps] + [first.invars[p] for p in invariant]
            + xs_atoms)
    outs = em.call(rolled, *args)
    final, stacked = outs[:n_c], outs[n_c:]
    env = {}
    for p, v in zip(carry_ps, final):
        old = last.outvars[carry_in[p]]
        if not C.is_dropvar(old):
            env[old] = v
    for q, y in zip(ys, stacked):
        for s, i in enumerate(order):
            old = chain.eqns[i].outvars[q]
            if C.is_dropvar(old) or old in env or not users.get(old):
                continue
            env[old] = em.call(lambda a, s=s: lax.index_in_dim(a, s, keepdims=False), y)[0]
            produced.append((env[old], (y, s, k)))
    return em.eqns, env, produced


def _one_eqn_jaxpr(eqn) -> C.ClosedJaxpr:
    """A jaxpr holding just `eqn` (on fresh variables); the body's debug info names its args."""
    body = _body_of(eqn)
    body = body.jaxpr if isinstance(body, C.ClosedJaxpr) else body
    ins = [C.new_var(C.aval_of(a)) for a in eqn.invars]
    outs = [C.new_var(v.aval) for v in eqn.outvars]
    e = C.new_eqn(ins, outs, eqn.primitive, eqn.params, eqn.effects, eqn.source_info, eqn.ctx)
    return C.closed(C.replace_jaxpr(body, constvars=[], invars=ins, outvars=outs, eqns=[e]), [])


def _reroll_level(jaxpr, keyer: Keyer, min_len: int, ctx):
    eqns = list(jaxpr.eqns)
    chains = _find_chains(eqns, keyer)
    if not chains:
        return jaxpr, 0
    users = _users(eqns, jaxpr.outvars)
    chains = [p for c in chains for p in _cut(c, users)]
    chains = [c for c in chains if len(c.eqns) >= min_len]
    if not chains:
        return jaxpr, 0
    chains.sort(key=lambda c: c.idx[-1])
    at_end = {c.idx[-1]: c for c in chains}
    removed = {i for c in chains for i in c.idx[:-1]}
    env: dict = {}
    ys_origin: dict = {}   # atom -> (stacked ys var, scan index, chain length)
    out_eqns = []
    n = 0
    for i, e in enumerate(eqns):
        if env:
            new_in = [_walk.substitute(a, env) for a in e.invars]
            if any(a is not b for a, b in zip(new_in, e.invars)):
                e = e.replace(invars=new_in)
                eqns[i] = e
        if i in removed:
            continue
        chain = at_end.get(i)
        if chain is None:
            out_eqns.append(e)
            continue
        chain.eqns = [eqns[j] for j in chain.idx]  # operands substituted so far
        orig = list(chain.eqns)
        try:
            chain = _generalize(chain, keyer)
            new, sub, produced = _roll(chain, users, ys_origin, ctx.options.unroll)
        except Decline as d:
            ctx.report.declined(NAME, orig[0], str(d))
            # keep the calls, re-emitted at the chain's end: `_cut` guarantees that nothing
            # before the end uses their results, and their operands are all defined by then
            out_eqns.extend(orig)
            continue
        out_eqns.extend(new)
        env.update(sub)
        for atom, origin in produced:
            ys_origin.setdefault(atom, origin)
        n += 1
        ctx.report.applied(NAME, chain.eqns, after=("scan",))
        ctx.report.count("reroll.chains")
        ctx.report.count(f"reroll.length.{len(chain.eqns)}")
        ctx.report.stats.setdefault("reroll.lengths", []).append(len(chain.eqns))
    if not n:
        return jaxpr, 0
    outvars = [_walk.substitute(a, env) for a in jaxpr.outvars]
    return C.replace_jaxpr(jaxpr, eqns=out_eqns, outvars=outvars), n
