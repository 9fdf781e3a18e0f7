"""Static index maps: where each output element of a gather or scatter comes from (pure numpy).

A *source map* of an operation with static indices is an int64 array of the output's shape whose
entries are flat (row-major) indices into the operand, or -1 where the output takes the fill
value. Data movement is fully determined by it, so it is the ground truth every structural
rewrite is checked against:

* `gather_map(...)`   - the exact semantics of `lax.gather` (every dimension-number form, every
  mode, negative and out-of-range indices, empty shapes) as a source map;
* `scatter_map(...)`  - for a static scatter, which update element lands on each operand element;
* `decompose(...)`    - a source map as a short program of structural forms (`Form` steps:
  slice with strides, rev, transpose, reshape, broadcast_in_dim, a select against a constant
  mask for fills; concatenate only when allowed);
* `apply_forms(...)`  - evaluates such a program on a numpy array, which `validate` uses on an
  int32 position-tagged operand to check a proposed program against the source map.

Nothing here sees a jaxpr; `Decline(reason)` is raised where the result is implementation-defined.
"""
from __future__ import annotations

import dataclasses
import enum
import itertools
from typing import Sequence

import numpy as np

from ..report.records import Decline

FILL = -1  # source-map entry of an element that takes the fill value

# Forms whose transpose moves more than this many (non-broadcast) axes are not proposed: XLA's
# CPU transpose of many tiny axes measured ~5x slower than the gather (FFT bit reversal of 256,
# bench/gathers.py), while a 5-axis pixel shuffle measured faster.
MAX_TRANSPOSE_RANK = 6

_INT32_MAX = np.iinfo(np.int32).max


# --- modes ---------------------------------------------------------------------------------------

def mode_name(mode) -> str:
    """'clip', 'fill' or 'promise' for a GatherScatterMode, its name, or None (lax's default)."""
    if mode is None:  # lax.gather/scatter with mode=None: PROMISE_IN_BOUNDS (see lax.gather)
        return "promise"
    name = mode.name if isinstance(mode, enum.Enum) else str(mode)
    name = name.upper()
    if name in ("CLIP",):
        return "clip"
    if name in ("FILL_OR_DROP", "FILL", "DROP"):
        return "fill"
    if name in ("PROMISE_IN_BOUNDS",):
        return "promise"
    raise Decline(f"gather/scatter mode {name} is not modelled")


def _dn(dimension_numbers, *names):
    return tuple(tuple(int(d) for d in getattr(dimension_numbers, n, ())) for n in names)


def _as_int64_saturating(idx: np.ndarray) -> np.ndarray:
    """Index values as int64; uint64 values beyond int64 saturate (they are out of range anyway)."""
    if idx.dtype == np.uint64:
        return np.minimum(idx, np.uint64(1 << 62)).astype(np.int64)
    return idx.astype(np.int64)


def _row_major_strides(shape: Sequence[int]) -> np.ndarray:
    strides = np.ones(len(shape), np.int64)
    for d in range(len(shape) - 2, -1, -1):
        strides[d] = strides[d + 1] * max(int(shape[d + 1]), 1)
    return strides


# --- gather --------------------------------------------------------------------------------------

def gather_output_shape(start_indices_shape, dimension_numbers, slice_sizes) -> tuple[int, ...]:
    offset_dims, collapsed, obatch = _dn(dimension_numbers, "offset_dims", "collapsed_slice_dims",
                                         "operand_batching_dims")
    batch_shape = list(start_indices_shape[:-1])
    out_rank = len(offset_dims) + len(batch_shape)
    sizes = iter(int(s) for i, s in enumerate(slice_sizes) if i not in collapsed and i not in obatch)
    bs = iter(batch_shape)
    return tuple(next(sizes) if d in offset_dims else next(bs) for d in range(out_rank))


def wide_window_dims(operand_shape, dimension_numbers, slice_sizes, big: int) -> dict[int, int]:
    """Operand dims that every window takes whole (start 0, full size: passthrough by
    construction) and that are larger than `big`: operand dim → output dim.

    A gather's map can be computed with these dims shrunk to 1 and the rest applied to them
    unchanged: a vmapped gather over 65,536 rows needs a map of 16 entries, not of a million.
    """
    offset_dims = tuple(int(d) for d in dimension_numbers.offset_dims)
    skip = set(int(d) for d in dimension_numbers.collapsed_slice_dims)
    skip |= set(int(d) for d in getattr(dimension_numbers, "operand_batching_dims", ()))
    start_map = set(int(d) for d in dimension_numbers.start_index_map)
    window = [d for d in range(len(operand_shape)) if d not in skip]
    return {d: offset_dims[k] for k, d in enumerate(window)
            if int(slice_sizes[d]) == operand_shape[d] and d not in start_map
            and big < operand_shape[d] < 2 ** 31}  # (a dim past int32 changes FILL's wrap)


def window_core(operand_shape, dimension_numbers, slice_sizes, big: int):
    """(wide dims, operand shape, slice sizes) with the `wide_window_dims` shrunk to 1: what a
    gather's map is computed on; the wide dims pass through unchanged."""
    wide = wide_window_dims(operand_shape, dimension_numbers, slice_sizes, big)
    xs = tuple(1 if d in wide else int(s) for d, s in enumerate(operand_shape))
    ss = tuple(1 if d in wide else int(s) for d, s in enumerate(slice_sizes))
    return wide, xs, ss


def gather_batch_core(operand_shape, start_indices, dimension_numbers, slice_sizes, big: int):
    """(passthrough, operand shape, indices) of a gather whose operand dim 0 is a batch read
    row for row: output row b (output dim 0, index dim 0) reads operand row b, with one index
    pattern for every row. Two forms say so:

    * dim 0 is an operand batching dim paired with index dim 0, and the indices are the same
      at every position along it (`take_along_axis` with a broadcast index);
    * dim 0 is collapsed and addressed by an index component that is an iota along index dim 0,
      the other components the same at every position along it (`x[np.arange(n)[:, None], p]`).

    Then the map is computed with operand dim 0 and index dim 0 shrunk to 1, and
    `passthrough` = {0: 0} (operand dim → output dim, as `wide_window_dims`); otherwise ({},
    operand shape, indices) unchanged. Only a batch of more than `big` rows is shrunk.
    """
    idx = np.asarray(start_indices)
    shape = tuple(int(d) for d in operand_shape)
    unchanged = ({}, shape, idx)
    if idx.ndim < 2 or not shape or not big < shape[0] < 2 ** 31 or idx.shape[0] != shape[0]:
        return unchanged
    offset_dims, collapsed, start_map, obatch, ibatch = _dn(
        dimension_numbers, "offset_dims", "collapsed_slice_dims", "start_index_map",
        "operand_batching_dims", "start_indices_batching_dims")
    if 0 in offset_dims:  # output dim 0 is then a window dim, not index dim 0
        return unchanged
    first = idx[:1]
    if 0 in obatch:
        if ibatch[obatch.index(0)] != 0 or not (
                idx.strides[0] == 0    # (a broadcast view: the same along dim 0 by construction)
                or np.array_equal(idx, np.broadcast_to(first, idx.shape))):
            return unchanged
    elif 0 in collapsed and 0 in start_map and int(slice_sizes[0]) == 1:
        k = start_map.index(0)
        iota = np.arange(shape[0]).reshape((shape[0],) + (1,) * (idx.ndim - 2))
        others = np.delete(idx, k, axis=-1)
        if not (np.array_equal(idx[..., k], np.broadcast_to(iota, idx.shape[:-1]))
                and np.array_equal(others, np.broadcast_to(others[:1], others.shape))):
            return unchanged
    else:
        return unchanged
    return {0: 0}, (1,) + shape[1:], np.ascontiguousarray(first)


def scatter_window_core(operand_shape, updates_shape, dimension_numbers, big: int):
    """(k, operand core shape, updates core shape) of a scatter: its leading operand dims
    0..k-1 are covered whole by every update window (start 0, full size, no index addresses
    them) and are updates dims 0..k-1 too; the core shapes have them shrunk to 1. k is 0 unless
    those dims hold more than `big` elements.

    Such dims are identity-mapped (a vmapped `x.at[..., 3, 1:4].set(v)` over 65,536 rows), so
    the scatter's map is computed on the core, 16 entries rather than a million, and the rest
    applied to the leading dims unchanged (leading: mapping them adds no transposes).
    """
    dn = dimension_numbers
    uwd, inserted, obatch, to_operand = _dn(dn, "update_window_dims", "inserted_window_dims",
                                            "operand_batching_dims",
                                            "scatter_dims_to_operand_dims")
    window = [d for d in range(len(operand_shape)) if d not in inserted and d not in obatch]
    k = 0
    while (k < min(len(window), len(uwd)) and window[k] == k and uwd[k] == k
           and int(updates_shape[k]) == int(operand_shape[k]) < 2 ** 31 and k not in to_operand):
        k += 1
    if int(np.prod(operand_shape[:k], dtype=np.int64)) <= big:
        k = 0
    xs = (1,) * k + tuple(int(n) for n in operand_shape[k:])
    us = (1,) * k + tuple(int(n) for n in updates_shape[k:])
    return k, xs, us


def scatter_batch_core(operand_shape, updates_shape, indices: np.ndarray, dimension_numbers,
                       big: int):
    """(k, operand core shape, updates core shape, indices core) of a scatter whose leading dims
    0..k-1 are batching dims (`operand_batching_dims` and `scatter_indices_batching_dims` pair
    them with indices and updates dims 0..k-1) along which the indices are all the same: a
    vmapped `x.at[table].set(v)` with a constant table. Such dims are identity-mapped as in
    `scatter_window_core`, so the map is one batch element's (the indices' first row along them);
    None where there are none, or they hold no more than `big` elements.
    """
    uwd, obatch, ibatch = _dn(dimension_numbers, "update_window_dims", "operand_batching_dims",
                              "scatter_indices_batching_dims")
    pairs = dict(zip(obatch, ibatch))
    idx = np.asarray(indices)
    k = 0
    while (pairs.get(k) == k and k not in uwd and k < idx.ndim - 1 and k < len(updates_shape)
           and int(operand_shape[k]) == int(updates_shape[k]) == int(idx.shape[k]) < 2 ** 31):
        k += 1
    if k == 0 or int(np.prod(operand_shape[:k], dtype=np.int64)) <= big:
        return None
    core = idx[(slice(0, 1),) * k]
    if not all(s == 0 for s in idx.strides[:k]) and not np.all(idx == core):
        return None  # a different table per batch element: the map is the whole batch's
    xs = (1,) * k + tuple(int(n) for n in operand_shape[k:])
    us = (1,) * k + tuple(int(n) for n in updates_shape[k:])
    return k, xs, us, core


def _batch_to_window(obatch, ibatch, repeated, batch_pos, windows_before, offsets_before):
    """The batching pairs (operand dim, index dim) whose index dim is in `repeated`, made window
    dims: (their operand dims, the new offset dims, the operand and index batching dims kept,
    the index dims dropped), or None where there are none, or where moving them would reorder
    the result's dims (the operand's window dims fill the offset dims in order)."""
    moved = [(ob, ib) for ob, ib in zip(obatch, ibatch) if ib in repeated]
    if not moved:
        return None
    windows = sorted(set(windows_before) | {ob for ob, _ in moved})
    offsets = sorted(set(offsets_before) | {batch_pos[ib] for _, ib in moved})
    place = dict(zip(windows, offsets))
    if any(place[w] != o for w, o in zip(sorted(windows_before), sorted(offsets_before))) or \
            any(place[ob] != batch_pos[ib] for ob, ib in moved):
        return None
    gone = sorted(ib for _, ib in moved)
    keep = [(ob, ib) for ob, ib in zip(obatch, ibatch) if ib not in gone]
    return ([ob for ob, _ in moved], tuple(offsets), tuple(ob for ob, _ in keep),
            tuple(ib - sum(1 for g in gone if g < ib) for _, ib in keep), tuple(gone))


def gather_unbatched(operand_shape, index_shape, dimension_numbers, slice_sizes,
                     repeated: Sequence[int]):
    """A batched gather whose indices are the same along some batching dims (`repeated`: index
    dims), as one whose batch is a window dim: (new dimension numbers, new slice sizes, index
    dims to drop), or None. The result is the same element for element: each window starts at
    0 and spans the batch (always in bounds), and the other dims' starts are the same for every
    batch row.

        before:  gather x T[65536,12,3]  operand_batching_dims=(0,), slice (1,1,1,1)
        after:   gather x T0[12,3]       offset_dims=(0,), slice (65536,1,1,1)
    """
    offset_dims, collapsed, start_map, obatch, ibatch = _dn(
        dimension_numbers, "offset_dims", "collapsed_slice_dims", "start_index_map",
        "operand_batching_dims", "start_indices_batching_dims")
    out_rank = len(offset_dims) + len(index_shape) - 1
    batch_pos = [d for d in range(out_rank) if d not in offset_dims]
    windows = [d for d in range(len(operand_shape)) if d not in collapsed and d not in obatch]
    if not index_shape[-1]:
        return None   # no start index at all: see scatter_unbatched
    repeated = {d for d in repeated if index_shape[d] > 1}   # (a batch of one: nothing gained)
    r = _batch_to_window(obatch, ibatch, repeated, batch_pos, windows, offset_dims)
    if r is None:
        return None
    moved, offsets, kept_o, kept_i, gone = r
    dn = type(dimension_numbers)(
        offset_dims=offsets, collapsed_slice_dims=collapsed, start_index_map=start_map,
        operand_batching_dims=kept_o, start_indices_batching_dims=kept_i)
    sizes = [int(operand_shape[d]) if d in moved else int(s) for d, s in enumerate(slice_sizes)]
    return dn, tuple(sizes), gone


def scatter_unbatched(operand_shape, index_shape, updates_shape, dimension_numbers,
                      repeated: Sequence[int]):
    """`gather_unbatched` for a scatter: (new dimension numbers, index dims to drop), or None.
    The updates keep their shape; their batch dim becomes a window dim spanning the batch."""
    uwd, inserted, to_operand, obatch, ibatch = _dn(
        dimension_numbers, "update_window_dims", "inserted_window_dims",
        "scatter_dims_to_operand_dims", "operand_batching_dims", "scatter_indices_batching_dims")
    batch_pos = [d for d in range(len(updates_shape)) if d not in uwd]
    windows = [d for d in range(len(operand_shape)) if d not in inserted and d not in obatch]
    if not index_shape[-1]:
        # index vectors of no element: XLA:CPU placed such a windowed scatter-add's updates
        # elsewhere (x + u where the batched form and the same with one zero start component
        # gave the sums), found by test_indexmap's property test
        return None
    repeated = {d for d in repeated if index_shape[d] > 1}
    r = _batch_to_window(obatch, ibatch, repeated, batch_pos, windows, uwd)
    if r is None:
        return None
    _, window_dims, kept_o, kept_i, gone = r
    dn = type(dimension_numbers)(
        update_window_dims=window_dims, inserted_window_dims=inserted,
        scatter_dims_to_operand_dims=to_operand, operand_batching_dims=kept_o,
        scatter_indices_batching_dims=kept_i)
    return dn, gone


def gather_map(operand_shape, start_indices: np.ndarray, dimension_numbers, slice_sizes,
               mode) -> np.ndarray:
    """The source map of `lax.gather(operand, start_indices, dimension_numbers, slice_sizes, mode)`.

    Returns an int64 array of the gather's output shape: flat row-major indices into the operand,
    or -1 (`FILL`) where a FILL_OR_DROP gather yields its fill value. Semantics follow XLA's
    gather as JAX lowers it:

    * each start index k addresses operand dim `start_index_map[k]`; operand batching dims take
      the coordinate of the matching start-indices batching dim; offset dims walk the window;
    * CLIP / PROMISE_IN_BOUNDS: start indices are clamped to `[0, dim - slice_size]` (XLA);
      PROMISE_IN_BOUNDS with an index outside that range is implementation-defined: `Decline`;
    * FILL_OR_DROP: JAX converts indices to int32 (int64 if an operand dim exceeds int32) with
      wrap-around, then a window with any start outside `[0, dim - slice_size]` is filled.
    """
    return _window_map(operand_shape, start_indices, dimension_numbers, slice_sizes, mode,
                       fill_wrap=True)


def scatter_map(operand_shape, updates_shape, scatter_indices: np.ndarray, dimension_numbers,
                mode) -> np.ndarray:
    """Where each update element of a static scatter lands: an int64 array of the updates' shape
    of flat operand indices, -1 where the update is dropped (FILL_OR_DROP, window out of range).

    CLIP clamps like a gather; PROMISE_IN_BOUNDS out of range is implementation-defined
    (`Decline`). Unlike the gather, JAX passes scatter indices to XLA unconverted (no wrap).
    """
    dn = dimension_numbers
    window, inserted, obatch = _dn(dn, "update_window_dims", "inserted_window_dims",
                                   "operand_batching_dims")
    sizes, pos = [], 0
    for i in range(len(operand_shape)):
        if i in inserted or i in obatch:
            sizes.append(1)
        else:
            sizes.append(int(updates_shape[window[pos]]))
            pos += 1
    gdn = _GatherDN(window, inserted, _dn(dn, "scatter_dims_to_operand_dims")[0], obatch,
                    _dn(dn, "scatter_indices_batching_dims")[0])
    out = _window_map(operand_shape, scatter_indices, gdn, sizes, mode, fill_wrap=False)
    if out.shape != tuple(updates_shape):
        raise Decline(f"scatter updates shape {tuple(updates_shape)} != window map {out.shape}")
    return out


@dataclasses.dataclass(frozen=True)
class _GatherDN:
    offset_dims: tuple
    collapsed_slice_dims: tuple
    start_index_map: tuple
    operand_batching_dims: tuple = ()
    start_indices_batching_dims: tuple = ()


def _window_map(operand_shape, start_indices, dimension_numbers, slice_sizes, mode, *,
                fill_wrap: bool) -> np.ndarray:
    operand_shape = tuple(int(d) for d in operand_shape)
    slice_sizes = tuple(int(s) for s in slice_sizes)
    idx = np.asarray(start_indices)
    if idx.dtype.kind not in "iu":
        raise Decline(f"gather indices of dtype {idx.dtype} are not integers")
    if idx.ndim < 1:
        raise Decline("gather indices must have an index-vector dimension")
    offset_dims, collapsed, start_map, obatch, ibatch = _dn(
        dimension_numbers, "offset_dims", "collapsed_slice_dims", "start_index_map",
        "operand_batching_dims", "start_indices_batching_dims")
    mode = mode_name(mode)
    out_shape = gather_output_shape(idx.shape, dimension_numbers, slice_sizes)
    if int(np.prod(out_shape, dtype=np.int64)) == 0:
        return np.zeros(out_shape, np.int64)
    if any(s > d for s, d in zip(slice_sizes, operand_shape)):
        # Only reachable with empty indices (JAX skips the check there); XLA's result is not ours.
        raise Decline("gather slice size exceeds the operand dimension")

    op_rank = len(operand_shape)
    batch_shape = idx.shape[:-1]
    K = idx.shape[-1]
    strides = _row_major_strides(operand_shape)
    bounds = np.array([operand_shape[m] - slice_sizes[m] for m in start_map], np.int64)

    # Start of each window, per operand dim, as a flat offset over the batch shape.
    valid = np.ones(batch_shape, bool)
    if mode == "fill":
        wide = any(d > _INT32_MAX for d in operand_shape)
        if fill_wrap:
            v = idx.astype(np.int64 if wide else np.int32).astype(np.int64)  # JAX's wrap-around
        else:
            v = _as_int64_saturating(idx)
        inb = (v >= 0) & (v <= bounds)
        valid = np.all(inb, axis=-1) if K else valid
        starts = np.where(inb, v, 0)
    else:
        v = _as_int64_saturating(idx)
        inb = (v >= 0) & (v <= bounds)
        if mode == "promise" and not np.all(inb):
            raise Decline("PROMISE_IN_BOUNDS gather with out-of-range static indices: "
                          "its result is implementation-defined")
        info = np.iinfo(idx.dtype)
        if not np.all(inb) and np.any(bounds > info.max):
            raise Decline(f"clamp bound not representable in index dtype {idx.dtype}")
        starts = np.clip(v, 0, bounds)
    base = np.zeros(batch_shape, np.int64)
    for k, m in enumerate(start_map):
        base = base + starts[..., k] * strides[m]
    for od, idim in zip(obatch, ibatch):
        coord = np.arange(batch_shape[idim], dtype=np.int64)
        shape = [1] * len(batch_shape)
        shape[idim] = batch_shape[idim]
        base = base + coord.reshape(shape) * strides[od]

    # Offsets within a window.
    window_dims = [d for d in range(op_rank) if d not in collapsed and d not in obatch]
    off = np.zeros([slice_sizes[d] for d in window_dims], np.int64)
    for j, d in enumerate(window_dims):
        shape = [1] * len(window_dims)
        shape[j] = slice_sizes[d]
        off = off + np.arange(slice_sizes[d], dtype=np.int64).reshape(shape) * strides[d]

    out_rank = len(out_shape)
    batch_out = [d for d in range(out_rank) if d not in offset_dims]
    bshape = [1] * out_rank
    for d, n in zip(batch_out, batch_shape):
        bshape[d] = n
    oshape = [1] * out_rank
    for d, n in zip(offset_dims, off.shape):
        oshape[d] = n
    out = base.reshape(bshape) + off.reshape(oshape)
    out = np.where(valid.reshape(bshape), out, FILL)
    return np.broadcast_to(out, out_shape).astype(np.int64)


def gather_source_coords(operand_shape, source_map: np.ndarray) -> list[np.ndarray]:
    """The source map as per-operand-dim coordinates (entries -1 where filled)."""
    smap = np.asarray(source_map)
    coords = np.unravel_index(np.where(smap < 0, 0, smap), tuple(operand_shape)) if smap.size \
        else [np.zeros(smap.shape, np.int64) for _ in operand_shape]
    return [np.where(smap < 0, FILL, c).astype(np.int64) for c in coords]


# --- structural programs -------------------------------------------------------------------------
# A program is a tuple of steps applied to the operand, or a `Concat` of programs:
#   ("reshape", shape) ("slice", starts, limits, strides) ("rev", dims) ("transpose", perm)
#   ("broadcast_in_dim", shape, dims)
# `apply_program(x, prog, ops)` runs it with numpy (`NUMPY_OPS`) or with lax (the gathers pass).

@dataclasses.dataclass(frozen=True)
class Concat:
    axis: int
    parts: tuple


class _NumpyOps:
    @staticmethod
    def reshape(x, shape):
        return np.reshape(x, shape)

    @staticmethod
    def slice(x, starts, limits, strides):
        return x[tuple(slice(s, l, k) for s, l, k in zip(starts, limits, strides))]

    @staticmethod
    def rev(x, dims):
        return np.flip(x, dims) if dims else x

    @staticmethod
    def transpose(x, perm):
        return np.transpose(x, perm)

    @staticmethod
    def broadcast_in_dim(x, shape, dims):
        expanded = [1] * len(shape)
        for i, d in enumerate(dims):
            expanded[d] = x.shape[i]
        return np.broadcast_to(np.reshape(x, expanded), shape)

    @staticmethod
    def concatenate(xs, axis):
        return np.concatenate(xs, axis)


NUMPY_OPS = _NumpyOps()


def apply_program(x, prog, ops=NUMPY_OPS):
    if isinstance(prog, Concat):
        return ops.concatenate([apply_program(x, p, ops) for p in prog.parts], prog.axis)
    for step in prog:
        x = getattr(ops, step[0])(x, *step[1:])
    return x


def lift_program(prog, lead: tuple):
    """`prog` (on core dims) as one program on `lead + core` shapes that applies it to every
    element of the leading dims: what `vmap` of the program traces, built without tracing.

        before:  vmap(slice[(2,), (3,)])           on (128, 48)
        after:   slice[(0, 2), (128, 3)]            on (128, 48)
    """
    k, lead = len(lead), tuple(lead)
    if not k:
        return prog
    if isinstance(prog, Concat):
        return Concat(prog.axis + k, tuple(lift_program(p, lead) for p in prog.parts))
    inner = tuple(range(k))
    lift = {
        "reshape": lambda shape: (lead + tuple(shape),),
        "slice": lambda s, l, st: ((0,) * k + tuple(s), lead + tuple(l), (1,) * k + tuple(st)),
        "rev": lambda dims: (tuple(d + k for d in dims),),
        "transpose": lambda perm: (inner + tuple(p + k for p in perm),),
        "broadcast_in_dim": lambda shape, dims: (lead + tuple(shape),
                                                 inner + tuple(d + k for d in dims)),
    }
    return tuple((step[0], *lift[step[0]](*step[1:])) for step in prog)


def program_pieces(prog) -> int:
    """Number of leaf programs (1 for a plain program)."""
    if isinstance(prog, Concat):
        return sum(program_pieces(p) for p in prog.parts)
    return 1


def program_primitives(prog) -> set[str]:
    if isinstance(prog, Concat):
        return {"concatenate"}.union(*(program_primitives(p) for p in prog.parts))
    return {s[0] for s in prog}


def validate(operand_shape, source_map: np.ndarray, prog) -> bool:
    """Evaluate `prog` on an int32 position-tagged operand and compare with the source map.

    Entries of the source map that are `FILL` are not compared (the fill is applied separately).
    """
    n = int(np.prod(operand_shape, dtype=np.int64))
    if n > _INT32_MAX:
        return False
    tagged = np.arange(n, dtype=np.int32).reshape(operand_shape)
    try:
        got = apply_program(tagged, prog)
    except Exception:  # noqa: BLE001 - a malformed program is a mismatch
        return False
    smap = np.asarray(source_map)
    if got.shape != smap.shape:
        return False
    keep = smap >= 0
    return bool(np.array_equal(got[keep].astype(np.int64), smap[keep]))


# --- decomposition: a source map as affine digits, then as structural steps ------------------------

def _divisors_desc(n: int):
    small = [d for d in range(1, int(n ** 0.5) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]), reverse=True)


def affine_digits(f: np.ndarray, wild: np.ndarray):
    """Write a flat map as base + sum_j c_j * digit_j over a mixed radix (outer -> inner).

    Returns (base, [(size, stride), ...]) or None. `wild` entries match anything (fills).
    """
    return next(iter_affine_digits(f, wild), None)


def iter_affine_digits(f: np.ndarray, wild: np.ndarray, budget: int = 48, shape=None):
    """Every way (largest inner digit first) to write the map as affine digits, up to `budget`.

    Without wild entries the first answer is the canonical one; with them, later answers
    resolve the wild entries differently (a broadcast rather than a longer stride, say). With
    `shape`, digits never straddle a boundary between its dimensions (so `x[:, ::2]` stays a
    slice of `x`'s own axes instead of a strided slice of `x` flattened).
    """
    f = np.asarray(f, np.int64).reshape(-1)
    wild = np.asarray(wild, bool).reshape(-1)
    left = [budget]
    sizes0 = [int(d) for d in shape if int(d) != 1] if shape is not None else [int(f.size)]

    def rec(f, wild, digits, sizes):
        if left[0] <= 0:
            return
        if f.size <= 1:
            left[0] -= 1
            base = 0 if (f.size == 0 or wild[0]) else int(f[0])
            yield base, digits[::-1]
            return
        inner = sizes[-1] if sizes else f.size
        for r in _divisors_desc(inner):
            if r == 1 or left[0] <= 0:
                return
            step = _inner_digit(f, wild, r)
            if step is None:
                continue
            c, g, gw = step
            rest = sizes[:-1] + ([inner // r] if inner // r > 1 else [])
            yield from rec(g, gw, digits + [(r, c)], rest)
            if not wild.any():
                return  # canonical: the largest inner digit is always right

    yield from rec(f, wild, [], sizes0)


def _inner_digit(f, wild, r):
    P = f.size
    blk, wb = f.reshape(P // r, r), wild.reshape(P // r, r)
    pos = np.arange(r, dtype=np.int64)
    # The step c from the first block with two known entries (its first two): found with
    # whole-array numpy, never a Python loop over the blocks (a vmapped map has a million).
    known = ~wb
    two = np.flatnonzero(np.count_nonzero(known, axis=1) >= 2)
    c = 0
    if two.size:
        b = int(two[0])
        i0, i1 = np.flatnonzero(known[b])[:2]
        num = blk[b, i1] - blk[b, i0]
        den = i1 - i0
        if num % den:
            return None
        c = int(num // den)
    first = np.argmax(~wb, axis=1)
    allwild = np.all(wb, axis=1)
    base = blk[np.arange(P // r), first] - c * first
    pred = base[:, None] + c * pos[None, :]
    if not np.all(wb | (blk == pred)):
        return None
    return c, np.where(allwild, 0, base), allwild


def _transpose_rank(digits) -> int:
    """Axes a realization of `digits` transposes: the moving (stride-nonzero) digits."""
    moving = [abs(c) for o, c in digits if c != 0 and o > 1]
    return 0 if moving == sorted(moving, reverse=True) else len(moving)


def _chain_split(size: int, stride: int, cuts) -> list[int]:
    """Split an axis of `size` x `stride` at the strides in `cuts` that keep exact division."""
    top = size * stride
    sizes, cur = [], top
    for s in sorted(set(cuts), reverse=True):
        if stride < s < cur and s % stride == 0 and cur % s == 0:
            sizes.append(cur // s)
            cur = s
    sizes.append(cur // stride)
    return sizes


def _views(operand_shape, strides_needed):
    shape = tuple(operand_shape)
    r = len(shape)
    merges = [()]
    if 1 < r <= 8:
        bounds = list(range(1, r))
        combos = []
        for k in range(1, r):
            combos.extend(itertools.combinations(bounds, k))
        merges += combos  # boundaries removed (merged)
    seen = set()
    for merged in merges:
        groups, cur = [], [shape[0]] if r else []
        for i in range(1, r):
            if i in merged:
                cur.append(shape[i])
            else:
                groups.append(int(np.prod(cur)))
                cur = [shape[i]]
        if r:
            groups.append(int(np.prod(cur)))
        for refine in (False, True):
            v = list(groups)
            if refine:
                w = _row_major_strides(groups)
                v = []
                for n, s in zip(groups, w):
                    v.extend(_chain_split(int(n), int(s), strides_needed))
            v = tuple(v)
            if v not in seen:
                seen.add(v)
                yield v
    flat = (int(np.prod(shape, dtype=np.int64)),)
    if flat not in seen:
        yield flat


def _assign(view, base_coords, digits):
    """Assign each nonzero digit an axis of `view` (step = stride / axis stride); None if none."""
    W = _row_major_strides(view)
    order = sorted((j for j, (o, c) in enumerate(digits) if c != 0 and o > 1),
                   key=lambda j: -abs(digits[j][1]))
    out: dict[int, tuple[int, int]] = {}

    def fits(a, o, c):
        w = int(W[a])
        if abs(c) % w:
            return None
        m = abs(c) // w
        b = base_coords[a]
        if c > 0 and b + m * (o - 1) <= view[a] - 1:
            return m
        if c < 0 and b - m * (o - 1) >= 0:
            return m
        return None

    def search(k, used):
        if k == len(order):
            return True
        j = order[k]
        o, c = digits[j]
        cands = []
        for a in range(len(view)):
            if a in used:
                continue
            m = fits(a, o, c)
            if m is not None:
                cands.append((m != 1, a, m))
        for _, a, m in sorted(cands):
            out[j] = (a, m)
            if search(k + 1, used | {a}):
                return True
            del out[j]
        return False

    return dict(out) if search(0, frozenset()) else None


def realize(operand_shape, source_map: np.ndarray, wild: np.ndarray | None = None):
    """A single structural program (no concatenate) computing `source_map`, or None."""
    smap = np.asarray(source_map)
    out_shape = tuple(smap.shape)
    operand_shape = tuple(int(d) for d in operand_shape)
    if wild is None:
        wild = smap < 0
    if smap.size == 0:
        if int(np.prod(operand_shape, dtype=np.int64)) == 0:
            return (("reshape", out_shape),)
        flat = (int(np.prod(operand_shape, dtype=np.int64)),)
        return (("reshape", flat), ("slice", (0,), (0,), (1,)), ("reshape", out_shape))
    candidates = itertools.chain(iter_affine_digits(smap, wild, shape=out_shape),
                                 iter_affine_digits(smap, wild))
    for base, digits in candidates:
        if _transpose_rank(digits) > MAX_TRANSPOSE_RANK:
            continue
        needed = {abs(c) for o, c in digits if c != 0 and o > 1}
        for view in _views(operand_shape, needed):
            if not 0 <= base < max(1, int(np.prod(view, dtype=np.int64))):
                continue
            bc = [int(v) for v in np.unravel_index(base, view)] if view else []
            asg = _assign(view, bc, digits)
            if asg is None:
                continue
            return _steps(operand_shape, view, bc, digits, asg, out_shape)
    return None


def _steps(operand_shape, view, bc, digits, asg, out_shape):
    steps = []
    if tuple(view) != tuple(operand_shape):
        steps.append(("reshape", tuple(view)))
    by_axis = {a: (j, m) for j, (a, m) in asg.items()}
    starts, limits, strides, revs = [], [], [], []
    for a in range(len(view)):
        if a in by_axis:
            j, m = by_axis[a]
            o, c = digits[j]
            if c > 0:
                starts.append(bc[a]); limits.append(bc[a] + m * (o - 1) + 1)
            else:
                starts.append(bc[a] - m * (o - 1)); limits.append(bc[a] + 1)
                revs.append(a)
            strides.append(m)
        else:
            starts.append(bc[a]); limits.append(bc[a] + 1); strides.append(1)
    if tuple(starts) != (0,) * len(view) or tuple(limits) != tuple(view) or any(s != 1 for s in strides):
        steps.append(("slice", tuple(starts), tuple(limits), tuple(strides)))
    if revs:
        steps.append(("rev", tuple(revs)))
    kept_axes = sorted(by_axis)
    squeezed = tuple(digits[by_axis[a][0]][0] for a in kept_axes)
    if len(squeezed) != len(view):
        steps.append(("reshape", squeezed))
    order = [by_axis[a][0] for a in kept_axes]          # digit of each current axis
    want = sorted(order)                                # digits in output order
    perm = tuple(order.index(j) for j in want)
    if perm != tuple(range(len(perm))):
        steps.append(("transpose", perm))
    full = tuple(o for o, c in digits)
    if len(want) != len(full):
        steps.append(("broadcast_in_dim", full, tuple(want)))
    if full != tuple(out_shape):
        steps.append(("reshape", tuple(out_shape)))
    return simplify(operand_shape, steps)


def simplify(operand_shape, steps) -> tuple:
    """Merge consecutive reshapes and drop reshapes/transposes that change nothing."""
    out, shape = [], tuple(operand_shape)
    for step in steps:
        if step[0] == "reshape":
            if out and out[-1][0] == "reshape":
                out.pop()
                shape = _shape_after(operand_shape, out)
            if tuple(step[1]) != shape:
                out.append(step)
            shape = tuple(step[1])
            continue
        if step[0] == "transpose" and tuple(step[1]) == tuple(range(len(step[1]))):
            continue
        out.append(step)
        shape = _shape_after(operand_shape, out)
    return tuple(out)


def _shape_after(operand_shape, steps):
    dummy = np.empty(tuple(operand_shape), dtype=np.bool_) if np.prod(operand_shape) <= (1 << 16) \
        else None
    if dummy is None:
        shape = tuple(operand_shape)
        for s in steps:
            if s[0] in ("reshape", "broadcast_in_dim"):
                shape = tuple(s[1])
            elif s[0] == "slice":
                shape = tuple(max(0, -(-(l - a) // k)) for a, l, k in zip(s[1], s[2], s[3]))
            elif s[0] == "transpose":
                shape = tuple(shape[i] for i in s[1])
        return shape
    return apply_program(dummy, tuple(steps)).shape


def decompose(operand_shape, source_map: np.ndarray, *, allow_concat: bool = False,
              piece_budget: int = 32, no_concat_reason: str = "gathers='all' allows it"):
    """A validated structural program for `source_map` (FILL entries free), or `Decline`.

    `no_concat_reason`: why concatenate forms are not searched when `allow_concat` is False
    (the caller knows: the option, or the size of the whole operation); it ends the decline.
    """
    smap = np.asarray(source_map)
    prog = realize(operand_shape, smap)
    if prog is not None and validate(operand_shape, smap, prog):
        return prog
    if not allow_concat:
        raise Decline(f"no structural form without concatenate ({no_concat_reason})")
    if smap.size > SPLIT_MAX_ELEMENTS:
        raise Decline("no structural form without concatenate, and concatenate forms are "
                      f"searched only up to SPLIT_MAX_ELEMENTS={SPLIT_MAX_ELEMENTS} elements")
    best = None
    for axis in range(smap.ndim):
        prog = _split(operand_shape, smap, axis, piece_budget, depth=1)
        if prog is not None and (best is None or program_pieces(prog) < program_pieces(best)):
            best = prog
    if best is None:
        raise Decline(f"more than {piece_budget} pieces needed")
    if not validate(operand_shape, smap, best):
        raise Decline("self-validation failed on the index-tagged operand")
    return best


SPLIT_MAX_ELEMENTS = 1 << 16  # concatenate decompositions are searched only below this size


def _split(operand_shape, smap, axis, budget, depth):
    n = smap.shape[axis]
    if n < 2 or n > 4 * budget or smap.size > SPLIT_MAX_ELEMENTS:
        return None
    parts, start, pieces = [], 0, 0

    def sub(a, b):
        return np.take(smap, np.arange(a, b), axis=axis)

    while start < n:
        end, prog = start + 1, None
        p = realize(operand_shape, sub(start, end))
        if p is None:
            if depth <= 0:
                return None
            best = None
            s = sub(start, end)
            for ax in range(s.ndim):
                if ax == axis:
                    continue
                q = _split(operand_shape, s, ax, budget - pieces, depth - 1)
                if q is not None and (best is None or program_pieces(q) < program_pieces(best)):
                    best = q
            if best is None:
                return None
            prog = best
        else:
            prog = p
            while end < n:
                q = realize(operand_shape, sub(start, end + 1))
                if q is None:
                    break
                end, prog = end + 1, q
        parts.append(prog)
        pieces += program_pieces(prog)
        if pieces > budget:
            return None
        start = end
    if len(parts) == 1:
        return parts[0]
    return Concat(axis, tuple(parts))
