"""`analysis.indexmap`: gather/scatter source maps against lax itself, decomposition,
self-validation."""
import jax
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from jax import lax

from jaxrewrite.analysis import indexmap as IM
from jaxrewrite.analysis import repeats
from jaxrewrite.report.records import Decline

GDN = lax.GatherDimensionNumbers
SDN = lax.ScatterDimensionNumbers
MODES = ["clip", "fill", "promise_in_bounds"]
SENTINEL = -7


@st.composite
def gathers(draw, max_rank=3):
    """A random valid gather: (operand shape, indices, dimension numbers, slice sizes)."""
    rank = draw(st.integers(1, max_rank))
    shape = tuple(draw(st.lists(st.integers(0, 4), min_size=rank, max_size=rank)))
    dims = list(range(rank))
    n_obatch = draw(st.integers(0, min(1, rank)))
    obatch = tuple(sorted(draw(st.permutations(dims))[:n_obatch]))
    rest = [d for d in dims if d not in obatch]
    start_map = tuple(draw(st.permutations(rest))[:draw(st.integers(0, len(rest)))])
    collapsible = [d for d in rest if shape[d] >= 1]
    collapsed = tuple(sorted(d for d in collapsible if draw(st.booleans())))
    sizes = []
    for d in dims:
        if d in collapsed:
            sizes.append(1)
        elif d in obatch:
            sizes.append(min(1, shape[d]))
        else:
            sizes.append(draw(st.integers(0, shape[d])))
    batch_rank = draw(st.integers(n_obatch, n_obatch + 2))
    ibatch = tuple(draw(st.permutations(range(batch_rank)))[:n_obatch])
    bshape = [draw(st.integers(0, 3)) for _ in range(batch_rank)]
    for od, idim in zip(obatch, ibatch):
        bshape[idim] = shape[od]
    n_offset = rank - len(collapsed) - len(obatch)
    out_rank = n_offset + batch_rank
    offset = tuple(sorted(draw(st.permutations(range(out_rank)))[:n_offset]))
    dtype = draw(st.sampled_from([np.int8, np.uint8, np.int16, np.int32, np.uint32]))
    lo = 0 if np.dtype(dtype).kind == "u" else -6
    n = int(np.prod(bshape)) * len(start_map)
    vals = draw(st.lists(st.integers(lo, 8), min_size=n, max_size=n))
    idx = np.array(vals, dtype=dtype).reshape(tuple(bshape) + (len(start_map),))
    dn = GDN(offset_dims=offset, collapsed_slice_dims=collapsed, start_index_map=start_map,
             operand_batching_dims=obatch, start_indices_batching_dims=ibatch)
    return shape, idx, dn, tuple(sizes)


def _lax_gather_tagged(shape, idx, dn, sizes, mode):
    x = np.arange(int(np.prod(shape)), dtype=np.int32).reshape(shape)
    f = jax.jit(lambda x, i: lax.gather(x, i, dn, sizes, mode=mode, fill_value=SENTINEL))
    return np.asarray(f(x, idx)), x


def _from_map(x, smap):
    flat = x.reshape(-1)
    if smap.size == 0:
        return np.zeros(smap.shape, np.int32)
    return np.where(smap < 0, SENTINEL, flat[np.maximum(smap, 0)] if flat.size else 0)


@settings(max_examples=max(60, settings.default.max_examples))
@given(gathers(), st.sampled_from(MODES))
def test_gather_map_matches_lax_gather(g, mode):
    shape, idx, dn, sizes = g
    try:
        smap = IM.gather_map(shape, idx, dn, sizes, mode)
    except Decline:
        # Only where the result is implementation-defined.
        assert mode == "promise_in_bounds" or not np.all(idx >= 0)
        return
    ref, x = _lax_gather_tagged(shape, idx, dn, sizes, mode)
    assert smap.dtype == np.int64 and smap.shape == ref.shape
    np.testing.assert_array_equal(_from_map(x, smap), ref)


@settings(max_examples=max(40, settings.default.max_examples))
@given(gathers(), st.sampled_from(["clip", "fill"]))
def test_decompose_is_exact_or_declines(g, mode):
    shape, idx, dn, sizes = g
    smap = IM.gather_map(shape, idx, dn, sizes, mode)
    for allow in (False, True):
        try:
            prog = IM.decompose(shape, smap, allow_concat=allow)
        except Decline:
            continue
        x = np.arange(int(np.prod(shape)), dtype=np.int32).reshape(shape)
        got = IM.apply_program(x, prog)
        keep = smap >= 0
        np.testing.assert_array_equal(got[keep], x.reshape(-1)[smap[keep]])
        if not allow:
            assert "concatenate" not in IM.program_primitives(prog)


@settings(max_examples=max(40, settings.default.max_examples))
@given(gathers(), st.lists(st.integers(1, 3), min_size=1, max_size=2))
def test_lifted_program_is_the_program_on_every_leading_element(g, lead):
    """`lift_program` (what the gathers pass emits instead of tracing `vmap`) applies the
    program to each element of the leading dims, concatenates included."""
    shape, idx, dn, sizes = g
    smap = IM.gather_map(shape, idx, dn, sizes, "clip")
    try:
        prog = IM.decompose(shape, smap, allow_concat=True)
    except Decline:
        return
    xs = np.arange(int(np.prod(lead)) * int(np.prod(shape)), dtype=np.int32).reshape(
        tuple(lead) + shape)
    got = IM.apply_program(xs, IM.lift_program(prog, tuple(lead)))
    want = np.stack([IM.apply_program(x, prog) for x in xs.reshape((int(np.prod(lead)),) + shape)])
    np.testing.assert_array_equal(got, want.reshape(tuple(lead) + want.shape[1:]))


def test_mode_none_is_promise_in_bounds():
    dn = GDN(offset_dims=(), collapsed_slice_dims=(0,), start_index_map=(0,))
    with pytest.raises(Decline):
        IM.gather_map((3,), np.array([[5]]), dn, (1,), None)
    assert IM.gather_map((3,), np.array([[2]]), dn, (1,), None).tolist() == [2]


def test_fill_wraps_wide_indices_like_jax():
    # JAX converts FILL_OR_DROP indices to int32 before the bounds check.
    dn = GDN(offset_dims=(), collapsed_slice_dims=(0,), start_index_map=(0,))
    idx = np.array([[2 ** 32 + 1], [2 ** 31], [1]], np.int64)
    assert IM.gather_map((4,), idx, dn, (1,), "fill").tolist() == [1, -1, 1]


def test_scatter_map_matches_lax_scatter():
    dn = SDN(update_window_dims=(1,), inserted_window_dims=(0,), scatter_dims_to_operand_dims=(0,))
    idx = np.array([[3], [0], [9], [-1]], np.int32)
    for mode in ("clip", "fill"):
        t = IM.scatter_map((5, 2), (4, 2), idx, dn, mode)
        x = np.zeros(10, np.int32)
        upd = np.arange(1, 9, dtype=np.int32).reshape(4, 2)
        ref = jax.jit(lambda x, u: lax.scatter(x, idx, u, dn, mode=mode))(x.reshape(5, 2), upd)
        mine = x.copy()
        ok = t >= 0
        mine[t[ok]] = upd[ok]
        if mode == "clip":  # clipped duplicates: XLA's order; compare the unique targets only
            uniq = np.bincount(t[ok], minlength=10) == 1
            np.testing.assert_array_equal(mine[uniq], np.asarray(ref).reshape(-1)[uniq])
        else:
            np.testing.assert_array_equal(mine, np.asarray(ref).reshape(-1))


@pytest.mark.parametrize("name,shape,smap,prims", [
    ("identity", (4, 4), np.arange(16).reshape(4, 4), set()),
    ("transpose", (4, 4), np.arange(16).reshape(4, 4).T, {"transpose"}),
    ("rev-slice", (4, 4), np.arange(16).reshape(4, 4)[::-1, 1:3], {"slice", "rev"}),
    ("diagonal", (4, 4), np.diag(np.arange(16).reshape(4, 4)), {"reshape", "slice"}),
    ("bit-reversal", (8,), np.array([0, 4, 2, 6, 1, 5, 3, 7]), {"reshape", "transpose"}),
    ("broadcast", (3, 4), np.broadcast_to(np.arange(12).reshape(3, 4)[1], (5, 4)),
     {"slice", "reshape", "broadcast_in_dim"}),
    ("strided", (10,), np.arange(1, 10, 3), {"slice"}),
])
def test_structural_forms(name, shape, smap, prims):
    prog = IM.decompose(shape, smap)
    assert IM.program_primitives(prog) <= prims | {"reshape"}
    assert IM.validate(shape, smap, prog)


def test_roll_needs_concatenate():
    smap = np.roll(np.arange(8), 3)
    with pytest.raises(Decline):
        IM.decompose((8,), smap)
    prog = IM.decompose((8,), smap, allow_concat=True)
    assert "concatenate" in IM.program_primitives(prog) and IM.program_pieces(prog) == 2


def test_piece_budget_declines():
    rng = np.random.default_rng(0)
    smap = rng.permutation(64)
    with pytest.raises(Decline):
        IM.decompose((64,), smap, allow_concat=True, piece_budget=4)


def test_validate_rejects_wrong_program():
    smap = np.arange(16).reshape(4, 4).T
    assert not IM.validate((4, 4), smap, (("rev", (0,)),))
    assert IM.validate((4, 4), smap, (("transpose", (1, 0)),))


def _inner_digit_reference(f, wild, r):
    """The inner-digit step written block by block (the vectorised one must agree exactly)."""
    blocks, wb = f.reshape(-1, r), wild.reshape(-1, r)
    c = 0
    for b in range(blocks.shape[0]):
        known = [i for i in range(r) if not wb[b, i]]
        if len(known) >= 2:
            num, den = blocks[b, known[1]] - blocks[b, known[0]], known[1] - known[0]
            if num % den:
                return None
            c = int(num // den)
            break
    base = []
    for b in range(blocks.shape[0]):
        known = [i for i in range(r) if not wb[b, i]]
        if any(blocks[b, i] != blocks[b, known[0]] + c * (i - known[0]) for i in known):
            return None
        base.append(blocks[b, known[0]] - c * known[0] if known else 0)
    return c, np.array(base, np.int64), np.all(wb, axis=1)


@settings(max_examples=max(200, settings.default.max_examples))
@given(st.sampled_from([2, 3, 4]), st.integers(1, 5), st.integers(-3, 3), st.data())
def test_inner_digit_matches_the_block_by_block_reference(r, n_blocks, step, data):
    """Near-affine maps with wild entries: the same step, bases and all-wild blocks (or None)."""
    bases = data.draw(st.lists(st.integers(-8, 8), min_size=n_blocks, max_size=n_blocks))
    f = (np.array(bases)[:, None] + step * np.arange(r)).reshape(-1).astype(np.int64)
    if data.draw(st.booleans()):
        f[data.draw(st.integers(0, f.size - 1))] += data.draw(st.integers(-2, 2))
    wild = np.array(data.draw(st.lists(st.booleans(), min_size=f.size, max_size=f.size)))
    got, want = IM._inner_digit(f, wild, r), _inner_digit_reference(f, wild, r)
    assert (got is None) == (want is None)
    if got is not None:
        assert got[0] == want[0]
        np.testing.assert_array_equal(got[2], want[2])
        np.testing.assert_array_equal(got[1][~got[2]], want[1][~want[2]])


def test_scatter_window_core_leading_passthrough_dims():
    # vmap of s.at[..., 3, 1:4].set(v): the batch is update window dim 0, covered whole
    dn = SDN(update_window_dims=(0, 1), inserted_window_dims=(1,),
             scatter_dims_to_operand_dims=(1, 2))
    assert IM.scatter_window_core((65536, 4, 4), (65536, 3), dn, 64) == (1, (1, 4, 4), (1, 3))
    assert IM.scatter_window_core((16, 4, 4), (16, 3), dn, 64) == (0, (16, 4, 4), (16, 3))
    # an index addresses dim 0: not a passthrough dim
    dn0 = SDN(update_window_dims=(0, 1), inserted_window_dims=(1,),
              scatter_dims_to_operand_dims=(0, 1))
    assert IM.scatter_window_core((65536, 4, 4), (65536, 4), dn0, 64)[0] == 0
    # the batch trailing (x.at[idx].set(v) on (4, n)): not leading, analysed whole
    dnt = SDN(update_window_dims=(1,), inserted_window_dims=(0,),
              scatter_dims_to_operand_dims=(0,))
    assert IM.scatter_window_core((4, 65536), (2, 65536), dnt, 64)[0] == 0


def test_no_concat_reason_ends_the_decline():
    smap = np.roll(np.arange(8), 3)
    with pytest.raises(Decline, match="gathers='all' allows it"):
        IM.decompose((8,), smap)
    with pytest.raises(Decline, match="too large, say"):
        IM.decompose((8,), smap, no_concat_reason="too large, say")
    big = np.roll(np.arange(IM.SPLIT_MAX_ELEMENTS + 8), 3)
    with pytest.raises(Decline, match="SPLIT_MAX_ELEMENTS"):
        IM.decompose(big.shape, big, allow_concat=True)


def test_gather_batch_core_forms():
    n = 100
    # take_along_axis: batching dims (0, 0), the same indices in every row
    dn = GDN(offset_dims=(), collapsed_slice_dims=(1,), start_index_map=(1,),
             operand_batching_dims=(0,), start_indices_batching_dims=(0,))
    idx = np.broadcast_to(np.array([3, 2, 1, 0]), (n, 4))[..., None]
    rows, shape, core = IM.gather_batch_core((n, 4), idx, dn, (1, 1), 64)
    assert rows == {0: 0} and shape == (1, 4) and core.shape == (1, 4, 1)
    full = IM.gather_map((n, 4), idx, dn, (1, 1), "clip")
    one = IM.gather_map(shape, core, dn, (1, 1), "clip")
    np.testing.assert_array_equal(full, one + 4 * np.arange(n)[:, None])  # row b: one row's + b
    varying = idx.copy()
    varying[7, 0, 0] = 1
    assert IM.gather_batch_core((n, 4), varying, dn, (1, 1), 64)[0] == {}
    assert IM.gather_batch_core((n, 4), idx, dn, (1, 1), 128)[0] == {}  # batch not above big
    # x[np.arange(n)[:, None], p]: an iota component addressing collapsed dim 0
    dn2 = GDN(offset_dims=(), collapsed_slice_dims=(0, 1), start_index_map=(0, 1))
    p = np.array([3, 2, 1, 0])
    idx2 = np.stack(np.broadcast_arrays(np.arange(n)[:, None], p[None, :]), axis=-1)
    rows, shape, core = IM.gather_batch_core((n, 4), idx2, dn2, (1, 1), 64)
    assert rows == {0: 0} and shape == (1, 4)
    np.testing.assert_array_equal(IM.gather_map((n, 4), idx2, dn2, (1, 1), "clip"),
                                  IM.gather_map(shape, core, dn2, (1, 1), "clip")
                                  + 4 * np.arange(n)[:, None])
    shifted = idx2.copy()
    shifted[..., 0] = (shifted[..., 0] + 1) % n
    assert IM.gather_batch_core((n, 4), shifted, dn2, (1, 1), 64)[0] == {}


def _repeat_along_batching(idx, ibatch):
    """`idx` with its first row repeated along each index batching dim."""
    core = idx[tuple(slice(0, 1) if d in ibatch else slice(None) for d in range(idx.ndim))]
    return np.broadcast_to(core, idx.shape)


@settings(max_examples=max(60, settings.default.max_examples))
@given(gathers(), st.sampled_from(["clip", "fill"]))
def test_a_gather_batch_made_a_window_gives_the_same_result(g, mode):
    """`gather_unbatched`: where it applies, the gather with the batch as a window dim and one
    row of the table is lax's batched gather, element for element (or it declines)."""
    shape, idx, dn, sizes = g
    ibatch = tuple(dn.start_indices_batching_dims)
    idx = _repeat_along_batching(idx, ibatch)
    r = IM.gather_unbatched(shape, idx.shape, dn, sizes, ibatch)
    if r is None:
        return
    new_dn, new_sizes, gone = r
    core = repeats.row(idx, gone)
    assert not new_dn.operand_batching_dims and core.ndim == idx.ndim - len(gone)
    ref, _ = _lax_gather_tagged(shape, idx, dn, sizes, mode)
    got, _ = _lax_gather_tagged(shape, core, new_dn, new_sizes, mode)
    np.testing.assert_array_equal(got, ref)


def test_a_gather_batch_is_not_made_a_window_that_would_reorder_the_result():
    # operand (4, 5, 6), batch at operand dim 1; the window dim 2 comes out first (offset 0):
    # a window dim at operand dim 1 would come out before it
    dn = GDN(offset_dims=(0,), collapsed_slice_dims=(0,), start_index_map=(0,),
             operand_batching_dims=(1,), start_indices_batching_dims=(0,))
    assert IM.gather_unbatched((4, 5, 6), (5, 3, 1), dn, (1, 1, 6), (0,)) is None
    # the same batch with the window dim after it: made a window
    dn = GDN(offset_dims=(2,), collapsed_slice_dims=(0,), start_index_map=(0,),
             operand_batching_dims=(1,), start_indices_batching_dims=(0,))
    new_dn, sizes, gone = IM.gather_unbatched((4, 5, 6), (5, 3, 1), dn, (1, 1, 6), (0,))
    assert new_dn.offset_dims == (0, 2) and sizes == (1, 5, 6) and gone == (0,)


@settings(max_examples=max(60, settings.default.max_examples))
@given(gathers(), st.sampled_from(["clip", "fill"]))
def test_a_scatter_batch_made_a_window_gives_the_same_result(g, mode):
    """`scatter_unbatched` on the scatter that mirrors a random gather (its windows, inserted
    dims and batching dims): where it applies, the unbatched integer scatter-add is lax's
    batched one. (Duplicate targets included, though the gathers pass makes a window only of a
    scatter that writes each element once.)"""
    shape, idx, gdn, sizes = g
    ibatch = tuple(gdn.start_indices_batching_dims)
    idx = _repeat_along_batching(idx, ibatch)
    dn = SDN(update_window_dims=gdn.offset_dims, inserted_window_dims=gdn.collapsed_slice_dims,
             scatter_dims_to_operand_dims=gdn.start_index_map,
             operand_batching_dims=gdn.operand_batching_dims,
             scatter_indices_batching_dims=ibatch)
    ushape = IM.gather_output_shape(idx.shape, gdn, sizes)
    r = IM.scatter_unbatched(shape, idx.shape, ushape, dn, ibatch)
    if r is None:
        return
    new_dn, gone = r
    core = repeats.row(idx, gone)
    assert not new_dn.operand_batching_dims
    x = np.arange(int(np.prod(shape)), dtype=np.int32).reshape(shape)
    u = (np.arange(int(np.prod(ushape)), dtype=np.int32) * 7 + 1).reshape(ushape)
    add = jax.jit(lambda x, i, u, dn: lax.scatter_add(x, i, u, dn, mode=mode),
                  static_argnums=3)
    np.testing.assert_array_equal(np.asarray(add(x, core, u, new_dn)),
                                  np.asarray(add(x, idx, u, dn)))
