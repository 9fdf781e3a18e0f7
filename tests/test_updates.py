"""Static-index updates answer to the cost model: never a select where XLA updates in place.

On the CPU a static `.at[i].set(v)` / `dynamic_update_slice` stays the update it is (XLA writes the
buffer in place) unless scalarize splits the updated axis, where its select form is renaming; on
the GPU row the select form fuses (passes/_updates.py, backend/cost.py `update_form`); the TPU
row takes it from a minimum operand size (`update_select_min_elements`).
"""
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import jaxrewrite
from jaxrewrite.testing import assert_equivalent, primitive_counts

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "bench"))
import updates as bench_updates  # noqa: E402  (its cube step of 18 turns)

UPDATES = {"scatter", "scatter-add", "scatter_add", "scatter-mul", "scatter_mul",
           "scatter-min", "scatter-max", "dynamic_update_slice"}


def _rewrite(fn, *args, **opts):
    return jaxrewrite.rewrite_jaxpr_with_report(jax.make_jaxpr(fn)(*args), **opts)


def _updates(cj) -> int:
    return sum(n for p, n in primitive_counts(cj).items() if p in UPDATES)


def _face(c):                       # a cube-environment face turn, as users write it
    return c.at[2].set(jnp.rot90(c[2], k=-1))


def _shift(L):                      # a register shift from a cipher / PRNG specification
    return jnp.roll(L, -1).at[2].set(L[0] ^ (L[3] >> 1))


def _shift_loop(L):
    return lax.fori_loop(0, 8, lambda i, L: _shift(L), L)


def _several(x):                    # several updates in a row, on several axes
    x = x.at[:, 3].set(x[:, 0] * 2)
    x = x.at[1, 2].add(7)
    x = x.at[0].multiply(3)
    return lax.dynamic_update_slice(x, x[:2, :2] + 1, (2, 1))


_helper = jax.jit(_several)

# a face turn's ring of stickers as a constant table repeated per cube: a scatter with batching
# dims (the form Jumanji's RubiksCube reaches once its tables are folded)
_RING = np.stack([np.array([0, 0, 0, 1, 1, 1, 4, 4, 4, 5, 5, 5]), np.array([0] * 6 + [2] * 6),
                  np.array([0, 1, 2] * 4)], -1)
_RING_DN = lax.ScatterDimensionNumbers(
    update_window_dims=(), inserted_window_dims=(1, 2, 3), scatter_dims_to_operand_dims=(1, 2, 3),
    operand_batching_dims=(0,), scatter_indices_batching_dims=(0,))


def _ring(c):
    n = c.shape[0]
    table = np.broadcast_to(_RING, (n, 12, 3))
    moved = jnp.roll(c.reshape(n, 54)[:, :12], 3, axis=1)
    return lax.scatter(c, table, moved, _RING_DN, mode="drop")


CASES = {
    # name: (fn, make(batch) -> args)
    "face turn, vmap": (jax.vmap(_face),
                        lambda n: (np.random.default_rng(0).integers(0, 6, (n, 6, 3, 3),
                                                                     dtype=np.int8),)),
    "register shift, vmap": (jax.vmap(_shift),
                             lambda n: (np.arange(n * 5, dtype=np.uint32).reshape(n, 5),)),
    "register shift, fori_loop, vmap": (jax.vmap(_shift_loop),
                                        lambda n: (np.arange(n * 5, dtype=np.uint32)
                                                   .reshape(n, 5),)),
    "register shift, leading batch axis": (
        lambda L: L.at[:, 2].set(L[:, 0] ^ (L[:, 3] >> 1)),
        lambda n: (np.arange(n * 5, dtype=np.uint32).reshape(n, 5),)),
    "ring of stickers by a table, batching dims": (_ring,
                                         lambda n: (np.random.default_rng(1).integers(
                                             0, 6, (n, 6, 3, 3), dtype=np.int8),)),
    "several updates, vmap": (jax.vmap(_several),
                              lambda n: (np.arange(n * 16, dtype=np.int32).reshape(n, 4, 4),)),
    "several updates, jitted helper": (jax.vmap(lambda x: _helper(x) + 1),
                                       lambda n: (np.arange(n * 16, dtype=np.int32)
                                                  .reshape(n, 4, 4),)),
    "float set, leading batch axis": (lambda x: x.at[..., 1].set(-0.0).at[..., 2].add(x[..., 0]),
                                      lambda n: (np.linspace(-1, 1, n * 4, dtype=np.float32)
                                                 .reshape(n, 4),)),
}


@pytest.mark.parametrize("batch", [1, 4096, 65536])
@pytest.mark.parametrize("name", sorted(CASES))
def test_cpu_keeps_static_updates_in_place(name, batch):
    """Where nothing splits the updated axis, the CPU program keeps every update, and each
    static one left is a recorded decline that gives the estimate."""
    fn, make = CASES[name]
    args = make(batch)
    before = _updates(jax.make_jaxpr(fn)(*args))
    res = _rewrite(fn, *args, target="cpu")
    assert _updates(res.jaxpr) == before > 0
    kept = [d for d in res.report.declines if "in-place update" in (d.reason or "")]
    assert kept and all("element(s)" in d.reason for d in kept)


@pytest.mark.parametrize("name", sorted(CASES))
def test_updates_kept_are_exact(name):
    fn, make = CASES[name]
    assert_equivalent(fn, *make(96), bitwise=True)


@pytest.mark.parametrize("name", sorted(CASES))
def test_gpu_row_takes_the_select_form(name):
    """On the GPU row a static update becomes a select, which fuses (tests/test_kernels_gpu.py
    counts the kernels), or renaming where scalarize then splits it; the same bits."""
    fn, make = CASES[name]
    args = make(96)
    cj = assert_equivalent(fn, *args, bitwise=True, target="gpu")
    assert _updates(cj) < _updates(jax.make_jaxpr(fn)(*args))
    res = _rewrite(fn, *args, target="gpu")
    assert (primitive_counts(res.jaxpr).get("select_n", 0) >= 1
            or any(e.pass_name == "scalarize" for e in res.report.rewrites))


@pytest.mark.parametrize("name", sorted(n for n in CASES if "batching dims" not in n))
def test_tpu_row_takes_the_select_form_from_its_minimum_operand(name):
    """The TPU row takes the select form only from `update_select_min_elements` operand elements
    (below it the select measured no faster and compiled slower on the chip): at 4,096 examples
    every update stays, each a decline that names the minimum; at 65,536 they are rewritten."""
    from jaxrewrite.backend import cost
    fn, make = CASES[name]
    least = cost.costs("tpu").update_select_min_elements
    small, large = make(4096), make(65536)
    assert small[0].size < least <= large[0].size
    res = _rewrite(fn, *small, target="tpu")
    before = _updates(jax.make_jaxpr(fn)(*small))
    assert _updates(res.jaxpr) == before > 0
    kept = [d for d in res.report.declines if f"below {least}" in (d.reason or "")]
    assert len(kept) == before
    res = _rewrite(fn, *large, target="tpu")
    assert _updates(res.jaxpr) < _updates(jax.make_jaxpr(fn)(*large))
    assert_equivalent(fn, *large, bitwise=True, target="tpu")


def _switch_of_updates(i, x):        # a vmapped `switch` whose branches write one word each
    return lax.switch(i, [lambda x: x.at[1].set(x[0] + 1), lambda x: x.at[5].set(x[2] ^ 3)], x)


def test_tpu_row_takes_the_select_form_below_its_minimum_where_selects_read_it():
    """Below the minimum the TPU still takes the select form of an update whose every use is a
    `select_n` (the vmapped switch merging its branches): the select joins it, where the update
    would be a kernel of its own. The same bits."""
    from jaxrewrite.backend import cost
    fn = jax.vmap(_switch_of_updates)
    i = (np.arange(4096) % 2).astype(np.int32)
    x = np.arange(4096 * 8, dtype=np.uint32).reshape(4096, 8)
    assert x.size < cost.costs("tpu").update_select_min_elements
    before = jax.make_jaxpr(fn)(i, x)
    assert _updates(before) == 2
    res = _rewrite(fn, i, x, target="tpu")
    assert _updates(res.jaxpr) == 0
    assert not [d for d in res.report.declines if "kept as an" in (d.reason or "")]
    # the same updates read by anything else stay (below the minimum)
    res = _rewrite(lambda i, x: fn(i, x).sum(0) + _updates_read_twice(x), i, x, target="tpu")
    assert _updates(res.jaxpr) >= 1
    assert_equivalent(fn, i, x, bitwise=True, target="tpu")


def _updates_read_twice(x):
    y = x.at[:, 3].set(x[:, 0])
    return y.sum(0) + y[0]


def _lfsr(L):
    for _ in range(16):
        t = L[0] ^ (L[3] >> 1) ^ (L[5] << 3)
        L = jnp.roll(L, -1).at[7].set(t)
    return L


def test_a_split_register_shift_takes_the_update_as_renaming():
    """roll + `.at[7].set` over 8 words, 16 steps, 65,536 registers: scalarize splits the words,
    and the update's select form along them is renaming (no update, no select, no concatenate)."""
    fn = jax.vmap(_lfsr)
    L = np.random.default_rng(1).integers(0, 2 ** 32, (65536, 8), dtype=np.uint32)
    res = _rewrite(fn, L, target="cpu")
    counts = primitive_counts(res.jaxpr)
    assert _updates(res.jaxpr) == 0
    assert counts.get("select_n", 0) == 0 and counts.get("concatenate", 0) == 0
    assert any(e.pass_name == "scalarize" for e in res.report.rewrites)
    assert_equivalent(fn, L[:4096], bitwise=True, vmap=False, grad=False)


def test_split_declined_keeps_the_update():
    """Batch 1: pieces of one element are below the CPU's minimum piece, so nothing splits and
    the updates stay as they were (not left as selects)."""
    fn = _lfsr
    L = np.arange(8, dtype=np.uint32)
    res = _rewrite(fn, L, target="cpu")
    assert _updates(res.jaxpr) == _updates(jax.make_jaxpr(fn)(L)) == 16
    assert primitive_counts(res.jaxpr).get("select_n", 0) == 0


@pytest.mark.parametrize("target,batch", [("cpu", 4096), ("tpu", 4096), ("tpu", 65536)])
def test_explain_shows_the_decision(target, batch):
    """explain() says what the target's cost row decided: the CPU keeps the update in place,
    and the TPU below its minimum operand keeps it, each saying why; the TPU from its minimum
    (the GPU's row) takes the select form, listed as a gathers rewrite."""
    fn, make = CASES["face turn, vmap"]
    e = jaxrewrite.explain(fn, target=target)(*make(batch))
    kept = [d for d in e.declines if "kept as an" in (d.reason or "")]
    taken = [ev for ev in e.rewrites if ev.pass_name == "gathers" and "scatter" in ev.before
             and "select_n" in ev.after]
    if target == "cpu" or batch == 4096:
        assert kept and not taken
        assert ("in-place update" if target == "cpu" else "below") in kept[0].reason
    else:
        assert taken and not kept


def test_an_update_whose_index_was_not_folded_says_why():
    """No static update is left in silence: with fold=False its index, computed from constants,
    never becomes a literal, and the decline says so."""
    def f(x):
        return x.at[jnp.arange(2) * 2].set(7)

    x = np.arange(8, dtype=np.int32)
    res = _rewrite(f, x, fold=False, target="gpu")
    assert _updates(res.jaxpr) == 1
    assert any(d.pass_name == "gathers" and "fold=False" in d.reason for d in res.report.declines)


def test_gathers_off_keeps_updates_even_where_scalarize_splits():
    fn = jax.vmap(_lfsr)
    L = np.random.default_rng(2).integers(0, 2 ** 32, (4096, 8), dtype=np.uint32)
    res = _rewrite(fn, L, target="cpu", gathers=False)
    assert _updates(res.jaxpr) == 16


def test_a_vmapped_table_scatter_is_mapped_per_element():
    """A scatter whose batching dims carry one table repeated per element is mapped for one
    element (54 entries, not 4,096 x 54) and the batch passes through; a table that differs per
    element, or a batch too small to matter, is mapped whole."""
    from jaxrewrite.analysis import indexmap as IM
    table = np.broadcast_to(_RING, (4096, 12, 3))
    k, xs, us, core = IM.scatter_batch_core((4096, 6, 3, 3), (4096, 12), table, _RING_DN, 64)
    assert (k, xs, us, core.shape) == (1, (1, 6, 3, 3), (1, 12), (1, 12, 3))
    other = table.copy()
    other[7, 0] = (2, 1, 1)
    assert IM.scatter_batch_core((4096, 6, 3, 3), (4096, 12), other, _RING_DN, 64) is None
    assert IM.scatter_batch_core((64, 6, 3, 3), (64, 12), table[:64], _RING_DN, 64) is None


# the nine 3x3 boxes of a 9x9 board as rows of 9 cells (a permutation of the 81 cells)
_BOX = np.arange(81).reshape(3, 3, 3, 3).transpose(0, 2, 1, 3).reshape(9, 9)


def _box_write_back(mask):          # Jumanji's Sudoku: boxes read, masked, written back
    flat = mask.reshape(81, 9)
    boxes = flat[_BOX] & (jnp.arange(9) % 2 == 0)
    return flat.at[_BOX].set(boxes).reshape(9, 9, 9)


def _perm_add(x):                   # every element written once, added to
    return x.at[np.array([0, 2, 1, 3])].add(x[::-1] * 5)  # (a 2x2 transpose)


def _float_perm_set(x, v):
    return x.at[..., np.array([2, 3, 0, 1])].set(v)  # (halves swapped)


OVERWRITES = {
    "box write-back, vmap": (jax.vmap(_box_write_back), lambda n: (
        np.random.default_rng(3).integers(0, 2, (n, 9, 9, 9)).astype(bool),)),
    "permutation add, vmap": (jax.vmap(_perm_add), lambda n: (
        np.arange(n * 4, dtype=np.int32).reshape(n, 4),)),
    "float permutation set, leading batch axis": (_float_perm_set, lambda n: (
        np.zeros((n, 4), np.float32),
        np.array([np.nan, -0.0, 1.5, -np.inf] * n, np.float32).reshape(n, 4))),
}


@pytest.mark.parametrize("batch", [1, 1024])
@pytest.mark.parametrize("name", sorted(OVERWRITES))
def test_an_update_that_writes_every_element_once_is_moved_data(name, batch):
    """Nothing of the operand survives, so there is nothing to update in place: on the CPU too
    the update becomes its updates moved (no select), and the bits are `jax.jit`'s."""
    fn, make = OVERWRITES[name]
    args = make(batch)
    assert _updates(jax.make_jaxpr(fn)(*args)) >= 1
    cj = assert_equivalent(fn, *args, bitwise=True, target="cpu")
    assert _updates(cj) == 0
    assert primitive_counts(cj).get("select_n", 0) == 0


def test_a_float_overwrite_keeps_its_gradient():
    x = np.linspace(-1, 1, 8, dtype=np.float32).reshape(2, 4)
    v = np.linspace(2, 3, 8, dtype=np.float32).reshape(2, 4)
    cj = assert_equivalent(lambda x, v: jnp.sum(_float_perm_set(x, v) * x), x, v, grad=True,
                           target="cpu")
    assert _updates(cj) == 0


@pytest.mark.parametrize("index", [np.array([3, 0, 2, 3]),      # one element written twice
                                   np.array([3, 0, 2])])        # one element not written
def test_an_update_that_misses_an_element_stays_in_place(index):
    def f(x):
        return x.at[index].set(jnp.arange(index.size, dtype=x.dtype)[:, None] + 10)

    x = np.arange(4 * 64, dtype=np.int32).reshape(64, 4).T
    res = _rewrite(f, x, target="cpu")
    assert _updates(res.jaxpr) == 1
    assert any("in-place update" in (d.reason or "") for d in res.report.declines)


@pytest.mark.parametrize("batch", [4096, 65536])
def test_updates_a_split_would_leave_selects_stay_in_place(batch):
    """A cube's 6 x 3 x 3 stickers are more pieces than a split takes: it would cut the 3 x 3
    axes and leave each turn's writes a select along the six faces (1.9-3.6x slower, compile
    20x). Those updates stay as they are, with the reason; nothing else is taken."""
    c = np.random.default_rng(4).integers(0, 6, (batch, 6, 3, 3), dtype=np.int8)
    fn = jax.vmap(bench_updates.cube_step)
    res = _rewrite(fn, c, target="cpu")
    assert _updates(res.jaxpr) == _updates(jax.make_jaxpr(fn)(c)) == 180
    assert primitive_counts(res.jaxpr).get("select_n", 0) == 0
    assert any(d.pass_name == "scalarize" and "kept in place" in (d.reason or "")
               for d in res.report.declines)


def test_updates_a_split_renames_are_taken_beside_those_it_would_not():
    """In one level, a register shift whose split makes its update renaming is taken; an
    update of a (6, 6) table beside it, which no split cuts, stays an update; the same bits."""
    def f(L, x):
        return _lfsr(L), x.at[1, 2].set(7)

    L = np.random.default_rng(5).integers(0, 2 ** 32, (4096, 8), dtype=np.uint32)
    x = np.arange(4096 * 36, dtype=np.int32).reshape(4096, 6, 6)
    fn = jax.vmap(f)
    res = _rewrite(fn, L, x, target="cpu")
    assert _updates(jax.make_jaxpr(fn)(L, x)) == 17
    assert _updates(res.jaxpr) == 1
    assert any(e.pass_name == "scalarize" for e in res.report.rewrites)
    assert_equivalent(fn, L, x, bitwise=True, target="cpu")
