"""Size and depth (issue 7): how optimize's cost grows with the program, against jax.jit.

    python bench/scale.py [--quick]

1. Size: a program of N equations (a repeating block of elementwise math, static slices,
   reverses, static-index gathers and shared/fresh inner jits, so every pass has work to do),
   N = 1k, 10k, 100k (quick: 1k, 4k). For each: trace and lower medians for jax.jit and
   optimize (paired, caches cleared before each), the ratio, the pipeline's own time (the
   passes, from the report) as a fraction of the user program's trace, and microseconds per
   equation (linear growth shows as a flat column). The 10k program again with `target='gpu'`:
   there scalarize has no minimum piece size, so it analyses every equation before declining.
2. Depth: 100 nested jits (`jit(jit(...(x)))`), trace+lower ratio and a correctness check.
3. Memory: a program over a large integer constant (1 GB; quick: 64 MB) used in index arithmetic;
   peak traced memory (tracemalloc) of optimize's trace+lower against jax.jit's. The folding cap
   (`fold_limit`) must keep optimize from materialising copies of the constant.
"""
from __future__ import annotations

import functools
import os
import statistics
import sys
import time
import tracemalloc

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _common  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import jaxrewrite  # noqa: E402

NAME = "scale"
COLUMNS = ("case", "eqns", "trace_ms_jit", "trace_ms_opt", "lower_ms_jit", "lower_ms_opt",
           "trace_lower_ratio", "passes_ms", "passes_over_trace", "us_per_eqn_opt", "peak_mb_jit",
           "peak_mb_opt", "ok")

_PERM = np.array([3, 0, 2, 1], np.int32)
_shared = jax.jit(lambda v: jnp.tanh(v) * 2)


def _block(x, k):
    """About 10 equations: math, slicing, a static gather, a shared and a fresh inner jit."""
    y = jnp.sin(x) * 1.5 + x
    y = y[_PERM]                                  # static gather
    y = jnp.concatenate([y[1:], y[:1]])           # static slices + concat
    y = _shared(y)                                # the same inner jit every block
    y = jax.jit(functools.partial(lambda c, v: v - c, float(k % 3)))(y)  # a fresh closure
    return y[::-1] * 0.5 + x


def size_program(n_blocks: int):
    def f(x):
        for k in range(n_blocks):
            x = _block(x, k)
        return x
    return f


def depth_program(depth: int):
    def f(x):
        g = lambda v: jnp.sin(v) + 1  # noqa: E731
        for _ in range(depth):
            g = jax.jit(functools.partial(lambda inner, v: inner(v) * 1.0001, g))
        return g(x)
    return f


def count_eqns(fn, *args) -> int:
    from jaxrewrite import _walk
    return _walk.count_eqns(jax.make_jaxpr(fn)(*args))


def _pass_time(fn, *args, **opts) -> tuple[float, float]:
    """(pipeline seconds, user-trace seconds) of one fresh optimize trace."""
    jax.clear_caches()
    jaxrewrite.optimize(fn, **opts).trace(*args)
    rep = jaxrewrite.last_report()
    return rep.timings.get("rewrite", 0.0), rep.timings.get("trace", 0.0)


def phase_row(case: str, fn, args, repeats: int, **opts) -> dict:
    make = {"jit": lambda: jax.jit(fn), "opt": lambda: jaxrewrite.optimize(fn, **opts)}
    ph = _common.paired_phases_tl(make, args, repeats) if hasattr(_common, "paired_phases_tl") \
        else _trace_lower(make, args, repeats)
    passes = [_pass_time(fn, *args, **opts) for _ in range(max(1, repeats // 2))]
    p_med = statistics.median(p for p, _ in passes)
    t_med = statistics.median(t for _, t in passes)
    n = count_eqns(fn, *args)
    tl_jit = ph["jit"]["trace"] + ph["jit"]["lower"]
    tl_opt = ph["opt"]["trace"] + ph["opt"]["lower"]
    return dict(case=case, eqns=n,
                trace_ms_jit=1e3 * ph["jit"]["trace"], trace_ms_opt=1e3 * ph["opt"]["trace"],
                lower_ms_jit=1e3 * ph["jit"]["lower"], lower_ms_opt=1e3 * ph["opt"]["lower"],
                trace_lower_ratio=tl_opt / tl_jit, passes_ms=1e3 * p_med,
                passes_over_trace=p_med / t_med, us_per_eqn_opt=1e6 * tl_opt / n)


def _trace_lower(make, args, repeats) -> dict:
    """Median trace and lower seconds per variant, paired, caches cleared (no compile)."""
    samples = {k: {"trace": [], "lower": []} for k in make}
    for _ in range(repeats):
        for k, mk in make.items():
            jax.clear_caches()
            t0 = time.perf_counter()
            traced = mk().trace(*args)
            t1 = time.perf_counter()
            traced.lower()
            t2 = time.perf_counter()
            samples[k]["trace"].append(t1 - t0)
            samples[k]["lower"].append(t2 - t1)
    return {k: {ph: statistics.median(v) for ph, v in s.items()} for k, s in samples.items()}


def depth_row(depth: int, repeats: int) -> dict:
    fn = depth_program(depth)
    x = jnp.arange(4.0)
    row = phase_row(f"depth {depth} nested jits", fn, (x,), repeats)
    got, want = jaxrewrite.optimize(fn)(x), jax.jit(fn)(x)
    row["ok"] = bool(np.array_equal(np.asarray(got).view(np.uint32), np.asarray(want).view(np.uint32)))
    return row


def memory_program(n_elems: int):
    big = np.arange(n_elems, dtype=np.int32)

    def f(x):
        idx = (big * 3 + 1) % 4                    # index arithmetic over a huge constant
        return x[idx[:4]] + (big[-4:] % 7).astype(x.dtype)
    return f


def _peak_mb(fn) -> float:
    import gc
    gc.collect()
    tracemalloc.start()
    tracemalloc.reset_peak()
    base = tracemalloc.get_traced_memory()[0]
    fn()
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return (peak - base) / 2 ** 20


def memory_row(n_elems: int) -> dict:
    fn = memory_program(n_elems)
    x = jnp.arange(4.0)
    jax.clear_caches()
    peak_jit = _peak_mb(lambda: jax.jit(fn).trace(x).lower())
    jax.clear_caches()
    peak_opt = _peak_mb(lambda: jaxrewrite.optimize(fn).trace(x).lower())
    got, want = jaxrewrite.optimize(fn)(x), jax.jit(fn)(x)
    return dict(case=f"constant {n_elems * 4 / 2 ** 20:.0f} MB", eqns=count_eqns(fn, x),
                peak_mb_jit=peak_jit, peak_mb_opt=peak_opt,
                ok=bool(np.array_equal(np.asarray(got), np.asarray(want))))


def main(quick: bool = False) -> list[dict]:
    rows = []
    # blocks of ~16 equations: ~1k, ~10k, ~100k equations (quick: ~1k, ~4k)
    sizes = ((63, 3), (250, 3)) if quick else ((63, 5), (625, 3), (6250, 1))
    x = jnp.arange(4.0)
    for nb, repeats in sizes:
        fn = size_program(nb)
        row = phase_row(f"size {nb} blocks", fn, (x,), repeats)
        if nb <= 1000:  # compiling the 100k-equation program is XLA's time, not ours
            got, want = jaxrewrite.optimize(fn)(x), jax.jit(fn)(x)
            row["ok"] = bool(np.array_equal(np.asarray(got).view(np.uint32),
                                            np.asarray(want).view(np.uint32)))
        rows.append(row)
    if not quick:
        # The same 10k program rewritten for the GPU (lowered here for the CPU): scalarize has
        # no minimum piece size there, so it links every equation before it declines.
        rows.append(phase_row("size 625 blocks, target='gpu'", size_program(625), (x,), 3,
                              target="gpu"))
    rows.append(depth_row(100, 3))
    rows.append(memory_row((16 << 20) if quick else (256 << 20)))
    return rows


if __name__ == "__main__":
    _common.cli(NAME, main, COLUMNS)
