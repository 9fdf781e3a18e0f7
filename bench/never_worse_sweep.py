"""Never worse on a device (issue 45, item 3): the property test's generated programs against
`jax.jit`, as many as a time budget allows, written as they are measured, resumable.

    python bench/never_worse_sweep.py --out DIR [--budget 500] [--resume] [--sizes 4096,65536]
        [--n 400] [--seed 0] [--kinds perf,real] [--max-rounds 24] [--target tpu]
        [--match TEXT]      only the drawn programs whose recipe holds TEXT
        [--compile-only]    compile for a TPU v5e here, run nothing
        [--skip-same FILE]  time no program that FILE (--compile-only's) found unchanged

Programs: the generators of tests/test_never_worse.py (`jaxrewrite.strategies.perf_programs`:
ARX rounds and stencils; `real_code_recipes`: static updates, state machines, symmetry groups),
`--n` of them drawn by hypothesis from `--seed` (the same list for the same seed and hypothesis
version; programs that differ only in their batch counted once), each measured at every size
of `--sizes` (its drawn batch replaced), with x64 off as the test runs them. Program k is
measured at every size before program k + 1.

Per program and size, three callables: `jax.jit(fn)`, an A/A `jax.jit` of a wrapper (what noise
is), `jaxrewrite.optimize(fn)` (`--target`: whose decisions; default the backend's):
- compile: trace + rewrite + lower + compile once each, after `jax.clear_caches()`, the order
  alternating from program to program;
- outputs: the first call of each; `bits`: optimize's and the A/A's leaves equal jax.jit's bit
  for bit; `contract`: within the README's contract (floats: fusion-dependent rounding);
- run: paired rounds (5; the order alternating), each sample a back-to-back batch of calls of
  about 5 ms of the slowest form's program, medians, the rounds cut to fit 60 s where a form is
  that slow (the TPU's forms run by XLA:CPU in a dry run can be: one took 44 s a call);
  `same`: XLA compiled optimize's program to jax.jit's HLO up to names and order (then its run
  ratio is noise, and no run violation is counted).

The rule (issue 45): run <= 1.05x jax.jit's, compile <= 3x unless the run is <= 0.67x. A program
that breaks it is measured again (compiles 3 times, runs 11 rounds, medians) and is a violation
only if it breaks it again; both measurements are kept.

Files under `--out DIR`: `never_worse_sweep.jsonl`, one JSON object a line: a `session` line
per call (device, versions, argv), a `start` line before each measurement and its `result` (or
`error`) after. `--resume` measures only what the file holds no result for; a program started
and never finished (the call ran out of time, or the process died) is recorded as `unfinished`
and not measured again. `--start-from FILE`: a previous call's file, copied into `--out` first
(a device call's output folder starts empty), then resumed. A first call that takes more than
`--first-call-limit` seconds is an `error` and ends the process (a running device program cannot
be stopped); `--resume` goes on after it. `--target tpu` on a CPU: the TPU's decisions (kernels
in Pallas's interpreter: slow at 65,536).
`--compile-only`: on a host with no TPU and libtpu installed (the `tpu-aot` extra), each
program is compiled for a TPU v5e here (`backend.xla.tpu_compile`; jax.jit, the A/A and
optimize with the TPU's decisions, in that order; twice where past 3x) and nothing runs:
compile seconds, launches and `same`, into `never_worse_compile.jsonl`. A program that compiles past 3x is a
`candidate`: the rule holds only if the chip runs it in <= 0.67x.
`--skip-same FILE`: a `--compile-only` file. The programs it found compiled to `jax.jit`'s HLO
(within the compile rule) are not timed: the device would run `jax.jit`'s own program, so a run
ratio is noise. They are written as `same_here` lines (kind, recipe, size, the file's compile
ratio and launches) and counted apart. A chip call's time then goes to the programs the rewrite
changes (on Dec 8, 80 of the chip's 186 measurements were of programs compiled to `jax.jit`'s
HLO).
`--budget S`: no measurement is started that would end past S seconds of this process (its
estimate: 1.5x the slowest of the last 20); in a 10-minute device call, 480 leaves a minute to
open the chip, import, draw and print. At the end: the violations and counts of everything in
the file.
"""
from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import os
import shutil
import statistics
import sys
import threading
import time
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "tests"))

import _common  # noqa: E402
import jax  # noqa: E402
import numpy as np  # noqa: E402

import jaxrewrite  # noqa: E402
from jaxrewrite import strategies as S  # noqa: E402
from jaxrewrite.testing import assert_contract_equal  # noqa: E402

RUN_MAX, COMPILE_MAX, FAST_ENOUGH = 1.05, 3.0, 0.67
FILE = "never_worse_sweep.jsonl"
COMPILE_FILE = "never_worse_compile.jsonl"      # --compile-only
KINDS = {"perf": S.perf_programs, "real": S.real_code_recipes}


# --- the programs --------------------------------------------------------------------------------

def draw(n: int, seed: int, kinds=("perf", "real"), max_rounds: int = 24) -> list:
    """`n` recipes from the property test's strategies, drawn by hypothesis from `seed` (its
    generate phase only: no shrinking, no database), with batch 0 (`at_size` gives each its
    size), duplicates dropped."""
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import seed as hseed
    from hypothesis import strategies as st
    parts = [KINDS[k]() if k != "perf" else S.perf_programs(max_rounds=max_rounds)
             for k in kinds]
    out: list = []

    @settings(max_examples=n, deadline=None, database=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))
    @hseed(seed)
    @given(recipe=st.one_of(*parts))
    def collect(recipe):
        recipe = dataclasses.replace(recipe, batch=0)     # the sizes are the sweep's
        if recipe not in out:
            out.append(recipe)

    collect()
    return out[:n]


def at_size(recipe, size: int):
    return dataclasses.replace(recipe, batch=size)


# --- measuring -----------------------------------------------------------------------------------

def _makers(fn, target):
    opts = {} if target is None else {"target": target}
    return {"jit": lambda: jax.jit(fn), "aa": lambda: jax.jit(lambda *a: fn(*a)),
            "opt": lambda: jaxrewrite.optimize(fn, **opts)}


def _compile(make, args) -> tuple[float, object]:
    jax.clear_caches()
    t = time.perf_counter()
    c = make().lower(*args).compile()
    return time.perf_counter() - t, c


def _first_call(c, args, limit: float, on_timeout):
    """The first call, in a thread: past `limit` seconds `on_timeout()` (which ends the
    process: a running device program cannot be stopped)."""
    box = {}

    def go():
        try:
            box["v"] = _common.block(c(*args))
        except Exception as e:  # noqa: BLE001 - raised again in the caller's thread
            box["e"] = e

    th = threading.Thread(target=go, daemon=True)
    th.start()
    th.join(limit)
    if th.is_alive():
        on_timeout()
    if "e" in box:
        raise box["e"]
    return box["v"]


def _bits_equal(a, b) -> bool:
    la, lb = jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)
    return len(la) == len(lb) and all(
        np.asarray(x).dtype == np.asarray(y).dtype and np.asarray(x).shape == np.asarray(y).shape
        and np.asarray(x).tobytes() == np.asarray(y).tobytes() for x, y in zip(la, lb))


SAMPLING_S = 60.0    # the most a program's timed rounds take: fewer rounds for a slow form


def _sample(c, args, n: int) -> float:
    t = time.perf_counter()
    for _ in range(n):
        out = c(*args)
    _common.block(out)
    return (time.perf_counter() - t) / n


def measure(recipe, target=None, compiles: int = 1, rounds: int = 5, flip: bool = False,
            first_call_limit: float = 120.0, on_timeout=None) -> dict:
    """One program at one size: medians of compile and run seconds of jax.jit, its A/A and
    optimize, and how their outputs compare (module doc)."""
    from test_never_worse import _program_text
    fn, args = recipe.fn, recipe.args
    makers = _makers(fn, target)
    order = list(makers)[::-1] if flip else list(makers)
    comp: dict = {k: [] for k in makers}
    compiled: dict = {}
    report = None
    for r in range(compiles):
        for k in (order if r % 2 == 0 else order[::-1]):
            before = jaxrewrite.last_report()
            s, compiled[k] = _compile(makers[k], args)
            comp[k].append(s)
            if k == "opt" and jaxrewrite.last_report() is not before:
                report = jaxrewrite.last_report()
    outs = {k: _first_call(compiled[k], args, first_call_limit, on_timeout) for k in order}
    contract = ""
    try:
        assert_contract_equal(outs["opt"], outs["jit"], meta=False)
    except AssertionError as e:
        contract = " ".join(str(e).split())[:200]
    # calls a sample: ~5 ms of the slowest form's second call (a form hundreds of times slower
    # than jax.jit, as the TPU's decisions run by XLA:CPU can be, would otherwise be called as
    # often as jax.jit for minutes)
    one = {}
    for k in order:
        t = time.perf_counter()
        _common.block(compiled[k](*args))
        one[k] = time.perf_counter() - t
    n = max(1, min(500, int(5e-3 / max(max(one.values()), 1e-6))))
    rounds = max(1, min(rounds, int(SAMPLING_S / max(sum(one.values()) * n, 1e-9))))
    samples: dict = {k: [] for k in makers}
    for r in range(rounds):
        for k in (order if r % 2 == 0 else order[::-1]):
            samples[k].append(_sample(compiled[k], args, n))
    run = {k: statistics.median(v) for k, v in samples.items()}
    cmp_ = {k: statistics.median(v) for k, v in comp.items()}
    return dict(
        run_ms={k: v * 1e3 for k, v in run.items()}, compile_s=cmp_,
        run=run["opt"] / run["jit"], compile=cmp_["opt"] / cmp_["jit"],
        aa_run=run["aa"] / run["jit"], aa_compile=cmp_["aa"] / cmp_["jit"],
        same=_program_text(compiled["jit"]) == _program_text(compiled["opt"]),
        bits=_bits_equal(outs["opt"], outs["jit"]), aa_bits=_bits_equal(outs["aa"], outs["jit"]),
        contract=contract or "ok", calls_per_sample=n, compiles=compiles, rounds=rounds,
        rewrites=sorted({e.pass_name for e in report.rewrites}) if report else None)


def measure_compile(recipe) -> dict:
    """`--compile-only`: jax.jit, its A/A and optimize (the TPU's decisions) compiled for a TPU
    v5e on this host, once each in that order; compile seconds and launches, no run."""
    from test_never_worse import _program_text

    from jaxrewrite.backend import xla
    fn, args = recipe.fn, recipe.args
    specs = [jax.ShapeDtypeStruct(np.shape(a), np.asarray(a).dtype) for a in args]
    makers = _makers(fn, "tpu")
    comp, compiled = {}, {}
    for k in makers:
        jax.clear_caches()
        t = time.perf_counter()
        compiled[k] = xla.tpu_compile(makers[k](), *specs)
        comp[k] = time.perf_counter() - t
    return dict(compile_s=comp, compile=comp["opt"] / comp["jit"],
                aa_compile=comp["aa"] / comp["jit"],
                launches={k: sum(xla.launches(c).values()) for k, c in compiled.items()},
                same=_program_text(compiled["jit"]) == _program_text(compiled["opt"]))


def compile_only(indexed, sizes, path: str, budget: float, t_start: float) -> int:
    """The `--compile-only` loop: every (program, size) not yet in `path`, within `budget`."""
    from jaxrewrite.backend import xla
    done = {(r["recipe"], r["size"]) for r in load(path) if r["kind"] == "compiled"}
    # (the first compile of a process pays libtpu's start: not any program's)
    xla.tpu_compile(jax.jit(lambda x: x + 1), jax.ShapeDtypeStruct((8, 128), np.int32))
    for k, recipe in indexed:
        for size in sizes:
            r = at_size(recipe, size)
            if (repr(r), size) in done:
                continue
            if time.perf_counter() - t_start > budget:
                return _compile_summary(path)
            t0 = time.perf_counter()
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")   # uint64 words truncated with x64 off
                    m = measure_compile(r)
                if m["compile"] > COMPILE_MAX and m["aa_compile"] <= COMPILE_MAX:
                    again = measure_compile(r)       # (one compile each: measured twice)
                    m = again if again["compile"] < m["compile"] else m
                rec = dict(kind="compiled", recipe=repr(r), size=size, index=k, **m,
                           candidate=m["compile"] > COMPILE_MAX and not m["same"])
                line = (f"compile {m['compile']:.2f}x (A/A {m['aa_compile']:.2f}x), launches "
                        f"{m['launches']['jit']} -> {m['launches']['opt']}"
                        f"{' same HLO' if m['same'] else ''}"
                        f"{' CANDIDATE' if rec['candidate'] else ''}")
            except Exception as e:  # noqa: BLE001 - recorded; the sweep goes on
                rec = dict(kind="error", recipe=repr(r), size=size, index=k,
                           error=f"{type(e).__name__}: {' '.join(str(e).split())[:400]}")
                line = f"error {type(e).__name__}"
            append(path, dict(rec, seconds=time.perf_counter() - t0))
            print(f"[{k} @ {size}, {time.perf_counter() - t_start:.0f} s] {repr(r)[:80]}: "
                  f"{line}", flush=True)
    return _compile_summary(path)


def _compile_summary(path: str) -> int:
    rs = [r for r in load(path) if r["kind"] == "compiled"]
    for size in sorted({r["size"] for r in rs}):
        at = [r for r in rs if r["size"] == size]
        ratios = sorted(r["compile"] for r in at if not r["same"])
        print(f"size {size}: {len(at)} programs compiled for the TPU, "
              f"{sum(r['same'] for r in at)} to jax.jit's HLO; compile of the others "
              + (f"median {statistics.median(ratios):.2f}x, max {max(ratios):.2f}x; "
                 if ratios else "") + f"{sum(r['candidate'] for r in at)} past "
              f"{COMPILE_MAX}x (the chip decides: run <= {FAST_ENOUGH}x)", flush=True)
    for r in rs:
        if r["candidate"]:
            print(f"CANDIDATE {r['recipe']} @ {r['size']}: compile {r['compile']:.2f}x, "
                  f"launches {r['launches']['jit']} -> {r['launches']['opt']}", flush=True)
    return 0


def violations(m: dict) -> list[str]:
    """The rule, on one measurement (a run ratio of a `same` program is noise: not counted)."""
    out = []
    if not m["same"] and m["run"] > RUN_MAX:
        out.append(f"run {m['run']:.2f}x (limit {RUN_MAX}x)")
    if m["compile"] > COMPILE_MAX and not m["run"] <= FAST_ENOUGH:
        out.append(f"compile {m['compile']:.2f}x (limit {COMPILE_MAX}x; run {m['run']:.2f}x)")
    if m["contract"] != "ok":
        out.append(f"outputs differ: {m['contract']}")
    return out


# --- the file ------------------------------------------------------------------------------------

def load(path: str) -> list[dict]:
    if not os.path.exists(path):
        return []
    out = []
    with open(path) as f:
        for line in f:
            line = line.strip()
            if line:
                try:
                    out.append(json.loads(line))
                except json.JSONDecodeError:   # a line cut by a killed process
                    pass
    return out


def status(records: list[dict]) -> dict:
    """(recipe, size) -> 'result' | 'error' | 'unfinished', from the file's lines."""
    out: dict = {}
    for r in records:
        key = (r.get("recipe"), r.get("size"))
        if r["kind"] == "start":
            out.setdefault(key, "unfinished")
        elif r["kind"] in ("result", "error", "same_here"):
            out[key] = r["kind"]
    return out


def same_in(path: str | None) -> dict:
    """(recipe, size) -> its `--compile-only` record, for the programs that compiled to
    jax.jit's HLO for a TPU v5e within the compile rule (`--skip-same`)."""
    if path is None:
        return {}
    if not os.path.exists(path):
        sys.exit(f"--skip-same {path}: no such file")
    return {(r["recipe"], r["size"]): r for r in load(path)
            if r["kind"] == "compiled" and r["same"] and r["compile"] <= COMPILE_MAX}


def append(path: str, record: dict) -> None:
    with open(path, "a") as f:
        f.write(json.dumps(record, default=str) + "\n")
        f.flush()
        os.fsync(f.fileno())


def summary(records: list[dict]) -> str:
    done = status(records)
    results = [r for r in records if r["kind"] == "result"]
    lines = []
    for size in sorted({r["size"] for r in results}):
        rs = [r for r in results if r["size"] == size]
        bad = [r for r in rs if r["violations"]]
        aa = sorted(r["first"]["aa_run"] for r in rs)
        runs = sorted(r["final"]["run"] for r in rs if not r["final"]["same"])
        rewritten = (f"median {statistics.median(runs):.2f}x, max {max(runs):.2f}x" if runs
                     else "none")
        lines.append(
            f"size {size}: {len(rs)} programs measured, {len(bad)} violations; "
            f"{sum(r['final']['same'] for r in rs)} compiled to jax.jit's HLO; run of the others "
            f"{rewritten}; A/A run median "
            f"{statistics.median(aa):.2f}x, max {max(aa):.2f}x; not bit for bit: "
            f"{sum(not r['final']['bits'] for r in rs)}")
    for size in sorted({r["size"] for r in records if r["kind"] == "same_here"}):
        rs = [r for r in records if r["kind"] == "same_here" and r["size"] == size]
        lines.append(f"size {size}: {len(rs)} more programs compiled to jax.jit's HLO for a TPU "
                     f"v5e here (--skip-same; not timed), compile at most "
                     f"{max(r['compile'] for r in rs):.2f}x there")
    n_err = sum(v == "error" for v in done.values())
    n_unf = sum(v == "unfinished" for v in done.values())
    lines.append(f"errors {n_err}, unfinished {n_unf}")
    for r in results:
        if r["violations"]:
            f = r["final"]
            lines.append(f"VIOLATION {r['recipe']} @ {r['size']}: {'; '.join(r['violations'])} "
                         f"(first: run {r['first']['run']:.2f}x compile "
                         f"{r['first']['compile']:.2f}x; again: run {f['run']:.2f}x compile "
                         f"{f['compile']:.2f}x; A/A {f['aa_run']:.2f}x; rewrites "
                         f"{f['rewrites']})")
    for key, v in done.items():
        if v not in ("result", "same_here"):
            err = next((r.get("error", "") for r in records
                        if r["kind"] == "error" and (r["recipe"], r["size"]) == key), "")
            lines.append(f"{v.upper()} {key[0]} @ {key[1]} {err[:200]}")
    return "\n".join(lines)


# --- the run -------------------------------------------------------------------------------------

def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="folder of never_worse_sweep.jsonl")
    ap.add_argument("--budget", type=float, default=500.0, help="seconds of this process")
    ap.add_argument("--resume", action="store_true", help="go on from the file in --out")
    ap.add_argument("--start-from", default=None,
                    help="a previous call's file: copied into --out (if it has none), then resumed")
    ap.add_argument("--sizes", default="4096,65536")
    ap.add_argument("--n", type=int, default=400, help="programs drawn")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--kinds", default="perf,real", help=f"of {', '.join(KINDS)}")
    ap.add_argument("--max-rounds", type=int, default=24)
    ap.add_argument("--target", default=None, help="optimize's target (default: the backend's)")
    ap.add_argument("--first-call-limit", type=float, default=120.0)
    ap.add_argument("--match", default=None,
                    help="only the drawn programs whose recipe contains this text")
    ap.add_argument("--compile-only", action="store_true",
                    help="compile for a TPU v5e here (libtpu, no TPU), run nothing")
    ap.add_argument("--skip-same", default=None,
                    help="a --compile-only file: its programs compiled to jax.jit's HLO are "
                         "not timed")
    a = ap.parse_args(argv)
    t_start = time.perf_counter()
    os.makedirs(a.out, exist_ok=True)
    path = os.path.join(a.out, COMPILE_FILE if a.compile_only else FILE)
    if a.start_from:      # a device call's $OUT starts empty: the last call's file, brought along
        if not os.path.exists(path):
            shutil.copyfile(a.start_from, path)
        a.resume = True
    if os.path.exists(path) and not a.resume:
        sys.exit(f"{path} exists: --resume to go on with it, or another --out")
    import hypothesis
    sizes = [int(s) for s in a.sizes.split(",")]
    recipes = draw(a.n, a.seed, tuple(a.kinds.split(",")), a.max_rounds)
    # (with --match the draw is the same: each program keeps its index in the full run's)
    indexed = [(k, r) for k, r in enumerate(recipes) if not a.match or a.match in repr(r)]
    records = load(path)
    done = status(records)
    append(path, dict(kind="session", argv=sys.argv[1:] if argv is None else argv,
                      jax=jax.__version__, hypothesis=hypothesis.__version__,
                      date=time.strftime("%Y-%m-%d %H:%M:%S"), drawn=len(recipes),
                      **_common.device()))
    print(f"never-worse sweep: {jax.default_backend()}, {len(indexed)} programs x {sizes}, "
          f"{len(done)} in the file, budget {a.budget:.0f} s -> {path}", flush=True)
    if a.compile_only:
        return compile_only(indexed, sizes, path, a.budget, t_start)
    same_here = same_in(a.skip_same)
    recent: list[float] = []
    measured = 0
    for k, recipe in indexed:
        for size in sizes:
            r = at_size(recipe, size)
            key = (repr(r), size)
            if key in done:
                continue
            if key in same_here:
                c = same_here[key]
                append(path, dict(kind="same_here", recipe=key[0], size=size, index=k,
                                  compile=c["compile"], launches=c["launches"],
                                  source=os.path.basename(a.skip_same)))
                continue
            elapsed = time.perf_counter() - t_start
            est = 1.5 * max(recent[-20:], default=10.0)
            if elapsed + est > a.budget:
                print(f"budget: stopping at {elapsed:.0f} s (next estimated {est:.0f} s)",
                      flush=True)
                return finish(path)
            append(path, dict(kind="start", recipe=key[0], size=size, index=k))
            t0 = time.perf_counter()

            def timeout(key=key, t0=t0):
                append(path, dict(kind="error", recipe=key[0], size=size, index=k,
                                  error=f"first call past {a.first_call_limit:.0f} s: ended",
                                  seconds=time.perf_counter() - t0))
                print(f"{key[0]} @ {size}: first call past {a.first_call_limit:.0f} s; "
                      f"ending (--resume goes on after it)", flush=True)
                print(summary(load(path)), flush=True)
                os._exit(3)

            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")   # uint64 words truncated with x64 off
                    first = measure(r, a.target, flip=(k % 2 == 1),
                                    first_call_limit=a.first_call_limit, on_timeout=timeout)
                    final, bad = first, violations(first)
                    if bad:
                        final = measure(r, a.target, compiles=3, rounds=11,
                                        first_call_limit=a.first_call_limit, on_timeout=timeout)
                        bad = violations(final)
                append(path, dict(kind="result", recipe=key[0], size=size, index=k, first=first,
                                  final=final, violations=bad, seconds=time.perf_counter() - t0))
                line = (f"run {final['run']:.2f}x compile {final['compile']:.2f}x (A/A "
                        f"{final['aa_run']:.2f}x/{final['aa_compile']:.2f}x)"
                        f"{' same HLO' if final['same'] else ''}"
                        f"{' BITS DIFFER' if not final['bits'] else ''}"
                        f"{' VIOLATION: ' + '; '.join(bad) if bad else ''}")
            except Exception as e:  # noqa: BLE001 - recorded; the sweep goes on
                append(path, dict(kind="error", recipe=key[0], size=size, index=k,
                                  error=f"{type(e).__name__}: {' '.join(str(e).split())[:400]}",
                                  seconds=time.perf_counter() - t0))
                line = f"error {type(e).__name__}"
            recent.append(time.perf_counter() - t0)
            measured += 1
            jax.clear_caches()
            gc.collect()
            print(f"[{k} @ {size}, {time.perf_counter() - t_start:.0f} s] {key[0][:90]}: {line}",
                  flush=True)
    print(f"every drawn program measured ({measured} this call)", flush=True)
    return finish(path)


def finish(path: str) -> int:
    print(summary(load(path)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
