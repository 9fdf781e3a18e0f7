"""Recomputed residuals: a backward call that reads a forward call's residuals recomputes them.

Under `jax.grad` a stack of layers becomes a chain of forward calls, each handing the backward
pass its residuals (every intermediate the derivative needs), and a chain of backward calls
reading them in reverse. Rolled as they are, the forward scan writes every residual of every
layer into stacked ys and the backward scan reads them back: on XLA:CPU that memory traffic is
what a scan without remat costs (a hand-written `nn.scan` of Linen blocks, 16 layers: 1.23x the
unrolled gradient's run time; with `nn.remat`, 0.78x). So before rolling, each backward call
becomes one call that runs its forward call again and then itself: the forward chain then
hands over only its carried inputs, and the backward scan's body is the forward body followed
by the backward one, as `jax.checkpoint` of the layer would make it.

    before:  c1, r1 = jit[F] c0 w1          b1' = jit[B] g2 r2 w2       (r: residuals)
             c2, r2 = jit[F] c1 w2          b0' = jit[B] g1 r1 w1
    after:   c1, _  = jit[F] c0 w1          b1' = jit[F;B] g2 c1 w2     (F;B: r = F(c, w);
             c2, _  = jit[F] c1 w2          b0' = jit[F;B] g1 c0 w1      B(g, r, w))

Used by `reroll` (never on its own), and only where both chains then roll whole: the forward scan
emits its carried inputs as ys (`reroll._plan`), the backward scan reads them in reverse. Which
targets do this is the cost model's `reroll_recompute` (the CPU). The recomputed forward calls
compute the same operations on the same operands; XLA fuses them with the backward body, so float
results may differ in the last bits, as rolling's own (README, "Exactness").
"""
from __future__ import annotations

from .. import _compat as C

NAME = "recompute"


def _body_of(eqn):
    return eqn.params["jaxpr"]


def _pairing(fwd, bwd):
    """How the backward chain `bwd` reads the forward chain `fwd`'s results, or None.

    Returns (order, taken): `order[j]` is the forward call that backward call j reads (all in
    reverse or all in order), `taken` maps a backward operand position to the forward result
    position it reads. None when the chains do not pair one to one or read no residual (only
    carried values: a body that already recomputes, such as a checkpointed layer's).
    """
    k = len(fwd.eqns)
    if len(bwd.eqns) != k or bwd.idx[0] < fwd.idx[-1]:
        return None
    made_by = {v: (i, q) for i, e in enumerate(fwd.eqns) for q, v in enumerate(e.outvars)
               if not C.is_dropvar(v)}
    order, taken, mixed = None, {}, []
    for p in range(len(bwd.eqns[0].invars)):
        src = [made_by.get(e.invars[p]) if not C.is_literal(e.invars[p]) else None
               for e in bwd.eqns]
        if all(s is None for s in src):
            continue
        if any(s is None for s in src):   # e.g. each layer's input: the first is no result
            mixed.append(p)
            continue
        if len({q for _, q in src}) != 1:
            return None
        at = [i for i, _ in src]
        if order is None:
            order = at
        if at != order:
            return None
        taken[p] = src[0][1]
    if order is None or order not in (list(range(k)), list(range(k - 1, -1, -1))):
        return None
    # an operand that is partly forward results must be one forward operand in every call
    # (the layer's input), passed to F;B as that operand
    for p in mixed:
        if not any(all(b.invars[p] is fwd.eqns[i].invars[r] for b, i in zip(bwd.eqns, order))
                   for r in range(len(fwd.eqns[0].invars))):
            return None
    carried = {q for _, q in fwd.carry}
    if all(q in carried for q in taken.values()):
        return None
    return order, taken


def _fused_body(f0, b0, taken: dict, shared: dict):
    """The body `F;B`: operands (backward operands not taken, forward operands not shared with
    them), results the backward call's."""
    kept = [p for p in range(len(b0.invars)) if p not in taken]
    b_in = {p: C.new_var(C.aval_of(b0.invars[p])) for p in kept}
    f_in = {r: b_in[shared[r]] if r in shared else C.new_var(C.aval_of(a))
            for r, a in enumerate(f0.invars)}
    f_out = [C.new_var(v.aval) for v in f0.outvars]
    f_eqn = f0.replace(invars=[f_in[r] for r in range(len(f0.invars))], outvars=f_out)
    b_ins = [f_out[taken[p]] if p in taken else b_in[p] for p in range(len(b0.invars))]
    b_out = [C.new_var(v.aval) for v in b0.outvars]
    b_eqn = b0.replace(invars=b_ins, outvars=b_out)
    invars = [b_in[p] for p in kept] + [f_in[r] for r in range(len(f0.invars)) if r not in shared]
    body = C.closed(C.new_jaxpr(invars, [f_eqn, b_eqn], b_out, "recomputed"), ())
    return body, kept


def fuse(eqns: list, chains: list, may_pair) -> tuple[list, set, set]:
    """(equations, ids of the bodies made, ids of the forward bodies they recompute): every
    backward chain that reads a forward chain's residuals, with `may_pair(fwd, bwd)` true,
    becomes calls of `F;B` (module docstring).

    The chains' calls must each share one body object (`reroll._generalize` has not run: bodies
    that differ in literals are left as they are)."""
    eqns = list(eqns)
    made: set = set()
    forwards: set = set()
    fwd_of = {}   # id(backward chain) -> id(its forward chain): each chain in one pair at most
    for bwd in chains:
        if id(bwd) in fwd_of.values():
            continue
        for fwd in chains:
            if fwd is bwd or id(fwd) in fwd_of.values() or id(fwd) in fwd_of:
                continue
            if any(_body_of(e) is not _body_of(ch.eqns[0]) for ch in (fwd, bwd) for e in ch.eqns):
                continue
            pairing = _pairing(fwd, bwd)
            if pairing is None or not may_pair(fwd, bwd):
                continue
            fwd_of[id(bwd)] = id(fwd)
            order, taken = pairing
            f0, b0 = fwd.eqns[order[0]], bwd.eqns[0]
            # a forward operand that every backward call also takes is passed once (the layer's
            # parameters: one list read in the rolled body, not two)
            shared = {}
            for r in range(len(f0.invars)):
                for p in range(len(b0.invars)):
                    if p not in taken and p not in shared.values() and all(
                            not C.is_literal(b.invars[p]) and b.invars[p] is fwd.eqns[i].invars[r]
                            for b, i in zip(bwd.eqns, order)):
                        shared[r] = p
                        break
            body, kept = _fused_body(f0, b0, taken, shared)
            made.add(id(body))
            forwards.add(id(_body_of(f0)))
            for b, i, at in zip(bwd.eqns, order, bwd.idx):
                f = fwd.eqns[i]
                ins = [b.invars[p] for p in kept] + [a for r, a in enumerate(f.invars)
                                                      if r not in shared]
                eqns[at] = C.make_jit_eqn(ins, list(b.outvars), body, "recomputed",
                                          b.source_info, b.ctx)
            break
    return eqns, made, forwards
