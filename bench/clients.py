"""Real libraries through optimize: one small program per library, as its users write it.

    python bench/clients.py [--quick]          # needs the clients extra: pip install -e ".[clients]"

Each program is a library's own API (an Equinox CNN, a Flax NNX transformer block, an Optax
training step, a Diffrax ODE solve, a JAX MD Lennard-Jones system with a neighbour list, Pgx
games played by a policy) written as a pure function of arrays, run twice: forward, and
`jax.value_and_grad` of a scalar loss (the backward program is rewritten too). Per program and
direction: the rewrites applied (`strict=True`, so a pass that fails raises instead of falling
back), equations of the traced program, XLA compile time and the whole first call's time (trace,
rewrite, lower, compile) as ratios optimize / jax.jit (paired medians, caches cleared before
each), the run-time ratio (paired medians), and the largest difference from jax.jit's result, in
absolute terms and in the contract's unit (eps x the output's largest magnitude; 32 allowed).

`--quick` (CI) measures the forward programs only, with 3 compiles each way instead of 5.
Without the libraries it prints why and returns no rows, so `bench/run.py` in the plain
environment passes. `tests/clients/` checks the same programs under the contract.
"""
from __future__ import annotations

import collections
import dataclasses
import os
import sys
import warnings
from typing import Callable

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _common  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import jaxrewrite  # noqa: E402
from jaxrewrite import _walk, testing  # noqa: E402

NAME = "clients"
COLUMNS = ("library", "program", "direction", "rewrites", "eqns_jit", "eqns_opt",
           "compile_ms_jit", "compile_ms_opt", "compile_ratio", "total_ratio", "run_us_jit",
           "run_us_opt",
           "run_ratio", "max_abs_diff", "diff_eps")

# import name -> distribution (the clients extra in setup.cfg pins their versions)
LIBRARIES = {"equinox": "equinox", "flax": "flax", "optax": "optax", "diffrax": "diffrax",
             "jax_md": "jax-md", "pgx": "pgx"}


def missing() -> list[str]:
    """The clients libraries that are not importable here."""
    return _common.missing(LIBRARIES)


@dataclasses.dataclass
class Program:
    library: str
    name: str
    forward: Callable       # pure function of `args` (pytrees of arrays)
    loss: Callable          # scalar loss of `args`; differentiated with respect to args[0]
    args: tuple


def _rng(seed):
    return np.random.default_rng(seed)


def _f32(a):
    return jnp.asarray(a, jnp.float32)


# --- the programs -------------------------------------------------------------------------------

def equinox_cnn() -> Program:
    """A small Equinox CNN (conv, pool, MLP head) and its MSE loss, split into arrays and the
    static rest with `eqx.partition` as Equinox users do for `jax.jit`."""
    import equinox as eqx

    class CNN(eqx.Module):
        conv1: eqx.nn.Conv2d
        conv2: eqx.nn.Conv2d
        pool: eqx.nn.MaxPool2d
        head: eqx.nn.MLP
        norm: eqx.nn.LayerNorm

        def __init__(self, key):
            k1, k2, k3 = jax.random.split(key, 3)
            self.conv1 = eqx.nn.Conv2d(1, 4, kernel_size=3, padding=1, key=k1)
            self.conv2 = eqx.nn.Conv2d(4, 8, kernel_size=3, padding=1, key=k2)
            self.pool = eqx.nn.MaxPool2d(kernel_size=2, stride=2)
            self.norm = eqx.nn.LayerNorm(8 * 2 * 2)
            self.head = eqx.nn.MLP(8 * 2 * 2, 3, width_size=16, depth=2, activation=jax.nn.gelu,
                                   key=k3)

        def __call__(self, x):                        # x: (1, 8, 8)
            x = self.pool(jax.nn.relu(self.conv1(x)))
            x = jax.nn.relu(self.conv2(x))
            x = self.norm(jnp.ravel(x[:, ::2, ::2]))
            return self.head(x)

    model = CNN(jax.random.key(0))
    params, static = eqx.partition(model, eqx.is_inexact_array)

    def forward(params, x):
        return jax.vmap(eqx.combine(params, static))(x)

    def loss(params, x, y):
        return jnp.mean((forward(params, x) - y) ** 2)

    x = _f32(_rng(1).standard_normal((4, 1, 8, 8)))
    y = _f32(_rng(2).standard_normal((4, 3)))
    return Program("equinox", "CNN + MLP, vmapped", lambda p, x, y: forward(p, x), loss,
                   (params, x, y))


def flax_transformer() -> Program:
    """A Flax NNX pre-norm transformer block over token embeddings, split into graph and state
    with `nnx.split` / `nnx.merge` (the functional API users take to `jax.jit`)."""
    from flax import nnx

    class Block(nnx.Module):
        def __init__(self, vocab, dim, heads, rngs):
            self.embed = nnx.Embed(vocab, dim, rngs=rngs)
            self.norm1 = nnx.LayerNorm(dim, rngs=rngs)
            self.attn = nnx.MultiHeadAttention(num_heads=heads, in_features=dim, decode=False,
                                               rngs=rngs)
            self.norm2 = nnx.LayerNorm(dim, rngs=rngs)
            self.up = nnx.Linear(dim, 4 * dim, rngs=rngs)
            self.down = nnx.Linear(4 * dim, dim, rngs=rngs)
            self.out = nnx.Linear(dim, vocab, rngs=rngs)

        def __call__(self, tokens):
            x = self.embed(tokens)
            x = x + self.attn(self.norm1(x), mask=nnx.make_causal_mask(tokens))
            x = x + self.down(nnx.gelu(self.up(self.norm2(x))))
            return self.out(x)

    vocab = 32
    graphdef, state = nnx.split(Block(vocab, 16, 2, nnx.Rngs(0)))

    def forward(state, tokens):
        return nnx.merge(graphdef, state)(tokens)

    def loss(state, tokens, targets):
        logits = forward(state, tokens)
        return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), targets[..., None],
                                             axis=-1))

    tokens = jnp.asarray(_rng(3).integers(0, vocab, (2, 8)), jnp.int32)
    targets = jnp.roll(tokens, -1, axis=-1)
    return Program("flax", "NNX transformer block", lambda s, t, y: forward(s, t), loss,
                   (state, tokens, targets))


def optax_step() -> Program:
    """An Optax training step (global-norm clipping, AdamW with a cosine schedule) on a small
    MLP: forward is the update; the gradient is of the loss after one step (as in
    meta-learning), so it differentiates through the optimizer."""
    import optax

    sizes = [(8, 16), (16, 16), (16, 1)]
    rng = _rng(4)
    params = [dict(w=_f32(rng.standard_normal(s) / np.sqrt(s[0])), b=jnp.zeros(s[1], jnp.float32))
              for s in sizes]
    opt = optax.chain(optax.clip_by_global_norm(1.0),
                      optax.adamw(optax.cosine_decay_schedule(1e-2, 100), weight_decay=1e-4))
    opt_state = opt.init(params)

    def mlp_loss(params, x, y):
        h = x
        for i, layer in enumerate(params):
            h = h @ layer["w"] + layer["b"]
            if i < len(params) - 1:
                h = jnp.tanh(h)
        return jnp.mean((h[:, 0] - y) ** 2)

    def step(params, opt_state, x, y):
        loss, grads = jax.value_and_grad(mlp_loss)(params, x, y)
        updates, opt_state = opt.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    def loss_after_step(params, opt_state, x, y):
        new, _, _ = step(params, opt_state, x, y)
        return mlp_loss(new, x, y)

    x = _f32(rng.standard_normal((16, 8)))
    y = _f32(rng.standard_normal(16))
    return Program("optax", "AdamW step, clipped", step, loss_after_step, (params, opt_state, x, y))


def diffrax_ode() -> Program:
    """A Diffrax solve of a damped, driven oscillator with Tsit5 and an adaptive PID step size
    controller, saved at 8 times; the gradient of the final state with respect to the
    parameters goes through Diffrax's default checkpointed adjoint."""
    import diffrax

    def vector_field(t, y, args):
        k, c = args
        pos, vel = y
        return vel, -k * pos - c * vel + jnp.sin(t)

    def solve(args, y0):
        sol = diffrax.diffeqsolve(
            diffrax.ODETerm(vector_field), diffrax.Tsit5(), t0=0.0, t1=4.0, dt0=0.1, y0=y0,
            args=args, saveat=diffrax.SaveAt(ts=jnp.linspace(0.0, 4.0, 8)),
            stepsize_controller=diffrax.PIDController(rtol=1e-4, atol=1e-6), max_steps=256)
        return sol.ys

    def loss(args, y0):
        pos, vel = solve(args, y0)
        return jnp.sum(pos[-1] ** 2 + vel[-1] ** 2)

    args = (_f32([1.5, 2.0, 0.5]), _f32([0.3, 0.1, 0.2]))
    y0 = (_f32([1.0, 0.0, -1.0]), _f32([0.0, 1.0, 0.5]))
    return Program("diffrax", "Tsit5 + PID controller", solve, loss, (args, y0))


def jax_md_lj() -> Program:
    """JAX MD: a periodic Lennard-Jones system of 32 particles with a cell-free neighbour list;
    forward updates the list and returns energy and forces; the gradient is of the energy with
    respect to the positions (minus the forces) through the neighbour-list gather."""
    from jax_md import energy, partition, quantity, space

    n, box = 32, 6.0
    displacement, _ = space.periodic(box)
    neighbor_fn, energy_fn = energy.lennard_jones_neighbor_list(
        displacement, box, sigma=1.0, epsilon=1.0, r_onset=2.0, r_cutoff=2.5,
        fractional_coordinates=False, format=partition.Dense)
    grid = np.stack(np.meshgrid(*[np.arange(4)] * 3, indexing="ij"), -1).reshape(-1, 3)[:n]
    pos = _f32(grid * (box / 4) + _rng(5).uniform(-0.1, 0.1, (n, 3)))
    nbrs = neighbor_fn.allocate(pos)              # outside jit, as JAX MD requires

    def forward(pos, nbrs):
        nbrs = nbrs.update(pos)
        return energy_fn(pos, nbrs), quantity.force(energy_fn)(pos, nbrs), nbrs.idx, \
            nbrs.did_buffer_overflow

    def loss(pos, nbrs):
        return energy_fn(pos, nbrs.update(pos))

    return Program("jax-md", "Lennard-Jones, neighbour list", forward, loss, (pos, nbrs))


def pgx_policy() -> Program:
    """Pgx: eight tic-tac-toe games played to the end by a linear softmax policy over the board
    observation (`jax.vmap(env.init)`, `jax.vmap(env.step)` and the legal-action masks in a
    `lax.scan` rollout); the gradient is REINFORCE's: log-probabilities of the moves taken
    times the first player's return."""
    import pgx

    env = pgx.make("tic_tac_toe")
    games = 8

    def play(w, key):
        init_key, act_key = jax.random.split(key)

        def move(carry, i):
            state, logp, ret = carry
            obs = state.observation.reshape(games, -1).astype(jnp.float32)
            logits = jnp.where(state.legal_action_mask, obs @ w, -1e9)
            action = jax.random.categorical(jax.random.fold_in(act_key, i), logits, axis=-1)
            taken = jnp.take_along_axis(jax.nn.log_softmax(logits), action[:, None], 1)[:, 0]
            logp = logp + jnp.where(state.terminated, 0.0, taken)
            state = jax.vmap(env.step)(state, action)
            return (state, logp, ret + state.rewards[:, 0]), None

        state = jax.vmap(env.init)(jax.random.split(init_key, games))
        zeros = jnp.zeros(games, jnp.float32)
        (state, logp, ret), _ = jax.lax.scan(move, (state, zeros, zeros), jnp.arange(9))
        return state, logp, ret

    def forward(w, key):
        state, logp, ret = play(w, key)
        return ret, logp, state.terminated, state.current_player, state.observation

    def loss(w, key):
        _, logp, ret = play(w, key)
        return -jnp.mean(logp * ret)

    w = _f32(_rng(6).standard_normal((18, 9)) * 0.1)
    return Program("pgx", "tic-tac-toe rollout, REINFORCE", forward, loss, (w, jax.random.key(7)))


PROGRAMS = (equinox_cnn, flax_transformer, optax_step, diffrax_ode, jax_md_lj, pgx_policy)


def grad_program(p: Program) -> Callable:
    """The function the gradient direction compiles: value and gradient of `p.loss`."""
    return jax.value_and_grad(p.loss)


# --- the contract -------------------------------------------------------------------------------

def assert_contract(actual, expected, what: str = "output") -> None:
    """A forward result against jax.jit's under the README's contract
    (`jaxrewrite.testing.assert_contract_equal`): integers, booleans and PRNG keys bit for bit;
    floats within `testing.CONTRACT_ULPS` eps of each output's largest magnitude."""
    testing.assert_contract_equal(actual, expected, what=what)


def assert_grad_contract(actual, expected, what: str = "gradient",
                         ulps: float = testing.CONTRACT_ULPS) -> None:
    """Gradients (a pytree) by value within `ulps` eps x the largest magnitude of the whole
    gradient, not of each leaf: a parameter whose gradient is zero in exact arithmetic (the key
    bias of attention: softmax ignores a shift) comes out as rounding residue of the other
    terms, about 1e-8 in float32, and any regrouping moves it by as much: JAX's eager (op-by-op)
    result differs from jax.jit's there by 0.8x the leaf's magnitude (the Flax program below)."""
    la, ta = jax.tree_util.tree_flatten(actual)
    le, te = jax.tree_util.tree_flatten(expected)
    assert ta == te, f"{what}: pytree structure differs: {ta} vs {te}"
    scale: dict = {}
    for e in le:
        if jnp.issubdtype(e.dtype, jnp.inexact):
            fin = np.abs(np.asarray(e, np.float64))
            fin = fin[np.isfinite(fin)]
            scale[e.dtype] = max([scale.get(e.dtype, 0.0), float(jnp.finfo(e.dtype).tiny)]
                                 + ([float(fin.max())] if fin.size else []))
    for i, (a, e) in enumerate(zip(la, le)):
        if not jnp.issubdtype(e.dtype, jnp.inexact):
            testing.assert_value_equal([a], [e], what=f"{what}[{i}]")
            continue
        assert a.shape == e.shape and a.dtype == e.dtype, \
            f"{what}[{i}]: {a.dtype}{a.shape} vs {e.dtype}{e.shape}"
        a64, e64 = np.asarray(a, np.float64), np.asarray(e, np.float64)
        np.testing.assert_array_equal(np.isnan(a64), np.isnan(e64), err_msg=f"{what}[{i}]: NaNs")
        fin = np.isfinite(e64)
        np.testing.assert_array_equal(a64[~fin & ~np.isnan(e64)], e64[~fin & ~np.isnan(e64)],
                                      err_msg=f"{what}[{i}]: infinities")
        if fin.any():
            err = float(np.max(np.abs(a64[fin] - e64[fin])))
            bound = ulps * float(jnp.finfo(e.dtype).eps) * scale[e.dtype]
            assert err <= bound, (f"{what}[{i}]: differs from jax.jit by {err:.3g}; the contract "
                                  f"allows {bound:.3g} ({ulps} eps x {scale[e.dtype]:.3g})")


def assert_result(direction: str, actual, expected, what: str) -> None:
    """Forward results by `assert_contract`; (value, gradient) pairs by `assert_contract` for the
    value and `assert_grad_contract` for the gradient."""
    if direction == "forward":
        assert_contract(actual, expected, what)
    else:
        assert_contract(actual[0], expected[0], f"{what} value")
        assert_grad_contract(actual[1], expected[1], f"{what} gradient")


def _float_scale(leaves) -> float:
    mags = [float(np.max(np.abs(x[np.isfinite(x)]))) for x in leaves if np.isfinite(x).any()]
    return max(mags, default=0.0)


def max_diff(direction: str, actual, expected) -> tuple[float, float]:
    """Over the float leaves: the largest |actual - expected|, and the largest difference in the
    contract's unit as `assert_result` checks it (eps of the dtype x the largest finite magnitude
    of the leaf, or of the whole gradient; `testing.CONTRACT_ULPS` allowed)."""
    groups = [(actual, expected, False)] if direction == "forward" else \
        [(actual[0], expected[0], False), (actual[1], expected[1], True)]
    worst = units = 0.0
    for acts, exps, whole in groups:
        pairs = [(np.asarray(a, np.float64), np.asarray(e, np.float64), jnp.finfo(e.dtype))
                 for a, e in zip(jax.tree_util.tree_leaves(acts), jax.tree_util.tree_leaves(exps))
                 if jnp.issubdtype(e.dtype, jnp.inexact)]
        tree = _float_scale([e for _, e, _ in pairs])
        for a, e, finfo in pairs:
            fin = np.isfinite(e)
            if fin.any():
                d = float(np.max(np.abs(a[fin] - e[fin])))
                scale = max(tree if whole else _float_scale([e]), float(finfo.tiny))
                worst, units = max(worst, d), max(units, d / (float(finfo.eps) * scale))
    return worst, units


def rewrites_applied(report) -> collections.Counter:
    """Applied rewrites per pass, from a Report's counts ('<pass>.applied')."""
    return collections.Counter({k.rsplit(".", 1)[0]: v for k, v in report.counts.items()
                                if k.endswith(".applied") and v})


def _fmt_rewrites(c: collections.Counter) -> str:
    return ", ".join(f"{k} {v}" for k, v in sorted(c.items())) or "none"


# --- measuring ----------------------------------------------------------------------------------

_PHASES = ("trace", "lower", "compile")   # optimize's trace includes its rewrite

def measure(p: Program, direction: str, quick: bool) -> dict:
    fn = p.forward if direction == "forward" else grad_program(p)
    args = p.args
    opt_f, jit_f = jaxrewrite.optimize(fn, strict=True), jax.jit(fn)
    traced = opt_f.trace(*args)
    report = jaxrewrite.last_report()
    if report is None or report.errors:
        raise RuntimeError(f"{p.library} {direction}: the rewrite fell back: "
                           f"{report and report.errors}")
    expected, actual = jit_f(*args), opt_f(*args)
    assert_result(direction, actual, expected, f"{p.library} {direction}")
    diff, units = max_diff(direction, actual, expected)
    reps = 3 if quick else 5
    ph = _common.paired_phases(
        {"jit": lambda: jax.jit(fn), "opt": lambda: jaxrewrite.optimize(fn, strict=True)},
        args, repeats=reps)
    run = _common.paired_calls({"jit": lambda: jit_f(*args), "opt": lambda: opt_f(*args)},
                               repeats=5 if quick else 11,
                               inner=_common.calls_per_sample(lambda a: jit_f(*a), args,
                                                              0.01 if quick else 0.02))
    return dict(library=p.library, program=p.name, direction=direction,
                rewrites=_fmt_rewrites(rewrites_applied(report)),
                eqns_jit=_walk.count_eqns(jit_f.trace(*args).jaxpr),
                eqns_opt=_walk.count_eqns(traced.jaxpr),
                compile_ms_jit=ph["jit"]["compile"] * 1e3, compile_ms_opt=ph["opt"]["compile"] * 1e3,
                compile_ratio=ph["opt"]["compile"] / ph["jit"]["compile"],
                total_ratio=sum(ph["opt"][k] for k in _PHASES) / sum(ph["jit"][k] for k in _PHASES),
                run_us_jit=run["jit"] * 1e6, run_us_opt=run["opt"] * 1e6,
                run_ratio=run["opt"] / run["jit"], max_abs_diff=diff, diff_eps=units)


def main(quick: bool = False) -> list[dict]:
    absent = missing()
    if absent:
        print(f"clients: skipped, not installed here: {', '.join(absent)} "
              f"(pip install -e '.[clients]' in its own venv; see .ci/run)", file=sys.stderr)
        return []
    # JAX MD's energy sums ask for float64, which JAX truncates to float32 with a warning (x64 off)
    warnings.filterwarnings("ignore", "Explicitly requested dtype float64", UserWarning)
    rows = []
    # --quick (CI): the forward programs only; the gradients are tests/clients' to check
    directions = ("forward",) if quick else ("forward", "grad")
    for i, make in enumerate(PROGRAMS, 1):
        p = make()
        for direction in directions:
            print(f"[clients {i}/{len(PROGRAMS)}] {p.library}: {p.name} ({direction})",
                  file=sys.stderr, flush=True)
            rows.append(measure(p, direction, quick))
            jax.clear_caches()
    return rows


if __name__ == "__main__":
    _common.cli(NAME, main, COLUMNS)
