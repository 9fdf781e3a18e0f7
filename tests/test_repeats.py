"""Static values that repeat along an axis (a vmapped index table): fold keeps them as views of
one copy, the analyses read one row, and a large one reaches XLA as a broadcast of one copy."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from jax import lax

import jaxrewrite
from jaxrewrite import _compat as C
from jaxrewrite import _walk
from jaxrewrite._memo import same_bits
from jaxrewrite.analysis import repeats
from jaxrewrite.passes import fold, literals
from jaxrewrite.testing import assert_equivalent

from test_fold import _EDGE, _fold_once, numpy_rows_against_xla


def _view(v: np.ndarray, axis: int = 0) -> np.ndarray:
    """`v` as a broadcast view where it repeats along `axis` by value (else `v`)."""
    first = np.take(v, [0], axis=axis)
    return np.broadcast_to(first, v.shape) if v.ndim and np.all(v == first) else v


@pytest.mark.parametrize("name", sorted(fold.ELEMENTWISE))
def test_elementwise_folds_on_one_row_bit_exact_against_xla(name):
    """Every elementwise row fold evaluates in numpy, on operands that repeat along axis 0:
    XLA's bits, and the result a view that repeats too."""
    rows = 6
    a = np.broadcast_to(_EDGE, (rows, _EDGE.size))
    b = np.broadcast_to(np.roll(_EDGE, 3) * np.int32(-3), a.shape)
    for vals, got in numpy_rows_against_xla(name, a, b, operand=_view):
        if all(v.ndim == 0 or 0 in repeats.repeated_axes(v) for v in vals):
            for g in got:
                assert 0 in repeats.repeated_axes(g), f"{name}: the result was materialised"


def test_concatenate_reshape_and_comparison_keep_one_copy():
    rng = np.random.default_rng(0)
    t, u = rng.integers(0, 9, (1, 4, 3)), rng.integers(0, 9, (1, 4, 1))
    a, b = np.broadcast_to(t, (1000, 4, 3)), np.broadcast_to(u, (1000, 4, 1))
    cat = repeats.concatenate([a, b], 2)
    np.testing.assert_array_equal(cat, np.concatenate([np.asarray(a), np.asarray(b)], 2))
    assert repeats.repeated_axes(cat) == (0,)
    r = repeats.reshape(a, (1000, 12))
    np.testing.assert_array_equal(r, np.asarray(a).reshape(1000, 12))
    assert repeats.repeated_axes(r) == (0,)
    # a reshape that merges the repeated axis into another cannot stay a view: it is exact
    np.testing.assert_array_equal(repeats.reshape(a, (4000, 3)), np.asarray(a).reshape(4000, 3))
    # the same bits decided on one copy; a different row anywhere tells them apart
    assert same_bits(a, np.broadcast_to(t.copy(), a.shape))
    full = np.array(a)
    full[999, 3, 2] += 1
    assert not same_bits(a, full)
    neg0 = np.broadcast_to(np.array([[0.0, -0.0]], np.float32), (50, 2))
    assert not same_bits(neg0, np.broadcast_to(np.array([[0.0, 0.0]], np.float32), (50, 2)))
    assert not repeats.uniform(a) and repeats.uniform(np.broadcast_to(np.int8(3), (9, 9)))


# A vmapped `switch` over face turns, as an environment step writes it: batching makes each
# branch's index table a per-row table (one row repeated B times), and the turns' gathers have
# no structural form without concatenates at this size, so the tables stay in the program.
_RNG = np.random.default_rng(0)
_TABLES = [np.stack([_RNG.integers(0, 6, 8), _RNG.integers(0, 3, 8), _RNG.integers(0, 3, 8)],
                    1) for _ in range(3)]


def _turn(t):
    def f(c):
        return c.at[t[:4, 0], t[:4, 1], t[:4, 2]].set(c[t[4:, 0], t[4:, 1], t[4:, 2]])
    return f


def _step(c, a):
    c = c[np.arange(6)[::-1]]          # rewritten (a rev): the program is rewritten
    return lax.switch(a, [_turn(t) for t in _TABLES], c)


def _cube_args(batch):
    return (jnp.asarray(_RNG.integers(0, 100, (batch, 6, 3, 3)), jnp.int8),
            jnp.asarray(_RNG.integers(0, 3, batch), jnp.int32))


def _literals(cj):
    return [np.asarray(C.literal_value(a)) for e in _walk.iter_eqns(cj) for a in e.invars
            if C.is_literal(a)]


def test_folded_batch_tables_are_views_of_one_row():
    """What fold makes of the vmapped tables at 65,536 rows holds one row each (its cost, and
    every analysis after it, is the table's, not the batch's)."""
    cj = jax.make_jaxpr(jax.vmap(_step))(*_cube_args(65536))
    out, changed = _fold_once(cj)
    big = [v for v in _literals(out) if v.size >= literals.MIN_ELEMENTS]
    assert changed and len(big) >= 6
    assert all(0 in repeats.repeated_axes(v) for v in big)


def _batching(e) -> tuple:
    dn = e.params["dimension_numbers"]
    return tuple(getattr(dn, "operand_batching_dims", ()))


@pytest.mark.parametrize("batch,in_axis", [(16, 0), (65536, 0), (64, 3)])
def test_vmapped_switch_tables_become_one_row_with_the_batch_a_window(batch, in_axis):
    """The turns' gathers and scatters keep no batching dim and no batch-sized table: each reads
    one row of its table, the batch a window dim, as `vmap` makes of an unbatched index. Bit for
    bit with jax.jit, the batch leading or not."""
    c, a = _cube_args(batch)
    c = jnp.moveaxis(c, 0, in_axis)
    f = jax.vmap(_step, in_axes=(in_axis, 0))
    r = jaxrewrite.rewrite_jaxpr_with_report(jax.make_jaxpr(f)(c, a))
    # the turns' (index vectors of 3: face, row, column); the step's rev of the 6 faces is a
    # gather too where the target keeps it one (the TPU, passes/gathers.py's rev rule)
    moved = [e for e in _walk.iter_eqns(r.jaxpr) if e.primitive.name in ("gather", "scatter")
             and C.aval_of(e.invars[1]).shape[-1] == 3]
    assert len(moved) == 6
    if in_axis == 0:
        for e in moved:
            assert not _batching(e)
            assert C.is_literal(e.invars[1]) and np.shape(C.literal_value(e.invars[1])) == (4, 3)
    assert all(v.size < literals.MIN_ELEMENTS for v in _literals(r.jaxpr))
    assert_equivalent(f, c, a, bitwise=True, vmap=False)


@pytest.mark.parametrize("dtype,duplicates,unbatched", [
    (jnp.float32, True, False),   # which add lands first decides the float sum: kept batched
    (jnp.int32, True, False),     # exact in any order, but duplicates stay batched all the same
    (jnp.float32, False, True),   # one write per element
    (jnp.int32, False, True),
])
def test_scatter_batch_made_a_window_only_where_each_element_is_written_once(dtype, duplicates,
                                                                             unbatched):
    where = np.array([0, 1, 1, 2]) if duplicates else np.array([0, 1, 3, 2])

    def branch(k):
        return lambda v: v.at[(where + k) % 5].add(v[:4] * 3)

    def step(v, a):
        return lax.switch(a, [branch(0), branch(1)], v[::-1])

    v = jnp.asarray(_RNG.normal(size=(256, 5)) * 100, dtype)
    a = jnp.asarray(_RNG.integers(0, 2, 256), jnp.int32)
    f = jax.vmap(step)
    # fold's decision, on the CPU's row: on the TPU, passes/batched_updates.py then writes the
    # batched integer scatter-adds that stay (duplicates) as selects, and none is left to count
    r = jaxrewrite.rewrite_jaxpr_with_report(jax.make_jaxpr(f)(v, a), target="cpu")
    adds = [e for e in _walk.iter_eqns(r.jaxpr) if e.primitive.name.startswith("scatter")]
    assert len(adds) == 2
    assert all(not _batching(e) for e in adds) == unbatched
    assert_equivalent(f, v, a, bitwise=True, vmap=False)


def test_large_repeated_literals_reach_xla_as_broadcasts():
    """A table repeated along an axis that no rewrite consumed (a gather with no structural
    form and no batching dim) reaches XLA as a broadcast of one row, not a constant of the
    table's full size."""
    rows = np.broadcast_to(np.array([5, 0, 3, 6], np.int32), (2048, 4)).copy()

    def f(x):
        return x[rows] + x[np.arange(8)[::-1]][:4]

    x = jnp.arange(8, dtype=jnp.int32) * 7
    r = jaxrewrite.rewrite_jaxpr_with_report(jax.make_jaxpr(f)(x))
    assert r.changed and r.report.counts.get("literals.compacted", 0) == 1
    assert all(v.size < literals.MIN_ELEMENTS for v in _literals(r.jaxpr))
    g, = [e for e in _walk.iter_eqns(r.jaxpr) if e.primitive.name == "gather"]
    b, = [e for e in _walk.iter_eqns(r.jaxpr) if e.outvars[0] is g.invars[1]]
    assert b.primitive.name == "broadcast_in_dim" and C.is_literal(b.invars[0])
    assert np.shape(C.literal_value(b.invars[0])) == (4, 1)
    assert_equivalent(f, x, bitwise=True, vmap=False)


def test_small_or_varying_literals_are_left_as_they_are():
    lit = C.literal(np.arange(4096, dtype=np.int32).reshape(64, 64))
    assert literals.compact(lit) is None                     # nothing repeats
    small = C.literal(np.broadcast_to(np.arange(3, dtype=np.int32), (8, 3)))
    assert literals.compact(small) is None                   # below MIN_ELEMENTS
    by_value = C.literal(np.tile(np.arange(3, dtype=np.int32), (2048, 1)))  # no view: by value
    core, keep = literals.compact(by_value)
    assert keep == (1,) and np.shape(C.literal_value(core)) == (3,)


# --- the literals pass on every rank and pattern of repeated axes (issue 38) ----------------------

@st.composite
def _repeated_literals(draw):
    """A literal of 1,024+ elements repeated along some axes (a broadcast view or by value): its
    shape, which axes repeat, and the values along the others (a scalar core where all do)."""
    rank = draw(st.integers(1, 4))
    shape = [draw(st.sampled_from([1, 2, 3, 4, 8, 16, 32, 64])) for _ in range(rank)]
    big = draw(st.integers(0, rank - 1))
    shape[big] = max(shape[big], -(-literals.MIN_ELEMENTS // max(1, int(np.prod(shape)) //
                                                                 shape[big])))
    repeated = draw(st.lists(st.booleans(), min_size=rank, max_size=rank))
    dtype = draw(st.sampled_from([np.int32, np.uint32, np.int8, np.float32, np.bool_]))
    core_shape = tuple(1 if r else n for r, n in zip(repeated, shape))
    seed = draw(st.integers(0, 2**16))
    core = np.random.default_rng(seed).integers(0, 100, core_shape).astype(dtype)
    view = np.broadcast_to(core, tuple(shape))
    value = view if draw(st.booleans()) else np.array(view)
    return value


@given(_repeated_literals())
@settings(max_examples=60)
def test_literals_pass_emits_well_typed_broadcasts_of_any_rank(value):
    """Every literal the pass compacts becomes a `broadcast_in_dim` that type-checks and holds
    the literal's bits: a core of any rank, a scalar where every axis repeats (a uniform table:
    the form that crashed a vmapped BLAKE2s at 16,384 messages)."""
    from jaxrewrite.report.records import Report

    def f(x):
        return x, jnp.zeros(value.shape, value.dtype)

    cj = jax.make_jaxpr(f)(jnp.zeros(value.shape, value.dtype))
    out_var = cj.jaxpr.outvars[1]
    lit = C.literal(value, C.ShapedArray(value.shape, value.dtype))
    j = cj.jaxpr.replace(outvars=[cj.jaxpr.outvars[0], lit])
    j = j.replace(eqns=[e for e in j.eqns if out_var not in e.outvars])

    class Ctx:
        report = Report()
    out, changed = literals.run(C.closed(j, cj.consts), Ctx)
    C.check_jaxpr(out)
    assert changed == (literals.compact(lit) is not None)
    if changed:
        b, = [e for e in out.jaxpr.eqns if e.primitive.name == "broadcast_in_dim"]
        core = np.asarray(C.literal_value(b.invars[0]))
        assert core.ndim == len(b.params["broadcast_dimensions"])
        assert core.size < value.size
    got = jax.core.eval_jaxpr(out.jaxpr, out.consts, jnp.zeros(value.shape, value.dtype))[1]
    np.testing.assert_array_equal(np.asarray(got), value)
    assert np.asarray(got).dtype == value.dtype
