"""`autotune=`: decide between candidate forms of one jaxpr level by compiling them, and keep the
choice on disk.

| `autotune` | how a choice is made                                                            |
| ---------- | ------------------------------------------------------------------------------- |
| False      | the cost model alone (`backend.cost`), no compile                               |
| True       | compile each form for the target, count launches (`backend.xla.launches`); the  |
|            | target's `backend.cost.TargetCosts` row says how counts and the model combine   |
|            | (`pick_by_counts`)                                                              |
| "time"     | as True, then run both forms on the local device (paired medians): the faster   |
|            | wins. Timings are noisy, so two processes may choose differently: opt-in only.  |
|            | `reroll` is decided only here, by compile and run time (`choose_timed`): what   |
|            | it changes is compile time, which counts do not predict.                        |

Counts come from a deterministic compile, so every process of a multi-host run makes the same
choice (and reads the same cache entry). Compiling happens on the real backend when the target
is the local one; for target 'gpu' from a CPU-only process it uses XLA's deviceless GPU compiler
when the `gpu-aot` extra is importable and `JAX_PLATFORMS=cpu` (see `backend.xla`); with neither,
the cost model decides and nothing is cached.

Cache: one JSON object in `$JAXREWRITE_CACHE_DIR/autotune.json` (default
`~/.cache/jaxrewrite/autotune.json`), keyed by `digest()` of the level (a stable-across-processes
hash of its structural key, `analysis.structural`), the pass, the target, the options the choice
depends on and the JAX version. Writes replace the file atomically; a cache that cannot be read or
written is ignored (the choice is then made again), never an error.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import statistics
import tempfile
import time
from typing import Callable

import numpy as np

from .. import _compat as C
from ..analysis import structural as _structural

# Compiles made by this process for autotuning (tests read it: a cached choice compiles nothing).
COMPILES = 0

_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+|0x[0-9a-fA-F]{6,}")


class Unstable(Exception):
    """The level holds something with no stable identity across processes (an outer tracer,
    a non-addressable array): its choice is made but not cached."""


def _feed(h, k) -> None:
    """Feed a structural key into `h` in a form that is the same in every process."""
    t = type(k)
    if k is None or t in (bool, int, float, str):
        h.update(f"{t.__name__}:{k!r};".encode())
    elif t is bytes:
        h.update(b"b:%d:" % len(k) + k)
    elif t is tuple or t is list:
        h.update(b"(%d" % len(k))
        for x in k:
            _feed(h, x)
        h.update(b")")
    elif t in (frozenset, set):
        parts = []
        for x in k:
            sub = hashlib.blake2b(digest_size=16)
            _feed(sub, x)
            parts.append(sub.digest())
        h.update(b"{" + b"".join(sorted(parts)) + b"}")
    elif isinstance(k, _structural.StructKey):
        _feed(h, k.key)
    elif isinstance(k, _structural._Const):
        _feed(h, ("const", k.meta, hashlib.blake2b(k.data(), digest_size=16).digest()))
    elif isinstance(k, _structural._Ident):
        # kept by identity in the key (e.g. a jit's empty Mesh, a callback): its text where that
        # names the value (no address, not `<...>`), else nothing stable to key it by
        r = repr(k.obj)
        if r.startswith("<") or _ADDRESS.search(r):
            raise Unstable(type(k.obj).__name__)
        t = type(k.obj)
        h.update(f"ident:{t.__module__}.{t.__qualname__}:{r};".encode())
    elif isinstance(k, _structural._Unique):
        raise Unstable("tracer")
    elif isinstance(k, C.Primitive):
        h.update(f"prim:{k.name};".encode())
    else:  # dtypes, effects, eqn contexts, ...: their text, minus memory addresses
        h.update(f"{t.__module__}.{t.__qualname__}:{_ADDRESS.sub('', repr(k))};".encode())


def digest(jaxpr, *extra) -> str:
    """A hex digest of `jaxpr`'s structural key and `extra`, equal in every process for the same
    program and shapes; raises `Unstable` where there is none."""
    h = hashlib.blake2b(digest_size=20)
    _feed(h, _structural.structural_key(jaxpr).key)
    _feed(h, tuple(extra))
    return h.hexdigest()


# --- the cache -----------------------------------------------------------------------------------

def cache_path() -> str:
    root = os.environ.get("JAXREWRITE_CACHE_DIR") or os.path.join(
        os.path.expanduser("~"), ".cache", "jaxrewrite")
    return os.path.join(root, "autotune.json")


def _load(path: str) -> dict:
    try:
        with open(path) as f:
            data = json.load(f)
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def lookup(key: str) -> dict | None:
    rec = _load(cache_path()).get(key)
    return rec if isinstance(rec, dict) and isinstance(rec.get("split"), bool) else None


def store(key: str, record: dict) -> None:
    path = cache_path()
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        data = _load(path)
        data[key] = record
        fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".autotune.")
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=1, sort_keys=True)
        os.replace(tmp, path)
    except OSError:  # read-only home, full disk: the choice is simply made again next time
        pass


# --- compiling the candidates --------------------------------------------------------------------

def _platform(target: str) -> str:
    return "gpu" if target in ("gpu", "cuda", "rocm") else target


def _local_backend() -> str | None:
    import jax
    try:
        return _platform(jax.default_backend())
    except RuntimeError:
        return None


def compiler_for(target: str) -> tuple[str | None, str]:
    """('local' | 'deviceless' | None, why): how forms can be compiled for `target` here."""
    from . import xla as _xla
    if _local_backend() == _platform(target):
        return "local", "compiled on the local backend"
    if _platform(target) == "gpu" and _xla.gpu_aot_available():
        import jax
        if "cpu" in (jax.config.jax_platforms or "").split(","):
            return "deviceless", "compiled by XLA's deviceless H200 compiler"
        return None, "the deviceless GPU compiler needs JAX_PLATFORMS=cpu"
    return None, f"no compiler for target {target!r} in this process"


def _specs(cj):
    import jax
    return [jax.ShapeDtypeStruct(v.aval.shape, v.aval.dtype) for v in cj.jaxpr.invars]


def _fn(cj) -> Callable:
    return lambda *args: C.eval_jaxpr(cj, *args)


def compile_form(cj, how: str):
    """Compile the closed jaxpr `cj` as a program of its own ('local' or 'deviceless')."""
    global COMPILES
    import jax
    from . import xla as _xla
    COMPILES += 1
    if how == "deviceless":
        return _xla.gpu_compile(jax.jit(_fn(cj)), *_specs(cj))
    return jax.jit(_fn(cj)).trace(*_specs(cj)).lower().compile()


def launch_count(compiled, target: str) -> int:
    from . import xla as _xla
    if _platform(target) == "cpu":
        return _xla.cpu_fusions(compiled)
    return _xla.gpu_kernels(compiled)


def run_time(compiled, cj, reps: int = 5) -> float:
    """Median seconds of one run of `compiled` on zeros (local backend only). The zeros are
    numpy arrays: we may be inside `optimize`'s trace, where `jnp.zeros` would be a tracer."""
    import jax
    args = [np.zeros(v.aval.shape, v.aval.dtype) for v in cj.jaxpr.invars]
    jax.block_until_ready(compiled(*args))
    ts = []
    for _ in range(reps):
        t = time.perf_counter()
        jax.block_until_ready(compiled(*args))
        ts.append(time.perf_counter() - t)
    return statistics.median(ts)


def paired_times(a, cj_a, b, cj_b, reps: int = 5) -> tuple[float, float]:
    """Paired medians: a, b, a, b, ... so drift on a shared machine hits both alike."""
    ta, tb = [], []
    for _ in range(reps):
        ta.append(run_time(a, cj_a, 1))
        tb.append(run_time(b, cj_b, 1))
    return statistics.median(ta), statistics.median(tb)


def choose_timed(ctx, pass_name: str, original, candidate, key_extra: tuple = (),
                 run: bool = True) -> tuple[bool, str]:
    """Whether to keep `candidate` for `original` (both whole programs, ClosedJaxprs), by
    compiling each once on the local backend (lower + compile seconds) and running them paired
    on zeros (not with `run=False`: a loop whose trips depend on the data might not end on
    zeros): `backend.cost.reroll_measured` decides. Cached as `choose` caches; where nothing can be
    compiled here, the candidate is kept (the pass's own cost model has already decided)."""
    from . import cost as _cost
    report, target = ctx.report, ctx.target
    key, rec = _cached(report, original, pass_name, target, "time", key_extra)
    if rec is not None:
        return rec["split"], f"autotune (cached): {rec.get('why', '')}"
    how, how_why = compiler_for(target)
    if how != "local":
        report.count("autotune.model_only")
        return True, f"autotune: not measured ({how_why})"
    try:
        seconds = []
        for cj in (original, candidate):
            t = time.perf_counter()
            compiled = compile_form(cj, how)
            seconds.append((time.perf_counter() - t, compiled))
        (c0, a), (c1, b) = seconds
        r0, r1 = paired_times(a, original, b, candidate) if run else (None, None)
    except Exception as e:  # noqa: BLE001 - a form XLA rejects or zeros cannot run: kept, uncached
        report.count("autotune.compile_failed")
        return True, f"autotune: not measured ({type(e).__name__})"
    report.count("autotune.compiles", 2)
    go, why = _cost.reroll_measured(c1 / c0, r1 / max(r0, 1e-9) if run else None, target)
    why += f" (compile {c0:.2f} -> {c1:.2f} s)"
    if key:
        store(key, {"split": go, "why": why, "compile_s": [c0, c1], "run_s": [r0, r1],
                    "target": target})
    return go, f"autotune: {why}"


def closed_level(jaxpr, consts) -> C.ClosedJaxpr:
    """A level of a program as a program of its own (its consts closed over)."""
    return C.closed(jaxpr, list(consts))


def _cached(report, original, *key_parts) -> tuple[str | None, dict | None]:
    """(cache key or None where `original` has no stable identity, the cached record or None)."""
    import jax
    try:
        key = digest(original, *key_parts, jax.__version__)
    except Unstable:
        return None, None
    rec = lookup(key)
    if rec is not None:
        report.count("autotune.cached")
    return key, rec


def choose(ctx, pass_name: str, original, build: Callable, model_go: bool, model_why: str,
           key_extra: tuple = ()) -> tuple[bool, str, object]:
    """Whether to take the candidate form of one level: (go, why, candidate or None).

    `original` is the level as a ClosedJaxpr; `build()` makes the candidate (only when it is
    needed); `model_go`/`model_why` are the cost model's verdict, used where nothing can be
    compiled and as the tie-break of `backend.cost.pick_by_counts`.
    """
    from . import cost as _cost
    mode, target, report = ctx.options.autotune, ctx.target, ctx.report
    key, rec = _cached(report, original, pass_name, target, str(mode), key_extra)
    if rec is not None:
        return rec["split"], f"autotune (cached): {rec.get('why', '')}", None
    how, how_why = compiler_for(target)
    if how is None:
        report.count("autotune.model_only")
        return model_go, f"autotune: {how_why}; {model_why}", None
    candidate = build()
    try:
        a, b = compile_form(original, how), compile_form(candidate, how)
    except Exception as e:  # noqa: BLE001 - a form XLA rejects: the model decides, uncached
        report.count("autotune.compile_failed")
        return model_go, f"autotune: compile failed ({type(e).__name__}); {model_why}", candidate
    report.count("autotune.compiles", 2)
    n0, n1 = launch_count(a, target), launch_count(b, target)
    go, why = _cost.pick_by_counts(n0, n1, model_go, model_why, target)
    if mode == "time" and how == "local":
        try:
            t0, t1 = paired_times(a, original, b, candidate)
        except Exception as e:  # noqa: BLE001 - e.g. a dtype numpy cannot make: counts decide
            why += f" (not timed: {type(e).__name__})"
        else:
            go = t1 < t0
            why = f"timed {t1 / t0:.2f}x the original's run time ({n0} -> {n1} launches)"
    if key:
        store(key, {"split": go, "why": why, "launches": [n0, n1], "target": target})
    return go, f"autotune: {why}", candidate
