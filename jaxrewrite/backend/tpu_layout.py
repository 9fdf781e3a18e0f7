"""Where XLA:TPU keeps a 32-bit array with one long axis, and the view a kernel reads it in place.

A vmapped rounds program holds its state as u32[N, 4, 4] (the seed author's ChaCha20) or
u32[4, 4, N] (word-major). XLA:TPU does not pad such an array's short axes to 128 lanes: it
puts the long axis in the lanes, the last short axis in the sublanes of (4, 128) tiles, and the
other short axes major (`{0,2,1:T(4,128)}` and `{2,1,0:T(4,128)}`). Read row-major as a
(4, 4 * N/128, 128) array, both are the same bytes (a bitcast):

    x: u32[N, 4, 4]                   V[r, 4 * (n // 128) + c, n % 128] = x[n, r, c]
    V: u32[4, 4 * N/128, 128]         (and the same V for x: u32[4, 4, N], x[r, c, n])

so a kernel that takes V reads word (r, c) of its grid step's R tile rows as the rows c, c+4,
... of block r of a (4, 4R, 128) block (a sublane-strided load), and writes it back the same
way. Taking the 16 words as 16 (N/128, 128) arrays instead makes XLA relayout the state before
the kernel and after it (ChaCha20 on a TPU v5e with no TPU, `bench/tpu_aot.py`: five relayout
fusions, 650K of the program's 1.23M bundles; in place, the kernel is the only launch).

The rule, read off libtpu 0.0.42.1's entry layouts (`backend.xla.tpu_compile` of `x + 1` for
u32 arrays of 2-4 axes, one of them N a multiple of 1,024, the others below 128): the long axis
is minor; among the short axes, the one whose sublane tile pads least is second-minor, the last
one on a tie; its tile is (t, 128) with t its size where that is 1, 2 or 4, else 8; the other
short axes are major, in order. `native` models only the cases with no padding at all, where
the last short axis is the second-minor one (sizes 1, 2, 4 or a multiple of 8); elsewhere it
says None and the kernel takes pieces. Where XLA lays an array out otherwise (an intermediate
value's layout is XLA's choice), the view costs a relayout, as the pieces do: never wrong, at
worst as slow as before.
"""
from __future__ import annotations

import dataclasses
import math

import numpy as np

from .mosaic import LANES

_TILE_ROWS = 8                # the sublane tile of 32-bit data
_SHORT = LANES                # a short axis: fewer elements than the lanes


@dataclasses.dataclass(frozen=True)
class Native:
    """An array's place in memory as `(slabs, tiles * sublanes, LANES)` rows."""
    shape: tuple              # the array's
    axis: int                 # its long axis (N elements)
    sublanes: int             # t: the sublane tile of its last short axis

    @property
    def n(self) -> int:
        return self.shape[self.axis]

    @property
    def short(self) -> tuple:
        return self.shape[:self.axis] + self.shape[self.axis + 1:]

    @property
    def slabs(self) -> int:
        return math.prod(self.short) // self.sublanes

    def view_shape(self) -> tuple:
        return (self.slabs, self.n // LANES * self.sublanes, LANES)

    def slot(self, index: tuple) -> tuple[int, int]:
        """(slab, sublane) of the elements x[..., n, ...] at short-axes `index`."""
        flat = 0
        for i, d in zip(index, self.short):
            flat = flat * d + i
        return flat // self.sublanes, flat % self.sublanes

    def _long_last(self) -> tuple:
        """The permutation that moves the long axis last, the short ones in order before it."""
        return (*[k for k in range(len(self.shape)) if k != self.axis], self.axis)

    def to_view(self, x):
        """x (of `shape`) as V (`view_shape`): a bitcast where XLA keeps x as modelled."""
        from jax import lax
        t, short = self.sublanes, self.short
        x = lax.transpose(x, self._long_last())
        x = x.reshape(math.prod(short) // t, t, self.n // LANES, LANES)
        return lax.transpose(x, (0, 2, 1, 3)).reshape(self.view_shape())

    def from_view(self, v):
        """The inverse of `to_view`."""
        from jax import lax
        v = v.reshape(self.slabs, self.n // LANES, self.sublanes, LANES)
        v = lax.transpose(v, (0, 2, 1, 3)).reshape(*self.short, self.n)
        return lax.transpose(v, tuple(int(a) for a in np.argsort(self._long_last())))


def native(shape: tuple, itemsize: int) -> Native | None:
    """Where XLA:TPU keeps an array of `shape` with `itemsize`-byte elements as modelled in the
    module docstring; None where the model says nothing (the kernel takes pieces there)."""
    shape = tuple(shape)
    if itemsize != 4 or len(shape) < 2:
        return None
    long = [a for a, d in enumerate(shape) if d >= _SHORT]
    if len(long) != 1 or shape[long[0]] % (LANES * _TILE_ROWS):
        return None
    axis = long[0]
    last = shape[-1] if axis != len(shape) - 1 else shape[-2]
    if last in (1, 2, 4):
        t = last
    elif last % _TILE_ROWS == 0:
        t = _TILE_ROWS
    else:
        return None           # (padded: another short axis may be the second-minor one)
    return Native(shape, axis, t)
