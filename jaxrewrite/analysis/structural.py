"""The structural key of a jaxpr: equal keys mean the same program, up to variable renaming.

`structural_key(j)` numbers variables in binding order (constvars, invars, then each equation's
outputs), so two jaxprs that differ only in variable names (alpha-equivalent) get equal keys.
The key covers:

| part                 | keyed by                                                               |
|----------------------|------------------------------------------------------------------------|
| primitive            | the primitive object (identity: two primitives may share a name)       |
| params               | value, recursively; nested jaxprs by their own key; `name` included    |
| literals             | aval (weak type included) + bit pattern (small) or `_Const` (large)     |
| variables            | binding position + aval (`_compat.aval_key`: shape, dtype, weak type…) |
| effects              | the effect objects (per equation and per jaxpr)                        |
| equation context     | the interned `JaxprEqnContext` (compute type, mesh, xla metadata…)     |
| constants            | content: dtype, shape, sharding, bytes; tracers never equal anything   |
| callables in params  | identity (a callback is only "the same" when it is the same object)    |
| custom_jvp rule      | the user's JVP function behind JAX's per-trace thunk (`_compat`)       |

Keys are `StructKey` objects: hashed once (large constants through a content digest), then
compared in full on equal hashes, so a hash collision can never make two programs equal.
Source info and debug info (argument names) are not part of the key: they do not change what
the program computes or how it lowers, only what error messages and profiles say.
"""
from __future__ import annotations

import enum
import hashlib
import struct
from typing import Any

import numpy as np

from .. import _compat as C
from . import repeats

# Literals/params with at most this many elements are keyed by their bytes inline; larger ones
# by a `_Const` (content digest as hash, full byte comparison as equality).
_HASH_SAMPLE = 4096   # elements of a large constant its hash reads
_INLINE_ELEMENTS = 64


class StructKey:
    """A structural key: hash cached, equality = identity, then hash, then the full key."""
    __slots__ = ("key", "_hash")

    def __init__(self, key: tuple):
        self.key = key
        self._hash = None

    def __hash__(self):
        if self._hash is None:
            self._hash = hash(self.key)
        return self._hash

    def __eq__(self, other):
        if self is other:
            return True
        if not isinstance(other, StructKey) or hash(self) != hash(other):
            return False
        return self.key == other.key

    def __repr__(self):
        return f"StructKey({hash(self):#x})"


class _Const:
    """An array value keyed by content: bit-exact (NaN payloads, -0.0), dtype, shape, sharding.
    A broadcast view (`analysis/repeats.py`) is keyed by its core and the axes it repeats along:
    equal to a view of the same pattern, never to the same values held in full."""
    __slots__ = ("value", "meta", "_core", "_bytes", "_hash")

    def __init__(self, value, meta: tuple):
        rep = repeats.repeated_axes(value) if isinstance(value, np.ndarray) else ()
        self.value = value
        self.meta = meta + (("repeats", rep),) if rep else meta
        self._core = repeats.core(value, rep) if rep else value   # (a jax.Array: read lazily)
        self._bytes = None
        self._hash = None

    def data(self) -> bytes:
        if self._bytes is None:
            self._bytes = np.ascontiguousarray(np.asarray(self._core)).tobytes()
        return self._bytes

    def __hash__(self):
        if self._hash is None:
            # an evenly spaced sample: hashing whole folded tables (RubiksCube: megabytes) was
            # most of cse's time; equality still compares every byte
            flat = np.asarray(self._core).reshape(-1)
            if flat.size > _HASH_SAMPLE:
                flat = flat[::flat.size // _HASH_SAMPLE]
            sample = np.ascontiguousarray(flat).tobytes()
            self._hash = hash((self.meta, hashlib.blake2b(sample, digest_size=16).digest()))
        return self._hash

    def __eq__(self, other):
        if self is other:
            return True
        if not isinstance(other, _Const) or self.meta != other.meta:
            return False
        if self.value is other.value:
            return True
        return hash(self) == hash(other) and self.data() == other.data()


class _Ident:
    """Equal only to a wrapper of the very same object (held here, so its id cannot be reused)."""
    __slots__ = ("obj",)

    def __init__(self, obj):
        self.obj = obj

    def __hash__(self):
        return id(self.obj)

    def __eq__(self, other):
        return isinstance(other, _Ident) and other.obj is self.obj


class _Unique:
    """Equal to nothing but itself: tracer constants of an outer trace are never merged."""
    __slots__ = ()


# --- values ------------------------------------------------------------------------------------

_DTYPE_NAMES: dict = {}


def _dtype_name(dtype) -> str:
    """`str(dtype)`, memoised (numpy computes it anew each time, slowly)."""
    name = _DTYPE_NAMES.get(dtype)
    if name is None:
        name = _DTYPE_NAMES[dtype] = str(dtype)
    return name


def _array_key(a, extra=()) -> Any:
    """Key of a numpy/jax array value: inline bytes when small, `_Const` otherwise."""
    arr = a
    meta = (_dtype_name(arr.dtype), tuple(np.shape(arr))) + tuple(extra)
    if np.size(arr) <= _INLINE_ELEMENTS:
        return ("arr", meta, np.ascontiguousarray(np.asarray(arr)).tobytes())
    return _Const(arr, meta)


def const_key(c) -> Any:
    """Key of a constant (a ClosedJaxpr const or a literal's value)."""
    if C.is_tracer(c):
        return _Unique()
    try:
        import jax
        if isinstance(c, jax.Array):
            if not c.is_fully_addressable:
                return _Ident(c)
            return _array_key(c, ("jax", str(c.sharding), getattr(c, "weak_type", None)))
    except Exception:  # noqa: BLE001 - a value we cannot read: keep it by identity
        return _Ident(c)
    if isinstance(c, (np.ndarray, np.generic)):
        if c.dtype == object:
            return _Ident(c)
        return _array_key(c, ("np",))
    return param_key(c, None)


def literal_key(lit, aval_key=C.aval_key) -> Any:
    aval = C.aval_of(lit)
    val = C.literal_value(lit)
    t = type(val)
    if t is bool or t is int:
        return ("lit", aval_key(aval), t.__name__, val)
    if t is float:  # bit pattern: -0.0 and NaN payloads differ
        return ("lit", aval_key(aval), "float", struct.pack("<d", val))
    if isinstance(val, (np.ndarray, np.generic)) and val.ndim == 0 and val.dtype != object:
        return ("lit", aval_key(aval), "np0", _dtype_name(val.dtype), val.tobytes())
    try:
        dtype = getattr(aval, "dtype", None)
        arr = np.asarray(val, dtype=dtype) if isinstance(val, (bool, int, float, complex)) else val
        return ("lit", aval_key(aval), type(val).__name__, const_key(arr))
    except Exception:  # noqa: BLE001 - exotic literal (e.g. a key type): identity
        return ("lit", aval_key(aval), _Ident(val))


def param_key(v, sub) -> Any:
    """Key of one param value; `sub(jaxpr) -> StructKey` keys nested jaxprs."""
    if v is None or isinstance(v, (bool, str, bytes)):
        return v if v is None or isinstance(v, str) else (type(v).__name__, v)
    if isinstance(v, int):
        return ("int", v) if type(v) is int else (type(v).__qualname__, int(v))
    if isinstance(v, float):
        return ("float", struct.pack("<d", v))  # bit pattern: -0.0 and NaN payloads differ
    if isinstance(v, complex):
        return ("complex", struct.pack("<dd", v.real, v.imag))
    if isinstance(v, (C.ClosedJaxpr, C.Jaxpr)):
        return sub(v) if sub is not None else _Ident(v)
    if isinstance(v, enum.Enum):
        return (type(v).__qualname__, v.name)
    if isinstance(v, (tuple, list)):
        return (type(v).__qualname__,) + tuple(param_key(x, sub) for x in v)
    if isinstance(v, dict):
        return ("dict",) + tuple(sorted(((k, param_key(x, sub)) for k, x in v.items()),
                                        key=lambda kv: repr(kv[0])))
    if isinstance(v, (frozenset, set)):
        return ("set", frozenset(param_key(x, sub) for x in v))
    if isinstance(v, np.dtype):
        return ("dtype", str(v))
    if C.is_tracer(v):
        return _Unique()
    if isinstance(v, (np.ndarray, np.generic)):
        return const_key(v)
    try:
        import jax
        if isinstance(v, jax.Array):
            return const_key(v)
    except Exception:  # noqa: BLE001 - a probe: keyed below instead (hash or identity)
        pass
    if callable(v) and not isinstance(v, type):
        return _Ident(v)  # callbacks, thunks: the same only when the same object
    try:
        hash(v)
    except TypeError:
        return _Ident(v)
    return (type(v).__qualname__, v)


# --- jaxprs ------------------------------------------------------------------------------------

class Keyer:
    """Computes structural keys, memoised per jaxpr object (the object is held, so ids stay valid).

    One `Keyer` per pass run: nested jaxprs are keyed once, however often they occur.
    """

    def __init__(self):
        self._memo: dict[int, tuple[Any, StructKey]] = {}
        self._avals: dict[int, tuple[Any, tuple]] = {}
        self._params: dict[int, tuple[dict, tuple]] = {}
        self._literals: dict[int, tuple[Any, Any]] = {}

    def aval(self, aval) -> tuple:
        hit = self._avals.get(id(aval))
        if hit is not None and hit[0] is aval:
            return hit[1]
        k = C.aval_key(aval)
        self._avals[id(aval)] = (aval, k)
        return k

    def __call__(self, j) -> StructKey:
        hit = self._memo.get(id(j))
        if hit is not None and hit[0] is j:
            return hit[1]
        if isinstance(j, C.ClosedJaxpr):
            key = StructKey(("closed", self(j.jaxpr), tuple(const_key(c) for c in j.consts)))
        else:
            key = StructKey(self._jaxpr_key(j))
        self._memo[id(j)] = (j, key)
        return key

    def literal(self, lit) -> Any:
        """`literal_key(lit)`, memoised per Literal object (held; literals are immutable and the
        same objects recur in every round)."""
        hit = self._literals.get(id(lit))
        if hit is not None and hit[0] is lit:
            return hit[1]
        k = literal_key(lit, self.aval)
        self._literals[id(lit)] = (lit, k)
        return k

    def atom(self, a, env: dict) -> Any:
        if C.is_literal(a):
            return self.literal(a)
        n = env.get(a)
        if n is None:  # a free variable (never in a well-formed jaxpr): only itself
            return _Ident(a)
        return n

    def params(self, params: dict) -> tuple:
        # Memoised per params dict (held): rewritten equations (`eqn.replace(invars=...)`) and
        # later rounds share their params dict, and JAX never mutates one.
        hit = self._params.get(id(params))
        if hit is not None and hit[0] is params:
            return hit[1]
        key = tuple(sorted((k, self._param(k, v)) for k, v in params.items()))
        self._params[id(params)] = (params, key)
        return key

    def _param(self, name: str, v):
        if name == "jvp_jaxpr_fun":  # a fresh thunk per trace: key the user's rule behind it
            rule = C.custom_jvp_rule(v)
            if rule is not None:
                return ("jvp_rule", param_key(rule, self))
        return param_key(v, self)

    def eqn_key(self, eqn, in_keys: tuple, drops: bool = True) -> tuple:
        """Everything about `eqn` except its output variables' names (and, with `drops=False`,
        which outputs are dropped: CSE checks that separately)."""
        aval, is_drop = self.aval, C.is_dropvar
        outs = tuple(("drop" if drops and is_drop(v) else "out", aval(v.aval))
                     for v in eqn.outvars)
        effs = eqn.effects
        return (eqn.primitive, self.params(eqn.params) if eqn.params else (), in_keys, outs,
                effs if type(effs) is frozenset else frozenset(effs),
                eqn.ctx)  # ctx: interned, compared by identity

    def _jaxpr_key(self, j) -> tuple:
        env: dict = {}
        aval, literal, is_lit, is_drop = self.aval, self.literal, C.is_literal, C.is_dropvar

        def bind(v):
            env[v] = len(env)
            return aval(v.aval)

        def atom(a):  # `self.atom`, inlined for speed
            if is_lit(a):
                return literal(a)
            n = env.get(a)
            return _Ident(a) if n is None else n

        consts = tuple(bind(v) for v in j.constvars)
        ins = tuple(bind(v) for v in j.invars)
        eqns = []
        for eqn in j.eqns:
            eqns.append(self.eqn_key(eqn, tuple(atom(a) for a in eqn.invars)))
            for v in eqn.outvars:
                if not is_drop(v):
                    env[v] = len(env)
        outs = tuple(atom(a) for a in j.outvars)
        return ("jaxpr", consts, ins, tuple(eqns), outs, frozenset(j.effects))


def shared_keyer(ctx) -> Keyer:
    """The `Keyer` of this rewrite (kept in `ctx.cache`: dedup and CSE, every round, key each
    nested jaxpr object once); a fresh one without a context."""
    cache = getattr(ctx, "cache", None)
    if cache is None:
        return Keyer()
    return cache.setdefault("structural.keyer", Keyer())


def structural_key(j, keyer: Keyer | None = None) -> StructKey:
    """The structural key of a Jaxpr or ClosedJaxpr (see module doc)."""
    return (keyer or Keyer())(j)


def same_structure(a, b) -> bool:
    """Whether `a` and `b` are the same program up to variable renaming."""
    k = Keyer()
    return k(a) == k(b)
