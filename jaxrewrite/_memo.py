"""Memo tables for one rewrite: pure analyses of static values (index maps, decompositions).

An index-map analysis is a pure function of shapes, params and index values; the same gather
recurs in every fixed-point round, in every iteration of unrolled code, and in more than one pass
(gathers and scalarize both read a gather's source map). Keys are values, never `id`s.
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np

from .analysis import indexmap as IM
from .analysis import repeats
from .report.records import Decline


def memo(cache: dict | None, kind: str, key, compute: Callable[[], Any]):
    """`compute()`, memoised in `cache` (a rewrite's `Context.cache`) under `(kind, key)`.

    A `Decline` is memoised too and raised again on a hit. Without a cache, or with an
    unhashable key, `compute()` simply runs.
    """
    if cache is None:
        return compute()
    try:
        hash(key)
    except TypeError:
        return compute()
    table = cache.setdefault(f"memo.{kind}", {})
    hit = table.get(key)
    if hit is None:
        try:
            hit = (True, compute())
        except Decline as d:
            hit = (False, str(d))
        table[key] = hit
    if not hit[0]:
        raise Decline(hit[1])
    return hit[1]


def gather_map(cache: dict | None, operand_shape, idx, dimension_numbers, slice_sizes, mode):
    """`analysis.indexmap.gather_map`, memoised by value: the gathers and scalarize passes read the
    same maps. The result is shared: read it, never write it."""
    return memo(cache, "gather_map",
                (tuple(operand_shape), array_key(idx), dimension_numbers, tuple(slice_sizes),
                 mode),
                lambda: IM.gather_map(operand_shape, idx, dimension_numbers, slice_sizes, mode))


def array_key(a) -> tuple:
    """A hashable key for an array's value: dtype, shape and bytes (a scalar's shape is (),
    not the (1,) `np.ascontiguousarray` gives it)."""
    a = np.asarray(a)
    return (a.dtype.str, a.shape, np.ascontiguousarray(a).tobytes())


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    """Whether two arrays of one dtype and shape hold the same bits (NaN payloads and -0.0 told
    apart), compared in place: no byte copies of large arrays."""
    if a is b:
        return True
    if a.dtype.kind == "O" or a.dtype.itemsize == 0:
        return a.tobytes() == b.tobytes()
    on_cores = repeats.same(a, b)   # (two broadcast views of one pattern: their cores decide)
    if on_cores is not None:
        return on_cores
    a8 = np.ascontiguousarray(a).reshape(-1).view(np.uint8)
    b8 = np.ascontiguousarray(b).reshape(-1).view(np.uint8)
    return bool(np.array_equal(a8, b8))
