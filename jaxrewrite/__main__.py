"""`python -m jaxrewrite [--option name=value ...] script.py [args ...]`: run a script with the
switch on (every outermost `jax.jit` rewritten; see `_switch.py`), as `python -m cProfile` runs
one under the profiler. `-m module` runs a module instead of a script. `JAXREWRITE_LOG=1` logs
one line per rewritten function.
"""
from __future__ import annotations

import argparse
import ast
import os
import runpy
import sys

from . import _switch
from ._options import NAMES


def _option(text: str) -> tuple[str, object]:
    name, sep, value = text.partition("=")
    if not sep or name not in NAMES:
        raise argparse.ArgumentTypeError(
            f"expected name=value with name one of: {', '.join(NAMES)}; got {text!r}")
    try:
        return name, ast.literal_eval(value)  # True, 2, None, 'all' ...
    except (ValueError, SyntaxError):
        return name, value                    # auto, all, time: a bare word is a string


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(
        prog="python -m jaxrewrite",
        description="Run a Python script with every outermost jax.jit rewritten by jaxrewrite.")
    ap.add_argument("--option", "-o", action="append", type=_option, default=[],
                    metavar="NAME=VALUE", help="a rewrite option (repeatable), e.g. reroll=True")
    ap.add_argument("-m", dest="module", action="store_true",
                    help="run TARGET as a module (python -m TARGET), not a script")
    ap.add_argument("target", metavar="script.py", help="the script to run")
    ap.add_argument("args", nargs=argparse.REMAINDER, help="the script's arguments")
    ns = ap.parse_args(argv)
    _switch.enable(**dict(ns.option))
    sys.argv = [ns.target, *ns.args]
    if ns.module:
        runpy.run_module(ns.target, run_name="__main__", alter_sys=True)
        return
    # as `python script.py` would: the script's folder first on the path
    sys.path.insert(0, os.path.dirname(os.path.abspath(ns.target)))
    runpy.run_path(ns.target, run_name="__main__")


if __name__ == "__main__":
    main()
