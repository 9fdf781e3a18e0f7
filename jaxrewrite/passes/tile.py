"""A batch-independent program run as a loop over tiles of its batch axis (CPU).

A vmapped rounds loop carries the whole batch's state: each trip reads and writes every piece
of it, so once the state is larger than the cache every trip goes to memory (ChaCha20 over
65,536 blocks: 16 pieces of 65,536 words, 4 MiB read and written per double round). Run per
tile of T blocks, the same loop's state stays in the cache for all its trips:

    before:  { x:u32[B,4,4] -> s = scan[length=10]{ rounds }(pieces of x) ; y = join(s) + x }
    after:   { x:u32[B,4,4] -> ys = scan[length=B/T]{ (i, buf) ->
                   xt = dynamic_slice(x, i*T)                               # u32[T,4,4]
                   s = scan[length=10]{ rounds at T }(pieces of xt) ; yt = join(s) + xt
                   (i + 1, dynamic_update_slice(buf, yt, i*T)) }(0, zeros) }

Preconditions (each a decline with its reason where it fails):
- every equation maps element i to element i along the batch axis (`RULES`: elementwise
  equations, data movement and reductions on other axes, contractions that do not contract
  it; `scan`, `while`, `cond` and `jit` bodies recursively, a loop's carry keeping its axis);
  values that do not depend on the batch are computed once before the tile loop;
- no effects, no shardings, one device;
- a trip of a batched loop reads and writes more than the target's cache
  (`TargetCosts.tile_cache_bytes`: the CPU's per-core L2; 0 elsewhere: the GPU keeps the state
  in registers), the loop carries at most `tile_max_element_bytes` per batch element, and a
  power of two T of at least `tile_min`, whose carry takes at most `tile_budget` of the cache,
  divides B (the largest such T is taken).

The batch axis of each input is where its size is B, the largest dimension of the inputs
(the next ones are tried where that fails); the rules decide, so a wrong guess only declines.
Integer programs are bit for bit the same: each element's operations are the same ones.
"""
from __future__ import annotations

import math

import numpy as np
from jax import lax

from .. import _compat as C
from .. import _walk
from ..backend import cost as _cost
from ..report.records import Decline

NAME = "tile"
# A var's axis: its batch axis (an int), or None where it does not depend on the batch.

# --- the rule table: (eqn, operand axes) -> result axes ---------------------------------------

ELEMENTWISE = frozenset("""
    add sub mul div rem pow max min and or xor not neg sign floor ceil round is_finite exp exp2
    log log1p expm1 tanh logistic sin cos tan asin acos atan atan2 sinh cosh asinh acosh atanh
    sqrt rsqrt cbrt abs shift_left shift_right_logical shift_right_arithmetic population_count
    clz eq ne lt le gt ge select_n convert_element_type integer_pow square nextafter clamp imag
    real conj complex erf erfc erf_inv lgamma digamma copy copy_p reduce_precision
    threefry2x32 stop_gradient
""".split())
REDUCTIONS = frozenset("""reduce_sum reduce_max reduce_min reduce_prod reduce_and reduce_or
    reduce_xor argmax argmin""".split())
CUMULATIVE = frozenset("cumsum cumprod cummax cummin cumlogsumexp".split())


class _State:
    """One analysis (T None) or rebuild (T set) at batch size B."""

    def __init__(self, B: int, T: int | None = None):
        self.B, self.T = B, T
        self.loop_bytes = 0      # most bytes per batch element one batched loop carries
        self.live_bytes = 0      # most bytes per batch element live in one trip of such a loop
        self.loops = 0           # batched loops seen
        self.array_carry = None  # a batched loop carrying more than a word per element: its shape
        self.memo: dict = {}     # (id(jaxpr), axes) -> out axes / rebuilt jaxpr



def _one_axis(eqn, axes) -> int | None:
    batched = {a for a in axes if a is not None}
    if len(batched) > 1:
        raise Decline(f"{eqn.primitive.name}: operands batched along different axes")
    return batched.pop() if batched else None


def _aligned(eqn, axes, st):
    """Operands used element for element (same shape apart from scalars and size-1 axes, which
    JAX broadcasts): one batch axis; a batch-sized operand that does not depend on the batch is
    sliced per tile."""
    a = _one_axis(eqn, axes)
    slices = {}
    if a is not None:
        for k, (v, ax) in enumerate(zip(eqn.invars, axes)):
            shape = C.aval_of(v).shape
            if ax is not None or not shape or shape[a] == 1:  # (size 1: broadcast implicitly)
                continue
            if shape[a] != st.B:
                raise Decline(f"{eqn.primitive.name}: an operand of {shape[a]} along the "
                              f"batch axis")
            slices[k] = a
    return [a] * len(eqn.outvars), slices


def _rule_broadcast(eqn, axes, st):
    (a,) = axes[:1]
    if any(x is not None for x in axes[1:]):
        raise Decline("broadcast_in_dim with dynamic shape operands")
    return [None if a is None else eqn.params["broadcast_dimensions"][a]], {}


def _reshape_axis(in_shape, a, out_shape, B) -> int | None:
    """Where axis `a` of `in_shape` is in `out_shape` as a whole dimension of its own."""
    before = math.prod(in_shape[:a])
    p = 1
    for b, n in enumerate(out_shape):
        if p == before and n == B:
            return b
        p *= n
    return None


def _rule_reshape(eqn, axes, st):
    a = axes[0]
    if a is None:
        return [None], {}
    if eqn.params.get("dimensions") is not None:
        raise Decline("reshape with dimensions")
    b = _reshape_axis(C.aval_of(eqn.invars[0]).shape, a, eqn.params["new_sizes"], st.B)
    if b is None:
        raise Decline("reshape merges the batch axis with another")
    return [b], {}


def _rule_transpose(eqn, axes, st):
    a = axes[0]
    return [None if a is None else list(eqn.params["permutation"]).index(a)], {}


def _rule_squeeze(eqn, axes, st):
    a = axes[0]
    if a is None:
        return [None], {}
    dims = eqn.params["dimensions"]
    if a in dims:
        raise Decline("squeeze of the batch axis")
    return [a - sum(d < a for d in dims)], {}


def _not_along(param: str, what: str):
    """Rules for primitives acting along the axes named in `param` (never the batch axis)."""
    def rule(eqn, axes, st):
        a = _one_axis(eqn, axes)
        if a is None:
            return [None] * len(eqn.outvars), {}
        p = eqn.params[param]
        named = p if isinstance(p, (tuple, list)) else (p,)
        if a in named:
            raise Decline(f"{eqn.primitive.name} {what} the batch axis")
        return _aligned(eqn, axes, st)
    return rule


def _rule_slice(eqn, axes, st):
    a = axes[0]
    if a is None:
        return [None], {}
    p = eqn.params
    strides = p.get("strides") or (1,) * len(p["start_indices"])
    if p["start_indices"][a] != 0 or p["limit_indices"][a] != st.B or strides[a] != 1:
        raise Decline("slice of part of the batch axis")
    return [a], {}


def _rule_pad(eqn, axes, st):
    a = axes[0]
    if axes[1] is not None:
        raise Decline("pad with a batched padding value")
    if a is not None and tuple(eqn.params["padding_config"][a]) != (0, 0, 0):
        raise Decline("pad along the batch axis")
    return [a], {}


def _rule_reduce(eqn, axes, st):
    a = _one_axis(eqn, axes)
    if a is None:
        return [None] * len(eqn.outvars), {}
    red = eqn.params["axes"]
    if a in red:
        raise Decline(f"{eqn.primitive.name} along the batch axis")
    return [a - sum(d < a for d in red)] * len(eqn.outvars), {}


def _rule_stack(eqn, axes, st):
    outs, slices = _aligned(eqn, axes, st)
    a = outs[0]
    return [None if a is None else a + (a >= eqn.params["axis"])], slices


def _rule_unstack(eqn, axes, st):
    a, axis = axes[0], eqn.params["axis"]
    if a == axis:
        raise Decline("unstack along the batch axis")
    return [None if a is None else a - (a > axis)] * len(eqn.outvars), {}


def _rule_dot(eqn, axes, st):
    (lc, rc), (lb, rb) = eqn.params["dimension_numbers"]
    la, ra = axes
    lhs, rhs = (C.aval_of(v).shape for v in eqn.invars)
    if la in lc or ra in rc:
        raise Decline("dot_general contracts the batch axis")
    lfree = [d for d in range(len(lhs)) if d not in lc and d not in lb]
    rfree = [d for d in range(len(rhs)) if d not in rc and d not in rb]
    if la is not None and ra is not None:
        if la not in lb or ra not in rb or list(lb).index(la) != list(rb).index(ra):
            raise Decline("dot_general with both operands batched on unpaired axes")
        return [list(lb).index(la)], {}
    if la is not None:
        if la in lb:
            raise Decline("dot_general pairs the batch axis with an unbatched operand")
        return [len(lb) + lfree.index(la)], {}
    if ra is not None:
        if ra in rb:
            raise Decline("dot_general pairs the batch axis with an unbatched operand")
        return [len(lb) + len(lfree) + rfree.index(ra)], {}
    return [None], {}


def _rule_gather(eqn, axes, st):
    """A gather acting on other axes: the operand's batch axis taken whole (an offset
    dimension), or the indices batched and the operand not (a table read per element)."""
    a, c = axes
    dn = eqn.params["dimension_numbers"]
    if a is not None and c is not None:
        raise Decline("gather with batched operand and indices")
    if a is not None:
        if (a in dn.start_index_map or a in dn.collapsed_slice_dims
                or a in dn.operand_batching_dims or eqn.params["slice_sizes"][a] != st.B):
            raise Decline("gather indexes the batch axis")
        kept = [d for d in range(len(eqn.params["slice_sizes"]))
                if d not in dn.collapsed_slice_dims and d not in dn.operand_batching_dims]
        return [dn.offset_dims[kept.index(a)]], {}
    if c == len(C.aval_of(eqn.invars[1]).shape) - 1 or dn.operand_batching_dims:
        raise Decline("gather with batched index vectors")
    rank = len(C.aval_of(eqn.outvars[0]).shape)
    return [[d for d in range(rank) if d not in dn.offset_dims][c]], {}


def _rule_scan(eqn, axes, st):
    p = eqn.params
    nc, nk = p["num_consts"], p["num_carry"]
    consts, carry, xs = axes[:nc], list(axes[nc:nc + nk]), axes[nc + nk:]
    if any(a == 0 for a in xs):
        raise Decline("scan iterates over the batch axis")
    body_xs = [None if a is None else a - 1 for a in xs]
    slices = {}
    carry, out = _carry_fixpoint(eqn, p["jaxpr"], list(consts), carry, body_xs, nc, st, slices)
    ys = [None if a is None else a + 1 for a in out[nk:]]
    return carry + ys, slices


def _carry_fixpoint(eqn, body, consts, carry, tail, offset, st, slices):
    """The carry's batch axes: the initial values' axes; a batch-sized initial value that does
    not depend on the batch (a broadcast constant state), and a carry that a trip makes
    batched, start batched (the initial value sliced per tile)."""
    for k, a in enumerate(carry):
        hits = [d for d, n in enumerate(C.aval_of(eqn.invars[offset + k]).shape) if n == st.B]
        if a is None and len(hits) == 1:
            carry[k] = slices[offset + k] = hits[0]
    for _ in range(len(carry) + 1):
        out = _analyze(body.jaxpr, consts + carry + tail, st)
        changed = False
        for k, (a, b) in enumerate(zip(carry, out[:len(carry)])):
            if a == b:
                continue
            shape = C.aval_of(eqn.invars[offset + k]).shape
            if a is None and b is not None and len(shape) > b and shape[b] == st.B:
                carry[k] = b
                slices[offset + k] = b
                changed = True
            else:
                raise Decline(f"{eqn.primitive.name} carry {k} changes its batch axis in a trip")
        if not changed:
            _count_loop(body.jaxpr, body.jaxpr.invars[len(consts):len(consts) + len(carry)],
                        carry, st)
            return carry, out
    raise Decline(f"{eqn.primitive.name}: carry axes do not settle")


def _count_loop(body, invars, carry, st):
    """Record a batched loop: the bytes per batch element it carries, and those its body holds
    live each trip (the carry, and what its data movement materializes)."""
    per = sum(_element_bytes(v.aval, a) for v, a in zip(invars, carry) if a is not None)
    for v, a in zip(invars, carry):
        if a is not None and len(v.aval.shape) > 1 and st.array_carry is None:
            st.array_carry = tuple(v.aval.shape)
    if per:
        st.loops += 1
        st.loop_bytes = max(st.loop_bytes, per)
        st.live_bytes = max(st.live_bytes, per + _moved_bytes(body, st.B))


def _element_bytes(aval, a) -> int:
    return aval.dtype.itemsize * math.prod(aval.shape) // aval.shape[a]


# Equations XLA:CPU fuses into their consumers or makes views of: no buffer of their own.
_FUSED = ELEMENTWISE | {"reshape", "squeeze", "broadcast_in_dim", "slice", "iota"}


def _moved_bytes(jaxpr, B) -> int:
    """Bytes per batch element of the batch-sized values `jaxpr`'s data movement materializes
    (gathers, transposes, concatenates, ...; through `jit` bodies, not nested loops): they are
    live in the trip beside the carry. (ChaCha20's split body: none; BLAKE2s in the author's
    form, its gathers and 4-vector stacks: 8x its carry, and tiles sized for the carry alone
    ran 1.04x untiled where a quarter of that size ran 0.79x.)"""
    total = 0
    for e in jaxpr.eqns:
        if e.primitive.name in ("jit", "pjit"):
            total += _moved_bytes(e.params["jaxpr"].jaxpr, B)
        elif e.primitive.name not in _FUSED and e.primitive.name not in ("scan", "while"):
            for v in e.outvars:
                shape = getattr(v.aval, "shape", ())
                if B in shape:
                    total += _element_bytes(v.aval, list(shape).index(B))
    return total


def _rule_while(eqn, axes, st):
    p = eqn.params
    cn, bn = p["cond_nconsts"], p["body_nconsts"]
    cconsts, bconsts, carry = axes[:cn], axes[cn:cn + bn], list(axes[cn + bn:])
    slices = {}
    carry, out = _carry_fixpoint(eqn, p["body_jaxpr"], list(bconsts), carry, [], cn + bn, st,
                                 slices)
    if _analyze(p["cond_jaxpr"].jaxpr, list(cconsts) + carry, st) != [None]:
        raise Decline("while condition depends on the batch")
    return carry, slices


def _rule_cond(eqn, axes, st):
    if axes[0] is not None:
        raise Decline("cond index depends on the batch")
    outs = [_analyze(b.jaxpr, list(axes[1:]), st) for b in eqn.params["branches"]]
    if any(o != outs[0] for o in outs):
        raise Decline("cond branches batch their results differently")
    return outs[0], {}


def _rule_jit(eqn, axes, st):
    unspecified = C.unspecified_sharding()
    for k in ("in_shardings", "out_shardings"):
        if any(s is not unspecified and s is not None for s in eqn.params[k]):
            raise Decline("jit with shardings")
    return _analyze(eqn.params["jaxpr"].jaxpr, list(axes), st), {}


RULES = {
    **{n: _aligned for n in ELEMENTWISE},
    **{n: _rule_reduce for n in REDUCTIONS},
    **{n: _not_along("axis", "along") for n in CUMULATIVE},
    "broadcast_in_dim": _rule_broadcast,
    "reshape": _rule_reshape,
    "transpose": _rule_transpose,
    "squeeze": _rule_squeeze,
    "slice": _rule_slice,
    "pad": _rule_pad,
    "rev": _not_along("dimensions", "reverses"),
    "concatenate": _not_along("dimension", "joins along"),
    "sort": _not_along("dimension", "sorts along"),
    "split": _not_along("axis", "splits along"),
    "stack": _rule_stack,
    "unstack": _rule_unstack,
    "dot_general": _rule_dot,
    "gather": _rule_gather,
    "scan": _rule_scan,
    "while": _rule_while,
    "cond": _rule_cond,
    "jit": _rule_jit,
    "pjit": _rule_jit,
}


# --- analysis --------------------------------------------------------------------------------

def _read(env, atom):
    return None if C.is_literal(atom) else env[atom]


def _eqn_axes(eqn, axes, st, top):
    """(result axes, operands to slice per tile) of one equation."""
    if C.has_effects(eqn) or C.is_stateful(eqn):
        raise Decline(f"{eqn.primitive.name} has effects")
    for k in ("sharding", "out_sharding"):
        if not C.replicated(eqn.params.get(k)):
            raise Decline(f"{eqn.primitive.name} with a sharding")
    if top and _generator(eqn, st.B):
        return [eqn.params["dimension"]], {}
    if all(a is None for a in axes) and eqn.primitive.name not in ("scan", "while", "cond",
                                                                    "jit", "pjit"):
        return [None] * len(eqn.outvars), {}
    rule = RULES.get(eqn.primitive.name)
    if rule is None:
        raise Decline(f"{eqn.primitive.name} on batched operands (not in the rule table)")
    outs, slices = rule(eqn, axes, st)
    if slices and not top:
        raise Decline(f"{eqn.primitive.name} inside a body reads a batch-sized value that does "
                      f"not depend on the batch")
    return outs, slices


def _analyze(jaxpr, in_axes, st, top=False, record=None):
    """Result axes of `jaxpr` given its inputs' axes (memoised per nested jaxpr object)."""
    key = (id(jaxpr), tuple(in_axes))
    if not top and key in st.memo:
        return st.memo[key]
    env = {v: None for v in jaxpr.constvars}
    env.update(zip(jaxpr.invars, in_axes))
    for eqn in jaxpr.eqns:
        try:
            outs, slices = _eqn_axes(eqn, [_read(env, v) for v in eqn.invars], st, top)
        except Decline as d:
            d.eqn = getattr(d, "eqn", eqn)
            raise
        env.update(zip(eqn.outvars, outs))
        if record is not None:
            record[eqn] = (outs, slices)
    out = [_read(env, v) for v in jaxpr.outvars]
    if not top:
        st.memo[key] = out
    return out


# --- rebuild at tile size T --------------------------------------------------------------------

def _key(atom):
    """A dict key for a var or a literal (literals are not hashable)."""
    return ("literal", id(atom)) if C.is_literal(atom) else atom


def _tile_aval(aval, a, T):
    shape = list(aval.shape)
    shape[a] = T
    return aval.update(shape=tuple(shape))


# primitive -> (the param holding a size per dim, whether its dims are the result's (else the
# first operand's)): the batch axis's entry is the batch's size, the tile's once rebuilt
_SIZE_PARAMS = {
    "broadcast_in_dim": ("shape", True),
    "reshape": ("new_sizes", True),
    "slice": ("limit_indices", False),
    "gather": ("slice_sizes", False),
}


def _params(eqn, axes, outs, st):
    """`eqn`'s params at tile size (shape params; nested bodies rebuilt)."""
    p = dict(eqn.params)
    name, T = eqn.primitive.name, st.T
    row = _SIZE_PARAMS.get(name)
    if row is not None:
        key, of_result = row
        d = outs[0] if of_result else axes[0]
        if d is not None:  # the batch axis's entry of that shape param becomes the tile
            p[key] = tuple(T if k == d else n for k, n in enumerate(p[key]))
    elif name == "scan":
        nc, nk = p["num_consts"], p["num_carry"]
        # the carry at its settled axes (a batch-sized initial value comes in sliced)
        body_axes = (list(axes[:nc]) + list(outs[:nk])
                     + [None if a is None else a - 1 for a in axes[nc + nk:]])
        p["jaxpr"] = _rebuild(p["jaxpr"], body_axes, st)
    elif name == "while":
        cn = p["cond_nconsts"]
        carry = list(outs)
        p["body_jaxpr"] = _rebuild(p["body_jaxpr"], list(axes[cn:cn + p["body_nconsts"]]) + carry,
                                   st)
        p["cond_jaxpr"] = _rebuild(p["cond_jaxpr"], list(axes[:cn]) + carry, st)
    elif name == "cond":
        p["branches"] = tuple(_rebuild(b, list(axes[1:]), st) for b in p["branches"])
    elif name in ("jit", "pjit"):
        p["jaxpr"] = _rebuild(p["jaxpr"], list(axes), st)
    return p


def _rebuild(cj, in_axes, st):
    """Nested `cj` with its batched values at tile size (memoised: shared bodies stay shared)."""
    key = ("rebuilt", id(cj.jaxpr), tuple(in_axes))
    if key in st.memo:
        return st.memo[key]
    j = cj.jaxpr
    invars = [C.new_var(v.aval if a is None else _tile_aval(v.aval, a, st.T))
              for v, a in zip(j.invars, in_axes)]
    env = dict(zip(j.invars, invars))
    axes = dict(zip(j.invars, in_axes))
    axes.update({v: None for v in j.constvars})
    env.update({v: v for v in j.constvars})
    eqns = _rebuild_eqns(j.eqns, env, axes, st, {})
    out = C.closed(C.replace_jaxpr(j, invars=invars, eqns=eqns,
                                   outvars=[env.get(v, v) if not C.is_literal(v) else v
                                            for v in j.outvars]), cj.consts)
    st.memo[key] = out
    return out


def _rebuild_eqns(eqns, env, axes, st, sliced, top=False):
    """`eqns` at tile size: `env` maps old vars to new ones, `axes` old vars to batch axes;
    `sliced[(var, axis)]` is the per-tile slice of a batch-sized unbatched value (top level)."""
    out = []
    for eqn in eqns:
        in_axes = [_read(axes, v) for v in eqn.invars]
        outs, slices = _eqn_axes(eqn, in_axes, st, top)  # (checked by the analysis)
        invars = []
        for k, v in enumerate(eqn.invars):
            if k in slices:
                invars.append(sliced[(_key(v), slices[k])])
            else:
                invars.append(v if C.is_literal(v) else env[v])
        if all(a is None for a in in_axes) and all(a is None for a in outs) and \
                not any(k in slices for k in range(len(invars))) and \
                eqn.primitive.name not in ("scan", "while", "cond", "jit", "pjit"):
            params = eqn.params
        else:
            params = _params(eqn, in_axes, outs, st)
        avals = C.abstract_eval(eqn.primitive, [C.aval_of(v) for v in invars], **params)
        outvars = [C.new_var(av) for av in avals]
        out.append(C.new_eqn(invars, outvars, eqn.primitive, params, eqn.effects,
                             eqn.source_info, eqn.ctx))
        env.update(zip(eqn.outvars, outvars))
        axes.update(zip(eqn.outvars, outs))
    return out


# --- the top level -----------------------------------------------------------------------------

def _candidates(jaxpr) -> list[int]:
    sizes = sorted({n for v in jaxpr.invars for n in getattr(C.aval_of(v), "shape", ())},
                   reverse=True)
    return sizes[:3]


def _input_axes(jaxpr, B) -> list:
    axes = []
    for v in jaxpr.invars:
        shape = getattr(C.aval_of(v), "shape", ())
        hits = [d for d, n in enumerate(shape) if n == B]
        if len(hits) > 1:
            raise Decline(f"an input has {len(hits)} axes of size {B}")
        axes.append(hits[0] if hits else None)
    return axes


class Plan:
    """What tiling the top level at batch size B would do (axes of every top-level equation)."""

    def __init__(self, jaxpr, B):
        self.B = B
        self.in_axes = _input_axes(jaxpr, B)
        if all(a is None for a in self.in_axes):
            raise Decline(f"no input has an axis of {B}")
        self.st = _State(B)
        self.record: dict = {}
        self.out_axes = _analyze(jaxpr, self.in_axes, self.st, top=True, record=self.record)
        if all(a is None for a in self.out_axes):
            raise Decline("no result depends on the batch")


def _plan(jaxpr):
    first = None
    for B in _candidates(jaxpr):
        try:
            return Plan(jaxpr, B)
        except Decline as d:
            first = first or d
    raise first or Decline("no input with an axis")


def _tile_size(plan, costs) -> int:
    """The power-of-two tile: one core's share fits `tile_budget` of that core's cache, and the
    tile is that share times the cores XLA:CPU may split a fusion over (`TargetCosts.tile_cores`:
    on 2 cores XLA splits none of a tile's fusions, and this size still measured fastest)."""
    per, B = plan.st.loop_bytes, plan.B
    cache = costs.tile_cache_bytes
    cores = 1 << int(math.log2(_cost.cpu_cores(costs)))   # (a power of two: tiles divide B)
    if not plan.st.loops:
        raise Decline("no loop carries batched state (XLA fuses straight-line code already)")
    if per > costs.tile_max_element_bytes:
        raise Decline(f"the loop carries {per} B per batch element (at most "
                      f"{costs.tile_max_element_bytes} B: a wider state was measured slower "
                      f"tiled)")
    # A trip reads the carry and writes the next one, each core its share. Measured (paired,
    # tiled vs untiled, 1 MiB L2): ChaCha20's split loop (64 B a block) 8,192 / 16,384 blocks
    # (1 / 2 MiB a trip) 0.6x; 4,096 blocks (512 KiB) alike; a 5x5-word ARX loop (100 B), 4,096
    # blocks (800 KiB) 1.1x.
    if 2 * per * B < cache * cores:
        raise Decline(f"loop state {per * B / 1024:.0f} KiB ({per} B x {B}): a trip reads and "
                      f"writes {2 * per * B / 1024:.0f} KiB, within the cache of its "
                      f"{cores} core(s) ({cache // 1024} KiB each)")
    if plan.st.array_carry is not None and not costs.tile_array_carry:
        # Measured: tiles win where the loop carries its state as words, one array of the
        # batch's length each (ChaCha20's and BLAKE2s's split carries); an unsplit 4x4-word ARX
        # loop over 65,536 blocks ran 1.3-8.8x jax.jit tiled (untiled 0.8-0.97x).
        raise Decline(f"a loop carries {plan.st.array_carry} arrays, not words of the batch's "
                      f"length (its carry was not split): measured slower tiled")
    budget = cache * costs.tile_budget
    live = plan.st.live_bytes
    share = 1 << int(math.log2(max(1, budget / live)))
    if share < costs.tile_min:
        raise Decline(f"{live} B live per batch element in a trip: a tile within "
                      f"{budget / 1024:.0f} KiB holds {share}, fewer than {costs.tile_min}")
    T = share * cores
    while T >= costs.tile_min * cores and B % T:
        T //= 2
    if T < costs.tile_min * cores:
        raise Decline(f"no power-of-two tile of at least {costs.tile_min} per core x {cores} "
                      f"core(s) divides the batch of {B}")
    if T >= B:
        raise Decline(f"one tile of {T} ({cores} core(s) x {T // cores}) holds the batch of {B}: "
                      f"each core's share already fits its cache")
    return T


def _emit(cj, plan, T):
    """The tiled program: uniform equations before the loop, the rest in a loop over tiles."""
    j = cj.jaxpr
    B = plan.B
    st = _State(B, T)
    ready = set(j.constvars) | {v for v, a in zip(j.invars, plan.in_axes) if a is None}
    pro, body, slice_keys, gens = [], [], [], []
    for eqn in j.eqns:
        outs, slices = plan.record[eqn]
        if _generator(eqn, B):
            gens.append(eqn)
        elif all(C.is_literal(v) or v in ready for v in eqn.invars) and \
                all(a is None for a in outs):
            pro.append(eqn)
            ready.update(eqn.outvars)
        else:
            body.append(eqn)
            for k, a in slices.items():
                if not any(_key(v) == _key(eqn.invars[k]) and b == a for v, b in slice_keys):
                    slice_keys.append((eqn.invars[k], a))
    out_axes = dict(zip(j.outvars, plan.out_axes))
    for v, a in out_axes.items():
        if a is None and not C.is_literal(v) and v not in ready:
            raise Decline("a result that does not depend on the batch is computed from "
                          "batched values")
    uniform_in = [v for v in dict.fromkeys(
        v for e in body for v in e.invars if not C.is_literal(v) and v in ready)]
    batched_in = [(v, a) for v, a in zip(j.invars, plan.in_axes) if a is not None]
    batched_out = [(v, a) for v, a in out_axes.items() if a is not None]
    if any(getattr(v.aval, "weak_type", False) for v, _ in batched_out):
        raise Decline("a weakly typed result (the tiles' buffer would not be)")
    if any(C.is_extended_dtype(v.aval.dtype) for v, _ in batched_out):
        raise Decline("a result of an extended dtype (PRNG keys: no buffer of zeros to fill)")
    # the body's own jaxpr: batched inputs (tiles), uniform values (whole), slices (tiles)
    env, axes = {}, {}
    b_in = [C.new_var(_tile_aval(v.aval, a, T)) for v, a in batched_in]
    u_in = [C.new_var(v.aval) for v in uniform_in]
    s_in = [C.new_var(_tile_aval(v.aval, a, T)) for v, a in slice_keys]
    g_in = [C.new_var(_tile_aval(e.outvars[0].aval, e.params["dimension"], T)) for e in gens]
    env.update({e.outvars[0]: n for e, n in zip(gens, g_in)})
    axes.update({e.outvars[0]: e.params["dimension"] for e in gens})
    env.update({v: n for (v, _), n in zip(batched_in, b_in)})
    env.update(zip(uniform_in, u_in))
    axes.update(dict(batched_in))
    axes.update({v: None for v in uniform_in})
    sliced = {(_key(v), a): n for (v, a), n in zip(slice_keys, s_in)}
    eqns = _rebuild_eqns(body, env, axes, st, sliced, top=True)
    outvars = [env[v] for v, _ in batched_out]
    body_cj = C.closed(C.new_jaxpr(b_in + u_in + s_in + g_in, eqns, outvars, name="tile"))
    pro_outs = list(dict.fromkeys(uniform_in + [v for v, a in out_axes.items()
                                                if a is None and not C.is_literal(v)
                                                and v in ready]))
    pro_in = list(j.constvars) + [v for v, a in zip(j.invars, plan.in_axes) if a is None]
    pro_cj = C.closed(C.new_jaxpr(pro_in, pro, pro_outs, name="tile_prologue"))
    n_tiles = B // T

    def tiled(*args):
        vals = dict(zip(j.invars, args))
        vals.update(zip(j.constvars, cj.consts))
        vals.update(zip(pro_outs, C.eval_jaxpr(pro_cj, *[vals[v] for v in pro_in])))

        def step(i, bufs):
            off = (i * T).astype(np.uint32)  # (unsigned: no negative-index fix-up per slice)
            xs = [lax.dynamic_slice_in_dim(vals[v], off, T, a) for v, a in batched_in]
            ss = [lax.dynamic_slice_in_dim(C.literal_value(v) if C.is_literal(v) else vals[v],
                                           off, T, a) for v, a in slice_keys]
            gs = [_iota_tile(e, T, off) for e in gens]
            ys = C.eval_jaxpr(body_cj, *xs, *[vals[v] for v in uniform_in], *ss, *gs)
            return [lax.dynamic_update_slice_in_dim(b, y, off, a)
                    for b, y, (_, a) in zip(bufs, ys, batched_out)]

        init = [lax.full(v.aval.shape, 0, v.aval.dtype) for v, _ in batched_out]
        done = dict(zip([v for v, _ in batched_out], lax.fori_loop(0, n_tiles, step, init)))
        return [C.literal_value(v) if C.is_literal(v) else done.get(v, vals.get(v))
                for v in j.outvars]

    return C.trace_avals(tiled, [v.aval for v in j.invars])


def _iota_tile(eqn, T, off):
    """Tile `off // T` of a generator (an iota along the batch axis): iota at T + offset."""
    aval, a = eqn.outvars[0].aval, eqn.params["dimension"]
    shape = list(aval.shape)
    shape[a] = T
    return lax.broadcasted_iota(aval.dtype, tuple(shape), a) + off.astype(aval.dtype)


def _generator(eqn, B) -> bool:
    """An integer iota along an axis of the batch size: element i is i (made per tile)."""
    p = eqn.params
    return (eqn.primitive.name == "iota" and p["shape"][p["dimension"]] == B
            and C.replicated(p.get("sharding")) and np.issubdtype(p["dtype"], np.integer))


def run(cj, ctx):
    """Tile the top level where the rules and the cost model allow (module docstring)."""
    costs = _cost.costs(ctx.target)
    if not ctx.options.tile:
        return cj, False
    j = cj.jaxpr
    if not j.eqns:
        return cj, False
    # (reported at the first loop: the rounds loop the tiles are for, in the user's source)
    site = next((e for e in _walk.iter_eqns(cj) if e.primitive.name in ("scan", "while")),
                j.eqns[0])
    try:
        if ctx.devices > 1:
            raise Decline(f"program partitioned over {ctx.devices} devices")
        plan = _plan(j)
        if not costs.tile_cache_bytes:
            raise Decline(f"target {ctx.target}: not tiled (one kernel keeps the state on chip)")
        T = _tile_size(plan, costs)
        new = _emit(cj, plan, T)
    except Decline as d:
        if _worth_saying(cj, costs):
            ctx.report.declined(NAME, getattr(d, "eqn", site), str(d))
        return cj, False
    st = plan.st
    cores = 1 << int(math.log2(_cost.cpu_cores(costs)))
    est = (f"T={T} of {plan.B} ({cores} core(s) x {T // cores}): {st.live_bytes} B live a block "
           f"x {T // cores} = {st.live_bytes * T // cores // 1024} KiB a trip per core "
           f"({st.loop_bytes} B carried: {st.loop_bytes * plan.B // 1024} KiB whole; cache "
           f"{costs.tile_cache_bytes // 1024} KiB a core)")
    ctx.report.applied(NAME, site, after=("scan",), note=est)
    ctx.report.stats["tile"] = dict(T=T, B=plan.B, bytes_per_element=st.loop_bytes,
                                    live_bytes_per_element=st.live_bytes)
    return new, True


def _worth_saying(cj, costs) -> bool:
    """A decline is recorded only for programs tiling is for: an input axis of at least the
    smallest tile, and a loop."""
    if max(_candidates(cj.jaxpr) or [0]) < costs.tile_min:
        return False
    return any(e.primitive.name in ("scan", "while") for e in _walk.iter_eqns(cj))
