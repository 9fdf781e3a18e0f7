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
| anything else (same aval by structure)  | scanned xs: stacked (literals: one literal);   |
|                                         | on CPU read from its list inside the loop      |

List form (target 'cpu', chains up to `LIST_READ_LIMIT`): instead of stacking the per-layer
operands (a copy of the parameters, alive through the backward loop under `jax.grad`), step i
reads row i from the list with a `cond`, and the scan is a `custom_jvp` whose rule carries the
tangents as stacked xs (so gradients are stacked cotangents sliced once, as before):

    after:   c3 = custom_jvp_call[scan[jaxpr={ c, i ; W. c' = remat[J'] c W i }]] c0 w1 w2 w3
             (J' = { w = custom_jvp_call[cond[branches: w1 | w2 | w3]] W i ; J }: a remat body
             re-reads its row in the backward loop instead of saving it; a jit body reads
             before the call)

Bodies that differ only in scalar literals at their top level (what `fold` makes of a call
with a per-layer index) chain too: the differing literals become trailing operands of one
generalized body and are scanned as a stacked literal. So do bodies that differ only in the
offsets at which they read a window of an operand (a layer's parameters read from one shared
array, `params[3*i:3*i+3]`): the window becomes a `dynamic_slice` at start operands, and the
starts are scanned the same way (exact: each window lies in bounds, nothing is clamped).

Repeated inline code (no call: a `jax.jit(..., inline=True)` function, a Python loop over plain
code, the forward pass JAX leaves in `jax.grad` of checkpointed layers) is first outlined into a
chain of calls of one body (`passes/outline.py`) and rolled the same way; outlined calls that no
chain rolls are inlined back.

Outputs of the chain used outside it (residuals under `jax.grad`, intermediate activations)
come out of the scan as stacked ys (a carried value: the stacked inputs of the steps) and are
indexed where they were used; on the CPU at offsets
carried round a loop (`_offsets`), which XLA does not fold, so each row's reads and consumers
compile to one kernel for all rows instead of one per row (`backend.cost` `reroll_runtime_offsets`).
A chain is cut where an intermediate result is used before the chain ends. When a chain's
per-iteration operands are exactly the ys of a chain rolled before it (in order, or in reverse:
a backward pass consuming forward residuals), the scan reads those ys directly (`reverse=True`
for the reverse order) instead of stacking a copy.

Under `jax.grad` the forward chain's residuals are what the backward chain reads; on the CPU
the backward calls are first made to recompute them (`passes/recompute.py`, `backend.cost`
`reroll_recompute`), so the forward scan stacks only each step's carried input and the backward
scan runs the forward body again, as a hand-written scan of checkpointed layers does.

Whether rolling pays is decided per target by `backend.cost`: without a contraction only the
forward is rolled (`reroll_backward`); a body whose contractions sit among equations that move data
or call a library every trip (concatenates of irreps chunks, a kernel gathered through a group's
product table, FFTs: `reroll_body`) is declined on the CPU with the model's estimate, a soft
verdict that `autotune="time"` measures instead of applying. Beyond that the jaxpr does not say: on
the CPU, rolling a training step wins where XLA fuses the unrolled backward pass across layers and
loses where it does not (`backend.cost.REROLL_TIMED`). With `autotune="time"` the whole program is
compiled and run both ways once (`backend.autotune.choose_timed`, cached on disk) and the rolled
one is kept only where it wins.

Tolerance: the scan computes the same operations in the same order; XLA may fuse a loop body
differently from an unrolled program, so float results can differ in the last bits (measured
in `bench/dedup.py`; the tests use rtol 1e-5 for float32). Integer programs are exact.
"""
from __future__ import annotations

import collections
import dataclasses
import functools

import numpy as np

from ..backend import autotune as _autotune
from .. import _compat as C
from ..backend import cost as _cost
from ..analysis import exact as _exact
from .. import _walk
from ..report.records import Decline
from ..analysis.structural import Keyer, literal_key
from . import outline, recompute

NAME = "reroll"
DEFAULT_MIN_LENGTH = 3


def min_length(opt) -> int | None:
    if opt is False or opt is None or opt == "auto":   # ("auto": passes/rounds.py alone)
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
    min_len = min_length(ctx.options.reroll)
    if min_len is None:
        return cj, False
    keyer = Keyer()
    report, measured = ctx.report, ctx.options.autotune == "time"
    if measured:   # what rolling records, to take back if the measurement declines it
        before = (len(report.rewrites), collections.Counter(report.counts),
                  list(report.stats.get("reroll.lengths", [])))
    # the cost model's run-time verdicts (`_slow_body`) are soft: where the whole program is
    # measured below, the measurement decides instead
    soft = measured and _autotune.compiler_for(ctx.target)[0] == "local"
    out, rolled = _walk.map_levels(
        cj, lambda j: outline_and_reroll(j, keyer, min_len, ctx, soft))
    if rolled and measured:
        # whether rolling pays is XLA's fusion of the unrolled program, which the jaxpr does not
        # show (`backend.cost.REROLL_TIMED`): measured on the whole program, before and after
        go, why = _autotune.choose_timed(ctx, NAME, cj, out,
                                         key_extra=(min_len, str(ctx.options.unroll)),
                                         run=not _open_ended(cj))
        report.stats.setdefault("autotune.choices", []).append(why)
        if not go:
            del report.rewrites[before[0]:]
            declined = report.counts["reroll.declined"]       # chains declined stay declined
            report.counts = before[1]
            if declined:
                report.counts["reroll.declined"] = declined
            report.stats["reroll.lengths"] = before[2]
            report.declined(NAME, cj.jaxpr.eqns[0] if cj.jaxpr.eqns else None, why)
            report.count("reroll.declined_measured")
            return cj, False
    return out, rolled > 0


def _open_ended(cj) -> bool:
    """Whether `cj` holds a `while` that is not a counted loop (its trips depend on the data)."""
    from .flatten import _while_loop
    return any(e.primitive.name == "while" and _while_loop(e) is None
               for e in _walk.iter_eqns(cj))


def outline_and_reroll(jaxpr, keyer: Keyer, min_len: int, ctx, soft: bool = False,
                        keep=None):
    """Chains of calls are rolled; then runs of repeated inline code left become calls
    (`outline`) and are rolled the same way. Outlined calls that no chain rolls are inlined
    back, so outlining alone never changes a level. `keep(scan equation)`: None to roll a
    chain, else why not (the chain is left as it was, nothing recorded but a count)."""
    rolled, n = _reroll_level(jaxpr, keyer, min_len, ctx, soft, keep)
    outlined, bodies = outline.outline_level(rolled, keyer, min_len,
                                             None if soft or keep else _segment_veto(ctx))
    if not bodies:
        return rolled, n
    new, m = _reroll_level(outlined, keyer, min_len, ctx, soft, keep)
    if not m:
        return rolled, n
    left = {id(e.params["jaxpr"]) for e in new.eqns if C.is_jit(e)} & bodies
    ctx.report.count(f"{NAME}.outlined_runs_rolled", len(bodies) - len(left))
    return outline.inline_outlined(new, bodies), n + m


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
            if outline.scalar_literal(a)]


def _window_reads(j) -> list[int]:
    """Equations of body `j` (top level) that read a window of one of its operands at a static
    offset: a unit-stride `slice` of an invar (a layer's parameters read from a shared array,
    `params[3*i:3*i+3]`, inside the layer's function)."""
    ins = set(j.invars)
    return [n for n, e in enumerate(j.eqns)
            if e.primitive.name == "slice" and not C.is_literal(e.invars[0])
            and e.invars[0] in ins and all(s in (None, 1) for s in (e.params["strides"] or ()))]


def _window_sizes(e) -> tuple:
    return tuple(h - l for l, h in zip(e.params["start_indices"], e.params["limit_indices"]))


def _skeleton_key(eqn, keyer: Keyer):
    body = _body_of(eqn)
    j = body.jaxpr if isinstance(body, C.ClosedJaxpr) else body
    spots = set(_scalar_literals(body))
    windows = set(_window_reads(j))
    env: dict = {}
    for v in (*j.constvars, *j.invars):
        env[v] = (len(env), keyer.aval(v.aval))
    ek = []
    for n, e in enumerate(j.eqns):
        ins = tuple(("lit?", keyer.aval(C.aval_of(a))) if (n, p) in spots else keyer.atom(a, env)
                    for p, a in enumerate(e.invars))
        if n in windows:   # keyed by its size, not its offset
            e = e.replace(params=dict(e.params, start_indices=(0,) * len(_window_sizes(e)),
                                      limit_indices=_window_sizes(e)))
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
    # windows read at offsets that differ along the chain: their start indices become operands
    windows = [n for n in _window_reads(j0)
               if any(j.eqns[n].params["start_indices"] != j0.eqns[n].params["start_indices"]
                      for j in jj[1:])]
    new_vars = [C.new_var(C.aval_of(j0.eqns[n].invars[p])) for n, p in lifted]
    starts = {n: [C.new_var(C.ShapedArray((), np.dtype(np.int32)))
                  for _ in j0.eqns[n].params["start_indices"]] for n in windows}
    where = dict(zip(lifted, new_vars))
    eqns = []
    for n, e in enumerate(j0.eqns):
        if n in starts:
            eqns.extend(_dynamic_window(e, starts[n]))
            continue
        eqns.append(e if not any((n, p) in where for p in range(len(e.invars))) else
                    e.replace(invars=[where.get((n, p), a) for p, a in enumerate(e.invars)]))
    new_vars += [v for n in windows for v in starts[n]]
    di = j0.debug_info
    if di is not None and di.arg_names is not None:
        di = di._replace(arg_names=tuple(di.arg_names) + ("",) * len(new_vars))
    gj = C.replace_jaxpr(j0, invars=[*j0.invars, *new_vars], eqns=eqns, debug_info=di)
    new_eqns = []
    for e, j in zip(chain.eqns, jj):
        extra = [j.eqns[n].invars[p] for n, p in lifted] + [
            C.literal(np.int32(i)) for n in windows for i in j.eqns[n].params["start_indices"]]
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


def _dynamic_window(e, starts):
    """The window read `e` (`_window_reads`) at start operands `starts`, writing `e`'s result;
    exact: every call's window lies in bounds, so `dynamic_slice` clamps nothing.

        before:  w = slice[start_indices=(3,), limit_indices=(6,)] params
        after:   w = dynamic_slice[slice_sizes=(3,)] params i            (i: 3 in this call)
    """
    from jax import lax
    sizes = _window_sizes(e)
    em = _walk.Emitter(e)
    em.call(lambda x, *i: lax.dynamic_slice(x, i, sizes), e.invars[0], *starts)
    *pre, last = em.eqns
    return [*pre, last.replace(outvars=list(e.outvars))]


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


def _same_broadcast(atoms, made: dict):
    """The first of `atoms`' producers where each is a `broadcast_in_dim` of one operand with one
    set of params (a table broadcast over the batch, once per round before cse), else None."""
    eqns = [None if C.is_literal(a) else made.get(a) for a in atoms]
    e0 = eqns[0]
    if e0 is None or e0.primitive.name != "broadcast_in_dim" or any(
            e is None or e.primitive is not e0.primitive or e.params != e0.params
            for e in eqns[1:]):
        return None
    return e0 if _same_atom([e.invars[0] for e in eqns]) else None


def _plan(chain: Chain, users: dict, ys_origin: dict, made: dict | None = None):
    """Classify operand positions and outputs; raise Decline when the chain cannot roll.
    `made` (the level's producers): an operand that is the same broadcast in every call is
    loop-invariant as the broadcast's operand, re-broadcast inside the body (`sunk`), where XLA
    fuses it into its consumers; stacked, a batch-sized mask would be read every trip (Keccak's
    rotation guard at 65,536 states: 1.9x the `fori_loop` form's run)."""
    first, k = chain.eqns[0], len(chain.eqns)
    carry_in = dict(chain.carry)                   # p -> q
    for p, q in chain.carry:
        ia, oa = C.aval_of(first.invars[p]), first.outvars[q].aval
        if C.aval_key(ia) != C.aval_key(oa):
            raise Decline(f"carry type differs: input {p} is {ia.str_short()}, output {q} is "
                          f"{oa.str_short()} (dtype/weak type/sharding must match exactly)")
    invariant, xs, sunk = [], [], {}
    for p in range(len(first.invars)):
        if p in carry_in:
            continue
        atoms = [e.invars[p] for e in chain.eqns]
        if _same_atom(atoms):
            invariant.append(p)
        elif made is not None and (b := _same_broadcast(atoms, made)) is not None:
            invariant.append(p)
            sunk[p] = b
        else:
            xs.append(p)
    carried_p = {q: p for p, q in carry_in.items()}
    ys = []   # ("out", result position) or ("in", carried operand position): stacked per step
    for q in range(len(first.outvars)):
        outs = [e.outvars[q] for e in chain.eqns]
        if q in carried_p:
            # a carried value used outside comes out as the stacked *inputs* of the steps: the
            # same values but the first and last, and what a backward chain that recomputes
            # each step (`recompute`) reads
            if any(len([u for u in users.get(v, ()) if u != chain.idx[i + 1]]) > 0
                   for i, v in enumerate(outs[:-1]) if not C.is_dropvar(v)):
                ys.append(("in", carried_p[q]))
        elif any(not C.is_dropvar(v) and users.get(v) for v in outs):
            ys.append(("out", q))
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
    return carry_in, invariant, xs, ys, direct, reverse, sunk


@dataclasses.dataclass
class _Layout:
    """Where the body's operands and results go in a rolled scan."""
    first: object                    # the chain's first call (its body and params)
    k: int
    carry_in: dict                   # operand position -> result position carried into it
    carry_ps: list                   # carried operand positions, sorted
    invariant: list                  # loop-invariant operand positions
    xs: list                         # scanned positions: stacked, a scan's ys, or literals
    listed: list                     # positions read from their list
    ys: list                         # what comes out as stacked ys: ("out", result position)
                                     # or ("in", carried operand position)
    sunk: dict = dataclasses.field(default_factory=dict)   # invariant position -> the broadcast
                                     # re-made inside the body from its operand (`_plan`)

    def assemble(self, carry, inv, xs, rows) -> list:
        ins = [None] * len(self.first.invars)
        for ps, vs in ((self.carry_ps, carry), (self.invariant, inv), (self.xs, xs),
                       (self.listed, rows)):
            for p, v in zip(ps, vs):
                ins[p] = v
        for p, b in self.sunk.items():
            ins[p] = b.primitive.bind(ins[p], **b.params)
        return ins

    def split_outs(self, outs, carry):
        """(carry out, ys) of one step from its results and its carried inputs."""
        at = {p: n for n, p in enumerate(self.carry_ps)}
        return ([outs[self.carry_in[p]] for p in self.carry_ps],
                [outs[q] if kind == "out" else carry[at[q]] for kind, q in self.ys])

    def y_aval(self, n: int):
        kind, q = self.ys[n]
        return self.first.outvars[q].aval if kind == "out" else C.aval_of(self.first.invars[q])


def _roll(chain: Chain, users: dict, ys_origin: dict, unroll, lists: bool = False,
          forward_only: str | None = None, offsets: bool = False, made: dict | None = None):
    """Replacement equations for `chain` and the substitution of its outputs.

    With `lists`, per-iteration operands that would be stacked are read from their list inside
    the loop instead (`_listed_scan`), when the chain is short enough for one `cond` per step.
    With `offsets`, a stacked result used outside is read row by row at offsets XLA cannot
    fold (`_offsets`), so that the reads and their consumers compile to one kernel for all rows.
    With `forward_only` (the cost model's reason not to roll a backward pass), a backward
    chain (one reading a rolled chain's residuals in reverse) declines, and a forward one is
    rolled with the unrolled chain as its derivative (`_forward_only`).
    """
    from jax import lax
    import jax.numpy as jnp

    carry_in, invariant, xs, ys, direct, reverse, sunk = _plan(chain, users, ys_origin, made)
    if forward_only and direct and reverse:
        raise Decline(f"backward pass not rolled: {forward_only}")
    if forward_only:
        lists = False
    first, last, k = chain.eqns[0], chain.eqns[-1], len(chain.eqns)
    order = list(range(k - 1, -1, -1)) if reverse else list(range(k))   # scan index -> element
    em = _walk.Emitter(last)
    carry_ps = sorted(carry_in)
    listed = [p for p in xs
              if p not in direct and _listable([chain.eqns[i].invars[p] for i in order])]
    if not lists or k * k * len(listed) > LIST_READ_LIMIT:
        listed = []
    xs = [p for p in xs if p not in listed]
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

    lay = _Layout(first, k, carry_in, carry_ps, invariant, xs, listed, ys, sunk)
    args = ([first.invars[p] for p in carry_ps]
            + [sunk[p].invars[0] if p in sunk else first.invars[p] for p in invariant]
            + xs_atoms)
    if listed:
        rolled = _listed_scan(lay, reverse, unroll)
        args += [chain.eqns[i].invars[p] for p in listed for i in order]
    elif forward_only:
        rolled = _forward_only(lay, reverse, unroll)
    else:
        rolled = _stacked_scan(lay, reverse, unroll)
    outs = em.call(rolled, *args)
    final, stacked = outs[:len(carry_ps)], outs[len(carry_ps):]
    env = {}
    for p, v in zip(carry_ps, final):
        old = last.outvars[carry_in[p]]
        if not C.is_dropvar(old):
            env[old] = v
    at = []  # the k row offsets, made once the first row is read
    for (kind, q), y in zip(ys, stacked):
        for s, i in enumerate(order):
            if kind == "in":   # row s is step i's carried input: the first's, or step i-1's result
                if i == 0:
                    if not C.is_literal(chain.eqns[0].invars[q]):
                        produced.append((chain.eqns[0].invars[q], (y, s, k)))
                    continue
                old = chain.eqns[i - 1].outvars[carry_in[q]]
            else:
                old = chain.eqns[i].outvars[q]
            if C.is_dropvar(old) or old in env or not users.get(old):
                continue
            if offsets:
                at = at or em.call(functools.partial(_offsets, k))
                env[old] = em.call_shared(_dynamic_row, y, at[s])[0]
            else:
                env[old] = em.call_shared(_static_row, y, static=(s,))[0]
            produced.append((env[old], (y, s, k)))
    return em.eqns, env, produced


def _dynamic_row(a, o):
    from jax import lax
    return lax.dynamic_index_in_dim(a, o, keepdims=False)


def _static_row(a, s: int):
    from jax import lax
    return lax.index_in_dim(a, s, keepdims=False)


def is_offsets_loop(eqn) -> bool:
    """Whether `eqn` has the shape of an `_offsets` loop (a scan carrying int32 scalars only,
    nothing scanned), not of a rolled chain (for counting rolled scans; a user's loop of that
    shape counts here too)."""
    if eqn.primitive.name != "scan" or eqn.params["num_consts"] or (
            len(eqn.invars) != eqn.params["num_carry"]):
        return False
    return all(C.aval_of(a).shape == () and C.aval_of(a).dtype == np.int32 for a in eqn.invars)


def _offsets(k: int):
    """The row offsets 0, 1, ..., k-1 carried round a loop of k trips, one place on per trip:
    back where they started, as values XLA does not fold into the kernels that read at them.

        before:  r3 = slice[start=(3, 0)] y ; r3' = squeeze r3 ; u3 = f r3'    (one kernel a row)
        after:   o0..o{k-1} = fori_loop[k trips: rotate] 0..k-1
                 r3 = dynamic_slice y o3 0 ; r3' = squeeze r3 ; u3 = f r3'       (one for all)
    """
    from jax import lax
    rows = [np.int32(r) for r in range(k)]
    return lax.fori_loop(0, k, lambda _, r: r[1:] + r[:1], rows)


def _stacked_scan(lay: _Layout, reverse: bool, unroll):
    """The rolled chain as a function of (init, invariants, stacked xs): the body is the call."""
    from jax import lax
    one = _one_eqn_jaxpr(lay.first)
    n_c, n_inv = len(lay.carry_ps), len(lay.invariant)

    def rolled(*args):
        init, inv, xv = args[:n_c], args[n_c:n_c + n_inv], args[n_c + n_inv:]

        def body(carry, x):
            return lay.split_outs(C.eval_jaxpr(one, *lay.assemble(carry, inv, x, ())), carry)

        c, y = lax.scan(body, list(init), list(xv), length=lay.k, reverse=reverse, unroll=unroll)
        return [*c, *y]
    return rolled


def _forward_only(lay: _Layout, reverse: bool, unroll):
    """The stacked scan as the primal of a `custom_jvp` whose rule is the unrolled chain's JVP:
    run as is, the program is the scan; differentiated (`jax.grad` of the optimized function),
    JAX sees the unrolled chain, as under `jax.jit`.

        rolled(c0, inv, X) = scan[c, x: call(c, inv, x)](c0, X)
        jvp:   jax.jvp(unrolled), unrolled(c0, inv, X) = call(..call(c0, inv, X[0]).., X[k-1])
    """
    import jax
    import jax.numpy as jnp

    scan = _stacked_scan(lay, reverse, unroll)
    one = _one_eqn_jaxpr(lay.first)
    n_c, n_inv = len(lay.carry_ps), len(lay.invariant)

    def unrolled(*args):
        c, inv, xv = list(args[:n_c]), args[n_c:n_c + n_inv], args[n_c + n_inv:]
        ys = [None] * lay.k
        for s in (range(lay.k - 1, -1, -1) if reverse else range(lay.k)):
            c, ys[s] = lay.split_outs(C.eval_jaxpr(one, *lay.assemble(c, inv, [x[s] for x in xv],
                                                                        ())), c)
        return [*c, *(jnp.stack([y[n] for y in ys]) for n in range(len(lay.ys)))]

    rolled = jax.custom_jvp(scan)
    rolled.defjvp(lambda primals, tangents: jax.jvp(unrolled, primals, tangents))
    return rolled


# --- per-iteration operands read from their list (no stacked copy) ------------------------------
# A stacked xs is a second copy of every per-layer operand (the parameters), and under `jax.grad`
# JAX's scan keeps it alive through the backward loop, while the stacked cotangents are built:
# two extra copies. Reading row i from the list itself inside the loop (a `cond` with a branch
# per row: XLA prunes each branch to its own row's operands and copies just those) needs none.
# Differentiated as is, though, the list would be loop-invariant: its cotangents would be k
# accumulators, each added to at every step (k^2 work). So the rolled scan is a `custom_jvp`
# whose rule routes the tangents through stacked xs as before: the primal is read from the
# list, the tangent of row i is row i of the stacked tangents, and its transpose is the usual
# stacked cotangents + one slice per element. Under a remat body the read goes inside the remat,
# so the backward loop re-reads the row instead of saving it as a (stacked) residual.
#
# Measured on XLA:CPU (bench/dedup.py's stack, d=64, `jax.grad(optimize(stack))`, paired, list
# form vs stacked form): N=24: temp memory 4.69 vs 9.19 MB (params 4.52, jax.jit 2.00), run
# 11.8 vs 11.8 ms (jax.jit 17.7), trace+lower+compile 2.87 vs 2.73 s (jax.jit 11.1); N=64: 12.5
# vs 24.5 MB, 32.8 vs 34.7 ms, 9.05 vs 8.63 s; gradients bit-identical between the two forms.
# Neither form closes the compile gap to a scan over stacked inputs: XLA:CPU compiles one kernel
# per output slice of the stacked cotangents (N x leaves), as for a hand-written list-input scan.
# Which targets read from lists is the cost model's `reroll_list_read` (CPU only): XLA:GPU's
# conditional reads its branch index back to the host (a sync per step) unless it runs inside
# a command buffer; not measured. Each of the k branches takes all k * len(listed) operands, so
# the jaxpr grows as k^2: long chains (`LIST_READ_LIMIT`) keep the stacked form too.

LIST_READ_LIMIT = 1 << 16        # most k * k * (listed positions) for the list form


def _listable(atoms) -> bool:
    """Per-iteration operands that can be read from their list: one aval, not all literals."""
    if all(C.is_literal(a) for a in atoms):
        return False
    return len({C.aval_key(C.aval_of(a)) for a in atoms}) == 1


def _list_read(lists, i):
    """Row `i` of each list (`lists[m][j]`: position m's operand of scan step j): one `switch`."""
    from jax import lax
    branches = [lambda ls, j=j: [ls_m[j] for ls_m in ls] for j in range(len(lists[0]))]
    return lax.switch(i, branches, [list(ls_m) for ls_m in lists])


@functools.lru_cache(maxsize=64)
def _read_jaxpr(k: int, avals: tuple) -> C.ClosedJaxpr:
    """`_list_read` traced once per operand types: every trace of the rolled chain (the rewrite,
    `jax.grad`'s jvp, partial eval, DCE) then holds the same branch jaxprs, and JAX's caches keyed
    on a jaxpr object work for them."""
    def flat(i, *ops):
        return _list_read([ops[m * k:(m + 1) * k] for m in range(len(ops) // k)], i)
    return C.trace_avals(flat, avals)


C.register_cache(_read_jaxpr, "jaxrewrite: reroll row reads")


@functools.lru_cache(maxsize=1)
def _reader():
    """`_list_read` as a `custom_jvp` (the tangent of a row is the same row of the tangents).

    Partial eval of a `cond` walks every branch even when none of its operands is
    differentiated (JAX's `cond` rules have no all-known shortcut); a `custom_jvp_call` whose
    operands are all known is passed through untouched. Here they are always known: the rolled
    scan's own rule gives rows their tangents, so this rule runs only for higher orders.
    """
    import jax

    def fn(lists, i):
        ops = [o for ls_m in lists for o in ls_m]
        return C.eval_jaxpr(_read_jaxpr(len(lists[0]), tuple(jax.typeof(o) for o in (i, *ops))),
                            i, *ops)

    @jax.custom_jvp
    def read(lists, i):
        return fn(lists, i)

    @read.defjvp
    def read_jvp(primals, tangents):
        (lists, i), (dlists, _) = primals, tangents
        rows_t = [_zero_tangent(ls_m[0]) for ls_m in lists]       # integer rows: float0
        live = [m for m, ls_m in enumerate(lists) if _inexact(ls_m[0])]
        for m, t in zip(live, read([dlists[m] for m in live], i) if live else ()):
            rows_t[m] = t
        return read(lists, i), rows_t
    return read


def _body_call(first):
    """(call, wrap): `call(ins)` evaluates the body; `wrap(f)` gives `f` the call's remat, so that
    the list read inside `f` is recomputed with the body rather than saved."""
    import jax
    if first.primitive is C.remat_p:
        inner = C.closed(_body_of(first), ())
        prm = first.params
        return (lambda ins: C.eval_jaxpr(inner, *ins),
                lambda f: jax.checkpoint(f, prevent_cse=prm["prevent_cse"], policy=prm["policy"]))
    one = _one_eqn_jaxpr(first)
    return (lambda ins: C.eval_jaxpr(one, *ins)), (lambda f: f)


def _nonzero(t) -> bool:
    import jax
    from jax.custom_derivatives import SymbolicZero
    return not isinstance(t, SymbolicZero) and np.dtype(t.dtype) != jax.dtypes.float0


def _inexact(x) -> bool:
    return np.issubdtype(np.dtype(x.dtype), np.inexact)


def _zero_tangent(x):
    import jax
    import jax.numpy as jnp
    return jnp.zeros_like(x) if _inexact(x) else np.zeros(np.shape(x), jax.dtypes.float0)


def _tangents(primals, positions, tangents) -> list:
    """Tangents for `primals`: `tangents` at `positions`, zeros (float0 for integers) elsewhere."""
    out = [_zero_tangent(v) for v in primals]
    for j, t in zip(positions, tangents):
        out[j] = t
    return out


def _listed_scan(lay: _Layout, reverse: bool, unroll):
    """The rolled chain as a function of (init, invariants, xs, lists flattened), a `custom_jvp`.

        rolled(c0, inv, X, w_1..w_k) = scan[body: c, (i, x) -> call(c, inv, x, switch(i, w))]
        jvp: scan over (i, x, dx, T) with T = stack(dw_1..dw_k); the row's tangent is T[i]

    Tangents are symbolic-zero aware: positions with no tangent are not differentiated (no
    stacked zeros), and an integer operand never is.
    """
    import jax
    import jax.numpy as jnp
    from jax import lax

    k = lay.k
    n_c, n_inv, n_x, n_l = len(lay.carry_ps), len(lay.invariant), len(lay.xs), len(lay.listed)
    call, wrap = _body_call(lay.first)
    read = _reader()

    def split(args):
        c, inv, x, flat = (list(args[:n_c]), list(args[n_c:n_c + n_inv]),
                           list(args[n_c + n_inv:n_c + n_inv + n_x]), args[n_c + n_inv + n_x:])
        return c, inv, x, [tuple(flat[m * k:(m + 1) * k]) for m in range(n_l)]

    def scan(body, init, xs):
        return lax.scan(body, init, [jnp.arange(k, dtype=np.int32), *xs], length=k,
                        reverse=reverse, unroll=unroll)

    @wrap
    def step(c, inv, x, lists, i):
        return call(lay.assemble(c, inv, x, read(lists, i)))

    def primal(*args):
        init, inv, xs, lists = split(args)
        c, y = scan(lambda c, ix: lay.split_outs(step(c, inv, ix[1:], lists, ix[0]), c), init,
                    xs)
        return [*c, *y]

    def jvp(primals, tangents):
        init, inv, xs, lists = split(primals)
        dinit, dinv, dxs, dlists = split(tangents)
        if not any(_nonzero(t) for t in tangents):
            out = primal(*primals)
            return out, [_zero_tangent(o) for o in out]
        c_d = [j for j in range(n_c) if _inexact(init[j])]       # carried tangents
        inv_d = [j for j in range(n_inv) if _nonzero(dinv[j])]
        x_d = [j for j in range(n_x) if _nonzero(dxs[j])]
        l_d = [m for m in range(n_l) if any(_nonzero(t) for t in dlists[m])]
        stacked_t = [jnp.stack([t if _nonzero(t) else _zero_tangent(w)
                                for t, w in zip(dlists[m], lists[m])]) for m in l_d]
        dc0 = [dinit[j] if _nonzero(dinit[j]) else _zero_tangent(init[j]) for j in c_d]
        dinv_d = [dinv[j] for j in inv_d]
        y_d = [n for n in range(len(lay.ys)) if _inexact(lay.y_aval(n))]

        @wrap
        def step_jvp(c, dc, inv, dinv, x, dx, lists, i, t):
            rows = read(lists, i)

            def f(cv, iv, xv, rv):
                c2, inv2, x2, rows2 = list(c), list(inv), list(x), list(rows)
                for dst, ps, vs in ((c2, c_d, cv), (inv2, inv_d, iv), (x2, x_d, xv),
                                    (rows2, l_d, rv)):
                    for p, v in zip(ps, vs):
                        dst[p] = v
                return call(lay.assemble(c2, inv2, x2, rows2))
            primals = tuple([vs[p] for p in ps] for vs, ps in ((c, c_d), (inv, inv_d), (x, x_d),
                                                                (rows, l_d)))
            return jax.jvp(f, primals, (list(dc), list(dinv), list(dx), list(t)))

        def body(carry, ix):
            (c, dc), i = carry, ix[0]
            x, dx, t = ix[1:1 + n_x], ix[1 + n_x:1 + n_x + len(x_d)], ix[1 + n_x + len(x_d):]
            outs, douts = step_jvp(c, dc, inv, dinv_d, x, dx, lists, i, t)
            c_out, y_out = lay.split_outs(outs, c)
            dc_out, dy_out = lay.split_outs(douts, _tangents(c, c_d, dc))
            return (c_out, [dc_out[j] for j in c_d]), (y_out, [dy_out[n] for n in y_d])

        (c, dc), (y, dy) = scan(body, (init, dc0), [*xs, *(dxs[j] for j in x_d), *stacked_t])
        return [*c, *y], [*_tangents(c, c_d, dc), *_tangents(y, y_d, dy)]

    rolled = jax.custom_jvp(primal)
    rolled.defjvp(jvp, symbolic_zeros=True)
    return rolled


def _one_eqn_jaxpr(eqn) -> C.ClosedJaxpr:
    """A jaxpr holding just `eqn` (on fresh variables); the body's debug info names its args."""
    body = _body_of(eqn)
    body = body.jaxpr if isinstance(body, C.ClosedJaxpr) else body
    ins = [C.new_var(C.aval_of(a)) for a in eqn.invars]
    outs = [C.new_var(v.aval) for v in eqn.outvars]
    e = C.new_eqn(ins, outs, eqn.primitive, eqn.params, eqn.effects, eqn.source_info, eqn.ctx)
    return C.closed(C.replace_jaxpr(body, constvars=[], invars=ins, outvars=outs, eqns=[e]), [])


def _differentiable(call) -> bool:
    """Whether a call has a float operand and result (else it has no derivative to keep)."""
    return (any(_inexact(C.aval_of(a)) for a in call.invars)
            and any(_inexact(v.aval) for v in call.outvars))


def _has_contraction(call) -> bool:
    """Whether a call's body holds a contraction (`backend.cost.REROLL_CONTRACTIONS`), at any
    depth."""
    return any(e.primitive.name in _cost.REROLL_CONTRACTIONS
               for e in _walk.iter_eqns(C.closed(_body_of(call), ())
                                        if not isinstance(_body_of(call), C.ClosedJaxpr)
                                        else _body_of(call)))


def _forward_only_reason(call, ctx) -> str | None:
    """Why a chain of `call`s is rolled forward only (its backward kept unrolled), or None."""
    return (_cost.reroll_backward(_has_contraction(call), ctx.target)
            if _differentiable(call) else None)


def _body_cost(call, trips: int, target) -> str | None:
    """`backend.cost.reroll_body` of `trips` calls of `call`: its body's equations, at any depth,
    that `REROLL_MOVERS` names, and its contractions."""
    body = _body_of(call)
    cj = body if isinstance(body, C.ClosedJaxpr) else C.closed(body, ())
    return _prims_cost(collections.Counter(e.primitive.name for e in _walk.iter_eqns(cj)),
                       trips, target)


def _prims_cost(prims: collections.Counter, trips: int, target) -> str | None:
    """`backend.cost.reroll_body` of a body holding `prims` (primitive name -> count)."""
    return _cost.reroll_body({p: n for p, n in prims.items() if p in _cost.REROLL_MOVERS},
                             sum(prims[p] for p in _cost.REROLL_CONTRACTIONS), trips, target)


def _segment_veto(ctx):
    """`outline_level`'s veto: the cost model's verdict on a run of inline code (one segment's
    equations, at any depth), recorded as a decline, before a body is built for it."""
    def veto(segment, trips: int) -> str | None:
        prims = collections.Counter(e.primitive.name for e in segment)
        for e in segment:
            for _, _, sub in C.params_jaxprs(e.params):
                prims.update(q.primitive.name for q in _walk.iter_eqns(sub))
        why = _prims_cost(prims, trips, ctx.target)
        if why is not None:
            ctx.report.count(f"{NAME}.declined_by_cost")
            ctx.report.declined(NAME, segment[0], why)
        return why
    return veto


def _slow_body(call, trips: int, ctx, soft: bool) -> str | None:
    """The cost model's reason not to roll `trips` calls of `call`'s body (run time), or None.
    A soft verdict: with `soft` (the program is measured, `autotune="time"`) it is noted and
    the measurement decides."""
    why = _body_cost(call, trips, ctx.target)
    if why is not None and soft:
        ctx.report.count(f"{NAME}.model_overridden")
        ctx.report.stats.setdefault("reroll.model_estimates", []).append(why)
        return None
    return why


def _chains(eqns, outvars, keyer: Keyer, min_len: int):
    """(chains worth rolling, cut where an intermediate is used early; users of each value)."""
    chains = _find_chains(eqns, keyer)
    if not chains:
        return [], {}
    users = _walk.uses(eqns, outvars)
    chains = [p for c in chains for p in _cut(c, users)]
    return [c for c in chains if len(c.eqns) >= min_len], users


def _recompute(eqns, chains, users, outvars, keyer: Keyer, min_len: int, ctx,
               soft: bool = False):
    """(eqns, chains, users) after backward chains that read forward residuals are made to
    recompute them (`recompute.fuse`), where both chains then roll whole; else as they were."""
    def may_pair(fwd, bwd):
        # (a pair the cost model declines is left as it is: its calls are declined whole)
        slow = not soft and any(_body_cost(c.eqns[0], len(c.eqns), ctx.target)
                                for c in (fwd, bwd))
        return (not slow and _forward_only_reason(fwd.eqns[0], ctx) is None
                and _exact.reason(ctx, [a for e in (*fwd.eqns, *bwd.eqns)
                                        for a in _exact.eqn_atoms(e)], "rolling") is None)

    new_eqns, made, forwards = recompute.fuse(eqns, chains, may_pair)
    if not made:
        return eqns, chains, users
    new_chains, new_users = _chains(new_eqns, outvars, keyer, min_len)
    fused = [c for c in new_chains if id(_body_of(c.eqns[0])) in made]
    try:   # every fused call, and the forward it recomputes, must be in a chain that rolls
        # (else the forward runs twice)
        if sum(len(c.eqns) for c in fused) != sum(
                1 for e in new_eqns if C.is_jit(e) and id(_body_of(e)) in made):
            raise Decline("a recomputing call is not in a chain")
        for c in new_chains:
            if id(_body_of(c.eqns[0])) in made | forwards:
                _plan(_generalize(c, keyer), new_users, {})
    except Decline as d:
        ctx.report.count(f"{NAME}.recompute_declined")
        ctx.report.stats.setdefault("reroll.recompute_declined", []).append(str(d))
        return eqns, chains, users
    ctx.report.count(f"{NAME}.recomputed", len(fused))
    return new_eqns, new_chains, new_users


def _carries_pieces(chain: Chain) -> bool:
    """Whether the rolled loop carries pieces of one split state: two or more carried values of
    one shape and dtype (a run of rounds scalarize split: ChaCha20's 16 words). XLA:CPU copies
    each at the top of every trip unless asked not to (`backend/compile_options.py`)."""
    kinds = collections.Counter((tuple(C.aval_of(chain.eqns[0].invars[p]).shape),
                                 str(C.aval_of(chain.eqns[0].invars[p]).dtype))
                                for p, _ in chain.carry)
    return max(kinds.values(), default=0) >= 2


class _Producers:
    """`get(var)`: the equation of `eqns` that makes `var` (None for an input)."""
    def __init__(self, eqns: list, at: dict):
        self.eqns, self.at = eqns, at

    def get(self, v):
        j = self.at.get(v)
        return None if j is None else self.eqns[j]


def _reroll_level(jaxpr, keyer: Keyer, min_len: int, ctx, soft: bool = False, keep=None):
    eqns = list(jaxpr.eqns)
    chains, users = _chains(eqns, jaxpr.outvars, keyer, min_len)
    if not chains:
        return jaxpr, 0
    costs = _cost.costs(ctx.target)
    if costs.reroll_recompute and keep is None:
        eqns, chains, users = _recompute(eqns, chains, users, jaxpr.outvars, keyer, min_len, ctx,
                                         soft)
    chains.sort(key=lambda c: c.idx[-1])
    at_end = {c.idx[-1]: c for c in chains}
    removed = {i for c in chains for i in c.idx[:-1]}
    # each value's producer, as renamed so far (`eqns[j]` is updated below before it is read)
    made_at = {v: j for j, e in enumerate(eqns) for v in e.outvars}
    made = _Producers(eqns, made_at)
    env: dict = {}
    ys_origin: dict = {}   # atom -> (stacked ys var, scan index, chain length)
    out_eqns = []
    n = 0
    for i, e in enumerate(eqns):
        e = eqns[i] = _walk.rename_operands(e, env)
        if i in removed:
            continue
        chain = at_end.get(i)
        if chain is None:
            out_eqns.append(e)
            continue
        chain.eqns = [eqns[j] for j in chain.idx]  # operands substituted so far
        orig = list(chain.eqns)
        try:
            _exact.check(ctx, [a for e in chain.eqns for a in _exact.eqn_atoms(e)], "rolling")
            slow = _slow_body(chain.eqns[0], len(chain.eqns), ctx, soft)
            if slow is not None:
                if keep is None:
                    ctx.report.count(f"{NAME}.declined_by_cost")
                raise Decline(slow)
            chain = _generalize(chain, keyer)
            why = _forward_only_reason(chain.eqns[0], ctx)
            new, sub, produced = _roll(chain, users, ys_origin, ctx.options.unroll,
                                       lists=costs.reroll_list_read and keep is None,
                                       forward_only=why,
                                       offsets=costs.reroll_runtime_offsets, made=made)
            if keep is not None:
                scans = [q for q in new if q.primitive.name == "scan"]
                not_kept = keep(scans[0]) if len(scans) == 1 else "not one plain scan"
                if not_kept is not None:
                    raise Decline(not_kept)
        except Decline as d:
            if keep is None:
                ctx.report.declined(NAME, orig[0], str(d))
            else:   # (a loop of rounds left as written: the common case, not a decline)
                ctx.report.count(f"{NAME}.left_as_written")
            # keep the calls, re-emitted at the chain's end: `_cut` guarantees that nothing
            # before the end uses their results, and their operands are all defined by then
            out_eqns.extend(orig)
            continue
        out_eqns.extend(new)
        env.update(sub)
        for atom, origin in produced:
            ys_origin.setdefault(atom, origin)
        n += 1
        if why is not None:
            ctx.report.declined(NAME, orig[0], f"forward rolled, its derivative kept unrolled: "
                                               f"{why}")
            ctx.report.count("reroll.forward_only")
        ctx.report.applied(NAME, chain.eqns, after=("scan",))
        ctx.report.count("reroll.chains")
        if _carries_pieces(chain):
            ctx.report.count("reroll.carries_pieces")
        ctx.report.count(f"reroll.length.{len(chain.eqns)}")
        ctx.report.stats.setdefault("reroll.lengths", []).append(len(chain.eqns))
    if not n:
        return jaxpr, 0
    outvars = [_walk.substitute(a, env) for a in jaxpr.outvars]
    return C.replace_jaxpr(jaxpr, eqns=out_eqns, outvars=outvars), n
