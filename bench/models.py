"""Training steps written with real libraries: `optimize(step, reroll=True)` vs `jax.jit(step)`.

A decoder-only transformer (d_model 128, 4 heads, seq 64, batch 4, vocabulary 256, GELU MLP 4x,
pre-norm, causal attention), its blocks built in a Python loop with each library's own layers;
the step is loss, gradient and an optax adam update. Models: Flax NNX, Flax Linen, Linen with
`nn.remat` blocks, Haiku, Equinox. Rows (one process, paired medians):

* `compile_jit_s`, `compile_opt_s`, `compile_ratio`: `.lower()` + `.compile()` seconds (the
  rewrite runs in the trace, so it is not in these);
* `run_ratio`: one step, optimize / jax.jit;
* `compile_aa`, `run_aa`: the same ratios for a second `jax.jit` of the step (the A/A control,
  measured in the same rounds): how far a ratio moves on this machine with nothing changed;
* `rewrite_s`: `jaxrewrite.rewrite_jaxpr` of the step's jaxpr (every pass, the first call);
* `reroll_share`: the reroll pass's own seconds in a second rewrite (the process warm, an
  autotuned choice cached) over `compile_jit_s`;
* `scans`, `lengths`: the scans reroll made and their trips;
* `max_rel_diff`: largest difference of the updated parameters after one step, relative to
  each leaf's largest magnitude.

    python bench/models.py [--quick] [--layers 16,32] [--models nnx,linen] [--repeats 5] [--autotune]

    python bench/models.py --unstack [--layers 16] [--repeats 3]

    python bench/models.py --floor [--layers 16,32] [--models nnx,linen,linen_remat] [--repeats 3]

    python bench/models.py --phases [--layers 32] [--models nnx,linen] [--repeats 3]

`--unstack` measures why a rolled Flax step compiled slowly on XLA:CPU (compile seconds only,
written to `results/models_unstack.json`): the adam update of one block's 12 parameter leaves x
N layers, each layer's gradient a separate array or a slice of one stacked array (what a rolled
backward pass gives its per-layer consumers), at constant offsets or at offsets passed in at
run time; the update rolled into a loop over layers, or vectorised over each leaf kind's stacked
layers (both with per-layer results out, as the step's outputs are); and Linen's gradient (no
update) under `jax.jit`, rolled (its rows read at runtime offsets on the CPU,
`backend.cost.TargetCosts.reroll_runtime_offsets`), and rolled with the stacked
gradients returned as they are (no per-layer unstacking).

`--floor` measures what a rolled step can reach (compile seconds only, written to
`results/models_floor.json`): the step, `jax.jit` and rolled; its gradient, `jax.jit` and rolled
with the stacked gradients returned; and the optax update alone, which stays per leaf.

`--phases` splits one compile of the step, `jax.jit` and rolled, into XLA:CPU's own phases
(written to `results/models_phases.json`): its HLO passes and its code generation (thunks and
LLVM), in seconds from XLA's timers (each compile in a child process with XLA's logging on), and
the fusions that reused a kernel already generated for an identical fusion (`reused_kernels`).

`--autotune` passes `autotune="time"`: the rolled program is kept only where it measured faster
to compile and no slower to run (`backend.cost.REROLL_TIMED`); the measuring (both programs compiled
once) happens in the first rewrite, which `rewrite_s` then includes, against a fresh cache.

Needs the `models` extra (`pip install -e ".[models]"`); without it `main` returns no rows and
says why (CI's quick bench runs in an environment without these libraries).
"""
from __future__ import annotations

import importlib.util
import os
import statistics
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

try:
    from _common import block, paired, paired_phases
except ImportError:  # imported as bench.models
    from bench._common import block, paired, paired_phases

import jaxrewrite

NAME = "models"
COLUMNS = ("model", "N", "compile_jit_s", "compile_opt_s", "compile_ratio", "run_ratio",
           "compile_aa", "run_aa",
           "rewrite_s", "reroll_share", "scans", "lengths", "max_rel_diff")

D, HEADS, SEQ, BATCH, VOCAB = 128, 4, 64, 4, 256
MODELS = ("nnx", "linen", "linen_remat", "haiku", "equinox")
_NEEDS = {"nnx": ("flax", "optax"), "linen": ("flax", "optax"), "linen_remat": ("flax", "optax"),
          "haiku": ("haiku", "optax"), "equinox": ("equinox", "optax")}


def missing(model: str) -> list[str]:
    """The libraries `model` needs that are not installed."""
    return [m for m in _NEEDS[model] if importlib.util.find_spec(m) is None]


def _tokens(seed=0):
    return jax.random.randint(jax.random.key(seed), (BATCH, SEQ), 0, VOCAB)


def _xent(logits, tok):
    import optax
    return optax.softmax_cross_entropy_with_integer_labels(logits[:, :-1], tok[:, 1:]).mean()


def _adam_step(loss_of, tx):
    """step(params, opt_state, tok) -> (loss, params, opt_state)."""
    import optax

    def step(params, opt_state, tok):
        loss, g = jax.value_and_grad(loss_of)(params, tok)
        updates, opt_state = tx.update(g, opt_state, params)
        return loss, optax.apply_updates(params, updates), opt_state
    return step


# --- the models: one builder per library, each returning (step, params) -----------------------------

def linen(n: int, remat: bool = False, seed: int = 0):
    import flax.linen as nn

    class Block(nn.Module):
        @nn.compact
        def __call__(self, x):
            mask = nn.make_causal_mask(jnp.ones(x.shape[:2]))
            h = nn.LayerNorm()(x)
            x = x + nn.MultiHeadDotProductAttention(num_heads=HEADS)(h, h, mask=mask)
            h = nn.Dense(D)(nn.gelu(nn.Dense(4 * D)(nn.LayerNorm()(x))))
            return x + h

    class Model(nn.Module):
        @nn.compact
        def __call__(self, tok):
            x = nn.Embed(VOCAB, D)(tok)
            blk = nn.remat(Block) if remat else Block
            for _ in range(n):
                x = blk()(x)
            return nn.Dense(VOCAB)(nn.LayerNorm()(x))

    model = Model()
    params = model.init(jax.random.key(seed), _tokens())
    return (lambda p, tok: _xent(model.apply(p, tok), tok)), params


def nnx_model(n: int, seed: int = 0):
    from flax import nnx

    class Block(nnx.Module):
        def __init__(self, rngs):
            self.ln1, self.ln2 = nnx.LayerNorm(D, rngs=rngs), nnx.LayerNorm(D, rngs=rngs)
            self.attn = nnx.MultiHeadAttention(HEADS, D, decode=False, rngs=rngs)
            self.up, self.down = nnx.Linear(D, 4 * D, rngs=rngs), nnx.Linear(4 * D, D, rngs=rngs)

        def __call__(self, x, mask):
            x = x + self.attn(self.ln1(x), mask=mask)
            return x + self.down(nnx.gelu(self.up(self.ln2(x))))

    class Model(nnx.Module):
        def __init__(self, rngs):
            self.embed = nnx.Embed(VOCAB, D, rngs=rngs)
            self.blocks = nnx.List([Block(rngs) for _ in range(n)])
            self.ln, self.head = nnx.LayerNorm(D, rngs=rngs), nnx.Linear(D, VOCAB, rngs=rngs)

        def __call__(self, tok):
            mask = nnx.make_causal_mask(tok)
            x = self.embed(tok)
            for b in self.blocks:
                x = b(x, mask)
            return self.head(self.ln(x))

    graphdef, params = nnx.split(Model(nnx.Rngs(seed)))

    def loss(p, tok):
        return _xent(nnx.merge(graphdef, p)(tok), tok)
    return loss, params


def haiku_model(n: int, seed: int = 0):
    import haiku as hk

    def fwd(tok):
        x = hk.Embed(VOCAB, D)(tok)
        mask = jnp.tril(jnp.ones((SEQ, SEQ), bool))[None, None]
        for _ in range(n):
            h = hk.LayerNorm(-1, True, True)(x)
            x = x + hk.MultiHeadAttention(HEADS, D // HEADS, w_init=hk.initializers.VarianceScaling(
                1.0))(h, h, h, mask=mask)
            h = hk.LayerNorm(-1, True, True)(x)
            x = x + hk.Linear(D)(jax.nn.gelu(hk.Linear(4 * D)(h)))
        return hk.Linear(VOCAB)(hk.LayerNorm(-1, True, True)(x))

    model = hk.without_apply_rng(hk.transform(fwd))
    params = model.init(jax.random.key(seed), _tokens())
    return (lambda p, tok: _xent(model.apply(p, tok), tok)), params


def equinox_model(n: int, seed: int = 0):
    import equinox as eqx

    class Block(eqx.Module):
        ln1: eqx.nn.LayerNorm
        ln2: eqx.nn.LayerNorm
        attn: eqx.nn.MultiheadAttention
        up: eqx.nn.Linear
        down: eqx.nn.Linear

        def __init__(self, key):
            k1, k2, k3 = jax.random.split(key, 3)
            self.ln1, self.ln2 = eqx.nn.LayerNorm(D), eqx.nn.LayerNorm(D)
            self.attn = eqx.nn.MultiheadAttention(HEADS, D, key=k1)
            self.up, self.down = eqx.nn.Linear(D, 4 * D, key=k2), eqx.nn.Linear(4 * D, D, key=k3)

        def __call__(self, x, mask):  # x: (SEQ, D)
            h = jax.vmap(self.ln1)(x)
            x = x + self.attn(h, h, h, mask=mask)
            h = jax.vmap(self.ln2)(x)
            return x + jax.vmap(lambda v: self.down(jax.nn.gelu(self.up(v))))(h)

    class Model(eqx.Module):
        embed: eqx.nn.Embedding
        blocks: list
        ln: eqx.nn.LayerNorm
        head: eqx.nn.Linear

        def __init__(self, key):
            ks = jax.random.split(key, n + 2)
            self.embed = eqx.nn.Embedding(VOCAB, D, key=ks[0])
            self.blocks = [Block(k) for k in ks[2:]]
            self.ln, self.head = eqx.nn.LayerNorm(D), eqx.nn.Linear(D, VOCAB, key=ks[1])

        def __call__(self, tok):  # tok: (SEQ,)
            mask = jnp.tril(jnp.ones((SEQ, SEQ), bool))
            x = jax.vmap(self.embed)(tok)
            for b in self.blocks:
                x = b(x, mask)
            return jax.vmap(lambda v: self.head(self.ln(v)))(x)

    params, static = eqx.partition(Model(jax.random.key(seed)), eqx.is_array)

    def loss(p, tok):
        return _xent(jax.vmap(eqx.combine(p, static))(tok), tok)
    return loss, params


# (loss(params, tokens), params) for `n` blocks, per model
LOSSES = {"nnx": nnx_model, "linen": linen, "haiku": haiku_model, "equinox": equinox_model,
          "linen_remat": lambda n, seed=0: linen(n, remat=True, seed=seed)}


def build(model: str, n: int, seed: int = 0):
    """(step, (params, opt_state, tokens)) for one of `MODELS` with `n` blocks."""
    import optax
    loss, params = LOSSES[model](n, seed=seed)
    tx = optax.adam(1e-3)
    return _adam_step(loss, tx), (params, tx.init(params), _tokens(seed + 1))


# --- measuring ----------------------------------------------------------------------------------------

def _max_rel(a, b) -> float:
    """Largest difference of any leaf, relative to that leaf's largest magnitude (an element-wise
    ratio is dominated by parameters that are near zero)."""
    worst = 0.0
    for u, v in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)):
        u, v = np.asarray(u, np.float64), np.asarray(v, np.float64)
        if u.size:
            worst = max(worst, float(np.max(np.abs(u - v)) / max(np.max(np.abs(v)), 1e-30)))
    return worst


def _scans(cj):
    from jaxrewrite._walk import iter_eqns
    from jaxrewrite.passes.reroll import is_offsets_loop
    return [e.params["length"] for e in iter_eqns(cj)
            if e.primitive.name == "scan" and not is_offsets_loop(e)]


def row(model: str, n: int, repeats: int = 5, **options) -> dict:
    step, args = build(model, n)
    opts = dict(reroll=True, **options)
    cj = jax.make_jaxpr(step)(*args)
    t = time.perf_counter()
    res = jaxrewrite.rewrite_jaxpr_with_report(cj, **opts)
    rewrite_s = time.perf_counter() - t
    # the pass's own time once the process is warm (the first rewrite in a process also pays
    # JAX's one-time tracing of scan/cond machinery); with autotune the choice is cached by now
    warm = jaxrewrite.rewrite_jaxpr_with_report(cj, **opts).report.timings.get("pass.reroll", 0.0)
    ph = paired_phases({"jit": lambda: jax.jit(step), "opt": lambda: jaxrewrite.optimize(step, **opts),
                        "jit2": lambda: jax.jit(step)}, args, repeats=repeats)
    comp = {k: v["lower"] + v["compile"] for k, v in ph.items()}
    fj, fo, fa = ph["jit"]["compiled"], ph["opt"]["compiled"], ph["jit2"]["compiled"]
    run = paired({"jit": lambda: fj(*args), "opt": lambda: fo(*args), "jit2": lambda: fa(*args)},
                 repeats=max(repeats, 5))
    diff = _max_rel(block(fo(*args))[1], block(fj(*args))[1])
    return dict(model=model, N=n, compile_jit_s=comp["jit"], compile_opt_s=comp["opt"],
                compile_ratio=comp["opt"] / comp["jit"], run_ratio=run["opt"] / run["jit"],
                compile_aa=comp["jit2"] / comp["jit"], run_aa=run["jit2"] / run["jit"],
                rewrite_s=rewrite_s,
                # the reroll pass against jax.jit's own lower + compile (issue 15: under 10%)
                reroll_share=warm / comp["jit"],
                scans=len(_scans(res.jaxpr)),
                lengths=",".join(map(str, res.report.stats.get("reroll.lengths", []))),
                max_rel_diff=diff)


def loss_curves(model: str, n: int, steps: int = 100, **options):
    """(jax.jit's losses, optimize's losses) over `steps` adam steps on one fixed batch."""
    step, (params, opt_state, tok) = build(model, n)
    out = []
    for fn in (jax.jit(step), jaxrewrite.optimize(step, reroll=True, **options)):
        p, o, losses = params, opt_state, []
        for _ in range(steps):
            loss, p, o = fn(p, o, tok)
            losses.append(float(loss))
        out.append(np.array(losses))
    return out[0], out[1]


def main(quick: bool = False, layers=None, models=None, repeats=None, **options) -> list[dict]:
    models = [m for m in (models or MODELS)]
    absent = {m: missing(m) for m in models}
    if all(absent.values()):
        print(f"models: skipped, the `models` extra is not installed "
              f"(missing: {sorted({x for v in absent.values() for x in v})})")
        return []
    layers = layers or ((4,) if quick else (16, 32))
    repeats = repeats or (1 if quick else 5)
    rows = []
    for m in models:
        if absent[m]:
            print(f"models: {m} skipped (missing {absent[m]})")
            continue
        for n in layers:
            r = row(m, n, repeats, **options)
            print(r, flush=True)
            rows.append(r)
    return rows


# --- why rolled Flax steps compile slower on XLA:CPU (--unstack) -------------------------------

UNSTACK_COLUMNS = ("case", "N", "compile_s")

# Linen block's parameter leaves (attention q/k/v kernels, out kernel, biases, MLP, norms)
_LEAVES = ([(D, HEADS, D // HEADS)] * 3 + [(HEADS, D // HEADS, D), (D,), (D,), (D, 4 * D), (4 * D,),
           (4 * D, D), (D,), (D,), (D,)])


def _adam_leaf(g, p, m, v):
    m = 0.9 * m + 0.1 * g
    v = 0.999 * v + 0.001 * g * g
    return p - 1e-3 * m / (jnp.sqrt(v) + 1e-8), m, v


def _compile_s(fn, args, repeats: int) -> float:
    """Median lower + compile seconds of `jax.jit(fn)` on `args`, fresh caches each time."""
    ts = []
    for _ in range(repeats):
        jax.clear_caches()
        t = time.perf_counter()
        jax.jit(fn).lower(*args).compile()
        ts.append(time.perf_counter() - t)
    return statistics.median(ts)


def _flat(fn, tree_args):
    """`fn`'s closed jaxpr over the leaves of `tree_args`, and those leaves."""
    leaves, tree = jax.tree_util.tree_flatten(tree_args)
    return jax.make_jaxpr(lambda *a: fn(*jax.tree_util.tree_unflatten(tree, a)))(*leaves), leaves


def _stacked_unread(rolled):
    """A rolled gradient's jaxpr whose outputs are its first output (the loss) and the rolled
    loops' own stacked results: no layer's row is read out of them."""
    from jaxrewrite import _compat as C
    from jaxrewrite import _walk
    from jaxrewrite.passes import reroll
    j = rolled.jaxpr
    loops = [v for e in j.eqns if e.primitive.name in ("scan", "custom_jvp_call")
             and not reroll.is_offsets_loop(e) for v in e.outvars]
    return _walk.dce_closed(C.closed(C.replace_jaxpr(j, outvars=list(j.outvars[:1]) + loops),
                                     rolled.consts))


def unstack_rows(n: int = 16, repeats: int = 3) -> list[dict]:
    from jax import lax

    from jaxrewrite import _compat as C
    stacked = [jnp.zeros((n,) + s, jnp.float32) for s in _LEAVES]
    per = [[jnp.zeros(s, jnp.float32) for _ in range(n)] for s in _LEAVES]

    def from_slices(gs, p, m, v):
        return [[_adam_leaf(lax.index_in_dim(g, i, 0, keepdims=False), p[k][i], m[k][i], v[k][i])
                 for i in range(n)] for k, g in enumerate(gs)]

    def from_arrays(gs, p, m, v):
        return [[_adam_leaf(gs[k][i], p[k][i], m[k][i], v[k][i]) for i in range(n)]
                for k in range(len(gs))]

    def at_offsets(gs, p, m, v, offsets):  # the offsets are runtime values: one kernel for all
        return [[_adam_leaf(lax.dynamic_index_in_dim(g, offsets[i], 0, keepdims=False),
                            p[k][i], m[k][i], v[k][i]) for i in range(n)] for k, g in enumerate(gs)]

    def rows_of(ys, offsets):  # per-layer results out of stacked ones, at runtime offsets
        return [[tuple(lax.dynamic_index_in_dim(y, offsets[i], 0, keepdims=False) for y in y3)
                 for i in range(n)] for y3 in ys]

    def rolled_update(gs, p, m, v, offsets):  # a loop over layers: its rows read from lists
        def body(c, i):
            pick = [lambda t, j=j: [[x[k][j] for k in range(len(gs))] for x in t] for j in range(n)]
            rp, rm, rv = lax.switch(i, pick, (p, m, v))
            rows = [lax.dynamic_index_in_dim(g, i, 0, keepdims=False) for g in gs]
            return c, [_adam_leaf(g, rp[k], rm[k], rv[k]) for k, g in enumerate(rows)]
        return rows_of(lax.scan(body, 0, jnp.arange(n))[1], offsets)

    def stacked_update(gs, p, m, v, offsets):  # vectorised: each leaf kind's layers stacked
        return rows_of([_adam_leaf(g, jnp.stack(p[k]), jnp.stack(m[k]), jnp.stack(v[k]))
                        for k, g in enumerate(gs)], offsets)

    offsets = [jnp.int32(i) for i in range(n)]
    rows = [dict(case="adam per leaf, per-layer gradients as separate arrays", N=n,
                 compile_s=_compile_s(from_arrays, (per, per, per, per), repeats)),
            dict(case="adam per leaf, per-layer gradients sliced from one stacked array", N=n,
                 compile_s=_compile_s(from_slices, (stacked, per, per, per), repeats)),
            dict(case="the same, slice offsets passed in as runtime values", N=n,
                 compile_s=_compile_s(at_offsets, (stacked, per, per, per, offsets), repeats)),
            dict(case="adam rolled into a loop over layers (rows read from lists), rows out", N=n,
                 compile_s=_compile_s(rolled_update, (stacked, per, per, per, offsets), repeats)),
            dict(case="adam on stacked leaves (each kind's layers stacked), rows out", N=n,
                 compile_s=_compile_s(stacked_update, (stacked, per, per, per, offsets), repeats))]
    if missing("linen"):
        print(f"models --unstack: Linen rows skipped (missing {missing('linen')})")
        return rows
    loss, params = linen(n)
    cj, args = _flat(jax.value_and_grad(loss), (params, _tokens(1)))
    rolled = jaxrewrite.rewrite_jaxpr(cj, reroll=True)
    kept = _stacked_unread(rolled)
    for case, c in (("Linen gradient, jax.jit", cj), ("Linen gradient, rolled", rolled),
                    ("Linen gradient, rolled, stacked gradients returned", kept)):
        rows.append(dict(case=case, N=n,
                         compile_s=_compile_s(lambda *a, c=c: C.eval_jaxpr(c, *a), args, repeats)))
    return rows


# --- what a rolled step can reach: what rolling leaves per leaf (--floor) -------------------------

FLOOR_COLUMNS = ("model", "N", "step_jit_s", "step_rolled_s", "rolled_ratio", "grad_jit_s",
                 "grad_rolled_s", "update_s", "floor_ratio")

def floor_rows(model: str, n: int, repeats: int = 3) -> list[dict]:
    """Compile seconds (lower + compile, paired) of the training step, `jax.jit` and rolled; of
    its gradient alone, `jax.jit` and rolled with the stacked per-layer gradients returned as they
    are (nothing read per layer); and of the optax update alone, its gradients passed in.

    A rolled step keeps the update per parameter leaf: its inputs and outputs are the user's
    per-layer leaves, and rolling or stacking the update inside the program compiles slower still
    (`--unstack`). So `floor_ratio`, (rolled gradient + update) / `jax.jit`'s step, is what a
    rolled step could reach if reading each layer's gradient row were free."""
    import optax

    from jaxrewrite import _compat as C
    loss, params = LOSSES[model](n)
    tx = optax.adam(1e-3)
    state, tok = tx.init(params), _tokens(1)

    def update(g, st, p):
        u, st = tx.update(g, st, p)
        return optax.apply_updates(p, u), st
    step_j, step_a = _flat(_adam_step(loss, tx), (params, state, tok))
    grad_j, grad_a = _flat(jax.value_and_grad(loss), (params, tok))
    upd_j, upd_a = _flat(update, (params, state, params))
    step_r = jaxrewrite.rewrite_jaxpr(step_j, reroll=True)
    grad_r = _stacked_unread(jaxrewrite.rewrite_jaxpr(grad_j, reroll=True))
    forms = {"step_jit_s": (step_j, step_a), "step_rolled_s": (step_r, step_a),
             "grad_jit_s": (grad_j, grad_a), "grad_rolled_s": (grad_r, grad_a),
             "update_s": (upd_j, upd_a)}
    samples = {k: [] for k in forms}
    for _ in range(repeats):
        for k, (cj, a) in forms.items():
            jax.clear_caches()
            t = time.perf_counter()
            jax.jit(lambda *x, cj=cj: C.eval_jaxpr(cj, *x)).lower(*a).compile()
            samples[k].append(time.perf_counter() - t)
    r = {k: statistics.median(v) for k, v in samples.items()}
    r.update(model=model, N=n, rolled_ratio=r["step_rolled_s"] / r["step_jit_s"],
             floor_ratio=(r["grad_rolled_s"] + r["update_s"]) / r["step_jit_s"])
    return [r]


# --- where XLA:CPU's compile time goes (--phases) ----------------------------------------------

PHASES_COLUMNS = ("model", "N", "form", "hlo_passes_s", "codegen_s", "reused_kernels")
# XLA's timers (VLOG 1 of these files) and its thunk emitter's line for a fusion whose kernel is
# one it already generated
_XLA_VMODULE = "cpu_compiler=1,thunk_emitter=1"
_CHILD = """
import sys; sys.path[:0] = {path!r}
import jax, jaxrewrite, models
step, args = models.build({model!r}, {n})
f = jax.jit(step) if {form!r} == "jit" else jaxrewrite.optimize(step, reroll=True)
f.trace(*args).lower().compile()
"""


def _timer_s(log: str, name: str) -> float:
    """The last reading of XLA timer `name` in `log` (`... <name> time: 1.23 s (1234567 us)`)."""
    import re
    hits = re.findall(re.escape(name) + r" time: [^(]*\((\d+) us\)", log)
    return int(hits[-1]) / 1e6 if hits else float("nan")


def phases_rows(model: str, n: int, repeats: int = 3) -> list[dict]:
    """Medians over `repeats` compiles (each in a fresh child process, jax.jit and rolled taken
    in turn) of XLA:CPU's HLO-pass and code-generation seconds for the step, and its reused
    kernels."""
    import subprocess
    here = os.path.dirname(os.path.abspath(__file__))
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="0", TF_CPP_VMODULE=_XLA_VMODULE)
    samples = {f: [] for f in ("jit", "rolled")}
    for _ in range(repeats):
        for form in samples:
            code = _CHILD.format(path=[here, os.path.dirname(here)], model=model, n=n, form=form)
            log = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                                 text=True, check=True).stderr
            hlo = "Running HLO passes on [jit_step] for CPU"   # logged as the passes end
            samples[form].append((_timer_s(log, hlo),
                                  _timer_s(log, "Compiling [jit_step] for CPU using JIT"),
                                  log[log.rfind(hlo):].count("Reusing kernel")))
    return [dict(model=model, N=n, form=form,
                 hlo_passes_s=statistics.median(s[0] for s in v),
                 codegen_s=statistics.median(s[1] for s in v),
                 reused_kernels=statistics.median(s[2] for s in v))
            for form, v in samples.items()]


if __name__ == "__main__":
    from _common import markdown_table, write_results

    def _arg(name, conv, default=None):
        argv = sys.argv[1:]
        return conv(argv[argv.index(name) + 1]) if name in argv else default

    quick = "--quick" in sys.argv[1:]
    if "--unstack" in sys.argv[1:]:
        n = (_arg("--layers", lambda s: tuple(int(x) for x in s.split(","))) or (16,))[0]
        rows = unstack_rows(n, _arg("--repeats", int, 3))
        print(markdown_table(rows, UNSTACK_COLUMNS))
        print(f"\nwritten {write_results(NAME + '_unstack', rows, dict(layers=n))}")
        sys.exit(0)
    for mode, rows_of, layers0, models0, columns in (
            ("floor", floor_rows, (16, 32), ["nnx", "linen", "linen_remat"], FLOOR_COLUMNS),
            ("phases", phases_rows, (32,), ["nnx", "linen"], PHASES_COLUMNS)):
        if f"--{mode}" not in sys.argv[1:]:
            continue
        layers = _arg("--layers", lambda s: tuple(int(x) for x in s.split(","))) or layers0
        models = _arg("--models", lambda s: s.split(",")) or models0
        rows = []
        for m in models:
            if missing(m):
                print(f"models --{mode}: {m} skipped (missing {missing(m)})")
                continue
            for n in layers:
                new = rows_of(m, n, _arg("--repeats", int, 3))
                rows += new
                print(new, flush=True)
        print(markdown_table(rows, columns))
        print(f"\nwritten {write_results(NAME + '_' + mode, rows, dict(layers=layers))}")
        sys.exit(0)
    options = {"autotune": "time"} if "--autotune" in sys.argv[1:] else {}
    layers = _arg("--layers", lambda s: tuple(int(x) for x in s.split(",")))
    models = _arg("--models", lambda s: s.split(","))
    repeats = _arg("--repeats", int)
    if options:  # a fresh cache: the measuring shows in rewrite_s
        import tempfile
        os.environ["JAXREWRITE_CACHE_DIR"] = tempfile.mkdtemp(prefix="jaxrewrite-models-")
    rows = main(quick, layers, models, repeats, **options)
    print(markdown_table(rows, COLUMNS))
    print(f"\nwritten {write_results(NAME, rows, dict(quick=quick, layers=layers, repeats=repeats, **options))}")
