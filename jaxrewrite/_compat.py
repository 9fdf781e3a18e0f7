"""The one module that touches JAX internals.

Everything version-dependent lives here: where `Jaxpr`/`ClosedJaxpr`/`Var`/`Literal` come from,
the name of the `jit` primitive (`jit_p` since JAX 0.7, `pjit_p` before), how constants appear
(constvars holding numpy arrays, or array literals), how a function is traced to a jaxpr and how a
jaxpr is evaluated back into the current trace. Every other module imports these names from here.

Supported: JAX >= 0.7.0 (the declared floor, smoke-tested in `.ci/run`).
"""
from __future__ import annotations

import inspect
import os
import threading as _threading
import warnings
import weakref
from typing import Any, Callable, Iterator, Sequence

import jax
import numpy as np
from jax._src import core as _core
from jax._src import source_info_util as _siu
from jax._src import effects as _effects

JAX_VERSION = tuple(int(p) for p in jax.__version__.split(".")[:3] if p.isdigit())

Jaxpr = _core.Jaxpr
ClosedJaxpr = _core.ClosedJaxpr
JaxprEqn = _core.JaxprEqn
Var = _core.Var
Literal = _core.Literal
DropVar = _core.DropVar
Primitive = _core.Primitive
ShapedArray = _core.ShapedArray
Tracer = _core.Tracer
AbstractValue = _core.AbstractValue

# `pjit_p` was renamed `jit_p` in JAX 0.7; both names may exist for a while.
try:  # JAX >= 0.7
    from jax._src.pjit import jit_p
except ImportError:  # pragma: no cover - JAX < 0.7
    from jax._src.pjit import pjit_p as jit_p

from jax._src.lax import lax as _lax_mod  # noqa: E402  (primitive table below)
from jax._src.lax import slicing as _slicing  # noqa: E402
from jax._src.lax import control_flow as _cf  # noqa: E402

gather_p = _slicing.gather_p
scatter_p = _slicing.scatter_p
scatter_add_p = _slicing.scatter_add_p
scatter_mul_p = _slicing.scatter_mul_p
scatter_min_p = _slicing.scatter_min_p
scatter_max_p = _slicing.scatter_max_p
dynamic_slice_p = _slicing.dynamic_slice_p
dynamic_update_slice_p = _slicing.dynamic_update_slice_p
GatherDimensionNumbers = _slicing.GatherDimensionNumbers
ScatterDimensionNumbers = _slicing.ScatterDimensionNumbers
GatherScatterMode = _slicing.GatherScatterMode
scan_p = _cf.scan_p
while_p = _cf.while_p
cond_p = _cf.cond_p

try:
    from jax._src.ad_checkpoint import remat_p
except ImportError:  # pragma: no cover
    remat_p = None
try:
    from jax._src.custom_derivatives import custom_jvp_call_p, custom_vjp_call_p
except ImportError:  # pragma: no cover
    custom_jvp_call_p = custom_vjp_call_p = None
closed_call_p = getattr(_core, "closed_call_p", None)

# Primitives whose result depends on hidden state, not only on operands: never merged by CSE,
# never folded. (`rng_uniform` draws from XLA's own generator; `rng_bit_generator` is pure.)
STATEFUL_PRIMITIVE_NAMES = frozenset({"rng_uniform", "iota_32x2_shape"})


# --- structure -----------------------------------------------------------------------------------

def new_var(aval) -> Var:
    return Var(aval)


def new_eqn(invars, outvars, primitive, params, effects=None, source_info=None, ctx=None) -> JaxprEqn:
    if effects is None:
        effects = _core.no_effects
    return _core.new_jaxpr_eqn(list(invars), list(outvars), primitive, params, effects,
                               source_info, ctx)


def literal(value, aval=None) -> Literal:
    """An (array or scalar) literal. JAX >= 0.7 lowers array literals as constants."""
    if aval is None:
        aval = ShapedArray(np.shape(value), np.asarray(value).dtype)
    return Literal(value, aval)


def is_literal(atom) -> bool:
    return isinstance(atom, Literal)


def is_dropvar(atom) -> bool:
    return isinstance(atom, DropVar)


def literal_value(atom):
    return atom.val


def aval_of(atom):
    return atom.aval


def closed(jaxpr: Jaxpr, consts: Sequence = ()) -> ClosedJaxpr:
    return ClosedJaxpr(jaxpr, list(consts))


def new_jaxpr(invars, eqns, outvars, name: str = "jaxrewrite") -> Jaxpr:
    """A jaxpr of `eqns` (no constvars), effects joined from the equations; `name` is what its
    debug info says it was traced for."""
    effs = _core.join_effects(*(e.effects for e in eqns)) if eqns else _core.no_effects
    di = _core.DebugInfo("jaxrewrite", name, tuple("" for _ in invars),
                         tuple("" for _ in outvars))
    return Jaxpr([], list(invars), list(outvars), list(eqns), effs, di)


def replace_jaxpr(jaxpr: Jaxpr, **kw) -> Jaxpr:
    """`Jaxpr.replace`, recomputing effects from the equations when they change."""
    if "eqns" in kw and "effects" not in kw:
        kw["effects"] = join_effects(jaxpr, kw["eqns"])
    return jaxpr.replace(**kw)


def join_effects(jaxpr: Jaxpr, eqns) -> Any:
    """Effects of a jaxpr with `eqns`: the equations' effects, minus those on local binders."""
    effs = _core.join_effects(*(e.effects for e in eqns)) if eqns else _core.no_effects
    # Input effects (refs passed in) are indexed by invar position; keep the original ones.
    keep = {e for e in jaxpr.effects if isinstance(e, _effects.JaxprInputEffect)}
    return frozenset(e for e in effs if not isinstance(e, _effects.JaxprInputEffect)) | keep


def eqn_typing_error(eqn) -> str | None:
    """Why `eqn` is ill typed (its literals, its primitive's typing rule on its operands' avals
    against its results' avals, as `check_jaxpr` checks each equation), or None. Nested jaxprs
    are checked where the primitive's own rule checks them (jit, scan, while, cond)."""
    if any(is_varying(v.aval) for v in (*eqn.invars, *eqn.outvars)):
        return None   # typed under its shard_map body's manual mesh only (traced there)
    try:
        for a in eqn.invars:
            if isinstance(a, Literal) and not _core.typecheck(a.aval, a.val):
                return f"{eqn.primitive.name}: a literal does not match its type {a.aval}"
        prim = eqn.primitive

        def ctx_factory():
            return _core.JaxprPpContext(), _core.JaxprPpSettings()
        with eqn.ctx.manager:
            if prim in _core.custom_typechecks:
                out, _ = _core.custom_typechecks[prim](ctx_factory, *eqn.invars, **eqn.params)
            elif prim.call_primitive:
                out, _ = _core._check_call(ctx_factory, prim, eqn.invars, eqn.params)
            else:
                out, _ = _core.check_eqn(prim, [a.aval for a in eqn.invars], eqn.params)
        out = [getattr(o, "aval", o) for o in out]
        if len(out) != len(eqn.outvars):
            return f"{prim.name}: {len(out)} results for {len(eqn.outvars)} binders"
        for v, o in zip(eqn.outvars, out):
            if not _core.typematch(v.aval, o):
                return f"{prim.name}: a result typed {o} is bound as {v.aval}"
    except Exception as e:  # noqa: BLE001 - the typing rule's own complaint
        return f"{eqn.primitive.name}: {type(e).__name__}: {e}"
    return None


def check_jaxpr(jaxpr) -> None:
    """Raise `JaxprTypeError` if `jaxpr` (open or closed) is not well typed."""
    j = jaxpr.jaxpr if isinstance(jaxpr, ClosedJaxpr) else jaxpr
    _core.check_jaxpr(j)


JAXPR_TYPES = (ClosedJaxpr, Jaxpr)  # what a param holding a jaxpr holds


def params_jaxprs(params) -> Iterator[tuple[str, int | None, Any]]:
    """(param name, index in a tuple or None, jaxpr) for every jaxpr held in `params`.

    Covers ClosedJaxpr and Jaxpr values and tuples of them (`cond`'s `branches`), which is where
    jit, scan, while, cond, remat, custom_jvp_call (`call_jaxpr`; its `jvp_jaxpr_fun` is a thunk
    kept as is), custom_vjp_call (`call_jaxpr`; fwd/bwd are thunks), closed_call and shard_map
    carry their bodies.
    """
    for name, val in params.items():
        if isinstance(val, JAXPR_TYPES):
            yield name, None, val
        elif (type(val) is tuple and val and isinstance(val[0], JAXPR_TYPES)
              and all(isinstance(v, JAXPR_TYPES) for v in val)):
            for i, v in enumerate(val):
                yield name, i, v


def replace_params_jaxprs(params, new: dict[tuple[str, int | None], Any]):
    """`params` with the jaxprs at the given (name, index) keys replaced."""
    out = dict(params)
    for (name, i), v in new.items():
        if i is None:
            out[name] = v
        else:
            t = list(out[name])
            t[i] = v
            out[name] = tuple(t)
    return out


# --- jit equations: per-argument params kept in step with invars ----------------------------------

JIT_PER_ARG_PARAMS = ("in_shardings", "in_layouts", "donated_invars")
JIT_PER_OUT_PARAMS = ("out_shardings", "out_layouts")


def is_jit(eqn) -> bool:
    return eqn.primitive is jit_p


def unspecified_sharding():
    from jax._src.sharding_impls import UNSPECIFIED
    return UNSPECIFIED


def register_cache(cache, for_what: str):
    """Have `jax.clear_caches()` clear `cache` (an `lru_cache` of traces) along with JAX's own
    staging caches, so a compile timed after it is cold here too. Returns `cache`."""
    try:
        from jax._src.util import register_cache as register
    except ImportError:  # a JAX without the registry: the cache lives until the process ends
        return cache
    register(cache, for_what)
    return cache


def replicated(sharding) -> bool:
    """A primitive's `sharding`/`out_sharding` param that constrains nothing: None, or a spec with
    every dimension unpartitioned (what every op carries once a mesh is set, e.g. by NetKet's
    `jax.sharding.set_mesh`). The value is the same on every device, so a rewrite may drop it."""
    if sharding is None:
        return True
    spec = getattr(sharding, "spec", None)
    return (spec is not None and all(d is None for d in spec)
            and not getattr(spec, "unreduced", None) and not getattr(spec, "reduced", None))


def jit_params_for_args(params, keep_in: Sequence[bool] | None = None,
                        keep_out: Sequence[bool] | None = None, **new):
    """A jit equation's params after dropping inputs/outputs (`keep_*` masks), with `new` set."""
    out = dict(params, **new)
    if keep_in is not None:
        for k in JIT_PER_ARG_PARAMS:
            out[k] = tuple(v for v, keep in zip(params[k], keep_in) if keep)
    if keep_out is not None:
        for k in JIT_PER_OUT_PARAMS:
            out[k] = tuple(v for v, keep in zip(params[k], keep_out) if keep)
    return out


def jit_params_append_args(params, n: int):
    """A jit equation's params after appending `n` plain (unsharded, undonated) inputs."""
    out = dict(params)
    out["in_shardings"] = tuple(params["in_shardings"]) + (unspecified_sharding(),) * n
    out["in_layouts"] = tuple(params["in_layouts"]) + (None,) * n
    out["donated_invars"] = tuple(params["donated_invars"]) + (False,) * n
    return out


def make_jit_eqn(invars, outvars, jaxpr: ClosedJaxpr, name: str, source_info=None, ctx=None):
    """A fresh `jit` equation calling `jaxpr` with default per-argument params."""
    u = unspecified_sharding()
    params = dict(jaxpr=jaxpr, in_shardings=(u,) * len(invars), out_shardings=(u,) * len(outvars),
                  in_layouts=(None,) * len(invars), out_layouts=(None,) * len(outvars),
                  donated_invars=(False,) * len(invars), ctx_mesh=_empty_mesh(), name=name,
                  keep_unused=False, inline=False, compiler_options_kvs=())
    return new_eqn(invars, outvars, jit_p, params, jaxpr.effects, source_info, ctx)


def _empty_mesh():
    from jax._src import mesh as mesh_lib
    return mesh_lib.get_abstract_mesh()


# --- effects -------------------------------------------------------------------------------------

def has_effects(eqn) -> bool:
    return bool(eqn.effects)


def is_stateful(eqn) -> bool:
    return eqn.primitive.name in STATEFUL_PRIMITIVE_NAMES


# --- source info ---------------------------------------------------------------------------------

_PKG_DIR = os.path.dirname(os.path.abspath(__file__))
_siu.register_exclusion(_PKG_DIR)  # jaxrewrite's own frames are not the user's line


_JAX_DIRS = tuple(os.path.dirname(os.path.abspath(m.__file__)) + os.sep
                  for m in (jax, np) if getattr(m, "__file__", None))


def user_stacklevel() -> int:
    """`warnings.warn(..., stacklevel=user_stacklevel())`, called in a function of jaxrewrite,
    names the first frame outside jaxrewrite, JAX and numpy: the user's line that called the
    program, however deep in JAX's dispatch the warning is raised."""
    import sys
    frame, level = sys._getframe(1), 1
    while frame is not None and frame.f_code.co_filename.startswith((_PKG_DIR + os.sep,
                                                                     *_JAX_DIRS)):
        frame, level = frame.f_back, level + 1
    return level


def user_location(eqn) -> str | None:
    """`file.py:line` of the user's frame that produced `eqn`, or None."""
    return source_location(eqn.source_info)


def source_location(si) -> str | None:
    """`file.py:line` of the user's frame in an equation's source info, or None."""
    if si is None or si.traceback is None:
        return None
    frame = _siu.user_frame(si.traceback)
    if frame is None:
        return None
    return f"{os.path.basename(frame.file_name)}:{frame.start_line}"


# --- tracing and evaluation ------------------------------------------------------------------------

def trace(flat_fun: Callable, flat_args: Sequence) -> ClosedJaxpr:
    """Trace `flat_fun(*flat_args) -> list` to a ClosedJaxpr.

    `flat_args` may be tracers of an enclosing `jax.jit` trace: only their avals (weak types
    included) are used. Values the function closes over that belong to an enclosing trace become
    constants of the jaxpr; they are tracers and are never folded or merged.
    """
    return jax.make_jaxpr(flat_fun)(*flat_args)


def name_like(flat_fun: Callable, fun: Callable, args: Sequence, kwargs: dict,
              dyn: Sequence[int]) -> Callable:
    """Give `flat_fun` (called with the dynamic leaves `dyn` of `(args, kwargs)`) the debug
    info `jax.jit(fun)` would have, so errors raised while tracing it (a tracer used as a bool,
    ...) name the user's function and argument names, not jaxrewrite's wrapper."""
    from jax._src import api_util
    try:
        dbg = api_util.debug_info("jit", fun, args, kwargs)
        names = dbg.arg_names
        if names is None or len(names) != len(jax.tree_util.tree_leaves((args, kwargs))):
            return flat_fun
        api_util.save_wrapped_fun_debug_info(
            flat_fun, dbg._replace(arg_names=tuple(names[i] for i in dyn)))
    except Exception:  # noqa: BLE001 - debug info is a nicety; never fail a trace over it
        pass
    return flat_fun


def trace_avals(fun: Callable, avals: Sequence, ctx=None) -> ClosedJaxpr:
    """Trace `fun` on abstract values (used by rewrites to build replacement equations).

    `ctx` is the context of the equation being replaced: inside a `shard_map` body with
    `check_vma`, operands carry varying manual axes (`f32[4]{V:i}`) that only trace right under
    that body's manual mesh, so such avals are traced there, as they are (see `_trace_manual`).
    """
    if ctx is not None and any(_varying(a) for a in avals):
        return _trace_manual(fun, avals, ctx)
    if all(type(a) is _core.ShapedArray for a in avals):
        # traced straight to a jaxpr: `jax.make_jaxpr` wraps the function in a `jit` trace
        # first, twice the time for the one- or two-equation forms rewrites emit in hundreds
        from jax._src import api_util
        from jax._src import linear_util as lu
        from jax._src.interpreters import partial_eval as pe
        dbg = api_util.debug_info("jaxrewrite", fun, avals, {})
        jaxpr, _, consts = pe.trace_to_jaxpr_dynamic(lu.wrap_init(fun, debug_info=dbg),
                                                     list(avals))
        return ClosedJaxpr(jaxpr, consts)
    specs = [jax.ShapeDtypeStruct(a.shape, a.dtype, weak_type=getattr(a, "weak_type", False))
             for a in avals]
    return jax.make_jaxpr(fun)(*specs)


def is_varying(aval) -> bool:
    """Whether `aval` varies over manual mesh axes (it traces only under its shard_map body)."""
    return bool(_varying(aval))


def _varying(aval) -> frozenset:
    mat = getattr(aval, "manual_axis_type", None)
    if mat is None:  # JAX < 0.8 (at least 0.7.0): the varying manual axes are `aval.vma`
        return getattr(aval, "vma", frozenset()) or frozenset()
    return getattr(mat, "varying", frozenset()) or frozenset()


def _trace_manual(fun: Callable, avals: Sequence, ctx) -> ClosedJaxpr:
    """Trace `fun` on `avals` (with their varying manual axes) under `ctx`'s manual mesh, with
    vma checking on, as `shard_map` traces its body; JAX then inserts the `pvary`s it needs."""
    from jax._src import api_util, config, mesh as mesh_lib
    from jax._src import linear_util as lu
    from jax._src.interpreters import partial_eval as pe
    mesh = ctx.cur_abstract_mesh
    dbg = api_util.debug_info("jaxrewrite", fun, avals, {})
    with config._check_vma(True), mesh_lib.use_abstract_mesh(mesh), \
            _core.extend_axis_env_nd(mesh.shape.items()):
        jaxpr, _, consts = pe.trace_to_jaxpr_dynamic(lu.wrap_init(fun, debug_info=dbg), list(avals))
    return ClosedJaxpr(jaxpr, consts)


def eval_jaxpr(cj: ClosedJaxpr, *args) -> list:
    """Evaluate `cj` in the current trace (inside `jax.jit`, this stages its equations out).

    Inside `jax.jit`'s own trace the equations are emitted as they are (`_emit_into_trace`):
    binding each one again would re-run abstract evaluation and staging rules that only
    rebuild the same equation (a third of optimize's trace at 100k equations).
    """
    trace = _emit_target(cj, args)
    if trace is None:
        return _core.eval_jaxpr(cj.jaxpr, cj.consts, *args)
    return _emit_into_trace(trace, cj, args)


def _emit_target(cj: ClosedJaxpr, args):
    """The jit trace that `args` belong to, when `cj` can be emitted into it directly."""
    from jax._src.interpreters import partial_eval as pe
    trace = getattr(_core.trace_ctx, "trace", None)
    if (not isinstance(trace, pe.DynamicJaxprTrace) or not hasattr(trace, "emit_eqn")
            or not all(isinstance(a, pe.DynamicJaxprTracer) and a._trace is trace for a in args)):
        return None
    # Effects that name an input (state refs) are renumbered by `bind`; so are values with
    # mutable state: leave both to it.
    if any(isinstance(e, _effects.JaxprInputEffect) for e in cj.jaxpr.effects):
        return None
    if any(getattr(v.aval, "has_qdd", False) for v in cj.jaxpr.invars):
        return None
    return trace


def _emit_into_trace(trace, cj: ClosedJaxpr, args) -> list:
    """Each equation of `cj` added to `trace` with its params, effects, context and source line
    (name stack under the current one), as `jax.core.eval_jaxpr` would stage it."""
    from jax._src.interpreters import partial_eval as pe
    here = _siu.current()
    env = dict(zip(cj.jaxpr.invars, args))
    for v, c in zip(cj.jaxpr.constvars, cj.consts):
        env[v] = trace.new_const(c, source_info=here)

    def read(a, src):
        if isinstance(a, _core.Literal):
            return pe.DynamicJaxprTracer(trace, a.aval, a, src)
        return env[a]

    for eqn in cj.jaxpr.eqns:
        src = eqn.source_info.replace(name_stack=here.name_stack + eqn.source_info.name_stack)
        ins = [read(a, src) for a in eqn.invars]
        outs = trace.emit_eqn(ins, [v.aval for v in eqn.outvars], eqn.primitive, eqn.params,
                              eqn.effects, src, eqn.ctx)
        for v, t in zip(eqn.outvars, outs):
            env[v] = t
    return [read(a, here) for a in cj.jaxpr.outvars]


def sharding_devices(s) -> int:
    """Devices a sharding or mesh (concrete or abstract) spans; 1 for anything else."""
    mesh = s if hasattr(s, "axis_names") and hasattr(s, "size") else getattr(s, "mesh", None)
    try:
        size = int(getattr(mesh, "size", 0) or 0)
        if size:
            return size
        devs = getattr(s, "device_set", None)
        return max(1, len(devs)) if devs else 1
    except Exception:  # noqa: BLE001 - a probe: an object we cannot size makes no claim (1); at
        return 1       # worst CSE runs where the partitioned check would decline it: never wrong


def leaves(tree) -> list:
    """The leaves of a pytree of shardings (None is a leaf here, and ignored)."""
    return [x for x in jax.tree_util.tree_leaves(tree, is_leaf=lambda x: x is None)
            if x is not None]


def is_tracer(x) -> bool:
    return isinstance(x, Tracer)


def is_foldable_const(x) -> bool:
    """A constant whose value is known now (numpy, or a concrete jax Array): never a tracer."""
    if isinstance(x, Tracer):
        return False
    if isinstance(x, jax.Array):  # a single-device array only: never move sharded data
        return x.is_fully_addressable and len(x.sharding.device_set) == 1
    return isinstance(x, (np.ndarray, np.generic))


def abstract_eval(primitive, avals, **params):
    """Output avals of `primitive` applied to `avals` (a list, also for single results)."""
    out, _effs = primitive.abstract_eval(*avals, **params)
    return list(out) if primitive.multiple_results else [out]


def aval_key(aval) -> tuple:
    """What about an aval changes a trace: shape, dtype, weak type, sharding, memory space."""
    return (type(aval).__name__, getattr(aval, "shape", None), str(getattr(aval, "dtype", None)),
            getattr(aval, "weak_type", None), str(getattr(aval, "sharding", "")),
            str(getattr(aval, "memory_space", "")))


def signature_difference(before: ClosedJaxpr, after: ClosedJaxpr) -> str | None:
    """Where `after` takes or gives other values than `before` (count, shape, dtype, weak type,
    sharding, memory space of each input and output), said for a warning; None: the same."""
    for side, a, b in (("input", before.jaxpr.invars, after.jaxpr.invars),
                       ("output", before.jaxpr.outvars, after.jaxpr.outvars)):
        if len(a) != len(b):
            return f"{len(a)} {side}s became {len(b)}"
        for i, (u, v) in enumerate(zip(a, b)):
            if u is v or u.aval is v.aval:  # (most are: a rewrite keeps inputs, and avals)
                continue
            ku, kv = aval_key(u.aval), aval_key(v.aval)
            if ku != kv:
                what = [n for n, x, y in zip(_AVAL_KEY_PARTS, ku, kv) if x != y]
                return f"{side} {i}: {u.aval} became {v.aval} ({', '.join(what)})"
    return None


_AVAL_KEY_PARTS = ("kind", "shape", "dtype", "weak type", "sharding", "memory space")


def enable_x64(flag: bool = True):
    """Context manager: 64-bit mode on/off (`jax.enable_x64`; JAX < 0.8: jax.experimental's)."""
    fn = getattr(jax, "enable_x64", None)
    if fn is None:  # JAX < 0.8 (at least 0.7.0): only `jax.experimental.enable_x64`
        from jax.experimental import enable_x64 as fn
    return fn(flag)


def x64_enabled() -> bool:
    return bool(jax.config.jax_enable_x64)


def is_extended_dtype(dtype) -> bool:
    """Whether `dtype` is one of JAX's extended dtypes (PRNG keys), which numpy cannot hold."""
    try:
        np.dtype(dtype)
        return False
    except TypeError:
        return True


# --- added for constant folding (fold pass) ------------------------------------------------------

def filtered_debug_info(jaxpr: Jaxpr, keep_in: Sequence[bool] | None = None,
                        keep_out: Sequence[bool] | None = None):
    """`jaxpr.debug_info` after dropping inputs/outputs (`keep_*` masks), names kept in step."""
    di = jaxpr.debug_info
    if di is None:
        return None
    kw = {}
    if keep_in is not None:
        kw["arg_names"] = di.filter_arg_names(keep_in)
    if keep_out is not None:
        kw["result_paths"] = di.filter_result_paths(keep_out)
    return di._replace(**kw)


def eval_primitive_on_cpu(primitive, values: Sequence, params) -> list:
    """Apply `primitive` to concrete numpy `values` now, on the CPU, whatever trace is current.

    XLA's own semantics (shifts by the bit width, division by zero, overflow), not numpy's.
    Compiled with the values as arguments: JAX's eager path constant-folds integer division by
    zero on the host and crashes the process (SIGFPE) in jax 0.10.

    Placement goes through JAX's config state (`jax._src.config.default_device`) and arguments
    committed to the CPU device, never through attributes of the `jax` module: a library may
    assign `jax.default_device = jax.devices()[0]` (xlb does), which made the context manager
    call a TypeError and silently stopped folding for the rest of the process.
    """
    from jax._src import config as jax_config  # config states, not attributes of `jax`
    cpu = jax.devices("cpu")[0]
    try:
        key = (primitive, tuple(sorted(params.items())))
        hash(key)
    except TypeError:
        key = None
    fn = _EVAL_CACHE.get(key) if key is not None else None
    if fn is None:
        fn = jax.jit(lambda *a: primitive.bind(*a, **params))
        if key is not None:
            _EVAL_CACHE[key] = fn
    with _core.ensure_compile_time_eval(), jax_config.default_device(cpu):
        args = [jax.device_put(v, cpu) for v in values]
        out = fn(*args)
    outs = list(out) if primitive.multiple_results else [out]
    return [np.asarray(o) for o in outs]


_EVAL_CACHE: dict = {}


# --- added for data-movement passes (movement, scalarize) --------------------------------------

def lax_primitive(name: str):
    """The lax primitive called `name` ('slice', 'reshape', 'stack', ...), or None if this JAX
    has none (`stack`/`unstack` are recent primitives: scalarize does nothing without them)."""
    for mod in (_lax_mod, _slicing):
        p = getattr(mod, f"{name}_p", None)
        if isinstance(p, Primitive):
            return p
    return None


# --- added for structural identity (dedup/cse) -----------------------------------------------------

def _closure_cells(fn) -> dict:
    return {n: c.cell_contents for n, c in zip(fn.__code__.co_freevars, fn.__closure__ or ())}


def custom_jvp_rule(jvp_jaxpr_fun):
    """What a `custom_jvp_call`'s `jvp_jaxpr_fun` thunk stands for, as comparable parts.

    JAX makes a fresh thunk per trace (a memoized closure over the user's JVP rule as a
    `WrappedFun`), so two traces of one `custom_jvp` function never share it. Returns
    (rule function, ((transformation, static args), ...), params) with the per-trace aux-store
    lambdas left out, or None when the thunk does not have the expected shape (then callers
    compare it by identity). Read from jax/_src/interpreters/partial_eval.py
    (`process_custom_jvp_call`), JAX 0.10.
    """
    try:
        thunk = _closure_cells(jvp_jaxpr_fun.f)["fn"]
        jvp = _closure_cells(thunk)["jvp"]
        transforms = tuple(
            (gen, tuple(a for a in args
                        if not (callable(a) and getattr(a, "__qualname__", "").startswith(
                            "transformation_with_aux2.<locals>"))))
            for gen, args in jvp.transforms)
        return jvp.f, transforms, tuple(jvp.params)
    except Exception:  # noqa: BLE001 - another JAX version: identity comparison is the fallback
        return None


# --- the switch: every outermost jax.jit traced through a rewrite (`_switch.py`) ------------------
#
# `jax.jit(f)` (jax/_src/api.py) returns `pjit._cpp_pjit(f, jit_info)`: a C++ `PjitFunction` whose
# cache misses, `.trace`, `.lower` and `.eval_shape` all reach `pjit._infer_params`, which calls
# the module-level `pjit._trace_for_jit(f, jit_info, ...)` to trace `f`. That call is the one
# place every jit's trace passes through, whenever and however the jit object was made (held
# since import, `from jax import jit`, nnx.jit, eqx.filter_jit): the hook replaces `f` there and
# leaves the jit object, its type and its attributes as they are. Read from JAX 0.10.2.
#
# The switch's value is a JAX config state included in the jit key and the trace context, as
# JAX's own contexts are (`jax.default_matmul_precision`): the C++ dispatch cache and the trace
# caches are keyed by it, so a function traced with the switch on is traced again with it off (and
# the other way round), and a thread-local value (`with jaxrewrite.enabled():`) is per thread.

_SWITCH = None  # the config state, made on first use: None (off) or the switch's Options


def _switch_state(create: bool = False):
    """JAX 0.10's config state constructor (jaxlib's `config_ext.Config`); None until the switch
    is first turned on, and on a JAX whose constructor differs (then `enable` says so)."""
    global _SWITCH
    if _SWITCH is None and create:
        from jax._src.config import config_ext
        _SWITCH = config_ext.Config("jaxrewrite_switch", None, include_in_jit_key=True,
                                    include_in_trace_context=True)
    return _SWITCH


def switch_install() -> None:
    """Make the switch's config state (under the caller's lock: once)."""
    _switch_state(create=True)


_NO_STATE = object()  # what switch_swap_local returns before the state exists


def switch_swap_local(value):
    """Set this thread's switch value; returns the previous one, for `switch_set_local`."""
    state = _switch_state()
    return state.swap_local(value) if state is not None else _NO_STATE


def switch_set_local(previous) -> None:
    state = _switch_state()
    if state is not None:
        if previous is _NO_STATE:  # made meanwhile: this thread had no value of its own
            from jax._src.config import config_ext
            previous = config_ext.unset
        state.set_local(previous)


def switch_set_global(value) -> None:
    state = _switch_state()
    if state is not None:
        state.set_global(value)


def switch_value():
    state = _switch_state()
    return state.value if state is not None else None


# The hook point and the config state's `include_in_trace_context` are JAX >= 0.9's (read from the
# jax-v0.7.0 ... v0.10.2 tags: `_trace_for_jit` first appears in 0.9.0).
SWITCH_MIN_JAX = (0, 9, 0)


def has_jit_trace_hook() -> bool:
    from jax._src import pjit as _pjit
    return callable(getattr(_pjit, "_trace_for_jit", None))


def hook_jit_trace(hook: Callable) -> bool:
    """Route every `jax.jit` trace through `hook(trace, fun, jit_info)`, where `trace(g)` traces
    `g` in `fun`'s place, exactly as JAX would have traced `fun`. Installed once; False if this
    JAX has no `_trace_for_jit` to hook."""
    from jax._src import pjit as _pjit
    original = getattr(_pjit, "_trace_for_jit", None)
    if original is None:  # pragma: no cover - another JAX: the switch is not available
        return False
    if getattr(original, "__jaxrewrite_hook__", None) is hook:
        return True
    original = getattr(original, "__wrapped__", original)

    def _trace_for_jit(fun, jit_info, *rest, **kw):
        return hook(lambda g: original(g, jit_info, *rest, **kw), fun, jit_info)

    _trace_for_jit.__wrapped__ = original
    _trace_for_jit.__jaxrewrite_hook__ = hook
    _pjit._trace_for_jit = _trace_for_jit
    return True


# --- compile options a rewrite asks for --------------------------------------------------------
#
# Some forms the passes make compile better under a non-default XLA option (`backend/
# compile_options.py`). `jax.jit` fixes its `compiler_options` when it is made, before the rewrite
# has seen the program; what the jit lowers and compiles with is the params that
# `pjit._infer_params` returns (traced once, then cached: `PjitParams.params
# ["compiler_options_kvs"]`). One wrapper of `_infer_params` does it all, and adds one Python
# frame per nested jit (programs of 100 nested jits trace within Python's recursion limit):
# - it keeps, per thread, the jits whose params are being inferred (a nested jit's above its
#   caller's);
# - the rewrite of a jit's own function asks for options on the innermost one (not on a
#   caller's: whether a nested trace runs or comes from JAX's cache must not change the
#   caller's options); they are kept against the traced jaxpr;
# - where the jit is called outermost, they are added to a copy of its params (JAX rejects
#   options on a nested jit, and the cached params serve both uses). An option the jit was given
#   is left as it is.

_TRACING = _threading.local()  # .frames: [jit's function, options asked for, fallback]
_WANTED: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()  # traced jaxpr -> options
_INSTALL = _threading.Lock()


def install_jit_trace() -> bool:
    """Put jaxrewrite's wrapper around `pjit._infer_params` (once). False if this JAX has no
    `_trace_for_jit` (JAX < 0.9, whose params we have not read)."""
    from jax._src import pjit as _pjit
    with _INSTALL:
        infer = getattr(_pjit, "_infer_params", None)
        if not has_jit_trace_hook() or infer is None:  # pragma: no cover - JAX < 0.9
            return False
        if getattr(infer, "__jaxrewrite_hook__", False):
            return True

        def _infer_params(fun, jit_info, *rest, **kw):
            frames = getattr(_TRACING, "frames", None)
            if frames is None:
                frames = _TRACING.frames = []
            frame = [fun, None, None]
            frames.append(frame)
            try:
                result = infer(fun, jit_info, *rest, **kw)
            finally:
                frames.pop()
            if frame[1] is None and frame[2] is None and not _WANTED:
                return result
            params, args = result  # (PjitParams, flat args), as JAX 0.9-0.10 return them
            jaxpr = params.params.get("jaxpr")
            if frame[2] is not None and jaxpr is not None:
                _keep_lowering_fallback(jaxpr, *frame[2])
            if frame[1] is not None and jaxpr is not None:
                _WANTED[jaxpr] = frame[1]
            wanted = _WANTED.get(jaxpr) if jaxpr is not None else None
            if wanted and is_outermost_trace():
                return _with_compile_options(params, wanted), args
            return result

        _infer_params.__wrapped__ = infer
        _infer_params.__jaxrewrite_hook__ = True
        _pjit._infer_params = _infer_params
        return True


def _tracing_frame(fun):
    """The innermost jit being traced in this thread, where it traces `fun` (`optimize`) or
    the function `fun` wraps (the switch traces `fun` in its place); else None."""
    frames = getattr(_TRACING, "frames", None)
    if not frames or not (frames[-1][0] is fun or frames[-1][0] is getattr(fun, "__wrapped__",
                                                                           None)):
        return None
    return frames[-1]


def request_compile_options(fun, options: dict) -> bool:
    """Ask that the jit tracing `fun` be compiled with `options` (XLA debug options) wherever
    it is called outermost. True if the innermost jit being traced in this thread is `fun`'s."""
    frame = _tracing_frame(fun)
    if frame is None:
        return False
    frame[1] = dict(options)
    return True


# --- a rewritten program that fails to lower or compile: the next program in its place ---------
#
# The rewrite runs inside jax.jit's trace; what JAX lowers later is the jit's own jaxpr, made
# from the rewritten program. The rewrite registers the program it started from on the jit being
# traced (`request_lowering_fallback`); the `_infer_params` wrapper keeps it against that jit's
# traced jaxpr (`_FALLBACK`), where the two take and give the same values. Every call and every
# `.lower()` of a jit reaches `pjit._resolve_and_lower(args, jaxpr, ...)` (read from JAX 0.10.2:
# `_pjit_call_impl_python`, `stages.Traced.lower`); its wrapper (`install_lowering_guard`) asks
# `on_failure(jaxpr, err, stage)` for the program to lower instead where lowering raises, or
# where compiling a registered program does (`stage` says which), and lowers that. The program
# given may be registered in its turn (`keep_lowering_candidate`: the rewrite again without the
# pass laid at the failure), so one that fails leads to the next; none is tried twice in one
# lowering, and the chain ends at a program that is not registered (the original). A jaxpr that
# failed once is lowered as its replacement (the last in its chain) straight away after.

_FALLBACK: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()  # jaxpr -> (original, info)
_INSTEAD: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()   # failed jaxpr -> replacement


def request_lowering_fallback(fun, original: ClosedJaxpr, info) -> bool:
    """Where the jit being traced for `fun` (as `request_compile_options` finds it) later fails
    to lower or compile, `on_failure` is asked for the program to lower instead; `original`
    (the program as traced, before the rewrite) and `info` go to it; `info=None` takes an
    earlier request back. True if that jit was found."""
    frame = _tracing_frame(fun)
    if frame is None:
        return False
    frame[2] = None if info is None else (original, info)
    return True


def _keep_lowering_fallback(jaxpr: ClosedJaxpr, original: ClosedJaxpr, info) -> None:
    # The jit's jaxpr takes the dynamic arguments in `original`'s order and gives its outputs;
    # where it does not (closed-over tracers became inputs), nothing is kept.
    if signature_difference(original, jaxpr) is not None:
        return
    _FALLBACK[jaxpr] = (_standing_in(original, jaxpr), info)


def _standing_in(program: ClosedJaxpr, jaxpr: ClosedJaxpr) -> ClosedJaxpr:
    """`program` with `jaxpr`'s debug info (argument and result names), to lower in its place."""
    return closed(program.jaxpr.replace(debug_info=jaxpr.jaxpr.debug_info), program.consts)


def keep_lowering_candidate(failed: ClosedJaxpr, program: ClosedJaxpr, info) -> ClosedJaxpr:
    """`program` (a rewrite of the program `failed` was made from, taking and giving the same
    values) made ready to be lowered in place of `failed`, and registered with `info` as
    `failed` was: where it fails in turn, `on_failure` is asked for the next."""
    original, _ = _FALLBACK[failed]
    candidate = _standing_in(program, failed)
    _FALLBACK[candidate] = (original, info)
    return candidate


def lowering_fallback(jaxpr) -> tuple | None:
    """(the original program, to lower in place of `jaxpr`, info) where `jaxpr` is a jit's
    traced program that a rewrite made (or a candidate for one); else None."""
    try:
        return _FALLBACK.get(jaxpr)
    except TypeError:  # not weakly referenceable: not one of ours
        return None


def lowered_instead(jaxpr) -> ClosedJaxpr | None:
    """The program lowered in place of `jaxpr` (the last of its chain) where `jaxpr` failed to
    lower or compile; else None."""
    seen = set()
    try:
        while jaxpr in _INSTEAD and id(jaxpr) not in seen:
            seen.add(id(jaxpr))
            jaxpr = _INSTEAD[jaxpr]
    except TypeError:  # not weakly referenceable: not one of ours
        return None
    return jaxpr if seen else None


def has_lowering_guard() -> bool:
    """Whether this JAX has the hooks `install_lowering_guard` needs (>= 0.9). Without them a
    rewritten program that JAX cannot lower or compile raises, as the program would."""
    from jax._src import pjit as _pjit
    return callable(getattr(_pjit, "_resolve_and_lower", None)) and has_jit_trace_hook()


def install_lowering_guard(on_failure: Callable) -> bool:
    """Wrap `pjit._resolve_and_lower` (once); False where this JAX has none (< 0.9).

    `on_failure(jaxpr, err, stage)` returns `(instead, settled)`: the jaxpr to lower in place of
    `jaxpr`, and a callable (or None) called once what replaced it has lowered (stage
    "lowered") or compiled ("compiled"); or raises."""
    from jax._src import pjit as _pjit
    with _INSTALL:
        if not has_lowering_guard():  # pragma: no cover - JAX < 0.9
            return False
        lower = _pjit._resolve_and_lower
        if getattr(lower, "__jaxrewrite_hook__", False):
            return True

        def lower_as(jaxpr, args, kw):
            if "jaxpr" in kw:
                return lower(*args, **{**kw, "jaxpr": jaxpr})
            return lower(args[0], jaxpr, *args[2:], **kw)

        def lower_guarded(jaxpr, args, kw) -> tuple:
            """(`jaxpr`'s lowering, or that of what `on_failure` gives in its place, in turn;
            the `settled` callables of the failures on the way)."""
            tried, settled = [], []
            while True:
                try:
                    computation = lower_as(jaxpr, args, kw)
                    break
                except Exception as err:  # noqa: BLE001 - on_failure re-raises what it cannot mend
                    if any(jaxpr is t for t in tried):  # never twice: the chain cannot loop
                        raise
                    tried.append(jaxpr)
                    instead, done = on_failure(jaxpr, err, "lowered")
                    settled.append(done)
                    jaxpr = instead
            for t in tried:  # each failed program, and the one asked for, lowered as the last
                _INSTEAD[t] = jaxpr
            if jaxpr in _FALLBACK:
                _guard_compile(computation, jaxpr, lambda j: lower_guarded(j, args, kw),
                               on_failure)
            return computation, [s for s in settled if s is not None]

        def _resolve_and_lower(*args, **kw):
            if not _FALLBACK and not _INSTEAD:  # no rewritten program lives: JAX's own path
                return lower(*args, **kw)
            jaxpr = kw["jaxpr"] if "jaxpr" in kw else args[1]
            # one that failed before: the program that replaced it, straight away
            jaxpr = lowered_instead(jaxpr) or jaxpr
            computation, settled = lower_guarded(jaxpr, args, kw)
            for done in settled:
                done()
            return computation

        _resolve_and_lower.__wrapped__ = lower
        _resolve_and_lower.__jaxrewrite_hook__ = True
        _pjit._resolve_and_lower = _resolve_and_lower
        return True


def _guard_compile(computation, jaxpr, lower_instead: Callable, on_failure: Callable) -> None:
    """Have `computation.compile` (a rewritten program's) compile what `on_failure` gives where
    XLA rejects the rewritten one (that program's compile guarded in its turn, where it is
    registered). The lowering is cached by JAX and shared: patched once."""
    compile_ = getattr(computation, "compile", None)
    if compile_ is None or getattr(compile_, "__jaxrewrite_hook__", False):
        return

    def compile_or_fallback(*a, **k):
        try:
            return compile_(*a, **k)
        except Exception as err:  # noqa: BLE001 - on_failure re-raises what it cannot mend
            instead, done = on_failure(jaxpr, err, "compiled")
            _INSTEAD[jaxpr] = instead
            computation_, settled = lower_instead(instead)
            compiled = computation_.compile(*a, **k)  # guarded in its turn, where registered
            _INSTEAD[jaxpr] = lowered_instead(instead) or instead
            for s in [*settled, done]:  # told once it compiled
                if s is not None:
                    s()
            return compiled

    compile_or_fallback.__jaxrewrite_hook__ = True
    try:
        computation.compile = compile_or_fallback
    except AttributeError:  # pragma: no cover - another JAX's lowering object: unguarded
        pass


def raised_in_kernel(err: BaseException) -> bool:
    """Whether `err` (or an error it was raised from) came from lowering or compiling a Pallas
    kernel: raised inside Pallas's or Mosaic's Python code (JAX's `_src/pallas`,
    `_src/tpu_custom_call`), or XLA's error names Mosaic or the kernel's custom call (a kernel
    Mosaic refused when the TPU compiler compiled it). Where this is wrong, the fallback drops
    another pass first and gets there one program later."""
    import traceback
    seen = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        for frame in traceback.extract_tb(err.__traceback__):
            path = frame.filename.replace("\\", "/")
            if "/_src/pallas/" in path or "/_src/tpu_custom_call" in path:
                return True
        text = str(err)
        if "Mosaic" in text or "tpu_custom_call" in text:
            return True
        err = err.__cause__ or err.__context__
    return False


# --- primitives that fail where JAX lowers or XLA compiles (`testing.inject_lowering_failure`) ----

_FAILING: dict = {}


def failing_identity(stage: str) -> Primitive:
    """The identity on one array, as a primitive that JAX cannot lower (`stage="lowered"`: its
    rule raises NotImplementedError, as Pallas's TPU lowering does for a primitive it lacks) or
    that XLA cannot compile (`"compiled"`: a custom call to a target no one registered, which
    lowers). Evaluated, and abstractly evaluated, as the identity. One primitive per stage."""
    if stage not in ("lowered", "compiled"):
        raise ValueError(f"failing_identity: stage {stage!r} is not 'lowered' or 'compiled'")
    with _INSTALL:
        prim = _FAILING.get(stage)
        if prim is not None:
            return prim
        from jax._src.interpreters import mlir
        prim = Primitive(f"jaxrewrite_fails_to_be_{stage}")
        prim.def_impl(lambda x: x)
        prim.def_abstract_eval(lambda aval: aval)
        if stage == "lowered":
            def rule(ctx, x):
                raise NotImplementedError(f"{prim.name} has no lowering (injected)")
        else:
            def rule(ctx, x):
                aval, = ctx.avals_out
                return mlir.custom_call(
                    "jaxrewrite_no_such_target", operands=[x], backend_config={}, api_version=4,
                    result_types=[_ir_type(mlir, ctx, aval)]).results
        mlir.register_lowering(prim, rule)
        _FAILING[stage] = prim
        return prim


def _ir_type(mlir, ctx, aval):
    # JAX >= 0.9 takes the module context first; 0.7-0.8 take the aval alone
    params = inspect.signature(mlir.aval_to_ir_type).parameters
    if len(params) >= 2:
        return mlir.aval_to_ir_type(ctx.module_context, aval)
    return mlir.aval_to_ir_type(aval)  # pragma: no cover - JAX < 0.9


def _with_compile_options(params, wanted: dict):
    kvs = params.params.get("compiler_options_kvs")
    if not isinstance(kvs, tuple):  # pragma: no cover - another JAX's params
        return params
    given = {k for k, _ in kvs}
    extra = tuple((k, v) for k, v in wanted.items()
                  if k not in given and compile_option_supported(k, v))
    if not extra:
        return params
    return params._replace(params={**params.params, "compiler_options_kvs": kvs + extra})


_SUPPORTED: dict = {}


def compile_option_supported(name: str, value) -> bool:
    """Whether this jaxlib's XLA accepts the debug option `name` (compiles a one-op program once
    per option and process; an XLA without it rejects the name)."""
    if name not in _SUPPORTED:
        try:
            jax.jit(lambda x: x + 1, compiler_options={name: value}).lower(
                np.float32(0)).compile()
        except Exception as e:  # noqa: BLE001 - an older XLA: the option is not asked for
            _SUPPORTED[name] = False
            warnings.warn(f"jaxrewrite: this XLA does not accept the compile option {name} "
                          f"({type(e).__name__}: {e}); programs that ask for it are compiled "
                          f"without it", RuntimeWarning, stacklevel=2)
        else:
            _SUPPORTED[name] = True
    return _SUPPORTED[name]


def is_outermost_trace() -> bool:
    """Whether no transformation or trace is under way in this thread (a jit traced now is an
    outermost one: not inside another jit, `grad`, `vmap` or a loop body)."""
    return _core.trace_state_clean()


def jit_info_shardings(jit_info) -> tuple:
    """The in/out shardings a `jax.jit` was given (leaves), from its `PjitInfo`."""
    return (tuple(getattr(jit_info, "in_shardings_leaves", ())),
            tuple(getattr(jit_info, "out_shardings_leaves", ())))


def jitted_function(obj):
    """The function a `jax.jit` object traces, or None if `obj` is not one."""
    return getattr(obj, "_fun", None) if hasattr(obj, "_jit_info") else None


def is_jax_internal_jit(fun) -> bool:
    """JAX's own jits run outside any trace: one primitive applied eagerly (`jnp.sin(x)` on an
    array dispatches `jit(sin)`), or a `jax.numpy` function called on arrays. A JAX function that
    closes over a function of yours is your program (JAX's test utilities jit such a wrapper)."""
    if getattr(fun, "_apply_primitive", False):
        return True
    if not _in_jax(fun):
        return False
    for cell in getattr(fun, "__closure__", None) or ():
        try:
            value = cell.cell_contents
        except ValueError:  # an empty cell
            continue
        if callable(value) and not isinstance(value, type) and not _in_jax(value):
            return False
    return True


def _in_jax(obj) -> bool:
    module = getattr(obj, "__module__", None) or ""
    return module == "jax" or module.startswith(("jax.", "jaxlib."))


# --- Pallas (passes/kernel.py) -----------------------------------------------------------------
#
# One TPU kernel over (rows, 128) tiles of 2-D word arrays, scalars in SMEM, read from
# `jax.experimental.pallas` (JAX 0.10.2: `pl.pallas_call`, `pl.BlockSpec`, `pltpu.SMEM`,
# `pltpu.CompilerParams`, `pl.CostEstimate`). Where Pallas cannot be imported nothing is emitted.

def pallas_available() -> bool:
    try:
        from jax.experimental import pallas  # noqa: F401
        from jax.experimental.pallas import tpu  # noqa: F401
    except Exception:  # noqa: BLE001 - any import failure: no kernels
        return False
    return True


def pallas_tiles_call(kernel: Callable, operands: Sequence, in_blocks: Sequence,
                      out_avals: Sequence, out_blocks: Sequence, steps: int, *,
                      interpret: bool, name: str, flops: int = 0, bytes_accessed: int = 0,
                      input_fusion: bool = False) -> list:
    """`kernel(*in_refs, *out_refs)` as one `pallas_call` over a grid of `steps`. Each operand's
    block (`in_blocks`): None, a (1, 1) array whole in SMEM; or a block shape whose
    second-minor axis is the one the grid walks, block i at row i * rows: (rows, 128) of a
    (M, 128) array, or (slabs, rows, 128) of a (slabs, M, 128) one. Outputs (`out_avals`:
    (shape, dtype) pairs) likewise in `out_blocks`. Grid steps are independent ("parallel").
    `input_fusion`: let XLA fuse each operand's producer into the kernel's input
    (`allow_input_fusion`)."""
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import tpu as pltpu

    def spec(block):
        if block is None:
            # (a scalar as (1, 1): under vmap Pallas batches it to (B, 1, 1) in blocks of
            # (1, 1, 1), which Mosaic takes, where a (1,) batched to (B, 1) in blocks of (1, 1)
            # failed to lower on a TPU v5e)
            return pl.BlockSpec((1, 1), lambda i: (np.int32(0), np.int32(0)),
                                memory_space=pltpu.SMEM)
        # (int32 block indices: with jax_enable_x64 a Python 0 would be int64, which Mosaic
        # refuses)
        lead = (np.int32(0),) * (len(block) - 2)
        return pl.BlockSpec(tuple(block), lambda i: (*lead, i, np.int32(0)))

    params = pltpu.CompilerParams(
        dimension_semantics=("parallel",),
        allow_input_fusion=[b is not None for b in in_blocks] if input_fusion else None)
    call = pl.pallas_call(
        kernel, grid=(steps,),
        out_shape=[jax.ShapeDtypeStruct(tuple(s), d) for s, d in out_avals],
        in_specs=[spec(b) for b in in_blocks], out_specs=[spec(b) for b in out_blocks],
        interpret=interpret, name=name, compiler_params=params,
        cost_estimate=pl.CostEstimate(flops=int(flops), transcendentals=0,
                                      bytes_accessed=int(bytes_accessed)))
    return list(call(*operands))


def pallas_load_rows(ref, slab: int, first: int, rows: int, stride: int):
    """Rows first, first + stride, ... (`rows` of them) of slab `slab` of a (slabs, R, 128)
    block: a sublane-strided load."""
    from jax.experimental import pallas as pl
    return ref.at[slab][pl.ds(first, rows, stride=stride), :]


def pallas_store_rows(ref, slab: int, first: int, rows: int, stride: int, value) -> None:
    """`value` ((rows, 128)) into the rows `pallas_load_rows` reads: a sublane-strided store."""
    from jax.experimental import pallas as pl
    ref.at[slab][pl.ds(first, rows, stride=stride), :] = value


def pallas_program_id(axis: int = 0):
    """The grid step a kernel runs (inside its body)."""
    from jax.experimental import pallas as pl
    return pl.program_id(axis)


# --- Threefry draws (passes/threefry.py) ----------------------------------------------------------
#
# JAX 0.10 moved the PRNG into `jax._src.random` (`prng.py`: the key types and the `random_*`
# primitives; `threefry2x32.py`: the Threefry implementation); before, both were
# `jax._src.prng`. What the pass reads: a key dtype's implementation (its `random_bits` and
# `split`, traced on the key's words), whether it is Threefry, and the Threefry hash's own
# definition (`_threefry2x32_lowering`: the 20 rounds as the TPU and GPU lower them).

def _threefry_module():
    try:  # JAX >= 0.10
        from jax._src.random import threefry2x32 as mod
    except ImportError:  # pragma: no cover - JAX < 0.10
        from jax._src import prng as mod
    return mod


def key_impl(aval):
    """The PRNG implementation of a typed key array's aval (`key<fry>[]`), else None."""
    impl = getattr(getattr(aval, "dtype", None), "_impl", None)
    return impl if impl is not None and hasattr(impl, "random_bits") else None


def is_threefry(impl) -> bool:
    """Whether `impl` (a `key_impl`) is JAX's Threefry-2x32."""
    return impl is not None and impl is getattr(_threefry_module(), "threefry_prng_impl", None)


def threefry_partitionable() -> bool:
    """`jax_threefry_partitionable` (on by default since JAX 0.5): the counters are a 64-bit
    iota of the output's shape as (high, low) words, not halves of one 32-bit iota."""
    return bool(jax.config.jax_threefry_partitionable)


def threefry2x32_rounds(k1, k2, x1, x2) -> tuple:
    """JAX's own Threefry-2x32 hash of counter words (x1, x2) under key words (k1, k2), as
    straight-line adds, rotates and xors (`_threefry2x32_lowering`, unrolled: the form JAX
    lowers `threefry2x32` to on the TPU and the GPU)."""
    return tuple(_threefry_module()._threefry2x32_lowering(k1, k2, x1, x2,
                                                            use_rolled_loops=False))
