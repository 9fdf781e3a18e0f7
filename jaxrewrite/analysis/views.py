"""Affine views: where each element of a value made from `root` by data movement alone sits in
`root` (its flat, row-major position), as `offset + sum(index[k] * strides[k])`.

    x: u32[N, 4, 4]
    t = transpose[(1, 2, 0)] x ; r = reshape[(16, N)] t ; p = squeeze(slice[5:6, :] r)
    view_of(p, x) == View(shape=(N,), strides=(16,), offset=5)      (p[n] is x[n, 1, 1])

Slices, squeezes, transposes, copies, the results of an unstack, and reshapes that numpy could
make without a copy keep a value a view; anything else (a reshape that would need one, any
computation) ends it (None). Two values with equal views hold the same elements of `root` in
the same order: that is how a pass finds that a piece it needs is already at hand. Pure Python
on shapes: nothing is the size of the data.
"""
from __future__ import annotations

import dataclasses
import math

from .. import _compat as C


@dataclasses.dataclass(frozen=True)
class View:
    shape: tuple
    strides: tuple
    offset: int = 0

    def key(self) -> tuple:
        """What decides which elements, in which order (a size-1 dim's stride does not)."""
        return (self.shape, tuple(s for d, s in zip(self.shape, self.strides) if d != 1),
                self.offset)


def contiguous(shape) -> View:
    strides, acc = [], 1
    for d in reversed(shape):
        strides.append(acc)
        acc *= d
    return View(tuple(shape), tuple(reversed(strides)))


def take(v: View, axis: int, i: int) -> View:
    """v[..., i, ...] along `axis` (the axis dropped)."""
    return View(v.shape[:axis] + v.shape[axis + 1:], v.strides[:axis] + v.strides[axis + 1:],
                v.offset + i * v.strides[axis])


def reshape(v: View, shape) -> View | None:
    """The view reshaped row-major, where that needs no copy (numpy's rule), else None."""
    shape = tuple(shape)
    if math.prod(shape) != math.prod(v.shape):
        return None
    old = [(d, s) for d, s in zip(v.shape, v.strides) if d != 1]
    new_dims = [d for d in shape if d != 1]
    out: list[int] = []
    i = j = 0
    while i < len(old) and j < len(new_dims):
        # the smallest runs of old and new dims whose sizes multiply to the same number
        i2, j2, po, pn = i + 1, j + 1, old[i][0], new_dims[j]
        while po != pn:
            if po < pn:
                po *= old[i2][0]
                i2 += 1
            else:
                pn *= new_dims[j2]
                j2 += 1
        run = old[i:i2]
        if any(run[k][1] != run[k + 1][1] * run[k + 1][0] for k in range(len(run) - 1)):
            return None              # those old dims are not one contiguous run
        stride, seg = run[-1][1], []
        for d in reversed(new_dims[j:j2]):
            seg.append(stride)
            stride *= d
        out.extend(reversed(seg))
        i, j = i2, j2
    it = iter(out)
    strides = tuple(0 if d == 1 else next(it) for d in shape)
    return View(shape, strides, v.offset)


def stacked(shape, stack) -> list[View] | None:
    """Where each operand of the `stack` equation sits in a row-major array of `shape` that is
    its result reshaped (None where that reshape would copy):

        y = reshape[(N, 4, 4)](stack[axis=1](p0..p15))     stacked((N, 4, 4), stack)[5]
                                                           == View((N,), (16,), 5)"""
    base = reshape(contiguous(tuple(shape)), tuple(C.aval_of(stack.outvars[0]).shape))
    if base is None:
        return None
    return [take(base, stack.params["axis"], i) for i in range(len(stack.invars))]


def apply(v: View, eqn) -> View | None:
    """The view of `eqn`'s result, `eqn` applied to a value of view `v`; None where `eqn` is not
    data movement this module follows."""
    name, p = eqn.primitive.name, eqn.params
    if name in ("copy", "copy_p"):          # (`jnp.array(x)`: the same elements, in order)
        return v
    if name == "transpose":
        perm = p["permutation"]
        return View(tuple(v.shape[k] for k in perm), tuple(v.strides[k] for k in perm),
                    v.offset)
    if name == "squeeze":
        drop = {d % len(v.shape) for d in p["dimensions"]}
        return View(tuple(d for k, d in enumerate(v.shape) if k not in drop),
                    tuple(s for k, s in enumerate(v.strides) if k not in drop), v.offset)
    if name == "reshape" and p.get("dimensions") is None:
        return reshape(v, p["new_sizes"])
    if name == "slice":
        steps = p["strides"] or (1,) * len(v.shape)
        shape = tuple(-(-(hi - lo) // st) for lo, hi, st in
                      zip(p["start_indices"], p["limit_indices"], steps))
        return View(shape, tuple(s * st for s, st in zip(v.strides, steps)),
                    v.offset + sum(lo * s for lo, s in zip(p["start_indices"], v.strides)))
    return None


def view_of(atom, root, defn, memo: dict) -> View | None:
    """The view of `atom` in `root` through the equations `defn` names, or None."""
    if atom is root:
        return contiguous(tuple(C.aval_of(root).shape))
    if C.is_literal(atom):
        return None
    if atom in memo:
        return memo[atom]
    memo[atom] = None                # (cut cycles; a value made twice is not a view anyway)
    e = defn(atom)
    if e is not None and len(e.invars) == 1:
        inner = view_of(e.invars[0], root, defn, memo)
        if inner is not None and len(e.outvars) == 1:
            memo[atom] = apply(inner, e)
        elif inner is not None and e.primitive.name == "unstack":   # (result k: take k)
            memo[atom] = take(inner, e.params["axis"] % len(inner.shape),
                              list(e.outvars).index(atom))
    return memo[atom]
