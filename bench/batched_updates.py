"""Batched updates (issue 40): XLA:TPU's loop over the batch vs selects on iota masks.

    python bench/batched_updates.py [--quick]

jax-ml/jax#21367's program, `jit(vmap(lax.dynamic_update_slice))` with starts of shape (B, 1),
at (100, 32) 2 wide (the issue's own) and 8 wide, and at (8192, 256) 8 wide; `.at[i].set(v)` per
row (FILL_OR_DROP and CLIP) and per-example rows of a (B, T, D) buffer; and one shape past the
cost row's work limit (`backend.cost`, `batched_update_max_work`), which `optimize` declines, so
the hand-written form there says whether that limit is where it should be.

Variants, timed in paired rounds (jit, optimize, jit again, hand, [optimize(target="tpu")],
jit, ...), medians of at least 9 samples, each sample enough back-to-back calls for ~20 ms:
* `jit`: jax.jit; `jit_again`: a second jax.jit of the same function (the A/A control: its
  ratio to `jit` is what noise is);
* `opt`: jaxrewrite.optimize with its default target (the TPU on the chip);
* `hand`: the update written by hand as one select per window position on an iota mask;
* `opt_tpu` (only where the backend is not the TPU): optimize(target="tpu"), the TPU's form
  run here.
Every variant's output is checked bit for bit against `jit`'s. Compile times: trace + lower +
compile of fresh jits, caches cleared, paired, medians.

One JSON object is printed (the last line of stdout) and written to $OUT/batched_updates.json
when OUT is set. `rows[*].ratio_opt` is optimize's run time over jax.jit's; `targets` says what
the issue asks of it on the chip, `verdicts` whether this run met it.
"""
from __future__ import annotations

import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _common  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax import lax  # noqa: E402

import jaxrewrite  # noqa: E402
from jaxrewrite import _walk  # noqa: E402
from jaxrewrite.backend import cost as _cost  # noqa: E402

NAME = "batched_updates"
SCATTERS = ("scatter", "scatter-add", "scatter_add", "scatter-mul", "scatter_mul",
            "scatter-min", "scatter_min", "scatter-max", "scatter_max")
COLUMNS = ("program", "shape", "rewritten", "run_us_jit", "ratio_opt", "ratio_jit_again",
           "ratio_hand", "ratio_opt_tpu", "compile_ms_jit", "compile_ratio_opt", "bitwise")
# What the issue asks of optimize on the chip (run time over jax.jit's).
TARGETS = {"dus (8192, 256) 8 wide": 0.05, "dus (100, 32) 2 wide": 0.7,
           "dus (100, 32) 8 wide": 0.7}
ELSEWHERE = 1.0      # never worse: at most jax.jit's time (within the A/A noise)


# --- programs -----------------------------------------------------------------------------------

dus = jax.vmap(lax.dynamic_update_slice)                      # the program
set_fill = jax.vmap(lambda x, v, i: x.at[i].set(v))
set_clip = jax.vmap(lambda x, v, i: x.at[i].set(v, mode="clip"))


def hand_dus(x, u, s):
    """One select per window position on an iota mask (JAX wraps a negative start once; XLA
    clamps the start into [0, N - w])."""
    n, w = x.shape[1], u.shape[1]
    c = s[:, 0]
    c = jnp.clip(jnp.where(c < 0, c + n, c), 0, n - w)
    d = lax.broadcasted_iota(jnp.int32, x.shape, 1) - c[:, None]
    for k in range(w):
        x = jnp.where(d == k, u[:, k:k + 1], x)
    return x


def _hand_set(clip):
    def hand(x, v, i):
        n = x.shape[1]
        i = jnp.where(i < 0, i + n, i)
        if clip:
            i = jnp.clip(i, 0, n - 1)      # (FILL_OR_DROP: an index out of range hits nothing)
        shape = (i.shape[0], n) + (1,) * (x.ndim - 2)
        hit = lax.broadcasted_iota(jnp.int32, shape, 1) == i.reshape((-1,) + (1,) * (x.ndim - 1))
        return jnp.where(hit, jnp.expand_dims(v, 1), x)
    return hand


def programs(quick: bool):
    rng = np.random.default_rng(0)

    def f32(*shape):
        return jnp.asarray(rng.standard_normal(shape), jnp.float32)

    def starts(n, shape):     # in range, negative and past the end (wrapped, clamped, dropped)
        return jnp.asarray(rng.integers(-n - 4, n + 4, shape), jnp.int32)

    limit = _cost.costs("tpu").batched_update_max_work
    out = [("dus (100, 32) 2 wide", dus, hand_dus,
            (f32(100, 32), f32(100, 2), starts(32, (100, 1)))),
           ("dus (100, 32) 8 wide", dus, hand_dus,
            (f32(100, 32), f32(100, 8), starts(32, (100, 1)))),
           ("dus (8192, 256) 8 wide", dus, hand_dus,
            (f32(8192, 256), f32(8192, 8), starts(256, (8192, 1)))),
           (".at[i].set (8192, 256)", set_fill, _hand_set(False),
            (f32(8192, 256), f32(8192), starts(256, 8192))),
           (".at[i].set clip (8192, 256)", set_clip, _hand_set(True),
            (f32(8192, 256), f32(8192), starts(256, 8192))),
           (".at[i].set row (1024, 64, 128)", set_fill, _hand_set(False),
            (f32(1024, 64, 128), f32(1024, 128), starts(64, 1024))),
           # past the TPU row's work limit: declined, optimize is jax.jit (the hand form says
           # whether the limit is where it should be)
           (f"dus (512, {2 * limit // 8}) 8 wide, declined", dus, hand_dus,
            (f32(512, 2 * limit // 8), f32(512, 8), starts(2 * limit // 8, (512, 1))))]
    if quick:
        out = [p for p in out if "(1024, 64, 128)" not in p[0]]
    return out


# --- measuring ----------------------------------------------------------------------------------

def _variants(fn, hand):
    v = {"jit": lambda: jax.jit(fn), "opt": lambda: jaxrewrite.optimize(fn),
         "jit_again": lambda: jax.jit(fn), "hand": lambda: jax.jit(hand)}
    if jax.default_backend() != "tpu":
        v["opt_tpu"] = lambda: jaxrewrite.optimize(fn, target="tpu")
    return v


def _same_bits(a, b) -> bool:
    a, b = np.asarray(a), np.asarray(b)
    return a.shape == b.shape and a.dtype == b.dtype and bool(
        np.array_equal(np.ascontiguousarray(a).view(np.uint8), np.ascontiguousarray(b).view(np.uint8)))


def measure(name, fn, hand, args, quick: bool) -> dict:
    make = _variants(fn, hand)
    ph = _common.paired_phases(make, args, repeats=1 if quick else 3)
    fns = {k: mk() for k, mk in make.items()}
    ref = fns["jit"](*args)
    bitwise = {k: _same_bits(f(*args), ref) for k, f in fns.items() if k != "jit"}
    # what each optimize variant makes of the program: scatters left, declines and their reasons
    rewrites = {k: jaxrewrite.rewrite_jaxpr_with_report(
        jax.make_jaxpr(fn)(*args), **({"target": "tpu"} if k == "opt_tpu" else {}))
        for k in fns if k in ("opt", "opt_tpu")}
    inner = _common.calls_per_sample(lambda a: fns["jit"](*a), args, 0.005 if quick else 0.02,
                                     cap=2000)
    run = _common.paired_calls({k: (lambda f=f: f(*args)) for k, f in fns.items()},
                               repeats=9 if quick else 15, inner=inner)
    row = dict(program=name, shape=[list(np.shape(a)) for a in args],
               rewritten={k: not any(e.primitive.name in SCATTERS
                                     for e in _walk.iter_eqns(r.jaxpr))
                          for k, r in rewrites.items()},
               declined={k: [e.reason for e in r.report.declines if e.pass_name == NAME]
                         for k, r in rewrites.items()},
               run_us_jit=run["jit"] * 1e6, calls_per_sample=inner,
               compile_ms_jit=1e3 * sum(ph["jit"][p] for p in ("trace", "lower", "compile")),
               bitwise=bitwise)
    for k in fns:
        if k == "jit":
            continue
        row[f"run_us_{k}"] = run[k] * 1e6
        row[f"ratio_{k}"] = run[k] / run["jit"]
        total = sum(ph[k][p] for p in ("trace", "lower", "compile"))
        row[f"compile_ms_{k}"] = 1e3 * total
        row[f"compile_ratio_{k}"] = total / (row["compile_ms_jit"] / 1e3)
    return row


def verdicts(rows, backend: str) -> dict:
    """Whether each row met its target (on the TPU only: elsewhere there is no loop to beat)."""
    if backend != "tpu":
        return {"note": f"targets are for the TPU; this ran on {backend}"}
    out = {}
    for r in rows:
        limit = TARGETS.get(r["program"], ELSEWHERE)
        noise = abs(r["ratio_jit_again"] - 1.0)
        ok = r["ratio_opt"] <= limit + (noise if limit == ELSEWHERE else 0.0)
        out[r["program"]] = dict(ratio_opt=round(r["ratio_opt"], 4), target=limit,
                                 met=bool(ok and all(r["bitwise"].values())))
    return out


def main(quick: bool = False) -> list[dict]:
    rows = []
    progs = programs(quick)
    for n, (name, fn, hand, args) in enumerate(progs, 1):
        print(f"[{NAME} {n}/{len(progs)}] {name}", file=sys.stderr, flush=True)
        rows.append(measure(name, fn, hand, args, quick))
    return rows


if __name__ == "__main__":
    quick = "--quick" in sys.argv[1:]
    t0 = time.perf_counter()
    rows = main(quick)
    backend = jax.default_backend()
    payload = dict(name=NAME, jax=jax.__version__, backend=backend,
                   device=str(jax.devices()[0].device_kind), quick=quick,
                   date=time.strftime("%Y-%m-%d %H:%M:%S"), seconds=time.perf_counter() - t0,
                   targets={**TARGETS, "elsewhere": ELSEWHERE}, verdicts=verdicts(rows, backend),
                   rows=rows)
    print(_common.markdown_table(rows, COLUMNS), file=sys.stderr)
    text = json.dumps(payload, default=str)
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], f"{NAME}.json"), "w") as f:
            f.write(text + "\n")
    print(text)
