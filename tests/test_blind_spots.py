"""Static gathers the passes used not to look at (issue 23, part 3), and the fold_limit cliff.

* `jnp.take` with more than 64 static indices: its `idx < 0` mask is an all-false splat that fold
  keeps as an equation, so the index reached the gather only up to 64 entries;
* gathers in vmapped `lax.switch` branches: batching routes each branch constant through
  `select_n(p, stop_gradient(c), c)`, a select of two equal arms;
* every static gather left is a recorded decline, never silence;
* a gather over more than `fold_limit` elements whose batch dims pass through (a sorting network
  over 65,536 rows) is rewritten: the limit bounds the map of one row, not the batch.

What is seen is the analyses' business; whether a seen gather is taken is the target's cost row
(the TPU keeps a rev of more than 2 elements, and a reshape that pads its (8, 128) tiles, as
gathers: bench/tpu_costs.py). The structure here is the CPU's row (`default_target("cpu")`), on
any host; the programs still run on the default backend.
"""
import inspect

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import jaxrewrite
from jaxrewrite import _compat as C
from jaxrewrite import _walk
from jaxrewrite._options import Options
from jaxrewrite._pipeline import Context
from jaxrewrite.passes import fold
from jaxrewrite.report.records import Report
from jaxrewrite.testing import assert_equivalent, primitive_counts

pytestmark = pytest.mark.default_target("cpu")


def _rewrite(fn, *args, **opts):
    res = jaxrewrite.rewrite_jaxpr_with_report(jax.make_jaxpr(fn)(*args), **opts)
    return res.jaxpr, res.report


def _transposed(n: int, a: int) -> np.ndarray:
    """The permutation of a row-major (a, n // a) read column by column: a structural gather."""
    return np.arange(n).reshape(a, n // a).T.ravel()


# --- jnp.take above 64 indices ------------------------------------------------------------------

@pytest.mark.parametrize("n,a", [(64, 8), (65, 5), (200, 8), (4096, 64)])
def test_take_with_many_static_indices_becomes_data_movement(n, a):
    idx = _transposed(n, a)
    v = jnp.arange(n, dtype=jnp.float32) * 1.5 - 7.0
    cj = assert_equivalent(lambda v: jnp.take(v, idx), v, bitwise=True)
    counts = primitive_counts(cj)
    assert counts.get("gather", 0) == 0 and counts.get("transpose", 0) == 1, counts
    batched = jnp.stack([v, -v, v * 0.0])
    cj = assert_equivalent(jax.vmap(lambda v: jnp.take(v, idx)), batched, bitwise=True)
    assert primitive_counts(cj).get("gather", 0) == 0


def test_take_with_many_static_indices_in_a_loop_body():
    idx = _transposed(200, 8)
    f = lambda v: lax.fori_loop(0, 5, lambda i, v: jnp.take(v, idx) * 2.0, v)  # noqa: E731
    cj = assert_equivalent(f, jnp.arange(200, dtype=jnp.float32), bitwise=True)
    counts = primitive_counts(cj)
    assert counts.get("gather", 0) == 0 and counts.get("transpose", 0) == 1, counts


@pytest.mark.parametrize("n", [65, 4096])
def test_take_of_a_traced_arange_is_seen(n):
    # the index is an iota folding keeps as an equation; it reaches `_take`'s gather as a literal
    v = jnp.arange(n, dtype=jnp.int32)
    cj = assert_equivalent(lambda v: jnp.take(v, jnp.arange(n)[::-1]), v, bitwise=True)
    counts = primitive_counts(cj)
    assert counts.get("gather", 0) == 0 and counts.get("rev", 0) == 1, counts


# --- select_n forwarding (fold's FORWARD table) -------------------------------------------------

def _fold_once(fn, *args):
    cj = jax.make_jaxpr(fn)(*args)
    ctx = Context(Options.make(), Report())
    out, changed = fold.run(_walk.literalize_consts(cj, ctx.options.fold_limit), ctx)
    return out, changed, ctx.report


def test_select_n_with_equal_arms_is_that_arm():
    c = np.arange(100, dtype=np.float32)  # floats too: forwarding computes nothing
    out, changed, report = _fold_once(lambda p, x: lax.select_n(p, c, c.copy()) + x,
                                      jnp.ones(100, bool), jnp.ones(100, jnp.float32))
    assert changed and report.counts["fold.forwarded"] == 1
    assert "select_n" not in primitive_counts(out)


def test_select_n_with_a_uniform_constant_predicate_picks_that_arm():
    def f(x, y):
        p = jnp.full((128,), 1, jnp.int32)  # a splat fold keeps as an equation
        return lax.select_n(p, x, y, x * 2.0)
    x = jnp.arange(128, dtype=jnp.float32)
    out, changed, _ = _fold_once(f, x, -x)
    # the select is gone: its result is `y`, the program's second input
    assert "select_n" not in primitive_counts(out)
    assert out.jaxpr.outvars[0] is out.jaxpr.invars[1]
    assert_equivalent(f, x, -x, bitwise=True)


def test_select_n_is_kept_where_arms_differ_or_the_predicate_varies():
    p = np.arange(100) % 2 == 0
    out, _, _ = _fold_once(lambda x, y: lax.select_n(p, x, y), jnp.ones(100), jnp.zeros(100))
    assert primitive_counts(out).get("select_n") == 1
    out, _, _ = _fold_once(lambda q, x: lax.select_n(q, x, -x), jnp.ones(100, bool), jnp.ones(100))
    assert primitive_counts(out).get("select_n") == 1


# --- vmapped switch -------------------------------------------------------------------------------

P1 = np.arange(8).reshape(2, 4).T.ravel()  # structural: a transpose
P2 = np.arange(8)[::-1].copy()


def _switch(i, x):
    return lax.switch(i, [lambda x: x[P1], lambda x: x[P2] * 2.0,
                          lambda x: x.at[np.array([1, 5])].set(x[:2] + 1.0)], x)


@pytest.mark.parametrize("batch", [4, 300])
def test_gathers_in_vmapped_switch_branches_are_seen(batch):
    i = jnp.arange(batch, dtype=jnp.int32) % 3
    x = jnp.arange(batch * 8, dtype=jnp.float32).reshape(batch, 8)
    f = jax.vmap(_switch)
    assert primitive_counts(jax.make_jaxpr(f)(i, x).jaxpr).get("gather", 0) == 2
    cj, report = _rewrite(f, i, x)
    assert primitive_counts(cj).get("gather", 0) == 0
    # the scatter is looked at: applied or declined, with its reason
    seen = [e for e in report.rewrites + report.declines
            if e.pass_name == "gathers" and e.before == ("scatter",)]
    assert seen
    assert all(e.reason for e in report.declines if e.before == ("scatter",))
    assert_equivalent(f, i, x, bitwise=True, vmap=False, grad=False)


# --- no static gather left in silence -------------------------------------------------------------

DN = lax.GatherDimensionNumbers(offset_dims=(), collapsed_slice_dims=(0,), start_index_map=(0,))


def _kinds(x):
    """Static gathers of several kinds, one per line (a line is a decline's location)."""
    n = x.shape[0]
    return [
        x[_transposed(n, 4)],                                              # structural: applied
        x[(np.arange(n) * 7 + 3) % n],                                     # no structural form
        x[np.roll(np.arange(n), 5)],                                       # needs concatenate
        lax.gather(x, np.array([[n + 3], [1]]), DN, (1,), mode="promise_in_bounds"),  # out of range
        x[jnp.round(jnp.linspace(0.0, n - 1.0, n)).astype(jnp.int32)[::-1]],  # a float step
        x[(jnp.arange(2 * n, dtype=jnp.int32) * 3 % n).reshape(2, n)],     # above fold_limit
    ]


def _line(fn, marker) -> int:
    src, start = inspect.getsourcelines(fn)
    return start + next(k for k, s in enumerate(src) if marker in s)


def test_every_static_gather_left_is_a_recorded_decline():
    x = jnp.arange(40, dtype=jnp.float32)  # operand and outputs within fold_limit=48
    f = lambda x: _kinds(x)  # noqa: E731
    cj, report = _rewrite(f, x, fold_limit=48)
    left = [e for e in _walk.iter_eqns(cj) if e.primitive.name == "gather"]
    assert len(left) == 5, len(left)  # all but the structural one
    declined = {e.location: e.reason for e in report.declines
                if e.pass_name == "gathers" and e.before == ("gather",)}
    for e in left:
        loc = C.source_location(e.source_info)
        assert loc in declined and declined[loc], (loc, sorted(declined))
    here = __file__.rsplit("/", 1)[-1]
    reasons = {int(loc.rsplit(":", 1)[1]): r for loc, r in declined.items()
               if loc.startswith(here)}
    assert "fold_limit=48" in reasons[_line(_kinds, "above fold_limit")]
    assert "did not evaluate" in reasons[_line(_kinds, "a float step")]
    assert_equivalent(f, x, bitwise=True, fold_limit=48, vmap=False)


# --- the fold_limit cliff ---------------------------------------------------------------------------

def _stages(n):
    """A bitonic sorting network on `n` keys: (partner, take the min?) per compare-exchange."""
    i = np.arange(n)
    k = 2
    while k <= n:
        j = k // 2
        while j >= 1:
            partner = i ^ j
            yield partner, (i < partner) == ((i & k) == 0)
            j //= 2
        k *= 2


def bitonic(x):
    for partner, take_lo in _stages(x.shape[-1]):
        y = x[:, partner]
        x = jnp.where(take_lo, jnp.minimum(x, y), jnp.maximum(x, y))
    return x


def bitonic_row(x):
    for partner, take_lo in _stages(x.shape[-1]):
        y = x[partner]
        x = jnp.where(take_lo, jnp.minimum(x, y), jnp.maximum(x, y))
    return x


@pytest.mark.parametrize("name,fn", [("batch axis", bitonic), ("vmap", jax.vmap(bitonic_row))])
def test_sorting_network_above_fold_limit_is_rewritten(name, fn):
    rows = 65536  # 65,536 x 32 = 2^21 elements: twice the default fold_limit
    x = jnp.asarray(np.random.default_rng(0).integers(-50, 50, (rows, 32)), jnp.int32)
    assert x.size > Options().fold_limit
    cj, report = _rewrite(fn, x)
    assert primitive_counts(cj).get("gather", 0) == 0
    assert not [e for e in report.declines if e.pass_name == "gathers"]
    got = np.asarray(jaxrewrite.optimize(fn)(x))
    np.testing.assert_array_equal(got, np.asarray(jax.jit(fn)(x)))
    np.testing.assert_array_equal(got, np.sort(np.asarray(x), axis=1))


def test_fold_limit_still_bounds_the_map_of_one_row():
    # rows that do not pass through (2 of them) are part of the map: 2 x 128 > fold_limit=64
    x = jnp.arange(256, dtype=jnp.float32).reshape(2, 128)
    cj, report = _rewrite(lambda x: x[:, ::-1][:, np.arange(128)[::-1]], x, fold_limit=64)
    assert primitive_counts(cj).get("gather", 0) == 1
    assert any("fold_limit=64" in e.reason for e in report.declines if e.pass_name == "gathers")
    # 4,096 rows pass through: the map is one row of 32
    x = jnp.arange(4096 * 32, dtype=jnp.int32).reshape(4096, 32)
    cj, _ = _rewrite(lambda x: x[:, np.arange(32)[::-1]], x, fold_limit=64)
    assert primitive_counts(cj).get("gather", 0) == 0


def test_index_table_above_fold_limit_with_a_row_iota_is_rewritten():
    # x[np.arange(n)[:, None], P]: the index is a (65536, 32, 2) table, 4M entries, that fold
    # leaves as broadcasts and a concatenate; its rows are an iota times one 32-entry table
    rows = 65536
    perm = np.arange(32).reshape(4, 8).T.ravel()
    x = jnp.asarray(np.random.default_rng(1).integers(-50, 50, (rows, 32)), jnp.int32)
    f = lambda x: x[np.arange(rows)[:, None], perm[None, :]]  # noqa: E731
    cj, report = _rewrite(f, x)
    counts = primitive_counts(cj)
    assert counts.get("gather", 0) == 0 and counts.get("concatenate", 0) == 0, counts
    assert not [e for e in report.declines if e.pass_name == "gathers"]
    np.testing.assert_array_equal(np.asarray(jaxrewrite.optimize(f)(x)), np.asarray(x)[:, perm])
