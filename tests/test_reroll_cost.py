"""Whether rolling pays (`backend.cost.reroll_body`), and layers that read one parameter array at
their own offsets (reroll=True).

The bodies below are plain-JAX stand-ins for the real networks the cost model was measured on
(an e3nn-jax equivariant network, a netket GCNN): they hold what the model keys on, contractions
among equations that move data every trip (concatenates of irreps-like chunks; a kernel gathered
through a group's product table), not the libraries. Tolerance: rolled float programs are
compared with rtol=1e-5 (float32), as in tests/test_reroll.py.
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxrewrite
from jaxrewrite import _compat as C
from jaxrewrite._api import rewrite_jaxpr_with_report
from jaxrewrite.backend import autotune as _autotune
from jaxrewrite.backend import cost as _cost
from jaxrewrite.passes import reroll
from jaxrewrite.testing import assert_equivalent

RTOL = 1e-5
RNG = np.random.default_rng(0)

# `autotune="time"` measures on the local backend only: target='cpu' (every rewrite here) is
# measured where the CPU is the default backend (on a TPU host the model decides)
cpu_compiler = pytest.mark.skipif(
    _autotune.compiler_for("cpu")[0] != "local",
    reason="measures rolled forms for target='cpu', which autotune does only where the CPU is "
           "the default backend (autotune.compiler_for)")

# --- an e3nn-like block: irreps chunks, products with a constant table, concatenated, gated ----

MULS, DIMS = (4, 4, 2, 2), (1, 1, 3, 3)
CG = [RNG.normal(size=(d, d, d)).astype(np.float32) for d in DIMS]


def _e3_block(chunks, w):
    outs = []
    for c, cg in zip(chunks, CG):
        p = jnp.einsum("bui,bvj,ijk->buvk", c, c, cg)
        outs.append(p.reshape(p.shape[0], -1, p.shape[-1]))
    flat = jnp.concatenate([o.reshape(o.shape[0], -1) for o in outs], axis=1)
    gates = jax.nn.sigmoid(flat @ w)
    new, at = [], 0
    for m, o in zip(MULS, outs):
        new.append(jnp.tanh(o[:, :m, :]) * gates[:, at:at + m, None] + o[:, m:2 * m, :])
        at += m
    return new


def _e3_net(ws, chunks):
    for w in ws:
        chunks = _e3_block(chunks, w)
    return sum(c.sum() for c in chunks)


def _e3_net_calls(ws, chunks):
    for w in ws:
        chunks = jax.jit(_e3_block)(chunks, w)
    return sum(c.sum() for c in chunks)


def _e3_args(n=4, batch=8):
    f = sum(m * m * d for m, d in zip(MULS, DIMS))
    ws = [jnp.asarray(RNG.normal(size=(f, sum(MULS))), jnp.float32) * 0.05 for _ in range(n)]
    xs = [jnp.asarray(RNG.normal(size=(batch, m, d)), jnp.float32) for m, d in zip(MULS, DIMS)]
    return ws, xs


# --- a GCNN-like layer: the kernel expanded through a group's product table (a gather) ---------

G = 8
TABLE = np.asarray([RNG.permutation(G) for _ in range(G)], np.int32)


def _gc_layer(x, w):
    k = w[:, :, TABLE]                                     # (F, F, G, G): a gather per trip
    return jax.nn.relu(jnp.einsum("bfg,fehg->beh", x, k)) + x


def _gc_net(ws, x):
    for w in ws:
        x = jax.jit(_gc_layer)(x, w)
    return (x * x).sum()


def _gc_args(n=4, feats=3, batch=4):
    ws = [jnp.asarray(RNG.normal(size=(feats, feats, G)), jnp.float32) * 0.2 for _ in range(n)]
    return ws, jnp.asarray(RNG.normal(size=(batch, feats, G)), jnp.float32)


# --- a transformer-like layer (contractions, no data movement): what rolling wins on ----------

def _mlp_block(x, w1, w2):
    h = jax.nn.gelu(x @ w1)
    y = x + h @ w2
    return (y - y.mean(-1, keepdims=True)) * jax.lax.rsqrt(y.var(-1, keepdims=True) + 1e-5)


def _mlp_net(w1s, w2s, x):
    for w1, w2 in zip(w1s, w2s):
        x = _mlp_block(x, w1, w2)
    return (x * x).sum()


def _mlp_args(n=4, d=8):
    return ([jnp.asarray(RNG.normal(size=(d, 2 * d)), jnp.float32) * 0.3 for _ in range(n)],
            [jnp.asarray(RNG.normal(size=(2 * d, d)), jnp.float32) * 0.3 for _ in range(n)],
            jnp.asarray(RNG.normal(size=(4, d)), jnp.float32))


def _rewrite(f, *args, **opts):
    opts.setdefault("target", "cpu")
    res = rewrite_jaxpr_with_report(jax.make_jaxpr(f)(*args), **opts)
    C.check_jaxpr(res.jaxpr)
    return res.jaxpr, res.report


def _rolled(cj) -> int:
    """Scans that reroll made, at any depth (not the row-offset loops, `reroll._offsets`)."""
    from jaxrewrite import _walk
    return sum(1 for e in _walk.iter_eqns(cj)
               if e.primitive.name == "scan" and not reroll.is_offsets_loop(e))


def _cost_declines(report):
    return [d.reason for d in report.declines
            if d.pass_name == "reroll" and d.reason.startswith("estimate on cpu")]


@pytest.mark.parametrize("name, f, args", [
    ("e3nn-like", _e3_net, _e3_args()),
    ("e3nn-like calls", _e3_net_calls, _e3_args()),
    ("e3nn-like grad", jax.grad(_e3_net_calls), _e3_args()),
    ("gcnn-like", _gc_net, _gc_args()),
    ("gcnn-like grad", jax.grad(_gc_net), _gc_args()),
])
def test_bodies_moving_data_around_contractions_are_declined_with_the_estimate(name, f, args):
    cj, report = _rewrite(f, *args, reroll=True)
    assert _rolled(cj) == 0
    reasons = _cost_declines(report)
    assert reasons and report.counts["reroll.declined_by_cost"] == len(reasons)
    # the reason names the model's estimate: trips, equations per trip, what they are
    assert any(("concatenate" in r or "gather" in r or "scatter" in r) and "contraction" in r
               and "trips" in r for r in reasons), reasons
    # the program the CPU's estimate declined (on the TPU, reroll=True rolls these bodies: that
    # program is test_rolled_on_the_tpu_within_the_contract's)
    assert_equivalent(f, *args, reroll=True, rtol=RTOL, vmap=False, target="cpu")


@pytest.mark.parametrize("name, f, args", [
    ("e3nn-like grad", jax.grad(_e3_net_calls), _e3_args()),
    ("gcnn-like grad", jax.grad(_gc_net), _gc_args()),
])
def test_rolled_on_the_tpu_within_the_contract(name, f, args):
    """The TPU's row rolls the bodies the CPU declines (reroll=True): the rolled program, run on
    the default backend, holds the contract (floats within its ulps) against jax.jit."""
    cj, report = _rewrite(f, *args, reroll=True, target="tpu")
    assert _rolled(cj) == 2
    assert_equivalent(f, *args, reroll=True, vmap=False, grad=False, target="tpu")


def test_winning_bodies_still_roll_forward_and_backward():
    args = _mlp_args(n=5)       # backward: 4 trips (`REROLL_MIN_TRIPS`; the first layer differs)
    cj, report = _rewrite(_mlp_net, *args, reroll=True)
    assert _rolled(cj) == 1 and not _cost_declines(report)
    cj, report = _rewrite(jax.grad(_mlp_net, argnums=(0, 1)), *args, reroll=True)
    assert len(report.stats["reroll.lengths"]) == 2 and not _cost_declines(report)  # fwd, bwd
    assert_equivalent(_mlp_net, *args, reroll=True, rtol=RTOL, vmap=False)


def test_data_movement_without_a_contraction_still_rolls():
    """A stencil step (`jnp.roll`: concatenates of slices) rolled forward ran faster: the rule
    is about contractions among data movement."""
    def step(x):
        return jnp.tanh(jnp.roll(x, 1, axis=0) * 0.5 + jnp.roll(x, -1, axis=1))

    def f(x):
        for _ in range(5):
            x = jax.jit(step)(x)
        return x
    x = jnp.linspace(-1, 1, 48).reshape(6, 8)
    cj, report = _rewrite(f, x, reroll=True)
    assert _rolled(cj) == 1 and not _cost_declines(report)


def test_rule_rows():
    assert _cost.reroll_body({}, 3, 4, "cpu") is None                      # no data movement
    assert _cost.reroll_body({"concatenate": 2}, 0, 4, "cpu") is None      # no contraction
    why = _cost.reroll_body({"gather": 1, "pad": 3}, 1, 3, "cpu")
    assert why and "3 trips" in why and "4 equation(s)" in why and "gather x1" in why
    assert _cost.reroll_body({"gather": 1}, 1, 3, "gpu") is None           # not measured there
    why = _cost.reroll_body({}, 2, 3, "cpu")                               # a short chain
    assert why and "3 trips" in why and "2 contraction(s)" in why
    assert _cost.reroll_body({}, 2, _cost.REROLL_MIN_TRIPS["cpu"], "cpu") is None
    assert _cost.reroll_body({}, 0, 3, "cpu") is None                      # no contraction


@cpu_compiler
def test_short_chains_of_contractions_stay_unrolled_unless_measured(cache_dir, monkeypatch):
    """Three layers (a qujax circuit's, 1.03-1.07x rolled) are declined with the estimate; four
    roll; `autotune="time"` measures the three instead."""
    args = _mlp_args(n=3)
    cj, report = _rewrite(_mlp_net, *args, reroll=True)
    assert _rolled(cj) == 0 and report.counts["reroll.declined_by_cost"] == 1
    assert _rolled(_rewrite(_mlp_net, *_mlp_args(n=4), reroll=True)[0]) == 1
    monkeypatch.setitem(_cost.REROLL_TIMED, "cpu", (float("inf"), float("inf")))
    cj, report = _rewrite(_mlp_net, *args, reroll=True, autotune="time")
    assert _rolled(cj) == 1 and report.counts["reroll.model_overridden"] == 1
    assert_equivalent(_mlp_net, *args, reroll=True, rtol=RTOL, vmap=False)


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("JAXREWRITE_CACHE_DIR", str(tmp_path))
    return tmp_path


@cpu_compiler
def test_autotune_time_measures_instead_of_declining(cache_dir, monkeypatch):
    """The verdict is soft: with autotune="time" the chain is rolled and the whole program
    measured; here the measurement is made to keep it (a rolled program that wins)."""
    monkeypatch.setitem(_cost.REROLL_TIMED, "cpu", (float("inf"), float("inf")))
    args = _gc_args()
    cj, report = _rewrite(_gc_net, *args, reroll=True, autotune="time")
    assert _rolled(cj) == 1 and not _cost_declines(report)
    assert report.counts["reroll.model_overridden"] >= 1
    assert any("gather" in w for w in report.stats["reroll.model_estimates"])
    assert report.stats["autotune.choices"]                                # it was measured
    assert_equivalent(_gc_net, *args, reroll=True, autotune="time", rtol=RTOL, vmap=False)


@cpu_compiler
def test_autotune_time_can_still_decline_by_measurement(cache_dir, monkeypatch):
    monkeypatch.setitem(_cost.REROLL_TIMED, "cpu", (0.0, 0.0))             # nothing can win
    cj, report = _rewrite(_gc_net, *_gc_args(), reroll=True, autotune="time")
    assert _rolled(cj) == 0 and report.counts["reroll.declined_measured"] == 1


# --- layers reading one parameter array at their own offsets (a quantum circuit's layers) ------

def _rot(state, t):
    c, s = jnp.cos(t), jnp.sin(t)
    state = state * c[0] + jnp.roll(state, 1, axis=-1) * s[0]
    state = state * c[1] - jnp.flip(state, -1) * s[1]
    return jnp.tanh(state * c[2] + s[2])


LAYERS = 6


def _circuit_inline(params, state):
    for i in range(LAYERS):
        state = _rot(state, params[3 * i:3 * i + 3])
    return state


def _circuit_in_calls(params, state):
    for i in range(LAYERS):     # each layer's function reads its own window: bodies differ
        state = jax.jit(lambda s, p, i=i: _rot(s, p[3 * i:3 * i + 3]))(state, params)
    return state


def _circuit_args():
    return jnp.linspace(0.1, 1.0, 3 * LAYERS), jnp.linspace(-1, 1, 16).reshape(2, 8)


@pytest.mark.parametrize("f", [_circuit_inline, _circuit_in_calls])
def test_offsets_into_a_shared_array_become_scanned_xs(f):
    args = _circuit_args()
    cj, report = _rewrite(f, *args, reroll=True)
    assert report.stats["reroll.lengths"] == [LAYERS]
    # the offsets are one scanned int32 literal of the layers' start indices
    lits = [np.asarray(C.literal_value(a)) for e in cj.jaxpr.eqns
            if e.primitive.name in ("scan", "custom_jvp_call") for a in e.invars
            if C.is_literal(a)]
    assert any(v.dtype == np.int32 and v.ravel().tolist() == [3 * i for i in range(LAYERS)]
               for v in lits), lits
    # the static windows became one dynamic window read inside the loop
    from jaxrewrite import _walk
    assert sum(1 for e in _walk.iter_eqns(cj) if e.primitive.name == "dynamic_slice") == 1
    assert_equivalent(f, *args, reroll=True, rtol=RTOL)
