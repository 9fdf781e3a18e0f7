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
        info = chain = None
        if result.changed:
            chain = _Chain(fun, result.report)
            info = _Fallback(chain, cj, options, shardings, result.changed_by)
            C.request_lowering_fallback(wrapped, cj, info)
        program = result.jaxpr
        while True:
            try:
                outs = C.eval_jaxpr(program, *dyn_vals)
                break
            except Exception as err:  # noqa: BLE001 - contained: the next program is staged
                if info is None:  # the program as traced: its error is the user's
                    raise
                program, info = _fell_back(info, err, "staged")
                if info is None:
                    program = cj
                C.request_lowering_fallback(wrapped, cj, info)  # (None: nothing to fall back to)
        if chain is not None:
            _tell(chain)  # (where a program could not be staged)
        return jax.tree_util.tree_unflatten(out_tree[-1], outs)

    wrapped.__jaxrewrite_options__ = options
    return wrapped


# Fallback by pass: a rewritten program that fails to be staged, lowered or compiled is made
# again, from the program as traced, without the pass laid at the failure (the last that changed
# it; where a Pallas kernel failed, the last that emits kernels: `_pipeline.laid_at`); where that
# one fails too, without the next such pass as well; after `_MAX_REWRITES` programs (or where
# no pass is left to drop), the program as traced runs. A failing pass costs its own gain only.
_MAX_REWRITES = 3
_TELL_LOCK = threading.Lock()


@dataclasses.dataclass
class _Chain:
    """One rewrite's failures, shared by every program tried in its place: told in one warning."""
    fun: Callable
    report: object  # the rewrite's Report: each failure is recorded there too (explain shows it)
    first: tuple | None = None  # (stage, error) of the first failure: the one the warning gives
    dropped: list = dataclasses.field(default_factory=list)  # passes left out, in that order
    original: bool = False  # whether it came to the program as traced
    told: tuple | None = None  # (dropped, original) as the warning said them


@dataclasses.dataclass(frozen=True)
class _Fallback:
    """What the lowering guard knows of a program a rewrite made: how to make the next one."""
    chain: _Chain
    original: C.ClosedJaxpr  # the program as traced: what the pipeline runs on again
    options: Options
    shardings: tuple
    changed_by: tuple  # the passes that changed this program, in order: the next to leave out
    without: frozenset = frozenset()  # the passes this program was made without


def _fell_back(info: _Fallback, err: Exception, stage: str):
    """(the next program to try where `info`'s could not be `stage`, its `_Fallback`), or
    (None, None): the program as traced. The failure goes to the report; re-raises `err`
    under `strict=True`."""
    if info.options.strict:
        raise err
    chain = info.chain
    if chain.first is None:
        chain.first = (stage, err)
    program = None
    culprit = _pipeline.laid_at(info.changed_by, C.raised_in_kernel(err))
    if culprit is not None and len(info.without) < _MAX_REWRITES:
        without = info.without | {culprit}
        program = _rewrite_without(info, without)
    what = (f"the rewritten program could not be {stage}" if not info.without else
            f"the program made without {_quoted(p for p in chain.dropped if p in info.without)} "
            f"could not be {stage} either") + f" ({type(err).__name__}: {err})"
    if program is None:
        chain.original = True
        chain.report.errors.append(f"{what}; the original program ran")
    else:
        if culprit not in chain.dropped:  # (two threads lowering the same program)
            chain.dropped.append(culprit)
        chain.report.errors.append(f"{what}; dropped pass '{culprit}', the program "
                                   f"the other passes made ran")
    chain.report.stats["fallback"] = {"dropped": list(chain.dropped), "original": chain.original}
    if program is None:
        return None, None
    return program.jaxpr, dataclasses.replace(info, changed_by=program.changed_by,
                                              without=without)


def _rewrite_without(info: _Fallback, without: frozenset):
    """The pipeline run again on the program as traced without the passes `without`; None where
    that changes nothing (or fails: then the original is what is left)."""
    # the switch off: at lowering time no trace is under way, and the pipeline's own jits
    # (constant evaluation, autotuning) would be outermost
    previous = C.switch_swap_local(None)
    try:
        result = _pipeline.rewrite(info.original, dataclasses.replace(info.options, strict=True),
                                   shardings=info.shardings, without=without)
    except Exception as err:  # noqa: BLE001 - a pass failing here: the original program runs
        logger.debug("fallback: the rewrite without %s failed: %r", sorted(without), err)
        return None
    finally:
        C.switch_set_local(previous)
    return result if result.changed else None


def _lowering_failed(jaxpr, err: Exception, stage: str):
    """`_compat`'s lowering guard: (the program to lower in place of `jaxpr`, which could not be
    `stage` ("lowered" or "compiled": `err` says why), the callable to call once that one has).
    Where `jaxpr` is, or holds, a program a rewrite made: the next program of its chain
    (`_fell_back`), each registered to fall back in its turn. Re-raises `err` where there is
    none, or `strict=True` was asked for."""
    hit = C.lowering_fallback(jaxpr)
    if hit is not None:
        original, info = hit
        program, after = _fell_back(info, err, stage)
        if after is None:
            return original, functools.partial(_tell, info.chain)
        return (C.keep_lowering_candidate(jaxpr, program, after),
                functools.partial(_tell, info.chain))
    # a rewritten program inside another jit's: each replaced where it sits
    chains = []

    def swap(c):
        h = C.lowering_fallback(c)
        if h is None:
            return c
        original, info = h
        program, after = _fell_back(info, err, stage)
        chains.append(info.chain)
        return original if after is None else C.keep_lowering_candidate(c, program, after)

    instead = _walk.map_jaxprs(jaxpr, swap)
    if not chains:
        raise err
    return instead, lambda: [_tell(c) for c in chains]


def _tell(chain: _Chain) -> None:
    """The one warning for `chain`'s failures, once they are settled (a program lowered, or
    where compiling failed compiled, in place of the rewritten one). A later failure (a program
    that lowered in place of one, then failed to compile) is in the report's errors only."""
    now = (tuple(chain.dropped), chain.original)
    with _TELL_LOCK:  # (two threads lowering the same program: one warning)
        if chain.first is None or chain.told is not None:
            return
        chain.told = now
    stage, err = chain.first
    dropped = _quoted(chain.dropped)
    s = "es" if len(chain.dropped) > 1 else ""
    if not chain.original:
        then = f"dropped pass{s} {dropped}, running the program the other passes made"
    elif chain.dropped:
        then = f"dropped pass{s} {dropped}, still failing; running the original program"
    else:
        last = chain.report.stats.get("changed_by") or [None]
        then = f"the last pass to change it: '{last[-1]}'; running the original program"
    _warn_fallback(chain.fun, f"could not be {stage}", err, then)


def _quoted(names) -> str:
    return ", ".join(f"'{n}'" for n in names)


def _warn_fallback(fun, what: str, err: Exception, then: str) -> None:
    name = getattr(fun, "__qualname__", None) or getattr(fun, "__name__", None) or repr(fun)
    warnings.warn(f"jaxrewrite: the rewritten program of {name} {what} ({type(err).__name__}: "
                  f"{err}); {then}", RuntimeWarning, stacklevel=C.user_stacklevel())


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
    """`jax.make_jaxpr(fun, static_argnums)` followed by `rewrite_jaxpr(..., **options)`.

    Nothing here is lowered, so the fallback by pass of `optimize` (a rewritten program that
    fails to lower or compile is made again without the pass laid at it) never comes into
    play: the jaxpr returned is every pass's, and a pass whose output JAX cannot lower shows
    only when that jaxpr is lowered."""
    opts = Options.make(**options)
    if not callable(fun):
        raise TypeError(f"make_jaxpr() expects a callable, got {type(fun).__name__}")

    @functools.wraps(fun)
    def run(*args, **kwargs):
        cj = jax.make_jaxpr(fun, static_argnums=static_argnums)(*args, **kwargs)
        return _pipeline.rewrite(cj, opts, check="types").jaxpr

    return run
