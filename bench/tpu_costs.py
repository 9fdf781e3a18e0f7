"""The measurements behind the cost model's TPU rows (`backend/cost.py`), on the chip.

    python bench/tpu_costs.py [--quick] [--only SECTION[,SECTION]] [--budget SECONDS]

One process (opening a TPU costs ~15 s, and one process at a time may hold it); each section
adds rows as it goes and the JSON is rewritten after each one (`$OUT/tpu_costs.json` where
`OUT` is set, else bench/results/tpu_costs.json), so a run stopped at its limit keeps what it
measured. Run times are paired medians (jax.jit, candidate, jax.jit again as the A/A control,
...); compile times are trace + rewrite + lower + compile after `jax.clear_caches()`.

Sections:
* `movement`: a static permutation of a small axis as a user writes it (`x[:, perm]`), on the
  minor axis (B, K) and on the major axis (K, B) of an array: what the gathers pass's forms
  (rev, reshape-rev-reshape, transpose) cost against the gather XLA:TPU runs for `jax.jit`;
* `bitonic`: bitonic sorts of K keys per row (`x[..., partner]`, min/max), as a user writes
  them;
* `chacha`: the seed author's ChaCha20 (`bench/permutations.py`, `chacha_loop("fori")`) over
  4,096 to 1,048,576 blocks: where the split form pays for its compile time (launch-bound or
  not), with launches (instructions of the compiled module's entry computation);
* `seed`: `bench/seed.py`'s rounds programs at 65,536;
* `reroll`: a transformer LM training step (plain JAX, d=512, sequence 256, batch 16, Adam by
  hand) of 8 and 16 layers in a Python loop: jax.jit against `reroll=True` and the defaults,
  first call (trace + compile + run) and step, losses; and each form's compiled module
  (`hlo_summary`: copies, dynamic-update-slices, transposes, ... in the entry and inside its
  loops, temp memory; the text under `$OUT/hlo/`), to read what makes a rolled step slower.
  With `--profile`, each form's step under JAX's profiler (`_common.op_profile`): device time
  by op kind and the slowest ops, to find the ops that make the difference.
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _common  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import jaxrewrite  # noqa: E402

ROWS: list[dict] = []
T0 = time.perf_counter()


def _out_path() -> str:
    out = os.environ.get("OUT")
    return os.path.join(out, "tpu_costs.json") if out else os.path.join(_common.RESULTS,
                                                                        "tpu_costs.json")


def _save(meta: dict) -> None:
    with open(_out_path(), "w") as f:
        json.dump({"meta": meta, "rows": ROWS}, f, indent=1, default=str)


def _row(**kw) -> None:
    kw["t"] = round(time.perf_counter() - T0, 1)
    ROWS.append(kw)
    print(json.dumps(kw, default=str), flush=True)


def launches(compiled) -> int:
    """Instructions of the entry computation of a compiled module (what one call launches,
    loops counted once); -1 where the text is not available."""
    try:
        text = compiled.as_text()
    except Exception:  # noqa: BLE001 - a backend without HLO text
        return -1
    n, inside = 0, False
    for line in text.splitlines():
        if line.startswith("ENTRY"):
            inside = True
            continue
        if inside:
            if line.startswith("}"):
                break
            if " = " in line:
                n += 1
    return n


# What item 1 of issue 46 reads in each rolled step's compiled module: operations that copy or
# move the stacked weights, gradients and residuals, in the entry and inside loops.
HLO_OPS = ("copy", "dynamic-update-slice", "dynamic-slice", "transpose", "concatenate", "slice",
           "fusion", "custom-call", "while", "convolution", "dot")


def hlo_summary(compiled, name: str) -> dict:
    """Counts of `HLO_OPS` in `compiled`'s module (where it holds loops: also those inside them,
    "loop:" keys), its memory analysis, and the module written to `$OUT/hlo/<name>.txt` where
    OUT is set. Text is all XLA gives of a compiled module; a bench reads it, the tests do not."""
    try:
        text = compiled.as_text()
    except Exception as err:  # noqa: BLE001 - a backend without HLO text
        return {"error": repr(err)}
    out = os.environ.get("OUT")
    if out:
        os.makedirs(os.path.join(out, "hlo"), exist_ok=True)
        safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in name)
        with open(os.path.join(out, "hlo", safe + ".txt"), "w") as f:
            f.write(text)
    counts: dict = {}
    bodies = {ln.split("body=")[1].split(",")[0].split(")")[0].strip().lstrip("%")
              for ln in text.splitlines() if " while(" in ln and "body=" in ln}
    computation, loop = None, False
    for ln in text.splitlines():
        if ln and not ln.startswith(" ") and "{" in ln:  # a computation's header
            computation = ln.split()[1 if ln.startswith("ENTRY") else 0].lstrip("%")
            loop = computation in bodies
            continue
        if " = " not in ln:
            continue
        rhs = ln.split(" = ", 1)[1]
        op = next((o for o in HLO_OPS if f" {o}(" in rhs or rhs.startswith(f"{o}(")), None)
        if op is not None:
            key = ("loop:" if loop else "") + op
            counts[key] = counts.get(key, 0) + 1
    try:
        mem = compiled.memory_analysis()
        counts["temp_mb"] = round(mem.temp_size_in_bytes / 2**20, 1)
        counts["argument_mb"] = round(mem.argument_size_in_bytes / 2**20, 1)
    except Exception:  # noqa: BLE001 - a backend without memory analysis
        pass
    return counts


def compile_s(make, args) -> tuple[float, object]:
    """Seconds to trace, rewrite, lower and compile `make()` from fresh caches."""
    jax.clear_caches()
    f = make()
    t = time.perf_counter()
    c = f.lower(*args).compile()
    return time.perf_counter() - t, c


def same_bits(a, b) -> bool:
    return all(np.array_equal(np.ascontiguousarray(x).view(np.uint8),
                              np.ascontiguousarray(y).view(np.uint8))
               for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)))


@contextlib.contextmanager
def candidate_row(costs: dict | None = None, loop_costs: dict | None = None):
    """The TPU cost rows with `costs` / `loop_costs` fields replaced, for one compile: a
    candidate rule measured beside the rows as they are."""
    from jaxrewrite.backend import cost
    saved = cost.COSTS["tpu"], cost.LOOP_COSTS["tpu"]
    cost.COSTS["tpu"] = dataclasses.replace(saved[0], **(costs or {}))
    cost.LOOP_COSTS["tpu"] = dataclasses.replace(saved[1], **(loop_costs or {}))
    try:
        yield
    finally:
        cost.COSTS["tpu"], cost.LOOP_COSTS["tpu"] = saved


def compare(section: str, name: str, size, fn, args, forms: dict, repeats: int) -> None:
    """jax.jit(fn) against each optimize form in `forms` (name -> options, or (options,
    candidate_row's keywords)): runs (paired, with an A/A jax.jit), compiles, launches, bits."""
    makers = {"jit": (lambda: jax.jit(lambda *a: fn(*a)), {}),
              "jit A/A": (lambda: jax.jit(lambda *a: fn(*a)), {})}
    for form, spec in forms.items():
        opts, row = spec if isinstance(spec, tuple) else (spec, {})
        makers[form] = ((lambda o: lambda: jaxrewrite.optimize(lambda *a: fn(*a), **o))(opts),
                        row)
    compiled, comp = {}, {}
    for form, (make, row) in makers.items():
        with candidate_row(**row):
            comp[form], compiled[form] = compile_s(make, args)
    ref = compiled["jit"](*args)
    runs = _common.paired({k: (lambda c: lambda: c(*args))(c) for k, c in compiled.items()},
                          repeats=repeats)
    for form in makers:
        _row(section=section, program=name, size=size, form=form,
             run_ms=round(runs[form] * 1e3, 4), run_ratio=round(runs[form] / runs["jit"], 3),
             compile_s=round(comp[form], 3), compile_ratio=round(comp[form] / comp["jit"], 2),
             launches=launches(compiled[form]), exact=same_bits(compiled[form](*args), ref))


# --- movement -------------------------------------------------------------------------------------

def _perms(k: int) -> dict:
    i = np.arange(k)
    return {"rev": i[::-1].copy(), "swap pairs (i^1)": i ^ 1, "swap halves": i ^ (k // 2),
            "random": np.random.default_rng(k).permutation(k)}


def movement(quick: bool) -> None:
    batch = 1024 if quick else 65536
    for k in ((16,) if quick else (16, 64, 128)):
        for pname, perm in _perms(k).items():
            x = jnp.asarray(np.random.default_rng(0).integers(0, 2**32, (batch, k),
                                                              dtype=np.uint32))
            compare("movement", f"minor axis {pname}", (batch, k),
                    lambda x, p=perm: (x[:, p] ^ (x >> 3)), (x,),
                    {"optimize": {}, "optimize gathers=False": {"gathers": False}}, 9)
            xt = x.T
            compare("movement", f"major axis {pname}", (k, batch),
                    lambda x, p=perm: (x[p, :] ^ (x >> 3)), (xt,),
                    {"optimize": {}}, 9)


# --- bitonic sorts ----------------------------------------------------------------------------------

def bitonic_sort(x):
    """Sort the last axis (a power of two) with the bitonic network, as written by hand
    (bench/gathers.py's)."""
    from gathers import _bitonic
    return _bitonic(x)


def bitonic(quick: bool) -> None:
    for batch in ((1024,) if quick else (4096, 65536)):
        for k in ((16,) if quick else (16, 32, 64)):
            x = jnp.asarray(np.random.default_rng(k).integers(-2**31, 2**31, (batch, k),
                                                              dtype=np.int32))
            compare("bitonic", f"bitonic sort of {k} keys", (batch, k), bitonic_sort, (x,),
                    {"optimize": {}, "optimize gathers=False": {"gathers": False},
                     "optimize, split up to 64": ({}, {"costs": dict(max_axis=64,
                                                                     max_pieces=64)})}, 9)


# --- ChaCha20, the author's form ----------------------------------------------------------------------

def chacha(quick: bool) -> None:
    from permutations import _blocks, chacha_loop
    block = jax.vmap(chacha_loop("fori"))
    for n in ((4096,) if quick else (4096, 65536, 262144, 1 << 20)):
        x = _blocks(n)
        compare("chacha", "chacha20 author's fori form", n, block, (x,),
                {"optimize": {}, "optimize, loop rolled, carry split": ({}, {"loop_costs": dict(
                    launches_decide=False, split_carry=True, min_body_permutations=2,
                    min_split_trips=3, min_split_work=5.0)})}, 7)


# --- the seed's rounds programs ----------------------------------------------------------------------

def seed(quick: bool) -> None:
    import seed as seed_bench
    for name, fn, arg in seed_bench.programs(quick):
        if name.startswith("rounds/"):
            compare("seed", name, tuple(arg.shape), fn, (arg,), {"optimize": {}}, 7)


# --- a transformer LM training step, layers in a Python loop -----------------------------------------

def _layer_params(key, d, ff):
    ks = jax.random.split(key, 6)
    s = 1 / np.sqrt(d)
    return {"ln1": jnp.ones(d), "ln2": jnp.ones(d),
            "wq": jax.random.normal(ks[0], (d, d)) * s, "wk": jax.random.normal(ks[1], (d, d)) * s,
            "wv": jax.random.normal(ks[2], (d, d)) * s, "wo": jax.random.normal(ks[3], (d, d)) * s,
            "w1": jax.random.normal(ks[4], (d, ff)) * s,
            "w2": jax.random.normal(ks[5], (ff, d)) / np.sqrt(ff)}


def _ln(x, g):
    m = x.mean(-1, keepdims=True)
    v = ((x - m) ** 2).mean(-1, keepdims=True)
    return (x - m) * jax.lax.rsqrt(v + 1e-5) * g


def _block(p, x, heads):
    b, t, d = x.shape
    h = _ln(x, p["ln1"])
    q, k, v = (jnp.einsum("btd,de->bte", h, p[w]).reshape(b, t, heads, d // heads)
               for w in ("wq", "wk", "wv"))
    a = jnp.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(d // heads)
    a = jnp.where(jnp.tril(jnp.ones((t, t), bool)), a, -1e9)
    o = jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(a, -1), v).reshape(b, t, d)
    x = x + o @ p["wo"]
    return x + jax.nn.gelu(_ln(x, p["ln2"]) @ p["w1"]) @ p["w2"]


def transformer_step(layers: int, d: int, seq: int, batch: int, vocab: int = 1024,
                     heads: int = 8, scanned: bool = False, remat: str | None = None):
    """(step, args): Adam on a transformer LM's loss, its layers in a Python loop or, with
    `scanned`, in `lax.scan` over stacked layer parameters as a user writes it by hand;
    `remat`: the scanned block under `jax.checkpoint` with that `jax.checkpoint_policies`
    policy (MaxText's form: the backward loop recomputes what the policy does not save)."""
    key = jax.random.key(0)
    params = {"emb": jax.random.normal(key, (vocab, d)) * 0.02,
              "layers": [_layer_params(jax.random.fold_in(key, i), d, 4 * d)
                         for i in range(layers)]}

    if scanned:
        params["layers"] = jax.tree_util.tree_map(lambda *a: jnp.stack(a), *params["layers"])

    def loss(p, tok):
        x = p["emb"][tok]
        if scanned:
            block = lambda x, lp: (_block(lp, x, heads), None)  # noqa: E731
            if remat:
                block = jax.checkpoint(block, policy=getattr(jax.checkpoint_policies, remat))
            x = jax.lax.scan(block, x, p["layers"])[0]
        for lp in ([] if scanned else p["layers"]):
            x = _block(lp, x, heads)
        logits = x @ p["emb"].T
        lp_ = jax.nn.log_softmax(logits[:, :-1])
        return -jnp.take_along_axis(lp_, tok[:, 1:, None], -1).mean()

    def step(p, m, v, tok):
        l, g = jax.value_and_grad(loss)(p, tok)
        m = jax.tree_util.tree_map(lambda m, g: 0.9 * m + 0.1 * g, m, g)
        v = jax.tree_util.tree_map(lambda v, g: 0.999 * v + 0.001 * g * g, v, g)
        p = jax.tree_util.tree_map(lambda p, m, v: p - 1e-3 * m / (jnp.sqrt(v) + 1e-8), p, m, v)
        return l, p, m, v

    zeros = jax.tree_util.tree_map(jnp.zeros_like, params)
    tok = jax.random.randint(jax.random.key(1), (batch, seq), 0, vocab)
    return step, (params, zeros, zeros, tok)


# The CPU row's rolled training step (`backend/cost.py`): the backward loop runs each block's
# forward again, rows of stacked results read at runtime offsets, per-layer operands from lists.
CPU_ROLLED = dict(reroll_recompute=True, reroll_runtime_offsets=True, reroll_list_read=True)
LAYERS = [8, 16]
PROFILE = []        # --profile: each form's ops under JAX's profiler (`_common.op_profile`)
REMAT = ("dots_with_no_batch_dims_saveable", "nothing_saveable")


def reroll(quick: bool) -> None:
    sizes = ((2, 64, 32, 2),) if quick else tuple((n, 512, 256, 16) for n in LAYERS)
    for layers, d, seq, batch in sizes:
        step, args = transformer_step(layers, d, seq, batch)
        scan_step, scan_args = transformer_step(layers, d, seq, batch, scanned=True)
        # the scan with what its backward loop saves chosen by a remat policy (Dec 7 on the
        # chip the plain scan ran 1.59x: every residual stacked, 2.3 GB of temporaries)
        remat_steps = {policy: transformer_step(layers, d, seq, batch, scanned=True,
                                                remat=policy)[0] for policy in REMAT}
        forms = {"jit": (lambda: jax.jit(lambda *a: step(*a)), {}),
                 "jit, layers in lax.scan by hand": (lambda: jax.jit(lambda *a: scan_step(*a)),
                                                     {}),
                 **{f"jit, layers in lax.scan by hand, remat {policy}": (
                     (lambda s: lambda: jax.jit(lambda *a: s(*a)))(s), {})
                    for policy, s in remat_steps.items()},
                 "optimize": (lambda: jaxrewrite.optimize(lambda *a: step(*a)), {}),
                 "optimize reroll=True": (lambda: jaxrewrite.optimize(lambda *a: step(*a),
                                                                      reroll=True), {}),
                 "optimize reroll=True, the CPU's rolled form": (
                     lambda: jaxrewrite.optimize(lambda *a: step(*a), reroll=True),
                     {"costs": CPU_ROLLED}),
                 # the CPU form's recompute alone (the weights stacked, not read from lists at
                 # runtime offsets): which of its three parts the TPU's step time follows
                 "optimize reroll=True, recompute only": (
                     lambda: jaxrewrite.optimize(lambda *a: step(*a), reroll=True),
                     {"costs": {"reroll_recompute": True}})}
        first, fns, losses, hlo = {}, {}, {}, {}
        for form, (make, row) in forms.items():
            jax.clear_caches()
            f = make()
            t = time.perf_counter()
            a = scan_args if "by hand" in form else args
            with candidate_row(**row):  # the first call, through its stages: the module at hand
                compiled = f.lower(*a).compile()
                out = _common.block(compiled(*a))
            first[form] = time.perf_counter() - t
            fns[form] = compiled
            losses[form] = float(out[0])
            hlo[form] = hlo_summary(compiled, f"reroll-{layers}-{form}")
        runs = _common.paired({k: (lambda f, a: lambda: f(*a))(
            f, scan_args if "by hand" in k else args) for k, f in fns.items()},
            repeats=5 if not quick else 3)
        profiles = {k: _common.op_profile((lambda f, a: lambda: f(*a))(
            f, scan_args if "by hand" in k else args)) for k, f in fns.items()} if PROFILE else {}
        for form in forms:
            _row(section="reroll", program=f"transformer step, {layers} layers", size=(d, seq,
                                                                                       batch),
                 form=form, first_call_s=round(first[form], 2),
                 first_call_ratio=round(first[form] / first["jit"], 3),
                 run_ms=round(runs[form] * 1e3, 3), run_ratio=round(runs[form] / runs["jit"], 3),
                 loss=losses[form],
                 loss_rel=abs(losses[form] - losses["jit"]) / max(abs(losses["jit"]), 1e-30),
                 hlo=hlo[form], **({"profile": profiles[form]} if PROFILE else {}))


SECTIONS = {"chacha": chacha, "bitonic": bitonic, "movement": movement, "seed": seed,
            "reroll": reroll}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--only", default=",".join(SECTIONS))
    ap.add_argument("--budget", type=float, default=float("inf"),
                    help="seconds after which no new section starts")
    ap.add_argument("--layers", default="8,16", help="transformer depths (reroll)")
    ap.add_argument("--profile", action="store_true",
                    help="reroll: where each form's step time goes, op by op")
    a = ap.parse_args()
    LAYERS[:] = [int(n) for n in a.layers.split(",")]
    PROFILE[:] = [True] if a.profile else []
    dev = jax.devices()[0]
    meta = {"backend": jax.default_backend(), "device": getattr(dev, "device_kind", str(dev)),
            "jax": jax.__version__, "quick": a.quick, "date": time.strftime("%Y-%m-%d %H:%M")}
    print(json.dumps(meta), flush=True)
    for name in a.only.split(","):
        if time.perf_counter() - T0 > a.budget:
            _row(section=name, skipped=f"budget of {a.budget:g} s spent")
            continue
        try:
            SECTIONS[name](a.quick)
        except Exception as e:  # noqa: BLE001 - a bench: say what failed, keep the rest
            _row(section=name, error=f"{type(e).__name__}: {e}"[:2000])
        _save(meta)
    _save(meta)


if __name__ == "__main__":
    main()
