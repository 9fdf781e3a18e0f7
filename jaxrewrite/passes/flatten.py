"""Flatten small static control flow, so that scalar replacement sees one region.

A value that crosses a `jit` boundary or is carried by a loop stays whole there: scalarize
(passes/scalarize.py) splits small static axes only within one jaxpr level, so a permutation in
a jitted helper (`_double_round`'s `state.ravel()[diag_map]`) or in a loop body (`fori_loop`
over double rounds) stays a gather, and the jitted quarter-round's `jnp.array([a, b, c, d])`
stays a re-join. This pass removes those boundaries where the cost model says so, bottom-up
(innermost levels first, so a call of a call is flat before its caller is looked at):

1. Inline: a plain `jit` call (no shardings, layouts, donation, effects, compiler options)
   whose signature carries a small static axis, whose body re-joins pieces along it without
   reordering them (`jnp.array([a, b, c, d])` in a jitted quarter-round), called where the
   calling level reorders along a small axis (a static gather, a rev, a concatenate of slices),
   is replaced by its body: the re-join meets the permutation in one region. (A call that
   reorders is scalarize's to inline, only where a split follows.) On the CPU (`"auto"`) only
   where scalarize would split the pieces (`backend.cost.TargetCosts.min_piece_elements`); otherwise
   the call stays, lowered once. A call is only a call inside the same `jax.jit`: XLA inlines
   it before fusion anyway, so no value changes.

       before:  d:u32[N,4,4] = jit[_quarterround]{ ... concatenate[dimension=2] ... } c
                e:u32[N,16] = gather[literal indices] (reshape (transpose d))
       after:   (the body's equations, renamed; uses of d read the concatenate's result)

2. Unroll: a loop with a static trip count - `scan` (what `fori_loop` with static bounds and
   `lax.scan` lower to) or a `while` whose condition is `i < U` on a counter that starts at a
   literal and is incremented by 1 (`fori_loop` with bounds that became literals) - whose body,
   its plain calls inlined (a jitted double round), is exact (`EXACT`) and moves data along a
   small axis of its carry (CPU: reorders it, so that scalarize splits the unrolled form), and
   whose unrolled size the cost model allows (`backend.cost.unroll_decision`: estimated launches per
   call rolled vs unrolled, and the equations added, which is compile time):

       before:  _, s = scan[length=2, num_carry=2]{ (i, c) -> (i + 1, f(c)) } 0 x
       after:   s1 = f(x) ; s = f(s1)           (i folded away by fold)

   xs are sliced per trip, ys stacked at the end; `reverse=True` walks the trips backwards.

3. Split the carry (CPU, TPU, `"auto"`: `backend.cost.LoopCosts.split_carry`): a rolled loop costs no
   launches there, and unrolling multiplies what XLA compiles by the trip count, so the loop
   stays rolled and its carry is carried as pieces (`loop_carry.py`), where each trip permutes
   carried data at least twice (`min_body_permutations`) and scalarize would split the new body
   with no re-join of the carry (asked first, with a scratch report), and the loop does enough
   work to pay for compiling its pieces: at least `min_split_trips` trips, `min_split_work`
   equations x trips per piece, and a state in cache or tiled unless the body moves it often
   (`backend.cost.split_pays`). Otherwise it stays as it was, with the reason: unrolled and
   split, a short loop costs the same compile time for the same trips.

4. Keep it rolled for a kernel (`"auto"`, where the kernel pass is on: the TPU from
   `kernel_min_elements`): an integer loop that the kernel pass will take with its carry split
   (`kernel.loop_reason` on the body scalarize would make) stays rolled, its carry split as in
   3, whatever 3's thresholds say, so that the loop runs inside one kernel; otherwise 3 (or,
   on a target that unrolls, 2) decides as before.

Exactness: the same primitives on the same values in the same order. Loops are unrolled only
where every primitive of the body computes each element exactly (`EXACT`: integer, bitwise,
comparison, selection and data movement), so XLA's different code for the flat form cannot
round differently. `flatten=False` turns the pass off; `flatten=True` unrolls every eligible
loop within the compile-time limit, whatever the launch estimate.
"""
from __future__ import annotations

import dataclasses

import jax.numpy as jnp
import numpy as np
from jax import lax

from .. import _compat as C
from ..backend import cost as _cost
from .. import _walk
from ..report.records import Report
from . import kernel
from . import loop_carry
from . import movement
# Scalarize's verdict on an unrolled level (CPU), asked before the loop is given up: unrolled
# and not split, a loop only costs compile time and run time (as reroll asks outline).
from . import scalarize

PASS = "flatten"

# Primitives that compute each element exactly whatever the code XLA makes around them, and
# data movement: a loop body of these computes the same bits rolled or unrolled.
EXACT = frozenset({
    "add", "sub", "mul", "neg", "abs", "sign", "max", "min", "and", "or", "xor", "not",
    "shift_left", "shift_right_logical", "shift_right_arithmetic", "population_count", "clz",
    "eq", "ne", "lt", "le", "gt", "ge", "select_n", "convert_element_type", "copy", "copy_p",
    "integer_pow", "square",
    "slice", "squeeze", "reshape", "broadcast_in_dim", "concatenate", "stack", "transpose",
    "rev", "gather", "iota", "pad", "expand_dims",
    # (a table read at the loop index, `rc[i]`: a static slice once unrolled)
    "dynamic_slice", "unstack",
    # reductions: exact on integers (floats are caught by `_EXACT_FLOAT_SAFE`)
    "reduce_xor", "reduce_and", "reduce_or", "reduce_max", "reduce_min", "reduce_sum",
    "reduce_prod",
})
# Equations that move data between positions: what splitting a small axis turns into renaming.
MOVERS = frozenset({"gather", "concatenate", "stack", "rev"})
# Integer arithmetic is exact; float add/mul/... are exactly rounded too, but XLA may contract
# or reassociate differently in another fusion: floats stay rolled (their bodies' values kept).
_EXACT_FLOAT_SAFE = frozenset({"slice", "squeeze", "reshape", "broadcast_in_dim", "concatenate",
                               "stack", "transpose", "rev", "gather", "select_n", "copy",
                               "copy_p", "pad", "expand_dims", "eq", "ne", "lt", "le", "gt",
                               "ge", "max", "min", "neg", "abs", "dynamic_slice", "unstack"})


def _small_axis(atom, max_axis: int) -> bool:
    shape = getattr(C.aval_of(atom), "shape", ())
    return any(1 < s <= max_axis for s in shape)


def is_float(atom) -> bool:
    dt = getattr(C.aval_of(atom), "dtype", None)   # (a PRNG key's dtype is not numpy's)
    return dt is not None and not C.is_extended_dtype(dt) and bool(np.issubdtype(dt, np.inexact))


def _permutes(e, producer: dict) -> bool:
    """Whether `e` reorders data (not only re-joins it): a static gather, a rev, or a
    concatenate/stack of slices (a roll). `jnp.array([a, b, c, d])` joins computed values:
    a mover, but splitting it alone gains nothing."""
    name = e.primitive.name
    if name == "gather":
        return C.is_literal(e.invars[1])
    if name == "rev":
        return True
    if name in ("concatenate", "stack"):
        return any(not C.is_literal(a) and getattr(producer.get(a), "primitive", None) is not None
                   and producer[a].primitive.name in ("slice", "squeeze", "reshape")
                   for a in e.invars)
    return False


def _largest_piece(cj, max_axis: int, permuting: bool, memo: dict | None = None) -> int:
    """The biggest piece a split along a small axis moved by some equation of `cj` (any level)
    could make: scalarize's piece-size verdict, looked up before flattening (0: none moves
    data along a small axis). `permuting`: count only equations that reorder (`_permutes`).
    `memo`: per jaxpr object, for the walk of one `run` (a shared body is looked at once)."""
    jaxpr = cj.jaxpr if isinstance(cj, C.ClosedJaxpr) else cj
    key = (id(jaxpr), permuting)
    if memo is not None and key in memo and memo[key][0] is jaxpr:
        return memo[key][1]
    best = 0
    producer: dict | None = None
    for e in jaxpr.eqns:
        name = e.primitive.name
        if name not in MOVERS or (name == "gather" and not C.is_literal(e.invars[1])):
            continue
        if permuting:
            if producer is None and name in ("concatenate", "stack"):
                producer = {v: q for q in jaxpr.eqns for v in q.outvars}
            if not _permutes(e, producer or {}):
                continue
        for v in (*e.invars, *e.outvars):
            if C.is_literal(v) or C.is_dropvar(v):
                continue
            shape = C.aval_of(v).shape
            small = [s for s in shape if 1 < s <= max_axis]
            if small:
                best = max(best, int(np.prod(shape)) // min(small))
    for _, subs in _walk.nested_eqns(jaxpr):
        for _, _, sub in subs:
            best = max(best, _largest_piece(sub, max_axis, permuting, memo))
    if memo is not None:
        memo[key] = (jaxpr, best)   # (the object kept: its id is not reused during the walk)
    return best


def inexact_body(jaxpr, integers_exact: bool = False) -> str | None:
    """Why a loop body is not exact to unroll (None: it is). `integers_exact`: any primitive
    whose results are integers or booleans is exact (a carry split keeps the body's code, so
    only float rounding could move with the fusions; an integer sum is the same in any order)."""
    for e in jaxpr.eqns:
        name = e.primitive.name
        if e.effects:
            return f"'{name}' has effects"
        if integers_exact and not any(is_float(v) for v in e.outvars):
            continue
        if name not in EXACT:
            return f"'{name}' in the body (only exact integer/bitwise ops and data movement)"
        if name not in _EXACT_FLOAT_SAFE and any(is_float(v) for v in e.outvars):
            return f"float '{name}' in the body (XLA may fuse it differently unrolled)"
    return None


def _inline_all(jaxpr, depth: int = 16):
    """`jaxpr` with its plain calls inlined, and theirs (a loop body about to be unrolled: a
    jitted double round whose `jnp.take` is a `_take` call of its own)."""
    for _ in range(depth):
        new = _walk.inline_calls(jaxpr, _walk.plain_call)
        if new is jaxpr:
            break
        jaxpr = new
    return jaxpr


# --- loops with a static trip count ---------------------------------------------------------------

def _scan_loop(eqn):
    """(trips, body, consts, carry init, xs, reverse) of a scan."""
    p = eqn.params
    nc, nk = p["num_consts"], p["num_carry"]
    iv = list(eqn.invars)
    return (p["length"], p["jaxpr"], iv[:nc], iv[nc:nc + nk], iv[nc + nk:], p["reverse"])


def _while_loop(eqn):
    """(trips, body, body consts, carry init) of a `while` that counts a
    carried integer from a literal by 1 up to a literal bound (`fori_loop`), else None."""
    p = eqn.params
    cn, bn = p["cond_nconsts"], p["body_nconsts"]
    cond, body = p["cond_jaxpr"], p["body_jaxpr"]
    cconsts, bconsts, init = eqn.invars[:cn], eqn.invars[cn:cn + bn], eqn.invars[cn + bn:]
    if len(cond.jaxpr.eqns) != 1 or cond.consts:
        return None
    c = cond.jaxpr.eqns[0]
    if c.primitive.name != "lt" or cond.jaxpr.outvars[0] is not c.outvars[0]:
        return None
    cenv = dict(zip(cond.jaxpr.invars, list(cconsts) + list(init)))
    i_var, bound = c.invars
    carry_in = cond.jaxpr.invars[cn:]
    if i_var not in carry_in:
        return None
    k = carry_in.index(i_var)
    if not C.is_literal(bound):
        if bound in carry_in:
            # a carried bound (fori_loop's `upper`) must pass through the body unchanged
            j = carry_in.index(bound)
            if body.jaxpr.outvars[j] is not body.jaxpr.invars[bn + j]:
                return None
        bound = cenv.get(bound, bound)
    start = init[k]
    if not (C.is_literal(bound) and C.is_literal(start)):
        return None
    # the body must step the counter by exactly 1
    bi = body.jaxpr.invars[bn + k]
    step = next((e for e in body.jaxpr.eqns if body.jaxpr.outvars[k] in e.outvars), None)
    if (step is None or step.primitive.name != "add" or bi not in step.invars
            or not any(C.is_literal(a) and np.asarray(C.literal_value(a)) == 1
                       for a in step.invars)):
        return None
    lo, hi = (int(np.asarray(C.literal_value(a))) for a in (start, bound))
    trips = max(0, hi - lo)
    return trips, body, list(bconsts), list(init)


def _unroll(eqn, trips, body, consts, init, xs=(), reverse=False):
    """The equations of `trips` copies of `body` chained through the carry; the results."""
    em = _walk.Emitter(eqn)
    nk = len(init)
    carry = list(init)
    ys: list = []
    for t in (reversed(range(trips)) if reverse else range(trips)):
        x_t = [em.call(lambda v, t=t: lax.index_in_dim(v, t, keepdims=False), x)[0] for x in xs]
        outs = _walk.inline_body(body, list(consts) + carry + x_t, em.eqns)
        carry = outs[:nk]
        ys.append(outs[nk:])
    if reverse:
        ys.reverse()
    stacked = []
    for k, v in enumerate(eqn.outvars[nk:]):
        if C.is_dropvar(v):
            stacked.append(v)
            continue
        stacked.append(em.call(lambda *a: jnp.stack(a), *[y[k] for y in ys])[0])
    return em.eqns, carry + stacked


def _carry_permutations(eqn, body) -> int:
    """How many equations of a loop body reorder data computed from the carry (a gather of a
    loop-invariant table is computed the same way every trip, whatever happens to the carry)."""
    p = eqn.params
    first = p["num_consts"] if eqn.primitive.name == "scan" else p["body_nconsts"]
    count = p["num_carry"] if eqn.primitive.name == "scan" else len(body.invars) - first
    reach = set(body.invars[first:first + count])
    producer = {v: q for q in body.eqns for v in q.outvars}
    n = 0
    for e in body.eqns:
        if not any(not C.is_literal(a) and a in reach for a in e.invars):
            continue
        reach.update(e.outvars)
        n += e.primitive.name in MOVERS and _permutes(e, producer)
    return n


def _loop_plan(eqn, body, trips, ctx, max_axis, piece_of) -> _cost.LoopPlan:
    movers = sum(1 for e in body.jaxpr.eqns if e.primitive.name in MOVERS)
    permutations = _carry_permutations(eqn, body.jaxpr)
    carried = eqn.params.get("num_carry")
    carry = eqn.outvars[:carried] if carried is not None else eqn.outvars
    small = any(_small_axis(v, max_axis) for v in carry if not C.is_dropvar(v))
    piece = piece_of(body, True) if small else 0
    return _cost.LoopPlan(trips=trips, body_eqns=len(body.jaxpr.eqns), body_movers=movers,
                          permutes=piece > 0, piece_elements=piece, splits=ctx.options.scalarize
                          not in (False, None),
                          moves=small and piece_of(body, False) > 0,
                          body_permutations=permutations)


def _unroll_rule(ctx, mode, max_axis, piece_of, pending):
    """`rule(eqn)` for `_walk.rewrite_eqns`: a loop's unrolled replacement, or None. What it
    unrolls is recorded in `pending` ((eqn, summary, calls inlined)) until the level's verdict.
    Where the target splits carries instead (`backend.cost.LoopCosts.split_carry`, CPU, `"auto"`),
    the replacement is the rolled loop with its carry split (`loop_carry`), or None."""
    lc = _cost.loop_costs(ctx.target)
    split_carry = lc.split_carry and mode == "auto"
    # (where the kernel pass will take the loop split, it stays rolled so that it runs inside
    # the kernel, whatever the split's own thresholds say)
    for_kernel = mode == "auto" and kernel.enabled(ctx)
    max_pieces = _cost.costs(ctx.target).max_pieces
    min_piece = _cost.costs(ctx.target).min_piece_elements

    def rule(eqn):
        name = eqn.primitive.name
        if name == "scan":
            trips, body, consts, init, xs, reverse = _scan_loop(eqn)
        elif name == "while":
            found = _while_loop(eqn)
            if found is None:
                return None
            trips, body, consts, init = found
            xs, reverse = (), False
        else:
            return None
        if trips == 0 or eqn.effects:
            return None
        # the body's plain calls are inlined with it (bottom-up, they are flat already)
        flat = _inline_all(body.jaxpr)
        calls = sum(1 for e in body.jaxpr.eqns if C.is_jit(e) and _walk.plain_call(e))
        body = C.closed(flat, body.consts) if flat is not body.jaxpr else body
        plan = _loop_plan(eqn, body, trips, ctx, max_axis, piece_of)
        no_kernel = ""      # why the kernel route was not taken, said where the split declines
        if for_kernel and plan.moves and inexact_body(body.jaxpr, integers_exact=True) is None:
            # (float loops are not the kernel's: they go on as before, without a word here)
            loop = loop_carry.Loop(trips, body, consts, init, list(xs), reverse,
                                   eqn.params.get("unroll", 1) if name == "scan" else 1)
            # (the pieces' size first: the split is traced and analysed only where it may pay)
            rep, why = None, kernel.size_reason(plan.piece_elements, trips * plan.body_eqns, ctx)
            if why is None:
                rep, why = loop_carry.split_loop(
                    eqn, loop, ctx, max_axis, max_pieces, _scalarize_split,
                    plan.body_permutations,
                    accept=lambda scan, split: _kernel_verdict(scan, split, ctx))
            if rep is not None:
                ctx.report.applied(PASS, eqn, after=(f"rolled, carry split for a kernel: {why}",))
                ctx.report.count(f"{PASS}.carries_split_for_kernel")
                return rep
            if not split_carry:
                ctx.report.declined(PASS, eqn, f"{name} of {trips} trips: not kept rolled for "
                                               f"a kernel ({why}); unrolled where the cost "
                                               f"model says")
            no_kernel = f"; not kept rolled for a kernel: {why}"
        if split_carry:
            if not plan.moves or not plan.body_permutations:
                # nothing to make renaming (said only where a kernel was refused)
                if no_kernel:
                    ctx.report.declined(PASS, eqn, f"{name} of {trips} trips: carry not split: "
                                                   f"no permutation of it{no_kernel}")
                return None
            loop = loop_carry.Loop(trips, body, consts, init, list(xs), reverse,
                                   eqn.params.get("unroll", 1) if name == "scan" else 1)
            why = inexact_body(body.jaxpr, integers_exact=True)
            if why is None and not plan.splits:
                # (the split carry is made for the body scalarize splits; without that split
                # each trip re-joins the pieces and splits them again: a 4x4 ARX state, 9
                # trips, 4,096 blocks, compiled 5.7x and ran 1.18x jax.jit)
                why = ("scalarize=False: the body would not be split, so each trip would "
                       "re-join the carried pieces and split them again")
            if why is None and trips < lc.min_split_trips:
                why = (f"fewer than {lc.min_split_trips} trips do not pay for a split's compile "
                       f"time, rolled or unrolled")
            if why is None and plan.body_permutations < lc.min_body_permutations:
                why = (f"{plan.body_permutations} permutation(s) per trip (minimum "
                       f"{lc.min_body_permutations}): a lone permutation fuses into its "
                       f"consumer in the rolled loop, and split pieces are copied every trip")
            if why is None and plan.piece_elements < min_piece:
                # (asked before the new body is traced: the common case of small batches)
                why = (f"pieces of at most {plan.piece_elements} elements would not be split "
                       f"(minimum {min_piece})")
            if why is None:
                rep, why = loop_carry.split_loop(eqn, loop, ctx, max_axis, max_pieces,
                                                 _scalarize_split, plan.body_permutations)
                if rep is not None:
                    ctx.report.applied(PASS, eqn, after=(f"rolled, carry split: {why}",))
                    ctx.report.count(f"{PASS}.carries_split")
                    return rep
            ctx.report.declined(PASS, eqn, f"{name} of {trips} trips: carry not split: "
                                           f"{why}{no_kernel}")
            return None
        why, summary = _cost.unroll_decision(plan, ctx.target, mode)
        if why is None:
            why = inexact_body(body.jaxpr)
        if why is None and not all(C.is_foldable_const(c) for c in body.consts):
            why = "the body closes over values not known at trace time"
        if why is not None:
            # a loop with nothing to split is normal: recorded only where it would have mattered
            if plan.moves or mode is True:
                ctx.report.declined(PASS, eqn, f"{name} of {trips} trips stays rolled: {why}")
            return None
        eqns, outs = _unroll(eqn, trips, body, consts, init, xs, reverse)
        pending.append((eqn, trips, summary, calls))
        return _walk.Replacement(eqns, outs)
    return rule


# --- driver --------------------------------------------------------------------------------------

def _inline_rule(ctx, mode, max_axis, max_eqns, piece_of):
    """`should(eqn, level_piece)`: whether to inline a call at a level. It must be plain, carry a
    small axis in its signature, and re-join pieces along one (`jnp.array([a, b, c, d])`)
    without reordering them, where the calling level reorders (`level_piece()`:
    `_largest_piece` of the caller's reorderings): the quarter-round's re-join then meets its
    caller's permutation in one region. A call that reorders is left to scalarize, which inlines
    it only where a split follows; calls in a loop body go with the body (`_unroll_rule`). With
    mode 'auto', scalarize must be on and the pieces big enough for it on this target."""
    min_piece = _cost.costs(ctx.target).min_piece_elements
    splits = ctx.options.scalarize not in (False, None)

    def should(eqn, level_piece):
        if not _walk.plain_call(eqn) or not any(
                _small_axis(v, max_axis) for v in (*eqn.invars, *eqn.outvars)
                if not C.is_literal(v) and not C.is_dropvar(v)):
            return False
        if mode == "auto" and not splits:
            return False        # nothing scalarize would split: the call stays (lowered once)
        body = eqn.params["jaxpr"]
        if piece_of(body, True):
            return False        # it reorders: scalarize's to inline where it splits
        # the body's piece first: the calling level's (a walk of the whole level) only if needed
        piece = piece_of(body, False)
        if piece and not (mode == "auto" and piece < min_piece):
            piece = min(piece, level_piece())
        if piece == 0 or (mode == "auto" and piece < min_piece):
            return False
        n = _walk.count_eqns(body)
        if n > max_eqns:
            ctx.report.declined(PASS, eqn, f"call of {n} equations not inlined "
                                           f"(limit {max_eqns}: compile time)")
            return False
        ctx.report.applied(PASS, eqn, after=("inlined",))
        return True
    return should


def carry_split_reason(eqn, ctx) -> str | None:
    """None where this pass would carry the loop `eqn` split on `ctx`'s target (the CPU rule of
    `_unroll_rule`), else why not; asked with a scratch report, nothing recorded."""
    if ctx.options.flatten != "auto" or not _cost.loop_costs(ctx.target).split_carry:
        return "the target does not split loop carries (or flatten is not 'auto')"
    scratch = dataclasses.replace(ctx, report=Report())
    loop_axis = _cost.loop_axis(ctx.target)
    pieces: dict = {}
    rule = _unroll_rule(scratch, "auto", loop_axis,
                        lambda j, permuting: _largest_piece(j, loop_axis, permuting, pieces), [])
    if rule(eqn) is not None and (scratch.report.counts.get(f"{PASS}.carries_split") or
                                  scratch.report.counts.get(f"{PASS}.carries_split_for_kernel")):
        return None
    reasons = [d.reason for d in scratch.report.declines]
    return reasons[-1] if reasons else "no permutation along a small axis of the carry"


def _scalarize_split(ctx, jaxpr, consts) -> tuple:
    """scalarize's split of one level as its `run` makes it (static-gather calls inlined
    first), asked with a scratch report (the real one records what scalarize does when the
    pipeline runs it): (the split level, None), or (None, scalarize's reason)."""
    scratch = dataclasses.replace(ctx, report=Report())
    c = _cost.costs(ctx.target)
    j, split = scalarize.scalarize_jaxpr(
        scalarize.inline_for_split(jaxpr, max(c.max_axis, c.cost_axis)), scratch,
        ctx.options.scalarize, consts)
    if split:
        return j, None
    reasons = [d.reason for d in scratch.report.declines]
    return None, reasons[-1] if reasons else "nothing to split"


def _kernel_verdict(scan, split_body, ctx) -> str | None:
    """The kernel pass's verdict on a loop split for it: its body as scalarize splits it, with
    the reshapes of pieces that renaming leaves taken away as the movement pass will take them
    (asked with a scratch report)."""
    if ctx.options.movement:
        scratch = dataclasses.replace(ctx, report=Report())
        split_body, _ = movement.simplify(split_body, scratch.report, ctx=scratch)
        split_body, _ = _walk.dce(split_body)
    return kernel.loop_reason(scan, split_body, ctx)


def _scalarize_verdict(ctx, jaxpr, consts) -> str | None:
    """None where scalarize would split this level, else its reason."""
    return _scalarize_split(ctx, jaxpr, consts)[1]


def run(cj, ctx):
    """Inline small re-joining calls, and unroll small static loops whose small axes are
    permuted (or, where the target splits carries, split their carry), innermost first.
    Nothing else changes."""
    mode = ctx.options.flatten
    if mode is False or mode is None:
        return cj, False
    lc = _cost.loop_costs(ctx.target)
    max_axis = _cost.costs(ctx.target).max_axis
    stats: list = []
    pieces: dict = {}
    # where launches do not decide and carries are not split (a row with `split_carry` off),
    # an unrolled loop must be split to pay
    ask_scalarize = not lc.launches_decide and mode == "auto"

    def piece_of(j, permuting: bool) -> int:
        return _largest_piece(j, max_axis, permuting, pieces)

    should_inline = _inline_rule(ctx, mode, max_axis, lc.max_unrolled_eqns, piece_of)
    pending: list = []
    # loops are looked at up to the axes scalarize splits where its verdict is asked first or
    # launches decide (`backend.cost.loop_axis`: a 25-lane Keccak state)
    loop_axis = _cost.loop_axis(ctx.target)
    loop_pieces: dict = {}

    def loop_piece_of(j, permuting: bool) -> int:
        return _largest_piece(j, loop_axis, permuting, loop_pieces)

    unroll = _unroll_rule(ctx, mode, loop_axis, loop_piece_of, pending)
    changed = [False]

    def inline(c, j):
        memo: list = []   # the level's reorderings, looked up at the first candidate call

        def level_piece():
            if not memo:
                memo.append(piece_of(j, True))
            return memo[0]
        return _walk.inline_calls(j, lambda e: should_inline(e, level_piece))

    def level(c):
        j = c.jaxpr
        if not _walk.nested_eqns(j):   # most levels: no call, no loop
            return c
        j2 = inline(c, j)
        loops = any(j2.eqns[i].primitive.name in ("scan", "while")
                    for i, _ in _walk.nested_eqns(j2))
        pending.clear()
        j3, unrolled = _walk.rewrite_eqns(j2, unroll) if loops else (j2, False)
        if unrolled and pending:   # (a carry split was asked of scalarize in the rule)
            why = _scalarize_verdict(ctx, j3, c.consts) if ask_scalarize else None
            for eqn, trips, summary, calls in pending:
                name = eqn.primitive.name
                if why is not None:
                    ctx.report.declined(PASS, eqn, f"{name} of {trips} trips stays rolled: "
                                                   f"scalarize would not split it unrolled "
                                                   f"({why}; {summary})")
                    continue
                # the estimate rides on the event, so explain() shows why it was unrolled
                ctx.report.applied(PASS, eqn, after=(f"unrolled ({summary})",))
                if calls:
                    ctx.report.count(f"{PASS}.inlined_in_loops", calls)
                ctx.report.count(f"{PASS}.unrolled_trips", trips)
                stats.append(f"{name} of {trips} trips unrolled: {summary}")
            if why is not None:
                j3 = j2
        if j3 is j:
            return c
        changed[0] = True
        return C.closed(j3, c.consts)

    out = _walk.map_jaxprs(cj, level)
    if stats:
        ctx.report.stats.setdefault(f"{PASS}.loops", []).extend(stats)
    return (out, True) if changed[0] else (cj, False)
