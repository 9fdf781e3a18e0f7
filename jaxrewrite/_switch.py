"""The switch: rewrite every outermost `jax.jit` of an unmodified program.

    jaxrewrite.enable(reroll=True)          # from here on, in every thread
    with jaxrewrite.enabled(**options):     # in this block, in this thread
    python -m jaxrewrite train.py           # a whole script

While the switch is on, each `jax.jit` that is traced outside any other trace (an *outermost*
jit: the step you call, however it was made — `jax.jit`, `nnx.jit`, `eqx.filter_jit`, a jit
inside optax or diffrax called from your loop) is traced through `optimize`'s wrapper with the
switch's options. Jits called inside it are part of its program and are rewritten with it. The
hook sits where JAX traces a jit (`_compat.hook_jit_trace`), so the jit objects themselves are
untouched: their type, attributes, `.lower`, `.trace`, `.eval_shape`, `.clear_cache`, donation,
shardings, pickling and `jax.export` are JAX's own, applied to the rewritten program.

Left as JAX traces them: jits traced inside another trace (inner jits, and jits called under an
eager `grad`/`vmap`: the enclosing program, if any, is rewritten whole), `optimize`'s own jits,
jaxrewrite's internal ones (the switch is off while it rewrites), JAX's own jits called eagerly
(`jnp.sin(x)`, one primitive each), and functions opted out with `jaxrewrite.skip`.

A rewrite that fails runs the program JAX traces, with one warning per function (`strict=True`
raises instead); one whose program fails to lower or compile runs without the pass laid at it,
as under `optimize`; an error of the traced function itself is raised as JAX raises it.
"""
from __future__ import annotations

import contextlib
import functools
import threading
import types
import warnings
import weakref
from typing import Callable

from . import _api
from . import _compat as C
from . import _pipeline
from ._options import Options

_HOOKED = False
_LOCK = threading.Lock()
_SKIPPED: weakref.WeakSet = weakref.WeakSet()  # functions jax.jit traces, opted out
_SKIP_ATTR = "__jaxrewrite_skip__"
_WARNED: set[str] = set()                      # functions whose rewrite failed, warned once
_OPTED_OUT = threading.local()                  # a skipped function ran inside this trace
# Programs the switch traced through a rewrite: how many, how many the rewrite changed, how many
# fell back (read by `testing_switch`'s summary line).
STATS = {"traced": 0, "rewritten": 0, "fell_back": 0}


def enable(**options) -> None:
    """Rewrite every outermost `jax.jit` with `options` (those of `optimize`), in every thread,
    until `disable()`. A thread inside `with enabled(...)` keeps that block's options."""
    _set(C.switch_set_global, _options(options))


def disable() -> None:
    """Turn the switch off (in every thread without an `enabled` block of its own). Functions
    traced while it was on are traced again, as JAX traces them, on their next call."""
    C.switch_set_global(None)


@contextlib.contextmanager
def enabled(**options):
    """`with jaxrewrite.enabled(**options):` the switch on in this block, in this thread; an
    inner block's options replace an outer one's until it ends."""
    previous = _set(C.switch_swap_local, _options(options))
    try:
        yield
    finally:
        C.switch_set_local(previous)


@contextlib.contextmanager
def _off():
    """The switch off in this thread (jaxrewrite's own jits, explain's baseline)."""
    previous = C.switch_swap_local(None)
    try:
        yield
    finally:
        C.switch_set_local(previous)


def is_enabled() -> bool:
    """Whether the switch is on in this thread."""
    return C.switch_value() is not None


def skip(fn: Callable) -> Callable:
    """Opt `fn` out of the switch; usable as a decorator.

    A jit is left as JAX traces it when the function it traces is `fn`, wraps `fn`
    (`functools.wraps`: `nnx.jit`'s does), or calls a plain function that `skip` returned while
    it is traced. So `@jaxrewrite.skip` goes above or below `@jax.jit` and `@nnx.jit`, and below
    `@eqx.filter_jit` (whose jit traces a function of its own that calls yours).

    Returns `fn` itself, except for a plain Python function: then a wrapper of it that, when
    called while a program is traced through the switch, leaves that program unrewritten.
    """
    f, seen = fn, 0
    while f is not None and seen < 16:  # fn, what it wraps, and a jit object's function
        _mark(f)
        inner = C.jitted_function(f)
        if inner is not None:
            _mark(inner)
        f, seen = getattr(f, "__wrapped__", None), seen + 1
    if not isinstance(fn, types.FunctionType):
        return fn

    @functools.wraps(fn)
    def skipped(*args, **kwargs):
        _OPTED_OUT.value = True
        return fn(*args, **kwargs)

    _mark(skipped)
    return skipped


def _mark(fn) -> None:
    try:
        _SKIPPED.add(fn)
    except TypeError:  # not weakly referenceable
        try:
            setattr(fn, _SKIP_ATTR, True)
        except (AttributeError, TypeError):
            raise TypeError(f"jaxrewrite.skip: cannot mark {fn!r}") from None


def _options(options: dict) -> Options:
    bad = sorted(set(options) - set(Options.__dataclass_fields__))
    if bad:  # jax.jit's own keywords belong to each jit, not to the switch
        raise TypeError(f"jaxrewrite.enable() takes rewrite options only; got {bad}")
    made = Options.make(**options)
    _pipeline.enabled_passes(made)  # imports the passes now, not in the first step's trace
    return made


def _set(setter, value):
    global _HOOKED
    with _LOCK:
        if not _HOOKED:
            if not C.has_jit_trace_hook():
                raise RuntimeError(
                    f"jaxrewrite's switch needs jax >= {'.'.join(map(str, C.SWITCH_MIN_JAX))} "
                    f"(its jit trace hook); this is jax {'.'.join(map(str, C.JAX_VERSION))}: "
                    f"use optimize()")
            try:
                C.switch_install()
                hooked = C.hook_jit_trace(_trace)
            except Exception as e:  # noqa: BLE001 - another JAX: said plainly below
                hooked, why = False, f" ({type(e).__name__}: {e})"
            else:
                why = ""
            if not hooked:
                raise RuntimeError(f"jaxrewrite's switch needs JAX's jit trace hook and config "
                                   f"state, which jax {'.'.join(map(str, C.JAX_VERSION))} does "
                                   f"not have as jax 0.10 does{why}; use optimize()")
            _HOOKED = True
    return setter(value)


def _skipped(fun) -> bool:
    f, seen = fun, 0
    while f is not None and seen < 16:  # the functools.wraps chain (nnx's JitFn wraps the user's)
        if getattr(f, _SKIP_ATTR, False) or getattr(f, "__jaxrewrite_options__", None):
            return True
        try:
            if f in _SKIPPED:
                return True
        except TypeError:
            pass
        f, seen = getattr(f, "__wrapped__", None), seen + 1
    return False


def _trace(trace: Callable, fun, jit_info):
    """The hook: trace `fun` through a rewrite when the switch is on and this jit is outermost."""
    options = C.switch_value()
    if (options is None or not C.is_outermost_trace() or C.is_jax_internal_jit(fun)
            or _skipped(fun)):
        return trace(fun)
    in_sh, out_sh = C.jit_info_shardings(jit_info)
    wrapped = _api._rewriting(fun, options, {"in_shardings": in_sh, "out_shardings": out_sh},
                              opted_out=_opted_out)
    _OPTED_OUT.value = False
    before = _api.last_report()
    try:
        with _off():  # jits inside are part of this program; jaxrewrite's own are not rewritten
            result = trace(wrapped)
    except Exception as err:  # noqa: BLE001 - contained: the program as JAX traces it runs
        if options.strict:
            raise
        failure = err
    else:
        report = _api.last_report()
        _count(report if report is not before else None)  # (none: a skipped function ran)
        return result
    result = trace(fun)  # an error of `fun` itself is raised here, as JAX raises it
    _count(None, fell_back=True)
    _warn_once(fun, failure)
    return result


def _count(report, fell_back: bool = False) -> None:
    with _LOCK:
        STATS["traced"] += 1
        if fell_back or (report is not None and report.errors):
            STATS["fell_back"] += 1
        elif report is not None and any(k.endswith(".applied") and n
                                        for k, n in report.counts.items()):
            STATS["rewritten"] += 1


def _opted_out() -> bool:
    """Whether a `skip`ped function ran while the current program was traced."""
    return getattr(_OPTED_OUT, "value", False)


def _warn_once(fun, err: Exception) -> None:
    name = getattr(fun, "__qualname__", None) or getattr(fun, "__name__", None) or repr(fun)
    with _LOCK:
        if name in _WARNED:
            return
        _WARNED.add(name)
    warnings.warn(f"jaxrewrite: rewriting {name} failed ({type(err).__name__}: {err}); "
                  f"running the original program", RuntimeWarning, stacklevel=2)
