"""The rewrite's own cost: optimize's trace+lower against jax.jit's, and where the rewrite's time
goes, pass by pass.

    python bench/rewrite_cost.py [--quick] [--scatter] [--final-check]

Cases (builders shared with bench/dedup.py and bench/scale.py):
* `closures`: N fresh `jax.jit` closures of an 8-step body (N = 8, 16, 50);
* `remat transformer grad`: `jax.grad` of an 8-layer pre-norm transformer stack, `jax.checkpoint`
  per layer (d=64, t=32);
* `size`: the scale benchmark's repeating block, 100 and 1000 blocks (1.6k / 16k equations);
* `vmapped scatter set` / `scatter add` (issue 13): `vmap(lambda s, v: s.at[..., 3, 1:4].set(v))`
  and `x.at[:, 3, 0].add(1)` on a (N, 4, 4) uint32 state, N = 1,024, 16,384, 65,536 rows: the
  gathers pass analyses one window, so the rewrite stays flat in N (`--scatter`: these rows only,
  printed, results file untouched).

`--final-check`: what the rewritten program's final check costs, a share of the rewrite
(`final_check_rows`), printed.

Columns: trace+lower medians (paired: jit, optimize, jit, ...; caches cleared before each, so
constant folding pays any compile it needs every time, as in a fresh process), their ratio, the
rewrite (all passes, from the report) and each pass in ms, and the rewrite over the user
program's trace (issue 7 asks <= 0.25 at 10k equations).
"""
from __future__ import annotations

import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _common  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

import jaxrewrite  # noqa: E402

NAME = "rewrite_cost"
PASSES = ("fold", "gathers", "movement", "scalarize", "dedup", "cse")
COLUMNS = ("case", "N", "eqns", "trace_lower_jit_ms", "trace_lower_opt_ms", "ratio", "rewrite_ms",
           *(f"{p}_ms" for p in PASSES), "rewrite_over_trace")


def _trace_lower(jitted, args) -> float:
    t = time.perf_counter()
    jitted.trace(*args).lower()
    return time.perf_counter() - t


def row(case: str, n: int, make_fn, args, repeats: int) -> dict:
    samples = {"jit": [], "opt": []}
    timings: list[dict] = []
    for k in samples:  # warm-up: imports, first traces
        jax.clear_caches()
        _trace_lower(jax.jit(make_fn()) if k == "jit" else jaxrewrite.optimize(make_fn()), args)
    for _ in range(repeats):
        for k in samples:
            jax.clear_caches()
            f = jax.jit(make_fn()) if k == "jit" else jaxrewrite.optimize(make_fn())
            samples[k].append(_trace_lower(f, args))
            if k == "opt":
                timings.append(dict(jaxrewrite.last_report().timings))
    med = {k: statistics.median(v) for k, v in samples.items()}

    def t(key):
        return statistics.median(d.get(key, 0.0) for d in timings)

    from jaxrewrite import _walk
    out = dict(case=case, N=n, eqns=_walk.count_eqns(jax.make_jaxpr(make_fn())(*args)),
               trace_lower_jit_ms=1e3 * med["jit"], trace_lower_opt_ms=1e3 * med["opt"],
               ratio=med["opt"] / med["jit"], rewrite_ms=1e3 * t("rewrite"))
    out.update({f"{p}_ms": 1e3 * t(f"pass.{p}") for p in PASSES})
    out["rewrite_over_trace"] = t("rewrite") / max(t("trace"), 1e-9)
    print(_common.markdown_table([out], COLUMNS).splitlines()[-1], file=sys.stderr, flush=True)
    return out


SCATTERS = {
    "vmapped scatter set": (
        lambda: jax.vmap(lambda s, v: s.at[..., 3, 1:4].set(v)),
        lambda n: [jnp.zeros((n, 4, 4), jnp.uint32), jnp.ones((n, 3), jnp.uint32)]),
    "scatter add": (lambda: (lambda x: x.at[:, 3, 0].add(jnp.uint32(1))),
                    lambda n: [jnp.zeros((n, 4, 4), jnp.uint32)]),
}


def scatter_rows(reps: int) -> list[dict]:
    return [row(case, n, make_fn, make_args(n), reps)
            for case, (make_fn, make_args) in SCATTERS.items() for n in (1024, 16384, 65536)]


def main(quick: bool = False) -> list[dict]:
    import dedup as D
    import scale as S
    reps = 3 if quick else 7
    x = jnp.linspace(0, 1, 64)
    rows = [row("closures", n, lambda n=n: D._closures(n), [x], reps)
            for n in ((8, 50) if quick else (8, 16, 50))]
    ps, xs = D._params(8, 64), jnp.ones((32, 64))
    rows.append(row("remat transformer grad", 8, lambda: jax.grad(D.stack), [ps, xs], reps))
    v = jnp.linspace(0, 1, 4)
    for nb in ((100,) if quick else (100, 1000)):
        rows.append(row("size", nb, lambda nb=nb: S.size_program(nb), [v],
                        reps if nb <= 100 else 3))
    return rows + scatter_rows(reps)


def final_check_rows(repeats: int = 5) -> list[dict]:
    """What the rewritten program's final check costs (issue 38: at most 5% of the rewrite, or
    it is not on by default): the largest bench programs, the size program of 100 and 1,000
    blocks and bench/models.py's 32-layer training steps (where flax, equinox and optax are
    installed), with the defaults and with reroll=True."""
    import importlib.util
    import scale as S
    from jaxrewrite import _pipeline
    from jaxrewrite._options import Options
    cases = [(f"size, {nb} blocks", lambda nb=nb: (S.size_program(nb), [jnp.linspace(0, 1, 4)]))
             for nb in (100, 1000)]
    if all(importlib.util.find_spec(m) for m in ("flax", "equinox", "optax")):
        import models as M
        cases += [(f"{m} step, 32 layers", lambda m=m: M.build(m, 32))
                  for m in ("linen", "nnx", "equinox")]
    rows = []
    for case, make in cases:
        fn, args = make()
        cj = jax.make_jaxpr(fn)(*args)
        for opts in ({}, {"reroll": True}):
            rw, fc = [], []
            for _ in range(repeats):
                r = _pipeline.rewrite(cj, Options.make(**opts))
                rw.append(r.report.timings["rewrite"])
                fc.append(r.report.timings.get("final_check", 0.0))
            out = dict(case=case, options=str(opts or "defaults"),
                       rewrite_ms=1e3 * statistics.median(rw),
                       final_check_ms=1e3 * statistics.median(fc),
                       share=statistics.median(c / w for c, w in zip(fc, rw)))
            print(_common.markdown_table([out]).splitlines()[-1], file=sys.stderr, flush=True)
            rows.append(out)
    return rows


if __name__ == "__main__":
    if "--final-check" in sys.argv[1:]:
        print(_common.markdown_table(final_check_rows()))
    elif "--scatter" in sys.argv[1:]:
        print(_common.markdown_table(scatter_rows(3 if "--quick" in sys.argv[1:] else 7),
                                     COLUMNS))
    else:
        _common.cli(NAME, main, COLUMNS)
