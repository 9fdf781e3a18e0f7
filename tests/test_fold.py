"""Constant folding: XLA's integer semantics, size cap, no floats, call specialisation."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from jax import lax

import jaxrewrite
from jaxrewrite import _compat as C
from jaxrewrite import _walk
from jaxrewrite import strategies as S
from jaxrewrite._options import Options
from jaxrewrite._pipeline import Context
from jaxrewrite.report.records import Report
from jaxrewrite.passes import fold
from jaxrewrite.testing import assert_equivalent, primitive_counts

ONLY_FOLD = dict(gathers=False, movement=False, flatten=False, scalarize=False, cse=False,
                 dedup=False)


def _fold_once(cj, **opts):
    ctx = Context(Options.make(**opts), Report())
    return fold.run(_walk.literalize_consts(cj, ctx.options.fold_limit), ctx)


def _structure(cj):
    return [(e.primitive.name, tuple(str(C.aval_of(a)) for a in e.invars))
            for e in _walk.iter_eqns(cj)]


I32 = np.int32


@pytest.mark.parametrize("name,op,a,b", [
    ("shift_left by >= width", lax.shift_left, np.array([1, 3, -1], I32), np.array([31, 32, 40], I32)),
    ("shift_right_logical", lax.shift_right_logical, np.array([-8, 8], I32), np.array([33, 1], I32)),
    ("shift_right_arithmetic", lax.shift_right_arithmetic, np.array([-8, 8], I32), np.array([40, 2], I32)),
    ("div by zero", lax.div, np.array([7, -7, 0], I32), np.array([0, 0, 0], I32)),
    ("rem by zero", lax.rem, np.array([7, -7], I32), np.array([0, 0], I32)),
    ("overflow", lax.add, np.array([2 ** 31 - 1], I32), np.array([1], I32)),
    ("int8 mul overflow", lax.mul, np.array([100, -128], np.int8), np.array([3, -1], np.int8)),
    ("min int / -1", lax.div, np.array([-2 ** 31], I32), np.array([-1], I32)),
    ("uint sub", lax.sub, np.array([0], np.uint32), np.array([1], np.uint32)),
])
def test_fold_matches_xla(name, op, a, b):
    # Reference: XLA computing op on *arguments* (jax.jit of op over numpy constants can crash
    # XLA's own constant folder with SIGFPE on integer division by zero, jax 0.10.2).
    expected = np.asarray(jax.jit(op)(a, b))
    cj = jaxrewrite.rewrite_jaxpr(jax.make_jaxpr(lambda: op(a, b))(), **ONLY_FOLD)
    assert not cj.jaxpr.eqns, _structure(cj)
    out = cj.jaxpr.outvars[0]
    assert C.is_literal(out)
    got = np.asarray(C.literal_value(out))
    assert got.dtype == expected.dtype
    np.testing.assert_array_equal(got, expected)
    # And inside a program, the optimized result equals XLA's.
    f = jaxrewrite.optimize(lambda x: x + op(a, b), **ONLY_FOLD)
    np.testing.assert_array_equal(np.asarray(f(np.zeros_like(a))), expected)


def test_floats_are_not_folded():
    a = np.array([1.0, 2.0], np.float32)

    def f(x):
        return x + lax.mul(a, a)

    cj = jaxrewrite.rewrite_jaxpr(jax.make_jaxpr(f)(a), **ONLY_FOLD)
    assert primitive_counts(cj).get("mul") == 1


def test_fold_limit_caps_materialized_constants():
    a = np.arange(10, dtype=I32)

    def f(x):
        return x + lax.mul(a, a)

    cj = jax.make_jaxpr(f)(a)
    assert primitive_counts(jaxrewrite.rewrite_jaxpr(cj, fold_limit=4, **ONLY_FOLD)).get("mul") == 1
    assert "mul" not in primitive_counts(jaxrewrite.rewrite_jaxpr(cj, fold_limit=100, **ONLY_FOLD))


def test_large_splats_keep_their_equation():
    def f(x):
        return x + jnp.zeros((200, 200), I32) + lax.iota(I32, 200)

    x = np.zeros((200, 200), I32)
    cj = assert_equivalent(f, x, **ONLY_FOLD, bitwise=True)
    counts = primitive_counts(cj)
    assert counts.get("broadcast_in_dim", 0) >= 1 and counts.get("iota", 0) == 1


def test_take_is_specialised_through_nested_jits():
    idx = np.array([3, -1, 0, 2])

    def f(x):
        return jnp.take(x, idx, axis=1)

    x = np.arange(16.0, dtype=np.float32).reshape(4, 4)
    cj = assert_equivalent(f, x, **ONLY_FOLD, bitwise=True)
    counts = primitive_counts(cj)
    assert counts.get("gather") == 1
    assert not {"lt", "add", "select_n"} & set(counts), counts
    g = next(e for e in _walk.iter_eqns(cj) if e.primitive.name == "gather")
    assert C.is_literal(g.invars[1])


@pytest.mark.parametrize("where", ["scan", "cond", "while", "custom_jvp", "remat"])
def test_constants_reach_bodies(where):
    idx = np.array([2, 0, 1])

    def body_fn(x):
        return x[idx] * 2.0

    @jax.custom_jvp
    def cj_fn(x):
        return body_fn(x)

    cj_fn.defjvp(lambda p, t: (cj_fn(p[0]), t[0][idx] * 2.0))

    def f(x):
        if where == "scan":
            return lax.scan(lambda c, _: (body_fn(c), None), x, None, length=2)[0]
        if where == "cond":
            return lax.cond(x[0] > 0, body_fn, lambda y: y, x)
        if where == "while":
            return lax.while_loop(lambda c: c[1] < 2, lambda c: (body_fn(c[0]), c[1] + 1), (x, 0))[0]
        if where == "custom_jvp":
            return cj_fn(x)
        return jax.checkpoint(body_fn)(x)

    x = np.array([1.0, 2.0, 3.0], np.float32)
    cj = assert_equivalent(f, x, grad=where != "while", **ONLY_FOLD, bitwise=True)
    gathers = [e for e in _walk.iter_eqns(cj) if e.primitive.name == "gather"]
    assert gathers and all(C.is_literal(e.invars[1]) for e in gathers)
    assert "select_n" not in primitive_counts(cj)  # the index normalisation was folded


def test_fold_is_idempotent_and_reports_no_change():
    idx = np.array([1, 0])

    def f(x):
        return jnp.take(x, idx) + jnp.take(x, idx)

    cj = jax.make_jaxpr(f)(np.zeros(2, np.float32))
    once, changed = _fold_once(cj)
    assert changed
    twice, changed2 = _fold_once(once)
    assert not changed2 and twice is once
    C.check_jaxpr(once)


@settings(max_examples=25, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(S.programs(max_ops=12, depth=2))
def test_fold_reaches_its_fixed_point_in_one_run(prog):
    """The pipeline never wakes fold for its own change (`PassSpec.enables`): a second run over
    fold's output must find nothing. Random programs with static gathers, index arithmetic and
    nested calls of every kind."""
    cj = jax.make_jaxpr(prog.fn)(*prog.args)
    once, _ = _fold_once(cj)
    twice, changed = _fold_once(once)
    assert not changed and _structure(twice) == _structure(once)


def test_converges_with_dedup():
    idx = np.array([2, 1, 0])  # rev; its reverse is the identity
    take = jax.jit(lambda x, i: x[i])

    def f(x):
        return take(x, idx) + take(x, idx) + take(x, idx[::-1].copy())

    x = np.arange(3.0, dtype=np.float32)
    # fold, gathers, dedup, cse; the CPU's row (the TPU keeps a rev of 3 elements a gather,
    # bench/tpu_costs.py, and this test is about the rounds)
    opts = dict(movement=False, scalarize=False, target="cpu")
    report = jaxrewrite.rewrite_jaxpr_with_report(jax.make_jaxpr(f)(x), **opts).report
    assert report.counts["pipeline.rounds"] < Options().max_rounds
    cj = assert_equivalent(f, x, **opts, bitwise=True)
    assert "gather" not in primitive_counts(cj)


def test_x64_indices_fold():
    with jax.enable_x64(True):
        idx = np.array([3, 1], np.int64)
        x = np.arange(4.0)
        cj = assert_equivalent(lambda x: jnp.take(x, idx), x, **ONLY_FOLD, bitwise=True)
        g = next(e for e in _walk.iter_eqns(cj) if e.primitive.name == "gather")
        assert C.is_literal(g.invars[1]) and C.aval_of(g.invars[1]).dtype == np.int64


def _first_eqn(f, *args):
    return jax.make_jaxpr(f)(*args).jaxpr.eqns[-1]


_EDGE = np.array([0, 1, -1, 2**31 - 1, -2**31, 7, -8, 3], np.int32)
_NUMPY_CASES = {
    "broadcast_in_dim": lambda a, b: lax.broadcast_in_dim(a, (3, 8), (1,)),
    "iota": lambda a, b: lax.broadcasted_iota(jnp.int32, (3, 5), 1),
    "reshape": lambda a, b: a.reshape(2, 4),
    "squeeze": lambda a, b: lax.squeeze(a.reshape(1, 8), (0,)),
    "transpose": lambda a, b: lax.transpose(a.reshape(2, 4), (1, 0)),
    "concatenate": lambda a, b: lax.concatenate([a, b], 0),
    "slice": lambda a, b: lax.slice(a, (1,), (7,), (2,)),
    "rev": lambda a, b: lax.rev(a, (0,)),
    "convert_element_type": lambda a, b: (a.astype(jnp.int8), a.astype(bool),
                                          a.astype(jnp.uint16), (a > 0).astype(jnp.int32)),
    "select_n": lambda a, b: (lax.select_n(a > b, a, b),
                              lax.select_n(jnp.clip(a, 0, 2), a, b, a + b)),
    "eq": lambda a, b: a == b, "ne": lambda a, b: a != b, "lt": lambda a, b: a < b,
    "le": lambda a, b: a <= b, "gt": lambda a, b: a > b, "ge": lambda a, b: a >= b,
    "and": lambda a, b: (a & b, (a > 0) & (b > 0)), "or": lambda a, b: (a | b, (a > 0) | (b > 0)),
    "xor": lambda a, b: (a ^ b, (a > 0) ^ (b > 0)), "not": lambda a, b: (~a, ~(a > 0)),
    "max": lambda a, b: lax.max(a, b), "min": lambda a, b: lax.min(a, b),
    "add": lambda a, b: (a + b, a.astype(jnp.uint8) + b.astype(jnp.uint8)),
    "sub": lambda a, b: a - b, "mul": lambda a, b: a * b, "neg": lambda a, b: -a,
    "sign": lambda a, b: (lax.sign(a), lax.sign(a.astype(jnp.uint8))),
    "clamp": lambda a, b: (lax.clamp(-7, a, 3), lax.clamp(b, a, b + 1)),
    "rem": lambda a, b: (lax.rem(a, jnp.where((b == 0) | (b == -1), -5, b)),
                         lax.rem(a.astype(jnp.uint32), jnp.uint32(7))),
    "stop_gradient": lambda a, b: lax.stop_gradient(a),
    "scatter": lambda a, b: (a.at[3].set(b[0]), a.reshape(2, 4).at[1, 2].set(9),
                             (a > 0).at[2].set(False), a.at[-1].set(5)),
}


def test_numpy_evaluation_declines_where_xla_defines_the_edge():
    """Remainder by 0 or -1, a scatter with a repeated or out-of-bounds index: XLA's answer
    (its own definitions, its choice of the winning update, its mode) -- not evaluated in numpy."""
    a = np.array([5, -7, 2**31 - 1, -2**31], np.int32)
    cases = [(lambda a, b: lax.rem(a, b), np.array([0, 3, 1, 2], np.int32)),
             (lambda a, b: lax.rem(a, b), np.array([1, 3, 1, -1], np.int32)),
             (lambda a, b: a.at[np.array([1, 1])].set(b[:2]), a),
             (lambda a, b: a.at[np.array([0, 9])].set(b[:2], mode="drop"), a)]
    seen = 0
    for f, b in cases:
        cj = jax.make_jaxpr(f)(a, b)
        env = dict(zip(cj.jaxpr.invars, (a, b)))
        env.update(zip(cj.jaxpr.constvars, map(np.asarray, cj.consts)))
        for eqn in cj.jaxpr.eqns:
            vals = [np.asarray(C.literal_value(x)) if C.is_literal(x) else env[x]
                    for x in eqn.invars]
            if eqn.primitive.name in ("rem", "scatter"):
                assert fold._numpy_eval(eqn, vals) is None
                seen += 1
            env.update(zip(eqn.outvars, C.eval_primitive_on_cpu(eqn.primitive, vals, eqn.params)))
    assert seen == len(cases)


def numpy_rows_against_xla(name, a, b, operand=lambda v: v) -> list:
    """Runs `_NUMPY_CASES[name]` on `a, b` equation by equation through XLA, and each equation of
    primitive `name` through fold's numpy row too, on its operands as `operand` gives them:
    asserts XLA's dtype, shape and bits, and returns (operands, numpy results) of each."""
    cj = jax.make_jaxpr(lambda a, b: _NUMPY_CASES[name](a, b))(a, b)
    env = dict(zip(cj.jaxpr.invars, (a, b)))
    checked = []
    for eqn in cj.jaxpr.eqns:
        vals = [np.asarray(C.literal_value(x)) if C.is_literal(x) else operand(env[x])
                for x in eqn.invars]
        ref = C.eval_primitive_on_cpu(eqn.primitive, [np.array(v) for v in vals], eqn.params)
        got = fold._numpy_eval(eqn, vals) if eqn.primitive.name == name else None
        if got is not None:
            checked.append((vals, got))
            for g, r in zip(got, ref):
                assert g.dtype == r.dtype and g.shape == r.shape
                np.testing.assert_array_equal(g, r)
        env.update(zip(eqn.outvars, (np.asarray(r) for r in ref)))
    assert checked, f"{name} was never evaluated in numpy"
    return checked


@pytest.mark.parametrize("name", sorted(fold.NUMPY_EXACT))
def test_numpy_evaluation_is_bit_exact_against_xla(name):
    """Every primitive fold evaluates in numpy gives XLA's bits, overflow and edges included."""
    numpy_rows_against_xla(name, _EDGE, np.roll(_EDGE, 3) * np.int32(-3))


def test_same_bits_tells_signed_zeros_and_nan_payloads_apart():
    """select_n with equal arms is forwarded only when the arms are equal bit for bit."""
    from jaxrewrite._memo import same_bits
    z = np.zeros(5, np.float32)
    nz = -z
    q = np.full(5, np.nan, np.float32)
    q2 = q.view(np.uint32).copy()
    q2[3] ^= 1                                  # another NaN payload at one position
    assert same_bits(z, z.copy()) and same_bits(q, q.copy())
    assert not same_bits(z, nz)
    assert not same_bits(q, q2.view(np.float32))
    b = np.arange(12, dtype=np.int8).reshape(3, 4)
    assert same_bits(b.T, b.T.copy()) and not same_bits(b.T, b.T[::-1])
    assert same_bits(np.asarray(True), np.asarray(True))


def test_calls_specialised_per_site_to_trivial_bodies_are_inlined_shared_ones_stay():
    """qujax reads each of 48 angles through one jitted indexing helper; folding
    specialises every call to its own index, and each body becomes one slice: 48 functions,
    each lowered and compiled alone, for nothing. Those are inlined. A trivial body that several
    calls share is one function already (and reroll's chains are made of such calls): kept."""
    read = jax.jit(lambda v, i: v[i])
    double = jax.jit(lambda x: x * 2.0)

    def f(v):
        angles = jnp.stack([read(v, k) for k in range(6)])
        return jnp.cos(angles), double(v), double(v + 1.0)
    v = jnp.linspace(-1.0, 1.0, 8, dtype=jnp.float32)
    before = jax.make_jaxpr(f)(v)
    assert sum(C.is_jit(e) for e in before.jaxpr.eqns) == 8
    res = jaxrewrite.rewrite_jaxpr_with_report(before)
    calls = [e for e in res.jaxpr.jaxpr.eqns if C.is_jit(e)]
    assert len(calls) == 2 and calls[0].params["jaxpr"] is calls[1].params["jaxpr"]
    assert primitive_counts(calls[0].params["jaxpr"]) == {"mul": 1}
    assert "gather" not in primitive_counts(res.jaxpr)
    assert res.report.counts["fold.inlined"] == 6
    assert_equivalent(f, v, vmap=False)
