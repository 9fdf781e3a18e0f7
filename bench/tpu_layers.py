"""Training steps as users write them, under the switch: what a TPU user gets by default (issue 46).

    python bench/tpu_layers.py [--models nnx,linen,...] [--layers 8,24] [--forms ...]
        [--size 512,8,256,16,8192] [--steps 10] [--repeats 5] [--budget S] [--out DIR] [--resume]

Each model's step is `jax.jit(step)` as its library's users write it (bench/models.py's Flax
NNX, Flax Linen, Linen with `nn.remat` blocks, Haiku and Equinox transformers, optax adam;
bench/tpu_costs.py's plain-JAX transformer with Adam by hand; an MLP stack), its blocks built
in a Python loop. Forms:

* `plain`: `jax.jit(step)`;
* `switch`: the same inside `jaxrewrite.enabled()` (what `python -m jaxrewrite` does), defaults;
* `switch reroll=True`: inside `jaxrewrite.enabled(reroll=True)`;
* `switch reroll=True recompute` (only when named): the same with the target's cost row set to
  recompute residuals in the backward loop (`reroll_recompute`, the CPU's choice).

For each (model, layers), one row per form:

* `first_call_s` (and `first_call_ratio` to plain): trace + rewrite + lower + compile + run of
  the first call, after `jax.clear_caches()` (one each: at 10-60 s a call on the chip, the
  budget allows no repeats; the rows of `--repeats`' run times are paired);
* `step_ms`, `step_ratio`: a later step, paired medians of `--repeats` rounds (plain, switch,
  switch reroll=True, a second plain as the A/A control, ...);
* `loss_rel`: the largest difference, over `--steps` steps from the same start, of the form's
  loss from plain's, relative to plain's;
* `scans`: the `scan`s of the program the form ran (reroll's, and a hand-written one's).

Sizes (`--size d,heads,seq,batch,vocab`): issue 46's, 512, 8, 256, 16, 8,192. Rows are written
to `DIR/tpu_layers.json` after each one (`$OUT` where set), so a call stopped at its limit keeps
what it measured; `--resume` skips the (model, layers) already there. A model whose library is
missing is skipped with the reason (on the TPU host, flax and optax install from its own index
into a folder put last on PYTHONPATH: ../shared/tpu/README.md).
"""
from __future__ import annotations

import argparse
import contextlib
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

MODELS = ("plain", "mlp", "nnx", "linen", "linen_remat", "haiku", "equinox")
FORMS = {"plain": None, "switch": {}, "switch reroll=True": {"reroll": True}}
# forms with the target's cost row changed too (`--forms` names them): whether a row's candidate
# value pays on what users write (issue 46: the TPU's rolled step recomputing its residuals,
# 1.46x faster than stacking them on bench/tpu_costs.py's transformer; Flax NNX not measured)
ROW_FORMS = {"switch reroll=True recompute": ({"reroll": True}, {"reroll_recompute": True})}
T0 = time.perf_counter()


@contextlib.contextmanager
def sized(d: int, heads: int, seq: int, batch: int, vocab: int):
    """bench/models.py's transformers at these sizes within the block (its builders read the
    module's sizes when they build and trace)."""
    import models
    saved = models.D, models.HEADS, models.SEQ, models.BATCH, models.VOCAB
    models.D, models.HEADS, models.SEQ, models.BATCH, models.VOCAB = d, heads, seq, batch, vocab
    try:
        yield
    finally:
        models.D, models.HEADS, models.SEQ, models.BATCH, models.VOCAB = saved


def mlp_step(n: int, width: int, batch: int):
    """(step, args): Adam by hand on an MLP of `n` (width x width) ReLU layers, a Python loop."""
    key = jax.random.key(0)
    params = [(jax.random.normal(jax.random.fold_in(key, i), (width, width)) / np.sqrt(width),
               jnp.zeros(width)) for i in range(n)]
    x = jax.random.normal(jax.random.key(1), (batch, width))
    y = jax.random.normal(jax.random.key(2), (batch, width))

    def loss(p, x, y):
        for w, b in p:
            x = jax.nn.relu(x @ w + b)
        return ((x - y) ** 2).mean()

    def step(p, m, v, x, y):
        l, g = jax.value_and_grad(loss)(p, x, y)
        m = jax.tree_util.tree_map(lambda m, g: 0.9 * m + 0.1 * g, m, g)
        v = jax.tree_util.tree_map(lambda v, g: 0.999 * v + 0.001 * g * g, v, g)
        p = jax.tree_util.tree_map(lambda p, m, v: p - 1e-3 * m / (jnp.sqrt(v) + 1e-8), p, m, v)
        return l, p, m, v

    zeros = jax.tree_util.tree_map(jnp.zeros_like, params)
    return step, (params, zeros, zeros, x, y)


def build(model: str, n: int, size: tuple):
    """(step, args, carry): `step(*args)` returns the loss first; `carry(args, out)` gives the
    next step's args."""
    d, heads, seq, batch, vocab = size
    if model == "plain":
        import tpu_costs
        step, args = tpu_costs.transformer_step(n, d, seq, batch, vocab=vocab, heads=heads)
        return step, args, lambda a, out: (*out[1:], a[3])
    if model == "mlp":
        step, args = mlp_step(n, 4 * d, batch * seq // 16)
        return step, args, lambda a, out: (*out[1:], a[3], a[4])
    import models
    step, args = models.build(model, n)
    return step, args, lambda a, out: (out[1], out[2], a[2])


def missing(model: str) -> list[str]:
    if model in ("plain", "mlp"):
        return []
    import models
    return models.missing(model)


def _scans(traced) -> int:
    from jaxrewrite._walk import iter_eqns
    return sum(e.primitive.name == "scan" for e in iter_eqns(traced.jaxpr))


@contextlib.contextmanager
def _within(form: str):
    """The form's switch (none for `plain`) and, for `ROW_FORMS`, its cost row."""
    from jaxrewrite.backend import cost
    options, row = ROW_FORMS.get(form, (FORMS.get(form), {}))
    with contextlib.ExitStack() as stack:
        if row:
            stack.enter_context(cost.override_row(jax.default_backend(), **row))
        if options is not None:
            stack.enter_context(jaxrewrite.enabled(**options))
        yield


def measure(model: str, n: int, size: tuple, forms: list[str], steps: int, repeats: int) -> list:
    """The rows of one (model, layers): each form's first call, step time and losses. The first
    call goes through jax.jit's stages (trace, lower, compile, run: what a call does), so each
    form's executable is at hand after `jax.clear_caches()` made the next form start cold."""
    step, args, carry = build(model, n, size)
    compiled, first, losses, scans = {}, {}, {}, {}
    for form in forms:
        jax.clear_caches()
        with _within(form):
            t = time.perf_counter()
            traced = jax.jit(step).trace(*args)
            c = traced.lower().compile()
            out = _common.block(c(*args))
            first[form] = time.perf_counter() - t
        scans[form], compiled[form] = _scans(traced), c
        seq, a = [float(out[0])], carry(args, out)
        for _ in range(steps - 1):
            out = c(*a)
            seq.append(float(out[0]))
            a = carry(a, out)
        losses[form] = np.array(seq)
    timed = {form: (lambda c: lambda: c(*args))(c) for form, c in compiled.items()}
    base = "plain" if "plain" in forms else forms[0]
    timed[f"{base} A/A"] = timed[base]
    runs = _common.paired(timed, repeats=repeats)
    rows = []
    for form in timed:
        name = form.replace(" A/A", "")
        rel = np.abs(losses[name] - losses[base]) / np.maximum(np.abs(losses[base]), 1e-30)
        rows.append(dict(model=model, layers=n, size=list(size), form=form,
                         first_call_s=round(first[name], 2),
                         first_call_ratio=round(first[name] / first[base], 3),
                         step_ms=round(runs[form] * 1e3, 3),
                         step_ratio=round(runs[form] / runs[base], 3),
                         loss_rel=float(rel.max()), scans=scans[name],
                         t=round(time.perf_counter() - T0, 1)))
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--layers", default="8,24")
    ap.add_argument("--forms", default=",".join(FORMS))
    ap.add_argument("--size", default="512,8,256,16,8192", help="d,heads,seq,batch,vocab")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--budget", type=float, default=float("inf"),
                    help="seconds after which no new (model, layers) starts")
    ap.add_argument("--out", default=os.environ.get("OUT") or _common.RESULTS)
    ap.add_argument("--resume", action="store_true")
    a = ap.parse_args()
    size = tuple(int(v) for v in a.size.split(","))
    forms = a.forms.split(",")
    unknown = [f for f in forms if f not in FORMS and f not in ROW_FORMS]
    if unknown:
        sys.exit(f"--forms {unknown}: of {list(FORMS) + list(ROW_FORMS)}")
    path = os.path.join(a.out, "tpu_layers.json")
    dev = jax.devices()[0]
    meta = {"backend": jax.default_backend(), "device": getattr(dev, "device_kind", str(dev)),
            "jax": jax.__version__, "date": time.strftime("%Y-%m-%d %H:%M"), "size": size}
    rows = []
    if a.resume and os.path.exists(path):
        with open(path) as f:
            rows = json.load(f)["rows"]
    done = {(r["model"], r["layers"]) for r in rows}
    print(json.dumps(meta), flush=True)
    with sized(*size):
        for model in a.models.split(","):
            if missing(model):
                rows.append(dict(model=model, skipped=f"missing {missing(model)}"))
                print(json.dumps(rows[-1]), flush=True)
                continue
            for n in (int(v) for v in a.layers.split(",")):
                if (model, n) in done:
                    continue
                if time.perf_counter() - T0 > a.budget:
                    print(json.dumps({"model": model, "layers": n, "skipped": "budget"}))
                    continue
                for r in measure(model, n, size, forms, a.steps, a.repeats):
                    rows.append(r)
                    print(json.dumps(r), flush=True)
                with open(path, "w") as f:
                    json.dump({"meta": meta, "rows": rows}, f, indent=1)
    firsts = [r["first_call_ratio"] for r in rows if r.get("form") == "switch"]
    if firsts:
        print(f"switch, defaults: first call {statistics.median(firsts):.2f}x plain (median of "
              f"{len(firsts)})")


if __name__ == "__main__":
    main()
