"""One generated program against `jax.jit`, measured as tests/test_never_worse.py measures it.

    python bench/never_worse.py "ArxRecipe(shape=(8,), rounds=6, batch=4096, wrap='fori')" [...]
        [--repeat N] [--options "scalarize=True"]
    python bench/never_worse.py --draw 30 [--seed 1]

For each recipe (`jaxrewrite.strategies.ArxRecipe` / `FieldRecipe` expressions): what `flatten`
and `scalarize` did (the report's reasons), then N measurements (default 2) of compile and run
time against `jax.jit` (paired medians, outputs bit for bit), and the property violations the
test would report. `--options`: keywords for `optimize` (e.g. a mode the default declines).

`--draw N`: N ARX states in a `fori_loop` drawn at random (`_draw`: 8 to 25 words of u32 or
u64, 3 to 16 trips, 4,096 to 65,536 blocks), where a loop's carry split is decided
(`backend.cost.split_pays`), measured once each, as a markdown table.
"""
import argparse
import functools
import os
import random
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))

import jax  # noqa: E402

import jaxrewrite  # noqa: E402
from jaxrewrite import strategies  # noqa: E402
from jaxrewrite._api import rewrite_jaxpr_with_report  # noqa: E402


def _draw(n: int, seed: int) -> list:
    """`n` fori_loop ARX recipes from a seeded generator (the same list for the same seed)."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        shape = rng.choice([(4, 4), (5, 5), (8,), (16,), (25,), (4, 4)])
        out.append(strategies.ArxRecipe(
            shape=shape, dtype=rng.choice(["uint32", "uint64"]), rounds=rng.randint(3, 16),
            batch=rng.choice([4096, 16384, 65536]), seed=rng.randint(0, 999),
            message=rng.random() < .5, fanout=rng.choice([1, 2]),
            quarter=shape == (4, 4) and rng.random() < .5, undo=rng.random() < .6,
            out=rng.choice(["state", "xor", "fold"]), wrap="fori"))
    return out


def draw_table(n: int, seed: int) -> None:
    """The carry-split decisions on `n` drawn loops, measured as the property test measures."""
    import test_never_worse as T
    print("| recipe | split | why not | compile | run | property |")
    print("| --- | --- | --- | --- | --- | --- |")
    for r in _draw(n, seed):
        with jax.enable_x64(r.dtype == "uint64"):
            res = rewrite_jaxpr_with_report(jax.make_jaxpr(r.fn)(*r.args), target="cpu")
            split = any(e.pass_name == "flatten" for e in res.report.rewrites)
            why = [d.reason for d in res.report.declines if d.pass_name == "flatten"]
            m = T.measure(r, 5, compiles=3)
        text = (f"{r.shape} {r.dtype} x {r.rounds} trips x {r.batch}"
                f"{', message' if r.message else ''}{', quarter' if r.quarter else ''}, "
                f"seed {r.seed}")
        short = why[0].split(": carry not split: ")[-1][:60] if why and not split else ""
        print(f"| {text} | {'yes' if split else 'no'} | {short} | "
              f"{m['compile_opt'] / m['compile_jit']:.2f}x | {m['run_opt'] / m['run_jit']:.2f}x | "
              f"{'; '.join(T.violations(m)) or 'ok'} |", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("recipes", nargs="*")
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--options", default="")
    ap.add_argument("--draw", type=int, default=0)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    if a.draw:
        return draw_table(a.draw, a.seed)
    options = eval(f"dict({a.options})")  # noqa: S307 - a command-line tool's own argument
    import test_never_worse as T
    if options:  # measure() calls jaxrewrite.optimize(fn): give it the options
        T.jaxrewrite = type(sys)("jaxrewrite_with_options")
        T.jaxrewrite.optimize = functools.partial(jaxrewrite.optimize, **options)
    for text in a.recipes:
        recipe = eval(text, vars(strategies))  # noqa: S307
        res = rewrite_jaxpr_with_report(jax.make_jaxpr(recipe.fn)(*recipe.args), **options)
        print(recipe)
        for e in res.report.rewrites:
            if e.pass_name in ("flatten", "scalarize"):
                print(f"  + {e.pass_name}: {' '.join(e.after)[:160]}")
        for d in res.report.declines:
            if d.pass_name in ("flatten", "scalarize"):
                print(f"  - {d.pass_name}: {d.reason[:160]}")
        for _ in range(a.repeat):
            m = T.measure(recipe, 5, compiles=3)
            print(f"  run {m['run_opt'] / m['run_jit']:.2f}x  compile "
                  f"{m['compile_opt'] / m['compile_jit']:.2f}x  (jax.jit: run "
                  f"{m['run_jit'] * 1e3:.3f} ms, compile {m['compile_jit']:.3f} s)  "
                  f"{'; '.join(T.violations(m)) or 'within the properties'}", flush=True)


if __name__ == "__main__":
    main()
