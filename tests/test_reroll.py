"""Re-rolling chains of identical calls into `lax.scan` (reroll=True).

Tolerance: rolled programs are compared with rtol=1e-5 (float32); integer programs exactly.
"""
import jax
import jax.numpy as jnp
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from jax.experimental import io_callback

import jaxrewrite
from jaxrewrite import _compat as C
from jaxrewrite._options import Options
from jaxrewrite._pipeline import Context
from jaxrewrite.report.records import Report
from jaxrewrite.passes import reroll
from jaxrewrite import _walk
from jaxrewrite.testing import assert_bitwise_equal, assert_equivalent, primitive_counts

RTOL = 1e-5


def _rewrite(f, *args, **opts):
    res = jaxrewrite._api.rewrite_jaxpr_with_report(jax.make_jaxpr(f)(*args), **opts)
    C.check_jaxpr(res.jaxpr)
    return res.jaxpr, res.report


def _top(cj, name):
    return sum(1 for e in cj.jaxpr.eqns if e.primitive.name == name)


def _scans(cj):
    """The rolled scans at the top level: bare, or the one inside a list-reading `custom_jvp`
    (not the loops that carry the row offsets of stacked results, `reroll._offsets`)."""
    out = []
    for e in cj.jaxpr.eqns:
        if e.primitive.name == "scan":
            if not reroll.is_offsets_loop(e):
                out.append(e)
        elif e.primitive.name == "custom_jvp_call":
            out.extend(s for s in e.params["call_jaxpr"].jaxpr.eqns if s.primitive.name == "scan")
    return out


def _layer(w, x):
    return jnp.tanh(x @ w) + x


def _stack(ws, x):
    for w in ws:
        x = jax.checkpoint(_layer)(w, x)
    return (x * x).sum()


def _weights(n, d=4, seed=0):
    ks = jax.random.split(jax.random.key(seed), n)
    return [jax.random.normal(k, (d, d)) * 0.3 for k in ks]


def test_fresh_jit_closures_roll_into_one_scan():
    def f(x):
        for _ in range(6):
            x = jax.jit(lambda s: jnp.sin(s) * 0.5 + s)(x)
        return x
    x = jnp.linspace(0, 1, 8)
    cj, report = _rewrite(f, x, reroll=True)
    assert len(_scans(cj)) == 1 and _top(cj, "jit") == 0
    assert report.stats["reroll.lengths"] == [6]
    assert_equivalent(f, x, reroll=True, rtol=RTOL)


def test_checkpoint_stack_with_per_layer_weights():
    ws, x = _weights(5), jnp.ones((2, 4))
    cj, report = _rewrite(_stack, ws, x, reroll=True)
    assert len(_scans(cj)) == 1 and _top(cj, C.remat_p.name) == 0
    assert report.counts["reroll.chains"] == 1
    assert_equivalent(_stack, ws, x, reroll=True, rtol=RTOL)


def test_grad_of_optimize_is_grad_of_a_scan():
    ws, x = _weights(6), jnp.ones((3, 4))
    g_opt = jax.jit(jax.grad(jaxrewrite.optimize(_stack, reroll=True)))
    g_ref = jax.jit(jax.grad(_stack))
    for a, b in zip(g_opt(ws, x), g_ref(ws, x)):
        np.testing.assert_allclose(a, b, rtol=RTOL, atol=RTOL)
    jaxpr = jax.make_jaxpr(jax.grad(jaxrewrite.optimize(_stack, reroll=True)))(ws, x)
    counts = primitive_counts(jaxpr)
    assert counts.get("scan", 0) >= 2 and counts.get(C.remat_p.name, 0) <= 2  # fwd + bwd loops


def test_optimize_of_grad_rolls_the_backward_chain():
    ws, x = _weights(6), jnp.ones((3, 4))
    g = jax.grad(_stack)
    cj, report = _rewrite(g, ws, x, reroll=True)
    assert report.counts["reroll.chains"] >= 1 and len(_scans(cj)) >= 1
    assert _top(cj, C.remat_p.name) < 6
    got, want = jaxrewrite.optimize(g, reroll=True)(ws, x), jax.jit(g)(ws, x)
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b, rtol=RTOL, atol=RTOL)


def test_per_layer_literals_are_lifted_into_xs():
    def layer(x, i, key):
        return x + jax.random.normal(jax.random.fold_in(key, i), x.shape) * 0.1

    def f(x, key):
        for i in range(5):
            x = jax.jit(layer)(x, i, key)
        return x
    x, key = jnp.zeros(4), jax.random.key(1)
    for fold in (False, True):  # fold specialises each body to its index: reroll lifts it back
        cj, _ = _rewrite(f, x, key, reroll=True, fold=fold)
        assert len(_scans(cj)) == 1
        # the scan, or the custom_jvp around it (a body without contraction: forward only)
        lits = [a for e in cj.jaxpr.eqns if e.primitive.name in ("scan", "custom_jvp_call")
                for a in e.invars if C.is_literal(a)]
        assert lits and np.asarray(C.literal_value(lits[0])).ravel().tolist() == [0, 1, 2, 3, 4]
        assert_equivalent(f, x, key, reroll=True, fold=fold, rtol=RTOL, grad=False, vmap=False)


def test_intermediate_results_come_out_as_ys():
    def f(x):
        outs = []
        for _ in range(4):
            x = jax.jit(lambda s: jnp.cos(s) + 1.0)(x)
            outs.append(x)
        return x, outs[1] * 2, outs[0]
    x = jnp.linspace(0, 1, 3)
    cj, _ = _rewrite(f, x, reroll=True)
    assert len(_scans(cj)) == 1
    assert_equivalent(f, x, reroll=True, rtol=RTOL)


def test_rows_of_stacked_results_are_read_at_runtime_offsets_on_the_cpu():
    """On the CPU each row of a stacked result is read at an offset carried round a loop (XLA:CPU
    compiles one kernel for all rows, not one per constant offset); the values are the rows
    themselves, bit for bit what static slices read. Other targets slice statically."""
    import dataclasses

    from jaxrewrite.backend import cost as _cost

    def f(x):
        outs = []
        for _ in range(5):
            x = jax.jit(lambda s: jnp.sin(s) * 1.5 + 0.25)(x)
            outs.append(x)
        return x, [o * 2 for o in outs]  # every layer's result is used after the chain
    x = jnp.linspace(0, 1, 8)
    cj, report = _rewrite(f, x, reroll=True, target="cpu")
    assert report.stats["reroll.lengths"] == [5]
    loops = [e for e in cj.jaxpr.eqns if reroll.is_offsets_loop(e)]
    assert len(loops) == 1
    offsets = set(loops[0].outvars)
    assert any(e.primitive.name == "dynamic_slice" for e in _walk.iter_eqns(cj))
    assert _top(cj, "slice") == 0
    # each row read (a dynamic_slice) is fed by one of the loop's offsets
    fed = [a for e in cj.jaxpr.eqns if e.primitive.name != "scan" for a in e.invars
           if not C.is_literal(a) and a in offsets]
    assert len(fed) == 4 and len(set(fed)) == 4   # (the last row is the carry itself)
    got = jaxrewrite.optimize(f, reroll=True, target="cpu")(x)
    cpu = _cost.COSTS["cpu"]
    try:
        _cost.COSTS["cpu"] = dataclasses.replace(cpu, reroll_runtime_offsets=False)
        static, _ = _rewrite(f, x, reroll=True, target="cpu")
        assert not any(reroll.is_offsets_loop(e) for e in static.jaxpr.eqns)
        assert _top(static, "slice") == 4
        jax.clear_caches()
        want = jaxrewrite.optimize(f, reroll=True, target="cpu")(x)
    finally:
        _cost.COSTS["cpu"] = cpu
    assert_bitwise_equal(got, want)
    gpu, _ = _rewrite(f, x, reroll=True, target="gpu")
    assert not any(reroll.is_offsets_loop(e) for e in gpu.jaxpr.eqns)
    assert_equivalent(f, x, reroll=True, target="cpu", rtol=RTOL)


def test_min_length_default_off_and_effects():
    def f(x):
        for _ in range(3):
            x = jax.jit(lambda s: s * 2.0)(x)
        return x
    x = jnp.ones(2)
    assert len(_scans(_rewrite(f, x)[0])) == 0     # reroll="auto" by default: floats stay as written
    assert len(_scans(_rewrite(f, x, reroll=4)[0])) == 0           # chain shorter than 4
    assert len(_scans(_rewrite(f, x, reroll=3)[0])) == 1

    log = []

    def g(x):
        for _ in range(4):
            x = jax.jit(lambda s: io_callback(lambda v: (log.append(1), v)[1],
                                              jax.ShapeDtypeStruct((2,), jnp.float32), s * 2,
                                              ordered=True))(x)
        return x
    assert len(_scans(_rewrite(g, x, reroll=True)[0])) == 0        # effects: never rolled
    jaxrewrite.optimize(g, reroll=True)(x)
    jax.effects_barrier()
    assert log == [1] * 4


def test_reroll_is_idempotent_and_unroll_passes_through():
    def f(x):
        for _ in range(4):
            x = jax.jit(lambda s: s * 1.5 + 1)(x)
        return x
    cj, _ = _rewrite(f, jnp.ones(2), reroll=True, unroll=2)
    scan = _scans(cj)[0]
    assert scan.params["unroll"] == 2
    ctx = Context(Options.make(reroll=True), Report())
    out, changed = reroll.run(cj, ctx)
    assert out is cj and not changed


def test_chain_cut_where_an_intermediate_is_used_early():
    def f(x):
        a = jax.jit(lambda s: s + 1.0)
        x1 = a(x)
        x2 = a(x1)
        y = x1 * 3.0          # used before the chain ends: the chain is cut after x1
        x3 = a(x2 + y)
        x4 = a(x3)
        x5 = a(x4)
        x6 = a(x5)
        return x6
    x = jnp.ones(2)
    cj, _ = _rewrite(f, x, reroll=True)
    assert_equivalent(f, x, reroll=True, rtol=RTOL)


# --- property: random chains ---------------------------------------------------------------------

@settings(max_examples=6)
@given(st.integers(1, 7), st.booleans(), st.booleans(), st.integers(2, 4))
def test_random_chains(n, per_layer_weights, use_checkpoint, min_len):
    ws = _weights(n, d=3, seed=n)
    if not per_layer_weights:
        ws = [ws[0]] * n
    wrap = jax.checkpoint if use_checkpoint else jax.jit

    def f(ws, x):
        for i, w in enumerate(ws):
            x = wrap(lambda w, x, i: jnp.tanh(x @ w) * (1.0 + 0.01 * i) + x)(w, x, i)
        return x
    x = jnp.linspace(-1, 1, 6).reshape(2, 3)
    cj, report = _rewrite(f, ws, x, reroll=min_len)
    expect_rolled = n >= min_len
    assert (len(_scans(cj)) == 1) == expect_rolled
    if expect_rolled:
        assert report.stats["reroll.lengths"] == [n]
    assert_equivalent(f, ws, x, reroll=min_len, rtol=RTOL, vmap=False)


def test_backward_chain_reads_forward_residuals_in_reverse():
    def f(ws, x):
        for w in ws:
            x = jax.jit(_layer)(w, x)
        return (x * x).sum()
    ws, x = _weights(5), jnp.ones((2, 4))
    g = jax.grad(f)
    for target, stacks in (("gpu", 1), ("cpu", 0)):
        cj, report = _rewrite(g, ws, x, reroll=True, target=target)
        scans = _scans(cj)
        assert report.counts["reroll.chains"] == 2 and len(scans) == 2
        assert [s.params["reverse"] for s in scans] == [False, True]
        # stacked form: one stacked copy of the weights (the forward's), the backward slices it
        # and the residuals; list form (CPU): no stacked copy, both loops read the list
        assert _top(cj, "stack") + _top(cj, "concatenate") == stacks
        got, want = jaxrewrite.optimize(g, reroll=True, target=target)(ws, x), jax.jit(g)(ws, x)
        for a, b in zip(got, want):
            np.testing.assert_allclose(a, b, rtol=RTOL, atol=RTOL)


# --- list form (CPU): per-layer operands read from their list, no stacked copy -----------------

def _prims(cj) -> dict:
    return primitive_counts(cj)


def test_list_form_structure():
    ws, x = _weights(5), jnp.ones((2, 4))
    cj, _ = _rewrite(_stack, ws, x, reroll=True, target="cpu")
    (cjvp,) = [e for e in cj.jaxpr.eqns if e.primitive.name == "custom_jvp_call"]
    assert cjvp.invars[-5:] == cj.jaxpr.invars[:5]            # the weights, as they are
    (scan,) = _scans(cj)
    body = scan.params["jaxpr"].jaxpr
    (remat,) = [e for e in body.eqns if e.primitive.name == C.remat_p.name]
    # the read: inside the remat (re-read in the backward loop, not saved), a custom_jvp over
    # one switch with a branch per layer
    (read,) = [e for e in remat.params["jaxpr"].eqns if e.primitive.name == "custom_jvp_call"]
    (cond,) = [e for e in read.params["call_jaxpr"].jaxpr.eqns if e.primitive.name == "cond"]
    assert len(cond.params["branches"]) == 5
    assert [v.aval for v in read.outvars] == [jax.typeof(ws[0])]     # one row: one position
    assert _prims(cj).get("stack", 0) + _prims(cj).get("concatenate", 0) == 0
    # under grad, the only stacking is of the tangents: one stack, transposed into one unstack
    g = jax.make_jaxpr(jax.grad(jaxrewrite.optimize(_stack, reroll=True, target="cpu")))(ws, x)
    counts = primitive_counts(g)
    assert counts.get("stack", 0) + counts.get("concatenate", 0) == 0
    assert counts.get("unstack", 0) == 1
    # stacked form elsewhere
    cj_gpu, _ = _rewrite(_stack, ws, x, reroll=True, target="gpu")
    assert _top(cj_gpu, "scan") == 1 and _top(cj_gpu, "custom_jvp_call") == 0
    assert _prims(cj_gpu).get("stack", 0) == 1


def test_list_form_long_chain_keeps_stacked_form():
    n = int((reroll.LIST_READ_LIMIT) ** 0.5) + 1
    ws, x = [jnp.eye(2) * (1 + 1e-3 * i) for i in range(n)], jnp.ones((1, 2))
    cj, _ = _rewrite(_stack, ws, x, reroll=True, target="cpu")
    assert _top(cj, "scan") == 1 and _top(cj, "custom_jvp_call") == 0


def test_list_form_under_transformations():
    ws, x = _weights(4), jnp.linspace(-1, 1, 8).reshape(2, 4)
    opt = jaxrewrite.optimize(_stack, reroll=True, target="cpu")

    def close(a, b):
        for u, v in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)):
            np.testing.assert_allclose(u, v, rtol=RTOL, atol=RTOL)
    close(jax.grad(opt, argnums=(0, 1))(ws, x), jax.grad(_stack, argnums=(0, 1))(ws, x))
    close(jax.grad(opt, argnums=1)(ws, x), jax.grad(_stack, argnums=1)(ws, x))  # ws: no tangent
    close(jax.jacfwd(opt)(ws, x), jax.jacfwd(_stack)(ws, x))
    close(jax.jacrev(opt)(ws, x), jax.jacrev(_stack)(ws, x))
    close(jax.grad(lambda w: jax.grad(opt, argnums=1)(w, x).sum())(ws),       # second order
          jax.grad(lambda w: jax.grad(_stack, argnums=1)(w, x).sum())(ws))
    wsb = [jnp.stack([w, w * 0.5]) for w in ws]
    close(jax.vmap(opt)(wsb, jnp.stack([x, x])), jax.vmap(_stack)(wsb, jnp.stack([x, x])))
    close(jax.vmap(opt, in_axes=(0, None))(wsb, x), jax.vmap(_stack, in_axes=(0, None))(wsb, x))
    lin_o = jax.linearize(lambda w: opt(w, x), ws)[1]
    lin_r = jax.linearize(lambda w: _stack(w, x), ws)[1]
    close(lin_o(ws), lin_r(ws))


def test_list_form_integer_operands_and_outputs():
    def f(ws, ns, x):
        outs = []
        for w, n_ in zip(ws, ns):
            x, c = jax.checkpoint(lambda w, n_, x: (jnp.tanh(x @ w) * n_ + x, n_ * 2))(w, n_, x)
            outs.append(c)
        return x.sum(), outs[1]
    ws = _weights(4)
    ns = [jnp.int32(i + 1) for i in range(4)]
    x = jnp.ones((2, 4))
    cj, _ = _rewrite(f, ws, ns, x, reroll=True, target="cpu")
    assert _top(cj, "custom_jvp_call") == 1
    assert_equivalent(f, ws, ns, x, reroll=True, target="cpu", rtol=RTOL)
    g_o = jax.grad(lambda *a: jaxrewrite.optimize(f, reroll=True, target="cpu")(*a)[0],
                   argnums=(0, 2))(ws, ns, x)
    g_r = jax.grad(lambda *a: f(*a)[0], argnums=(0, 2))(ws, ns, x)
    h_o = jax.hessian(lambda x: jaxrewrite.optimize(f, reroll=True, target="cpu")(ws, ns, x)[0])(x)
    h_r = jax.hessian(lambda x: f(ws, ns, x)[0])(x)
    for u, v in zip(jax.tree_util.tree_leaves((g_o, h_o)), jax.tree_util.tree_leaves((g_r, h_r))):
        np.testing.assert_allclose(u, v, rtol=RTOL, atol=RTOL)


# --- the cost model under differentiation (a stencil loop) ------------------------------------------

_CX, _CY = (0, 1, 0, -1, 0, 1, -1, -1, 1), (0, 0, 1, 0, -1, 1, 1, -1, -1)


def _stencil(f):
    """Lattice-Boltzmann-like steps on a (n, n, 9) field: rolls and elementwise, no contraction."""
    for _ in range(4):
        g = jnp.stack([jnp.roll(f[..., i], (_CX[i], _CY[i]), axis=(0, 1)) for i in range(9)], -1)
        rho = g.sum(-1, keepdims=True)
        f = g - 0.6 * (g - rho / 9.0 * (1.0 + 0.1 * jnp.tanh(g)))
    return (f * f).sum()


def _field():
    return (1.0 + 0.1 * np.random.default_rng(0).normal(size=(8, 8, 9))).astype(np.float32)


def _all_scans(cj):
    from jaxrewrite._walk import iter_eqns
    return [e for e in iter_eqns(cj)
            if e.primitive.name == "scan" and not reroll.is_offsets_loop(e)]


def test_stencil_forward_rolls_and_its_gradient_is_jax_jits():
    """No contraction in the body: on the CPU a rolled backward pass runs slower than the
    unrolled one (6-step lattice-Boltzmann gradient 1.15-1.38x), so the forward is rolled and
    its derivative is the unrolled chain's. grad(optimize(f)) is then jax.jit's program."""
    f0 = _field()
    cj, report = _rewrite(_stencil, f0, reroll=True, target="cpu")
    assert [s.params["length"] for s in _all_scans(cj)] == [4]
    assert report.counts["reroll.forward_only"] == 1
    assert any("derivative kept unrolled" in d.reason and "no contraction" in d.reason
               for d in report.declines)
    opt = jaxrewrite.optimize(_stencil, reroll=True)
    np.testing.assert_allclose(opt(f0), jax.jit(_stencil)(f0), rtol=RTOL)
    grad_cj = jax.make_jaxpr(jax.grad(opt))(f0)
    assert not _all_scans(grad_cj)                       # the derivative is unrolled
    np.testing.assert_array_equal(jax.jit(jax.grad(opt))(f0),
                                  jax.jit(jax.grad(jax.jit(_stencil)))(f0))


def test_stencil_backward_chain_is_not_rolled():
    """optimize(jax.grad(f)): the forward chain rolls, the backward chain (reading its residuals
    in reverse) declines with the cost model's reason."""
    f0 = _field()
    g = jax.grad(_stencil)
    cj, report = _rewrite(g, f0, reroll=True, target="cpu")
    assert report.counts["reroll.chains"] == 1 and len(_all_scans(cj)) == 1
    assert any(d.reason.startswith("backward pass not rolled") for d in report.declines)
    np.testing.assert_allclose(jaxrewrite.optimize(g, reroll=True)(f0), jax.jit(g)(f0),
                               rtol=RTOL, atol=1e-6)


def test_layers_with_a_contraction_roll_forward_and_backward():
    ws, x = _weights(5), jnp.ones((2, 4))
    g = jax.grad(_stack)
    cj, report = _rewrite(g, ws, x, reroll=True, target="cpu")
    # the backward chain of remat calls rolls (the forward, 3 equations a layer, is too short
    # to outline); nothing is kept unrolled for the cost model
    assert report.counts["reroll.chains"] == 1 and not report.counts["reroll.forward_only"]
    assert not report.declines
    assert_equivalent(g, ws, x, reroll=True, rtol=RTOL, grad=False)


# --- recomputed residuals (CPU): the backward loop runs the forward body again ------------------

def _residual_layer(w, x):
    h = x @ w
    return jnp.tanh(h) * jax.nn.sigmoid(h) + x   # residuals: tanh(h), sigmoid(h), h


def _jit_stack(ws, x):
    for w in ws:
        x = jax.jit(_residual_layer)(w, x)
    return (x * x).sum()


def _scan_body_prims(scan) -> dict:
    return primitive_counts(C.closed(scan.params["jaxpr"].jaxpr, ()))


def test_cpu_backward_loop_recomputes_the_forward_instead_of_reading_its_residuals():
    """Under jax.grad a forward chain hands every residual to the backward chain. On the CPU
    the backward calls become calls of forward;backward (`passes/recompute.py`): the forward
    scan stacks only its carried inputs, and the backward scan's body computes the forward's
    tanh and sigmoid again. The GPU keeps the residuals."""
    ws, x = _weights(6), jnp.linspace(-1, 1, 8).reshape(2, 4)
    g = jax.grad(_jit_stack, argnums=(0, 1))   # (x too: every layer's backward is one body)
    cpu, report = _rewrite(g, ws, x, reroll=True, target="cpu")
    assert report.counts["reroll.recomputed"] == 1 and report.counts["reroll.chains"] == 2
    fwd, bwd = _scans(cpu)
    assert [fwd.params["reverse"], bwd.params["reverse"]] == [False, True]
    # forward: the carry and one stacked result, its carried inputs x_0..x_5
    ys = fwd.outvars[fwd.params["num_carry"]:]
    assert [tuple(v.aval.shape) for v in ys] == [(6, 2, 4)]
    assert _scan_body_prims(bwd).get("tanh", 0) == 1
    assert _scan_body_prims(bwd).get("logistic", 0) == 1
    gpu, report_gpu = _rewrite(g, ws, x, reroll=True, target="gpu")
    assert not report_gpu.counts["reroll.recomputed"]
    fwd_g, bwd_g = _scans(gpu)
    assert len(fwd_g.outvars) - fwd_g.params["num_carry"] > 1
    assert _scan_body_prims(bwd_g).get("tanh", 0) == 0
    got, want = jaxrewrite.optimize(g, reroll=True, target="cpu")(ws, x), jax.jit(g)(ws, x)
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b, rtol=RTOL, atol=RTOL)
    assert_equivalent(g, ws, x, reroll=True, target="cpu", rtol=RTOL, grad=False)


def test_recompute_needs_residuals_and_permission():
    """A checkpointed layer's backward already recomputes (it reads only carried values): left
    as it is. With exact=True nothing is rolled, so nothing is recomputed either."""
    ws, x = _weights(5), jnp.ones((2, 4))
    _, report = _rewrite(jax.grad(_stack), ws, x, reroll=True, target="cpu")
    assert report.counts["reroll.chains"] >= 1 and not report.counts["reroll.recomputed"]
    g = jax.grad(_jit_stack, argnums=(0, 1))
    _, exact = _rewrite(g, ws, x, reroll=True, target="cpu", exact=True)
    assert not exact.counts["reroll.recomputed"] and not exact.counts["reroll.chains"]


def test_recomputed_gradient_differentiates_again():
    """optimize of a gradient whose chains recompute, differentiated once more (the fused
    forward;backward body is an ordinary call under jax.grad). The weights are arguments:
    closed over, they would be constants that `fold` specialises each layer on."""
    ws, x = _weights(4), jnp.linspace(-1, 1, 8).reshape(2, 4)

    def h(ws, x):
        return sum(jnp.sum(t) for t in jax.tree.leaves(jax.grad(_jit_stack, (0, 1))(ws, x)))
    _, report = _rewrite(h, ws, x, reroll=True, target="cpu")
    assert report.counts["reroll.recomputed"] == 1 and report.counts["reroll.chains"] == 2
    got = jax.grad(jaxrewrite.optimize(h, reroll=True, target="cpu"), argnums=1)(ws, x)
    np.testing.assert_allclose(got, jax.grad(jax.jit(h), argnums=1)(ws, x), rtol=1e-4, atol=1e-5)
