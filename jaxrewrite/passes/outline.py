"""Outlining: a run of repeated equations that is not a call becomes a chain of calls of one body.

    before:  a1 = sin a0;  b1 = mul a1 w;  c1 = add b1 a0      (the same equations, k times,
             a2 = sin c1;  b2 = mul a2 w;  c2 = add b2 c1       each segment reading the one
             a3 = sin c2;  b3 = mul a3 w;  c3 = add b3 c2       before it: an inlined layer)
    after:   c1 = jit[outlined]{ sin; mul; add } a0 w
             c2 = jit[outlined]{ ... the same body object ... } c1 w
             c3 = jit[outlined]{ ... } c2 w

Used by `reroll` (never on its own): the calls are what it rolls into a `lax.scan`; calls it
does not roll are inlined back (`inline_outlined`), so outlining alone never changes a program.
Inline code is what `jax.jit(f, inline=True)` inner functions, `optimize(jax.grad(f))`'s forward
pass (JAX inlines checkpointed layers there) and Python loops over plain code leave.

Finding a run, per jaxpr level:
1. Each equation gets a signature: primitive, params (nested jaxprs by structure), operand and
   result avals, literal values; equations with effects get one of their own (never repeated).
   A unit-stride window of an input of the level (`params[3*i:3*i+3]`: layers that read their
   parameters from one shared array) is signed by its size, not its offset; in the body, a
   window whose offset differs between segments reads at start operands (`dynamic_slice`),
   one literal per segment, which `reroll` scans as xs. Where neither finds a run, a third
   try signs scalar literals by their type (rounds that differ only in a round constant):
   each segment is then a call of its own body, one skeleton, whose literals `reroll` lifts
   into the scan's xs.
2. Candidate periods L are the distances between nearby equations of one signature; for each
   (those with the longest periodic stretch, and their multiples), the positions where
   signature[i] == signature[i + L] form runs.
3. The phase (where a segment starts) is, of the boundaries that keep the most segments, the
   one the fewest values cross (a layer boundary: only the carried state crosses it).
4. A run is k >= `min_len` segments of L >= `MIN_EQNS` equations that reference each other the
   same way: an operand defined in its own segment comes from the same position in every
   segment; every other operand is an argument of the call (the reroll pass decides which are
   carried, loop-invariant or per iteration, and cuts chains it cannot roll).
5. Of the runs found, only one that rolls (`_rolls`: each segment carries from the one before)
   is taken: the one covering most equations, then fewest arguments, then the shortest
   segment.
"""
from __future__ import annotations

import collections

import numpy as np

from .. import _compat as C
from .. import _walk
from ..analysis.structural import Keyer

MIN_EQNS = 8          # shortest segment worth a call (a loop of tiny bodies costs more than it saves)
MAX_PERIODS = 4       # most frequent distances tried per run search
MAX_MULTIPLES = 16    # multiples of each tried (a layer of up to 16 identical blocks)
MAX_RUNS = 8          # runs outlined per level
LAGS = 8              # occurrences of a signature looked back at for candidate periods


def _offset_read(e, shared) -> bool:
    """Whether `e` reads a window of an input of the level (`shared`) at a static offset: a
    unit-stride `slice` (a layer's parameters, `params[3*i:3*i+3]`), whose offset may differ
    from segment to segment (`_offsets`)."""
    return (e.primitive.name == "slice" and not C.is_literal(e.invars[0])
            and e.invars[0] in shared
            and all(s in (None, 1) for s in (e.params["strides"] or ())))


def scalar_literal(a) -> bool:
    """A scalar literal operand: what the skeleton signatures key by type, and what `reroll`
    lifts into a generalized body's operands (the two must agree)."""
    return C.is_literal(a) and getattr(C.aval_of(a), "shape", None) == ()


def _signatures(eqns, keyer: Keyer, table: dict, shared=frozenset(), skeleton=False) -> list:
    """One id per equation, -1 for one that never repeats (an effect). Ids come from `table`
    (signature -> id), kept across a level's rounds of outlining: equations a round leaves in
    place keep theirs, and only its new calls get ids (`_unique`). With `shared` (the level's
    inputs), a window read from one of them (`_offset_read`) is signed by its size, not its
    offset: the second try, where the exact signatures find no run. `skeleton`: a scalar
    literal operand is signed by its type, not its value (rounds that differ in a round
    constant): the third try, each segment then its own body (`reroll` lifts the literals)."""
    ids = []
    for e in eqns:
        if C.has_effects(e):
            ids.append(-1)
            continue
        ins = tuple((("lit?", keyer.aval(C.aval_of(a))) if skeleton and scalar_literal(a)
                     else keyer.literal(a)) if C.is_literal(a)
                    else ("var", keyer.aval(a.aval)) for a in e.invars)
        if _offset_read(e, shared):
            sizes = tuple(h - l for l, h in zip(e.params["start_indices"],
                                                 e.params["limit_indices"]))
            key = ("slice at an offset", ins, sizes)
        else:
            key = keyer.eqn_key(e, ins)
        ids.append(table.setdefault(key, len(table)))
    return ids


def _skeleton(eqns, keyer: Keyer, table: dict, shared, wsigs: list) -> list | None:
    """`wsigs` with each equation that has a scalar literal operand signed by its skeleton
    (`_signatures(skeleton=True)`), or None where no two equations of one skeleton differ in
    their literals (a network's layers share theirs: nothing to find, at no search's cost).
    What earlier runs made (-1) stays out."""
    out, variants = list(wsigs), collections.defaultdict(set)
    for i, e in enumerate(eqns):
        if wsigs[i] != -1 and any(scalar_literal(a) for a in e.invars):
            (out[i],) = _signatures([e], keyer, table, shared, skeleton=True)
            variants[out[i]].add(wsigs[i])
    return out if any(len(v) > 1 for v in variants.values()) else None


def _offsets(eqns, p: int, L: int, k: int, shared) -> dict:
    """The window reads of segment 0 whose offsets differ between the segments
    [p + m L, p + (m+1) L), m < k: offset in the segment -> each segment's start indices."""
    out = {}
    for o in range(L):
        if _offset_read(eqns[p + o], shared):
            starts = [tuple(eqns[p + m * L + o].params["start_indices"]) for m in range(k)]
            if len(set(starts)) > 1:
                out[o] = starts
    return out


def _unique(sigs: list) -> np.ndarray:
    """`sigs` with each -1 made unique (-1 - its position): never in a run."""
    ids = np.asarray(sigs, np.int64)
    never = np.flatnonzero(ids < 0)
    ids[never] = -1 - never
    return ids


def _longest(ids: np.ndarray, g: int) -> int:
    """Equations covered by the longest stretch that repeats with period `g`."""
    eq = np.concatenate([[0], (ids[:-g] == ids[g:]).astype(np.int8), [0]])
    edges = np.diff(eq)
    starts, ends = np.flatnonzero(edges == 1), np.flatnonzero(edges == -1)
    return int((ends - starts).max()) + g if len(starts) else 0


def _periods(ids: np.ndarray, min_len: int) -> list[int]:
    """Candidate segment lengths: distances between occurrences of one signature, `LAGS` apart
    (a vectorised op split into 4 pieces repeats its signature 4 times in a row: the distance
    to the next round is 4 occurrences away), the `MAX_PERIODS` with the longest stretch that
    repeats with that period, and their multiples.

    Ranked by the longest stretch, not by how many equations align over the whole level: in a
    training step an optimizer's update (one short block per parameter leaf) aligns more
    equations in total than the layers do, so one-layer periods never made the cut, although
    a layer is the longest periodic stretch."""
    at = np.flatnonzero(ids >= 0)
    at = at[np.argsort(ids[at], kind="stable")]     # positions grouped by signature, in order
    grouped = ids[at]
    gaps: collections.Counter = collections.Counter()
    for lag in range(1, LAGS + 1):                  # each occurrence to the lag-th one before it
        same = grouped[lag:] == grouped[:-lag]
        vals, counts = np.unique((at[lag:] - at[:-lag])[same], return_counts=True)
        gaps.update(dict(zip(vals.tolist(), counts.tolist())))
    limit = len(ids) // max(min_len, 1)
    # the most frequent distances, ties to the shortest
    frequent = sorted(gaps.items(), key=lambda gc: (-gc[1], gc[0]))[:4 * MAX_PERIODS]
    cands = [g for g, _ in frequent if g <= limit]
    longest = {g: _longest(ids, g) for g in cands}
    top = sorted(cands, key=lambda g: (-longest[g], g))[:MAX_PERIODS]
    # ... and their multiples (a layer of 3 identical blocks repeats with period 3 blocks,
    # though each equation recurs every block)
    out = set()
    for g in top:
        first = max(1, -(-MIN_EQNS // g))          # the smallest multiple of g worth a call
        out.update(m * g for m in range(first, first + MAX_MULTIPLES) if m * g <= limit)
    return sorted(out)


def _crossings(eqns) -> np.ndarray:
    """crossings[p]: values defined before equation p (at this level) and used at or after it."""
    n = len(eqns)
    diff = np.zeros(n + 2, np.int64)
    defined: dict = {}
    last_use: dict = {}
    for i, e in enumerate(eqns):
        for a in e.invars:
            if not C.is_literal(a) and a in defined:
                last_use[a] = i
        for v in e.outvars:
            if not C.is_dropvar(v):
                defined[v] = i
    for v, u in last_use.items():
        diff[defined[v] + 1] += 1
        diff[u + 1] -= 1
    return np.cumsum(diff)[:n + 1]


def _positions(eqns, p: int, L: int, k: int) -> dict:
    """Each value defined in segments [p + m L, p + (m+1) L), m < k -> (m, offset, output)."""
    pos: dict = {}
    for m in range(k):
        for o in range(L):
            for q, v in enumerate(eqns[p + m * L + o].outvars):
                pos[v] = (m, o, q)
    return pos


def _references(eqns, start: int, L: int):
    """(how segment [start, start + L) references its own values, the atoms it reads from
    outside it, in slot order). An operand is defined before it is read, so the segment's own
    values are known by the time they are read."""
    own: dict = {}
    refs, ext = [], []
    Lit = C.Literal   # (isinstance inline: this loop sees every operand of every candidate)
    for o in range(L):
        e = eqns[start + o]
        for r, a in enumerate(e.invars):
            if isinstance(a, Lit):
                continue
            d = own.get(a)
            if d is not None:
                refs.append((o, r) + d)
            else:
                refs.append((o, r))
                ext.append(a)
        for q, v in enumerate(e.outvars):
            own[v] = (o, q)
    return refs, ext


def _verify(eqns, uses: dict, p: int, L: int, k: int):
    """(slot groups, exports, external atoms per segment, positions) when segments
    [p + m L, p + (m+1) L) for m < k reference each other alike; else None. A slot is an
    operand position (offset, operand index) not defined in its own segment; slots that hold
    the same atom in every segment are one argument (a group). Exports are the (offset, output)
    positions whose value is used outside its own segment. Segments are compared one by one,
    so a candidate that does not repeat is dropped at its first differing segment."""
    ref0, ext0 = _references(eqns, p, L)
    slots: list = [ext0]       # per segment: the external atoms, in slot order
    for m in range(1, k):
        refs, ext = _references(eqns, p + m * L, L)
        if refs != ref0:
            return None
        slots.append(ext)
    # one argument per distinct column of atoms across the segments
    groups: dict = {}
    for s in range(len(slots[0])):
        groups.setdefault(tuple(seg[s] for seg in slots), []).append(s)
    pos = _positions(eqns, p, L, k)
    exports = set()
    end = p + k * L
    for v, d in pos.items():
        if (d[1], d[2]) not in exports and any(
                not p <= i < end or (i - p) // L != d[0] for i in uses.get(v, ())):
            exports.add((d[1], d[2]))
    return list(groups.values()), sorted(exports), slots, pos


def _rolls(pos: dict, k: int, slots) -> bool:
    """Whether the run is a chain `reroll` can roll: every segment after the first takes, in each
    argument slot, either a value from outside the run or the same output of the segment just
    before it (a carry, wired alike in every segment). ChaCha20's 16 words: one quarter round
    repeats 80 times, but four in a row read the same state; a single round repeats 20 times,
    but columns and diagonals permute the words differently; the double round is the chain.
    `pos`: the run's `_positions`."""
    wiring = None
    for m in range(1, k):
        link = []
        for a in slots[m]:
            d = pos.get(a)
            if d is not None and d[0] != m - 1:
                return False
            link.append(None if d is None else d[1:])
        if wiring is None:
            wiring = link
        elif link != wiring:
            return False
    return wiring is not None and any(w is not None for w in wiring)


def _find_run(eqns, outvars, ids: np.ndarray, min_len: int):
    """The best run: (phase, L, k, _verify's result), or None.

    Each stretch that repeats with period L is a candidate. Its phase is the boundary the fewest
    values cross among the phases that keep the most segments (a boundary in a training step's
    forward pass is crossed by every residual saved before it, so the fewest crossings overall
    is the stretch's first equation, often mid-layer: 15 of 16 layers rolled); the boundary
    the fewest cross in the whole first period is a candidate too (a stretch that starts and
    ends mid-layer may roll only from a layer boundary, with a segment less). The first run
    that rolls, by most equations covered, then fewest call arguments, then shortest segment
    (one layer per trip, not two), is taken. A run that does not roll is never taken: `reroll` would inline its calls back
    (an optimizer's per-leaf update: thousands of equations outlined for nothing)."""
    cands = []
    cross = None
    for L in _periods(ids, min_len):
        eq = np.concatenate([[0], (ids[:-L] == ids[L:]).astype(np.int8), [0]])
        edges = np.diff(eq)
        for i, j in zip(np.flatnonzero(edges == 1).tolist(), np.flatnonzero(edges == -1).tolist()):
            # [i, j + L) repeats with period L
            if j - i >= L * (min_len - 1):
                if cross is None:
                    cross = _crossings(eqns)
                spare = (j + L - i) % L             # phases i .. i + spare keep every segment
                for phase in {i + int(np.argmin(cross[i:i + spare + 1])),
                              i + int(np.argmin(cross[i:i + L]))}:
                    k = (j + L - phase) // L
                    if k >= min_len:
                        cands.append((k * L, -L, phase, k))
    uses = _walk.uses(eqns, outvars) if cands else {}
    best = None
    for cover, neg_l, phase, k in sorted(cands, reverse=True):
        if best is not None and cover < best[0][0]:
            break
        found = _verify(eqns, uses, phase, -neg_l, k)
        if found is not None and _rolls(found[3], k, found[2]):
            score = (cover, -len(found[0]), neg_l)
            if best is None or score > best[0]:
                best = (score, (phase, -neg_l, k, found))
    return None if best is None else best[1]


def _body(eqns, p: int, L: int, groups, exports, slots0, offset_slots=None):
    """Segment 0 as a closed jaxpr: invars one per slot group, outvars the exports. A window
    read at offsets that differ between segments (`offset_slots`: its offset in the segment ->
    the slots of its start indices) becomes a `dynamic_slice` at start operands: exact, since
    every segment's window lies in bounds (nothing to clamp).

        before:  w = slice[start_indices=(3,), limit_indices=(6,)] params      (segment 1)
        after:   w = dynamic_slice[slice_sizes=(3,)] params i                  (i: 3 in segment 1)
    """
    invars = [C.new_var(C.aval_of(slots0[g[0]])) for g in groups]
    env: dict = {}
    by_slot = {s: v for g, v in zip(groups, invars) for s in g}
    offset_slots = offset_slots or {}
    s = 0
    body_eqns = []
    out_at: dict = {}
    for o in range(L):
        e = eqns[p + o]
        new_in = []
        for a in e.invars:
            if C.is_literal(a):
                new_in.append(a)
            elif a in env:
                new_in.append(env[a])
            else:
                new_in.append(by_slot[s])
                s += 1
        if o in offset_slots:
            sizes = tuple(h - l for l, h in zip(e.params["start_indices"],
                                                 e.params["limit_indices"]))
            em = _walk.Emitter(e)
            w, = em.call_shared(_window, new_in[0], *(by_slot[t] for t in offset_slots[o]),
                                static=(sizes,))
            body_eqns.extend(em.eqns)
            env[e.outvars[0]] = out_at[(o, 0)] = w
            continue
        outs = [v if C.is_dropvar(v) else C.new_var(v.aval) for v in e.outvars]
        for q, (v, w) in enumerate(zip(e.outvars, outs)):
            if not C.is_dropvar(v):
                env[v] = w
            out_at[(o, q)] = w
        body_eqns.append(e.replace(invars=new_in, outvars=outs))
    outvars = [out_at[x] for x in exports]
    return C.closed(C.new_jaxpr(invars, body_eqns, outvars, "outlined"), ())


def _window(x, *starts_and_sizes):
    """`x[starts : starts + sizes]` at runtime start indices (`Emitter.call_shared`'s form)."""
    from jax import lax
    *starts, sizes = starts_and_sizes
    return lax.dynamic_slice(x, starts, sizes)


def _hoist_constants(eqns) -> list:
    """`eqns` with the equations that depend on nothing but literals and each other
    (constants) moved to the front, in their order; the others keep theirs.

    `cse` leaves one copy of a computation every layer repeats on constants (Flax Linen builds
    the causal mask in each block) in the first layer, which then differs from the others and
    is left out of the run (15 of 16 layers rolled). Moved up front, it is an argument of all."""
    const: set = set()
    front, rest = [], []
    for e in eqns:
        if not C.has_effects(e) and all(C.is_literal(a) or a in const for a in e.invars):
            front.append(e)
            const.update(v for v in e.outvars if not C.is_dropvar(v))
        else:
            rest.append(e)
    return front + rest if front and rest else list(eqns)


def outline_level(jaxpr, keyer: Keyer, min_len: int, veto=None):
    """(new jaxpr, bodies outlined) for one level; (jaxpr, set()) when no run is found.
    `veto(segment equations, trips)`: a reason not to roll a run found (the cost model's, asked
    before its body is built; the caller records it), whose equations are then left as they are.

    Each round's calls never repeat (-1 in `sigs`): outlining L layers and then, in the next
    round, groups of 8 of those calls would nest them (a scan of L/8 trips of 8 layers)."""
    import jax
    bodies: set = set()
    original = jaxpr
    jaxpr = C.replace_jaxpr(jaxpr, eqns=_hoist_constants(jaxpr.eqns))
    table: dict = {}
    shared = frozenset((*jaxpr.invars, *jaxpr.constvars))   # windows of these: `_offsets`
    # exact signatures first; where they find no run, windows of the level's inputs signed by
    # their size (layers reading one parameter array at their own offsets)
    sigs = _signatures(jaxpr.eqns, keyer, table)
    wsigs = _signatures(jaxpr.eqns, keyer, table, shared)
    lsigs = None        # (skeleton signatures: made only where the other two find nothing)
    for _ in range(MAX_RUNS):
        eqns = list(jaxpr.eqns)
        own_bodies = False
        run = _find_run(eqns, jaxpr.outvars, _unique(sigs), min_len)
        if run is None and wsigs != sigs:
            run = _find_run(eqns, jaxpr.outvars, _unique(wsigs), min_len)
        if run is None:
            if lsigs is None:
                lsigs = _skeleton(eqns, keyer, table, shared, wsigs)
            if lsigs is not None:
                run = _find_run(eqns, jaxpr.outvars, _unique(lsigs), min_len)
                own_bodies = run is not None
        if run is None:
            break
        p, L, k, (groups, exports, slots, _) = run
        if not exports:
            break
        if veto is not None and veto(eqns[p:p + L], k):
            sigs, wsigs, lsigs = [None if ss is None else [*ss[:p], *[-1] * (k * L),
                                                           *ss[p + k * L:]]
                                  for ss in (sigs, wsigs, lsigs)]
            continue
        # windows read at offsets that differ per segment: their start indices are arguments
        # (literals, one per segment), which `reroll` scans as xs
        offset_slots = {}
        for o, starts in _offsets(eqns, p, L, k, shared).items():
            offset_slots[o] = []
            for d in range(len(starts[0])):
                offset_slots[o].append(len(slots[0]))
                groups.append([len(slots[0])])
                for m in range(k):
                    slots[m] = [*slots[m], C.literal(np.int32(starts[m][d]))]
        body = _body(eqns, p, L, groups, exports, slots[0], offset_slots)

        def outlined(*args, body=body):
            return C.eval_jaxpr(body, *args)

        call = jax.jit(outlined)  # one function object: every segment's call shares one body
        body_avals = tuple(C.aval_key(v.aval) for v in body.jaxpr.invars)
        new_eqns, env, traced = eqns[:p], {}, {}
        for m in range(k):
            if own_bodies and m:
                # segments that differ in scalar literals: each its own body (the same
                # skeleton), which `reroll` generalizes, the literals scanned as xs
                body = _body(eqns, p + m * L, L, groups, exports, slots[m], offset_slots)
                call = jax.jit(lambda *args, body=body: C.eval_jaxpr(body, *args))
                traced = {}
            em = _walk.Emitter(eqns[p + m * L])
            args = [slots[m][g[0]] for g in groups]
            args = [_walk.substitute(a, env) for a in args]
            avals = tuple(C.aval_of(a) for a in args)
            if tuple(C.aval_key(a) for a in avals) == body_avals:
                # the body's own operand types: called as it is (tracing it again through
                # `jax.jit` costs a trace of every equation, for the same jaxpr)
                outs = [C.new_var(v.aval) for v in body.jaxpr.outvars]
                em.eqns.append(C.make_jit_eqn(args, outs, body, "outlined",
                                              em.eqn.source_info, em.eqn.ctx))
            else:   # (other operand types, weak or varying: traced once per types)
                if avals not in traced:
                    traced[avals] = C.trace_avals(lambda *xs: list(call(*xs)), avals, em.eqn.ctx)
                outs = em.inline(traced[avals], args)
            for (o, q), new in zip(exports, outs):
                old = eqns[p + m * L + o].outvars[q]
                if not C.is_dropvar(old):
                    env[old] = new
            new_eqns.extend(em.eqns)
            bodies.update(id(e.params["jaxpr"]) for e in em.eqns if C.is_jit(e))
        tail = [_walk.rename_operands(e, env) for e in eqns[p + k * L:]]
        # renaming keeps a signature (operand types alike), unless a value became a literal
        relit = any(C.is_literal(v) for v in env.values())
        sigs, wsigs, lsigs = [
            None if ss is None else ss[:p] + [-1] * (len(new_eqns) - p)
            + (_signatures(tail, keyer, table, sh, sk) if relit else ss[p + k * L:])
            for ss, sh, sk in ((sigs, frozenset(), False), (wsigs, shared, False),
                               (lsigs, shared, True))]
        new_eqns.extend(tail)
        outvars = [_walk.substitute(a, env) for a in jaxpr.outvars]
        jaxpr = C.replace_jaxpr(jaxpr, eqns=new_eqns, outvars=outvars)
    return (jaxpr if bodies else original), bodies


def inline_outlined(jaxpr, bodies: set):
    """Calls of an outlined body that were not rolled, inlined back (program as it was)."""
    if not bodies:
        return jaxpr
    return _walk.inline_calls(jaxpr, lambda e: id(e.params["jaxpr"]) in bodies)
