"""Named regression tests: every bug the fuzzing / reliability work found, one test each.

Bugs in passes owned by others are kept as `xfail(strict=True)` until fixed (the strict xfail
turns into a failure the day the fix lands, so the marker gets removed).
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.sharding import PartitionSpec as P

import jaxrewrite
from jaxrewrite import _compat as C
from jaxrewrite import _walk as W
from jaxrewrite.testing import assert_bitwise_equal, assert_equivalent, primitive_counts


def test_tracing_error_names_the_users_function_and_argument():
    """Core (_api/_compat): errors raised while tracing the user's function named jaxrewrite's
    wrapper (`flat_fun at _api.py`) and its argument `dyn_vals[0]`, where jax.jit names the
    user's function and argument. Fixed: the inner trace carries jax.jit's debug info."""
    def h(x, scale):
        return 1 if x > 0 else scale

    with pytest.raises(jax.errors.TracerBoolConversionError) as want:
        jax.jit(h)(1.0, 2.0)
    with pytest.raises(jax.errors.TracerBoolConversionError) as got:
        jaxrewrite.optimize(h)(1.0, 2.0)
    assert "function h at" in str(got.value) and "argument x" in str(got.value)
    assert str(got.value).split("\n")[0] == str(want.value).split("\n")[0]


def test_tracing_error_names_with_static_and_pytree_arguments():
    def h(n, d):
        return d["a"] if d["b"] > n else d["a"] * 2

    with pytest.raises(jax.errors.TracerBoolConversionError) as got:
        jaxrewrite.optimize(h, static_argnums=0)(3, {"a": 1.0, "b": 2.0})
    assert "argument d['b']" in str(got.value)


def test_emitter_inside_shard_map_keeps_varying_manual_axes():
    """Core (_walk.Emitter/_compat.trace_avals): replacement equations built inside a shard_map
    body (check_vma=True) lost the varying-manual-axes type (`f32[4]{V:i}` became `f32[4]`), so
    any Emitter-based rewrite there produced an ill-typed jaxpr. Fixed: such operands are traced
    under the body's manual mesh, as shard_map traces its body."""
    mesh = jax.make_mesh((1,), ("i",), axis_types=(jax.sharding.AxisType.Auto,))

    def f(x):
        return jax.shard_map(lambda y: jnp.sin(y) * 2, mesh=mesh, in_specs=P("i"),
                             out_specs=P("i"))(x)

    cj = jax.make_jaxpr(f)(jnp.arange(4.0))
    (sm,) = [e for e in cj.jaxpr.eqns if e.primitive.name == "shard_map"]
    body = sm.params["jaxpr"]
    (sin,) = [e for e in body.eqns if e.primitive.name == "sin"]
    em = W.Emitter(sin)
    (y,) = em.call(lambda v: jnp.cos(v) + np.float32(1), sin.invars[0])
    assert C.aval_of(y) == sin.outvars[0].aval  # varying axes kept
    rep = em.replacement([y])
    new_body, _ = W.rewrite_eqns(body, lambda e: rep if e is sin else None)
    new_sm = sm.replace(params=dict(sm.params, jaxpr=new_body))
    out = C.closed(C.replace_jaxpr(cj.jaxpr, eqns=[new_sm if e is sm else e for e in cj.jaxpr.eqns]),
                   cj.consts)
    C.check_jaxpr(out)  # the body is checked under the shard_map's manual axes
    np.testing.assert_array_equal(C.eval_jaxpr(out, jnp.arange(4.0))[0],
                                  (jnp.cos(jnp.arange(4.0)) + 1) * 2)


def test_assert_equivalent_skips_gradients_where_undefined():
    """Core (testing.py): `grad` defaults to "where defined", but a reverse-mode-undefined
    program (a while loop) raised instead of skipping the gradient comparison."""
    def f(x):
        return lax.while_loop(lambda s: s[0] < 3, lambda s: (s[0] + 1, s[1] * 2), (0, x))[1]

    assert_equivalent(f, jnp.arange(3.0))
    with pytest.raises(ValueError, match="Reverse-mode"):
        assert_equivalent(f, jnp.arange(3.0), grad=True)


def test_static_gather_inside_shard_map_is_rewritten():
    """passes/fold.py (found here; fixed by the pass's owner the same day): a numpy constant
    used in a shard_map body is hoisted out by JAX and passed in as an argument; fold did not
    specialise shard_map call sites, so static gathers in shard_map bodies stayed gathers."""
    mesh = jax.make_mesh((1,), ("i",), axis_types=(jax.sharding.AxisType.Auto,))

    def f(x):
        body = lambda v: jnp.take(v, np.arange(4)[::-1].copy(), axis=-1) * 2  # noqa: E731
        return jax.shard_map(body, mesh=mesh, in_specs=P("i"), out_specs=P("i"))(x)

    x = jnp.arange(8.0).reshape(2, 4)
    assert_equivalent(f, x, vmap=False)
    # the CPU's decision: a rev of 4 elements is the gathers pass's form there; the TPU keeps
    # the gather (a rev of 16-64 elements ran 1.05-1.18x slower there, bench/tpu_costs.py), so
    # that fold reached the body is seen on the CPU's row, on any host
    out = jaxrewrite.rewrite_jaxpr(jax.make_jaxpr(f)(x), strict=True, target="cpu")
    assert primitive_counts(out).get("gather", 0) == 0


def test_static_gather_in_a_body_rewritten_without_shard_map():
    """The control for the xfail above: the same body at top level is rewritten."""
    def f(x):
        return jnp.take(x, np.arange(4)[::-1].copy(), axis=-1) * 2

    x = jnp.arange(8.0).reshape(2, 4)
    out = assert_equivalent(f, x, strict=True, target="cpu")   # (the CPU's rev, as above)
    assert primitive_counts(out).get("gather", 0) == 0
    assert_bitwise_equal(jaxrewrite.optimize(f, target="cpu")(x), jax.jit(f)(x))
    assert_bitwise_equal(jaxrewrite.optimize(f)(x), jax.jit(f)(x))


def test_optimize_afresh_from_many_threads_traces_once_per_shape():
    """Core (_api): `optimize(f)` called afresh from many threads at once could make several
    jitted wrappers (check-then-insert race in the wrapper cache), each tracing again.
    Fixed: the first wrapper inserted wins and every caller gets it."""
    import concurrent.futures as cf
    import threading

    calls = []

    def f(x):
        calls.append(1)
        return x * 3 + 1

    barrier = threading.Barrier(8)

    def worker(t):
        barrier.wait()
        return jaxrewrite.optimize(f)(jnp.ones(3))

    with cf.ThreadPoolExecutor(8) as pool:
        outs = list(pool.map(worker, range(8)))
    assert len(calls) == 1
    for out in outs:
        assert_bitwise_equal(out, jax.jit(lambda x: x * 3 + 1)(jnp.ones(3)))


def _scan_over_stacked_rows(x):
    """Found by fuzzing (reduced): a scan over `stack([x, 2x, x[::-1]])`."""
    def step(c, row):
        v = c + row
        c = jnp.maximum(v, v * v)
        return c, c.sum()

    c, ys = lax.scan(step, x, jnp.stack([x, x * 2, x[::-1]]))
    return c + ys.sum()


_X23 = jnp.asarray(np.random.RandomState(22).uniform(-2, 2, (2, 3)), jnp.float32)


def test_scalarize_keeps_gradients_equal():
    """passes/scalarize.py (found by fuzzing; fixed by the pass's owner the same day): splitting
    x (f32[2,3]) into rows changed the order of its cotangent sums, so the gradient differed
    from jax.jit's by 1 ulp (-19285.357 vs -19285.355 at [1, 1])."""
    assert_equivalent(_scan_over_stacked_rows, _X23, scalarize=True, strict=True)


def test_scan_over_stacked_rows_without_scalarize():
    """The control: every other rewrite keeps this program's gradients exact."""
    assert_equivalent(_scan_over_stacked_rows, _X23, scalarize=False, strict=True)


def test_scalarize_reaches_a_fixed_point():
    """passes/scalarize.py (found here; fixed by the pass's owner the same day): on its own
    output the pass applied again (one more unstack/stack join per round, same structure) and
    reported changed=True, so the pipeline always ran max_rounds rounds."""
    cj = jax.make_jaxpr(_scan_over_stacked_rows)(_X23)
    res = jaxrewrite.rewrite_jaxpr_with_report(cj, scalarize=True, max_rounds=8)
    assert res.report.counts["pipeline.rounds"] < 8, dict(res.report.counts)


def _scatter_add_then_reuse(x):
    """Found by fuzzing (reduced): a static-index scatter-add whose operand is used again."""
    l = x.at[np.array([2, 3])].add(x[:2])
    return (x[::-1] * l * 1000).sum() * l


_X4 = jnp.asarray(np.random.RandomState(21).uniform(-2, 2, (4,)), jnp.float32)


def test_static_scatter_add_keeps_gradients_equal():
    """passes/gathers.py (found by fuzzing; fixed by the pass's owner the same day): the static
    scatter-add became broadcast + add + select_n, using the operand more often; its cotangents
    were summed in another order and the gradient differed by 1 ulp (31304.199 vs 31304.197)."""
    assert_equivalent(_scatter_add_then_reuse, _X4, strict=True)


def test_static_scatter_add_gradients_within_two_ulps_and_forward_exact():
    """The weaker form tests/test_fuzz.py checks by default (a few ulps for gradients)."""
    assert_equivalent(_scatter_add_then_reuse, _X4, grad=False, strict=True)
    g_opt = jax.grad(lambda v: jaxrewrite.optimize(_scatter_add_then_reuse)(v).sum())(_X4)
    g_ref = jax.grad(lambda v: jax.jit(_scatter_add_then_reuse)(v).sum())(_X4)
    np.testing.assert_array_max_ulp(np.asarray(g_opt), np.asarray(g_ref), maxulp=2)


def test_float_static_scatter_add_stays_bit_exact_when_compiled():
    """Found by the long fuzz run: `x.at[idx].add(v) + x` rewritten as
    `x + select(hit, moved, -0.0) + x` came out one ulp apart from jax.jit once XLA:CPU compiled
    it; floating scatter-add is now kept as a scatter."""
    from jaxrewrite.strategies import Op, Program

    prog = Program(shape=(4, 4), ops=(Op("abs", 0, 0, 0), Op("abs", 0, 0, 0), Op("abs", 0, 0, 0),
                                      Op("static_scatter", 0, 0, 65), Op("add", 0, 1, 0)),
                   index=0, outputs=1)
    assert_equivalent(prog.fn, *prog.args, grad=False)


def test_gathers_all_decline_past_split_size_does_not_promise_it():
    """Issue 13: with gathers='all' past SPLIT_MAX_ELEMENTS the decline said "(gathers='all'
    allows it)". It names the size limit instead (fixed in passes/gathers.py)."""
    from jaxrewrite._api import rewrite_jaxpr_with_report
    from jaxrewrite.analysis.indexmap import SPLIT_MAX_ELEMENTS
    perm = np.array([3, 0, 2, 1, 5, 4, 7, 6])
    f = jax.vmap(lambda x: jnp.take(x, perm) + 1)
    x = jnp.zeros((SPLIT_MAX_ELEMENTS // 8 + 1, 8), jnp.uint32)
    for gathers in (True, "all"):
        res = rewrite_jaxpr_with_report(jax.make_jaxpr(f)(x), gathers=gathers, scalarize=False)
        why = [d.reason for d in res.report.declines if d.pass_name == "gathers"]
        assert why and all("allows it" not in w and str(SPLIT_MAX_ELEMENTS) in w for w in why)


def test_flatten_keeps_a_loop_rolled_when_scalarize_declines_the_unrolled_body():
    """Found by tests/test_never_worse.py's long run (shrunk): a 4x4 ARX round in a `fori_loop`
    of 2 trips, 1,024 blocks. flatten unrolls it (~4 launches rolled, ~1 unrolled) because a
    small axis of the carry is permuted; scalarize then declines the unrolled level (2
    permutations, 1 re-join: no gain on the CPU), so the program keeps both gathers, unrolled:
    2.3x jax.jit's run time (paired medians, re-measured). Rolled is what jax.jit runs."""
    from jaxrewrite import strategies as S
    from jaxrewrite._api import rewrite_jaxpr_with_report
    r = S.ArxRecipe(shape=(4, 4), rounds=2, batch=1024, message=False, fanout=1, quarter=False,
                    undo=False, out="state", wrap="fori")
    res = rewrite_jaxpr_with_report(jax.make_jaxpr(r.fn)(*r.args), target="cpu")
    split = any(e.pass_name == "scalarize" for e in res.report.rewrites)
    assert split or "scan" in primitive_counts(res.jaxpr)


@pytest.mark.parametrize("n", [1, 64, 16384, 65536])
def test_blake2s_written_plainly_equals_hashlib(n):
    """Issue 38: BLAKE2s written from RFC 7693 (the message schedule as `m[SIGMA[r]]`, the
    diagonals with `jnp.take`, the counter and final flag with `v.at[12].set`/`v.at[14].set`),
    vmapped over messages and their lengths, made `optimize` raise at 16,384 messages: the
    literals pass emitted a uniform table's broadcast with a 1-d core and no dimensions. Every
    digest equals `hashlib.blake2s`'s, bit for bit jax.jit's, with no warning."""
    import os
    import sys
    import warnings
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bench"))
    import blake2s as B
    words, lengths, raw = B.messages(n, seed=n)
    args = (jnp.asarray(words), jnp.asarray(lengths))
    with warnings.catch_warnings():
        warnings.simplefilter("error")          # no fallback: the rewrite itself is right
        got = jaxrewrite.optimize(B.hash_all)(*args)
    assert_bitwise_equal(got, jax.jit(B.hash_all)(*args))
    assert B.matches_hashlib(got, raw)
