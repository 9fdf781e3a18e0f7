"""Run every benchmark, write JSON, markdown tables and PNG charts.

    python bench/run.py [--quick] [--only NAME[,NAME...]] [--skip NAME[,NAME...]]
                        [--gpu-target h200] [--out DIR] [--no-charts] [--update-readme]

Runs each `bench/<name>.py` that exposes `NAME` and `main(quick)` (the known ones first: seed,
dedup, gathers, permutations, scale; then any other), one after the other in this process,
printing progress as it goes. A benchmark that is missing or raises is reported with its error
and the others still run; the exit status is then 1. Writes, under `bench/results/` (or --out):

* `<name>.json`   rows and metadata (jax version, backend, date, quick, seconds);
* `README.md`     one markdown table per benchmark, with the command that made it;
* `<name>_*.png`  charts, from whatever columns the rows have: compile time vs N (an `N`, `n`,
                  `copies`, `size` or `eqns` column), run time vs batch (a `batch` column), and
                  bars per `form`/`program`/`case` of kernels (or CPU fusions) and compile
                  times. Series are the string columns whose values repeat.

`--gpu-target h200` is passed to every `main` that takes a `gpu_target` parameter (kernel
counts from XLA's GPU compiler without a GPU; needs the `gpu-aot` extra). `--update-readme`
(or `--update-docs`) replaces, for each benchmark run, the block between `<!-- bench:NAME -->`
and `<!-- /bench:NAME -->` in `docs/measurements.md` (where it has one) with its table and first
chart.
"""
from __future__ import annotations

import argparse
import importlib
import inspect
import json
import os
import sys
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import _common  # noqa: E402

KNOWN = ("seed", "dedup", "gathers", "permutations", "scale")
# (never_worse: a tool for one generated program at a time, with no table of its own; keccak,
# author_chacha: programs other benches measure; accelerator, tpu_costs, tpu_kernel, tpu_dump,
# batched_updates, threefry, tpu_layers, never_worse_sweep: runs of their own, one process on a
# device within a budget, each
# `python bench/<name>.py`; tpu_aot: compiles for the TPU in libtpu's venv; bench/README.md is
# the map)
_NOT_BENCHES = {"run", "never_worse", "keccak", "author_chacha", "accelerator", "tpu_costs",
                "tpu_kernel", "tpu_dump", "batched_updates", "threefry", "tpu_layers",
                "never_worse_sweep", "tpu_aot"}


def discover(only: list[str] | None, skip: list[str] = ()) -> list[str]:
    present = sorted(f[:-3] for f in os.listdir(HERE)
                     if f.endswith(".py") and not f.startswith("_") and f[:-3] not in _NOT_BENCHES)
    if only:
        return only
    ordered = list(KNOWN) + [n for n in present if n not in KNOWN]
    return [n for n in ordered if n not in skip]


def run_one(name: str, quick: bool, gpu_target: str | None) -> tuple[list[dict], dict]:
    """Import bench/<name>.py and run its main; raises with a clear message when it cannot."""
    if not os.path.exists(os.path.join(HERE, f"{name}.py")):
        raise FileNotFoundError(f"bench/{name}.py does not exist")
    mod = importlib.import_module(name)
    if not hasattr(mod, "main") or not hasattr(mod, "NAME"):
        raise AttributeError(f"bench/{name}.py has no NAME and main(quick)")
    params = inspect.signature(mod.main).parameters
    kwargs = {"quick": quick}
    meta = {"quick": quick}
    if gpu_target:
        if "gpu_target" in params:
            kwargs["gpu_target"] = gpu_target
            meta["gpu_target"] = gpu_target
        else:
            meta["gpu_target"] = f"not supported by bench/{name}.py"
    rows = mod.main(**kwargs)
    if not isinstance(rows, list):
        raise TypeError(f"bench/{name}.py main() returned {type(rows).__name__}, not a list of rows")
    meta["columns"] = list(getattr(mod, "COLUMNS", ()) or _columns(rows))
    return rows, meta


def _columns(rows: list[dict]) -> list[str]:
    cols: dict[str, None] = {}
    for r in rows:
        cols.update(dict.fromkeys(r))
    return list(cols)


def _check_gpu_target(target: str) -> None:
    try:
        from jaxrewrite.backend import xla as _xla
        _xla.target_config(target)
    except (ImportError, AttributeError, ValueError) as e:
        sys.exit(f"--gpu-target {target}: {type(e).__name__}: {e}")
    try:
        ok = _xla.gpu_aot_available()
    except ImportError:  # find_spec of jax_plugins.* raises when jax_plugins itself is absent
        ok = False
    if not ok:
        sys.exit(f"--gpu-target {target}: the deviceless GPU compiler is not available; install "
                 f"the gpu-aot extra (pip install -e '.[gpu-aot]') and set JAX_PLATFORMS=cpu")


# --- charts ----------------------------------------------------------------------------------------

_N_KEYS = ("N", "n", "copies", "size", "eqns")
_CAT_KEYS = ("form", "program", "case", "name")


def _num(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _ykeys(rows, *words, exclude=("ratio",)):
    keys = [k for k in _columns(rows) if any(w in k.lower() for w in words)
            and not any(x in k.lower() for x in exclude) and any(_num(r.get(k)) for r in rows)]
    return keys


def chart_specs(name: str, rows: list[dict]) -> list[dict]:
    """Which charts the rows support: (kind, x or category key, y keys, title, file suffix)."""
    specs = []
    for x in _N_KEYS:
        if rows and all(_num(r.get(x)) for r in rows if x in r) and any(x in r for r in rows):
            ys = _ykeys(rows, "compile", "trace", "lower", exclude=("ratio", "over", "per"))
            if ys:
                unit = " (ms)" if any("ms" in y for y in ys) else ""
                specs.append(dict(kind="line", x=x, ys=ys, suffix="compile_vs_n",
                                  title=f"{name}: trace / lower / compile time vs {x}",
                                  ylabel=f"time{unit}"))
            break
    if any(_num(r.get("batch")) for r in rows):
        ys = _ykeys(rows, "run")
        if ys:
            specs.append(dict(kind="line", x="batch", ys=ys, title=f"{name}: run time vs batch",
                              suffix="run_vs_batch", ylabel="run time"))
    cat = next((k for k in _CAT_KEYS if any(isinstance(r.get(k), str) for r in rows)), None)
    if cat is not None:
        ys = _ykeys(rows, "kernel") or _ykeys(rows, "fusion")
        if ys:
            what = "kernels" if "kernel" in ys[0] else "CPU fusions"
            specs.append(dict(kind="bar", x=cat, ys=ys, title=f"{name}: {what} per {cat}",
                              suffix="kernels_per_form", ylabel=what))
        ys = _ykeys(rows, "compile")
        if ys and not any(s["suffix"] == "compile_vs_n" for s in specs):
            specs.append(dict(kind="bar", x=cat, ys=ys, title=f"{name}: compile time per {cat}",
                              suffix="compile_per_form", ylabel="compile (ms)"))
    return specs


def draw(name: str, rows: list[dict], out: str) -> list[str]:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    for spec in chart_specs(name, rows):
        fig, ax = plt.subplots(figsize=(8, 4.5))
        x = spec["x"]
        if spec["kind"] == "line":
            groups = _group(rows, exclude={x})
            for gname, grows in groups.items():
                grows = sorted((r for r in grows if _num(r.get(x))), key=lambda r: r[x])
                for y in spec["ys"]:
                    pts = [(r[x], r[y]) for r in grows if _num(r.get(y))]
                    if pts:
                        label = f"{gname} {y}".strip()
                        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=label)
            ax.set_xlabel(x)
            if all(r[x] > 0 for r in rows if _num(r.get(x))):
                ax.set_xscale("log")
        else:
            cats = [r for r in rows if isinstance(r.get(x), str)
                    and any(_num(r.get(y)) for y in spec["ys"])]
            labels = [_label(r, x) for r in cats]
            width = 0.8 / len(spec["ys"])
            for i, y in enumerate(spec["ys"]):
                ax.bar([j + i * width for j in range(len(cats))],
                       [r.get(y) if _num(r.get(y)) else 0 for r in cats], width, label=y)
            ax.set_xticks([j + 0.4 - width / 2 for j in range(len(cats))])
            ax.set_xticklabels(labels, rotation=45, ha="right", fontsize=8)
        ax.set_ylabel(spec["ylabel"])
        ax.set_title(spec["title"])
        ax.grid(True, alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
        fig.tight_layout()
        path = os.path.join(out, f"{name}_{spec['suffix']}.png")
        fig.savefig(path, dpi=100)
        plt.close(fig)
        paths.append(path)
    return paths


def _group(rows, exclude) -> dict[str, list[dict]]:
    """Rows grouped into the series of a line chart: by the string columns that repeat (a column
    whose every value differs, such as a case label, names points, not series)."""
    series = [k for k in _columns(rows) if k not in exclude
              and all(isinstance(r.get(k), str) for r in rows if k in r)
              and len({r.get(k) for r in rows}) < len(rows)]
    groups: dict[str, list[dict]] = {}
    for r in rows:
        groups.setdefault(" ".join(str(r.get(k, "")) for k in series), []).append(r)
    return groups


def _label(row, cat) -> str:
    extra = [str(v) for k, v in row.items() if isinstance(v, str) and k != cat]
    return " ".join([row[cat]] + extra)


# --- markdown --------------------------------------------------------------------------------------

def command_line(args) -> str:
    parts = ["python bench/run.py"]
    if args.quick:
        parts.append("--quick")
    if args.only:
        parts.append(f"--only {args.only}")
    if args.skip:
        parts.append(f"--skip {args.skip}")
    if args.gpu_target:
        parts.append(f"--gpu-target {args.gpu_target}")
    return " ".join(parts)


def section(name: str, payload: dict, charts: list[str], out: str, level: str = "##",
            columns=None) -> str:
    meta = payload.get("meta", {})
    kind = payload.get("device_kind")   # the device, where its name says more than the backend's
    device = f" ({kind})" if kind and kind != payload.get("backend") else ""
    lines = [f"{level} {name}", "",
             f"jax {payload.get('jax')}, backend {payload.get('backend')}{device}, "
             f"{payload.get('date')}"
             f"{', quick' if meta.get('quick') else ''}, {meta.get('seconds', 0):.0f} s. "
             f"Ratios are optimize / jax.jit in one process (paired medians).", "",
             _common.markdown_table(payload["rows"], columns or meta.get("columns") or None), ""]
    for c in charts:
        lines += [f"![{os.path.basename(c)}]({os.path.relpath(c, out)})", ""]
    return "\n".join(lines)


def write_readme(out: str, sections: list[str], failures: dict[str, str], cmd: str) -> str:
    path = os.path.join(out, "README.md")
    head = ["# Benchmark results", "",
            f"Written by `{cmd}`. Each benchmark compares `jax.jit` (baseline) with "
            f"`jaxrewrite.optimize` in one process; times are medians of paired runs.", ""]
    for name, err in failures.items():
        head += [f"**{name}: failed** - `{err.splitlines()[-1] if err else ''}`", ""]
    with open(path, "w") as f:
        f.write("\n".join(head + sections))
    return path


MEASUREMENTS = os.path.join("docs", "measurements.md")  # the page the tables live on


def update_readme(payload: dict, charts: list[str], root: str, columns=None,
                  name: str = "seed") -> bool:
    """Replace the `name` block of docs/measurements.md (between the markers) if it has one."""
    path = os.path.join(root, MEASUREMENTS)
    start, end = f"<!-- bench:{name} -->", f"<!-- /bench:{name} -->"
    try:
        with open(path) as f:
            text = f.read()
    except FileNotFoundError:
        return False
    if start not in text or end not in text:
        return False
    body = section(name, payload, charts[:1], os.path.dirname(path), level="###",
                   columns=columns)
    new = text[:text.index(start) + len(start)] + "\n" + body + "\n" + text[text.index(end):]
    with open(path, "w") as f:
        f.write(new)
    return True


# --- main ------------------------------------------------------------------------------------------

def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="small sizes, few repeats (CI)")
    ap.add_argument("--only", default=None, help="comma-separated benchmark names")
    ap.add_argument("--skip", default="", help="comma-separated names not to run (CI: those an "
                    "earlier step ran)")
    ap.add_argument("--gpu-target", default=None, help="also count kernels for this GPU (h200)")
    ap.add_argument("--out", default=_common.RESULTS, help="results folder (bench/results)")
    ap.add_argument("--no-charts", action="store_true")
    ap.add_argument("--update-readme", "--update-docs", action="store_true",
                    dest="update_readme",
                    help=f"put each table and chart into {MEASUREMENTS}'s bench:NAME block")
    args = ap.parse_args(argv)
    if args.gpu_target:
        _check_gpu_target(args.gpu_target)
    out = os.path.abspath(args.out)
    os.makedirs(out, exist_ok=True)
    _common.RESULTS = out  # write_results writes there
    names = discover(args.only.split(",") if args.only else None,
                     [n for n in args.skip.split(",") if n])
    cmd = command_line(args)
    failures: dict[str, str] = {}
    sections, summary = [], []
    t_all = time.perf_counter()
    for i, name in enumerate(names, 1):
        print(f"=== [{i}/{len(names)}] {name} ({time.perf_counter() - t_all:.0f} s so far)",
              file=sys.stderr, flush=True)
        t0 = time.perf_counter()
        try:
            rows, meta = run_one(name, args.quick, args.gpu_target)
        except Exception as e:  # noqa: BLE001 - reported below and in the exit status
            absent = isinstance(e, FileNotFoundError) and name not in sys.modules
            failures[name] = f"{type(e).__name__}: {e}" if absent else \
                "".join(traceback.format_exception(e))
            print(f"=== {name} FAILED after {time.perf_counter() - t0:.1f} s: "
                  f"{type(e).__name__}: {e}", file=sys.stderr, flush=True)
            summary.append((name, "FAILED", time.perf_counter() - t0, 0))
            continue
        meta["seconds"] = time.perf_counter() - t0
        meta["command"] = cmd
        path = _common.write_results(name, rows, meta)
        with open(path) as f:
            payload = json.load(f)
        charts = []
        if not args.no_charts:
            try:
                charts = draw(name, rows, out)
            except ImportError as e:
                print(f"charts skipped ({e}); pip install -e '.[bench]'", file=sys.stderr)
        sections.append(section(name, payload, charts, out))
        print(_common.markdown_table(rows, meta["columns"]), flush=True)
        print(f"=== {name}: {len(rows)} rows in {meta['seconds']:.1f} s -> {path}"
              + "".join(f", {c}" for c in charts), file=sys.stderr, flush=True)
        summary.append((name, "ok", meta["seconds"], len(rows)))
        if args.update_readme:
            root = os.path.dirname(HERE)
            cols = getattr(sys.modules.get(name), "README_COLUMNS", None)
            if not update_readme(payload, charts, root, cols, name=name):
                print(f"{MEASUREMENTS} has no <!-- bench:{name} --> block; not updated",
                      file=sys.stderr)
        try:
            import jax
            jax.clear_caches()  # one benchmark's compiled programs do not weigh on the next
        except Exception:  # noqa: BLE001
            pass
    readme = write_readme(out, sections, failures, cmd)
    print(f"\nwrote {readme}", file=sys.stderr)
    print(f"\n{'benchmark':<14} {'status':<7} {'seconds':>8} {'rows':>5}", file=sys.stderr)
    for name, status, secs, n in summary:
        print(f"{name:<14} {status:<7} {secs:8.1f} {n:5d}", file=sys.stderr)
    print(f"total {time.perf_counter() - t_all:.1f} s", file=sys.stderr)
    for name, err in failures.items():
        print(f"\n--- {name} failed:\n{err}", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
