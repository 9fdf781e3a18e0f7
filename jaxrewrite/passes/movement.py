"""Algebraic simplification of data movement: chains of slice/concatenate/stack/reshape/
transpose/rev that cancel become renaming or one equation.

A rule looks at one equation and the equation that produced its operand (`defn`), and returns
what replaces it, or None. Rules are keyed by primitive in `RULES`. Every rule is exact by
construction: it only re-expresses which element goes where, never computes.

The point (issue "make static permutations free"): `jnp.array([a, b, c, d])[0]` is `a`;
`x[0:2]` then `x[2:4]` concatenated is `x`; `rev(rev(x))` is `x`; a transpose and its inverse
are nothing. Equations left dead are removed by the pipeline's DCE.
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from .. import _compat as C
from ..analysis import exact as _exact
from ..analysis import indexmap as _im
from .. import _walk
from ..report.records import Decline, Report

PASS = "movement"

_prim = C.lax_primitive


def _shape(atom):
    return tuple(C.aval_of(atom).shape)


def _reshape(em, atom, shape):
    return em.bind(_prim("reshape"), atom, new_sizes=tuple(shape), dimensions=None,
                   sharding=None)[0]


def _full_slice(eqn) -> bool:
    x, = eqn.invars
    p = eqn.params
    return (all(s == 0 for s in p["start_indices"]) and tuple(p["limit_indices"]) == _shape(x)
            and (p["strides"] is None or all(s == 1 for s in p["strides"])))


def slice_rule(eqn, defn):
    """Slices that select what is already there.

        slice[full](x)                         → x
        slice[d: k:k+1](stack[d](a0..an))      → reshape(a_k)       (adds the size-1 dim)
        slice[d: in piece i](concatenate[d](..)) → slice(piece_i)    (or piece_i if it is all)
    """
    x, = eqn.invars
    if _full_slice(eqn):
        return _walk.forward(eqn, [x])
    d_eqn = defn(x)
    if d_eqn is None:
        return None
    p = eqn.params
    strides = p["strides"] or (1,) * len(_shape(x))
    start, limit = p["start_indices"], p["limit_indices"]
    if d_eqn.primitive.name == "stack":
        ax = d_eqn.params["axis"]
        others_full = all(start[d] == 0 and limit[d] == _shape(x)[d] and strides[d] == 1
                          for d in range(len(start)) if d != ax)
        if others_full and limit[ax] - start[ax] == 1:
            em = _walk.Emitter(eqn)
            return em.replacement([_reshape(em, d_eqn.invars[start[ax]], _shape(eqn.outvars[0]))])
        return None
    if d_eqn.primitive.name == "concatenate":
        ax = d_eqn.params["dimension"]
        off = 0
        for piece in d_eqn.invars:
            n = _shape(piece)[ax]
            if off <= start[ax] and limit[ax] <= off + n:
                s = list(start)
                lim = list(limit)
                s[ax] -= off
                lim[ax] -= off
                if tuple(s) == (0,) * len(s) and tuple(lim) == _shape(piece) and all(
                        st == 1 for st in strides):
                    return _walk.forward(eqn, [piece])
                em = _walk.Emitter(eqn)
                out = em.bind(eqn.primitive, piece, start_indices=tuple(s),
                              limit_indices=tuple(lim), strides=p["strides"])[0]
                return em.replacement([out])
            off += n
    return None


def concatenate_rule(eqn, defn):
    """Adjacent slices of one array, concatenated, are one slice.

        concatenate[d](slice[d: a:b](x), slice[d: b:c](x)) → slice[d: a:c](x)   (→ x if all)
    """
    d = eqn.params["dimension"]
    srcs = [defn(a) for a in eqn.invars]
    if len(srcs) < 2 or any(s is None or s.primitive.name != "slice" for s in srcs):
        return None
    x = srcs[0].invars[0]
    if any(s.invars[0] is not x or s.params["strides"] not in (None, (1,) * len(_shape(x)))
           for s in srcs):
        return None
    st0, lim0 = srcs[0].params["start_indices"], srcs[0].params["limit_indices"]
    for s in srcs[1:]:
        st, lim = s.params["start_indices"], s.params["limit_indices"]
        if any((st[k], lim[k]) != (st0[k], lim0[k]) for k in range(len(st)) if k != d):
            return None
    for a, b in zip(srcs, srcs[1:]):
        if a.params["limit_indices"][d] != b.params["start_indices"][d]:
            return None
    start = tuple(st0)
    limit = tuple(lim0[k] if k != d else srcs[-1].params["limit_indices"][d]
                  for k in range(len(lim0)))
    if start == (0,) * len(start) and limit == _shape(x):
        return _walk.forward(eqn, [x])
    em = _walk.Emitter(eqn)
    return em.replacement([em.bind(_prim("slice"), x, start_indices=start, limit_indices=limit,
                                   strides=None)[0]])


def reshape_rule(eqn, defn):
    """Reshapes collapse.

        reshape[s](x) with x of shape s          → x
        reshape[s](reshape(x)) / reshape(squeeze(x)) → reshape[s](x)   (→ x if x has shape s)
        squeeze(broadcast_in_dim[expand dims](x))    → x
    """
    if eqn.primitive.name == "reshape" and eqn.params.get("dimensions") is not None:
        return None
    if eqn.primitive.name == "reshape" and not C.replicated(eqn.params.get("sharding")):
        return None
    x = eqn.invars[0]
    out_shape = _shape(eqn.outvars[0])
    if _shape(x) == out_shape:
        return _walk.forward(eqn, [x])
    d_eqn = defn(x)
    if d_eqn is None or not (d_eqn.primitive.name in ("reshape", "squeeze")
                             or _is_expand_dims(d_eqn)):
        return None
    if d_eqn.primitive.name == "reshape" and (d_eqn.params.get("dimensions") is not None
                                              or not C.replicated(d_eqn.params.get("sharding"))):
        return None
    src = d_eqn.invars[0]
    if _shape(src) == out_shape:
        return _walk.forward(eqn, [src])
    em = _walk.Emitter(eqn)
    return em.replacement([_reshape(em, src, out_shape)])


def _is_expand_dims(eqn) -> bool:
    """broadcast_in_dim that only inserts size-1 dims (jnp.array([...])'s expand_dims)."""
    if eqn.primitive.name != "broadcast_in_dim" or not C.replicated(eqn.params.get("sharding")):
        return False
    x, = eqn.invars[:1]
    bd = tuple(eqn.params["broadcast_dimensions"])
    out = tuple(eqn.params["shape"])
    return (list(bd) == sorted(bd) and all(out[b] == s for b, s in zip(bd, _shape(x)))
            and all(out[d] == 1 for d in range(len(out)) if d not in bd)
            and len(eqn.invars) == 1)


def transpose_rule(eqn, defn):
    """transpose[p](transpose[q](x)) → transpose[q∘p](x); the identity permutation → x; a
    permutation that moves only size-1 dims → reshape (the elements keep their order), which
    the reshape rule then collapses: vmap's `c[0]` of a stacked (4, N) value leaves
    reshape (1, N), transpose (N, 1), squeeze chains that on the TPU padded each (8, 128) tile
    of a (N, 1) array (Philox-4x32-10 compiled 4-6.6x jax.jit's time)."""
    x, = eqn.invars
    perm = tuple(eqn.params["permutation"])
    if perm == tuple(range(len(perm))):
        return _walk.forward(eqn, [x])
    shape = _shape(x)
    if [d for d in perm if shape[d] != 1] == [d for d in range(len(perm)) if shape[d] != 1]:
        em = _walk.Emitter(eqn)
        return em.replacement([_reshape(em, x, _shape(eqn.outvars[0]))])
    d_eqn = defn(x)
    if d_eqn is None or d_eqn.primitive.name != "transpose":
        return None
    q = d_eqn.params["permutation"]
    composed = tuple(q[p] for p in perm)
    src = d_eqn.invars[0]
    if composed == tuple(range(len(composed))):
        return _walk.forward(eqn, [src])
    em = _walk.Emitter(eqn)
    return em.replacement([em.bind(eqn.primitive, src, permutation=composed)[0]])


def rev_rule(eqn, defn):
    """rev[a](rev[b](x)) → rev[a △ b](x) (→ x when the same dims); rev[()](x) → x."""
    x, = eqn.invars
    dims = set(eqn.params["dimensions"])
    if not dims:
        return _walk.forward(eqn, [x])
    d_eqn = defn(x)
    if d_eqn is None or d_eqn.primitive.name != "rev":
        return None
    rest = tuple(sorted(dims ^ set(d_eqn.params["dimensions"])))
    src = d_eqn.invars[0]
    if not rest:
        return _walk.forward(eqn, [src])
    em = _walk.Emitter(eqn)
    return em.replacement([em.bind(eqn.primitive, src, dimensions=rest)[0]])


def unstack_rule(eqn, defn):
    """unstack[d](stack[d](a0..an)) → a0..an; of a static scatter, `unstack_of_scatter`."""
    x, = eqn.invars
    d_eqn = defn(x)
    if d_eqn is not None and d_eqn.primitive.name == "scatter":
        return unstack_of_scatter(eqn, d_eqn)
    if (d_eqn is None or d_eqn.primitive.name != "stack"
            or d_eqn.params["axis"] != eqn.params["axis"]):
        return None
    return _walk.forward(eqn, list(d_eqn.invars))


def _scattered_rows(s_eqn, axis: int) -> tuple | None:
    """({operand row j along `axis`: update row k}, the updates' dim of k) for a scatter that
    replaces whole rows at static, distinct, in-range indices (`x.at[idx].set(u)` on a vmapped
    state), else None."""
    x, idx, u = s_eqn.invars
    dn, xs, us = s_eqn.params["dimension_numbers"], _shape(x), _shape(u)
    if (not C.is_literal(idx) or tuple(dn.inserted_window_dims) != (axis,)
            or tuple(dn.scatter_dims_to_operand_dims) != (axis,) or dn.operand_batching_dims
            or len(us) != len(xs)):
        return None
    window = tuple(dn.update_window_dims)
    others = [d for d in range(len(xs)) if d != axis]
    if len(window) != len(others) or any(us[w] != xs[d] for w, d in zip(window, others)):
        return None                    # (a window that does not cover the rest of a row)
    (k_dim,) = [d for d in range(len(us)) if d not in window]
    # the same scatter on one element of every other dim: what lands where along `axis`
    small_x = tuple(xs[d] if d == axis else 1 for d in range(len(xs)))
    small_u = tuple(us[d] if d == k_dim else 1 for d in range(len(us)))
    try:
        smap = _im.scatter_map(small_x, small_u, np.asarray(C.literal_value(idx)), dn,
                               s_eqn.params["mode"])
    except Decline:
        return None
    rows = [int(j) for j in np.asarray(smap).reshape(-1)]
    if any(j < 0 for j in rows) or len(set(rows)) != len(rows):
        return None                    # dropped, or written twice (XLA picks one: not defined)
    return {j: k for k, j in enumerate(rows)}, k_dim


def unstack_of_scatter(eqn, s_eqn):
    """The rows of a state some of whose rows a static scatter replaced are those rows of the
    updates and the others of the state, picked at trace time:

        y = scatter[rows (4, 9, 14, 3) along 1](x, u)          x: (N, 16), u: (N, 4)
        y0..y15 = unstack[1](y)
      → x0..x15 = unstack[1](x) ; u0..u3 = unstack[1](u)
        y0..y15 = x0, x1, x2, u3, u0, x5, ..                   (renaming; the unstacks then
                                                                cancel with their stacks)

    (Salsa20/8 written with `s.at[idx].set(...)`: split by scalarize, each quarter round's
    update stayed a scatter between a stack and an unstack, and cut the TPU's kernel in nine.)
    Only a replacing scatter (not scatter-add), static indices, each row written at most once
    and in range, and its window the whole of every other dim."""
    if s_eqn.primitive.name != "scatter" or C.has_effects(s_eqn):
        return None
    axis = eqn.params["axis"]
    found = _scattered_rows(s_eqn, axis)
    if found is None:
        return None
    picked, k_dim = found
    x, _, u = s_eqn.invars
    em = _walk.Emitter(eqn)
    xs = em.bind(eqn.primitive, x, axis=axis)
    us = em.bind(eqn.primitive, u, axis=k_dim)
    return em.replacement([us[picked[j]] if j in picked else xs[j] for j in range(len(xs))])


# Elementwise primitives that data movement commutes with (each output element depends on the
# same-position elements of the operands only).
ELEMENTWISE = frozenset({
    "add", "sub", "mul", "div", "rem", "max", "min", "neg", "abs", "sign", "sqrt", "rsqrt",
    "and", "or", "xor", "not", "shift_left", "shift_right_logical", "shift_right_arithmetic",
    "population_count", "clz", "eq", "ne", "lt", "le", "gt", "ge", "select_n",
    "convert_element_type", "floor", "ceil", "round", "is_finite", "exp", "log", "sin", "cos",
    "tanh", "logistic", "integer_pow", "square", "pow", "atan2", "exp2", "log1p", "expm1",
})

_MOVES = ("slice", "transpose", "rev", "reshape", "squeeze")


def push_through_elementwise(eqn, defn, uses):
    """Data movement of an elementwise result moves to its operands where it then cancels.

        slice[k](add(concatenate(a, b), c)) → add(slice[k](concatenate(a, b)), slice[k](c))
                                             → add(a, slice[k](c))        (next sweep)
        transpose(mul(transpose(x), y))     → mul(x, transpose(y))

    Preconditions: the elementwise result has no other use (nothing is computed twice), and
    for at least one operand the moved operation cancels by another rule. Rank-0 operands
    broadcast and stay as they are. Elementwise ops commute with movement exactly: each output
    element is computed from the same inputs, in the same way.
    """
    if eqn.primitive.name not in _MOVES or len(eqn.invars) != 1:
        return None
    y = eqn.invars[0]
    e = defn(y)
    if (e is None or e.primitive.name not in ELEMENTWISE or uses.get(y, 0) != 1
            or C.has_effects(e)):
        return None
    shape = _shape(y)
    if any(_shape(a) not in (shape, ()) for a in e.invars):
        return None
    move_rule = RULES[eqn.primitive.name]
    cancels = False
    for a in e.invars:
        if C.is_literal(a) or _shape(a) != shape:
            continue
        probe = C.new_eqn([a], [C.new_var(C.aval_of(eqn.outvars[0]).update(
            dtype=C.aval_of(a).dtype, weak_type=C.aval_of(a).weak_type))],
            eqn.primitive, eqn.params)
        if move_rule(probe, defn) is not None:
            cancels = True
            break
    if not cancels:
        return None
    em = _walk.Emitter(eqn)
    moved = [a if _shape(a) == () and shape != () else em.bind(eqn.primitive, a, **eqn.params)[0]
             for a in e.invars]
    return em.replacement(em.bind(e.primitive, *moved, **e.params))


def stack_split(x, defn, uses):
    """(the stack producing `x`, directly or through a reshape that only splits the stacked
    axis, and the dims of `x` the stacked axis became) where each has no other use; else None."""
    d = defn(x)
    if d is None or uses.get(x, 0) != 1:
        return None
    if d.primitive.name == "stack":
        return d, (d.params["axis"],)
    if d.primitive.name != "reshape" or d.params.get("dimensions") is not None \
            or not C.replicated(d.params.get("sharding")):
        return None
    y = d.invars[0]
    st = defn(y)
    if st is None or st.primitive.name != "stack" or uses.get(y, 0) != 1:
        return None
    a, ys, xs = st.params["axis"], _shape(y), _shape(x)
    m = len(xs) - len(ys) + 1
    if m < 1 or xs[:a] != ys[:a] or xs[a + m:] != ys[a + 1:]:
        return None
    return st, tuple(range(a, a + m))


def transpose_of_stack(eqn, defn, uses):
    """A transpose that moves only a stack's axis (split by a reshape or not) is that stack
    along another axis: the pieces are not moved, only where they are put.

        e = transpose[(1, 2, 0)](reshape[(N, 4, 4)](stack[axis=1](p0..p15)))   p_i: (N,)
      → e = reshape[(4, 4, N)](stack[axis=0](p0..p15))

    (A caller's word-major state, vmapped over its last axis: the pieces rejoined in its
    layout, not in the vmapped (N, 4, 4), transposed after. On the TPU each of those is a pass
    over an array whose minor dims of 4 are padded to 128.) The other dims must keep their
    order; the stack and the reshape must have no other use (nothing is stacked twice)."""
    if eqn.primitive.name != "transpose":
        return None
    found = stack_split(eqn.invars[0], defn, uses)
    if found is None:
        return None
    st, split = found
    perm = tuple(eqn.params["permutation"])
    at = perm.index(split[0])
    if perm[at:at + len(split)] != split:
        return None
    rest = [d for d in perm if d not in split]
    if rest != sorted(rest):
        return None
    em = _walk.Emitter(eqn)
    stacked = em.bind(st.primitive, *st.invars, **dict(st.params, axis=at))[0]
    out = _shape(eqn.outvars[0])
    if _shape(stacked) != out:
        stacked = _reshape(em, stacked, out)
    return em.replacement([stacked])


def transpose_into_call(eqn, defn, uses, ctx=None):
    """A transpose of a call's only result moves into the call, where it cancels there (the
    call's other rules then see it):

        c = jit[{ lambda ; a. let b = reshape(stack[1](..)); t = transpose[(2, 0, 1)] a
                              d = add b t in (d,) }] a
        e = transpose[(1, 2, 0)] c
      → e = jit[{ lambda ; a. let b = reshape[(4, 4, N)](stack[0](..)); d = add b a in (d,) }] a

    (vmap of a jitted function with `out_axes` not 0 puts the batch axis first inside and
    transposes the result outside.) Only a plain call (`_walk.plain_call`) of one result used
    once, and only where the body then holds fewer transposes than it did plus this one."""
    x = eqn.invars[0]
    call = defn(x)
    if call is None or not _walk.plain_call(call) or len(call.outvars) != 1 \
            or uses.get(x, 0) != 1:
        return None
    body = call.params["jaxpr"]
    if body.consts or not _moves_at_output(body.jaxpr):
        return None
    out, = body.jaxpr.outvars
    if C.is_literal(out):
        return None
    # a body probed once is not probed again in the pipeline's later rounds (its bodies stay
    # the same objects where nothing changed them)
    memo = ctx.cache.setdefault("movement.into_call", {}) if ctx is not None else {}
    key = (id(body.jaxpr), tuple(eqn.params["permutation"]))
    if key in memo:
        new_body = memo[key][1]
        if new_body is None:
            return None
    else:
        new_body = _moved_into(body, eqn, ctx)
        memo[key] = (body, new_body)   # (the body kept alive: its id is not reused)
        if new_body is None:
            return None
    out_var = C.new_var(C.aval_of(eqn.outvars[0]))
    new_call = C.new_eqn(list(call.invars), [out_var], call.primitive,
                         dict(call.params, jaxpr=new_body), call.effects, call.source_info,
                         call.ctx)
    return _walk.Replacement([new_call], [out_var])


def _moved_into(body, eqn, ctx):
    """`body` with the transpose `eqn` applied to its result and simplified, where that leaves
    fewer transposes than `body` has plus that one; else None."""
    out, = body.jaxpr.outvars
    moved = C.new_var(C.aval_of(eqn.outvars[0]))
    jaxpr = C.replace_jaxpr(body.jaxpr, eqns=list(body.jaxpr.eqns) + [
        C.new_eqn([out], [moved], eqn.primitive, eqn.params, None, eqn.source_info, eqn.ctx)],
        outvars=[moved])
    scratch = Report()   # the probe's own rewrites: one is recorded, the move, if it pays
    for _ in range(8):
        jaxpr, changed = simplify(jaxpr, scratch, ctx=ctx)
        if not changed:
            break
    jaxpr, _ = _walk.dce(jaxpr)
    before = sum(e.primitive.name == "transpose" for e in body.jaxpr.eqns) + 1
    if sum(e.primitive.name == "transpose" for e in jaxpr.eqns) >= before:
        return None
    return C.closed(jaxpr, ())


def _moves_at_output(jaxpr) -> bool:
    """Whether a body's result is made by data movement or elementwise work on it (what a
    transpose moved in could cancel with)."""
    out = jaxpr.outvars[0]
    for e in jaxpr.eqns:
        if out in e.outvars:
            return e.primitive.name in _MOVES + ("stack",) or e.primitive.name in ELEMENTWISE
    return False


RULES: dict[str, Callable] = {
    "slice": slice_rule,
    "concatenate": concatenate_rule,
    "reshape": reshape_rule,
    "squeeze": reshape_rule,
    "transpose": transpose_rule,
    "rev": rev_rule,
    "unstack": unstack_rule,
}


def use_counts(jaxpr) -> dict:
    """Each value -> how many times the level reads it, a level output counted twice (it is
    needed whole: the rules' "no other use" checks then see it as used elsewhere)."""
    uses: dict = {}
    Lit = C.Literal   # (isinstance inline: these loops see every equation)
    for e in jaxpr.eqns:
        for a in e.invars:
            if not isinstance(a, Lit):
                uses[a] = uses.get(a, 0) + 1
    for a in jaxpr.outvars:
        if not isinstance(a, Lit):
            uses[a] = uses.get(a, 0) + 2
    return uses


def simplify(jaxpr, report, rules=RULES, ctx=None):
    """One level: apply `rules` in one forward sweep (a replacement's output is seen by the
    equations after it, so chains cancel in one sweep), then, where no rule applied, push data
    movement through a single-use elementwise producer (`push_through_elementwise`).
    With `ctx`'s `exact=True`, a rewrite of floating-point values is declined (`analysis.exact`).
    Returns (jaxpr, changed)."""
    producers: dict = {}
    uses = use_counts(jaxpr)
    Lit = C.Literal   # (isinstance inline: these loops see every equation)

    def defn(atom):
        return None if isinstance(atom, Lit) else producers.get(atom)

    def rule(eqn):
        name = eqn.primitive.name
        rep = None
        if not eqn.effects:
            r = rules.get(name)
            rep = r(eqn, defn) if r is not None else None
            if rep is None and name in _MOVES:
                rep = push_through_elementwise(eqn, defn, uses)
            if rep is None and name == "transpose":
                rep = (transpose_of_stack(eqn, defn, uses)
                       or transpose_into_call(eqn, defn, uses, ctx))
            if rep is not None and (why := _exact.reason(ctx, _exact.eqn_atoms(eqn), "moving")):
                report.declined(PASS, eqn, why)  # exact=True: XLA's fusion around floats kept
                rep = None
        if rep is None:
            for v in eqn.outvars:
                producers[v] = eqn
            return None
        for e in rep.eqns:
            for v in e.outvars:
                producers[v] = e
        report.applied(PASS, eqn, after=rep.eqns)
        return rep

    return _walk.rewrite_eqns(jaxpr, rule)


def run(cj, ctx):
    if not ctx.options.movement:
        return cj, False
    changed = False

    def level(c):
        nonlocal changed
        j, ch = simplify(c.jaxpr, ctx.report, ctx=ctx)
        if not ch:
            return c
        changed = True
        return C.closed(j, c.consts)

    return _walk.map_jaxprs(cj, level), changed
