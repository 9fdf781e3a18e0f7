"""Dedup and re-rolling: fresh closures lowered once; a remat transformer stack rolled into a scan.

Rows (one process, paired medians; ratios against jax.jit or the hand-written scan):
* `closures`: N fresh `jax.jit(lambda s: body(s))` closures of one 8-step body in a Python loop.
  Functions in the lowered module (MLIR `func.func` ops, walked), trace+lower seconds of
  `optimize(f)` vs `jax.jit(f)`, bit-identical results.
* `stack-grad`: `jax.grad(optimize(stack, reroll=True))` of an N-layer pre-norm transformer
  stack (4 heads, causal attention, GELU MLP, `jax.checkpoint` per layer, layers in a Python
  loop) vs `jax.grad(jax.jit(stack))` and vs a hand-written `lax.scan` over stacked parameters
  (`scan`) or over the per-layer list stacked inside (`list_scan`): seconds from `.lower()` to
  compiled, run time, temp memory (`memory_analysis()`), max relative difference and
  bit-identity of the gradients. (XLA:CPU compiles one kernel per output slice of a stacked
  gradient, N x leaves of them: what keeps the list-input forms behind `scan`.)
* `grad-stack`: the same for `optimize(jax.grad(stack), reroll=True)`.

* `inline loop`: the seed's loop of `jax.jit(body, inline=True)` calls (no call left in the
  jaxpr), `optimize(f, reroll=True)` vs `jax.jit(f)`: the repeated inline code is outlined and
  rolled (`passes/outline.py`). Compile (lower to compiled) and run ratios, scans made, max
  relative difference.

* GPU launches (`--gpu-target h200`, needs the gpu-aot extra and JAX_PLATFORMS=cpu): kernel
  launches per call of the stack's gradient, unrolled vs rolled with `unroll=` 1, 2, 4, N
  (loop-body launches x trips), from XLA's deviceless GPU compile.

    python bench/dedup.py [--quick] [--gpu-target h200]
    python bench/dedup.py --stack 24 [--repeats 5]     # only the stack rows, medians of 5

The full run compiles N >= 24 once per variant (N = 64 takes minutes per compile); `--stack`
gives those rows with medians. XLA:CPU's multi-output fusion, which is off by default, is what
lets one kernel write many output slices; to see what it changes, run the same command under
`XLA_FLAGS=--xla_backend_extra_options=xla_cpu_use_multi_output_fusion` (a user-side flag:
`compiler_options` does not accept it).
"""
from __future__ import annotations

import statistics
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

try:
    from _common import (calls_per_sample, gpu_launches, mlir_functions, paired, paired_calls,
                         paired_phases)
except ImportError:  # imported as bench.dedup
    from bench._common import (calls_per_sample, gpu_launches, mlir_functions, paired,
                               paired_calls, paired_phases)

import jaxrewrite

NAME = "dedup"
CLOSURE_COLUMNS = ("case", "N", "fn_jit", "fn_opt", "trace_lower_jit_s", "trace_lower_opt_s",
                   "trace_lower_ratio", "bit_identical")
STACK_COLUMNS = ("case", "N", "compile_jit_s", "compile_opt_s", "compile_scan_s",
                 "compile_list_scan_s", "compile_speedup", "scan_speedup", "list_scan_speedup", "run_ratio_vs_jit", "run_scan_vs_jit", "temp_mb_jit", "temp_mb_opt",
                 "temp_mb_scan", "temp_mb_list_scan", "params_mb", "max_rel_diff", "bit_identical")


# --- fresh closures ----------------------------------------------------------------------------

def _body(s):
    for _ in range(8):
        s = jnp.sin(s) * 1.5 + s
    return s


def _closures(n):
    def f(x):
        for _ in range(n):
            x = jax.jit(lambda s: _body(s))(x)
        return x
    return f


def _bits_equal(a, b) -> bool:
    la, lb = jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)
    return all(np.array_equal(np.asarray(x).view(np.uint8), np.asarray(y).view(np.uint8))
               for x, y in zip(la, lb))


def closures_row(n: int, repeats: int) -> dict:
    x = jnp.linspace(0, 1, 64)
    ph = paired_phases({"jit": lambda: jax.jit(_closures(n)),
                        "opt": lambda: jaxrewrite.optimize(_closures(n))}, [x], repeats=repeats)
    tl = {k: v["trace"] + v["lower"] for k, v in ph.items()}
    same = _bits_equal(ph["opt"]["compiled"](x), ph["jit"]["compiled"](x))
    return dict(case="closures", N=n, fn_jit=mlir_functions(ph["jit"]["lowered"]),
                fn_opt=mlir_functions(ph["opt"]["lowered"]),
                trace_lower_jit_s=tl["jit"], trace_lower_opt_s=tl["opt"],
                trace_lower_ratio=tl["opt"] / tl["jit"], bit_identical=same)


def _grad_closures(kind, n):
    def f(x):
        for _ in range(n):
            wrap = jax.checkpoint if kind == "checkpoint" else jax.jit
            x = wrap(lambda s: _body(s))(x)
        return x.sum()
    return f


def grad_closures_rows(n: int = 50, repeats: int = 3) -> list[dict]:
    """`jax.grad(optimize(f))` of N fresh jit / checkpoint closures, dedup on vs off: JAX's
    jvp/partial-eval/transpose caches key on the jaxpr object, so one shared body is
    differentiated once."""
    x = jnp.linspace(0, 1, 64)
    rows = []
    for kind in ("jit", "checkpoint"):
        ph = paired_phases({
            d: (lambda d=d: jax.jit(jax.grad(jaxrewrite.optimize(
                _grad_closures(kind, n), dedup=(d == "on"), cse=False))))
            for d in ("on", "off")}, [x], repeats=repeats)
        tl = {k: v["trace"] + v["lower"] for k, v in ph.items()}
        rows.append(dict(case=f"grad of {kind} closures", N=n,
                         fn_dedup_off=mlir_functions(ph["off"]["lowered"]),
                         fn_dedup_on=mlir_functions(ph["on"]["lowered"]),
                         trace_lower_off_s=tl["off"], trace_lower_on_s=tl["on"],
                         trace_lower_ratio=tl["on"] / tl["off"],
                         bit_identical=_bits_equal(ph["on"]["compiled"](x), ph["off"]["compiled"](x))))
    return rows


# --- transformer stack -------------------------------------------------------------------------

def _ln(x, g, b):
    m = x.mean(-1, keepdims=True)
    v = ((x - m) ** 2).mean(-1, keepdims=True)
    return (x - m) * jax.lax.rsqrt(v + 1e-5) * g + b


def _layer(p, x, heads=4):
    t, d = x.shape
    h = _ln(x, p["g1"], p["b1"])
    q, k, v = jnp.split(h @ p["wqkv"], 3, axis=-1)
    q, k, v = (a.reshape(t, heads, d // heads).transpose(1, 0, 2) for a in (q, k, v))
    s = q @ k.transpose(0, 2, 1) / np.sqrt(d // heads).astype(np.float32)
    s = jnp.where(jnp.tril(jnp.ones((t, t), bool)), s, -1e9)
    a = jax.nn.softmax(s, -1) @ v
    x = x + a.transpose(1, 0, 2).reshape(t, d) @ p["wo"]
    h = _ln(x, p["g2"], p["b2"])
    return x + jax.nn.gelu(h @ p["w1"]) @ p["w2"]


def _params(n, d, seed=0):
    out = []
    for k in jax.random.split(jax.random.key(seed), n):
        k1, k2, k3, k4 = jax.random.split(k, 4)
        s = 0.5 / np.sqrt(d)
        out.append(dict(g1=jnp.ones(d), b1=jnp.zeros(d), g2=jnp.ones(d), b2=jnp.zeros(d),
                        wqkv=jax.random.normal(k1, (d, 3 * d)) * s,
                        wo=jax.random.normal(k2, (d, d)) * s,
                        w1=jax.random.normal(k3, (d, 4 * d)) * s,
                        w2=jax.random.normal(k4, (4 * d, d)) * s))
    return out


def stack(params, x):
    for p in params:
        x = jax.checkpoint(_layer)(p, x)
    return (x * x).mean()


def scan_stack(stacked, x):
    def body(c, p):
        return jax.checkpoint(_layer)(p, c), None
    x, _ = jax.lax.scan(body, x, stacked)
    return (x * x).mean()


def list_scan_stack(params, x):
    """The hand-written scan taking the same per-layer list as `stack` (stacked inside)."""
    return scan_stack(jax.tree_util.tree_map(lambda *xs: jnp.stack(xs), *params), x)


def _lower_to_compiled(make, args, repeats):
    """Median seconds of make().lower(*args).compile() per variant (fresh, caches cleared)."""
    samples = {k: [] for k in make}
    compiled = {}
    for _ in range(repeats):
        for k, mk in make.items():
            jax.clear_caches()
            t = time.perf_counter()
            compiled[k] = mk().lower(*args[k]).compile()
            samples[k].append(time.perf_counter() - t)
    return {k: statistics.median(v) for k, v in samples.items()}, compiled


def _temp_bytes(c) -> int | None:
    try:
        m = c.memory_analysis()
        return int(m.temp_size_in_bytes)
    except Exception:  # noqa: BLE001 - backend without memory analysis
        return None


def _rel(a, b) -> float:
    """Largest normwise relative difference over leaves: max|a-b| / max|b|."""
    la, lb = jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)
    return max(float(np.max(np.abs(np.asarray(x) - np.asarray(y))) / (np.max(np.abs(np.asarray(y))) + 1e-30))
               for x, y in zip(la, lb))


def stack_rows(n: int, d: int, t: int, repeats: int) -> list[dict]:
    params = _params(n, d)
    stacked = jax.tree_util.tree_map(lambda *xs: jnp.stack(xs), *params)
    x = jax.random.normal(jax.random.key(1), (t, d))
    param_bytes = sum(a.size * a.dtype.itemsize for a in jax.tree_util.tree_leaves(stacked))
    make = {
        "jit": lambda: jax.jit(jax.grad(stack)),
        "opt": lambda: jax.jit(jax.grad(jaxrewrite.optimize(stack, reroll=True))),
        "opt_of_grad": lambda: jaxrewrite.optimize(jax.grad(stack), reroll=True),
        "scan": lambda: jax.jit(jax.grad(scan_stack)),
        "list_scan": lambda: jax.jit(jax.grad(list_scan_stack)),
    }
    args = {"jit": (params, x), "opt": (params, x), "opt_of_grad": (params, x),
            "scan": (stacked, x), "list_scan": (params, x)}
    ct, comp = _lower_to_compiled(make, args, repeats)
    run = paired({k: (lambda k=k: comp[k](*args[k])) for k in make}, repeats=max(5, repeats))
    ref = comp["jit"](*args["jit"])
    rows = []
    for k, case in (("opt", "grad(optimize(stack))"), ("opt_of_grad", "optimize(grad(stack))")):
        out = comp[k](*args[k])
        tb = _temp_bytes(comp[k])
        rows.append(dict(
            case=case, N=n, compile_jit_s=ct["jit"], compile_opt_s=ct[k], compile_scan_s=ct["scan"],
            compile_list_scan_s=ct["list_scan"],
            compile_speedup=ct["jit"] / ct[k], scan_speedup=ct["jit"] / ct["scan"],
            list_scan_speedup=ct["jit"] / ct["list_scan"],
            run_ratio_vs_jit=run[k] / run["jit"], run_scan_vs_jit=run["scan"] / run["jit"],
            temp_mb_jit=(_temp_bytes(comp["jit"]) or 0) / 2**20, temp_mb_opt=(tb or 0) / 2**20,
            temp_mb_scan=(_temp_bytes(comp["scan"]) or 0) / 2**20,
            temp_mb_list_scan=(_temp_bytes(comp["list_scan"]) or 0) / 2**20,
            params_mb=param_bytes / 2**20,
            max_rel_diff=_rel(out, ref), bit_identical=_bits_equal(out, ref)))
    return rows


# --- inline code, outlined and rolled -------------------------------------------------------------

def inline_loop_row(repeats: int) -> dict:
    try:
        from seed import loop_program  # bench/seed.py: the report's program
    except ImportError:  # imported as bench.dedup
        from bench.seed import loop_program
    fn = loop_program("inline")
    x = jnp.asarray(np.random.default_rng(0).standard_normal((64, 64)), jnp.float32) * 0.1
    make = {"jit": lambda: jax.jit(fn), "opt": lambda: jaxrewrite.optimize(fn, reroll=True)}
    ph = paired_phases(make, (x,), repeats=repeats)
    comp = {k: ph[k]["compiled"] for k in make}
    inner = calls_per_sample(comp["jit"], x, 0.02, cap=200)
    run = paired_calls({k: (lambda c=c: c(x)) for k, c in comp.items()}, repeats=repeats * 2 + 1,
                       inner=inner)
    res = jaxrewrite.rewrite_jaxpr_with_report(jax.make_jaxpr(fn)(x), reroll=True)
    tl = {k: ph[k]["lower"] + ph[k]["compile"] for k in make}  # from .lower() to compiled
    return dict(case="inline loop", N=10, compile_ratio=tl["opt"] / tl["jit"],
                run_ratio=run["opt"] / run["jit"],
                scans=sum(1 for e in res.jaxpr.jaxpr.eqns if e.primitive.name == "scan"),
                outlined_runs_rolled=res.report.counts.get("reroll.outlined_runs_rolled", 0),
                max_rel_diff=_rel(comp["opt"](x), comp["jit"](x)))


def main(quick: bool = False, gpu_target: str | None = None, stack_only: tuple = (),
         repeats: int | None = None) -> list[dict]:
    if stack_only:  # only the stack's gradient rows, for these N (`--stack 24 --repeats 5`)
        rows = []
        for n in stack_only:
            rows.extend(stack_rows(n, d=64, t=32, repeats=repeats or 5))
            _progress(rows[-1])
        return rows
    rows = [inline_loop_row(3 if quick else 5)]
    _progress(rows[-1])
    ns = (8, 16, 50) if quick else (8, 16, 32, 50, 64)
    for n in ns:
        rows.append(closures_row(n, repeats=3 if quick else 5))
        _progress(rows[-1])
    for r in grad_closures_rows(16 if quick else 50):
        _progress(r)
        rows.append(r)
    stack_ns = (8,) if quick else (8, 16, 24, 32, 64)
    for n in stack_ns:
        new = stack_rows(n, d=32 if quick else 64, t=16 if quick else 32,
                         repeats=1 if quick or n >= 24 else 3)
        for r in new:
            _progress(r)
        rows.extend(new)
    if gpu_target:
        for r in gpu_rows(gpu_target, n=4 if quick else 8):
            _progress(r)
            rows.append(r)
    return rows


def _progress(row):
    print("#", {k: (round(v, 4) if isinstance(v, float) else v) for k, v in row.items()},
          file=sys.stderr, flush=True)


# --- GPU launches (deviceless H200 compile; run with the gpu-aot environment) -------------------

def gpu_rows(target: str, n: int = 8, d: int = 64, t: int = 32) -> list[dict]:
    """Kernel launches per call of the stack's gradient for `target` (deviceless GPU compile):
    unrolled (jax.jit) vs rolled with unroll=1, 2, 4, n (loop body launches x trips)."""
    from jaxrewrite.backend import xla as _xla
    params = _params(n, d)
    x = jax.random.normal(jax.random.key(1), (t, d))
    leaves, tree = jax.tree_util.tree_flatten((params, x))

    def flat(fn):
        return lambda *ls: fn(*jax.tree_util.tree_unflatten(tree, ls))
    variants = [("jax.jit", jax.grad(stack), 1)]
    for u in (1, 2, 4, n):
        variants.append((f"reroll unroll={u}",
                         jax.grad(jaxrewrite.optimize(stack, reroll=True, unroll=u)), -(-n // u)))
    rows = []
    for form, fn, trips in variants:
        hlo = _xla.gpu_compile(flat(fn), *leaves, target=target).as_text()
        rows.append(dict(case=f"gpu {target} grad(stack)", N=n, form=form, loop_trips=trips,
                         launches_per_call=gpu_launches(hlo, trips),
                         whiles=hlo.count(" while(")))
    return rows


def _cli():
    import sys
    from _common import markdown_table, write_results
    quick = "--quick" in sys.argv[1:]
    gpu = sys.argv[sys.argv.index("--gpu-target") + 1] if "--gpu-target" in sys.argv else None
    stack = tuple(int(n) for n in sys.argv[sys.argv.index("--stack") + 1].split(",")) \
        if "--stack" in sys.argv else ()
    repeats = int(sys.argv[sys.argv.index("--repeats") + 1]) if "--repeats" in sys.argv else None
    rows = main(quick, gpu, stack, repeats)
    print(markdown_table([r for r in rows if r["case"] == "inline loop"]))
    print()
    print(markdown_table([r for r in rows if r["case"] == "closures"], CLOSURE_COLUMNS))
    print()
    print(markdown_table([r for r in rows if r["case"].startswith("grad of")]))
    print()
    print(markdown_table([r for r in rows if "stack)" in r["case"] and "gpu" not in r["case"]],
                         STACK_COLUMNS))
    gpu_rows_ = [r for r in rows if r["case"].startswith("gpu")]
    if gpu_rows_:
        print()
        print(markdown_table(gpu_rows_))
    name = f"{NAME}_stack" if stack else NAME  # a partial run never replaces the full results
    print(f"\nwritten {write_results(name, rows, dict(quick=quick, stack=stack, repeats=repeats))}")


if __name__ == "__main__":
    _cli()
