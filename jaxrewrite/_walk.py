"""Walk every nested jaxpr, rewrite equations, rebuild.

Three tools every pass uses:

* `map_jaxprs(cj, fn)`: apply `fn(ClosedJaxpr) -> ClosedJaxpr` to every jaxpr, innermost
  first, through the params of every equation (jit, cond branches, while cond/body, scan,
  remat, custom_jvp/vjp primal bodies, closed_call, shard_map, and any unknown primitive that
  carries jaxprs). A jaxpr object shared by several equations is rewritten once and stays shared,
  which is what lets JAX lower a shared inner function once.
* `rewrite_eqns(jaxpr, rule)`: at one level, replace equations by what `rule` returns,
  substituting variables downstream.
* `Emitter`: build replacement equations by tracing a small JAX function on the operands'
  avals; the new equations carry the source info of the equation they replace.
"""
from __future__ import annotations

import dataclasses
import functools
import weakref
from typing import Callable, Sequence

import numpy as np

from . import _compat as C
from .report.records import call_site

# Parameters that are jaxprs but must not be rewritten: JAX keeps them as they are.
# (custom_jvp's `jvp_jaxpr_fun` and custom_vjp's `fwd_jaxpr_thunk`/`bwd` are thunks, not jaxprs.)
_OPAQUE_PRIMITIVES = frozenset({"pallas_call", "custom_lin"})


def as_closed(j) -> C.ClosedJaxpr:
    return j if isinstance(j, C.ClosedJaxpr) else C.closed(j, ())


def like(orig, new: C.ClosedJaxpr):
    """`new` in the form of `orig`: a ClosedJaxpr, or an open Jaxpr (which never gains consts)."""
    if isinstance(orig, C.ClosedJaxpr):
        return new
    assert not new.consts, "an open jaxpr cannot gain constants"
    return new.jaxpr


def map_jaxprs(cj: C.ClosedJaxpr, fn: Callable[..., C.ClosedJaxpr],
               memo: dict | None = None, *, nested_only: bool = False,
               owner: bool = False) -> C.ClosedJaxpr:
    """Apply `fn` bottom-up to `cj` and every jaxpr nested in it; shared objects stay shared.

    With `nested_only`, `cj` itself (rebuilt around its rewritten nested jaxprs) is not passed
    to `fn`. With `owner`, `fn(cj, name)` also gets the name of the primitive whose params hold
    that jaxpr (`"scan"` for a scan's body; None for `cj` itself).
    """
    memo = {} if memo is None else memo
    return _map(cj, fn, memo, not nested_only, (None,) if owner else ())


def map_levels(cj: C.ClosedJaxpr, fn: Callable[[C.Jaxpr], tuple[C.Jaxpr, int]]
               ) -> tuple[C.ClosedJaxpr, int]:
    """`map_jaxprs` for a per-level rewrite `fn(jaxpr) -> (jaxpr, rewrites made)`.

    Returns the new program and the total number of rewrites; a level with none is kept as is.
    """
    total = [0]

    def level(c: C.ClosedJaxpr) -> C.ClosedJaxpr:
        new, n = fn(c.jaxpr)
        if not n:
            return c
        total[0] += n
        return C.closed(new, c.consts)

    return map_jaxprs(cj, level), total[0]


def _map(j, fn, memo, apply=True, owner=()):
    # `owner`: () where `fn` takes the jaxpr alone, else (name of the primitive holding it,)
    key = (id(j), *owner)
    hit = memo.get(key)
    if hit is not None and hit[0] is j and apply:
        return hit[1]
    cj = as_closed(j)
    eqns = None
    for i, subs in nested_eqns(cj.jaxpr):  # most equations hold no jaxpr: not visited
        eqn = cj.jaxpr.eqns[i]
        # JAX cuts tracebacks at jit boundaries: equations inside a library's jit (`jnp.take`'s
        # `_take`) have no user frame, so the report falls back to the call site's line.
        with call_site(eqn):
            new_eqn = map_eqn_subjaxprs(
                eqn, lambda sub: _map(sub, fn, memo, True, owner and (eqn.primitive.name,)),
                subs)
        if new_eqn is not eqn:
            if eqns is None:
                eqns = list(cj.jaxpr.eqns)
            eqns[i] = new_eqn
    if eqns is not None:
        cj = C.closed(C.replace_jaxpr(cj.jaxpr, eqns=eqns), cj.consts)
    if not apply:
        return like(j, cj)
    out = like(j, fn(cj, *owner))
    memo[key] = (j, out)  # keep `j` alive so its id is not reused during the walk
    return out


# id(jaxpr) -> (weak reference, facts). Jaxprs are immutable and every pass walks every level:
# what a walk learns of a level once (which equations hold jaxprs, and which; that it has no
# dead code) is kept while the object lives. At 10k equations this is a third of the walking.
_FACTS: dict[int, tuple] = {}


def facts(jaxpr: C.Jaxpr) -> dict:
    """A dict of cached facts about one jaxpr object (open `Jaxpr`), alive as long as it is."""
    key = id(jaxpr)
    hit = _FACTS.get(key)
    if hit is not None and hit[0]() is jaxpr:
        return hit[1]
    d: dict = {}
    _FACTS[key] = (weakref.ref(jaxpr, lambda _, key=key: _FACTS.pop(key, None)), d)
    return d


def nested_eqns(jaxpr: C.Jaxpr) -> tuple:
    """(position, ((param name, index, jaxpr), ...)) for the equations of `jaxpr` (one level)
    whose params hold jaxprs; most equations hold none and are never looked at again."""
    f = facts(jaxpr)
    hit = f.get("nested")
    if hit is None:
        hit = f["nested"] = tuple((i, tuple(C.params_jaxprs(e.params)))
                                  for i, e in enumerate(jaxpr.eqns) if has_subjaxprs(e))
    return hit


# lax primitives whose params never hold a jaxpr: most equations of a model, looked at by every
# walk of every new level object (a training step: ~70k looks per rewrite)
_FLAT_PRIMITIVES = frozenset("""
    abs add and atan2 broadcast_in_dim ceil clamp concatenate convert_element_type cos cosh
    cumsum cumprod cummax cummin div dot_general dynamic_slice dynamic_update_slice eq erf
    erf_inv exp exp2 expm1 floor ge gt imag integer_pow iota is_finite le log
    log1p logistic lt max min mul ne neg not or pad pow real reduce_and reduce_max reduce_min
    reduce_or reduce_prod reduce_sum rem reshape rev round rsqrt select_n shift_left
    shift_right_arithmetic shift_right_logical sign sin sinh slice sqrt square squeeze stop_gradient
    sub tan tanh transpose xor argmax argmin copy
""".split())


def has_subjaxprs(eqn) -> bool:
    """Whether `eqn` may hold jaxprs in its params (a cheap test, before `params_jaxprs`)."""
    if eqn.primitive.name in _FLAT_PRIMITIVES:
        return False
    for v in eqn.params.values():
        if isinstance(v, C.JAXPR_TYPES) or (isinstance(v, tuple) and v
                                           and isinstance(v[0], C.JAXPR_TYPES)):
            return True
    return False


def map_eqn_subjaxprs(eqn, fn: Callable, subs=None):
    """`eqn` with each jaxpr in its params replaced by `fn(jaxpr)` (same object: no change).
    `subs`: `C.params_jaxprs(eqn.params)`, where the caller already has it."""
    if eqn.primitive.name in _OPAQUE_PRIMITIVES:
        return eqn
    new = {}
    for name, i, sub in (C.params_jaxprs(eqn.params) if subs is None else subs):
        out = fn(sub)
        if out is not sub:
            new[(name, i)] = out
    if not new:
        return eqn
    params = C.replace_params_jaxprs(eqn.params, new)
    return eqn.replace(params=params)


def iter_jaxprs(cj, seen: set | None = None):
    """Every distinct jaxpr object reachable from `cj` (itself included), outermost first."""
    seen = set() if seen is None else seen
    if id(cj) in seen:
        return
    seen.add(id(cj))
    yield cj
    jaxpr = cj.jaxpr if isinstance(cj, C.ClosedJaxpr) else cj
    for _, subs in nested_eqns(jaxpr):
        for _, _, sub in subs:
            yield from iter_jaxprs(sub, seen)


def iter_eqns(cj):
    """Every equation at every level (each distinct jaxpr object once)."""
    for j in iter_jaxprs(cj):
        yield from (j.jaxpr if isinstance(j, C.ClosedJaxpr) else j).eqns


def binding_error(cj, before=None) -> str | None:
    """Where a level of `cj` reads a variable it does not bind, or binds one twice (a rewrite
    that dropped or duplicated an equation), said for a warning; None where there is none.
    Levels that are `before`'s own objects are not looked at (JAX traced them). Order is not
    checked (emitting the program into a trace would raise on it). Set operations only:
    0.5-3% of the rewrite's time on the bench programs, where `check_jaxpr`, which runs every
    equation's typing rule, took 1.2-2.1x it."""
    Var = C.Var
    old_levels = {id(j) for j in iter_jaxprs(before)} if before is not None else set()
    for j in iter_jaxprs(cj):
        if id(j) in old_levels:
            continue
        jaxpr = j.jaxpr if isinstance(j, C.ClosedJaxpr) else j
        eqns = jaxpr.eqns
        binds = [*jaxpr.constvars, *jaxpr.invars,
                 *(v for e in eqns for v in e.outvars if v.__class__ is Var)]
        bound = set(binds)
        if len(bound) != len(binds):
            return "a variable is bound twice"
        reads = {a for e in eqns for a in e.invars if a.__class__ is Var}
        reads.update(a for a in jaxpr.outvars if a.__class__ is Var)
        if not reads <= bound:
            return f"{len(reads - bound)} variable(s) read but never bound"
    return None


def typing_error(after, before, only: frozenset | None = None) -> str | None:
    """Why an equation of `after` that is not one of `before`'s (a rewrite made it) is ill
    typed, or None: its primitive's typing rule against its result types, as `check_jaxpr`
    checks it, on the new equations alone (levels and equations kept from `before` were typed
    by JAX when it traced them); `only`: the primitives to check (None: all)."""
    old_levels = {id(j) for j in iter_jaxprs(before)}
    old_eqns = None     # made at the first candidate (a program with no new loop needs none)
    for j in iter_jaxprs(after):
        if id(j) in old_levels:
            continue
        for e in (j.jaxpr if isinstance(j, C.ClosedJaxpr) else j).eqns:
            if only is not None and e.primitive.name not in only:
                continue
            if old_eqns is None:
                old_eqns = {id(x) for x in iter_eqns(before)
                            if only is None or x.primitive.name in only}
            if id(e) not in old_eqns:
                why = C.eqn_typing_error(e)
                if why is not None:
                    return why
    return None


def uses(eqns, outvars) -> dict:
    """Each value -> the positions of the equations that read it, in order (`len(eqns)` for
    the level's outputs)."""
    out: dict = {}
    for i, e in enumerate(eqns):
        for a in e.invars:
            if not C.is_literal(a):
                out.setdefault(a, []).append(i)
    for a in outvars:
        if not C.is_literal(a):
            out.setdefault(a, []).append(len(eqns))
    return out


def count_eqns(cj) -> int:
    return sum(len((j.jaxpr if isinstance(j, C.ClosedJaxpr) else j).eqns)
               for j in iter_jaxprs(cj))


# --- one level: rule-driven rewriting ----------------------------------------------------------

@dataclasses.dataclass
class Replacement:
    """What replaces one equation: new equations, then each old outvar's new atom."""
    eqns: list
    outs: list


def substitute(atom, env: dict):
    if C.is_literal(atom):
        return atom
    return env.get(atom, atom)


def rename_operands(eqn, env: dict):
    """`eqn` with its operands found in `env` replaced; the same object when none is."""
    if env:
        Lit = C.Literal   # (a loop, not any(...): every pass renames every equation after a change)
        for a in eqn.invars:
            if not isinstance(a, Lit) and a in env:
                return eqn.replace(invars=[substitute(a, env) for a in eqn.invars])
    return eqn


def rewrite_eqns(jaxpr: C.Jaxpr, rule: Callable) -> tuple[C.Jaxpr, bool]:
    """Replace each equation for which `rule(eqn)` returns a Replacement; substitute downstream.

    `rule` sees equations whose operands are already substituted.
    """
    env: dict = {}
    eqns = []
    changed = False
    for eqn in jaxpr.eqns:
        eqn = rename_operands(eqn, env)
        rep = rule(eqn)
        if rep is None:
            eqns.append(eqn)
            continue
        changed = True
        eqns.extend(rep.eqns)
        for old, new in zip(eqn.outvars, rep.outs):
            if not C.is_dropvar(old):
                env[old] = new
    if not changed and not env:
        return jaxpr, False
    outvars = [substitute(a, env) for a in jaxpr.outvars]
    return C.replace_jaxpr(jaxpr, eqns=eqns, outvars=outvars), True


def forward(eqn, atoms) -> Replacement:
    """Replace `eqn` by no equation at all: its outputs are `atoms` (renaming)."""
    return Replacement([], list(atoms))


class Emitter:
    """Builds replacement equations for `eqn` by tracing small JAX functions.

        em = Emitter(eqn)
        y, = em.call(lambda x: lax.rev(x, (0,)), x_atom)
        return em.replacement([y])

    Numpy constants that the traced function creates become literals, so nested (open) jaxprs
    never gain constvars. New equations carry `eqn`'s source info and context.
    """

    def __init__(self, eqn):
        self.eqn = eqn
        self.eqns: list = []

    def call(self, fun: Callable, *atoms) -> list:
        cj = C.trace_avals(lambda *xs: _as_list(fun(*xs)), [C.aval_of(a) for a in atoms],
                           self.eqn.ctx)  # the ctx: manual axes inside shard_map bodies
        return self.inline(cj, atoms)

    def call_shared(self, fun: Callable, *atoms, static: tuple = ()) -> list:
        """`call` of a module-level `fun(*atoms, *static)` that is emitted many times: traced
        once per operand types and `static` (hashable) arguments, not once per use (a rolled
        gradient's row reads: k x leaves of them). Operands varying over manual axes trace
        under this equation's context, as in `call`."""
        avals = tuple(C.aval_of(a) for a in atoms)
        try:
            hash(static)
        except TypeError:  # an unhashable static argument: traced for this use alone
            return self.call(lambda *xs: fun(*xs, *static), *atoms)
        if any(C.is_varying(a) for a in avals):
            return self.call(lambda *xs: fun(*xs, *static), *atoms)
        return self.inline(_traced(fun, avals, tuple(static)), atoms)

    def inline(self, cj: C.ClosedJaxpr, atoms: Sequence) -> list:
        env = {}
        for v, c in zip(cj.jaxpr.constvars, cj.consts):
            if C.is_tracer(c):
                raise ValueError("a traced replacement closed over a tracer")
            env[v] = C.literal(np.asarray(c), v.aval)
        env.update(zip(cj.jaxpr.invars, atoms))
        for e in cj.jaxpr.eqns:
            outvars = [C.new_var(v.aval) if not C.is_dropvar(v) else v for v in e.outvars]
            new = C.new_eqn([substitute(a, env) for a in e.invars], outvars, e.primitive, e.params,
                            e.effects, self.eqn.source_info, self.eqn.ctx)
            env.update(zip(e.outvars, outvars))
            self.eqns.append(new)
        return [substitute(a, env) for a in cj.jaxpr.outvars]

    def bind(self, primitive, *atoms, **params) -> list:
        out_avals = C.abstract_eval(primitive, [C.aval_of(a) for a in atoms], **params)
        outvars = [C.new_var(a) for a in out_avals]
        self.eqns.append(C.new_eqn(list(atoms), outvars, primitive, params, None,
                                   self.eqn.source_info, self.eqn.ctx))
        return outvars

    def replacement(self, outs: Sequence) -> Replacement:
        return Replacement(self.eqns, list(outs))


def _as_list(x):
    return list(x) if isinstance(x, (list, tuple)) else [x]


@functools.lru_cache(maxsize=512)
def _traced(fun: Callable, avals: tuple, static: tuple) -> C.ClosedJaxpr:
    return C.trace_avals(lambda *xs: _as_list(fun(*xs, *static)), avals)


C.register_cache(_traced, "jaxrewrite: Emitter.call_shared traces")


# --- inlining -----------------------------------------------------------------------------------

def plain_call(eqn) -> bool:
    """A `jit` equation that inlining cannot change: no shardings, layouts, donation, effects,
    compiler options, and constants known at rewrite time (they become literals)."""
    p = eqn.params
    u = C.unspecified_sharding()
    return (C.is_jit(eqn) and not eqn.effects and not any(p.get("donated_invars", ()))
            and all(s is u or s is None
                    for s in tuple(p.get("in_shardings", ())) + tuple(p.get("out_shardings", ())))
            and all(lay is None for lay in tuple(p.get("in_layouts", ()))
                    + tuple(p.get("out_layouts", ())))
            and not p.get("compiler_options_kvs")
            and all(C.is_foldable_const(c) for c in p["jaxpr"].consts))


def inline_body(body: C.ClosedJaxpr, args, out: list) -> list:
    """Append `body`'s equations, renamed, to `out` (source infos kept); its results' atoms."""
    env = dict(zip(body.jaxpr.invars, args))
    env.update({v: C.literal(np.asarray(c), v.aval)
                for v, c in zip(body.jaxpr.constvars, body.consts)})
    for e in body.jaxpr.eqns:
        outs = [v if C.is_dropvar(v) else C.new_var(v.aval) for v in e.outvars]
        out.append(e.replace(invars=[substitute(a, env) for a in e.invars], outvars=outs))
        env.update(zip(e.outvars, outs))
    return [substitute(a, env) for a in body.jaxpr.outvars]


def inline_calls(jaxpr: C.Jaxpr, should_inline: Callable, candidates=None) -> C.Jaxpr:
    """`jaxpr` with every `jit` equation for which `should_inline(eqn)` holds replaced by its
    body (fresh variables; the body's constants, which the predicate guarantees are known,
    become literals). `candidates`: the positions worth asking about (default: every call).

        before:  c = jit[jaxpr={ lambda ; a. let b = sin a in (b,) }] x
        after:   c' = sin x                (uses of c read c')
    """
    if candidates is None:
        candidates = {i for i, _ in nested_eqns(jaxpr)}
    if not candidates:
        return jaxpr
    eqns, env, changed = [], {}, False
    for i, eqn in enumerate(jaxpr.eqns):
        eqn = rename_operands(eqn, env)
        if i not in candidates or not C.is_jit(eqn) or not should_inline(eqn):
            eqns.append(eqn)
            continue
        env.update(zip(eqn.outvars, inline_body(eqn.params["jaxpr"], eqn.invars, eqns)))
        changed = True
    if not changed:
        return jaxpr
    return C.replace_jaxpr(jaxpr, eqns=eqns, outvars=[substitute(a, env) for a in jaxpr.outvars])


# --- dead code ---------------------------------------------------------------------------------

def dce(jaxpr: C.Jaxpr) -> tuple[C.Jaxpr, bool]:
    """Drop equations at this level whose outputs are unused and that have no effects.

    Invars are kept (the signature is the caller's); nested jaxprs are not pruned here.
    """
    f = facts(jaxpr)
    if f.get("no_dead_code"):
        return jaxpr, False
    Lit = C.Literal   # (isinstance inline: this loop sees every equation; a DropVar is
    live = {v for v in jaxpr.outvars if not isinstance(v, Lit)}   # never in `live`)
    add = live.add
    kept = []
    for eqn in reversed(jaxpr.eqns):
        outs = eqn.outvars
        if eqn.effects or (outs[0] in live if len(outs) == 1 else any(v in live for v in outs)):
            kept.append(eqn)
            for a in eqn.invars:
                if not isinstance(a, Lit):
                    add(a)
    if len(kept) == len(jaxpr.eqns):
        f["no_dead_code"] = True
        return jaxpr, False
    kept.reverse()
    out = C.replace_jaxpr(jaxpr, eqns=kept)
    facts(out)["no_dead_code"] = True
    return out, True


def dce_closed(cj: C.ClosedJaxpr) -> C.ClosedJaxpr:
    """DCE at every level (nested signatures unchanged); unused constvars are dropped."""
    def level(c):
        j, changed = dce(c.jaxpr)
        if not changed:
            return c
        if not j.constvars:
            return C.closed(j, c.consts)
        used = {a for e in j.eqns for a in e.invars if not C.is_literal(a)}
        used |= {a for a in j.outvars if not C.is_literal(a)}
        keep = [i for i, v in enumerate(j.constvars) if v in used]
        if len(keep) != len(j.constvars):
            j = C.replace_jaxpr(j, constvars=[j.constvars[i] for i in keep])
            return C.closed(j, [c.consts[i] for i in keep])
        return C.closed(j, c.consts)
    return map_jaxprs(cj, level)


# --- constants ---------------------------------------------------------------------------------

def literalize_consts(cj: C.ClosedJaxpr, max_size: int) -> C.ClosedJaxpr:
    """Turn known (non-tracer) constants of at most `max_size` elements into literals.

    JAX hoists numpy constants to the outermost jaxpr's constvars; as literals, every pass sees
    static values the same way at every level. Tracers of an enclosing trace stay constvars.
    """
    j = cj.jaxpr
    env, keep_v, keep_c = {}, [], []
    for v, c in zip(j.constvars, cj.consts):
        if C.is_foldable_const(c) and np.size(c) <= max_size:
            env[v] = C.literal(np.asarray(c), v.aval)
        else:
            keep_v.append(v)
            keep_c.append(c)
    if not env:
        return cj
    eqns = [rename_operands(e, env) for e in j.eqns]
    outvars = [substitute(a, env) for a in j.outvars]
    return C.closed(C.replace_jaxpr(j, constvars=keep_v, eqns=eqns, outvars=outvars), keep_c)
