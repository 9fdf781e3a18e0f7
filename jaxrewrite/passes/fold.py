"""Constant folding of integer and boolean index arithmetic, through nested calls.

Indices written with numpy reach a `gather` through index arithmetic and through small jits
(`_take`, `_where`) that receive them as arguments. This pass makes them literals:

    d:i32[4] = add 0:i32[4]{3,1,2,0} 4:i32[]        ->   (d is the literal [7,5,6,4])
    e:i32[4] = select_n b a d                        ->   (e is a literal)
    c = jit[name=_take, jaxpr={b, a. ...}] x a       ->   c = jit[jaxpr={b. ... a↦literal ...}] x

Rules (each a row below):

* `fold`: an equation with no effects and no inner jaxpr, all of whose operands are literals (or
  values folded earlier at this level) and all of whose operands and results are integer or
  boolean, is evaluated now, through JAX on the CPU (XLA's semantics: shifts by the bit width or
  more, integer division by zero and overflow match the compiled program). Only the operations
  in `NUMPY_EXACT` - data movement, comparisons, bitwise logic, select and wrapping
  add/sub/mul/neg - are evaluated in numpy, where the result is the same bit for bit and no XLA
  compilation (tens of milliseconds each) is needed. Results
  larger than `fold_limit` elements are not folded. Large splats (a broadcast scalar, `iota`)
  keep their equation - XLA builds them cheaply and a literal would bloat the program - and so
  do large results computed from them, but their values still feed later folds (and index
  operands of gathers, scatters and dynamic slices are always materialized). A value that
  repeats along an axis (a table broadcast over a vmapped batch) is held as a numpy broadcast
  view, and the rows that allow it run on one copy (`analysis/repeats.py`): folding costs the
  table's size, not the batch's. Floating-point arithmetic is never folded.
* `forward` (table `FORWARD`): an equation whose result is one of its operands is that operand,
  for every dtype (nothing is computed): `select_n p a a -> a` (a vmapped `switch` routes each
  branch constant through `select_n(p, stop_gradient(c), c)`), `select_n p a0 a1` with `p` a
  constant that is all k -> `a_k`.
* `specialise`: a call whose argument is a literal gets a copy of its body with the literal
  substituted; a splat kept as an equation is rebuilt in the body as a `broadcast_in_dim` of its
  one element (`jnp.take`'s all-false `idx < 0` mask of 65+ elements reaches `_where`'s
  select). `jit`, `closed_call` and `checkpoint` drop the argument (jit's per-argument params
  kept in step) and hoist body outputs that became literals to the call site; `scan` (consts),
  `while` (cond/body consts), `cond` (operands), `custom_jvp_call`/`custom_vjp_call` and
  `shard_map` (replicated arguments, whose shape the body sees unchanged) keep their signature
  (the argument goes unused). A dropping call's output that is a static argument passed
  through is that argument (as a literal output is hoisted). Each specialisation consumes a
  literal use, so repeated rounds converge, also against dedup (which only merges identical
  bodies). A plain `jit` whose specialised body is at most `TRIVIAL_EQNS` equations (holding
  no jaxpr) is inlined: specialising made it this call site's own function, lowered and
  compiled alone for nothing (qujax reads 48 angles through one jitted `_take`: 48 bodies of
  one gather, 5 -> 49 MLIR functions); XLA inlines calls before fusion, so no value changes.

      c = jit[_take]{ a, i. ... gather a i ... } x 7    ->   c = gather x 7   (7: literal index)
"""
from __future__ import annotations

import math
from typing import Callable

import numpy as np

from .. import _compat as C
from .. import _walk
from .._memo import array_key, memo, same_bits
from ..analysis import repeats

NAME = "fold"

# Never evaluated at rewrite time: hidden state, placement, collectives, barriers.
NOT_FOLDED = frozenset({
    "rng_uniform", "iota_32x2_shape", "device_put", "optimization_barrier", "pvary", "psum",
    "pmax", "pmin", "ppermute", "all_gather", "all_to_all", "axis_index", "reduce_scatter",
    "psum_scatter", "pbroadcast", "debug_callback", "pure_callback", "io_callback",
    "random_seed", "random_bits", "random_wrap", "random_unwrap", "random_split",
    "random_fold_in", "copy_p", "sharding_constraint", "mesh_cast", "reshard", "platform_index",
})

# Results above this size that are one repeated value (or an iota) keep their equation.
SPLAT_KEEP_SIZE = 64
MEMO_SIZE = 256     # evaluations on values up to this size are memoised by value
TRIVIAL_EQNS = 2    # a `jit` specialised to a body this small is inlined


def _is_index_dtype(dtype) -> bool:
    try:
        return np.dtype(dtype).kind in "iub"
    except TypeError:  # extended dtypes (PRNG keys, float0)
        return False


def _atom_value(atom, static):
    if C.is_literal(atom):
        return np.asarray(C.literal_value(atom), dtype=C.aval_of(atom).dtype)
    return static.get(atom)


def _make_literal(value: np.ndarray, aval):
    value = np.asarray(value, dtype=aval.dtype)
    return C.literal(value[()] if value.ndim == 0 else value, aval)


# --- call specialisation: (sub-jaxpr param, which eqn invars feed which body invars, drop?) ------

def _all_args(eqn, name):
    return list(range(len(eqn.invars))), 0  # (eqn invar positions, body invar offset)


def _scan_consts(eqn, name):
    return list(range(eqn.params["num_consts"])), 0


def _while_consts(eqn, name):
    nc, nb = eqn.params["cond_nconsts"], eqn.params["body_nconsts"]
    if name == "cond_jaxpr":
        return list(range(nc)), 0
    return list(range(nc, nc + nb)), nc


def _cond_operands(eqn, name):
    return list(range(1, len(eqn.invars))), 1


# primitive name -> (body params, positions function, drop the argument?)
SPECIALISE: dict[str, tuple[tuple[str, ...], Callable, bool]] = {
    "jit": (("jaxpr",), _all_args, True),
    "pjit": (("jaxpr",), _all_args, True),
    "closed_call": (("call_jaxpr",), _all_args, True),
    "checkpoint": (("jaxpr",), _all_args, True),
    "remat2": (("jaxpr",), _all_args, True),  # checkpoint_p's name in jax 0.10
    "custom_jvp_call": (("call_jaxpr",), _all_args, False),
    "custom_vjp_call": (("call_jaxpr",), _all_args, False),
    "scan": (("jaxpr",), _scan_consts, False),
    "while": (("cond_jaxpr", "body_jaxpr"), _while_consts, False),
    "cond": (("branches",), _cond_operands, False),
    # Replicated arguments only (the body sees the same shape), signature kept (in_specs).
    "shard_map": (("jaxpr",), _all_args, False),
}


LOOPS = frozenset({"scan", "while"})


def substitute_invars(jaxpr, subs: dict, drop: bool, prelude=()):
    """`jaxpr` with body invars in `subs` (index -> literal, or a var that an equation of
    `prelude`, put first, defines) replaced; dropped when `drop`."""
    env = {jaxpr.invars[i]: lit for i, lit in subs.items()}
    eqns = list(prelude)
    for e in jaxpr.eqns:
        new_in = [env.get(a, a) if not C.is_literal(a) else a for a in e.invars]
        eqns.append(e.replace(invars=new_in) if any(a is not b for a, b in zip(new_in, e.invars))
                    else e)
    outvars = [env.get(a, a) if not C.is_literal(a) else a for a in jaxpr.outvars]
    kw = dict(eqns=eqns, outvars=outvars)
    if drop:
        keep = [i not in subs for i in range(len(jaxpr.invars))]
        kw["invars"] = [v for v, k in zip(jaxpr.invars, keep) if k]
        kw["debug_info"] = C.filtered_debug_info(jaxpr, keep_in=keep)
    return C.replace_jaxpr(jaxpr, **kw)


def _uses(jaxpr) -> set:
    used = {a for e in jaxpr.eqns for a in e.invars if not C.is_literal(a)}
    return used | {a for a in jaxpr.outvars if not C.is_literal(a)}


class _Folder:
    def __init__(self, ctx):
        self.limit = int(ctx.options.fold_limit)
        self.report = ctx.report
        # Per jaxpr object, for the whole rewrite (every round): the result depends only on the
        # object, and the next round sees most nested jaxprs again unchanged.
        cache = getattr(ctx, "cache", None)
        self.memo: dict = {} if cache is None else cache.setdefault("fold.memo", {})
        self.cache = cache

    # -- a jaxpr (closed or open), memoised per object --
    def jaxpr(self, j):
        hit = self.memo.get(id(j))
        if hit is not None and hit[0] is j:
            return hit[1], hit[2]
        cj = _walk.as_closed(j)
        changed = False
        if isinstance(j, C.ClosedJaxpr) and j.consts:
            new = _walk.literalize_consts(cj, self.limit)
            changed = new is not cj
            cj = new
        out, ch = self.level(cj)
        changed |= ch
        res = _walk.like(j, out) if changed else j
        self.memo[id(j)] = (j, res, changed)
        return res, changed

    def level(self, cj):
        j = cj.jaxpr
        index_uses = _index_operands(j)  # always materialized: the gathers pass reads them
        env: dict = {}      # var -> literal (materialized folds)
        static: dict = {}   # var -> numpy value (every folded value, materialized or not)
        eqns, changed = [], False
        calls = {i for i, subs in _walk.nested_eqns(j) if subs}
        for i, eqn in enumerate(j.eqns):
            renamed = _walk.rename_operands(eqn, env)
            changed |= renamed is not eqn
            eqn = renamed
            if i in calls:
                rep = self.call(eqn, static)
                if rep is not None:
                    new_eqns, outs = rep
                    eqns.extend(new_eqns)
                    for old, new in zip(eqn.outvars, outs):
                        if new is not old and not C.is_dropvar(old):
                            env[old] = new
                            if not C.is_literal(new) and new in static:  # `_passed_through`
                                static[old] = static[new]
                    changed = True
                else:
                    eqns.append(eqn)
                continue
            fwd = _forward(eqn, static)
            if fwd is not None:
                for old, new in zip(eqn.outvars, fwd):
                    env[old] = new
                    if not C.is_literal(new) and new in static:
                        static[old] = static[new]
                changed = True
                self.report.count("fold.forwarded")
                continue
            vals = self.try_fold(eqn, static)
            if vals is None:
                eqns.append(eqn)
                continue
            keep_eqn = False
            from_kept = any(not C.is_literal(a) for a in eqn.invars)  # a splat kept as an equation
            for v, val in zip(eqn.outvars, vals):
                if C.is_dropvar(v):
                    continue
                static[v] = val
                if v not in index_uses and (
                        _is_splat(eqn, val) or (from_kept and val.size > SPLAT_KEEP_SIZE)):
                    keep_eqn = True
                else:
                    env[v] = _make_literal(val, v.aval)
            if keep_eqn:
                eqns.append(eqn)
            else:
                changed = True
                self.report.count("fold.folded")
        if not changed:
            return cj, False
        outvars = [_walk.substitute(a, env) for a in j.outvars]
        return C.closed(C.replace_jaxpr(j, eqns=eqns, outvars=outvars), cj.consts), True

    # -- folding one equation --
    def try_fold(self, eqn, static):
        Lit = C.Literal
        for a in eqn.invars:  # cheapest test first: most equations have a traced operand
            if not isinstance(a, Lit) and a not in static:
                return None
        if eqn.effects or C.is_stateful(eqn) or eqn.primitive.name in NOT_FOLDED:
            return None
        if not eqn.outvars:
            return None
        for v in eqn.outvars:
            a = v.aval
            if not hasattr(a, "dtype") or not _is_index_dtype(a.dtype):
                return None
            if math.prod(a.shape) > self.limit:
                return None
        vals = []
        for a in eqn.invars:
            if not _is_index_dtype(getattr(C.aval_of(a), "dtype", None)):
                return None
            val = _atom_value(a, static)
            if val is None:
                return None
            vals.append(val)
        key = None
        if all(np.size(v) <= MEMO_SIZE for v in vals):
            # Unrolled code folds the same index arithmetic once per iteration: evaluate once.
            key = (eqn.primitive, tuple(eqn.params.items()), tuple(map(array_key, vals)),
                   tuple((tuple(v.aval.shape), v.aval.dtype) for v in eqn.outvars))
        return memo(self.cache if key is not None else None, "fold.eval", key,
                    lambda: _evaluate(eqn, vals, self.report))

    # -- calls: recurse into bodies, specialise on literal arguments --
    def call(self, eqn, static):
        """(new equations, outputs) replacing `eqn`, or None when nothing changed."""
        spec = SPECIALISE.get(eqn.primitive.name)
        if C.is_jit(eqn):
            spec = SPECIALISE["jit"]
        new_in = list(eqn.invars)
        # Static values not materialized (large splats) stay arguments: no big literal in bodies.
        if spec is None or eqn.effects:
            new = _walk.map_eqn_subjaxprs(eqn, lambda sub: self.jaxpr(sub)[0])
            return None if new is eqn else ([new], list(new.outvars))
        names, positions, drop = spec
        params = dict(eqn.params)
        any_change = False
        drop_mask = [False] * len(eqn.invars)
        for name in names:
            bodies = params[name]
            single = not isinstance(bodies, tuple)
            new_bodies = []
            for body in ((bodies,) if single else bodies):
                pos, off = positions(eqn, name)
                bj = body.jaxpr if isinstance(body, C.ClosedJaxpr) else body
                used = None  # computed only when an argument is a literal
                subs, prelude = {}, []
                for p in pos:
                    a = new_in[p]
                    bv = bj.invars[p - off]
                    if C.is_literal(a):
                        if np.shape(C.literal_value(a)) != tuple(bv.aval.shape):
                            continue  # a sharded argument: the body sees a shard of it
                        sub = C.literal(C.literal_value(a), bv.aval)
                    elif eqn.primitive.name in LOOPS:
                        continue  # a splat rebuilt in a loop body would be rebuilt every trip
                    else:
                        sub = _static_in_body(static.get(a), bj, bv, self.limit)
                        if sub is None:
                            continue
                    if not drop and used is None:
                        used = _uses(bj)
                    if drop or bv in used:
                        if isinstance(sub, tuple):  # (equation, its output)
                            prelude.append(sub[0])
                            sub = sub[1]
                        subs[p - off] = sub
                        drop_mask[p] = drop
                if subs and not bj.effects:
                    nj = substitute_invars(bj, subs, drop, prelude)
                    nb = C.closed(nj, body.consts) if isinstance(body, C.ClosedJaxpr) else nj
                    nb, _ = self.jaxpr(nb)
                    any_change = True
                    self.report.count("fold.specialised")
                else:
                    nb, ch = self.jaxpr(body)
                    any_change |= ch
                    if drop:
                        for p in pos:
                            drop_mask[p] = False
                new_bodies.append(nb)
            params[name] = new_bodies[0] if single else tuple(new_bodies)
        if not drop:
            if not any_change:
                return None
            new = eqn.replace(params=params)
            return [new], list(new.outvars)
        # Dropping calls (jit, closed_call, checkpoint): drop literal args, hoist literal outputs.
        name = names[0]
        body = params[name]
        bj = body.jaxpr if isinstance(body, C.ClosedJaxpr) else body
        keep_in = [not d for d in drop_mask]
        if any(drop_mask) and len(bj.invars) != sum(keep_in):
            # A body substituted without dropping (effects): keep the arguments.
            keep_in = [True] * len(eqn.invars)
        # outputs that are static arguments passed through are those arguments, as literal
        # outputs are those literals: the index of `jnp.take` leaves `_where` either way
        through = _passed_through(eqn, params, bj, [a for a, k in zip(eqn.invars, keep_in) if k],
                                  static)
        keep_out = [not C.is_literal(a) and t is None for a, t in zip(bj.outvars, through)]
        if not any_change and all(keep_out):
            return None
        if not all(keep_out):
            nj = C.replace_jaxpr(bj, outvars=[a for a, k in zip(bj.outvars, keep_out) if k],
                                 debug_info=C.filtered_debug_info(bj, keep_out=keep_out))
            body = C.closed(nj, body.consts) if isinstance(body, C.ClosedJaxpr) else nj
            params[name] = body
            self.report.count("fold.hoisted", keep_out.count(False))
        if C.is_jit(eqn):
            params = C.jit_params_for_args(params, keep_in=keep_in, keep_out=keep_out)
        invars = [a for a, k in zip(eqn.invars, keep_in) if k]
        outvars = [v for v, k in zip(eqn.outvars, keep_out) if k]
        kept = iter(outvars)
        outs = [next(kept) if k else (t if t is not None else a)
                for k, t, a in zip(keep_out, through, bj.outvars)]
        if not outvars and not eqn.effects:
            return [], outs
        new = eqn.replace(invars=invars, outvars=outvars, params=params)
        if any_change and _trivial_call(new):
            eqns: list = []
            sub = dict(zip(outvars, _walk.inline_body(params[name], invars, eqns)))
            self.report.count("fold.inlined")
            return eqns, [a if C.is_literal(a) else sub.get(a, a) for a in outs]
        return [new], outs


def _trivial_call(eqn) -> bool:
    """A plain `jit` call whose body is at most `TRIVIAL_EQNS` equations holding no jaxpr."""
    if not C.is_jit(eqn):
        return False
    body = eqn.params["jaxpr"].jaxpr
    return (len(body.eqns) <= TRIVIAL_EQNS and not _walk.nested_eqns(body)
            and _walk.plain_call(eqn))


def _passed_through(eqn, params, body, args, static) -> list:
    """Per body output: the call argument it is, where that is a static value (a literal or a
    splat kept as an equation) and the output is placed as the argument is, else None."""
    pos = {v: i for i, v in enumerate(body.invars)}
    shardings = params.get("out_shardings") if C.is_jit(eqn) else None
    out = []
    for k, o in enumerate(body.outvars):
        a = None if C.is_literal(o) else args[pos[o]] if o in pos else None
        if a is not None and not (C.is_literal(a) or a in static):
            a = None
        if a is not None and shardings is not None and (
                shardings[k] is not C.unspecified_sharding()
                or params["out_layouts"][k] is not None):
            a = None
        out.append(a)
    return out


def _static_in_body(value, body, bv, limit):
    """What a static argument kept as an equation (a splat, an iota) becomes in a call's body:
    a splat is rebuilt there (`_splat_in_body`); another value becomes a literal where the body
    reads an index from it (`jnp.take(v, jnp.arange(n)[::-1])`'s index reaches `_take`), else
    it stays an argument (no large literal in a body that does not need it)."""
    if value is None:
        return None
    sub = _splat_in_body(value, bv.aval)
    if sub is None and value.size <= limit and tuple(value.shape) == tuple(bv.aval.shape) \
            and not C.is_varying(bv.aval) and _feeds_index(body, bv):
        sub = C.literal(value, bv.aval)
    return sub


def _feeds_index(body, var) -> bool:
    """Whether `var` reaches an index operand in `body` (through nested calls: if their bodies
    index anything at all)."""
    reached = {var}
    for e in body.eqns:
        if not any(not C.is_literal(a) and a in reached for a in e.invars):
            continue
        pos = INDEX_OPERANDS.get(e.primitive.name)
        if pos is not None and any(not C.is_literal(e.invars[i]) and e.invars[i] in reached
                                   for i in pos(len(e.invars))):
            return True
        if _walk.has_subjaxprs(e) and any(
                x.primitive.name in INDEX_OPERANDS
                for _, _, sub in C.params_jaxprs(e.params) for x in _walk.iter_eqns(sub)):
            return True
        reached.update(e.outvars)
    return False


def _splat_in_body(value, aval):
    """(equation, var) that rebuild a kept splat `value` inside a body as `broadcast_in_dim` of
    its one element (no large literal), or None if `value` is not one."""
    if value is None or value.size == 0 or C.is_varying(aval) \
            or tuple(value.shape) != tuple(aval.shape):
        return None
    if not repeats.uniform(value):
        return None
    scalar = C.literal(np.asarray(value.flat[0], dtype=value.dtype)[()],
                       aval.update(shape=(), weak_type=False))
    var = C.new_var(aval)
    e = C.new_eqn([scalar], [var], C.lax_primitive("broadcast_in_dim"),
                  dict(shape=tuple(aval.shape), broadcast_dimensions=(), sharding=None))
    return e, var


# --- forwarding: an equation whose result is one of its operands -------------------------------
#
# Each row: primitive name -> function of (equation, static values) -> the operands that are its
# results, or None. Forwarding is exact for every dtype: no value is computed.

def _same_value(a, b, static) -> bool:
    if a is b:
        return True
    va, vb = _atom_value(a, static), _atom_value(b, static)
    # (bits compared in place: a vmapped `switch` compares arms of 16,384 elements hundreds of
    # times)
    return (va is not None and vb is not None and va.dtype == vb.dtype
            and va.shape == vb.shape and same_bits(va, vb))


def _select_n_forward(eqn, static):
    """select_n p a a → a (equal arms: batching routes a `switch` branch's constants through
    `select_n(p, stop_gradient(c), c)`); select_n p a0 a1 ... with p all k → a_k."""
    pred, *cases = eqn.invars
    out = eqn.outvars[0].aval
    if any(C.aval_of(c).shape != out.shape or C.aval_of(c).dtype != out.dtype
           or getattr(C.aval_of(c), "weak_type", False) != getattr(out, "weak_type", False)
           for c in cases):
        return None
    if all(_same_value(cases[0], c, static) for c in cases[1:]):
        return [cases[0]]
    p = _atom_value(pred, static)
    if p is None or p.size == 0:
        return None
    flat = p.reshape(-1)
    k = int(flat[0])
    if not np.all(flat == flat[0]) or not 0 <= k < len(cases):
        return None
    return [cases[k]]


FORWARD: dict[str, Callable] = {
    "select_n": _select_n_forward,
}


def _forward(eqn, static) -> list | None:
    rule = FORWARD.get(eqn.primitive.name)
    return None if rule is None or eqn.effects else rule(eqn, static)


def _evaluate(eqn, vals, report=None) -> list | None:
    """`eqn` on static `vals` (numpy where bit-exact, else XLA on the CPU); None if it cannot be
    evaluated now (recorded in `report` as a decline with the error). The results are read-only:
    memoised results are shared."""
    outs = _numpy_eval(eqn, vals)
    if outs is None:
        if report is not None:  # each one an XLA compile: visible, since it costs compile time
            report.count("fold.evaluated_by_xla")
        try:
            outs = C.eval_primitive_on_cpu(eqn.primitive, vals, eqn.params)
        except Exception as e:  # noqa: BLE001 - the equation is kept; the error is recorded
            if report is not None:
                report.declined(NAME, eqn, f"constant evaluation failed ({type(e).__name__}: {e})")
            return None
    res = []
    for o, v in zip(outs, eqn.outvars):
        if o.shape != tuple(v.aval.shape) or o.dtype != v.aval.dtype:
            return None
        o = np.asarray(o)
        if o.flags.writeable:
            o.flags.writeable = False
        res.append(o)
    return res


# --- numpy evaluation where it is bit-exact -----------------------------------------------------
#
# Each row: primitive name -> (params it may carry (others: use XLA), numpy function of (values,
# params) -> list of results). Operands and results are integer or boolean (try_fold checks).
# Integer add/sub/mul/neg wrap modulo 2^bits in numpy and in XLA alike; remainder only by
# divisors other than 0 and -1, scatter only at unique in-bounds points; division, shifts, pow and
# everything else go through XLA (their edge cases differ from numpy's). XLA's route compiles a
# program per primitive (10-30 ms each, again after `jax.clear_caches`): a row here saves that.

def _bcast(v, p):
    shape, dims = tuple(p["shape"]), tuple(p["broadcast_dimensions"])
    if list(dims) != sorted(set(dims)):
        return None
    mid = [1] * len(shape)
    for i, d in enumerate(dims):
        mid[d] = v[0].shape[i]
    return [repeats.expand(v[0].reshape(mid), shape)]   # a view: see `analysis/repeats.py`


def _iota(v, p):
    shape, dim = tuple(p["shape"]), int(p["dimension"])
    ar = np.arange(shape[dim], dtype=p["dtype"])
    mid = [1] * len(shape)
    mid[dim] = shape[dim]
    return [repeats.expand(ar.reshape(mid), shape)]


def _owned(o: np.ndarray) -> np.ndarray:
    """A copy of a slice or transpose (not a view into a larger value), except of a value that
    repeats: that view stays as small as its core."""
    return o if repeats.repeated_axes(o) else o.copy()


def _ints_only(f):
    def g(v, p):
        if any(np.asarray(x).dtype.kind == "b" for x in v):
            return None  # XLA's arithmetic on booleans is not numpy's
        with np.errstate(all="ignore"):
            return [f(*v)]
    return g


def _select(v, p):
    pred, cases = v[0], v[1:]
    if pred.dtype.kind == "b":
        if len(cases) != 2:
            return None
        return [np.where(pred, cases[1], cases[0])]
    if pred.size and (pred.min() < 0 or pred.max() >= len(cases)):
        return None  # out of range: XLA's choice, not ours
    return [np.choose(pred.astype(np.intp), cases)]


def _slice(v, p):
    strides = p["strides"] or (1,) * v[0].ndim
    return [_owned(v[0][tuple(slice(a, b, s) for a, b, s in
                              zip(p["start_indices"], p["limit_indices"], strides))])]


def _clamp(v, p):
    lo, x, hi = v  # XLA: min(max(x, lo), hi), lo and hi scalars or x's shape
    return [np.minimum(np.maximum(x, lo), hi)]


def _rem(v, p):
    x, y = v  # XLA: truncated remainder (the dividend's sign), which is C's and np.fmod's
    if x.dtype.kind == "b" or np.any(y == 0) or (y.dtype.kind == "i" and np.any(y == -1)):
        return None  # x % 0 and INT_MIN % -1: XLA's definitions, not numpy's
    with np.errstate(all="ignore"):
        return [np.fmod(x, y)]


def _scatter(v, p):
    """Point scatter (`x.at[i, j, k].set(u)`): one update per full index, unique, in bounds."""
    operand, idx, upd = v
    dn = p["dimension_numbers"]
    nd = operand.ndim
    if (p["update_jaxpr"] is not None or dn.update_window_dims
            or tuple(dn.inserted_window_dims) != tuple(range(nd))
            or tuple(dn.scatter_dims_to_operand_dims) != tuple(range(nd))
            or dn.operand_batching_dims or dn.scatter_indices_batching_dims
            or idx.ndim < 1 or idx.shape[-1] != nd or upd.shape != idx.shape[:-1]):
        return None
    flat = idx.reshape(-1, nd).astype(np.int64)
    if np.any(flat < 0) or np.any(flat >= np.asarray(operand.shape)):
        return None  # out of bounds: the mode decides (clip, drop): left to XLA
    if len({tuple(r) for r in flat.tolist()}) != len(flat):
        return None  # repeated indices: which update wins is XLA's choice
    out = operand.copy()
    out[tuple(flat.T)] = upd.reshape(-1)
    return [out]


def _convert(v, p):
    if p["weak_type"] not in (True, False):
        return None
    return [v[0].astype(p["new_dtype"])]  # int/bool -> int/bool: wraps, or != 0 for bool


NUMPY_EXACT: dict[str, tuple[frozenset, Callable]] = {
    "broadcast_in_dim": (frozenset({"shape", "broadcast_dimensions", "sharding"}), _bcast),
    "iota": (frozenset({"dtype", "shape", "dimension", "sharding"}), _iota),
    "reshape": (frozenset({"new_sizes", "dimensions", "sharding"}),
                lambda v, p: ([repeats.reshape(v[0], p["new_sizes"])] if p["dimensions"] is None
                              else None)),
    "squeeze": (frozenset({"dimensions"}),
                lambda v, p: [np.squeeze(v[0], tuple(p["dimensions"]))]),
    "transpose": (frozenset({"permutation"}),
                  lambda v, p: [_owned(np.transpose(v[0], p["permutation"]))]),
    "concatenate": (frozenset({"dimension"}),
                    lambda v, p: [repeats.concatenate(v, p["dimension"])]),
    "slice": (frozenset({"start_indices", "limit_indices", "strides"}), _slice),
    "rev": (frozenset({"dimensions"}),
            lambda v, p: [_owned(np.flip(v[0], tuple(p["dimensions"])))]),
    "convert_element_type": (frozenset({"new_dtype", "weak_type", "sharding"}), _convert),
    "select_n": (frozenset(), _select),
    "eq": (frozenset(), lambda v, p: [np.equal(*v)]),
    "ne": (frozenset(), lambda v, p: [np.not_equal(*v)]),
    "lt": (frozenset(), lambda v, p: [np.less(*v)]),
    "le": (frozenset(), lambda v, p: [np.less_equal(*v)]),
    "gt": (frozenset(), lambda v, p: [np.greater(*v)]),
    "ge": (frozenset(), lambda v, p: [np.greater_equal(*v)]),
    "and": (frozenset(), lambda v, p: [np.bitwise_and(*v)]),
    "or": (frozenset(), lambda v, p: [np.bitwise_or(*v)]),
    "xor": (frozenset(), lambda v, p: [np.bitwise_xor(*v)]),
    "not": (frozenset(), lambda v, p: [np.invert(v[0])]),
    "max": (frozenset(), lambda v, p: [np.maximum(*v)]),
    "min": (frozenset(), lambda v, p: [np.minimum(*v)]),
    "add": (frozenset(), _ints_only(np.add)),
    "sub": (frozenset(), _ints_only(np.subtract)),
    "mul": (frozenset({"out_dtype"}), _ints_only(np.multiply)),
    "neg": (frozenset(), _ints_only(np.negative)),
    "sign": (frozenset(), _ints_only(np.sign)),
    "clamp": (frozenset(), _clamp),
    "rem": (frozenset(), _rem),
    "stop_gradient": (frozenset(), lambda v, p: [v[0]]),
    "scatter": (frozenset({"update_jaxpr", "update_consts", "dimension_numbers",
                           "indices_are_sorted", "unique_indices", "mode"}), _scatter),
}

# rows that map element i of their operands to element i of their result: on values that repeat
# along an axis (`analysis/repeats.py`) they run on one copy
ELEMENTWISE = frozenset(NUMPY_EXACT) - {"broadcast_in_dim", "iota", "reshape", "squeeze",
                                        "transpose", "concatenate", "slice", "rev", "scatter"}

# operands that must share one dtype for the numpy row to apply (default: all of them)
_SAME_DTYPE = {"select_n": lambda v: v[1:], "scatter": lambda v: (v[0], v[2])}


def _numpy_eval(eqn, vals) -> list | None:
    """`eqn` on `vals` in numpy when that is bit-exact (see NUMPY_EXACT), else None."""
    row = NUMPY_EXACT.get(eqn.primitive.name)
    if row is None:
        return None
    allowed, fn = row
    p = eqn.params
    if any(k not in allowed for k in p) or not C.replicated(p.get("sharding")) \
            or p.get("out_dtype") is not None:
        return None
    vals = [np.asarray(v) for v in vals]
    same = _SAME_DTYPE.get(eqn.primitive.name, lambda v: v)(vals)
    if len({v.dtype for v in same}) > 1:
        return None  # mixed operand dtypes: leave the promotion question to XLA
    try:
        if eqn.primitive.name in ELEMENTWISE and len(eqn.outvars) == 1:
            outs = repeats.elementwise(lambda vs: fn(vs, p), vals, eqn.outvars[0].aval.shape)
        else:
            outs = fn(vals, p)
    except Exception:  # noqa: BLE001 - anything unexpected: XLA decides
        return None
    if outs is None:
        return None
    res = []
    for o, v in zip(outs, eqn.outvars):
        o = np.asarray(o)
        if o.shape != tuple(v.aval.shape) or o.dtype != v.aval.dtype:
            return None
        res.append(o)
    return res


# primitive -> positions of its index operands (the gathers pass needs them as literals)
INDEX_OPERANDS = {
    "gather": lambda n: [1], "scatter": lambda n: [1], "scatter-add": lambda n: [1],
    "scatter_add": lambda n: [1], "scatter-mul": lambda n: [1], "scatter_mul": lambda n: [1],
    "scatter-min": lambda n: [1], "scatter_min": lambda n: [1], "scatter-max": lambda n: [1],
    "scatter_max": lambda n: [1], "dynamic_slice": lambda n: range(1, n),
    "dynamic_update_slice": lambda n: range(2, n),
}


def _index_operands(jaxpr) -> set:
    out = set()
    for e in jaxpr.eqns:
        pos = INDEX_OPERANDS.get(e.primitive.name)
        if pos is not None:
            out.update(e.invars[i] for i in pos(len(e.invars)) if not C.is_literal(e.invars[i]))
    return out


def _is_splat(eqn, val: np.ndarray) -> bool:
    if val.size <= SPLAT_KEEP_SIZE:
        return False
    if eqn.primitive.name == "iota":
        return True
    return repeats.uniform(val)


def run(cj: C.ClosedJaxpr, ctx) -> tuple[C.ClosedJaxpr, bool]:
    """Fold integer/boolean arithmetic over literals at every level; specialise calls."""
    out, changed = _Folder(ctx).jaxpr(cj)
    return out, changed
