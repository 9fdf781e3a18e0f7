"""The test suite on a TPU host, in parts of at most 8 minutes each (issue 45).

    python3 tests/tpu_parts.py --list                  the parts, their files and estimates
    python3 tests/tpu_parts.py --part 3 --out DIR      one part (fits one 10-minute device call)
    python3 tests/tpu_parts.py --part 1,2,3 --out DIR  some parts, one after another
    python3 tests/tpu_parts.py --part all --out DIR    every part, one after another
    python3 tests/tpu_parts.py --part 3 --out DIR --resume
                                                       a part cut at its limit: the tests its
                                                       part-3.results does not list yet

From the repository root; nothing to set (the script sets PYTHONPATH, HYPOTHESIS_PROFILE=tpu
unless set, PYTHONUNBUFFERED). Each part is one pytest process (one process at a time may hold
the chip), stopped with SIGINT at `--limit` seconds (default 480) so that pytest still writes
its summary and its junit file (KILL 30 s later if it is inside a compile or a run that
SIGINT does not stop; the results file has every test finished before). Into DIR, as it goes:

    part-N.results   one line per test as it finishes: outcome, test id, seconds
    part-N.summary   one line, rewritten after every test: counts so far, then the end state
                     ("complete", or "cut at the limit" with how many were not run), failures
    part-N.xml       pytest's --junitxml (at the end of the part)
    part-N.log       pytest's output (-rfEs: failures, errors and skips with their reasons)

and several parts (`--part 1,2,3`, `--part all`) also write summary.txt, each part's line. A
test file that no part names runs in the last part ("rest"), so a new file is never left out;
`--list` shows it there.

The split follows each file's time on the CPU with the TPU's decisions
(`JAXREWRITE_TEST_TARGET=tpu`, HYPOTHESIS_PROFILE=tpu, 2 shared cores, Dec 6; PARTS' comments).
A part that comes close to its limit on the chip is split in two here; one cut there is run
again with --resume.
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

# (name, test files). CPU seconds of each file with the TPU's decisions, as above, in the
# comments ("skip" where the chip skips it whole: tests of XLA:CPU itself); a part's sum stays
# near 250 CPU s. On Dec 6 the chip ran parts 5 and 6 and test_reroll_cost in 320 s; here
# they take 312 CPU s and test_never_worse's checks that are not XLA:CPU timing (not measured
# apart): the chip was not much slower than these figures, so 250 leaves room. (test_regressions' BLAKE2s does not
# finish on the CPU with the TPU's decisions: XLA:CPU runs the TPU's scalarized hash, about
# 1,800 elementwise equations, for minutes; on the chip the file ran in that 320 s.)
PARTS: list[tuple[str, list[str]]] = [
    ("api-explain", ["test_api.py",            # 36
                     "test_autotune.py",       # 37
                     "test_blind_spots.py",    # 22
                     "test_contract.py",       # 21
                     "test_cse.py",            # 26
                     "test_dedup.py",          # 33
                     "test_effects.py",        # 16
                     "test_explain.py",        # 21
                     "test_fallback.py"]),     # 8
    ("batched-gathers", ["test_batched_updates.py",   # 111
                         "test_gathers.py"]),         # 99
    ("faults-fold", ["test_faults.py",         # 84-153 (164 tests, each compiles twice)
                     "test_fold.py"]),         # 35
    ("fuzz", ["test_bench_quick.py",           # 56
              "test_compile_options.py",       # skip
              "test_fuzz.py"]),                # 135
    ("indexmap-movement", ["test_indexmap.py",      # 8
                           "test_keccak.py",        # 23
                           "test_kernel.py",        # 49
                           "test_kernels_gpu.py",   # skip (gpu_aot)
                           "test_loops.py",         # 47
                           "test_models.py",        # skip (slow)
                           "test_movement.py"]),    # 12
    ("never-worse-reroll", ["test_never_worse.py",  # 209 (most of it XLA:CPU timing: skip)
                            "test_outline.py",      # 24
                            "test_regressions.py",  # 6, and BLAKE2s: 15 (the CPU row)
                            "test_repeats.py",      # 14
                            "test_reroll.py"]),     # 62
    ("reroll-cost-switch", ["test_reroll_cost.py",     # 67
                            "test_rewrite_cost.py",    # 10
                            "test_rewrite_speed.py",   # 5
                            "test_rounds.py",          # 12
                            "test_scalarize.py",       # 20
                            "test_scale.py",           # 13
                            "test_segments.py",        # 10
                            "test_sharding.py",        # 10
                            "test_switch.py"]),        # 13
    ("rest", ["test_threads.py",               # 6
              "test_tile.py",                  # 19
              "test_tpu.py",                   # 10
              "test_updates.py",               # 20
              "test_walk.py"]),                # 4
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
    if rc in (124, 137, -9) and "; complete" in line:
        # (pytest had finished every test and written its summary; the process's exit, which
        # closes the chip, was still going at the limit: nothing was cut)
        line += "; its exit stopped at the limit, after the last test"
    elif rc in (124, 137, -9) and "cut at the limit" not in line:
        # (SIGINT did not stop pytest within 30 s, inside a compile or a run: `timeout` sent
        # KILL to the group, itself included, so no summary from pytest and no junit file)
        line = line.replace("; running", "") + "; cut at the limit (killed 30 s after SIGINT)"
    line += f"; rc={rc}, wall {wall:.0f} s"
    with open(base + ".summary", "w") as f:
        f.write(line + "\n")
    return rc, line


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--list", action="store_true", help="list the parts and their files")
    ap.add_argument("--part", help="parts' numbers (1-based) or names, comma-separated, or 'all'")
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
    chosen = []
    for p in (list(map(str, range(1, len(ps) + 1))) if a.part == "all" else a.part.split(",")):
        if p.isdigit() and 1 <= int(p) <= len(ps):
            chosen.append(int(p))
        elif p in names:
            chosen.append(names.index(p) + 1)
        else:
            ap.error(f"--part {a.part!r}: numbers 1-{len(ps)} or names of {names}, "
                     "separated by commas, or 'all'")
    os.makedirs(a.out, exist_ok=True)
    worst = 0
    for i in chosen:
        rc, line = run_part(i, a.out, a.limit, a.pytest_args, a.resume)
        print(line, flush=True)
        if len(chosen) > 1:
            with open(os.path.join(a.out, "summary.txt"), "a") as f:
                f.write(line + "\n")
        worst = worst or rc
    return 0 if worst == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
