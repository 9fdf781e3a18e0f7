"""Structural identity (`analysis.structural`) and the dedup pass: identical inner jaxprs become
one."""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from jax.experimental import io_callback

import jaxrewrite
from jaxrewrite import _compat as C
from jaxrewrite.analysis import structural as S
from jaxrewrite import _walk as W
from jaxrewrite._options import Options
from jaxrewrite._pipeline import Context
from jaxrewrite.report.records import Report
from jaxrewrite.passes import dedup
from jaxrewrite.testing import assert_equivalent


def _ctx(**opts):
    return Context(Options.make(**opts), Report())


def _jit_bodies(cj):
    return {id(e.params["jaxpr"]) for e in W.iter_eqns(cj) if C.is_jit(e)}


def _mlir_functions(lowered) -> int:
    """`func.func` operations in the lowered module, found by walking the MLIR operations."""
    module = lowered.compiler_ir()
    return sum(1 for op in module.body.operations if op.operation.name == "func.func")


def _body(s):
    for _ in range(8):
        s = jnp.sin(s) * 1.5 + s
    return s


# --- structural keys ---------------------------------------------------------------------------

def _jaxpr(f, *args):
    return jax.make_jaxpr(f)(*args)


def test_key_is_invariant_under_renaming():
    a = _jaxpr(lambda x, y: jnp.sin(x) * y, jnp.ones(3), jnp.ones(3))
    b = _jaxpr(lambda u, v: jnp.sin(u) * v, jnp.ones(3), jnp.ones(3))
    assert a is not b and a.jaxpr.invars[0] is not b.jaxpr.invars[0]
    assert S.same_structure(a, b)
    assert hash(S.structural_key(a)) == hash(S.structural_key(b))


@pytest.mark.parametrize("f, g", [
    (lambda x: x * 2.0, lambda x: x * 3.0),                       # literal value
    (lambda x: x + 0.0, lambda x: x + -0.0),                      # literal bits: -0.0
    (lambda x: jnp.sin(x), lambda x: jnp.cos(x)),                 # primitive
    (lambda x: jnp.sum(x, 0), lambda x: jnp.max(x, 0)),           # primitive
    (lambda x: x[::-1] + x, lambda x: x + x[::-1]),               # operand order
    (lambda x: jnp.cumsum(x), lambda x: jnp.cumsum(x[::-1])[::-1]),
])
def test_key_distinguishes_programs(f, g):
    x = jnp.arange(4.0)
    assert not S.same_structure(_jaxpr(f, x), _jaxpr(g, x))


def test_key_distinguishes_avals_and_params():
    f = lambda x: jnp.sum(x, axis=0)  # noqa: E731
    assert not S.same_structure(_jaxpr(f, jnp.ones((2, 3))), _jaxpr(f, jnp.ones((3, 2))))
    assert not S.same_structure(_jaxpr(f, jnp.ones((2, 3))), _jaxpr(f, jnp.ones((2, 3), jnp.int32)))
    h = lambda x: x * 2  # noqa: E731  (weak-typed input vs strong)
    assert not S.same_structure(_jaxpr(h, 1.0), _jaxpr(h, jnp.float32(1.0)))
    g = lambda x: jnp.sum(x, axis=1)  # noqa: E731
    assert not S.same_structure(_jaxpr(f, jnp.ones((2, 2))), _jaxpr(g, jnp.ones((2, 2))))


def test_key_includes_the_jit_name():
    def named(name):
        def body(x):
            return jnp.sin(x)
        body.__name__ = name
        return jax.jit(body)
    a = _jaxpr(lambda x: named("a")(x), jnp.ones(2))
    b = _jaxpr(lambda x: named("b")(x), jnp.ones(2))
    a2 = _jaxpr(lambda x: named("a")(x), jnp.ones(2))
    assert not S.same_structure(a, b)
    assert S.same_structure(a, a2)


def test_constants_by_content_never_by_id_and_tracers_never():
    big1, big2 = np.arange(1000.0, dtype=np.float32), np.arange(1000.0, dtype=np.float32)
    big3 = big1.copy()
    big3[500] = -1
    k1 = S.const_key(big1)
    assert k1 == S.const_key(big2) and hash(k1) == hash(S.const_key(big2))
    assert k1 != S.const_key(big3)
    assert S.const_key(np.float32(0.0)) != S.const_key(np.float32(-0.0))
    nan1 = np.array([np.nan], np.float32)
    nan2 = nan1.view(np.uint32).copy()
    nan2 |= 1
    assert S.const_key(nan1) != S.const_key(nan2.view(np.float32))
    assert S.const_key(big1) != S.const_key(big1.astype(np.float64))

    seen = []

    @jax.jit
    def outer(t):
        seen.append((S.const_key(t), S.const_key(t)))
        return t
    outer(1.0)
    ka, kb = seen[0]
    assert ka != kb and ka == ka  # a tracer is equal to nothing but its own key


def test_hash_collision_never_merges():
    a = _jaxpr(lambda x: jnp.sin(x), jnp.ones(2))
    b = _jaxpr(lambda x: jnp.cos(x), jnp.ones(2))
    ka, kb = S.structural_key(a), S.structural_key(b)
    ka._hash = kb._hash = 42  # force a collision
    assert hash(ka) == hash(kb) and ka != kb
    assert len({ka: 1, kb: 2}) == 2


# --- the dedup pass ----------------------------------------------------------------------------

def _fresh_closures(n):
    def f(x):
        for _ in range(n):
            x = jax.jit(lambda s: _body(s))(x)
        return x
    return f


def test_fifty_fresh_closures_lower_to_at_most_two_functions():
    f = _fresh_closures(50)
    x = jnp.linspace(0, 1, 16)
    assert _mlir_functions(jax.jit(f).lower(x)) == 51
    assert _mlir_functions(jaxrewrite.optimize(f).lower(x)) <= 2
    # (no gradient here: XLA takes minutes to compile the VJP of 400 unrolled steps)
    cj = assert_equivalent(f, x, grad=False, vmap=False, bitwise=True)
    assert len(_jit_bodies(cj)) == 1


def test_partial_objects_and_checkpoint_merge():
    def layer(w, x):
        return jnp.tanh(x @ w)

    def f(w, x):
        for _ in range(4):
            x = jax.jit(functools.partial(layer, w))(x)
        for _ in range(3):
            x = jax.checkpoint(functools.partial(layer, w))(x)
        return x
    w, x = jnp.eye(4) * 0.5, jnp.ones((2, 4))
    cj = assert_equivalent(f, w, x, bitwise=True)
    assert len(_jit_bodies(cj)) == 1
    remat_bodies = {id(e.params["jaxpr"]) for e in W.iter_eqns(cj) if e.primitive is C.remat_p}
    assert len(remat_bodies) == 1


def test_unchanged_when_nothing_merges_and_idempotent():
    shared = jax.jit(jnp.sin)

    def f(x):
        return shared(shared(x)) + jax.jit(jnp.cos)(x)
    cj = jax.make_jaxpr(f)(jnp.ones(3))
    out, changed = dedup.run(cj, _ctx())
    assert out is cj and not changed

    g = _fresh_closures(5)
    cj = jax.make_jaxpr(g)(jnp.ones(3))
    once, changed = dedup.run(cj, _ctx())
    assert changed and len(_jit_bodies(once)) == 1
    twice, changed2 = dedup.run(once, _ctx())
    assert twice is once and not changed2


def test_nested_bodies_merge_bottom_up():
    def outer_body(s):
        return jax.jit(lambda t: _body(t))(s) * 2

    def f(x):
        for _ in range(4):
            x = jax.jit(lambda s: outer_body(s))(x)
        return x
    x = jnp.ones(3)
    cj = assert_equivalent(f, x, bitwise=True)
    assert len(_jit_bodies(cj)) == 2
    assert _mlir_functions(jaxrewrite.optimize(f).lower(x)) <= 3


@pytest.mark.parametrize("transform", ["grad", "vmap", "jacfwd"])
def test_repeats_found_under_transformations(transform):
    f = _fresh_closures(6)
    g = {"grad": lambda x: jax.grad(lambda y: f(y).sum())(x),
         "vmap": jax.vmap(f),
         "jacfwd": jax.jacfwd(f)}[transform]
    x = jnp.linspace(0.1, 1, 3)
    if transform == "vmap":
        x = jnp.stack([x, x + 1])
    before = jax.make_jaxpr(g)(x)
    res = jaxrewrite.rewrite_jaxpr(before)
    assert len(_jit_bodies(res)) < len(_jit_bodies(before))
    assert_equivalent(g, x, grad=False, vmap=False, bitwise=True)
    n_opt = _mlir_functions(jaxrewrite.optimize(g).lower(x))
    assert n_opt < _mlir_functions(jax.jit(g).lower(x))


def test_grad_of_optimize_shares_one_body():
    f = _fresh_closures(10)
    x = jnp.linspace(0, 1, 8)
    grad_opt = jax.jit(jax.grad(lambda y: jaxrewrite.optimize(f)(y).sum()))
    grad_ref = jax.jit(jax.grad(lambda y: f(y).sum()))
    assert _mlir_functions(grad_opt.lower(x)) < _mlir_functions(grad_ref.lower(x)) // 3
    np.testing.assert_array_equal(grad_opt(x), grad_ref(x))


# --- property test: random programs with repeated calls ----------------------------------------

# A call spec: (op, constant, name, effect). Bodies with equal specs and no effect are identical
# programs; anything else differs (an effect's callback is a fresh object per closure).
_OPS = {"sin": jnp.sin, "tanh": jnp.tanh, "neg": jnp.negative}
_call = st.tuples(st.sampled_from(sorted(_OPS)), st.sampled_from([1.0, 2.0, -0.0, 0.0]),
                  st.sampled_from(["a", "b"]),
                  st.sampled_from([None, None, None, "debug", "io", "rand_same", "rand_other"]))


def _make_body(spec, log):
    op, c, name, effect = spec

    def body(s, key):
        y = _OPS[op](s) * c + s
        if effect == "debug":
            jax.debug.callback(lambda v: log.append(("debug", float(v[0]))), y)
        elif effect == "io":
            y = io_callback(lambda v: (log.append(("io", float(v[0]))), v)[1],
                            jax.ShapeDtypeStruct(y.shape, y.dtype), y, ordered=True)
        elif effect == "rand_same":
            y = y + jax.random.uniform(key, y.shape)
        elif effect == "rand_other":
            y = y + jax.random.uniform(jax.random.fold_in(key, 7), y.shape)
        return y
    body.__name__ = name
    return jax.jit(body)


def _program(specs, log):
    def f(x, key):
        for spec in specs:
            x = _make_body(spec, log)(x, key)
        return x
    return f


@settings(max_examples=10)
@given(st.lists(_call, min_size=1, max_size=5))
def test_dedup_merges_exactly_the_identical_bodies(specs):
    x, key = jnp.linspace(-1, 1, 4), jax.random.key(0)
    log_ref, log_opt = [], []
    expected = jax.jit(_program(specs, log_ref))(x, key)
    actual = jaxrewrite.optimize(_program(specs, log_opt), fold=False, cse=False)(x, key)
    jax.effects_barrier()
    np.testing.assert_array_equal(np.asarray(actual).view(np.uint32),
                                  np.asarray(expected).view(np.uint32))
    assert log_opt == log_ref  # effects keep their count and order

    cj = jax.make_jaxpr(_program(specs, []))(x, key)
    out, changed = dedup.run(cj, _ctx())
    pure = {s for s in specs if s[3] in (None, "rand_same", "rand_other")}
    effectful = [s for s in specs if s[3] in ("debug", "io")]
    top = {id(e.params["jaxpr"]) for e in out.jaxpr.eqns if C.is_jit(e)}
    assert len(top) == len(pure) + len(effectful)
    assert changed == (len(_jit_bodies(cj)) != len(_jit_bodies(out)))
    assert sum(1 for e in out.jaxpr.eqns if C.is_jit(e)) == len(specs)


def test_custom_jvp_bodies_merge_only_with_the_same_rule():
    def make(scale):
        @jax.custom_jvp
        def g(x):
            return jnp.sin(x)
        g.defjvp(lambda p, t: (g(p[0]), t[0] * scale))
        return g
    g2, g3 = make(2.0), make(3.0)

    def f(x):
        for _ in range(3):  # relu/gelu hold custom_jvp calls: a fresh JVP thunk per trace
            x = jax.jit(lambda s: jax.nn.relu(s) + jax.nn.gelu(s) * 0.5)(x)
        a = jax.jit(lambda s: g2(s))(x)
        b = jax.jit(lambda s: g2(s))(x * 2)
        c = jax.jit(lambda s: g3(s))(x * 3)   # same primal body, a different JVP rule
        return a + b + c
    x = jnp.linspace(-1, 1, 5)
    cj = jax.make_jaxpr(f)(x)
    out, changed = dedup.run(cj, _ctx())
    top = [e.params["jaxpr"] for e in out.jaxpr.eqns if C.is_jit(e)]
    assert changed and len({id(j) for j in top}) == 3
    assert top[0] is top[1] is top[2] and top[3] is top[4] and top[5] is not top[3]
    assert_equivalent(f, x, bitwise=True)  # gradients through the merged bodies use each body's own rule
