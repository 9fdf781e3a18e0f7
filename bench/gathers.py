"""Static-index gathers (issue 4): jax.jit vs optimize (default) vs optimize(gathers="all").

    python bench/gathers.py [--quick] [--gpu-target h200]
    JAX_PLATFORMS=cpu .venv-gpu/bin/python bench/gathers.py --gpu-target h200   # + H200 kernels

Programs: the seed's 7-iteration program (interdependent column function; diagonals into columns
by `lax.gather`, `jnp.take`, ravel-index-reshape, or no permutation), and real static
permutations on a batch: diagonals to columns, FFT bit reversal, pixel shuffle (depth to space),
a roll, a transpose written as fancy indexing, a per-row rotation, a static scatter, and a
bitonic sorting network over 65,536 rows of 32 keys (above `fold_limit`).

Per program and variant: equations and gathers left in the traced program, CPU fusions, CPU run
time (paired medians, one process) and compile time (paired, caches cleared), as ratios to
jax.jit; kernels from XLA's deviceless GPU compile (`jaxrewrite.backend.xla`, the gpu-aot extra)
when a `gpu_target` is given, else those columns stay empty.
"""
from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _common  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import jaxrewrite  # noqa: E402
from jaxrewrite import _walk  # noqa: E402

NAME = "gathers"
# jit: jax.jit; opt: optimize() with every default pass; own: this area's passes only (fold,
# gathers, dedup, cse: movement and scalarize off); all: optimize(gathers="all").
VARIANTS = ("jit", "opt", "own", "all")
OWN = dict(movement=False, scalarize=False)
COLUMNS = ("program",
           *(f"eqns_{v}" for v in VARIANTS), *(f"gathers_{v}" for v in VARIANTS),
           *(f"fusions_{v}" for v in VARIANTS), *(f"kernels_{v}" for v in VARIANTS),
           "run_us_jit", *(f"run_ratio_{v}" for v in VARIANTS[1:]),
           "compile_ms_jit", *(f"compile_ratio_{v}" for v in VARIANTS[1:]))


def _make(variant, fn, target=None):
    if variant == "jit":
        return jax.jit(fn)
    kw = {} if target is None else dict(target=target)
    if variant == "own":
        kw.update(OWN)
    elif variant == "all":
        kw["gathers"] = "all"
    return jaxrewrite.optimize(fn, **kw)


# --- programs ---------------------------------------------------------------------------------------

def _bitrev(n):
    bits = n.bit_length() - 1
    return np.array([int(f"{i:0{bits}b}"[::-1], 2) for i in range(n)])


def _bitonic(x):
    """A bitonic sorting network over the last axis: per stage, `x[:, partner]` (a static
    permutation), then min/max and a select by a constant mask."""
    n = x.shape[-1]
    i = np.arange(n)
    k = 2
    while k <= n:
        j = k // 2
        while j >= 1:
            partner = i ^ j
            y = x[:, partner]
            x = jnp.where((i < partner) == ((i & k) == 0), jnp.minimum(x, y), jnp.maximum(x, y))
            j //= 2
        k *= 2
    return x


def permutations(quick: bool):
    b = 256 if quick else 4096
    rng = np.random.default_rng(0)
    i4 = np.arange(4)
    diag_rows = (i4[:, None] + i4[None, :]) % 4
    n_fft = 256 if quick else 1024
    C, r, H, W = 4, 2, 8, 8
    ps_idx = np.arange(C * r * r * H * W).reshape(C, r, r, H, W).transpose(0, 3, 1, 4, 2).reshape(-1)
    n = 16
    rot = (np.arange(n)[None, :] + np.arange(n)[:, None]) % n
    f32 = lambda *s: jnp.asarray(rng.standard_normal(s), jnp.float32)  # noqa: E731
    return [
        ("diagonals to columns", lambda x: x[:, diag_rows, i4[None, :]], f32(b, 4, 4)),
        ("fft bit reversal", lambda x: x[:, _bitrev(n_fft)], f32(b // 4, n_fft)),
        ("pixel shuffle", lambda x: x.reshape(x.shape[0], -1)[:, ps_idx].reshape(
            x.shape[0], C, H * r, W * r), f32(b // 8, C * r * r, H, W)),
        ("roll", lambda x: x[:, np.roll(np.arange(n), 3)], f32(b, n)),
        ("transpose as indexing", lambda x: x[:, np.arange(n)[None, :], np.arange(n)[:, None]],
         f32(b // 4, n, n)),
        ("per-row rotation", lambda x: jnp.take_along_axis(x, np.broadcast_to(rot, x.shape), -1),
         f32(b // 4, n, n)),
        ("reverse + stride", lambda x: x[:, ::-1][:, np.arange(0, n, 2)] * 2.0, f32(b, n)),
        ("static scatter", lambda x: x.at[:, np.array([1, 5, 9])].set(0.0), f32(b, n)),
        # 2^21 keys: above fold_limit, the rows pass through (issue 23: was declined, 1.0x)
        (f"bitonic sort {1024 if quick else 65536} x 32", _bitonic, jnp.asarray(
            rng.integers(-1000, 1000, (1024 if quick else 65536, 32)), jnp.int32)),
    ]


def seed_programs(quick: bool):
    import seed
    batch = 1024 if quick else 65536
    ms = jnp.asarray(np.random.default_rng(1).integers(0, 2**32, (batch, 4, 4), dtype=np.uint32))
    return [(f"seed rounds/mix/{p}", seed.rounds_program(seed.col_mix, seed.PERMS[p]), ms)
            for p in ("gather", "take", "ravel", "none")]


# --- measuring ------------------------------------------------------------------------------------

def _gathers(jaxpr) -> int:
    return sum(1 for e in _walk.iter_eqns(jaxpr) if e.primitive.name == "gather")


def measure(name, fn, arg, quick: bool, gpu_target: str | None = None) -> dict:
    reps = 2 if quick else 5
    fns = {v: _make(v, fn) for v in VARIANTS}
    ref = np.asarray(fns["jit"](arg))
    for v in VARIANTS[1:]:
        got = np.asarray(fns[v](arg))
        np.testing.assert_array_equal(got.view(np.uint8), ref.view(np.uint8), err_msg=f"{name}/{v}")
    row = dict(program=name)
    ph = _common.paired_phases({v: (lambda v=v: _make(v, fn)) for v in VARIANTS}, (arg,),
                               repeats=reps)
    for v in VARIANTS:
        tj = fns[v].trace(arg).jaxpr
        row[f"eqns_{v}"] = _walk.count_eqns(tj)
        row[f"gathers_{v}"] = _gathers(tj)
        row[f"fusions_{v}"] = _common.cpu_fusions(ph[v]["compiled"])
    inner = _common.calls_per_sample(fns["jit"], arg, 0.005 if quick else 0.02, cap=500)
    run = _common.paired_calls({v: (lambda f=fns[v]: f(arg)) for v in VARIANTS},
                               repeats=3 if quick else 11, inner=inner)
    row["run_us_jit"] = run["jit"] * 1e6
    row["compile_ms_jit"] = ph["jit"]["compile"] * 1e3
    for v in VARIANTS[1:]:
        row[f"run_ratio_{v}"] = run[v] / run["jit"]
        row[f"compile_ratio_{v}"] = ph[v]["compile"] / ph["jit"]["compile"]
    if gpu_target:
        row.update(_gpu_kernels(fn, arg, gpu_target))
    return row


def _gpu_kernels(fn, arg, target: str) -> dict:
    """GPU kernels from XLA's deviceless compile for `target` (needs the gpu-aot extra)."""
    from jaxrewrite.backend import xla as _xla
    return {f"kernels_{v}": _xla.gpu_kernels(_xla.gpu_compile(_make(v, fn, "gpu"), arg,
                                                              target=target))
            for v in VARIANTS}


def main(quick: bool = False, gpu_target: str | None = None) -> list[dict]:
    progs = permutations(quick) + seed_programs(quick)
    rows = []
    for i, (name, fn, arg) in enumerate(progs, 1):
        print(f"[gathers {i}/{len(progs)}] {name}", file=sys.stderr, flush=True)
        rows.append(measure(name, fn, arg, quick, gpu_target))
    return rows


if __name__ == "__main__":
    argv = sys.argv[1:]
    target = argv[argv.index("--gpu-target") + 1] if "--gpu-target" in argv else None
    _common.cli(NAME, lambda quick: main(quick, target), COLUMNS)
