"""What a TPU v5e would run, compiled on this host with no TPU: launches and VLIW bundles.

    python3 bench/tpu_aot.py                         # tpu_dump's programs, 1,048,576 blocks
    python3 bench/tpu_aot.py author split threefry_jit --n 65536
    python3 bench/tpu_aot.py step:jit:8 step:scan:8 step:reroll:8    # issue 46's step forms
    python3 bench/tpu_aot.py acc:chacha:jit acc:chacha:opt acc:chacha:pieces

Needs libtpu (`pip install -e ".[tpu-aot]"`, best in a venv of its own: `.ci/run`'s tpu-aot
step makes one). Each program (`tpu_dump.build`: the kernel pass's ChaCha20 kernels, hand-made
ones, the split XLA form, JAX's Threefry draw by jax.jit and by the kernel) is compiled in a
child process by XLA:TPU and Mosaic for a compile-only TPU v5e (`backend.xla.tpu_compile`),
with libtpu's own dump on (`--xla_jf_dump_to`). From each launched computation's final bundles
(the program the chip's TensorCore issues, one VLIW bundle a cycle) this counts:

- `bundles`: static, and `dynamic`: each bundle times the trip counts of the loops around it
  (read from the loops' exit tests);
- `valu`: vector ALU operations per bundle inside loops, of the 4 slots a bundle has.

What it predicts, calibrated on the chip (Dec 6-7, `bench/threefry.py`, `bench/tpu_dump.py`):
XLA's Threefry fusion of 2**26 words, 2.01M dynamic bundles, ran 2.02 ms; the kernel pass's
Threefry kernel, 2.04M, ran 2.04-2.10 ms. So a bundle costs about 1.0 ns where the VALU is the
bound; where HBM is (copies, relayouts) the time is longer than the bundles say, and only the
chip can tell. `predicted_ms` is `dynamic` x 1.0 ns, a lower bound.

`acc:GROUP:FORM` programs are the accelerator bench's group GROUP (`chacha`, `salsa`, ...) as
FORM (`jit`, `opt`, or `pieces`: `kernel_in_place=False`): compile seconds and launches of
each of its programs, no bundles.

`step:FORM:LAYERS` programs are the training step of `tpu_costs.py --only reroll` (forms in
`STEP_FORMS`): compile seconds on this host, launches and temporaries, no bundles (`--bundles`
counts them too, with a compile 3-4x longer; they do not time a step: the 8-layer `jax.jit`
step has 1.41M, its hand scan 1.42M, where the chip ran 8.61 ms and 13.7 ms).

One JSON line a program; with `--out DIR` (default `bench/results/`), `tpu_aot.json`
(`tpu_aot_steps.json` for `step:` programs alone, `tpu_aot_accelerator.json` for `acc:` ones).
"""
from __future__ import annotations

import collections
import glob
import json
import os
import re
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
NS_PER_BUNDLE = 1.0     # the calibration above
PROGRAMS = ("author", "word", "hand", "hand_native", "split", "threefry_jit", "threefry_kernel")

_BUNDLE = re.compile(r"^\s*(?:0x[0-9a-f]+|\d+)\s+(LB|LH|LE|PB|PF|CT)?:\s*(>*)\s*\{")
_EXIT = re.compile(r"scmp\.\w+\.[su]32\.totalorder %s\w+, (\d+) /\* loop exit test")
_VOP = re.compile(r"= (v[a-z]+)[.\s]")


def bundles(path: str) -> dict:
    """One final_bundles dump: static and dynamic bundle counts, vector ops in loops.

    A bundle line starts with its address, a loop mark (`LB:` opens a loop body) and one `>` per
    loop around it (none on an empty bundle, which takes its neighbour's depth). A loop ends at
    the first bundle shallower than it or at the next loop opened at its depth; its trips are
    the constant of the first exit test inside it (1 where none is found)."""
    items, loops, stack = [], [], []
    with open(path) as fh:
        lines = [ln for ln in fh if _BUNDLE.match(ln)]
    for ln in lines:
        m = _BUNDLE.match(ln)
        depth = len(m.group(2))
        if ln[m.end():].lstrip().startswith("}") and items:
            depth = items[-1][0]
        while stack and (depth < stack[-1]["depth"] or (m.group(1) == "LB"
                                                        and depth == stack[-1]["depth"])):
            stack.pop()
        if m.group(1) == "LB":
            stack.append(dict(depth=depth, trips=None))
            loops.append(stack[-1])
        if stack and stack[-1]["trips"] is None:
            e = _EXIT.search(ln)
            if e:
                stack[-1]["trips"] = int(e.group(1))
        items.append((depth, list(stack), ln))
    dynamic, valu, in_loop = 0, collections.Counter(), 0
    for depth, around, ln in items:
        k = 1
        for lp in around:
            k *= lp["trips"] or 1
        dynamic += k
        if around:
            in_loop += 1
            valu.update(_VOP.findall(ln))
    alu = sum(n for op, n in valu.items() if op not in ("vld", "vst", "vsyncadd", "vphi",
                                                        "vmov", "vsyncpa", "vdelay"))
    return dict(bundles=len(items), dynamic=dynamic,
                loops=[lp["trips"] for lp in loops],
                valu_per_loop_bundle=round(alu / in_loop, 2) if in_loop else 0.0,
                loop_ops=dict(valu.most_common(8)))


def summarise(dump: str) -> dict:
    """Per launched computation of a libtpu dump (its final bundles), and the program's sum."""
    parts = {}
    for path in sorted(glob.glob(os.path.join(dump, "*-final_bundles.txt"))):
        if "schedule-analysis" in path:
            continue
        name = re.sub(r"^\d+-", "", os.path.basename(path))
        name = re.sub(r"-\d+-final_bundles\.txt$", "", name)
        if name.startswith("<"):        # libtpu's own start and end of a program
            continue
        parts[name] = bundles(path)
    dynamic = sum(p["dynamic"] for p in parts.values())
    return dict(dynamic=dynamic, predicted_ms=round(dynamic * NS_PER_BUNDLE * 1e-6, 3),
                parts=parts)


# `step:FORM:LAYERS`: tpu_costs' transformer training step (d=512, sequence 256, batch 16) in
# the forms `tpu_costs.py --only reroll` runs on the chip, compiled here: what the TPU's first
# call waits for, and the temporaries each form keeps. No bundles: a step is bound by the MXU
# and HBM, which bundles do not time (and libtpu's dump slows its compile 2-4x).
STEP_FORMS = ("jit", "scan", "scan_dots", "scan_nothing", "optimize", "reroll", "reroll_cpu",
              "reroll_recompute")


def _step(form: str, layers: int):
    """(function, argument specs, cost-row fields) of a training-step form."""
    import jax

    import jaxrewrite
    import tpu_costs
    remat = {"scan_dots": "dots_with_no_batch_dims_saveable",
             "scan_nothing": "nothing_saveable"}.get(form)
    step, args = tpu_costs.transformer_step(layers, 512, 256, 16,
                                            scanned=form.startswith("scan"), remat=remat)
    costs = {"reroll_cpu": tpu_costs.CPU_ROLLED,
             "reroll_recompute": {"reroll_recompute": True}}.get(form, {})
    if form.startswith("reroll") or form == "optimize":
        f = jaxrewrite.optimize(lambda *a: step(*a), reroll=form != "optimize", target="tpu")
    else:
        f = jax.jit(lambda *a: step(*a))
    specs = jax.tree_util.tree_map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), args)
    return f, specs, costs


# `acc:GROUP:FORM`: each program of one of the accelerator bench's groups (`accelerator.py`,
# its sizes for the chip) compiled here as `jit`, `opt` (optimize, the TPU's defaults) or
# `pieces` (the same with `kernel_in_place=False`: the kernel on pieces XLA relayouts): compile
# seconds and launches per program, no bundles.
ACC_FORMS = {"jit": None, "opt": {}, "pieces": {"kernel_in_place": False}}


def _acc(group: str, form: str) -> dict:
    import jax

    import accelerator
    import jaxrewrite
    from jaxrewrite.backend import cost, xla
    rows = []
    for case in getattr(accelerator, f"{group}_cases")(False):
        specs = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in case.make_args()]
        jax.clear_caches()        # (optimize's rewrite is cached per program, not per row)
        with jax.enable_x64(case.x64), cost.override_row("tpu", **(ACC_FORMS[form] or {})):
            f = (jax.jit(case.fn) if ACC_FORMS[form] is None
                 else jaxrewrite.optimize(case.fn, target="tpu"))
            t = time.perf_counter()
            compiled = xla.tpu_compile(f, *specs)
        rows.append(dict(program=case.program, size=case.size,
                         compile_s=round(time.perf_counter() - t, 2),
                         launches=sum(xla.launches(compiled).values())))
    return dict(program=f"acc:{group}:{form}", cases=rows)


def child(name: str, n: int) -> dict:
    sys.path.insert(0, HERE)
    import jax

    import tpu_costs
    import tpu_dump
    from jaxrewrite.backend import xla

    if name.startswith("acc:"):
        return _acc(*name.split(":")[1:])
    if name.startswith("step:"):
        _, form, layers = name.split(":")
        f, specs, costs = _step(form, int(layers))
    else:
        f, arg = tpu_dump.build(name, n)
        specs, costs = [jax.ShapeDtypeStruct(arg.shape, arg.dtype)], {}
    t = time.perf_counter()
    with tpu_costs.candidate_row(costs=costs):
        compiled = xla.tpu_compile(f, *specs)
    row = dict(program=name, n=n, compile_s=round(time.perf_counter() - t, 2),
               launches=xla.launches(compiled))
    mem = compiled.memory_analysis()
    if mem is not None:
        row["temp_mb"] = round(mem.temp_size_in_bytes / 2**20)
    return row


def run(name: str, n: int, bundles: bool = False) -> dict:
    # (no dump for step: and acc: programs unless asked: the comments above)
    bundled = bundles or not name.startswith(("step:", "acc:"))
    with tempfile.TemporaryDirectory() as dump:
        env = dict(os.environ, JAX_PLATFORMS="cpu",
                   PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
        if bundled:
            env["LIBTPU_INIT_ARGS"] = (os.environ.get("LIBTPU_INIT_ARGS", "") + f" --xla_jf_dump_to"
                                       f"={dump} --xla_jf_dump_llo_text=true")
        r = subprocess.run([sys.executable, __file__, "--child", name, str(n)], env=env,
                           capture_output=True, text=True, timeout=1200)
        rows = [json.loads(ln[4:]) for ln in r.stdout.splitlines() if ln.startswith("ROW ")]
        if r.returncode or not rows:
            return dict(program=name, n=n, error=(r.stderr or r.stdout).strip().splitlines()[-3:])
        return {**rows[0], **(summarise(dump) if bundled else {})}


def main(argv=None) -> list[dict]:
    args = sys.argv[1:] if argv is None else argv
    if args[:1] == ["--child"]:
        print("ROW " + json.dumps(child(args[1], int(args[2]))), flush=True)
        return []
    n = int(args[args.index("--n") + 1]) if "--n" in args else 1 << 20
    out = args[args.index("--out") + 1] if "--out" in args else os.path.join(HERE, "results")
    skip = {args[i + 1] for i, a in enumerate(args) if a in ("--n", "--out")}
    names = [a for a in args if not a.startswith("--") and a not in skip] or list(PROGRAMS)
    rows = []
    for name in names:
        rows.append(run(name, n, bundles="--bundles" in args))
        print(json.dumps({k: v for k, v in rows[-1].items() if k != "parts"}), flush=True)
    os.makedirs(out, exist_ok=True)
    kinds = {name.split(":")[0] if ":" in name else "" for name in names}
    file = {"step": "tpu_aot_steps.json", "acc": "tpu_aot_accelerator.json"}.get(
        kinds.pop() if len(kinds) == 1 else "", "tpu_aot.json")
    with open(os.path.join(out, file), "w") as fh:
        json.dump(rows, fh, indent=1)
    return rows


if __name__ == "__main__":
    main()
