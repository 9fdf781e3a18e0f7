"""CSE: identical pure equations on identical operands are computed once; nothing else is."""
import jax
import jax.numpy as jnp
from hypothesis import given, settings
from hypothesis import strategies as st
from jax import lax
from jax.experimental import io_callback
from jax.experimental.xla_metadata import set_xla_metadata

from jaxrewrite import _compat as C
from jaxrewrite._options import Options
from jaxrewrite._pipeline import Context
from jaxrewrite.report.records import Report
from jaxrewrite.passes import cse
from jaxrewrite.testing import assert_equivalent


def _run(f, *args):
    cj = jax.make_jaxpr(f)(*args)
    ctx = Context(Options.make(), Report())
    out, changed = cse.run(cj, ctx)
    C.check_jaxpr(out)
    return cj, out, changed, ctx.report


def _count(cj, name):
    return sum(1 for e in cj.jaxpr.eqns if e.primitive.name == name)


def test_identical_pure_eqns_merge():
    def f(x):
        return jnp.sin(x) * jnp.sin(x) + jnp.sin(x * 2) - jnp.sin(x * 2)
    cj, out, changed, report = _run(f, jnp.ones(3))
    assert changed and _count(cj, "sin") == 4 and _count(out, "sin") == 2
    assert _count(out, "mul") == _count(cj, "mul") - 1
    assert report.counts["cse.hits"] == 3
    assert_equivalent(f, jnp.linspace(-2, 2, 5), bitwise=True)
    again, changed2 = cse.run(out, None)  # idempotent: nothing left to merge
    assert again is out and not changed2


def test_identical_calls_merge_and_different_operands_do_not():
    def f(x, y):
        return jax.jit(lambda s: s * 3)(x) + jax.jit(lambda s: s * 3)(x) + jax.jit(lambda s: s * 3)(y)
    cj, out, changed, _ = _run(f, jnp.ones(3), jnp.ones(3))
    assert _count(cj, "jit") == 3 and _count(out, "jit") == 2
    assert_equivalent(f, jnp.ones(3), jnp.arange(3.0), bitwise=True)


def test_different_params_or_literals_do_not_merge():
    def f(x):
        return jnp.sum(x, 0) + jnp.sum(x, 1) + (x * 2.0).sum() + (x * 3.0).sum() + (x + 0.0).sum() + (x + -0.0).sum()
    _, out, changed, _ = _run(f, jnp.ones((3, 3)))
    assert not changed


def test_random_draws_same_key_merge_different_keys_never():
    def f(k):
        a = jax.random.bits(k, (4,))
        b = jax.random.bits(k, (4,))
        c = jax.random.bits(jax.random.fold_in(k, 1), (4,))
        d = jax.random.bits(jax.random.fold_in(k, 2), (4,))
        return a, b, c, d
    k = jax.random.key(3)
    cj, out, changed, _ = _run(f, k)
    assert _count(cj, "random_bits") == 4 and _count(out, "random_bits") == 3
    assert_equivalent(f, k, grad=False, vmap=False, bitwise=True)


def test_stateful_rng_never_merges():
    def f(x):
        a = lax.rng_uniform(0.0, 1.0, (3,))
        b = lax.rng_uniform(0.0, 1.0, (3,))
        c = jax.jit(lambda: lax.rng_uniform(0.0, 1.0, (3,)))()
        d = jax.jit(lambda: lax.rng_uniform(0.0, 1.0, (3,)))()
        return x + a + b + c + d
    cj, out, changed, report = _run(f, jnp.ones(3))
    assert _count(out, "rng_uniform") == 2 and _count(out, "jit") == 2
    assert not changed
    assert {d.reason for d in report.declines} >= {"stateful primitive rng_uniform",
                                                   "a nested body draws from a stateful primitive"}


def test_effects_never_merge_and_keep_count_and_order():
    def f(x):
        y1 = io_callback(lambda v: (log.append(1), v)[1], jax.ShapeDtypeStruct((3,), jnp.float32), x, ordered=True)
        y2 = io_callback(lambda v: (log.append(2), v)[1], jax.ShapeDtypeStruct((3,), jnp.float32), x, ordered=True)
        jax.debug.callback(lambda v: log.append(3), x)
        jax.debug.callback(lambda v: log.append(3), x)
        return y1 + y2
    log = []
    cj, out, changed, _ = _run(f, jnp.ones(3))
    assert not changed and len(out.jaxpr.eqns) == len(cj.jaxpr.eqns)
    import jaxrewrite
    jax.jit(f)(jnp.ones(3))
    jax.effects_barrier()
    ref, log[:] = list(log), []
    jaxrewrite.optimize(f)(jnp.ones(3))
    jax.effects_barrier()
    assert sorted(log) == sorted(ref) == [1, 2, 3, 3]  # count kept (debug callbacks: unordered)
    assert [v for v in log if v != 3] == [1, 2]         # ordered io_callbacks: order kept


def test_checkpoint_prevent_cse_is_honoured():
    def f(x, prevent):
        g = jax.checkpoint(lambda s: jnp.sin(s) * 2, prevent_cse=prevent)
        return g(x) + g(x)
    _, out, changed, _ = _run(lambda x: f(x, True), jnp.ones(3))
    assert not changed and _count(out, C.remat_p.name) == 2
    _, out, changed, _ = _run(lambda x: f(x, False), jnp.ones(3))
    assert changed and _count(out, C.remat_p.name) == 1
    assert_equivalent(lambda x: f(x, False), jnp.linspace(0, 1, 3), bitwise=True)
    assert_equivalent(lambda x: f(x, True), jnp.linspace(0, 1, 3), bitwise=True)


def test_equation_context_is_part_of_the_key():
    def f(x):
        a = jnp.sin(x)
        with set_xla_metadata(tag="other"):
            b = jnp.sin(x)
        return a + b
    cj, out, changed, _ = _run(f, jnp.ones(3))
    assert _count(cj, "sin") == 2 and _count(out, "sin") == 2 and not changed


def test_nested_levels_are_cse_d():
    def f(x):
        def body(c, _):
            return jnp.cos(c) + jnp.cos(c), None
        return lax.scan(body, x, None, length=3)[0]
    cj, out, changed, _ = _run(f, jnp.ones(3))
    body = out.jaxpr.eqns[0].params["jaxpr"].jaxpr
    assert changed and sum(1 for e in body.eqns if e.primitive.name == "cos") == 1
    assert_equivalent(f, jnp.linspace(0, 1, 3), bitwise=True)


# --- property: random expression DAGs with repeated subexpressions ------------------------------

_UNARY = {"sin": jnp.sin, "neg": jnp.negative, "exp": jnp.exp, "half": lambda v: v * 0.5}
_BINARY = {"add": jnp.add, "mul": jnp.multiply, "sub": jnp.subtract}
_node = st.one_of(st.tuples(st.just("u"), st.sampled_from(sorted(_UNARY)), st.integers(0, 20)),
                  st.tuples(st.just("b"), st.sampled_from(sorted(_BINARY)), st.integers(0, 20),
                            st.integers(0, 20)),
                  st.tuples(st.just("jit"), st.sampled_from(sorted(_UNARY)), st.integers(0, 20)))


def _dag(nodes):
    def f(x, y):
        vals = [x, y]
        for node in nodes:
            pick = lambda i: vals[i % len(vals)]  # noqa: E731
            if node[0] == "u":
                vals.append(_UNARY[node[1]](pick(node[2])))
            elif node[0] == "b":
                vals.append(_BINARY[node[1]](pick(node[2]), pick(node[3])))
            else:
                op = _UNARY[node[1]]
                vals.append(jax.jit(lambda v: op(v))(pick(node[2])))
        return vals[2:]
    return f


@settings(max_examples=8)
@given(st.lists(_node, min_size=1, max_size=10))
def test_random_dags_are_bit_exact_and_idempotent(nodes):
    f = _dag(nodes)
    x, y = jnp.linspace(-1, 1, 4), jnp.linspace(0.5, 2, 4)
    _, out, _, _ = _run(f, x, y)
    again, changed = cse.run(out, None)
    assert not changed and again is out
    assert_equivalent(f, x, y, vmap=False, bitwise=True)
    # no two pure top-level equations left with the same key
    assert len({(e.primitive, tuple(map(id, e.invars)), str(e.params)) for e in out.jaxpr.eqns
                if e.primitive.name != "jit"}) == sum(1 for e in out.jaxpr.eqns if e.primitive.name != "jit")
