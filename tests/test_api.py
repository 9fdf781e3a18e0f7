"""The foundation contract (issue 2): `optimize` is a drop-in `jax.jit`, the walker reaches every
nested jaxpr, and what it leaves alone stays alone.

Walker checks use a small test pass (`sin` -> `cos`, built with the Emitter) appended to an
otherwise empty pipeline, so they pin the core and not any particular rewrite.
"""
import collections
import re
import inspect

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import jaxrewrite
from jaxrewrite import _compat as C
from jaxrewrite import _pipeline
from jaxrewrite import _walk as W
from jaxrewrite._options import NAMES, Options
from jaxrewrite.testing import assert_bitwise_equal, assert_equivalent, primitive_counts

# --- a test pass: every `sin` becomes `cos`, at every level --------------------------------------

SIN2COS = _pipeline.PassSpec("sin2cos", "dedup", True)
_NO_PASSES = dict(dedup=False, cse=False, fold=False, gathers=False, movement=False,
                  scalarize=False, reroll=False)


def _sin2cos_rule(eqn):
    if eqn.primitive is not lax.sin_p:
        return None
    em = W.Emitter(eqn)
    (y,) = em.call(jnp.cos, eqn.invars[0])
    return em.replacement([y])


def sin2cos(cj, ctx):
    changed = []

    def level(c):
        j, ch = W.rewrite_eqns(c.jaxpr, _sin2cos_rule)
        changed.append(ch)
        return C.closed(j, c.consts) if ch else c

    out = W.map_jaxprs(cj, level)
    return out, any(changed)


def rewrite_sin2cos(cj):
    return _pipeline.rewrite(cj, Options.make(**_NO_PASSES), extra_passes=((SIN2COS, sin2cos),))


def _eqns_named(cj, name):
    return [e for e in W.iter_eqns(cj) if e.primitive.name == name]


# --- the three call forms -------------------------------------------------------------------------

def _f(x, y):
    return jnp.sin(x) * y + 1


def test_decorator_bare():
    @jaxrewrite.optimize
    def f(x, y):
        return _f(x, y)

    assert_bitwise_equal(f(jnp.arange(3.0), 2.0), jax.jit(_f)(jnp.arange(3.0), 2.0))


def test_decorator_with_options():
    @jaxrewrite.optimize(dedup=False, cse=False)
    def f(x, y):
        return _f(x, y)

    assert_bitwise_equal(f(jnp.arange(3.0), 2.0), jax.jit(_f)(jnp.arange(3.0), 2.0))


def test_decorator_empty_parens_and_call_form():
    g = jaxrewrite.optimize()(_f)
    h = jaxrewrite.optimize(_f, cse=False, donate_argnums=())
    for fn in (g, h):
        assert_bitwise_equal(fn(jnp.arange(3.0), 2.0), jax.jit(_f)(jnp.arange(3.0), 2.0))


def test_every_option_is_accepted_by_every_entry_point():
    x = jnp.arange(4.0)
    for name in NAMES:
        kw = {name: Options().__getattribute__(name)}
        assert_bitwise_equal(jaxrewrite.optimize(_f, **kw)(x, 3.0), jax.jit(_f)(x, 3.0))
        cj = jaxrewrite.make_jaxpr(_f, **kw)(x, 3.0)
        C.check_jaxpr(cj)
        C.check_jaxpr(jaxrewrite.rewrite_jaxpr(jax.make_jaxpr(_f)(x, 3.0), **kw))


# --- pytrees, static and donated arguments ------------------------------------------------------

Pair = collections.namedtuple("Pair", "a b")


def test_pytrees_in_and_out():
    def f(d, p, *, scale):
        return {"s": d["x"] * scale + p.a, "t": (p.b, d["y"].sum())}

    args = ({"x": jnp.arange(3.0), "y": jnp.ones((2, 2))}, Pair(jnp.float32(2), jnp.arange(4)))
    out = jaxrewrite.optimize(f)(*args, scale=jnp.float32(3))
    assert_bitwise_equal(out, jax.jit(f)(*args, scale=jnp.float32(3)))
    assert_equivalent(lambda d, p: f(d, p, scale=2.0), *args, bitwise=True)


def test_static_argnums_and_argnames_keep_the_signature():
    def f(x, n, *, mode="add"):
        return x + n if mode == "add" else x * n

    g = jaxrewrite.optimize(f, static_argnums=1, static_argnames="mode")
    ref = jax.jit(f, static_argnums=1, static_argnames="mode")
    assert inspect.signature(g) == inspect.signature(f)
    x = jnp.arange(3.0)
    for n, mode in [(2, "add"), (3, "mul"), (2, "mul")]:
        assert_bitwise_equal(g(x, n, mode=mode), ref(x, n, mode=mode))


def test_static_argnames_given_positionally_resolve_through_the_signature():
    def f(x, n):
        return x * n

    g = jaxrewrite.optimize(f, static_argnames="n")
    ref = jax.jit(f, static_argnames="n")
    x = jnp.arange(3.0)
    assert_bitwise_equal(g(x, 4), ref(x, 4))
    assert_bitwise_equal(g(x, n=5), ref(x, n=5))
    # n is static: it is a Python int inside the function (a tracer would fail `range`)
    h = jaxrewrite.optimize(lambda x, n: sum(x * i for i in range(n)), static_argnames="n")
    assert_bitwise_equal(h(x, n=3), jax.jit(lambda x, n: sum(x * i for i in range(n)),
                                            static_argnames="n")(x, n=3))


def test_donate_argnums_matches_jax_jit():
    def f(x, y):
        return x * 2 + y

    g = jaxrewrite.optimize(f, donate_argnums=0)
    ref = jax.jit(f, donate_argnums=0)
    lo_g, lo_r = g.lower(jnp.ones(8), jnp.ones(8)), ref.lower(jnp.ones(8), jnp.ones(8))
    donated = lambda lo: [a.donated for a in jax.tree_util.tree_leaves(lo.args_info)]  # noqa: E731
    assert donated(lo_g) == donated(lo_r) == [True, False]
    x1, x2 = jnp.ones(8), jnp.ones(8)
    assert_bitwise_equal(g(x1, 1.0), ref(x2, 1.0))
    assert x1.is_deleted() == x2.is_deleted()


def _main_arity(lowered) -> int:
    """Number of parameters of the lowered module's entry function (structure, not text)."""
    module = lowered.compiler_ir("stablehlo")
    for op in module.body.operations:
        if op.operation.name == "func.func" and str(op.attributes["sym_name"]) == '"main"':
            return len(op.regions[0].blocks[0].arguments)
    raise AssertionError("no main function")


@pytest.mark.parametrize("keep_unused", [False, True])
def test_keep_unused_matches_jax_jit(keep_unused):
    def f(x, unused):
        return x + 1

    args = (jnp.ones(3), jnp.ones(5))
    got = _main_arity(jaxrewrite.optimize(f, keep_unused=keep_unused).lower(*args))
    want = _main_arity(jax.jit(f, keep_unused=keep_unused).lower(*args))
    assert got == want == (2 if keep_unused else 1)


def test_lower_trace_eval_shape():
    def f(x):
        return {"y": jnp.sin(x).sum(0), "z": x.astype(jnp.int32)}

    x = jnp.ones((3, 4))
    g, ref = jaxrewrite.optimize(f), jax.jit(f)
    assert g.eval_shape(x) == ref.eval_shape(x)
    traced = g.trace(x)
    assert traced.out_info == ref.trace(x).out_info
    assert isinstance(traced.jaxpr, C.ClosedJaxpr)
    lowered = g.lower(x)
    assert lowered.out_info == ref.lower(x).out_info
    compiled = lowered.compile()
    assert_bitwise_equal(compiled(x), ref(x))


# --- caching --------------------------------------------------------------------------------------

def test_second_call_with_same_shapes_does_not_trace_again():
    traces = []

    def f(x):
        traces.append(jax.typeof(x).shape)
        return x * 2

    g = jaxrewrite.optimize(f)
    g(jnp.ones(3))
    g(jnp.zeros(3))
    assert len(traces) == 1
    g(jnp.ones(4))
    assert len(traces) == 2
    g(jnp.ones(4, jnp.int32))  # dtype changes the trace
    assert len(traces) == 3
    g(jnp.ones(3))
    assert len(traces) == 3


def test_weak_type_changes_the_trace_like_jax_jit():
    counts = {"opt": 0, "jit": 0}

    def make(key):
        def f(x):
            counts[key] += 1
            return x + 1
        return f

    g, ref = jaxrewrite.optimize(make("opt")), jax.jit(make("jit"))
    for a in (1.0, jnp.float32(1), 2.0, jnp.float32(3)):
        assert_bitwise_equal(g(a), ref(a))
    assert counts["opt"] == counts["jit"] == 2


def test_optimize_afresh_returns_the_same_wrapper_and_does_not_retrace():
    traces = []

    def f(x):
        traces.append(1)
        return x + 1

    a = jaxrewrite.optimize(f)
    assert jaxrewrite.optimize(f) is a
    assert jaxrewrite.optimize(f, cse=False) is not a
    assert jaxrewrite.optimize(f, cse=False) is jaxrewrite.optimize(f, cse=False)
    assert jaxrewrite.optimize(f, static_argnums=()) is jaxrewrite.optimize(f, static_argnums=())
    for _ in range(3):
        jaxrewrite.optimize(f)(jnp.ones(2))  # the training-loop habit
    assert len(traces) == 1


def test_wrapper_cache_key_is_weak():
    """A function that dies leaves no entry that a new function at the same address could hit."""
    import gc

    for k in range(20):  # fresh lambdas, each optimized once (ids get reused)
        g = eval(f"lambda x: x * {k}")  # noqa: S307 - a distinct body per iteration
        assert_bitwise_equal(jaxrewrite.optimize(g)(2.0), jax.jit(g)(2.0))
        del g
        gc.collect()


def test_wrapper_cache_does_not_keep_the_function_alive():
    import gc
    import weakref

    def make():
        big = np.zeros(1000, np.float32)
        return lambda x: x + big.sum()

    f = make()
    jaxrewrite.optimize(f)(1.0)
    ref = weakref.ref(f)
    del f
    gc.collect()
    assert ref() is None


def test_x64_mode_is_part_of_the_cache_key():
    def f(x):
        return jnp.arange(3) + x

    a = jaxrewrite.optimize(f)
    with C.enable_x64(True):
        b = jaxrewrite.optimize(f)
        assert b is not a
        assert_bitwise_equal(b(1), jax.jit(f)(1))
    assert_bitwise_equal(a(1), jax.jit(f)(1))


# --- bad input --------------------------------------------------------------------------------------

def test_unknown_keyword_is_a_type_error_listing_the_options():
    for call in (lambda: jaxrewrite.optimize(_f, dedupe=True),
                 lambda: jaxrewrite.optimize(dedupe=True),
                 lambda: jaxrewrite.optimize(_f, static_argnum=1)):
        with pytest.raises(TypeError) as info:
            call()
        for name in ("dedup", "cse", "fold"):
            assert name in str(info.value)
    with pytest.raises(TypeError, match="dedup"):
        jaxrewrite.rewrite_jaxpr(jax.make_jaxpr(_f)(1.0, 2.0), bogus=1)
    with pytest.raises(TypeError, match="dedup"):
        jaxrewrite.make_jaxpr(_f, bogus=1)


@pytest.mark.parametrize("bad", [3, "f", None.__class__, [1]], ids=["int", "str", "type", "list"])
def test_non_callable_is_a_type_error(bad):
    if callable(bad):
        bad = object()
    with pytest.raises(TypeError):
        jaxrewrite.optimize(bad)
    with pytest.raises(TypeError):
        jaxrewrite.make_jaxpr(bad)
    with pytest.raises(TypeError):
        jaxrewrite.rewrite_jaxpr(bad)


def _same_error(call_ref, call_opt):
    with pytest.raises(Exception) as want:
        call_ref()
    with pytest.raises(Exception) as got:
        call_opt()
    assert type(got.value) is type(want.value)
    # the message names the function object; only its address may differ
    hexaddr = lambda e: re.sub(r"0x[0-9a-f]+", "0x?", str(e))  # noqa: E731
    assert hexaddr(got.value) == hexaddr(want.value)


@pytest.mark.parametrize("case", ["str_arg", "unhashable_static", "too_many_args",
                                  "shape_error", "bad_static_argnum", "bool_conversion"])
def test_arguments_jax_jit_rejects_give_jax_jits_error(case):
    def f(x, y=1):
        return x + y

    def g(x):
        return jnp.ones(3) + jnp.ones(4) + x

    def h(x):
        return 1 if x > 0 else 0

    calls = {
        "str_arg": (f, {}, ("a",)),
        "unhashable_static": (f, dict(static_argnums=1), (1.0, [1, 2])),
        "too_many_args": (f, {}, (1.0, 2.0, 3.0)),
        "shape_error": (g, {}, (1.0,)),
        "bad_static_argnum": (f, dict(static_argnames="z"), (1.0,)),
        "bool_conversion": (h, {}, (1.0,)),
    }
    fn, kw, args = calls[case]
    _same_error(lambda: jax.jit(fn, **kw)(*args), lambda: jaxrewrite.optimize(fn, **kw)(*args))


# --- rewrite_jaxpr / make_jaxpr ------------------------------------------------------------------

def test_rewrite_jaxpr_and_make_jaxpr_show_a_runnable_program():
    def f(x, n):
        return jnp.sin(x)[::n] * 2

    x = jnp.arange(6.0)
    cj = jax.make_jaxpr(f, static_argnums=1)(x, 2)
    out = jaxrewrite.rewrite_jaxpr(cj)
    assert isinstance(out, C.ClosedJaxpr)
    C.check_jaxpr(out)
    assert_bitwise_equal(C.eval_jaxpr(out, x), C.eval_jaxpr(cj, x))
    shown = jaxrewrite.make_jaxpr(f, static_argnums=1)(x, 2)
    assert isinstance(shown, C.ClosedJaxpr)
    assert [v.aval for v in shown.jaxpr.outvars] == [v.aval for v in cj.jaxpr.outvars]
    res = jaxrewrite.rewrite_jaxpr_with_report(cj)
    assert res.jaxpr is not None and not res.fell_back
    assert res.report.stats["eqns_before"] >= res.report.stats["eqns_after"] >= 1


def test_rewrite_is_idempotent_in_structure():
    def f(x):
        y = jax.jit(lambda v: v * 2)(x)
        return jnp.sin(y) + jax.jit(lambda v: v * 2)(x)

    cj = jax.make_jaxpr(f)(jnp.ones(3))
    once = jaxrewrite.rewrite_jaxpr(cj)
    twice = jaxrewrite.rewrite_jaxpr(once)
    assert primitive_counts(once) == primitive_counts(twice)


# --- the walker: every nested jaxpr is reached, and what must stay stays --------------------------

def test_walker_reaches_jit_cond_while_scan():
    inner = jax.jit(lambda y: jnp.sin(y) + 1)

    def f(x, i):
        c, _ = lax.scan(lambda c, _: (jnp.sin(c), None), x, None, length=2)
        c = lax.cond(i > 0, lambda y: jnp.sin(y) * 2, lambda y: -y, c)
        c = lax.while_loop(lambda s: (s[0] < 3) & (jnp.sin(s[1]).sum() < 100.0),
                           lambda s: (s[0] + 1, inner(s[1])), (0, c))[1]
        return c

    args = (jnp.arange(3.0), 1)
    cj = jax.make_jaxpr(f)(*args)
    res = rewrite_sin2cos(cj)
    assert res.changed and not res.fell_back
    assert "sin" in primitive_counts(cj)
    assert "sin" not in primitive_counts(res.jaxpr)
    C.check_jaxpr(res.jaxpr)

    def g(x, i):  # the same program, written with cos
        c, _ = lax.scan(lambda c, _: (jnp.cos(c), None), x, None, length=2)
        c = lax.cond(i > 0, lambda y: jnp.cos(y) * 2, lambda y: -y, c)
        inner_c = jax.jit(lambda y: jnp.cos(y) + 1)
        c = lax.while_loop(lambda s: (s[0] < 3) & (jnp.cos(s[1]).sum() < 100.0),
                           lambda s: (s[0] + 1, inner_c(s[1])), (0, c))[1]
        return c

    assert_bitwise_equal(jax.jit(lambda *a: C.eval_jaxpr(res.jaxpr, *a))(*args),
                         [jax.jit(g)(*args)])


def test_walker_custom_jvp_rewrites_primal_and_keeps_the_jvp_rule():
    @jax.custom_jvp
    def h(x):
        return jnp.sin(x)

    h.defjvp(lambda p, t: (h(p[0]), 7.0 * t[0]))

    cj = jax.make_jaxpr(h)(1.0)
    res = rewrite_sin2cos(cj)
    (eqn,) = _eqns_named(res.jaxpr, "custom_jvp_call")
    (orig,) = _eqns_named(cj, "custom_jvp_call")
    assert eqn.params["jvp_jaxpr_fun"] is orig.params["jvp_jaxpr_fun"]
    assert "sin" not in primitive_counts(res.jaxpr)
    run = lambda x: C.eval_jaxpr(res.jaxpr, x)[0]  # noqa: E731
    assert run(1.0) == np.cos(np.float32(1.0))
    assert jax.grad(run)(1.0) == 7.0  # the user's rule, not the derivative of cos
    assert_equivalent(h, jnp.float32(0.5), bitwise=True)


def test_walker_custom_vjp_rewrites_primal_and_keeps_fwd_bwd():
    @jax.custom_vjp
    def h(x):
        return jnp.sin(x)

    h.defvjp(lambda x: (jnp.sin(x), x), lambda r, g: (5.0 * g,))

    cj = jax.make_jaxpr(h)(1.0)
    res = rewrite_sin2cos(cj)
    (eqn,) = _eqns_named(res.jaxpr, "custom_vjp_call")
    (orig,) = _eqns_named(cj, "custom_vjp_call")
    for k, v in orig.params.items():
        if not isinstance(v, (C.ClosedJaxpr, C.Jaxpr)):
            assert eqn.params[k] is v, k
    run = lambda x: C.eval_jaxpr(res.jaxpr, x)[0]  # noqa: E731
    assert run(1.0) == np.cos(np.float32(1.0))
    assert jax.grad(run)(1.0) == 5.0
    assert_equivalent(h, jnp.float32(0.5), bitwise=True)


@pytest.mark.parametrize("prevent_cse", [True, False])
def test_walker_checkpoint_keeps_prevent_cse_and_policy(prevent_cse):
    policy = jax.checkpoint_policies.dots_with_no_batch_dims_saveable

    def f(x):
        return jax.checkpoint(lambda y: jnp.sin(y) @ y, prevent_cse=prevent_cse, policy=policy)(x)

    x = jnp.ones((3, 3))
    cj = jax.make_jaxpr(f)(x)
    res = rewrite_sin2cos(cj)
    (orig,) = _eqns_named(cj, C.remat_p.name)
    (eqn,) = _eqns_named(res.jaxpr, C.remat_p.name)
    assert eqn.params["prevent_cse"] is prevent_cse
    assert eqn.params["policy"] is orig.params["policy"]
    assert isinstance(eqn.params["jaxpr"], C.Jaxpr)
    assert "sin" not in primitive_counts(res.jaxpr)
    assert_equivalent(f, x, bitwise=True)


def test_walker_closed_call():
    body = jax.make_jaxpr(lambda y: jnp.sin(y) * 3)(1.0)
    outer = jax.make_jaxpr(lambda y: y + 1)(1.0)  # y + 1, then a closed_call on its result
    (add,) = outer.jaxpr.eqns
    out = C.new_var(body.out_avals[0])
    call = C.new_eqn(list(add.outvars), [out], C.closed_call_p, dict(call_jaxpr=body),
                     body.effects, add.source_info, add.ctx)
    cj = C.closed(C.replace_jaxpr(outer.jaxpr, eqns=[add, call], outvars=[out]), outer.consts)
    C.check_jaxpr(cj)
    res = rewrite_sin2cos(cj)
    assert primitive_counts(res.jaxpr) == {"add": 1, "closed_call": 1, "cos": 1, "mul": 1}
    assert C.eval_jaxpr(res.jaxpr, 1.0)[0] == np.cos(np.float32(2.0)) * 3


def test_walker_shard_map_body():
    from jax.sharding import PartitionSpec as P

    mesh = jax.make_mesh((1,), ("i",), axis_types=(jax.sharding.AxisType.Auto,))

    def f(x):
        return jax.shard_map(lambda y: jnp.sin(y) * 2, mesh=mesh, in_specs=P("i"),
                             out_specs=P("i"))(x)

    x = jnp.arange(4.0)
    cj = jax.make_jaxpr(f)(x)
    assert "shard_map" in primitive_counts(cj)
    res = rewrite_sin2cos(cj)
    assert "sin" not in primitive_counts(res.jaxpr)
    C.check_jaxpr(res.jaxpr)
    np.testing.assert_array_equal(jax.jit(lambda a: C.eval_jaxpr(res.jaxpr, a)[0])(x),
                                  jnp.cos(x) * 2)
    assert_equivalent(f, x, bitwise=True)


def test_pallas_call_passes_through_unchanged():
    pl = pytest.importorskip("jax.experimental.pallas")

    def kernel(x_ref, o_ref):
        o_ref[...] = jnp.sin(x_ref[...])

    def f(x):
        return pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
                              interpret=True)(x) + jnp.sin(x)

    x = jnp.arange(8.0)
    cj = jax.make_jaxpr(f)(x)
    res = rewrite_sin2cos(cj)
    (orig,) = _eqns_named(cj, "pallas_call")
    (eqn,) = _eqns_named(res.jaxpr, "pallas_call")
    assert eqn is orig  # the kernel (which has a sin) is not touched
    assert [e.primitive.name for e in res.jaxpr.jaxpr.eqns].count("sin") == 0
    assert_equivalent(f, x, grad=False, vmap=False, bitwise=True)


def test_unknown_primitive_passes_through():
    from jax.interpreters import mlir

    twice_p = C.Primitive("jaxrewrite_test_twice")
    twice_p.def_abstract_eval(lambda a: a)
    twice_p.def_impl(lambda a: a * 2)
    mlir.register_lowering(twice_p, mlir.lower_fun(lambda a: a * 2, multiple_results=False))

    def f(x):
        return twice_p.bind(jnp.sin(x)) + 1

    x = jnp.arange(3.0)
    cj = jax.make_jaxpr(f)(x)
    res = rewrite_sin2cos(cj)
    (eqn,) = _eqns_named(res.jaxpr, "jaxrewrite_test_twice")
    assert eqn.params == {}
    assert_equivalent(f, x, grad=False, vmap=False, bitwise=True)


def test_rewritten_equations_keep_the_users_source_line():
    def f(x):
        return jnp.sin(x) * 2  # THE-LINE

    line = next(i for i, s in enumerate(inspect.getsource(f).splitlines()) if "THE-LINE" in s)
    want = f"test_api.py:{f.__code__.co_firstlineno + line}"
    cj = jax.make_jaxpr(jax.jit(f))(jnp.ones(2))  # also through a nested jit
    res = rewrite_sin2cos(cj)
    (cos,) = _eqns_named(res.jaxpr, "cos")
    (sin,) = _eqns_named(cj, "sin")
    assert C.user_location(sin) == want
    assert C.user_location(cos) == want


def test_jit_per_argument_params_stay_in_step():
    def f(x, y, z):
        return jax.jit(lambda a, b, c: a * 2 + c, donate_argnums=(0,), keep_unused=True)(x, y, z)

    cj = jax.make_jaxpr(f)(jnp.ones(2), jnp.ones(3), jnp.ones(2))
    (eqn,) = _eqns_named(cj, "jit")
    params = C.jit_params_for_args(eqn.params, keep_in=[True, False, True])
    for k in C.JIT_PER_ARG_PARAMS:
        assert len(params[k]) == 2, k
    assert params["donated_invars"] == (True, False)
    params = C.jit_params_append_args(params, 2)
    for k in C.JIT_PER_ARG_PARAMS:
        assert len(params[k]) == 4, k
    assert params["donated_invars"] == (True, False, False, False)
    # the pipeline's own rewrites of jit equations keep them in step (every level checked)
    out = jaxrewrite.rewrite_jaxpr(cj)
    for e in W.iter_eqns(out):
        if C.is_jit(e):
            for k in C.JIT_PER_ARG_PARAMS:
                assert len(e.params[k]) == len(e.invars), k
            for k in C.JIT_PER_OUT_PARAMS:
                assert len(e.params[k]) == len(e.outvars), k
    C.check_jaxpr(out)


def test_wrappers_of_wrapped_functions_are_not_shared():
    # jax.grad copies f.__dict__ (functools.wraps) into its result: the wrapper store must not
    # travel with it, or optimize(jax.grad(f)) would return optimize(f).
    def f(w):
        return (w * w).sum()

    g = jax.grad(f)
    of, og = jaxrewrite.optimize(f), jaxrewrite.optimize(g)
    assert of is not og
    w = jnp.arange(3.0)
    assert_bitwise_equal(og(w), jax.jit(g)(w))
    assert_bitwise_equal(of(w), jax.jit(f)(w))
    assert jaxrewrite.optimize(g) is og


def test_optimized_program_in_jits_trace_keeps_lines_names_and_effects():
    """The rewritten jaxpr is emitted into jax.jit's trace equation by equation (not re-bound):
    each equation keeps its source line and name stack, and effects stay in order."""
    def f(x):
        with jax.named_scope("block"):
            y = jnp.sin(x) * 2  # THE-LINE
        jax.debug.print("y={}", y, ordered=True)
        return y

    line = next(i for i, s in enumerate(inspect.getsource(f).splitlines()) if "THE-LINE" in s)
    want = f"test_api.py:{f.__code__.co_firstlineno + line}"
    x = jnp.ones(2)
    outer = jaxrewrite.optimize(f).trace(x).jaxpr
    ref = jax.jit(f).trace(x).jaxpr
    (sin,) = _eqns_named(outer, "sin")
    (ref_sin,) = _eqns_named(ref, "sin")
    assert C.user_location(sin) == want
    assert sin.source_info.name_stack == ref_sin.source_info.name_stack
    assert outer.effects == ref.effects
    assert [e.primitive.name for e in outer.jaxpr.eqns if e.effects] == \
        [e.primitive.name for e in ref.jaxpr.eqns if e.effects]


@pytest.mark.skipif(C.has_jit_trace_hook(), reason="this JAX has the hook: tests/test_switch.py")
def test_switch_on_a_jax_without_its_hook_says_so_and_changes_nothing():
    """On JAX older than 0.9 (the declared floor, 0.7.0) the switch has no jit trace to hook:
    `enable()` raises, naming the version it needs, and jax.jit runs as it did."""
    with pytest.raises(RuntimeError, match=r"needs jax >= 0\.9"):
        jaxrewrite.enable()
    assert not jaxrewrite.is_enabled()
    x = jnp.arange(4.0)
    assert_bitwise_equal(jax.jit(lambda x: x[::-1] * 2)(x), x[::-1] * 2)
    assert_bitwise_equal(jaxrewrite.optimize(lambda x: x[::-1] * 2)(x), x[::-1] * 2)
