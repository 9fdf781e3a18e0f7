"""Public entry points: `optimize`, `rewrite_jaxpr`, `make_jaxpr`.

The data path is a straight line: `jax.jit` traces a wrapper; the wrapper traces the user's
function to a jaxpr (`_compat.trace`), runs the pass pipeline on it (`_pipeline.rewrite`), and
evaluates the rewritten jaxpr into `jax.jit`'s own trace (`_compat.eval_jaxpr`). Because the
rewrite happens inside `jax.jit`'s trace, everything `jax.jit` offers (pytrees, static and donated
arguments, shardings, `.lower()`, `.trace()`, caching and fast dispatch) is `jax.jit`'s own.
"""
from __future__ import annotations

import collections
import dataclasses
import functools
import inspect
import threading
import time
import warnings
import weakref
from typing import Callable

import jax

from . import _compat as C
from . import _pipeline
from . import _walk
from .report import log as _log
from ._options import NAMES, Options
from .report.records import logger

_JIT_PARAMS = frozenset(p for p in inspect.signature(jax.jit).parameters if p != "fun")


def _split_kwargs(kwargs: dict) -> tuple[Options, dict]:
    opts = {k: v for k, v in kwargs.items() if k in NAMES}
    jit_kw = {k: v for k, v in kwargs.items() if k not in NAMES}
    bad = sorted(k for k in jit_kw if k not in _JIT_PARAMS)
    if bad:
        raise TypeError(f"optimize() got unexpected keyword argument(s) {bad}: neither a "
                        f"jaxrewrite option ({', '.join(NAMES)}) nor a jax.jit parameter")
    return Options.make(**opts), jit_kw


def optimize(fun: Callable | None = None, /, **kwargs):
    """`jax.jit(fun)`, with the jaxpr rewritten before XLA sees it.

    Usable as `@optimize`, `@optimize(dedup=False)` and `optimize(f, reroll=True)`. Keywords are
    the rewrite options (see `jaxrewrite.OPTIONS`) and any `jax.jit` parameter. Returns what
    `jax.jit` returns. Calling `optimize(f, **same)` again returns the same wrapper.
    """
    options, jit_kw = _split_kwargs(kwargs)
    if fun is None:
        return functools.partial(optimize, **kwargs)
    if not callable(fun):
        raise TypeError(f"optimize() expects a callable, got {type(fun).__name__}: {fun!r}")
    key = _cache_key(options, jit_kw)
    store = _store_for(fun) if key is not None else None
    if store is None:
        return jax.jit(_rewriting(fun, options, jit_kw), **jit_kw)
    with _CACHE_LOCK:
        hit = store.get(key)
    if hit is not None:
        return hit
    jitted = jax.jit(_rewriting(fun, options, jit_kw), **jit_kw)
    with _CACHE_LOCK:
        # another thread may have made one meanwhile: the first one in wins, so every caller
        # shares one jitted object (and jax.jit's cache: one trace per shape)
        return store.setdefault(key, jitted)


# Wrappers are reused for the same function and options. They live on the function itself
# (`fun.__dict__`), so the cache dies with the function: fun -> store -> wrapper -> fun is a
# cycle the garbage collector frees. Callables without a writable `__dict__` (bound methods,
# builtins) use a small bounded table keyed by a weak reference instead.
_STORE_ATTR = "__jaxrewrite_wrappers__"
_CACHE_LOCK = threading.Lock()
_FALLBACK: collections.OrderedDict = collections.OrderedDict()
_FALLBACK_SIZE = 64


def _cache_key(options: Options, jit_kw: dict):
    try:
        extra = tuple(sorted((k, _hashable(v)) for k, v in jit_kw.items()))
        key = (options.key(), extra, C.x64_enabled())
        hash(key)
        return key
    except TypeError:  # unhashable jit options: no reuse
        return None


def _store_for(fun) -> dict | None:
    d = getattr(fun, "__dict__", None)
    if isinstance(d, dict) and not inspect.ismethod(fun):
        with _CACHE_LOCK:
            # `functools.wraps` (jax.grad, jax.vmap, ...) copies `__dict__` into the wrapper:
            # a store is only ours if it names `fun` itself as its owner.
            owner, store = d.get(_STORE_ATTR, (None, None))
            if owner is not fun:
                store = {}
                d[_STORE_ATTR] = (fun, store)
            return store
    try:
        ref = weakref.WeakMethod(fun) if inspect.ismethod(fun) else weakref.ref(fun)
        hash(ref)
    except TypeError:
        return None
    with _CACHE_LOCK:
        store = _FALLBACK.pop(ref, None) or {}
        _FALLBACK[ref] = store  # most recently used last
        while len(_FALLBACK) > _FALLBACK_SIZE:
            _FALLBACK.popitem(last=False)
    return store


def _hashable(v):
    if isinstance(v, (list, tuple)):
        return tuple(_hashable(x) for x in v)
    if isinstance(v, dict):
        return tuple(sorted((k, _hashable(x)) for k, x in v.items()))
    hash(v)
    return v


def _rewriting(fun: Callable, options: Options, jit_kw: dict | None = None,
               opted_out: Callable[[], bool] | None = None) -> Callable:
    """The function `jax.jit` traces: trace `fun`, rewrite, evaluate into the current trace.

    `opted_out()` (the switch's) says, after `fun` is traced, to leave the program as traced."""
    # Shardings jax.jit is given: whether the program is partitioned over several devices.
    shardings = tuple((jit_kw or {}).get(k) for k in ("in_shardings", "out_shardings"))
    C.install_jit_trace()  # where the rewrite's compile options reach the jit (once)
    C.install_lowering_guard(_lowering_failed)  # a program that fails to lower runs as traced

    @functools.wraps(fun, updated=())  # not fun.__dict__: it holds optimize's wrapper store
    def wrapped(*args, **kwargs):
        leaves, treedef = jax.tree_util.tree_flatten((args, kwargs))
        # Inside jax.jit every dynamic argument is a tracer; anything else is a static argument
        # (static_argnums/static_argnames) and is passed through to `fun` unchanged.
        dyn = [i for i, x in enumerate(leaves) if C.is_tracer(x)]
        out_tree = []

        def flat_fun(*dyn_vals):
            full = list(leaves)
            for i, v in zip(dyn, dyn_vals):
                full[i] = v
            a, kw = jax.tree_util.tree_unflatten(treedef, full)
            outs, tree = jax.tree_util.tree_flatten(fun(*a, **kw))
            out_tree.append(tree)
            return outs

        dyn_vals = [leaves[i] for i in dyn]
        t0 = time.perf_counter()
        # named like `fun`, so errors while tracing it read as they do under jax.jit
        cj = C.trace(C.name_like(flat_fun, fun, args, kwargs, dyn), dyn_vals)
        t1 = time.perf_counter()
        if opted_out is not None and opted_out():
            return jax.tree_util.tree_unflatten(out_tree[-1], C.eval_jaxpr(cj, *dyn_vals))
        result = _pipeline.rewrite(cj, options, shardings=shardings)
        result.report.time("trace", t1 - t0)
        _log.rewritten(fun, dyn_vals, result.report)  # JAXREWRITE_LOG=1: one line per function
        _LAST.report = result.report
        logger.debug("optimize(%s): %s", getattr(fun, "__name__", fun), dict(result.report.counts))
        if result.compile_options:  # applied where this jit is called outermost: see _compat
            C.request_compile_options(wrapped, result.compile_options)
        if result.changed:
            C.request_lowering_fallback(wrapped, cj, _Fallback(fun, result.last_pass, options,
                                                               result.report))
        try:
            outs = C.eval_jaxpr(result.jaxpr, *dyn_vals)
        except Exception as err:  # noqa: BLE001 - contained: the program as traced runs
            if options.strict or not result.changed:
                raise
            _warn_fallback(fun, result.last_pass, "could not be staged", err)
            result.report.errors.append(f"staging: {type(err).__name__}: {err}")
            outs = C.eval_jaxpr(cj, *dyn_vals)
        return jax.tree_util.tree_unflatten(out_tree[-1], outs)

    wrapped.__jaxrewrite_options__ = options
    return wrapped


@dataclasses.dataclass(frozen=True)
class _Fallback:
    """What the lowering guard says of a rewritten program that fails to lower or compile."""
    fun: Callable
    last_pass: str | None
    options: Options
    report: object  # the rewrite's Report: the failure is recorded there too (explain shows it)


def _lowering_failed(jaxpr, err: Exception, stage: str):
    """`_compat`'s lowering guard: the program to lower in place of `jaxpr`, which could not
    be `stage` ("lowered" or "compiled": `err` says why). Where `jaxpr` is, or holds, a
    rewritten program: the program as traced before the rewrite, with one warning. Re-raises
    `err` where there is none, or `strict=True` was asked for."""
    hit = C.lowering_fallback(jaxpr)
    if hit is None:  # a rewritten program inside another jit's: each replaced where it sits
        found = []

        def swap(c):
            h = C.lowering_fallback(c)
            if h is None:
                return c
            found.append(h[1])
            return h[0]

        instead = _walk.map_jaxprs(jaxpr, swap)
        if not found:
            raise err
        hit = (instead, found[0])
    instead, info = hit
    if info.options.strict:
        raise err
    _warn_fallback(info.fun, info.last_pass, f"could not be {stage}", err)
    info.report.errors.append(f"the rewritten program could not be {stage} "
                              f"({type(err).__name__}: {err}); the original program ran")
    return instead


def _warn_fallback(fun, last_pass, what: str, err: Exception) -> None:
    name = getattr(fun, "__qualname__", None) or getattr(fun, "__name__", None) or repr(fun)
    warnings.warn(f"jaxrewrite: the rewritten program of {name} {what} ({type(err).__name__}: "
                  f"{err}); the last pass to change it: '{last_pass}'; running the original "
                  f"program", RuntimeWarning, stacklevel=C.user_stacklevel())


_LAST = threading.local()


def last_report():
    """The report of the most recent rewrite in this thread (None before any)."""
    return getattr(_LAST, "report", None)


def rewrite_jaxpr(closed_jaxpr: C.ClosedJaxpr, **options) -> C.ClosedJaxpr:
    """The rewritten form of `closed_jaxpr` (a `jax.make_jaxpr` result)."""
    return rewrite_jaxpr_with_report(closed_jaxpr, **options).jaxpr


def rewrite_jaxpr_with_report(closed_jaxpr: C.ClosedJaxpr, **options) -> _pipeline.RewriteResult:
    """`rewrite_jaxpr`, returning the `RewriteResult` (jaxpr, report, changed)."""
    if not isinstance(closed_jaxpr, C.ClosedJaxpr):
        raise TypeError(f"rewrite_jaxpr expects a ClosedJaxpr (from jax.make_jaxpr), got "
                        f"{type(closed_jaxpr).__name__}")
    return _pipeline.rewrite(closed_jaxpr, Options.make(**options), check="types")


def make_jaxpr(fun: Callable, static_argnums=(), **options):
    """`jax.make_jaxpr(fun, static_argnums)` followed by `rewrite_jaxpr(..., **options)`."""
    opts = Options.make(**options)
    if not callable(fun):
        raise TypeError(f"make_jaxpr() expects a callable, got {type(fun).__name__}")

    @functools.wraps(fun)
    def run(*args, **kwargs):
        cj = jax.make_jaxpr(fun, static_argnums=static_argnums)(*args, **kwargs)
        return _pipeline.rewrite(cj, opts, check="types").jaxpr

    return run
