"""One generated program against `jax.jit`, measured as tests/test_never_worse.py measures it.

    python bench/never_worse.py "ArxRecipe(shape=(8,), rounds=6, batch=4096, wrap='fori')" [...]
        [--repeat N] [--options "scalarize=True"]

For each recipe (`jaxrewrite.strategies.ArxRecipe` / `FieldRecipe` expressions): what `flatten`
and `scalarize` did (the report's reasons), then N measurements (default 2) of compile and run
time against `jax.jit` (paired medians, outputs bit for bit), and the property violations the
test would report. `--options`: keywords for `optimize` (e.g. a mode the default declines).
"""
import argparse
import functools
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))

import jax  # noqa: E402

import jaxrewrite  # noqa: E402
from jaxrewrite import strategies  # noqa: E402
from jaxrewrite._api import rewrite_jaxpr_with_report  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("recipes", nargs="+")
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--options", default="")
    a = ap.parse_args()
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
