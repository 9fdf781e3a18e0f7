"""JAX's own Threefry draws as one Pallas kernel (issue 47): jax.jit vs optimize, on the TPU.

    python bench/threefry.py --out /tmp/threefry.json       # on the TPU (one process, ~3-4 min)
    python bench/threefry.py --quick --out /tmp/q.json      # anywhere: small sizes, interpreter
    ... --profile                                           # and jax.jit's, the kernel's and
                                                            # rbg's ops (`_common.op_profile`)

Programs (the key is the argument; `jax_threefry_partitionable` as JAX 0.10.2 sets it, on):
1. `jax.random.bits(key, (N,))`, uint32, N = 16,777,216 and 67,108,864;
2. a bfloat16 dropout mask of (16, 256, 4096): `where(bernoulli(key, 0.9), 1/0.9, 0)` as
   bfloat16 (`bernoulli` -> `uniform` -> `random_bits`; the uniform's shift and or go into the
   kernel, its float epilogue and the select stay XLA's).
Variants, every one compiled in this process:
- `jit`, `jit (A/A)`: `jax.jit` twice (the second: what noise is);
- `optimize`: the default (`kernel="auto"`, the TPU row: its `threefry_min_elements` is
  provisional); `optimize kernel=True`: a kernel whatever the size;
- `optimize rows=R`: `kernel=True` with the TPU row's `kernel_generator_rows` = R, the rows of
  a grid step for a kernel that reads no piece (512, provisional; `kernel_tile_rows`, 16, was
  measured on ChaCha20's 16 pieces in and out: a draw only writes, so a step of 16 rows would
  be mostly step overhead); the sweep says which rows pay;
- `jit rbg` (bits only): `jax.random.bits` on an `rbg` key, XLA's RngBitGenerator: the speed
  the issue aims at, with other bits (not checked: `exact` is None).
3. The threshold sweep: `jax.random.bits` of 65,536 / 262,144 / 1,048,576 words, `jit`
   against `optimize kernel=True` (what `threefry_min_elements` should be).

Columns: run ms (paired rounds: baseline, candidate, baseline, ..., each variant once a round,
medians of `repeats` >= 5) and its ratio to `jit`; compile seconds (trace + rewrite + lower +
compile of a fresh function, caches cleared; `jit` and `optimize` twice, medians) and the ratio
to `jit`; `exact`: bit for bit `jit`'s output (compared on the device); `pallas_calls`, the
kernel's tiles and grid, the passes' declines, and `errors` (a kernel that failed to lower: the
original program ran, and the row measures jax.jit's program).
"""
from __future__ import annotations

import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _common  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from jax import lax  # noqa: E402

import jaxrewrite  # noqa: E402
from jaxrewrite.backend import cost as _cost  # noqa: E402

NAME = "threefry"
OPT = dict(target="tpu")   # the TPU's cost row, also with --quick on another host
KEEP = 0.9


def bits(shape):
    return lambda key: jax.random.bits(key, shape)


def dropout_mask(shape):
    return lambda key: jnp.where(jax.random.bernoulli(key, KEEP, shape), 1 / KEEP,
                                 0.0).astype(jnp.bfloat16)


def _opt(**kw):
    return lambda f: jaxrewrite.optimize(f, **OPT, **kw)


def _facts(report) -> dict:
    if report is None:
        return {}
    return dict(
        pallas_calls=report.counts.get("kernel.applied", 0),
        threefry=report.stats.get("threefry", []), kernel=report.stats.get("kernel", []),
        declines=sorted({f"{e.pass_name}: {e.reason}" for e in report.declines
                         if e.pass_name in ("threefry", "kernel")}),
        rewrite_s=report.timings.get("rewrite"), errors=list(report.errors))


def _same(a, b) -> bool:
    """Bit for bit, on the device (no copy of a 256 MiB draw to the host)."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.dtype == jnp.bfloat16:
        a, b = (lax.bitcast_convert_type(x, jnp.uint16) for x in (a, b))
    return bool(jnp.array_equal(a, b))


PROFILED = ("jit", "optimize kernel=True", "jit rbg (other bits)")   # with --profile


def table(program: str, n: int, variants: dict, repeats: int,
          twice=("jit", "optimize"), profile: bool = False) -> list[dict]:
    """`variants`: name -> (maker of a fresh jitted callable, cost-row overrides, its args,
    whether its output must be `jit`'s). `profile`: the `PROFILED` variants' ops too."""
    compiles = {k: [] for k in variants}
    compiled, facts = {}, {}
    for rnd in range(2):
        for name, (make, overrides, args, _) in variants.items():
            if rnd and name not in twice:
                continue
            print(f"[{NAME}] {program}/{n}: compile {name}", file=sys.stderr, flush=True)
            s, c, report = _common.compile_on_row(make, args, overrides)
            compiles[name].append(s)
            compiled.setdefault(name, c)
            facts.setdefault(name, _facts(report))
    print(f"[{NAME}] {program}/{n}: timing {len(variants)} variants", file=sys.stderr, flush=True)
    med = _common.paired({k: (lambda c=c, a=variants[k][2]: c(*a)) for k, c in compiled.items()},
                         repeats=repeats)
    ref = compiled["jit"](*variants["jit"][2])
    rows = []
    for name, (_, _, args, checked) in variants.items():
        out = compiled[name](*args)
        comp = statistics.median(compiles[name])
        rows.append(dict(
            program=program, n=n, form=name, run_ms=med[name] * 1e3,
            run_ratio_jit=med[name] / med["jit"], compile_s=comp,
            compile_ratio_jit=comp / statistics.median(compiles["jit"]),
            compile_samples=compiles[name], exact=_same(out, ref) if checked else None,
            **facts[name]))
        if profile and name in PROFILED:
            rows[-1]["profile"] = _common.op_profile(lambda c=compiled[name]: c(*args))
        del out
        r = rows[-1]   # (as it comes: a run stopped from outside keeps what it measured)
        print(f"[{NAME}] {program} {n} {name}: {r['run_ms']:.3f} ms {r['run_ratio_jit']:.3f}x, "
              f"compile {r['compile_s']:.2f} s {r['compile_ratio_jit']:.2f}x, exact "
              f"{r['exact']}, kernels {r.get('pallas_calls')}", flush=True)
    return rows


def _variants(f, key, rows_sweep=(), rbg=None) -> dict:
    v = {"jit": (lambda: jax.jit(f), {}, (key,), True),
         "jit (A/A)": (lambda: jax.jit(lambda k: f(k)), {}, (key,), True),
         "optimize": (lambda: _opt()(f), {}, (key,), True),
         "optimize kernel=True": (lambda: _opt(kernel=True)(f), {}, (key,), True)}
    for r in rows_sweep:
        v[f"optimize rows={r}"] = (lambda: _opt(kernel=True)(f), {"kernel_generator_rows": r},
                                   (key,), True)
    if rbg is not None:
        v["jit rbg (other bits)"] = (lambda: jax.jit(f), {}, (rbg,), False)
    return v


def main(quick: bool = False, profile: bool = False) -> list[dict]:
    key, rbg = jax.random.key(2026), jax.random.key(2026, impl="rbg")
    reps = 5 if quick else 7
    sweep = (16, 64) if quick else (16, 128, 512, 2048)
    rows = []
    for n in ((1 << 14, 1 << 16) if quick else (1 << 24, 1 << 26)):
        rows += table("bits uint32", n, _variants(bits((n,)), key, sweep, rbg), reps,
                      profile=profile)
    shape = (2, 8, 4096) if quick else (16, 256, 4096)
    rows += table(f"dropout mask bf16 {shape}", int(jnp.prod(jnp.array(shape))),
                  _variants(dropout_mask(shape), key, sweep), reps, profile=profile)
    for n in ((1 << 12, 1 << 13) if quick else (1 << 16, 1 << 18, 1 << 20)):
        f = bits((n,))
        rows += table("bits uint32 (threshold)", n, {
            "jit": (lambda f=f: jax.jit(f), {}, (key,), True),
            "optimize kernel=True": (lambda f=f: _opt(kernel=True)(f), {}, (key,), True)},
            reps, twice=(), profile=profile)
    return rows


def cli() -> dict:
    quick = "--quick" in sys.argv[1:]
    t0 = time.perf_counter()
    rows = main(quick, profile="--profile" in sys.argv[1:])
    row = _cost.costs("tpu")
    return dict(name=NAME, quick=quick, jax=jax.__version__, backend=jax.default_backend(),
                devices=[str(d) for d in jax.devices()], date=time.strftime("%Y-%m-%d %H:%M:%S"),
                threefry_partitionable=bool(jax.config.jax_threefry_partitionable),
                tpu_row={k: getattr(row, k) for k in (
                    "kernel_min_elements", "kernel_min_eqns", "kernel_tile_rows",
                    "kernel_generator_rows", "threefry_min_elements")},
                seconds=time.perf_counter() - t0, rows=rows)


if __name__ == "__main__":
    result = cli()
    text = json.dumps(result, indent=1, default=str)
    out = (sys.argv[sys.argv.index("--out") + 1] if "--out" in sys.argv[1:]
           else os.path.join(os.environ["OUT"], f"{NAME}.json") if os.environ.get("OUT")
           else None)
    print(_common.markdown_table(
        result["rows"], ["program", "n", "form", "run_ms", "run_ratio_jit", "compile_s",
                         "compile_ratio_jit", "exact", "pallas_calls"]))
    if out:
        with open(out, "w") as f:
            f.write(text)
        print(f"written {out}", file=sys.stderr)
    else:
        print(text)
