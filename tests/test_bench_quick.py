"""The benchmark runner: `bench/run.py --quick --only seed` works end to end (as CI runs it), and
the chart/table machinery handles the row shapes the other benchmarks write."""
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCH = os.path.join(ROOT, "bench")


def test_run_quick_seed(tmp_path):
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    env.pop("JAXREWRITE_LOG", None)
    proc = subprocess.run([sys.executable, os.path.join(BENCH, "run.py"), "--quick", "--only", "seed",
                           "--out", str(tmp_path)], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "[seed 1/" in proc.stderr and "=== seed: " in proc.stderr   # progress was shown
    payload = json.loads((tmp_path / "seed.json").read_text())
    assert payload["meta"]["quick"] is True and payload["backend"] == "cpu"
    rows = {r["program"]: r for r in payload["rows"]}
    for name in ("loop/inline", "loop/jit", "loop/closure", "rounds/shift/gather",
                 "rounds/mix/take", "rounds/mix/none", "call overhead"):
        assert name in rows, name
    # what jax.jit does to the seed programs, as the issue states it
    assert rows["loop/closure"]["jaxprs_jit"] == 10
    assert rows["loop/jit"]["jaxprs_jit"] == 1 and rows["loop/inline"]["jaxprs_jit"] == 0
    for name, r in rows.items():
        if name == "call overhead":
            assert r["run_us_jit"] > 0 and r["run_us_opt"] > 0 and r["run_ratio"] > 0
            continue
        # figures, not claims about the passes (their own tests make those)
        for k in ("eqns_jit", "eqns_opt", "jaxprs_jit", "jaxprs_opt", "funcs_jit", "funcs_opt"):
            assert isinstance(r[k], int) and r[k] >= 0, (name, k)
        assert r["funcs_jit"] == r["jaxprs_jit"] + 1, name   # jax.jit lowers each jaxpr once
        assert r["compile_ms_jit"] > 0 and r["compile_ms_opt"] > 0, name
        assert r["fusions_jit"] >= 1 and r["fusions_opt"] >= 1, name
    readme = (tmp_path / "README.md").read_text()
    assert "## seed" in readme and "| loop/closure |" in readme and "--quick --only seed" in readme
    pngs = sorted(p.name for p in tmp_path.glob("seed_*.png"))
    if _has_matplotlib():
        assert pngs and all((tmp_path / p).stat().st_size > 1000 for p in pngs)
    else:  # the test extra has no matplotlib: the runner says it skipped the charts, and why
        assert not pngs and "charts skipped" in proc.stderr and ".[bench]" in proc.stderr


def _has_matplotlib() -> bool:
    import importlib.util
    return importlib.util.find_spec("matplotlib") is not None


def test_missing_benchmark_fails_loudly(tmp_path):
    proc = subprocess.run([sys.executable, os.path.join(BENCH, "run.py"), "--quick", "--only",
                           "no_such_bench", "--out", str(tmp_path), "--no-charts"], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1
    assert "no_such_bench FAILED" in proc.stderr and "does not exist" in proc.stderr
    assert "no_such_bench: failed" in (tmp_path / "README.md").read_text()


@pytest.fixture
def runner():
    sys.path.insert(0, BENCH)
    try:
        import run
        yield run
    finally:
        sys.path.remove(BENCH)


def test_charts_from_row_shapes(tmp_path, runner):
    pytest.importorskip("matplotlib")
    by_n = [dict(variant=v, N=n, compile_ms=n * (1 if v == "opt" else 3.0), compile_ratio=0.3)
            for v in ("jit", "opt") for n in (1, 10, 100)]
    by_batch = [dict(form=f, batch=b, run_us_jit=b * 1.0, run_us_opt=b * 0.5)
                for f in ("take", "gather") for b in (16, 256)]
    forms = [dict(form=f, kernels_jit=12, kernels_opt=3, compile_ms_jit=5.0, compile_ms_opt=4.0)
             for f in ("take", "gather", "none")]
    assert [s["suffix"] for s in runner.chart_specs("a", by_n)] == ["compile_vs_n"]
    assert [s["suffix"] for s in runner.chart_specs("b", by_batch)] == ["run_vs_batch"]
    assert [s["suffix"] for s in runner.chart_specs("c", forms)] == \
        ["kernels_per_form", "compile_per_form"]
    spec = runner.chart_specs("c", forms)[0]
    assert spec["ys"] == ["kernels_jit", "kernels_opt"]
    paths = runner.draw("a", by_n, str(tmp_path)) + runner.draw("c", forms, str(tmp_path))
    assert len(paths) == 3 and all(os.path.getsize(p) > 1000 for p in paths)


def test_update_readme_block(tmp_path, runner):
    """`--update-readme` writes the tables into docs/measurements.md, charts linked from there."""
    page = tmp_path / "docs" / "measurements.md"
    page.parent.mkdir()
    page.write_text("intro\n<!-- bench:seed -->\nold table\n<!-- /bench:seed -->\nend\n")
    payload = dict(jax="0.10.2", backend="cpu", date="today", meta=dict(quick=False, seconds=3.0),
                   rows=[dict(program="loop/closure", eqns_jit=100, eqns_opt=19, extra=1.0)])
    chart = tmp_path / "bench" / "results" / "seed_kernels_per_form.png"
    cols = ("program", "eqns_jit", "eqns_opt")
    assert runner.update_readme(payload, [str(chart)], str(tmp_path), cols)
    text = page.read_text()
    assert "old table" not in text and text.startswith("intro\n<!-- bench:seed -->\n")
    assert text.endswith("<!-- /bench:seed -->\nend\n")
    assert "| loop/closure | 100 | 19 |" in text and "extra" not in text
    assert "](../bench/results/seed_kernels_per_form.png)" in text
    assert not runner.update_readme(payload, [], str(tmp_path), name="switch")  # no such block
    page.write_text("no markers\n")
    assert not runner.update_readme(payload, [], str(tmp_path))
    assert page.read_text() == "no markers\n"
    assert not (tmp_path / "README.md").exists()


@pytest.mark.skipif(not hasattr(os, "sched_getaffinity") or not os.path.isdir("/proc/self/task"),
                    reason="per-thread affinity is Linux's")
def test_one_core_pins_every_thread_and_restores(runner):
    import threading

    import _common
    before = {int(t): os.sched_getaffinity(int(t)) for t in os.listdir("/proc/self/task")}
    stop = threading.Event()
    worker = threading.Thread(target=stop.wait)   # a thread that exists before the block
    worker.start()
    try:
        with _common.one_core() as core:
            assert core in os.sched_getaffinity(0)
            for t in os.listdir("/proc/self/task"):
                assert os.sched_getaffinity(int(t)) == {core}
        after = {int(t): os.sched_getaffinity(int(t)) for t in os.listdir("/proc/self/task")}
        for t, mask in before.items():
            if t in after:
                assert after[t] == mask
        assert after[worker.native_id] == before[threading.main_thread().native_id]
    finally:
        stop.set()
        worker.join()


def test_never_worse_sweep_end_to_end(tmp_path, runner):
    """bench/never_worse_sweep.py on three tiny drawn programs (the TPU's decisions, emulated):
    every one measured against jax.jit and its A/A, one JSON line each as it goes; --resume
    measures only what the file lacks, and a program started and never finished is not
    measured again."""
    import never_worse_sweep as W
    out = str(tmp_path)
    common = ["--out", out, "--sizes", "64", "--max-rounds", "2", "--target", "tpu"]
    assert W.main(common + ["--n", "2", "--budget", "300"]) == 0
    path = tmp_path / W.FILE
    records = W.load(str(path))
    results = [r for r in records if r["kind"] == "result"]
    assert len(results) == 2 and all(r["size"] == 64 for r in results)
    for r in results:
        m = r["final"]
        assert m["bits"] and m["aa_bits"] and m["contract"] == "ok"      # tiny: no noise kind
        assert m["run_ms"]["jit"] > 0 and m["compile_s"]["opt"] > 0 and m["aa_run"] > 0
        assert r["violations"] == W.violations(m)
    with pytest.raises(SystemExit):                  # an existing file needs --resume
        W.main(common + ["--n", "2"])
    # a third program whose measurement never ended: recorded, not measured again
    third = W.at_size(W.draw(3, 0, max_rounds=2)[2], 64)
    W.append(str(path), dict(kind="start", recipe=repr(third), size=64, index=2))
    assert W.main(common + ["--n", "3", "--resume", "--budget", "300"]) == 0
    records = W.load(str(path))
    assert len([r for r in records if r["kind"] == "result"]) == 2
    assert W.status(records)[(repr(third), 64)] == "unfinished"
    assert "unfinished 1" in W.summary(records)
    # the next device call starts in an empty folder, from the last call's file
    fresh = tmp_path / "next"
    assert W.main(["--out", str(fresh), "--start-from", str(path), "--sizes", "64",
                   "--max-rounds", "2", "--n", "3", "--budget", "0"]) == 0
    assert W.load(str(fresh / W.FILE))[:len(records)] == records


def test_never_worse_sweep_skips_what_compiled_to_jax_jit_s_program(tmp_path, runner):
    """`--skip-same FILE`: the programs a `--compile-only` file found compiled to jax.jit's HLO
    (within the compile rule) are written as `same_here` lines, counted apart, and not timed;
    one past the compile rule, or changed, is timed."""
    import never_worse_sweep as W
    drawn = [W.at_size(r, 64) for r in W.draw(3, 0, max_rounds=2)]
    compiled = tmp_path / "compiled.jsonl"
    for k, (same, ratio) in enumerate([(True, 1.1), (False, 1.0), (True, 3.5)]):
        W.append(str(compiled), dict(kind="compiled", recipe=repr(drawn[k]), size=64, index=k,
                                     same=same, compile=ratio, launches={"jit": 3, "opt": 3}))
    out = tmp_path / "out"
    assert W.main(["--out", str(out), "--sizes", "64", "--n", "3", "--max-rounds", "2",
                   "--target", "tpu", "--skip-same", str(compiled), "--budget", "300"]) == 0
    records = W.load(str(out / W.FILE))
    kinds = {r["recipe"]: r["kind"] for r in records if r["kind"] in ("result", "same_here")}
    assert kinds == {repr(drawn[0]): "same_here", repr(drawn[1]): "result",
                     repr(drawn[2]): "result"}
    assert W.status(records)[(repr(drawn[0]), 64)] == "same_here"
    assert "1 more programs compiled to jax.jit's HLO" in W.summary(records)


def test_never_worse_sweep_rule(runner):
    """Issue 45's rule: run <= 1.05x; compile <= 3x unless the run is <= 0.67x; a run ratio
    of a program compiled to jax.jit's own HLO is noise."""
    import never_worse_sweep as W
    m = dict(run=1.0, compile=1.0, same=False, contract="ok")
    assert W.violations(m) == []
    assert W.violations(dict(m, run=1.06))[0].startswith("run 1.06x")
    assert W.violations(dict(m, run=1.06, same=True)) == []
    assert W.violations(dict(m, compile=3.5, run=0.66)) == []
    assert W.violations(dict(m, compile=3.5, run=0.9))[0].startswith("compile 3.50x")
    assert W.violations(dict(m, contract="differs"))[0].startswith("outputs differ")


def test_never_worse_sweep_measures_only_what_match_names(tmp_path, runner):
    """`--match TEXT`: of the same draw, only the programs whose recipe holds TEXT, each under
    its index in the full draw (a device call re-measures chosen programs)."""
    import never_worse_sweep as W
    drawn = W.draw(6, 0, max_rounds=2)
    want = type(drawn[-1]).__name__
    assert W.main(["--out", str(tmp_path), "--sizes", "64", "--n", "6", "--max-rounds", "2",
                   "--target", "tpu", "--match", want, "--budget", "300"]) == 0
    results = [r for r in W.load(str(tmp_path / W.FILE)) if r["kind"] == "result"]
    assert results and all(r["recipe"].startswith(want + "(") for r in results)
    assert {r["index"] for r in results} == {k for k, d in enumerate(drawn)
                                             if type(d).__name__ == want}


def test_never_worse_sweep_calls_a_slow_form_fewer_times(runner, monkeypatch):
    """A sample's calls follow the slowest form's call, and the rounds fit the sampling budget:
    a form thousands of times slower than jax.jit (the TPU's forms run by XLA:CPU in a dry run:
    44 s a call) does not hold the sweep for as many calls as jax.jit's."""
    import jax.numpy as jnp

    import never_worse_sweep as W

    class Slow:
        fn = staticmethod(lambda x: jnp.sin(x) * 2.0)
        args = (jnp.ones(64, jnp.float32),)

    plain = W._makers

    def makers(fn, target):
        m = plain(fn, target)
        m["opt"] = lambda: _Delayed(m["jit"]())
        return m

    class _Delayed:            # jax.jit's program, every call of it 50 ms late
        def __init__(self, jitted):
            self.jitted, self.c = jitted, None

        def lower(self, *a):
            self.c = self.jitted.lower(*a).compile()
            return self

        def compile(self):
            return self

        def __call__(self, *a):
            import time
            time.sleep(0.05)
            return self.c(*a)

        def as_text(self):
            return self.c.as_text()

    monkeypatch.setattr(W, "_makers", makers)
    monkeypatch.setattr(W, "SAMPLING_S", 0.12)       # 2 rounds of a 50 ms call
    m = W.measure(Slow(), rounds=5)
    assert m["calls_per_sample"] == 1 and 1 <= m["rounds"] <= 2
    assert m["run"] > 10 and m["bits"]


def test_models_phases_reads_xla_timers(runner):
    """`models.py --phases` takes a timer's last reading, in XLA's exact microseconds, and a
    timer that never logged reads as NaN (a compile whose logging was off is not a zero)."""
    import math

    import models
    name = "Running HLO passes on [jit_step] for CPU"
    log = (f"I1207 03:05:39.50 8533 cpu_compiler.cc:1215] {name} time: 1.20 s (1204000 us) "
           "(cumulative: 1.2 s, max: 1.2 s, #called: 1)\n"
           f"I1207 03:05:44.93 8533 cpu_compiler.cc:1215] {name} time: 5.52 s (5524836 us) "
           "(cumulative: 6.7 s, max: 5.52 s, #called: 2)\n")
    assert models._timer_s(log, name) == 5.524836
    assert math.isnan(models._timer_s(log, "Compiling [jit_step] for CPU using JIT"))


def test_skip_leaves_out_what_an_earlier_ci_step_ran(runner):
    """`--skip` drops names from the discovered list (.ci/run: seed and scale ran in
    earlier steps); `--only` still names exactly what runs."""
    every = runner.discover(None)
    assert {"seed", "scale", "faults", "dedup"} <= set(every)
    kept = runner.discover(None, ["seed", "scale", "faults"])
    assert kept == [n for n in every if n not in ("seed", "scale", "faults")]
    assert runner.discover(["seed"], ["seed"]) == ["seed"]
    assert not set(kept) & runner._NOT_BENCHES


def test_every_discovered_bench_has_a_name_and_main(runner):
    """A file in bench/ that `run.py` would run must define `NAME` and `main` (a device run or a
    helper goes in `_NOT_BENCHES`): CI's quick run stops at the first one that does not."""
    import ast
    for name in runner.discover(None):
        with open(os.path.join(runner.HERE, f"{name}.py")) as fh:
            tree = ast.parse(fh.read())
        top = {t.id for n in tree.body if isinstance(n, ast.Assign) for t in n.targets
               if isinstance(t, ast.Name)}
        funcs = {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
        assert "NAME" in top and "main" in funcs, name
