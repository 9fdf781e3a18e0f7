"""Static values that repeat along axes, kept as numpy broadcast views (stride 0 there).

Under `vmap` an index table is one small table repeated along the batch axis. Evaluated as a
full array, every fold of it, every comparison and every copy costs the batch size: Jumanji's
RubiksCube step spent 0.18 s of its rewrite in fold at 65,536 cubes, against 12 ms at 16, and
the gathers pass 0.54 s mapping those tables. Kept as a view, an elementwise operation runs on
one copy (the core) and broadcasts the result back.
"""
from __future__ import annotations

from typing import Callable, Sequence

import numpy as np


def repeated_axes(v: np.ndarray) -> tuple[int, ...]:
    """The axes of more than one element along which `v` is a broadcast view (stride 0)."""
    return tuple(d for d, (n, s) in enumerate(zip(v.shape, v.strides)) if n > 1 and s == 0)


def equal_axes(v: np.ndarray) -> tuple[int, ...]:
    """The axes of more than one element along which `v` holds the same values: its repeated
    axes (no comparison needed), then those its core is the same along."""
    views = repeated_axes(v)
    c = core(v, views)
    return tuple(d for d, n in enumerate(v.shape) if n > 1 and (
        d in views or bool(np.all(c == np.take(c, [0], axis=d)))))


def core(v: np.ndarray, axes: Sequence[int] | None = None) -> np.ndarray:
    """`v` cut to one element along `axes` (default: its repeated axes); a view, no copy."""
    axes = repeated_axes(v) if axes is None else axes
    if not axes:
        return v
    return v[tuple(slice(0, 1) if d in axes else slice(None) for d in range(v.ndim))]


def row(v: np.ndarray, axes) -> np.ndarray:
    """`v` at index 0 along `axes`, those axes dropped: one copy of a table repeated along them,
    contiguous, of rank `v.ndim - len(axes)` (a scalar where every axis repeats:
    `np.ascontiguousarray` would make it 1-d)."""
    return np.array(v[tuple(0 if d in axes else slice(None) for d in range(v.ndim))], order="C")


def expand(c: np.ndarray, shape) -> np.ndarray:
    """`c` broadcast to `shape`: a read-only view."""
    return np.broadcast_to(c, tuple(shape))


def _common(vals: Sequence[np.ndarray], rank: int, skip: int | None = None) -> tuple[int, ...]:
    """Axes repeated in every operand of rank `rank` (scalars repeat everywhere)."""
    shared = None
    for v in vals:
        if v.ndim == 0:
            continue
        if v.ndim != rank:
            return ()
        r = set(repeated_axes(v))
        shared = r if shared is None else shared & r
    return tuple(sorted(d for d in (shared or ()) if d != skip))


def elementwise(fn: Callable, vals: Sequence[np.ndarray], shape) -> list | None:
    """`fn(vals)` (a list of results of `shape`) computed on the operands' cores where they all
    repeat along some axis, and broadcast back; else `fn(vals)` as it is."""
    axes = _common(vals, len(shape))
    if not axes:
        return fn(vals)
    outs = fn([v if v.ndim == 0 else core(v, axes) for v in vals])
    if outs is None:
        return None
    return [expand(np.asarray(o), shape) for o in outs]


def concatenate(vals: Sequence[np.ndarray], axis: int) -> np.ndarray:
    """`np.concatenate(vals, axis)`, on cores where every operand repeats along another axis."""
    rank = vals[0].ndim
    axes = _common(vals, rank, skip=axis)
    if not axes:
        return np.concatenate(vals, axis)
    out = np.concatenate([core(v, axes) for v in vals], axis)
    shape = list(vals[0].shape)
    shape[axis] = out.shape[axis]
    return expand(out, shape)


def reshape(v: np.ndarray, shape) -> np.ndarray:
    """`v.reshape(shape)`, keeping the repeats of leading axes that the reshape leaves as they
    are (a batch axis of a vmapped table: (B, 4, 3) -> (B, 12))."""
    shape = tuple(int(n) for n in shape)
    k = 0
    while k < min(v.ndim, len(shape)) and v.shape[k] == shape[k]:
        k += 1
    lead = tuple(d for d in repeated_axes(v) if d < k)
    if not lead:
        return np.reshape(v, shape)
    c = core(v, lead)
    return expand(np.reshape(c, c.shape[:k] + shape[k:]), shape)


def same(a: np.ndarray, b: np.ndarray) -> bool | None:
    """Whether `a` and `b` (one dtype and shape) hold the same bits, decided on their cores
    where both repeat along the same axes; None where it takes comparing the full arrays."""
    ra = repeated_axes(a)
    if not ra or ra != repeated_axes(b):
        return None
    ca, cb = core(a, ra), core(b, ra)
    return np.ascontiguousarray(ca).tobytes() == np.ascontiguousarray(cb).tobytes()


def uniform(v: np.ndarray) -> bool:
    """Whether every element of `v` is the same (checked on its core)."""
    c = core(v).reshape(-1)
    return c.size == 0 or bool(np.all(c == c[0]))
