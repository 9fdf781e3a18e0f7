"""The one module that touches JAX internals.

Everything version-dependent lives here: where `Jaxpr`/`ClosedJaxpr`/`Var`/`Literal` come from,
the name of the `jit` primitive (`jit_p` since JAX 0.7, `pjit_p` before), how constants appear
(constvars holding numpy arrays, or array literals), how a function is traced to a jaxpr and how a
jaxpr is evaluated back into the current trace. Every other module imports these names from here.

Supported: JAX >= 0.7.0 (the declared floor, smoke-tested in `.ci/run`).
"""
from __future__ import annotations

import os
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


def check_jaxpr(jaxpr) -> None:
    """Raise `JaxprTypeError` if `jaxpr` (open or closed) is not well typed."""
    j = jaxpr.jaxpr if isinstance(jaxpr, ClosedJaxpr) else jaxpr
    _core.check_jaxpr(j)


def params_jaxprs(params) -> Iterator[tuple[str, int | None, Any]]:
    """(param name, index in a tuple or None, jaxpr) for every jaxpr held in `params`.

    Covers ClosedJaxpr and Jaxpr values and tuples of them (`cond`'s `branches`), which is where
    jit, scan, while, cond, remat, custom_jvp_call (`call_jaxpr`; its `jvp_jaxpr_fun` is a thunk
    kept as is), custom_vjp_call (`call_jaxpr`; fwd/bwd are thunks), closed_call and shard_map
    carry their bodies.
    """
    for name, val in params.items():
        if isinstance(val, (ClosedJaxpr, Jaxpr)):
            yield name, None, val
        elif isinstance(val, tuple) and val and all(isinstance(v, (ClosedJaxpr, Jaxpr)) for v in val):
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


def user_location(eqn) -> str | None:
    """`file.py:line` of the user's frame that produced `eqn`, or None."""
    si = eqn.source_info
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


def trace_avals(fun: Callable, avals: Sequence) -> ClosedJaxpr:
    """Trace `fun` on abstract values (used by rewrites to build replacement equations)."""
    specs = [jax.ShapeDtypeStruct(a.shape, a.dtype, weak_type=getattr(a, "weak_type", False))
             for a in avals]
    return jax.make_jaxpr(fun)(*specs)


def eval_jaxpr(cj: ClosedJaxpr, *args) -> list:
    """Evaluate `cj` in the current trace (inside `jax.jit`, this stages its equations out)."""
    return _core.eval_jaxpr(cj.jaxpr, cj.consts, *args)


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


def x64_enabled() -> bool:
    return bool(jax.config.jax_enable_x64)
