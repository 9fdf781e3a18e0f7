"""Shared measuring helpers for bench/*.py.

How we measure (these machines are shared and noisy): ratios in one process, paired runs
(baseline, candidate, baseline, ...), medians of at least 5. An absolute time means little; a
ratio in one run means a lot.
"""
from __future__ import annotations

import contextlib
import gc
import importlib.util
import json
import os
import statistics
import sys
import time
from typing import Callable, Sequence

import jax

HERE = os.path.dirname(os.path.abspath(__file__))
RESULTS = os.path.join(HERE, "results")
sys.path.insert(0, os.path.dirname(HERE))  # run from a checkout without installing


def missing(libraries: dict[str, str]) -> list[str]:
    """The distributions in `libraries` (import name -> distribution) not importable here."""
    return [dist for mod, dist in libraries.items() if importlib.util.find_spec(mod) is None]


def block(x):
    return jax.tree_util.tree_map(lambda a: a.block_until_ready() if hasattr(a, "block_until_ready") else a, x)


def paired(fns: dict[str, Callable[[], object]], repeats: int = 7, warmup: int = 1) -> dict[str, float]:
    """Median seconds of each zero-argument callable, run interleaved (a, b, c, a, b, c, ...)."""
    return paired_with_cores(fns, repeats, warmup)[0]


def paired_with_cores(fns: dict[str, Callable[[], object]], repeats: int = 7,
                      warmup: int = 1) -> tuple[dict[str, float], dict[str, float]]:
    """`paired`'s medians, and for each callable the median CPU seconds per wall second of its
    calls (the process's CPU time, every thread: about how many cores it kept busy)."""
    for f in fns.values():
        for _ in range(warmup):
            block(f())
    samples: dict[str, list[float]] = {k: [] for k in fns}
    cores: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(repeats):
        for k, f in fns.items():
            c, t = time.process_time(), time.perf_counter()
            block(f())
            wall = time.perf_counter() - t
            samples[k].append(wall)
            cores[k].append((time.process_time() - c) / max(wall, 1e-9))
    return ({k: statistics.median(v) for k, v in samples.items()},
            {k: statistics.median(v) for k, v in cores.items()})


@contextlib.contextmanager
def one_core():
    """Every thread of this process, XLA's thread pools included, on one core for the block: runs
    on one core in the same process and rounds as the others, to set beside one-core figures
    (OpenSSL's). Yields the core, or None where threads cannot be pinned (not Linux); the threads'
    own affinities come back after."""
    try:
        tids = [int(t) for t in os.listdir("/proc/self/task")]
        before = {t: os.sched_getaffinity(t) for t in tids}
    except (AttributeError, OSError):   # no per-thread affinity here
        yield None
        return
    mask = os.sched_getaffinity(0)
    core = min(mask)
    for t in tids:
        try:
            os.sched_setaffinity(t, {core})
        except OSError:                 # the thread ended meanwhile
            pass
    try:
        yield core
    finally:
        for t in [int(t) for t in os.listdir("/proc/self/task")]:
            try:
                os.sched_setaffinity(t, before.get(t, mask))   # a thread born inside: the mask
            except OSError:
                pass


def paired_calls(fns: dict[str, Callable[[], object]], repeats: int = 7, inner: int = 1000) -> dict[str, float]:
    """Median seconds per call over `inner` back-to-back calls (for dispatch overhead)."""
    def many(f):
        def run():
            r = None
            for _ in range(inner):
                r = f()
            return r
        return run
    med = paired({k: many(f) for k, f in fns.items()}, repeats=repeats)
    return {k: v / inner for k, v in med.items()}


def calls_per_sample(f, arg, seconds: float, cap: int = 1000) -> int:
    """How many back-to-back calls of `f(arg)` make one timing sample of about `seconds`."""
    block(f(arg))
    t = time.perf_counter()
    block(f(arg))
    once = max(time.perf_counter() - t, 1e-6)
    return max(1, min(cap, int(seconds / once)))


def phases(jitted, *args, **kwargs) -> dict:
    """Seconds for trace, lower and compile of a `jax.jit`-like object (fresh, not cached)."""
    gc.collect()
    t0 = time.perf_counter()
    traced = jitted.trace(*args, **kwargs)
    t1 = time.perf_counter()
    lowered = traced.lower()
    t2 = time.perf_counter()
    compiled = lowered.compile()
    t3 = time.perf_counter()
    return dict(trace=t1 - t0, lower=t2 - t1, compile=t3 - t2, lowered=lowered, compiled=compiled)


def paired_phases(make: dict[str, Callable[[], object]], args: Sequence, repeats: int = 5) -> dict[str, dict]:
    """Median trace/lower/compile seconds per variant; `make[k]()` returns a FRESH jitted object
    (so nothing is cached between repeats), interleaved across variants."""
    samples: dict[str, dict[str, list[float]]] = {k: {"trace": [], "lower": [], "compile": []} for k in make}
    last = {}
    for _ in range(repeats):
        for k, mk in make.items():
            jax.clear_caches()
            p = phases(mk(), *args)
            for ph in ("trace", "lower", "compile"):
                samples[k][ph].append(p[ph])
            last[k] = p
    out = {}
    for k, s in samples.items():
        out[k] = {ph: statistics.median(v) for ph, v in s.items()}
        out[k]["lowered"] = last[k]["lowered"]
        out[k]["compiled"] = last[k]["compiled"]
    return out


def mlir_functions(lowered) -> int:
    """Number of `func.func` operations in a lowered module (walked, not grepped)."""
    module = lowered.compiler_ir("stablehlo")
    count = 0
    for op in module.body.operations:
        if op.operation.name == "func.func":
            count += 1
    return count


def cpu_fusions(compiled) -> int:
    """Fusions in a compiled CPU program (delegates to jaxrewrite.backend.xla when it exists)."""
    try:
        from jaxrewrite.backend import xla as _xla
        return _xla.cpu_fusions(compiled)
    except ImportError:
        text = compiled.as_text()
        return sum(1 for line in text.splitlines() if " fusion(" in line and "=" in line and "ENTRY" not in line)


def gpu_launches(hlo: str, trips: int = 1) -> int:
    """Kernel launches per call in optimized GPU HLO text: ENTRY's launches, plus each while
    loop's body launches x its trips and its condition's x (trips + 1). A loop's trips are
    XLA's own `known_trip_count` where it has one, else `trips`."""
    import re
    launch = re.compile(r"\s(fusion|custom-call|copy|sort|conditional|gather|scatter|concatenate)\(")
    blocks = {b.split("(")[0].split()[-1].lstrip("%") if b.strip() else "": b
              for b in re.split(r"\n(?=\S)", hlo)}
    entry = next(b for b in blocks.values() if b.startswith("ENTRY"))
    total = len(launch.findall(entry))
    for m in re.finditer(r"while\(.*?condition=%?([\w.\-]+), body=%?([\w.\-]+)(.*)", hlo):
        cond, body = m.group(1), m.group(2)
        known = re.search(r'"known_trip_count":\{"n":"(\d+)"\}', m.group(3))
        n = int(known.group(1)) if known else trips
        total += n * len(launch.findall(blocks.get(body, ""))) + (n + 1) * len(
            launch.findall(blocks.get(cond, "")))
    return total


def op_profile(call: Callable[[], object], calls: int = 3, top: int = 15) -> dict:
    """Where a compiled call's time goes, op by op: `call()` run `calls` times under JAX's
    profiler (after one warm-up), its XLA ops' device time per call. On an accelerator the ops
    are the device plane's "XLA Ops" line; on the CPU, the thunks that name their HLO op. Gives
    `total_ms`, `by_kind` (ms per op kind: the HLO op's name without its number, or the
    profiler's category where it gives one) and the `top` ops (name, ms, calls per call, long
    name where the profiler gives one). Ratios between two forms of a program say which ops
    make the difference; absolute times here include the profiler's overhead."""
    import glob
    import re
    import tempfile

    block(call())
    with tempfile.TemporaryDirectory() as tmp:
        with jax.profiler.trace(tmp):
            for _ in range(calls):
                block(call())
        paths = glob.glob(os.path.join(tmp, "**", "*.xplane.pb"), recursive=True)
        if not paths:
            return {"error": "the profiler wrote no xplane file"}
        data = jax.profiler.ProfileData.from_file(paths[0])
    ops: dict[str, list] = {}
    for plane in data.planes:
        device = plane.name.startswith("/device:")
        for line in plane.lines:
            if device and line.name != "XLA Ops":
                continue
            for e in line.events:
                stats = dict(e.stats)
                if not device and "hlo_op" not in stats:
                    continue
                kind = stats.get("hlo_category") or re.sub(r"[.]\d+$", "", e.name)
                entry = ops.setdefault(e.name, [0.0, 0, str(kind),
                                                str(stats.get("long_name", ""))])
                entry[0] += e.duration_ns / 1e6 / calls
                entry[1] += 1
    by_kind: dict[str, float] = {}
    for ms, _, kind, _ in ops.values():
        by_kind[kind] = by_kind.get(kind, 0.0) + ms
    ranked = sorted(ops.items(), key=lambda kv: -kv[1][0])[:top]
    return {"total_ms": round(sum(v[0] for v in ops.values()), 4),
            "by_kind": {k: round(v, 4) for k, v in sorted(by_kind.items(), key=lambda kv: -kv[1])},
            "top": [[name, round(ms, 4), n // calls, long[:160]]
                    for name, (ms, n, _, long) in ranked]}


def on_cpu() -> bool:
    """Whether programs run on XLA:CPU here (the default backend): what CPU-only measurements
    (one-core pinning, OpenSSL beside it, XLA:CPU's compile options) need."""
    return jax.default_backend() == "cpu"


def device() -> dict:
    """The backend and the device the programs run on, for every table's metadata."""
    d = jax.devices()[0]
    return dict(backend=jax.default_backend(), device_kind=d.device_kind,
                device_count=jax.device_count())


def write_results(name: str, rows: list[dict], meta: dict | None = None) -> str:
    os.makedirs(RESULTS, exist_ok=True)
    path = os.path.join(RESULTS, f"{name}.json")
    payload = dict(name=name, jax=jax.__version__, **device(),
                   date=time.strftime("%Y-%m-%d %H:%M:%S"), xla_flags=os.environ.get("XLA_FLAGS"),
                   meta=meta or {}, rows=rows)
    with open(path, "w") as f:
        json.dump(payload, f, indent=1, default=str)
    return path


def fmt(v) -> str:
    if isinstance(v, float):
        if v == 0:
            return "0"
        if abs(v) >= 100:
            return f"{v:.0f}"
        if abs(v) >= 1:
            return f"{v:.2f}"
        return f"{v:.3g}"
    return str(v)


def markdown_table(rows: list[dict], columns: Sequence[str] | None = None) -> str:
    if not rows:
        return "(no rows)"
    cols = list(columns or rows[0].keys())
    lines = ["| " + " | ".join(cols) + " |", "| " + " | ".join("---" for _ in cols) + " |"]
    for r in rows:
        lines.append("| " + " | ".join(fmt(r.get(c, "")) for c in cols) + " |")
    return "\n".join(lines)


def cli(name: str, main: Callable[[bool], list[dict]], columns: Sequence[str] | None = None):
    """The `python bench/<name>.py [--quick]` entry point."""
    quick = "--quick" in sys.argv[1:]
    rows = main(quick)
    print(markdown_table(rows, columns))
    print(f"\nwritten {write_results(name, rows, dict(quick=quick))}")


def compile_on_row(make: Callable, args: Sequence, overrides: dict, target: str = "tpu"):
    """(seconds of trace + rewrite + lower + compile of a fresh `make()`, caches cleared, the
    compiled program, the rewrite's report or None for a plain jax.jit), with `target`'s cost
    row overridden by `overrides` (`backend.cost.override_row`) while it is made."""
    import jax
    import jaxrewrite
    from jaxrewrite.backend import cost
    jax.clear_caches()
    before = jaxrewrite.last_report()
    with cost.override_row(target, **overrides):
        t = time.perf_counter()
        compiled = make().lower(*args).compile()
        seconds = time.perf_counter() - t
    report = jaxrewrite.last_report()
    return seconds, compiled, (report if report is not before else None)
