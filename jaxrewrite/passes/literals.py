"""Large literals that repeat along an axis are emitted as the broadcasts they are (run last).

fold makes index operands literals (the gathers pass reads them), and the pipeline makes
closed-over constants literals. Under `vmap` such a value is one small table repeated along the
batch axis. Where no rewrite consumed it, it would reach XLA as a constant of the whole batch's
size, which XLA compiles in and the executable holds: Jumanji's RubiksCube step at 65,536 cubes
carried 33 tables of 65,536 x 12 x 3 and compiled in 5.3 s against 0.44 s for `jax.jit`, which
computes them with broadcasts. (The gathers pass now reads one row of such a table where the
batch can be a window dim, `gathers._unbatched`; this pass emits what is left.)

    before:  g = gather x T                      T: i32[65536,4,1], every row the same
    after:   t = broadcast_in_dim[shape=(65536, 4, 1), broadcast_dimensions=(1, 2)] T0
             g = gather x t                      T0: i32[4,1]
"""
from __future__ import annotations

import numpy as np

from .. import _compat as C
from .. import _walk
from ..analysis import repeats

PASS = "literals"
# Below this many elements a literal is left as it is: its bytes cost XLA nothing to speak of.
MIN_ELEMENTS = 1024


def compact(atom) -> tuple[C.Literal, tuple[int, ...]] | None:
    """(the literal's core, the axes it keeps) where `atom` is a large literal repeated along
    some axis, else None."""
    if not C.is_literal(atom):
        return None
    aval = C.aval_of(atom)
    v = np.asarray(C.literal_value(atom))
    if v.ndim == 0 or v.size < MIN_ELEMENTS or v.dtype != aval.dtype or C.is_varying(aval) \
            or not C.replicated(getattr(aval, "sharding", None)):
        return None
    rep = repeats.equal_axes(v)
    if not rep:
        return None
    keep = tuple(d for d in range(v.ndim) if d not in rep)
    core = repeats.row(v, rep)
    core_aval = aval.update(shape=core.shape)
    return C.literal(core[()] if core.ndim == 0 else core, core_aval), keep


def _level(cj: C.ClosedJaxpr, report) -> C.ClosedJaxpr:
    j = cj.jaxpr
    made: dict = {}     # id(literal) -> the var its broadcast defines (a literal used twice)
    eqns, changed = [], False

    def atom(a, src):
        nonlocal changed
        if not C.is_literal(a):
            return a
        hit = made.get(id(a))
        if hit is not None:
            return hit[1]
        c = compact(a)
        if c is None:
            return a
        core, keep = c
        out = C.new_var(C.aval_of(a))
        eqns.append(C.new_eqn([core], [out], C.lax_primitive("broadcast_in_dim"),
                              {"shape": tuple(C.aval_of(a).shape), "broadcast_dimensions": keep,
                               "sharding": None},
                              None, getattr(src, "source_info", None), getattr(src, "ctx", None)))
        made[id(a)] = (a, out)      # (the literal kept alive: its id stays its own)
        changed = True
        report.count(f"{PASS}.compacted")
        return out

    for eqn in j.eqns:
        invars = [atom(a, eqn) for a in eqn.invars]
        eqns.append(eqn if all(a is b for a, b in zip(invars, eqn.invars))
                    else eqn.replace(invars=invars))
    outvars = [atom(a, None) for a in j.outvars]
    if not changed:
        return cj
    return C.closed(C.replace_jaxpr(j, eqns=eqns, outvars=outvars), cj.consts)


def run(cj: C.ClosedJaxpr, ctx) -> tuple[C.ClosedJaxpr, bool]:
    out = _walk.map_jaxprs(cj, lambda c: _level(c, ctx.report))
    return (out, True) if out is not cj else (cj, False)
