"""The switch on real programs: the first call plain and under `jaxrewrite.enabled()`.

    python bench/switch.py [--quick]      # needs the clients and models extras (flax, equinox,
                                          # dm-haiku, optax, diffrax)

Each program is written as its library's users write it, with the library's own jit (`nnx.jit`,
`eqx.filter_jit`) or `jax.jit` around a Linen/Haiku/Optax/Diffrax step, and knows nothing of
jaxrewrite. Per sample a fresh step is built (JAX caches traces per function) and its first
call is timed: trace + lower + compile + run, as a user's first step. Rounds are paired (plain,
switch, plain again), so `aa_ratio` (plain again / plain) shows what noise alone does to
`first_ratio` (switch / plain). From JAX's own events (`jax.monitoring`) for the same calls:
`trace_ms` is JAX's trace of the step (with the switch: the user's function traced, rewritten and
restaged), `lower_compile_ms` its lowering and compiling. `overhead_pct` is what the switch adds
to the trace (switch trace - plain trace) as a share of the plain first call, and `rewrite_ms`
the rewrite alone (jaxrewrite's report); where `rewrites` is `none`, that is all the switch costs.
`run_ratio` is a compiled step's call, switch / plain (paired medians).

`--quick` takes 3 rounds instead of 7. Without the libraries it returns no rows.
"""
from __future__ import annotations

import collections
import importlib.util
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

NAME = "switch"
COLUMNS = ("library", "program", "rewrites", "first_ms", "first_ratio", "aa_ratio", "trace_ms",
           "trace_ms_switch", "rewrite_ms", "lower_compile_ms", "overhead_pct", "run_ratio")
NEEDS = ("flax", "equinox", "haiku", "optax", "diffrax")


# --- the programs: each `make()` returns a fresh zero-argument first call ------------------------

def _data(n=64, d=16):
    x = jax.random.normal(jax.random.key(0), (n, d))
    return x, jnp.sin(x.sum(axis=1, keepdims=True))


def nnx_step():
    import optax
    from flax import nnx

    class MLP(nnx.Module):
        def __init__(self, rngs):
            self.l1 = nnx.Linear(16, 64, rngs=rngs)
            self.l2 = nnx.Linear(64, 64, rngs=rngs)
            self.l3 = nnx.Linear(64, 1, rngs=rngs)

        def __call__(self, x):
            return self.l3(nnx.relu(self.l2(nnx.relu(self.l1(x)))))

    model = MLP(nnx.Rngs(0))
    opt = nnx.Optimizer(model, optax.adam(1e-3), wrt=nnx.Param)
    x, y = _data()

    def make():
        @nnx.jit
        def step(model, opt, x, y):
            loss, grads = nnx.value_and_grad(lambda m: jnp.mean((m(x) - y) ** 2))(model)
            opt.update(model, grads)
            return loss
        return lambda: step(model, opt, x, y)

    return "flax", "NNX MLP, adam step (nnx.jit)", make


def linen_step():
    import flax.linen as nn
    import optax

    class MLP(nn.Module):
        @nn.compact
        def __call__(self, x):
            for width in (64, 64):
                x = nn.relu(nn.Dense(width)(x))
            return nn.Dense(1)(x)

    model, tx = MLP(), optax.adam(1e-3)
    x, y = _data()
    params = model.init(jax.random.key(0), x)
    state = tx.init(params)

    def make():
        def step(params, state, x, y):
            loss, grads = jax.value_and_grad(
                lambda p: jnp.mean((model.apply(p, x) - y) ** 2))(params)
            updates, state = tx.update(grads, state, params)
            return optax.apply_updates(params, updates), state, loss
        step = jax.jit(step)
        return lambda: step(params, state, x, y)

    return "flax", "Linen MLP, adam step (jax.jit)", make


def equinox_step():
    import equinox as eqx
    import optax

    model = eqx.nn.MLP(16, 1, 64, 2, key=jax.random.key(0))
    tx = optax.adam(1e-3)
    state = tx.init(eqx.filter(model, eqx.is_array))
    x, y = _data()

    def make():
        @eqx.filter_jit
        def step(model, state, x, y):
            loss, grads = eqx.filter_value_and_grad(
                lambda m: jnp.mean((jax.vmap(m)(x) - y) ** 2))(model)
            updates, state = tx.update(grads, state, eqx.filter(model, eqx.is_array))
            return eqx.apply_updates(model, updates), state, loss
        return lambda: step(model, state, x, y)

    return "equinox", "MLP, adam step (eqx.filter_jit)", make


def haiku_step():
    import haiku as hk
    import optax

    net = hk.without_apply_rng(hk.transform(lambda x: hk.nets.MLP([64, 64, 1])(x)))
    tx = optax.adam(1e-3)
    x, y = _data()
    params = net.init(jax.random.key(0), x)
    state = tx.init(params)

    def make():
        def step(params, state, x, y):
            loss, grads = jax.value_and_grad(
                lambda p: jnp.mean((net.apply(p, x) - y) ** 2))(params)
            updates, state = tx.update(grads, state, params)
            return optax.apply_updates(params, updates), state, loss
        step = jax.jit(step)
        return lambda: step(params, state, x, y)

    return "haiku", "MLP, adam step (hk.transform)", make


def optax_step():
    import optax

    sizes = [(16, 64), (64, 64), (64, 1)]
    rng = np.random.default_rng(0)
    params = [dict(w=jnp.asarray(rng.standard_normal(s) / 8, jnp.float32),
                   b=jnp.zeros(s[1], jnp.float32)) for s in sizes]
    opt = optax.chain(optax.clip_by_global_norm(1.0),
                      optax.adamw(optax.cosine_decay_schedule(1e-2, 100), weight_decay=1e-4))
    state = opt.init(params)
    x, y = _data()

    def loss(params):
        h = x
        for i, layer in enumerate(params):
            h = h @ layer["w"] + layer["b"]
            h = jnp.tanh(h) if i < len(params) - 1 else h
        return jnp.mean((h - y) ** 2)

    def make():
        def step(params, state):
            value, grads = jax.value_and_grad(loss)(params)
            updates, state = opt.update(grads, state, params)
            return optax.apply_updates(params, updates), state, value
        step = jax.jit(step)
        return lambda: step(params, state)

    return "optax", "AdamW step, clipped, cosine schedule", make


def diffrax_solve():
    import diffrax

    def vector_field(t, y, args):
        pos, vel = y
        return vel, -args[0] * pos - args[1] * vel + jnp.sin(t)

    args = (jnp.array([1.5, 2.0, 0.5]), jnp.array([0.3, 0.1, 0.2]))
    y0 = (jnp.array([1.0, 0.0, -1.0]), jnp.array([0.0, 1.0, 0.5]))

    def make():
        def solve(args, y0):
            return diffrax.diffeqsolve(
                diffrax.ODETerm(vector_field), diffrax.Tsit5(), t0=0.0, t1=4.0, dt0=0.1, y0=y0,
                args=args, saveat=diffrax.SaveAt(ts=jnp.linspace(0.0, 4.0, 8)),
                stepsize_controller=diffrax.PIDController(rtol=1e-4, atol=1e-6),
                max_steps=256).ys
        solve = jax.jit(solve)
        return lambda: solve(args, y0)

    return "diffrax", "Tsit5 + PID controller solve", make


PROGRAMS = (nnx_step, linen_step, equinox_step, haiku_step, optax_step, diffrax_solve)


# --- measuring ------------------------------------------------------------------------------------

_EVENTS = {"/jax/core/compile/jaxpr_trace_duration": "trace",
           "/jax/core/compile/jaxpr_to_mlir_module_duration": "lower_compile",
           "/jax/core/compile/backend_compile_duration": "lower_compile"}
_phases: collections.Counter | None = None


def _listen(event, seconds, **_kw):
    if _phases is not None and event in _EVENTS:
        _phases[_EVENTS[event]] += seconds


def _first_call(make, switch: bool) -> tuple[float, dict, object]:
    """Seconds of a fresh step's first call, JAX's phases of it, and the step."""
    global _phases
    call = make()
    _phases = collections.Counter()
    t0 = time.perf_counter()
    if switch:
        with jaxrewrite.enabled():
            _common.block(call())
    else:
        _common.block(call())
    seconds = time.perf_counter() - t0
    phases, _phases = dict(_phases), None
    return seconds, phases, call


def _applied(report) -> str:
    if report is None:
        return "?"
    c = {k[:-len(".applied")]: n for k, n in sorted(report.counts.items())
         if k.endswith(".applied") and n}
    return ", ".join(f"{k} {n}" for k, n in c.items()) or "none"


def measure(program, rounds: int) -> dict:
    library, name, make = program()
    for switch in (False, True):  # warm: imports, the libraries' own inner jits, pass modules
        _first_call(make, switch)
    samples = {k: [] for k in ("plain", "switch", "again")}
    phases = {k: [] for k in samples}
    rewrite_ms = []
    for _ in range(rounds):
        for arm in ("plain", "switch", "again"):
            before = jaxrewrite.last_report()
            s, ph, call = _first_call(make, arm == "switch")
            samples[arm].append(s)
            phases[arm].append(ph)
            if arm == "switch":
                report = jaxrewrite.last_report()
                assert report is not before, f"{name}: the switch did not rewrite the step"
                rewrite_ms.append(report.timings.get("rewrite", 0.0) * 1e3)
                switched = call
            else:
                plain = call
    med = {k: statistics.median(v) for k, v in samples.items()}

    def phase(arm, key):
        return statistics.median(p.get(key, 0.0) for p in phases[arm]) * 1e3

    with jaxrewrite.enabled():
        _common.block(switched())
    run = _common.paired({"plain": plain, "switch": lambda: _switch_call(switched)},
                         repeats=rounds + 4)
    trace_plain, trace_switch = phase("plain", "trace"), phase("switch", "trace")
    return dict(
        library=library, program=name, rewrites=_applied(report),
        first_ms=med["plain"] * 1e3, first_ratio=med["switch"] / med["plain"],
        aa_ratio=med["again"] / med["plain"], trace_ms=trace_plain, trace_ms_switch=trace_switch,
        rewrite_ms=statistics.median(rewrite_ms),
        lower_compile_ms=phase("plain", "lower_compile"),
        overhead_pct=100 * (trace_switch - trace_plain) / (med["plain"] * 1e3),
        run_ratio=run["switch"] / run["plain"])


def _switch_call(call):
    with jaxrewrite.enabled():
        return call()


def main(quick: bool = False) -> list[dict]:
    absent = [m for m in NEEDS if importlib.util.find_spec(m) is None]
    if absent:
        print(f"switch: {', '.join(absent)} not installed (pip install -e '.[clients,models]'); "
              f"no rows")
        return []
    jax.monitoring.register_event_duration_secs_listener(_listen)
    rows = []
    for program in PROGRAMS:
        rows.append(measure(program, 3 if quick else 7))
        r = rows[-1]
        print(f"  {r['library']:8s} {r['program']:40s} first {r['first_ratio']:.3f} "
              f"(A/A {r['aa_ratio']:.3f}) overhead {r['overhead_pct']:.1f}% "
              f"rewrites: {r['rewrites']}", flush=True)
    return rows


if __name__ == "__main__":
    _common.cli(NAME, main, COLUMNS)
