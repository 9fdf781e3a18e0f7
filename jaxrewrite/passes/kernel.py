"""One Pallas TPU kernel for a region of integer work on split pieces (TPU first).

flatten and scalarize leave a vmapped rounds program as separate words, pieces of N elements
(`u32[N]`); XLA:TPU still runs them as dozens of fusions that each read and write their words
through HBM (ChaCha20 over 1,048,576 blocks: 36-79 launches). Here such a region becomes one
`pallas_call`: each piece laid out as (N/128, 128) words, one grid step per (R, 128) tile of
every piece, the region's own equations evaluated on the loaded tiles, its loops inside:

    before:  w0..w15:u32[N] = pieces of x
             _, s0..s15 = scan[length=10]{ (i, c0..c15) -> (i + 1, rounds(c0..c15)) } 0 w0..w15
             y0 = add s0 w0 ; ... ; y15 = add s15 w15
             y = join(y0..y15)
    after:   t0..t15:u32[N/128,128] = reshape w0..w15           (a bitcast: N % 1,024 == 0)
             o0..o15 = pallas_call[grid=(ceil(N/128/R),), blocks (R, 128) of every operand]{
                 c = the tiles of t0..t15 ; s = fori_loop(0, 10, rounds, (0, c)) ; out s + c }
             y0..y15 = reshape o0..o15 ; y = join(y0..y15)

On the TPU (`kernel_in_place`), an array at least half of whose elements the region reads
as pieces (`_whole`), and an array into which a `stack` re-joins the region's outputs, are
taken whole, as the view in which XLA:TPU already keeps them (`backend/tpu_layout.py`); each
piece is read or written as sublane-strided rows of it, and XLA moves nothing before or after
the kernel:

    before:  (as above, with x: u32[N, 4, 4] and y = reshape[(N, 4, 4)](stack[1](y0..y15)))
    after:   v = view(x) : u32[4, 4 * N/128, 128]                  (a bitcast on the TPU)
             o = pallas_call[grid=(N/128/R,), blocks (4, 4R, 128)]{
                 word (r, c) = rows c, c + 4, ... of slab r of v's block ; ... ;
                 each result written to the same rows of o's block }
             y = unview(o)                                          (a bitcast)

The region, found at the program's top level and in the bodies of `jit` calls made there
(one batch size N per region, in program order; an equation that depends on the region and
feeds it cuts it), holds:
- equations of `backend.mosaic.KERNEL_PRIMITIVES` on 32-bit integer or boolean pieces of N
  elements and on scalars (literals stay literals in the body; other scalars are SMEM
  operands), a scalar broadcast to a piece, an iota along a piece (made from the grid step);
- `scan` loops without xs and `while` loops whose condition reads scalars only, carrying
  pieces and scalars, whose bodies hold only such equations (and calls of them); a scalar
  result of a loop must be unused after it (the kernel returns pieces); a 64-bit trip counter
  (`fori_loop`'s under `jax_enable_x64`) is carried as int32 where it fits (`narrow_counters`);
- `jit`, `custom_jvp_call` and `custom_vjp_call` calls of such bodies (evaluated as the body),
  and what real code leaves around them: `copy` (`jnp.array(x)`, `x.copy()`) and conversions
  to the dtype a value has are the value (`backend.mosaic.IDENTITIES`).
An elementwise operation of the region's re-joined pieces and of an array whose pieces are at
hand (a rounds function's feed-forward, `state + input`) is first done on the pieces, so the
region takes it (`_epilogues`).
Each region equation computes element i of its pieces from element i of its operands, so a
tile of every piece is computed on its own. Bit for bit jax.jit's: the same primitives on the
same words (each row of the table is one Mosaic op that computes XLA's result), loops as
`fori_loop`/`while_loop` of the same bodies; a shift whose amount is not a literal below 32 is
computed as XLA defines it (`_shift`).

Declined with the reason (the region stays XLA's): floats (Mosaic would round them as it
does), 64-bit and narrow integers, primitives outside the table, pieces that are not a whole
number of (8, 128) tiles (not padded), effects at the level, a program over several devices,
and `backend.cost.kernel_decision` (`kernel="auto"`: on the TPU, pieces of at least
`kernel_min_elements` and a loop or `kernel_min_eqns` equations).

On the TPU flatten keeps a counted loop rolled with its carry split (the TPU's loop row:
`backend.cost.LOOP_COSTS`; where this pass will take it, `loop_reason`, whatever that row's
thresholds say), and `rounds` rolls a Python loop of rounds into one, so the loop runs inside
the kernel; a straight-line region goes into the kernel as it is.
"""
from __future__ import annotations

import collections
import dataclasses
import math

import jax.numpy as jnp
import numpy as np
from jax import lax

from .. import _compat as C
from .. import _walk
from ..analysis import views
from ..backend import cost as _cost
from ..backend import mosaic, tpu_layout
from . import movement

NAME = "kernel"
_LOOPS = frozenset({"scan", "while"})
_CALLS = frozenset({"jit", "pjit"})     # calls whose bodies are levels of their own
# Calls a kernel body evaluates as their body: the param that holds it. (Custom derivative
# rules are about tangents, and the integer pieces a kernel holds have none.)
_BODIES = {"jit": "jaxpr", "pjit": "jaxpr", "closed_call": "call_jaxpr",
           "custom_jvp_call": "call_jaxpr", "custom_vjp_call": "call_jaxpr"}
# Data movement at a region's edges (the split and the re-join of the user's arrays): XLA's,
# and not worth a decline each.
_EDGES = frozenset({"slice", "squeeze", "reshape", "stack", "unstack", "concatenate",
                    "transpose", "broadcast_in_dim", "gather", "dynamic_slice", "pad", "rev",
                    "iota", "expand_dims", "copy", "copy_p", "split", "dynamic_update_slice",
                    "scatter", "random_unwrap", "random_wrap"})
_MAX_KERNELS = 16        # kernels emitted per level (each a walk of the level after it)


def _shape(atom) -> tuple:
    return tuple(getattr(C.aval_of(atom), "shape", ()))


def _dtype(atom):
    return C.aval_of(atom).dtype


def _piece_length(eqn) -> int | None:
    """The length of the first 1-D result of `eqn` (a piece it would compute), or None."""
    for v in eqn.outvars:
        s = _shape(v)
        if len(s) == 1:
            return s[0]
    return None


# --- what a kernel body may hold --------------------------------------------------------------

class _Unfit(Exception):
    """An equation that cannot be in a kernel body; the message is the reason."""


def _value(atom, n: int, what: str) -> None:
    """`atom` is a piece of `n` elements or a scalar, of a dtype tiles hold."""
    s = _shape(atom)
    if s not in ((), (n,)):
        raise _Unfit(f"{what} of shape {s} (neither a piece of {n} nor a scalar)")
    if C.is_literal(atom) and s:
        raise _Unfit(f"{what}: a literal of {s} (only scalar literals stay in the body)")
    why = mosaic.dtype_reason(_dtype(atom))
    if why is not None:
        raise _Unfit(why)


def _check_eqn(eqn, n: int) -> None:
    """Raise `_Unfit` where `eqn` cannot be evaluated on tiles of pieces of `n` elements."""
    name = eqn.primitive.name
    if eqn.effects:
        raise _Unfit(f"'{name}' has effects")
    if name in _LOOPS:
        _check_loop(eqn, n)
        return
    if name in _BODIES:
        if name in _CALLS and not _walk.plain_call(eqn):
            raise _Unfit("a jit call with shardings, layouts, donation or options")
        body = eqn.params[_BODIES[name]]
        if not isinstance(body, C.ClosedJaxpr):
            raise _Unfit(f"a '{name}' whose body is not a closed jaxpr")
        for a in (*eqn.invars, *eqn.outvars):
            _value(a, n, "a call's operand")
        _check_body(body, n)
        return
    for v in eqn.outvars:
        _value(v, n, f"'{name}' result")
    if name == "broadcast_in_dim":
        if _shape(eqn.invars[0]) != () or _shape(eqn.outvars[0]) != (n,):
            raise _Unfit("broadcast_in_dim of a non-scalar")
        _value(eqn.invars[0], n, "broadcast operand")
        return
    if name == "iota":
        p = eqn.params
        if (_shape(eqn.outvars[0]) != (n,) or np.dtype(p["dtype"]) not in mosaic.WORD_DTYPES
                or not C.replicated(p.get("sharding")) or n > np.iinfo(np.int32).max):
            raise _Unfit("an iota that is not a 32-bit count along a piece")
        return
    why = mosaic.primitive_reason(name, [_dtype(a) for a in eqn.invars])
    if why is not None:
        raise _Unfit(why)
    for a in eqn.invars:
        _value(a, n, f"'{name}' operand")
    if name == "select_n" and not mosaic.select_ok(len(eqn.invars) - 1, _dtype(eqn.invars[0])):
        raise _Unfit("select_n of more than two cases or on an integer predicate")
    if name == "convert_element_type" and not mosaic.convert_ok(_dtype(eqn.invars[0]),
                                                                _dtype(eqn.outvars[0])):
        raise _Unfit("convert_element_type outside 32-bit words and booleans")


def _check_body(cj, n: int, scalars_only: bool = False) -> None:
    """Every equation of a nested body (a loop's, a call's) fits; its constants are scalars
    (`scalars_only`: a loop condition, which must not read pieces)."""
    if any(np.ndim(c) for c in cj.consts):
        raise _Unfit("a body closing over a constant array")
    for e in cj.jaxpr.eqns:
        _check_eqn(e, n)
        if scalars_only and any(_shape(a) for a in (*e.invars, *e.outvars)):
            raise _Unfit("a loop condition that reads pieces (trips per element)")


def _check_loop(eqn, n: int, body=None) -> None:
    """A loop the kernel runs: carries and constants pieces or scalars (a constant its body
    never reads may be anything: lax.scan leaves hoisted literals as unused operands), no xs,
    a condition on scalars. `body`: a Jaxpr in place of the loop's own (flatten asks)."""
    p = eqn.params
    if eqn.primitive.name == "scan":
        nc, nk = p["num_consts"], p["num_carry"]
        if len(eqn.invars) > nc + nk:
            raise _Unfit("a scan over xs (per-trip slices are not done)")
        cj, counters = narrow_counters(eqn, p["jaxpr"] if body is None else C.closed(body, ()))
        read = _read_vars(cj.jaxpr)
        for k, (a, v) in enumerate(zip(eqn.invars, cj.jaxpr.invars)):
            if (k >= nc or v in read) and k not in counters:
                _value(a, n, "a loop's carry or constant")
        _check_body(cj, n)
        return
    for a in eqn.invars:
        _value(a, n, "a loop's carry or constant")
    _check_body(p["cond_jaxpr"], n, scalars_only=True)
    _check_body(p["body_jaxpr"] if body is None else C.closed(body, ()), n)


def narrow_counters(scan, body) -> tuple:
    """(`body` with its 64-bit trip counters made int32, their operand positions in `scan`).

    With `jax_enable_x64`, `fori_loop(0, 10, f, s)` counts its trips in an int64 carry, and
    Mosaic has no 64-bit integers. A counter is a scalar 64-bit carry that starts at a literal,
    steps by a literal add each trip, and is read only by that add and by conversions to 32-bit
    words; where every value it takes fits in int32, it is carried as int32 in the kernel (the
    same integers, so the same words after a conversion):

        before:  { i:i64[] s:u32[N]. j:i64[] = add i 1:i64[] ; w:u32[] = convert i ; ... }
        after:   { i:i32[] s:u32[N]. j:i32[] = add i 1:i32[] ; w:u32[] = convert i ; ... }
    """
    p = scan.params
    nc, nk = p["num_consts"], p["num_carry"]
    j = body.jaxpr
    found: dict = {}      # carry position in the body -> (its add equation's index, its result)
    for k in range(nc, nc + nk):
        v, init = j.invars[k], scan.invars[k]
        try:
            dt = np.dtype(_dtype(v))
        except TypeError:   # (an extended dtype: PRNG keys)
            continue
        if dt.kind not in "iu" or dt.itemsize != 8 or _shape(v) != () or not C.is_literal(init):
            continue
        out = j.outvars[k - nc]
        step = next(((i, e) for i, e in enumerate(j.eqns) if e.primitive.name == "add"
                     and out in e.outvars and v in e.invars), None)
        if step is None:
            continue
        lit = [a for a in step[1].invars if a is not v]
        if len(lit) != 1 or not C.is_literal(lit[0]):
            continue
        start, by, trips = int(C.literal_value(init)), int(C.literal_value(lit[0])), p["length"]
        lo, hi = np.iinfo(np.int32).min, np.iinfo(np.int32).max
        if not (lo <= start <= hi and lo <= start + by * trips <= hi):
            continue
        readers = [e for e in j.eqns if any(a is v or a is out for a in e.invars)]
        if all(e is step[1] or (e.primitive.name == "convert_element_type"
                                and np.dtype(_dtype(e.outvars[0])) in mosaic.WORD_DTYPES)
               for e in readers) and out not in j.outvars[:k - nc] + j.outvars[k - nc + 1:]:
            found[k] = step
    if not found:
        return body, frozenset()
    env = {}
    for k, (_, e) in found.items():
        for var in (j.invars[k], e.outvars[0]):
            env[var] = C.new_var(C.aval_of(var).update(dtype=np.dtype(np.int32),
                                                       weak_type=False))
    steps = {i: e for i, e in found.values()}
    eqns = []
    for i, e in enumerate(j.eqns):
        ins = [_walk.substitute(a, env) for a in e.invars]
        if i in steps:
            ins = [a if not C.is_literal(a) else
                   C.literal(np.int32(C.literal_value(a)),
                             C.aval_of(a).update(dtype=np.dtype(np.int32), weak_type=False))
                   for a in ins]
        eqns.append(e.replace(invars=ins, outvars=[env.get(v, v) for v in e.outvars]))
    narrowed = C.replace_jaxpr(j, invars=[env.get(v, v) for v in j.invars], eqns=eqns,
                               outvars=[_walk.substitute(a, env) for a in j.outvars])
    return C.closed(narrowed, body.consts), frozenset(found)


def _read_vars(jaxpr) -> set:
    reads = {a for e in jaxpr.eqns for a in e.invars if not C.is_literal(a)}
    return reads | {a for a in jaxpr.outvars if not C.is_literal(a)}


def _work(eqns) -> tuple[int, int, list]:
    """(equations, counting each loop body once per trip, where known; loops; trip counts)."""
    total, loops, trips = 0, 0, []
    for e in eqns:
        name = e.primitive.name
        if name == "scan":
            inner, _, _ = _work(e.params["jaxpr"].jaxpr.eqns)
            total += e.params["length"] * inner
            loops += 1
            trips.append(e.params["length"])
        elif name == "while":
            inner, _, _ = _work(e.params["body_jaxpr"].jaxpr.eqns)
            total += inner
            loops += 1
            trips.append(None)
        elif name in _BODIES:
            inner, k, t = _work(e.params[_BODIES[name]].jaxpr.eqns)
            total, loops, trips = total + inner, loops + k, trips + t
        else:
            total += 1
    return total, loops, trips


# --- the kernel body: the region's jaxpr evaluated on tiles -------------------------------------

@dataclasses.dataclass(frozen=True)
class _Tile:
    shape: tuple          # (rows, 128)

    def first_element(self):
        """The index, along the piece, of this grid step's first element."""
        return C.pallas_program_id(0) * (self.shape[0] * self.shape[1])


def evaluate(jaxpr, consts, args, tile: _Tile) -> list:
    """`jax.core.eval_jaxpr` of a region on tiles: every equation's primitive bound on the
    tiles as it is, except those whose params name the piece's shape or a body (`_TILE_RULES`:
    loops, calls, broadcasts of scalars, iotas; shifts whose amount may be 32 or more)."""
    env = dict(zip(jaxpr.constvars, consts))
    env.update(zip(jaxpr.invars, args))

    def read(a):
        if C.is_literal(a):
            val = C.literal_value(a)
            # (a non-scalar literal is an unused loop constant: `_check_loop`)
            return np.dtype(C.aval_of(a).dtype).type(val) if not np.ndim(val) else val
        return env[a]

    for e in jaxpr.eqns:
        vals = [read(a) for a in e.invars]
        rule = _TILE_RULES.get(e.primitive.name)
        if rule is not None:
            outs = rule(e, vals, tile)
        else:
            outs = e.primitive.bind(*vals, **e.params)
            outs = list(outs) if e.primitive.multiple_results else [outs]
        env.update(zip(e.outvars, outs))
    return [read(a) for a in jaxpr.outvars]


def _typed(v, atom):
    """An initial carry of a loop in the kernel: a literal as a value of its own dtype."""
    return jnp.asarray(v, _dtype(atom)) if np.ndim(v) == 0 and not hasattr(v, "aval") else v


def _scan(e, vals, tile):
    p = e.params
    nc = p["num_consts"]
    body, counters = narrow_counters(e, p["jaxpr"])
    consts = vals[:nc]

    def step(_, carry):
        return tuple(evaluate(body.jaxpr, body.consts, [*consts, *carry], tile))

    init = tuple(jnp.asarray(v, np.int32) if k in counters else _typed(v, a)
                 for k, (v, a) in enumerate(zip(vals, e.invars)) if k >= nc)
    # (no xs: the trips are independent of the scan's direction; int32 bounds, so the loop's
    # own index is int32 with jax_enable_x64 too)
    return list(lax.fori_loop(np.int32(0), np.int32(p["length"]), step, init))


def _while(e, vals, tile):
    p = e.params
    cn, bn = p["cond_nconsts"], p["body_nconsts"]
    cconsts, bconsts = vals[:cn], vals[cn:cn + bn]
    cond, body = p["cond_jaxpr"], p["body_jaxpr"]
    init = tuple(_typed(v, a) for v, a in zip(vals[cn + bn:], e.invars[cn + bn:]))
    return list(lax.while_loop(
        lambda c: evaluate(cond.jaxpr, cond.consts, [*cconsts, *c], tile)[0],
        lambda c: tuple(evaluate(body.jaxpr, body.consts, [*bconsts, *c], tile)), init))


def _call(e, vals, tile):
    body = e.params[_BODIES[e.primitive.name]]
    return evaluate(body.jaxpr, body.consts, vals, tile)


def _select(e, vals, tile):
    """`select_n(p, a, b)`; between booleans as `(p & b) | (~p & a)`: Mosaic failed to
    compile a select of masks on a TPU v5e ("Invalid input layout" at `arith.extsi` i1 -> i8,
    Dec 6), and the logic ops on masks compile."""
    if np.dtype(_dtype(e.outvars[0])) != np.bool_:
        return [e.primitive.bind(*vals, **e.params)]
    if len(vals) == 2:   # (one case)
        return [vals[1]]
    p, a, b = vals
    return [(p & b) | (~p & a)]


def _identity(e, vals, tile):
    return [vals[0]]


def _convert(e, vals, tile):
    """A conversion to the dtype a value has (a no-op, as `jnp.asarray(x, x.dtype)` leaves
    it; a counter `narrow_counters` made int32 read as int32) is the value itself."""
    new = np.dtype(e.params["new_dtype"])
    if vals[0].dtype == new:
        return [vals[0]]
    return [e.primitive.bind(vals[0], **e.params)]


def _broadcast(e, vals, tile):
    return [lax.full(tile.shape, vals[0], _dtype(e.outvars[0]))]


def _iota(e, vals, tile):
    """Element i of the piece is i: this tile's first element plus its row-major offset."""
    rows = lax.broadcasted_iota(np.int32, tile.shape, 0)
    lanes = lax.broadcasted_iota(np.int32, tile.shape, 1)
    idx = tile.first_element() + rows * tile.shape[1] + lanes
    return [lax.convert_element_type(idx, _dtype(e.outvars[0]))]


def _shift(e, vals, tile):
    """XLA's shift for every amount: amounts of 32 or more (as unsigned) give 0, or the sign
    for an arithmetic right shift; Mosaic's `shli`/`shrui`/`shrsi` define only smaller ones. A
    literal amount below 32 is bound as it is."""
    x, d = vals
    amount = e.invars[1]
    bits = np.dtype(_dtype(e.outvars[0])).itemsize * 8
    if C.is_literal(amount) and 0 <= int(C.literal_value(amount)) < bits:
        return [e.primitive.bind(x, d, **e.params)]
    dtype = np.dtype(_dtype(amount))
    ok = lax.convert_element_type(d, np.uint32) < np.uint32(bits)
    safe = jnp.where(ok, d, dtype.type(0))
    shifted = e.primitive.bind(x, safe, **e.params)
    if e.primitive.name == "shift_right_arithmetic":
        fill = e.primitive.bind(x, dtype.type(bits - 1), **e.params)
    else:
        fill = jnp.zeros_like(shifted)
    return [jnp.where(ok, shifted, fill)]


_TILE_RULES = {
    "scan": _scan, "while": _while, **{name: _call for name in _BODIES},
    "broadcast_in_dim": _broadcast, "iota": _iota, "convert_element_type": _convert,
    "select_n": _select,
    **{name: _shift for name in mosaic.SHIFTS},
    **{name: _identity for name in mosaic.IDENTITIES},
}


# --- regions at one level --------------------------------------------------------------------

@dataclasses.dataclass
class _Region:
    n: int
    members: list          # equations, in program order
    inputs: list           # vars read from outside (pieces and scalars)
    outputs: list          # vars used after it (pieces)
    before: list           # the level's other equations that go before the kernel
    after: list            # ... and after it (they depend on the region)


def _fit(eqn, n, uses) -> str | None:
    """Why `eqn` cannot be a region equation on pieces of `n` (None: it can)."""
    try:
        _check_eqn(eqn, n)
    except _Unfit as u:
        return str(u)
    for v in eqn.outvars:
        if _shape(v) != (n,) and not C.is_dropvar(v) and uses.get(v, 0):
            return f"a scalar result of '{eqn.primitive.name}' is used after it"
    return None


def _fits(eqns, outvars) -> dict:
    """id(equation) -> the piece length it may be a region equation on, for those that may."""
    uses = collections.Counter(a for e in eqns for a in e.invars if not C.is_literal(a))
    uses.update(a for a in outvars if not C.is_literal(a))
    out = {}
    for e in eqns:
        n = _piece_length(e)
        if n is not None and _fit(e, n, uses) is None:
            out[id(e)] = n
    return out


def _grow(eqns, first: int, n: int, fits: dict, excluded: set, outvars) -> _Region:
    """The region of pieces of `n` starting at `eqns[first]`: every fitting equation on `n`
    (not `excluded`: in a region already) that does not depend on an equation outside the
    region that depends on the region."""
    members, produced, taint = [], set(), set()
    before, after = list(eqns[:first]), []
    for e in eqns[first:]:
        ins = [a for a in e.invars if not C.is_literal(a)]
        if (fits.get(id(e)) == n and e.outvars[0] not in excluded
                and not any(a in taint for a in ins)):
            members.append(e)
            produced.update(e.outvars)
        elif any(a in produced or a in taint for a in ins):
            taint.update(e.outvars)
            after.append(e)
        else:
            before.append(e)
    inputs = list(dict.fromkeys(a for e in members for a in e.invars
                                if not C.is_literal(a) and a not in produced))
    read_after = {a for e in after for a in e.invars if not C.is_literal(a)}
    read_after |= {a for a in outvars if not C.is_literal(a)}
    outputs = [v for e in members for v in e.outvars
               if not C.is_dropvar(v) and v in read_after]
    return _Region(n, members, inputs, outputs, before, after)


# Elementwise work a region's re-joined pieces may meet after it (a rounds function's
# feed-forward `state + input`): done on the pieces instead, inside the kernel (`_epilogues`).
_EPILOGUE = frozenset({"add", "sub", "mul", "and", "or", "xor"})


def _epilogues(j, ctx):
    """(the level, changed): an elementwise operation of pieces re-joined by a stack and of an
    array whose pieces are already at hand is done on the pieces, so that the kernel of the
    region that made them takes it too:

        w0..w15 = the pieces of x (rows of reshape(x, (16, N)), or of a transpose of it)
        y = add(reshape[(4, 4, N)](stack[0](s0..s15)), x)
      → y = reshape[(4, 4, N)](stack[0](add(s0, w0), .., add(s15, w15)))

    (ChaCha20's block function adds the input to the rounds' result: left to XLA, that add
    read both and wrote the result once more after the kernel, 3 x 64 MiB at 1,048,576
    blocks.) Exact: each element is computed from the same two elements. Only where the
    pieces are 32-bit integers that a kernel takes at their size (`size_reason`), the stack
    has no other use, and every piece of the other operand is a value of the level already
    (`analysis.views`: the same elements of it in the same order), so nothing is read twice."""
    uses = movement.use_counts(j)            # (what movement.stack_split's checks read)
    producers, order = {}, {}
    for i, e in enumerate(j.eqns):
        for v in e.outvars:
            producers[v], order[v] = e, i

    def defn(atom):
        return None if C.is_literal(atom) else producers.get(atom)

    def rule(eqn):
        if (eqn.primitive.name not in _EPILOGUE or len(eqn.invars) != 2 or eqn.effects
                or _shape(eqn.invars[0]) != _shape(eqn.invars[1])):
            return None
        for k in (0, 1):
            found = movement.stack_split(eqn.invars[k], defn, uses)
            if found is not None:
                break
        else:
            return None
        st, _ = found
        y, pieces = eqn.invars[1 - k], st.invars
        n = _shape(pieces[0])
        if (len(n) != 1 or mosaic.primitive_reason(eqn.primitive.name,
                                                   [_dtype(a) for a in eqn.invars])
                or size_reason(n[0], 1 << 30, ctx) is not None):
            return None
        # each piece of y as a view of y: row i of y laid out as the stack is
        rows = views.stacked(_shape(y), st)
        if rows is None:
            return None
        want = [w.key() for w in rows]
        here, memo = order[eqn.outvars[0]], {}
        at_hand: dict = {}
        for v, i in order.items():
            if i < here and _shape(v) == n and (w := views.view_of(v, y, defn, memo)):
                at_hand.setdefault(w.key(), v)
        ws = [at_hand.get(key) for key in want]
        if any(w is None for w in ws):
            return None
        em = _walk.Emitter(eqn)
        done = [em.bind(eqn.primitive, *((p, w) if k == 0 else (w, p)), **eqn.params)[0]
                for p, w in zip(pieces, ws)]
        out = em.bind(st.primitive, *done, **st.params)[0]
        if _shape(out) != _shape(eqn.outvars[0]):
            out = em.bind(C.lax_primitive("reshape"), out, new_sizes=_shape(eqn.outvars[0]),
                          dimensions=None, sharding=None)[0]
        rep = em.replacement([out])
        ctx.report.applied(NAME, eqn, after=rep.eqns)
        return rep

    j, changed = _walk.rewrite_eqns(j, rule)
    # (the stacks the operations took are dead: a region must not keep their pieces alive)
    return (_walk.dce(j)[0], True) if changed else (j, False)


def _level(cj, ctx, mode, memo) -> tuple:
    """(the level with its regions as kernels, changed) for one jaxpr level and the bodies of
    the calls made there."""
    hit = memo.get(id(cj.jaxpr))
    if hit is not None and hit[0] is cj:
        return hit[1]
    j, changed = _epilogues(cj.jaxpr, ctx)
    eqns, outvars = list(j.eqns), list(j.outvars)
    excluded: set = set()        # equations already in a region (by their first result)
    kernels = 0
    # (effects: a region's equations would move past others)
    fits = {} if any(e.effects for e in eqns) else _fits(eqns, outvars)
    while kernels < _MAX_KERNELS:
        first = next((i for i, e in enumerate(eqns)
                      if id(e) in fits and e.outvars[0] not in excluded), None)
        if first is None:
            break
        region = _grow(eqns, first, fits[id(eqns[first])], fits, excluded, outvars)
        excluded.update(e.outvars[0] for e in region.members)
        new = _emit(region, ctx, mode, outvars) if region.outputs else None
        if new is None:
            continue
        kernel_eqns, env, dropped = new
        eqns = (region.before + kernel_eqns
                + [_walk.rename_operands(e, env) for e in region.after if id(e) not in dropped])
        outvars = [_walk.substitute(a, env) for a in outvars]
        # (the kernel's own conversions at its edges are not a region's)
        excluded.update(e.outvars[0] for e in kernel_eqns)
        fits = _fits(eqns, outvars)   # (renamed equations are new objects)
        kernels += 1
        changed = True
    # calls made here that no region took run once: their bodies are levels of their own
    for i, e in enumerate(eqns):
        if e.primitive.name in _CALLS:
            body, ch = _level(e.params["jaxpr"], ctx, mode, memo)
            if ch:
                eqns[i] = e.replace(params={**e.params, "jaxpr": body})
                changed = True
    _say_unfit(eqns, ctx, mode)
    out = cj, False
    if changed:
        out = C.closed(C.replace_jaxpr(j, eqns=eqns, outvars=outvars), cj.consts), True
    memo[id(cj.jaxpr)] = (cj, out)
    return out


def _say_unfit(eqns, ctx, mode) -> None:
    """What stays XLA's at a level, said once: each loop on pieces that no kernel takes, with
    its reason; equations outside the table on integer pieces (they cut a region); work on
    pieces of a dtype tiles do not hold (floats, 64-bit words), once per dtype."""
    least = 1 if mode is True else max(1, _cost.costs(ctx.target).kernel_min_eqns)
    by_dtype: dict = {}
    for e in eqns:
        n = _piece_length(e)
        name = e.primitive.name
        if n is None or name in _EDGES or name in _BODIES:
            continue
        if name in _LOOPS:
            try:
                _check_eqn(e, n)
            except _Unfit as u:
                ctx.report.declined(NAME, e, f"{name} on pieces of {n} elements stays XLA's: {u}")
            continue
        dt = _dtype(e.outvars[0])
        why = mosaic.dtype_reason(dt)
        if why is not None:
            by_dtype.setdefault(why, []).append(e)
        elif name not in mosaic.KERNEL_PRIMITIVES:
            ctx.report.declined(NAME, e, f"stays XLA's (no kernel holds it): "
                                         f"{mosaic.primitive_reason(name, [dt])}")
    for why, es in by_dtype.items():
        if len(es) >= least:
            ctx.report.declined(NAME, es[0], f"{len(es)} equation(s) on pieces of "
                                             f"{_piece_length(es[0])} elements stay XLA's: {why}")


# --- in place: the user's arrays where XLA:TPU keeps them (backend/tpu_layout.py) -------------

_VIEW_OPS = frozenset({"slice", "squeeze", "reshape", "transpose", "unstack",
                       *mosaic.IDENTITIES})


@dataclasses.dataclass
class _InPlace:
    """An array a kernel reads or writes whole, as `layout`'s view: `slots` maps a region
    input's (or output's) position to the (slab, sublane) rows that hold it."""
    array: object             # an input: the array's var; an output: the var it replaces
    layout: tpu_layout.Native
    slots: dict
    dropped: tuple = ()       # an output: the re-join's equations it replaces


def _column(view: views.View, layout: tpu_layout.Native) -> tuple | None:
    """(slab, sublane) where `view` is x[..., :, ...] of an array laid out as `layout` (its long
    axis, at one index of the short ones), else None."""
    strides = views.contiguous(layout.shape).strides
    if view.shape != (layout.n,) or view.strides[0] != strides[layout.axis]:
        return None
    index = np.unravel_index(view.offset, layout.shape)
    if index[layout.axis] != 0:
        return None
    return layout.slot(tuple(int(i) for k, i in enumerate(index) if k != layout.axis))


def _whole(f: _InPlace) -> bool:
    """An array is read in place where the region reads at least half of it (else its blocks
    would bring in more than the pieces)."""
    return 2 * len(set(f.slots.values())) >= f.layout.slabs * f.layout.sublanes


def _in_place_inputs(region: _Region) -> list:
    """The arrays whose pieces the region reads (each piece a column of one array, through
    views: `analysis.views`), for those `tpu_layout` models."""
    producers = {v: e for e in region.before for v in e.outvars}
    defn = producers.get
    found: dict = {}
    for k, v in enumerate(region.inputs):
        if _shape(v) != (region.n,) or np.dtype(_dtype(v)).itemsize != 4:
            continue
        chain, a = [], v
        while ((e := producers.get(a)) is not None and e.primitive.name in _VIEW_OPS
               and len(e.invars) == 1 and not C.is_literal(e.invars[0])):
            a = e.invars[0]
            chain.append(a)
        for root in reversed(chain):            # the furthest first: the user's array
            layout = tpu_layout.native(_shape(root), np.dtype(_dtype(root)).itemsize)
            if layout is None or layout.n != region.n:
                continue
            w = views.view_of(v, root, defn, {})
            slot = None if w is None else _column(w, layout)
            if slot is not None:
                found.setdefault(root, _InPlace(root, layout, {})).slots[k] = slot
                break
    return [f for f in found.values() if _whole(f)]


def _in_place_outputs(region: _Region, outvars) -> list:
    """The region's outputs re-joined whole by a `stack` (and a reshape of it) after it, into
    an array `tpu_layout` models: the kernel writes that array instead."""
    outputs = {v: k for k, v in enumerate(region.outputs)}
    uses = collections.Counter(a for e in region.after for a in e.invars
                               if not C.is_literal(a))
    uses.update(a for a in outvars if not C.is_literal(a))
    found = []
    for st in region.after:
        ins = st.invars
        if (st.primitive.name != "stack" or len(set(ins)) != len(ins)
                or any(C.is_literal(a) or a not in outputs or uses[a] != 1 for a in ins)):
            continue
        dropped, final = [st], st.outvars[0]
        users = [e for e in region.after if final in e.invars]
        if (uses[final] == 1 and len(users) == 1 and users[0].primitive.name == "reshape"
                and users[0].params.get("dimensions") is None
                and C.replicated(users[0].params.get("sharding"))):
            dropped.append(users[0])
            final = users[0].outvars[0]
        layout = tpu_layout.native(_shape(final), np.dtype(_dtype(final)).itemsize)
        rows = views.stacked(_shape(final), st)
        if layout is None or layout.n != region.n or rows is None:
            continue
        slots = {outputs[a]: _column(w, layout) for w, a in zip(rows, ins)}
        if all(s is not None for s in slots.values()):
            found.append(_InPlace(final, layout, slots, tuple(dropped)))
    return found


def _emit(region: _Region, ctx, mode, outvars):
    """(the kernel's equations, what it replaces: var -> new atom, equations of `region.after`
    it replaces) or None (declined, recorded)."""
    n = region.n
    costs = _cost.costs(ctx.target)
    rows = costs.kernel_tile_rows
    pieces = [_shape(v) == (n,) for v in region.inputs]
    if not any(pieces) and costs.kernel_generator_rows:
        # (a region that reads no piece, its pieces made from the iota (a Threefry draw), only
        # writes: a short grid step would be all step overhead; at most the piece's own rows)
        rows = max(mosaic.SUBLANES, min(costs.kernel_generator_rows,
                                        n // mosaic.LANES // mosaic.SUBLANES * mosaic.SUBLANES))
    work, loops, trips = _work(region.members)
    site = next((e for e in region.members if e.primitive.name in _LOOPS), region.members[0])
    if mode == "auto" and not loops and work < costs.kernel_min_eqns:
        ctx.report.count(f"{NAME}.short_regions")   # (normal: not worth a decline)
        return None
    why = (mosaic.tile_reason(n, rows)
           or _cost.kernel_decision(n, work, loops, mode, ctx.target))
    if why is not None:
        ctx.report.declined(NAME, site, f"region of {len(region.members)} equation(s) on pieces "
                                        f"of {n} elements: {why}")
        return None
    total_rows, steps = mosaic.grid(n, rows)
    interpret = mosaic.interpret()
    region_cj = C.closed(C.new_jaxpr(region.inputs, region.members, region.outputs,
                                     name="kernel_region"))
    tile = _Tile((rows, mosaic.LANES))
    word = np.dtype(np.int32)
    in_place = costs.kernel_in_place and steps * rows == total_rows
    reads = _in_place_inputs(region) if in_place else []
    writes = _in_place_outputs(region, outvars) if in_place else []
    read_at = {k: (r, slot) for r, f in enumerate(reads) for k, slot in f.slots.items()}
    write_at = {k: (w, slot) for w, f in enumerate(writes) for k, slot in f.slots.items()}
    direct = [k for k in range(len(region.inputs)) if k not in read_at]
    outs_direct = [k for k in range(len(region.outputs)) if k not in write_at]

    def io(dt):  # booleans cross the kernel's boundary as int32
        return word if np.dtype(dt) == np.bool_ else np.dtype(dt)

    def block(f):
        return (f.layout.slabs, rows * f.layout.sublanes, mosaic.LANES)

    def body(*refs):
        ins, refs = refs[:len(direct)], refs[len(direct):]
        arrays, refs = refs[:len(reads)], refs[len(reads):]
        outs, out_arrays = refs[:len(outs_direct)], refs[len(outs_direct):]
        vals = [None] * len(region.inputs)
        for ref, k in zip(ins, direct):
            x = ref[...] if pieces[k] else ref[0, 0]
            vals[k] = x != 0 if np.dtype(_dtype(region.inputs[k])) == np.bool_ else x
        for k, (r, (slab, sub)) in read_at.items():
            vals[k] = C.pallas_load_rows(arrays[r], slab, sub, rows, reads[r].layout.sublanes)
        res = evaluate(region_cj.jaxpr, (), vals, tile)
        for ref, k in zip(outs, outs_direct):
            x = lax.convert_element_type(res[k], io(_dtype(region.outputs[k])))
            ref[...] = jnp.broadcast_to(x, tile.shape)
        for k, (w, (slab, sub)) in write_at.items():
            x = jnp.broadcast_to(res[k], tile.shape)
            C.pallas_store_rows(out_arrays[w], slab, sub, rows, writes[w].layout.sublanes, x)

    def kernel(*args):
        ops = []
        for x, k in zip(args, direct):
            x = x.astype(io(x.dtype))
            ops.append(x.reshape(total_rows, mosaic.LANES) if pieces[k] else x.reshape(1, 1))
        ops += [f.layout.to_view(x) for f, x in zip(reads, args[len(direct):])]
        out_avals = ([((total_rows, mosaic.LANES), io(_dtype(region.outputs[k])))
                      for k in outs_direct]
                     + [(f.layout.view_shape(), np.dtype(_dtype(f.array))) for f in writes])
        outs = C.pallas_tiles_call(
            body, ops,
            [(rows, mosaic.LANES) if pieces[k] else None for k in direct]
            + [block(f) for f in reads],
            out_avals,
            [(rows, mosaic.LANES)] * len(outs_direct) + [block(f) for f in writes],
            steps, interpret=interpret, name="jaxrewrite_kernel",
            flops=work * n, bytes_accessed=4 * sum(math.prod(s) for s, _ in out_avals)
            + 4 * sum(math.prod(o.shape) for o in ops),
            input_fusion=costs.kernel_input_fusion)
        got = [o.reshape(n) != 0 if np.dtype(_dtype(region.outputs[k])) == np.bool_
               else o.reshape(n) for o, k in zip(outs, outs_direct)]
        return got + [f.layout.from_view(o) for f, o in zip(writes, outs[len(outs_direct):])]

    em = _walk.Emitter(site)
    results = em.call(kernel, *[region.inputs[k] for k in direct], *[f.array for f in reads])
    env = {region.outputs[k]: r for k, r in zip(outs_direct, results)}
    env.update({f.array: r for f, r in zip(writes, results[len(outs_direct):])})
    inside = (f"loop{'s' if loops > 1 else ''} of "
              f"{', '.join('?' if t is None else str(t) for t in trips)} trips inside"
              if loops else "straight-line")
    in_place_note = "".join(
        f"; {len(f.slots)} piece(s) {how} {_shape(f.array)} in place, as "
        f"{f.layout.view_shape()}" for how, fs in (("read from", reads), ("written to", writes))
        for f in fs)
    note = (f"{sum(pieces)} piece(s) of {n} in, {len(region.outputs)} out"
            f"{f', {len(pieces) - sum(pieces)} scalar(s) in SMEM' if not all(pieces) else ''}; "
            f"{len(region.members)} equation(s), {inside} ({work} evaluated a tile); tiles "
            f"({rows}, {mosaic.LANES}), grid ({steps},){in_place_note}"
            f"{'; Pallas interpreter' if interpret else ''}")
    ctx.report.applied(NAME, site, after=("pallas_call",), note=note)
    ctx.report.stats.setdefault(NAME, []).append(dict(
        elements=n, rows=rows, grid=steps, pieces_in=sum(pieces),
        scalars_in=len(pieces) - sum(pieces), pieces_out=len(region.outputs),
        eqns=len(region.members), work=work, trips=trips, interpret=interpret,
        in_place_in=len(read_at), in_place_out=len(write_at)))
    return em.eqns, env, {id(e) for f in writes for e in f.dropped}


# --- entry points ------------------------------------------------------------------------------

def enabled(ctx) -> bool:
    """Whether this pass may emit kernels for `ctx` (option, target, Pallas, one device)."""
    return (_cost.kernel_on(ctx.options.kernel, ctx.target) and _refusal(ctx) is None)


def _refusal(ctx) -> str | None:
    """Why no kernel can be emitted in this process for `ctx` at all (None: they can)."""
    if ctx.devices > 1:
        return f"program partitioned over {ctx.devices} devices"
    if not C.pallas_available():
        return "Pallas cannot be imported here"
    return None


def loop_reason(scan, body, ctx) -> str | None:
    """None where this pass would put the loop `scan`, with `body` (a Jaxpr: the body its
    split will have, flatten asks before splitting) in place of its own, into a kernel on
    `ctx`'s target; else why not (nothing recorded)."""
    if not enabled(ctx):
        return f"no kernels on {ctx.target} (kernel={ctx.options.kernel!r})"
    n = next((_shape(v)[0] for v in scan.outvars if len(_shape(v)) == 1), None)
    if n is None:
        return "no piece carried"
    try:
        _check_loop(scan, n, body)
    except _Unfit as u:
        return str(u)
    return size_reason(n, scan.params.get("length", 1) * _work(body.eqns)[0], ctx)


def size_reason(n: int, work: int, ctx) -> str | None:
    """Why a loop doing `work` equations on pieces of `n` elements gets no kernel on `ctx`'s
    target (the tiles, the cost row), else None; asked before anything is traced."""
    return (mosaic.tile_reason(n, _cost.costs(ctx.target).kernel_tile_rows)
            or _cost.kernel_decision(n, work, 1, ctx.options.kernel, ctx.target))


def run(cj, ctx):
    """Regions of integer work on pieces become kernels (module docstring)."""
    mode = ctx.options.kernel
    if not _cost.kernel_on(mode, ctx.target):
        return cj, False
    why = _refusal(ctx)
    if why is not None:
        if mode is True and cj.jaxpr.eqns:
            ctx.report.declined(NAME, cj.jaxpr.eqns[0], why)
        return cj, False
    return _level(cj, ctx, mode, {})
