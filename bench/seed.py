"""The seed programs (issue 2): jax.jit vs jaxrewrite.optimize, in one process.

    python bench/seed.py [--quick]

1. The inner-jit loop: an outer function calls an inner function 10 times in a Python loop, the
   inner one as `jax.jit(body, inline=True)`, as `jax.jit(body)`, or as a fresh closure
   `jax.jit(lambda y: body(y))` per call (traced, lowered and compiled once per copy by JAX).
2. The 7-iteration program: an inner jitted function applies a column function to a 4x4 uint32
   matrix with `vmap`, then moves diagonals into columns (`out[i, j] = m[i, (i + j) % 4]`) with
   `lax.gather`, `jnp.take`, ravel-index-reshape, or no permutation; the column function is a
   plain shift left, or the interdependent one (`a <<= 7; b += a; c *= b`, three times, then
   `jnp.array([a, b, c, d])`). The outer function runs it 7 times, over a batch of matrices.
3. The steady-state call overhead of `optimize(f)` against `jax.jit(f)` (target: within 5%).

For each program: equations and distinct inner jaxprs of the traced program, MLIR functions,
trace / lower / compile medians (paired, caches cleared before each), CPU fusions, run time
(paired medians), and optimize's ratios to jax.jit.
"""
from __future__ import annotations

import functools
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _common  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax import lax  # noqa: E402

import jaxrewrite  # noqa: E402
from jaxrewrite import _walk  # noqa: E402
from jaxrewrite._explain import inner_jaxprs  # noqa: E402
from jaxrewrite.testing import assert_contract_equal  # noqa: E402

NAME = "seed"
COLUMNS = ("program", "eqns_jit", "eqns_opt", "jaxprs_jit", "jaxprs_opt", "funcs_jit", "funcs_opt",
           "trace_ms_jit", "trace_ms_opt", "lower_ms_jit", "lower_ms_opt", "compile_ms_jit",
           "compile_ms_opt", "compile_ratio", "fusions_jit", "fusions_opt", "run_us_jit",
           "run_us_opt", "run_ratio")

# the narrower table that `bench/run.py --update-readme` puts into docs/measurements.md
README_COLUMNS = ("program", "eqns_jit", "eqns_opt", "jaxprs_jit", "jaxprs_opt", "compile_ms_jit",
                  "compile_ms_opt", "compile_ratio", "fusions_jit", "fusions_opt", "run_ratio")


# --- 1. the inner-jit loop ------------------------------------------------------------------------

def body(x):
    y = jnp.tanh(x @ x.T) * 0.5 + x
    return jnp.sin(y) * jnp.cos(x) + 1.0


def loop_program(mode: str):
    inline = jax.jit(body, inline=True)
    shared = jax.jit(body)

    def loop(x):
        for _ in range(10):
            if mode == "inline":
                x = inline(x)
            elif mode == "jit":
                x = shared(x)
            else:  # a fresh closure per call, as in a loop that builds its step function
                x = jax.jit(lambda y: body(y))(x)
        return x

    loop.__name__ = f"loop_{mode}"
    return loop


# --- 2. the 7-iteration program -------------------------------------------------------------------

ROW, COL = np.meshgrid(np.arange(4), np.arange(4), indexing="ij")
DIAG_COL = (ROW + COL) % 4                   # out[i, j] = m[i, (i + j) % 4]
FLAT = ROW * 4 + DIAG_COL                    # the same, as indices into m.ravel()
GATHER_IDX = np.stack([ROW, DIAG_COL], axis=-1).astype(np.int32)   # (4, 4, 2)


def col_shift(col):
    return col << 1


def col_mix(col):
    a, b, c, d = col[0], col[1], col[2], col[3]
    for _ in range(3):
        a = a << 7
        b = b + a
        c = c * b
    return jnp.array([a, b, c, d])


def perm_gather(m):
    dn = lax.GatherDimensionNumbers(offset_dims=(), collapsed_slice_dims=(0, 1),
                                    start_index_map=(0, 1))
    return lax.gather(m, GATHER_IDX, dn, slice_sizes=(1, 1),
                      mode=lax.GatherScatterMode.PROMISE_IN_BOUNDS)


def perm_take(m):
    return jnp.take(m.ravel(), FLAT)


def perm_ravel(m):
    return m.ravel()[FLAT.ravel()].reshape(4, 4)


def perm_none(m):
    return m


PERMS = {"gather": perm_gather, "take": perm_take, "ravel": perm_ravel, "none": perm_none}
COLFNS = {"shift": col_shift, "mix": col_mix}


def rounds_program(colfn, perm):
    @jax.jit
    def inner(m):
        return perm(jax.vmap(colfn, in_axes=1, out_axes=1)(m))

    def one(m):
        for _ in range(7):
            m = inner(m)
        return m

    def rounds(ms):
        return jax.vmap(one)(ms)

    rounds.__name__ = f"rounds_{colfn.__name__[4:]}_{perm.__name__[5:]}"
    return rounds


def programs(quick: bool):
    n, batch = (64, 1024) if quick else (128, 65536)   # 65,536: the batch of the H200 figures
    x = jnp.asarray(np.random.default_rng(0).standard_normal((n, n)), jnp.float32) * 0.1
    ms = jnp.asarray(np.random.default_rng(1).integers(0, 2**32, (batch, 4, 4), dtype=np.uint32))
    out = [(f"loop/{mode}", loop_program(mode), x) for mode in ("inline", "jit", "closure")]
    for cname, colfn in COLFNS.items():
        for pname, perm in PERMS.items():
            out.append((f"rounds/{cname}/{pname}", rounds_program(colfn, perm), ms))
    return out


# --- measuring ------------------------------------------------------------------------------------

def measure(name: str, fn, arg, quick: bool, gpu_target: str | None = None) -> dict:
    reps = 3 if quick else 5
    ph = _common.paired_phases({"jit": lambda: jax.jit(fn), "opt": lambda: jaxrewrite.optimize(fn)},
                               (arg,), repeats=reps)
    jit_f, opt_f = jax.jit(fn), jaxrewrite.optimize(fn)
    # integers bit for bit, floats (the loop programs) within the contract: on a TPU the
    # rounding of float math follows its fusions, as on any backend
    assert_contract_equal(opt_f(arg), jit_f(arg), meta=False)
    tj, to = jit_f.trace(arg).jaxpr, opt_f.trace(arg).jaxpr
    run = _common.paired_calls({"jit": lambda: jit_f(arg), "opt": lambda: opt_f(arg)},
                               repeats=5 if quick else 11,
                               inner=_common.calls_per_sample(jit_f, arg, 0.01 if quick else 0.02))
    row = dict(program=name,
               eqns_jit=_walk.count_eqns(tj), eqns_opt=_walk.count_eqns(to),
               jaxprs_jit=inner_jaxprs(tj), jaxprs_opt=inner_jaxprs(to),
               funcs_jit=_common.mlir_functions(ph["jit"]["lowered"]),
               funcs_opt=_common.mlir_functions(ph["opt"]["lowered"]))
    for phase in ("trace", "lower", "compile"):
        row[f"{phase}_ms_jit"] = ph["jit"][phase] * 1e3
        row[f"{phase}_ms_opt"] = ph["opt"][phase] * 1e3
    row["compile_ratio"] = ph["opt"]["compile"] / ph["jit"]["compile"]
    row["fusions_jit"] = _common.cpu_fusions(ph["jit"]["compiled"])
    row["fusions_opt"] = _common.cpu_fusions(ph["opt"]["compiled"])
    row["run_us_jit"], row["run_us_opt"] = run["jit"] * 1e6, run["opt"] * 1e6
    row["run_ratio"] = run["opt"] / run["jit"]
    if gpu_target:
        row.update(_gpu_kernels(fn, arg, gpu_target))
    return row


def _gpu_kernels(fn, arg, target: str) -> dict:
    """Kernels of each program compiled for `target` without a GPU (the gpu-aot extra)."""
    from jaxrewrite.backend import xla as _xla
    makers = (("jit", jax.jit), ("opt", functools.partial(jaxrewrite.optimize, target="gpu")))
    return {f"kernels_{k}": _xla.gpu_kernels(_xla.gpu_compile(mk(fn), arg, target=target))
            for k, mk in makers}


def overhead(quick: bool) -> dict:
    """Steady-state per-call time of optimize(f) vs jax.jit(f) on a tiny function (paired)."""
    def tiny(x):
        return x * 2.0 + 1.0

    x = jnp.ones((8,), jnp.float32)
    jit_f, opt_f = jax.jit(tiny), jaxrewrite.optimize(tiny)
    med = _common.paired_calls({"jit": lambda: jit_f(x), "opt": lambda: opt_f(x)},
                               repeats=7 if quick else 15, inner=300 if quick else 2000)
    return dict(program="call overhead", run_us_jit=med["jit"] * 1e6, run_us_opt=med["opt"] * 1e6,
                run_ratio=med["opt"] / med["jit"])


def main(quick: bool = False, gpu_target: str | None = None) -> list[dict]:
    rows = []
    progs = programs(quick)
    for i, (name, fn, arg) in enumerate(progs, 1):
        print(f"[seed {i}/{len(progs) + 1}] {name}", file=sys.stderr, flush=True)
        rows.append(measure(name, fn, arg, quick, gpu_target))
    print(f"[seed {len(progs) + 1}/{len(progs) + 1}] call overhead", file=sys.stderr, flush=True)
    rows.append(overhead(quick))
    return rows


if __name__ == "__main__":
    _common.cli(NAME, main, COLUMNS)
