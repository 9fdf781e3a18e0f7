"""The test suite on a TPU host, in parts of at most 8 minutes each (issue 45).

    python3 tests/tpu_parts.py --list                  the parts, their files and estimates
    python3 tests/tpu_parts.py --part 3 --out DIR      one part (fits one 10-minute device call)
    python3 tests/tpu_parts.py --part all --out DIR    every part, one after another
    python3 tests/tpu_parts.py --part 3 --out DIR --resume
                                                       a part cut at its limit: the tests its
                                                       part-3.results does not list yet

From the repository root; nothing to set (the script sets PYTHONPATH, HYPOTHESIS_PROFILE=tpu
unless set, PYTHONUNBUFFERED). Each part is one pytest process (one process at a time may hold
the chip), stopped with SIGINT at `--limit` seconds (default 480) so that pytest still writes
its summary and its junit file. Into DIR, as it goes:

    part-N.results   one line per test as it finishes: outcome, test id, seconds
    part-N.summary   one line, rewritten after every test: counts so far, then the end state
                     ("complete", or "cut at the limit" with how many were not run), failures
    part-N.xml       pytest's --junitxml (at the end of the part)
    part-N.log       pytest's output (-rfEs: failures, errors and skips with their reasons)

and `--part all` also writes summary.txt, each part's line. A test file that no part names
runs in the last part ("rest"), so a new file is never left out; `--list` shows it there.

The split follows each file's time on the CPU with the TPU's decisions
(`JAXREWRITE_TEST_TARGET=tpu`, HYPOTHESIS_PROFILE=tpu, 2 shared cores, Dec 6), times 2.5
for the chip's compiles (on Dec 6 the chip took 320 s for the 274 tests of the first part of
`tests/test_[h-z]*.py`, about 2-4x the CPU per test). A part that comes close to its limit on
the chip is split in two here.
"""
from __future__ import annotations

import argparse
import glob
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
LIMIT_S = 480          # a part's pytest time: 8 minutes, the chip's ~15 s start on top
SCALE = 2.5            # chip seconds per CPU second (estimates only)

# (name, test files): CPU seconds per file in the comments, measured as above
PARTS: list[tuple[str, list[str]]] = [
    ("api-dedup", ["test_api.py", "test_autotune.py", "test_batched_updates.py",
                   "test_blind_spots.py", "test_contract.py", "test_cse.py", "test_dedup.py",
                   "test_effects.py", "test_explain.py", "test_fallback.py"]),
    ("faults-gathers", ["test_faults.py", "test_fold.py", "test_gathers.py"]),
    ("bench-fuzz", ["test_bench_quick.py", "test_compile_options.py", "test_fuzz.py"]),
    ("indexmap-movement", ["test_indexmap.py", "test_keccak.py", "test_kernel.py",
                           "test_kernels_gpu.py", "test_loops.py", "test_models.py",
                           "test_movement.py"]),
    ("never-worse-reroll", ["test_never_worse.py", "test_outline.py", "test_regressions.py",
                            "test_repeats.py", "test_reroll.py", "test_reroll_cost.py"]),
    ("rewrite-cost-switch", ["test_rewrite_cost.py", "test_rewrite_speed.py", "test_rounds.py",
                             "test_scalarize.py", "test_scale.py", "test_segments.py",
                             "test_sharding.py", "test_switch.py"]),
    ("rest", ["test_threads.py", "test_tile.py", "test_tpu.py", "test_updates.py",
              "test_walk.py"]),
]


def parts() -> list[tuple[str, list[str]]]:
    """PARTS, with every tests/test_*.py that none names added to the last part."""
    named = {f for _, files in PARTS for f in files}
    extra = sorted(os.path.basename(p) for p in glob.glob(os.path.join(HERE, "test_*.py"))
                   if os.path.basename(p) not in named)
    out = [(name, list(files)) for name, files in PARTS]
    out[-1][1].extend(extra)
    return out


# --- the pytest plugin (loaded in each part's process with -p tpu_parts) -------------------------

class _Progress:
    def __init__(self):
        self.out = os.environ["JAXREWRITE_PART_OUT"]          # DIR/part-N (no suffix)
        self.label = os.environ.get("JAXREWRITE_PART_LABEL", "")
        self.t0 = time.time()
        self.collected = 0
        self.counts: dict[str, int] = {}
        self.failures: list[str] = []
        open(self.out + ".results", "w").close()
        self.write("running")

    def write(self, state: str):
        done = sum(self.counts.get(k, 0) for k in ("passed", "failed", "skipped", "xfailed",
                                                    "xpassed"))
        counts = ", ".join(f"{v} {k}" for k, v in sorted(self.counts.items()))
        line = (f"{self.label}: {counts or 'nothing yet'} ({done} of {self.collected} tests) in "
                f"{time.time() - self.t0:.0f} s; {state}")
        if self.failures:
            line += "; failed: " + " ".join(self.failures)
        with open(self.out + ".summary.tmp", "w") as f:
            f.write(line + "\n")
        os.replace(self.out + ".summary.tmp", self.out + ".summary")

    def record(self, outcome: str, nodeid: str, seconds: float):
        self.counts[outcome] = self.counts.get(outcome, 0) + 1
        if outcome in ("failed", "error", "xpassed"):
            self.failures.append(nodeid if outcome == "failed" else f"{nodeid} ({outcome})")
        with open(self.out + ".results", "a") as f:
            f.write(f"{outcome.upper()} {nodeid} {seconds:.1f}s\n")
        self.write("running")


_P: _Progress | None = None


def pytest_configure(config):
    global _P
    if "JAXREWRITE_PART_OUT" in os.environ:
        _P = _Progress()


def pytest_collection_finish(session):
    if _P is not None:
        _P.collected = len(session.items)
        _P.write("running")


def pytest_runtest_logreport(report):
    if _P is None:
        return
    xfail = hasattr(report, "wasxfail")
    if report.when == "call":
        outcome = ("xfailed" if report.skipped else "xpassed") if xfail else report.outcome
    elif report.when == "setup" and not report.passed:
        outcome = "xfailed" if xfail else ("skipped" if report.skipped else "error")
    elif report.when == "teardown" and report.failed:
        outcome = "error"
    else:
        return
    _P.record(outcome, report.nodeid, report.duration)


def pytest_sessionfinish(session, exitstatus):
    if _P is not None:
        interrupted = exitstatus == 2 or session.shouldstop
        _P.write("cut at the limit (interrupted)" if interrupted else "complete")


# --- the driver --------------------------------------------------------------------------------

def _finished(base: str) -> list[str]:
    """The test ids DIR/part-N.results (and the earlier runs' part-N.results.K) list."""
    out = []
    for path in glob.glob(base + ".results*"):
        with open(path) as f:
            out.extend(line.split()[1] for line in f if len(line.split()) >= 2)
    return sorted(set(out))


def run_part(index: int, out: str, limit: int, extra: list[str],
             resume: bool = False) -> tuple[int, str]:
    name, files = parts()[index - 1]
    base = os.path.join(out, f"part-{index}")
    if resume:
        done = _finished(base)
        if os.path.exists(base + ".results"):
            os.replace(base + ".results", base + f".results.{len(done)}")
        for kind in ("summary", "xml", "log"):
            if os.path.exists(f"{base}.{kind}"):
                os.replace(f"{base}.{kind}", f"{base}.{kind}.{len(done)}")
        extra = [a for t in done for a in ("--deselect", t)] + list(extra)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([ROOT, HERE] + ([env["PYTHONPATH"]]
                                                        if env.get("PYTHONPATH") else []))
    env.setdefault("HYPOTHESIS_PROFILE", "tpu")
    env["PYTHONUNBUFFERED"] = "1"
    env["JAXREWRITE_PART_OUT"] = base
    env["JAXREWRITE_PART_LABEL"] = f"part {index} ({name})"
    cmd = ["timeout", "-s", "INT", "-k", "30", str(limit), sys.executable, "-m", "pytest", "-q",
           "-p", "no:cacheprovider", "-p", "tpu_parts", "-rfEs", f"--junitxml={base}.xml",
           *extra, *[os.path.join("tests", f) for f in files]]
    t0 = time.time()
    with open(base + ".log", "w") as log:
        log.write("$ " + " ".join(cmd) + "\n")
        log.flush()
        rc = subprocess.call(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    wall = time.time() - t0
    try:
        with open(base + ".summary") as f:
            line = f.read().strip()
    except FileNotFoundError:
        line = f"part {index} ({name}): no summary (pytest did not start; see {base}.log)"
    if rc in (124, 137) and "cut at the limit" not in line:
        line += "; cut at the limit"
    line += f"; rc={rc}, wall {wall:.0f} s"
    with open(base + ".summary", "w") as f:
        f.write(line + "\n")
    return rc, line


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--list", action="store_true", help="list the parts and their files")
    ap.add_argument("--part", help="a part's number (1-based) or name, or 'all'")
    ap.add_argument("--out", help="folder for each part's results, summary, junit and log")
    ap.add_argument("--limit", type=int, default=LIMIT_S, help="seconds of pytest per part")
    ap.add_argument("--resume", action="store_true",
                    help="leave out the tests the part's results file lists (kept, renamed)")
    ap.add_argument("pytest_args", nargs="*", help="more pytest arguments (after --)")
    a = ap.parse_args(argv)
    ps = parts()
    if a.list or not a.part:
        for i, (name, files) in enumerate(ps, 1):
            print(f"{i} {name}: {' '.join(files)}")
        return 0
    if not a.out:
        ap.error("--out DIR is needed with --part")
    names = [n for n, _ in ps]
    if a.part == "all":
        chosen = list(range(1, len(ps) + 1))
    elif a.part.isdigit() and 1 <= int(a.part) <= len(ps):
        chosen = [int(a.part)]
    elif a.part in names:
        chosen = [names.index(a.part) + 1]
    else:
        ap.error(f"--part {a.part!r}: a number 1-{len(ps)}, one of {names}, or 'all'")
    os.makedirs(a.out, exist_ok=True)
    worst = 0
    for i in chosen:
        rc, line = run_part(i, a.out, a.limit, a.pytest_args, a.resume)
        print(line, flush=True)
        if a.part == "all":
            with open(os.path.join(a.out, "summary.txt"), "a") as f:
                f.write(line + "\n")
        worst = worst or rc
    return 0 if worst == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
