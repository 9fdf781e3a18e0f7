"""The walker and the one-level rewriting tools (structure, never text)."""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from jaxrewrite import _compat as C
from jaxrewrite import _walk as W
from jaxrewrite.testing import primitive_counts


def _nested_program(x, i):
    inner = jax.jit(lambda y: jnp.sin(y) + 1)

    def body(c, _):
        return inner(c), None

    c, _ = lax.scan(body, x, None, length=2)
    c = lax.cond(i > 0, lambda y: inner(y) * 2, lambda y: -y, c)
    c = lax.while_loop(lambda s: s[0] < 3, lambda s: (s[0] + 1, inner(s[1])), (0, c))[1]
    c = jax.checkpoint(lambda y: inner(y) * 3)(c)

    @jax.custom_jvp
    def g(y):
        return inner(y) - 1

    g.defjvp(lambda p, t: (g(p[0]), t[0]))
    c = g(c)
    return c


def test_map_jaxprs_reaches_every_level():
    cj = jax.make_jaxpr(_nested_program)(jnp.ones(3), 1)
    seen = []

    def visit(c):
        seen.extend(e.primitive.name for e in c.jaxpr.eqns)
        return c

    out = W.map_jaxprs(cj, visit)
    assert out is cj  # identity function: nothing rebuilt
    # every sin lives inside the shared inner jit; reached through scan, cond, while, remat, custom_jvp
    parents = {"scan", "cond", "while", "checkpoint", "remat2", "custom_jvp_call", "jit"}
    assert parents & set(seen) >= {"scan", "cond", "while", "custom_jvp_call", "jit"}
    assert "sin" in seen


def test_shared_inner_jaxpr_is_rewritten_once_and_stays_shared():
    inner = jax.jit(lambda y: jnp.cos(y))

    def f(x):
        return inner(inner(x))

    cj = jax.make_jaxpr(f)(jnp.ones(2))
    calls = []

    def swap_cos_for_sin(c):
        calls.append(c)
        eqns = [e.replace(primitive=lax.sin_p) if e.primitive is lax.cos_p else e for e in c.jaxpr.eqns]
        return C.closed(C.replace_jaxpr(c.jaxpr, eqns=eqns), c.consts)

    out = W.map_jaxprs(cj, swap_cos_for_sin)
    j1, j2 = (e.params["jaxpr"] for e in out.jaxpr.eqns)
    assert j1 is j2
    assert len(calls) == 2  # the inner jaxpr once, the outer once
    assert primitive_counts(out) == {"jit": 2, "sin": 1}
    np.testing.assert_array_equal(C.eval_jaxpr(out, jnp.ones(2))[0], jnp.sin(jnp.sin(jnp.ones(2))))


def test_rewrite_eqns_substitutes_downstream():
    def f(x):
        return jnp.negative(jnp.negative(x)) * 2

    cj = jax.make_jaxpr(f)(jnp.ones(3))

    def rule(eqn):
        # neg(neg(y)) -> y, by forwarding the outer neg's output to the inner operand
        if eqn.primitive is lax.neg_p and eqn.invars[0] in producers:
            return W.forward(eqn, producers[eqn.invars[0]].invars)
        if eqn.primitive is lax.neg_p:
            producers[eqn.outvars[0]] = eqn
        return None

    producers = {}
    j, changed = W.rewrite_eqns(cj.jaxpr, rule)
    assert changed
    j, dced = W.dce(j)
    assert dced
    assert [e.primitive.name for e in j.eqns] == ["mul"]
    C.check_jaxpr(j)


def test_emitter_builds_equations_with_source_info_and_literal_constants():
    def f(x):
        return jnp.sin(x)

    cj = jax.make_jaxpr(f)(jnp.arange(4.0))
    eqn = cj.jaxpr.eqns[0]
    em = W.Emitter(eqn)
    (y,) = em.call(lambda v: lax.rev(v, (0,)) + np.arange(4, dtype=np.float32), eqn.invars[0])
    rep = em.replacement([y])
    assert {e.primitive.name for e in rep.eqns} == {"rev", "add"}
    assert all(e.source_info is eqn.source_info for e in rep.eqns)
    assert not any(isinstance(a, C.Var) and a not in (eqn.invars[0],) and a not in
                   [o for e in rep.eqns for o in e.outvars] for e in rep.eqns for a in e.invars)
    j, _ = W.rewrite_eqns(cj.jaxpr, lambda e: rep if e is eqn else None)
    C.check_jaxpr(j)
    out = C.eval_jaxpr(C.closed(j, cj.consts), jnp.arange(4.0))[0]
    np.testing.assert_array_equal(out, jnp.arange(4.0)[::-1] + jnp.arange(4.0))


def test_dce_keeps_effects_and_signature():
    def f(x, unused):
        jax.debug.print("x={x}", x=x)
        _ = x * 3  # dead
        return x + 1

    cj = jax.make_jaxpr(f)(1.0, 2.0)
    j, changed = W.dce(cj.jaxpr)
    assert changed
    assert len(j.invars) == 2
    assert [e.primitive.name for e in j.eqns] == ["debug_print", "add"]


def test_literalize_consts_keeps_tracers_and_big_constants():
    big = np.arange(100, dtype=np.int32)
    small = np.array([2, 0, 1], np.int32)

    def f(x):
        return x[small].sum() + (big * x[0]).sum()

    cj = jax.make_jaxpr(f)(jnp.arange(3.0))
    out = W.literalize_consts(cj, max_size=10)
    assert [np.shape(c) for c in out.consts] == [(100,)]  # only the big one stays a constvar
    assert len(cj.consts) >= 2
    C.check_jaxpr(out)
    np.testing.assert_array_equal(C.eval_jaxpr(out, jnp.arange(3.0))[0], jax.jit(f)(jnp.arange(3.0)))


def test_open_jaxprs_stay_open():
    def f(x):
        return jax.checkpoint(lambda y: jnp.sin(y) * 2)(x)

    cj = jax.make_jaxpr(f)(1.0)
    out = W.map_jaxprs(cj, lambda c: C.closed(C.replace_jaxpr(c.jaxpr, eqns=list(c.jaxpr.eqns)), c.consts))
    remat = out.jaxpr.eqns[0]
    assert isinstance(remat.params["jaxpr"], C.Jaxpr)
    C.check_jaxpr(out)


@pytest.mark.parametrize("n", [1, 50])
def test_iter_eqns_counts_each_distinct_jaxpr_once(n):
    inner = jax.jit(lambda y: y * 2)
    fresh = [jax.jit(functools.partial(lambda k, y: y * 2, k)) for k in range(n)]

    def f(x):
        for _ in range(n):
            x = inner(x)
        for g in fresh:
            x = g(x)
        return x

    cj = jax.make_jaxpr(f)(1.0)
    counts = primitive_counts(cj)
    assert counts["jit"] == 2 * n
    assert counts["mul"] == 1 + n  # the shared body once, each fresh body once


def test_nested_only_leaves_the_program_itself_to_the_caller():
    inner = jax.jit(lambda y: jnp.cos(y))
    cj = jax.make_jaxpr(lambda x: jnp.sin(inner(x)))(jnp.ones(2))
    calls = []

    def cos_to_sin(c):
        calls.append(c)
        eqns = [e.replace(primitive=lax.sin_p) if e.primitive is lax.cos_p else e
                for e in c.jaxpr.eqns]
        return C.closed(C.replace_jaxpr(c.jaxpr, eqns=eqns), c.consts)

    out = W.map_jaxprs(cj, cos_to_sin, nested_only=True)
    assert len(calls) == 1 and calls[0] is not cj  # only the inner jaxpr
    assert out is not cj and primitive_counts(out) == {"jit": 1, "sin": 2}
    assert W.map_jaxprs(cj, lambda c: c, nested_only=True) is cj  # nothing rebuilt


def test_has_subjaxprs_agrees_with_params_jaxprs():
    cj = jax.make_jaxpr(_nested_program)(jnp.ones(3), 1)
    eqns = list(W.iter_eqns(cj))
    assert any(W.has_subjaxprs(e) for e in eqns) and not all(W.has_subjaxprs(e) for e in eqns)
    for e in eqns:
        assert W.has_subjaxprs(e) == any(True for _ in C.params_jaxprs(e.params))


def test_flat_primitives_hold_no_jaxprs():
    """`_FLAT_PRIMITIVES` spares the params scan: every equation of such a primitive, in a
    gradient that uses many of them, holds no jaxpr in its params."""
    def f(x, w):
        h = jnp.tanh(x @ w) * jax.nn.sigmoid(x) + jnp.exp(-x ** 2)
        h = jnp.concatenate([h, jnp.cumsum(h, axis=0)], axis=1)[:, ::-1]
        h = jnp.where(h > 0, jnp.sqrt(jnp.abs(h)), lax.rsqrt(1 + h * h))
        return jnp.sum(h.T.reshape(-1)) + jnp.max(h) + jnp.argmax(h).astype(h.dtype)

    x, w = jnp.ones((4, 4)), jnp.ones((4, 4))
    cj = jax.make_jaxpr(jax.grad(f, argnums=(0, 1)))(x, w)
    flat = [e for e in W.iter_eqns(cj) if e.primitive.name in W._FLAT_PRIMITIVES]
    assert len({e.primitive.name for e in flat}) >= 15
    for e in flat:
        assert not any(True for _ in C.params_jaxprs(e.params)), e.primitive.name
