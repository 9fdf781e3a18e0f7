"""An array held as pieces: separate arrays, one per position along some of its axes.

`Builder` emits equations for a jaxpr level being rebuilt and keeps each old value whole, as
pieces over some split axes (an object array of atoms, row-major over the split axes' sizes), or
both; it converts on demand: splitting is `unstack` (slices, free for XLA), re-joining is one
`stack` (a concatenate for XLA), and dropping a size-1 split axis is a reshape. Used by
passes/scalarize.py; no rules here, only the representation.
"""
from __future__ import annotations

import numpy as np

from .. import _compat as C

_prim = C.lax_primitive

def shape_of(atom) -> tuple:
    s = atom.aval.shape  # already a tuple for ShapedArray: no copy (called ~30k times a rewrite)
    return s if type(s) is tuple else tuple(s)


def rest_shape(shape, axes) -> tuple:
    return tuple(s for d, s in enumerate(shape) if d not in axes)


def rest_positions(rank, axes) -> dict:
    """Full dim → position among the dims that are not split."""
    out, k = {}, 0
    for d in range(rank):
        if d not in axes:
            out[d] = k
            k += 1
    return out


def objarray(shape) -> np.ndarray:
    return np.empty(tuple(shape), dtype=object)


def each_piece(shape, fn) -> np.ndarray:
    """An object array of `shape` holding `fn(idx)` at every index: one new piece per piece."""
    out = objarray(shape)
    for idx in np.ndindex(out.shape):
        out[idx] = fn(idx)
    return out


class Builder:
    """Emits the new equations of one level; holds each old value whole and/or as pieces."""

    def __init__(self, chosen: dict, join_form: str = "flat", apart=(), apart_min: int = 0):
        self.join_form = join_form    # "flat" or "nested" (per target: backend.cost.TargetCosts)
        # old vars whose re-join must stay out of a concatenate fusion (`_stack_apart`): the
        # stack gets at least `apart_min` operands
        self.apart = frozenset(apart)
        self.apart_min = apart_min
        self.join_pieces: dict = {}   # old var → the new atoms re-joined into it
        self.chosen = chosen          # old var → split axes (sorted tuple)
        self.eqns: list = []
        self.whole: dict = {}         # old var → new atom
        self.parts: dict = {}         # (old var, axes) → object array of new atoms
        self.native: dict = {}        # old var → axes it was produced with
        self.src = None               # equation whose source info new equations carry
        self.joins = 0
        self.reshaped: dict = {}      # new var made by `reshape` → its operand (chains collapse)
        # (primitive, avals, params) → output avals: the pieces of one value all have the same
        # aval, so each split equation asks JAX once instead of once per piece (ChaCha20: 1,943
        # abstract evaluations → a few dozen; this was most of the pass's time).
        self._avals: dict = {}
        self.splats: dict = {}        # new var made by broadcasting a literal scalar → its value

    # -- equations --
    def _abstract_eval(self, prim, avals, params) -> list:
        try:
            key = (prim, tuple(avals), tuple(sorted(params.items())))
            hash(key)
        except TypeError:  # an unhashable param: ask JAX every time
            return C.abstract_eval(prim, avals, **params)
        outs = self._avals.get(key)
        if outs is None:
            outs = self._avals[key] = C.abstract_eval(prim, avals, **params)
        return outs

    def bind(self, prim, atoms, **params) -> list:
        outs = self._abstract_eval(prim, [C.aval_of(a) for a in atoms], params)
        outvars = [C.new_var(a) for a in outs]
        src = self.src
        self.eqns.append(C.new_eqn(list(atoms), outvars, prim, params, None,
                                   getattr(src, "source_info", None), getattr(src, "ctx", None)))
        return outvars

    def bind1(self, prim, atoms, **params):
        out = self.bind(prim, atoms, **params)[0]
        if prim.name == "broadcast_in_dim" and C.is_literal(atoms[0]) and shape_of(atoms[0]) == ():
            self.splats[out] = np.asarray(C.literal_value(atoms[0])).item()
        return out

    def uniform(self, atom):
        """The one value every element of `atom` has, where this level knows it; else None."""
        if C.is_literal(atom):
            v = np.asarray(C.literal_value(atom))
            return v.flat[0].item() if v.size and np.all(v == v.flat[0]) else None
        return self.splats.get(atom)

    def reshape(self, atom, shape):
        shape = tuple(int(s) for s in shape)
        if shape_of(atom) == shape:
            return atom
        if C.is_literal(atom):
            return literal_like(np.reshape(np.asarray(C.literal_value(atom)), shape), C.aval_of(atom))
        atom = self.reshaped.get(atom, atom)
        if shape_of(atom) == shape:
            return atom
        out = self.bind1(_prim("reshape"), [atom], new_sizes=shape, dimensions=None, sharding=None)
        self.reshaped[out] = atom
        return out

    # -- whole / pieces --
    def set_parts(self, var, axes, P):
        axes = tuple(axes)
        if not axes:
            self.whole[var] = P[()]
            return
        self.parts[(var, axes)] = P
        self.native.setdefault(var, axes)

    def get_whole(self, atom):
        if C.is_literal(atom):
            return atom
        if atom in self.whole:
            return self.whole[atom]
        axes = self.native.get(atom)
        if axes is None:  # an invar or constvar of the level
            return atom
        P = self.parts[(atom, axes)]
        self.whole[atom] = self._join(P, axes, shape_of(atom), apart=atom in self.apart)
        if P.size > 1:  # (one piece along axes of size 1: a reshape, no re-join)
            self.join_pieces[atom] = list(P.flat)
            self.joins += 1
        return self.whole[atom]

    def get_parts(self, atom, axes) -> np.ndarray:
        axes = tuple(axes)
        shape = shape_of(atom)
        if not axes:
            P = objarray(())
            P[()] = self.get_whole(atom)
            return P
        if C.is_literal(atom):
            return _split_literal(atom, axes)
        hit = self.parts.get((atom, axes))
        if hit is not None:
            return hit
        cur = self.native.get(atom)
        if cur is not None and all(shape[d] == 1 for d in set(cur) - set(axes)):
            P = self._refine(self.parts[(atom, cur)], cur, axes, shape)
        else:
            P = self._split(self.get_whole(atom), axes, shape)
        self.parts[(atom, axes)] = P
        return P

    def _split(self, atom, axes, shape) -> np.ndarray:
        """Nested `unstack`: slices, free for XLA."""
        P = objarray([shape[d] for d in axes])
        unstack = _prim("unstack")

        def rec(a, k, idx):
            if k == len(axes):
                P[idx] = a
                return
            pos = axes[k] - k
            if shape_of(a)[pos] == 1:
                outs = [self.reshape(a, shape_of(a)[:pos] + shape_of(a)[pos + 1:])]
            else:
                outs = self.bind(unstack, [a], axis=pos)
            for i, o in enumerate(outs):
                rec(o, k + 1, idx + (i,))
        rec(atom, 0, ())
        return P

    def _refine(self, P, cur, axes, shape) -> np.ndarray:
        """Pieces over `cur` → pieces over `axes` (drops only size-1 axes; splits others)."""
        cur, axes = tuple(cur), tuple(axes)
        # 1. drop size-1 split axes: each piece gains that dim back.
        keep = tuple(d for d in cur if d in axes)
        if keep != cur:
            Q = P.reshape([shape[d] for d in keep])
            out = objarray(Q.shape)
            for idx in np.ndindex(Q.shape):
                out[idx] = self.reshape(Q[idx], rest_shape(shape, keep))
            P, cur = out, keep
        # 2. split the extra axes of every piece.
        extra = tuple(d for d in axes if d not in cur)
        if not extra:
            return P
        pos = rest_positions(len(shape), cur)
        piece_shape = rest_shape(shape, cur)
        out = objarray([shape[d] for d in axes])
        for idx in np.ndindex(P.shape):
            sub = self._split(P[idx], tuple(pos[d] for d in extra), piece_shape)
            for sidx in np.ndindex(sub.shape):
                full = dict(zip(cur, idx))
                full.update(zip(extra, sidx))
                out[tuple(full[d] for d in axes)] = sub[sidx]
        return out

    def _join(self, P, axes, shape, apart: bool = False):
        if self.join_form == "nested" and not apart:
            return self._join_nested(P, axes, shape)
        return self._join_flat(P, axes, shape, apart)

    def _join_nested(self, P, axes, shape):
        """A `stack` per split axis, innermost first (rows, then the matrix)."""
        stack = _prim("stack")
        axes = tuple(axes)
        for k in range(len(axes) - 1, -1, -1):
            d = axes[k]
            pos = d - k  # dims of earlier split axes are not there yet
            Q = objarray(P.shape[:-1])
            for idx in np.ndindex(Q.shape):
                col = [P[idx + (i,)] for i in range(P.shape[-1])]
                if len(col) == 1:
                    s = list(shape_of(col[0]))
                    s.insert(pos, 1)
                    Q[idx] = self.reshape(col[0], s)
                else:
                    Q[idx] = self.bind1(stack, col, axis=pos)
            P = Q
        return P[()]

    def _join_flat(self, P, axes, shape, apart: bool = False):
        """One `stack` of all pieces (row-major), a reshape, and a transpose if the split axes
        are not adjacent.

            before: a_0 .. a_15 : u32[N]  (pieces over axes (1, 2) of u32[N,4,4])
            after:  s:u32[N,16] = stack[axis=1] a_0 .. a_15 ; r:u32[N,4,4] = reshape s

        (Nested stacks, one per split axis, compile far slower on XLA:CPU: 149 fusions and 40 s
        against 16 and 5 s for ChaCha20's 16 words.) `apart`: see `_stack_apart`.
        """
        axes = tuple(axes)
        first = axes[0]
        flat = [P[idx] for idx in np.ndindex(P.shape)]
        if len(flat) == 1:
            return self.reshape(flat[0], shape)
        if apart and len(flat) < self.apart_min:
            s = self._stack_apart(flat, first)
        else:
            s = self.bind1(_prim("stack"), flat, axis=first)
        rest = rest_shape(shape, axes)
        grouped = rest[:first] + tuple(shape[d] for d in axes) + rest[first:]
        s = self.reshape(s, grouped)
        order = list(range(first)) + [None] * len(axes) + list(range(first, len(rest)))
        # position in `grouped` of each full dim
        src = {}
        k = 0
        for d in range(len(shape)):
            if d in axes:
                src[d] = first + axes.index(d)
            else:
                src[d] = k if k < first else k + len(axes)
                k += 1
        perm = tuple(src[d] for d in range(len(shape)))
        del order
        if perm == tuple(range(len(shape))):
            return s
        return self.bind1(_prim("transpose"), [s], permutation=perm)


    def _stack_apart(self, flat, axis):
        """The stack of `flat` with at least `apart_min` operands, so that XLA:CPU leaves the
        concatenate unfused (it fuses one of at most 8 operands with its producers, and its
        concatenate emitter recomputes a shared value once per path to it: backend.cost.join_model).

            before: s:u32[N,8] = stack[axis=1] a_0 .. a_7
            after:  t:u32[N,16] = stack[axis=1] a_0 .. a_7 a_0 .. a_7
                    u:u32[N,2,8] = reshape t ; v:u32[N,1,8] = slice[0:1] u ; s = reshape v

        The reshape keeps XLA's simplifier from folding slice(concatenate) back to 8 operands;
        each piece then gets a loop fusion of its own, where shared values are computed once.
        """
        n = len(flat)
        r = -(-self.apart_min // n)
        s = self.bind1(_prim("stack"), flat * r, axis=axis)
        shape = shape_of(s)
        u = self.reshape(s, shape[:axis] + (r, n) + shape[axis + 1:])
        ushape = shape_of(u)
        v = self.bind1(_prim("slice"), [u], start_indices=(0,) * len(ushape),
                       limit_indices=tuple(1 if d == axis else x for d, x in enumerate(ushape)),
                       strides=None)
        return self.reshape(v, shape[:axis] + (n,) + shape[axis + 1:])


def literal_like(value, like_aval):
    value = np.asarray(value, dtype=like_aval.dtype)
    aval = C.ShapedArray(value.shape, value.dtype, weak_type=getattr(like_aval, "weak_type", False))
    return C.literal(value, aval)


def _split_literal(atom, axes) -> np.ndarray:
    value = np.asarray(C.literal_value(atom))
    aval = C.aval_of(atom)
    shape = value.shape
    P = objarray([shape[d] for d in axes])
    for idx in np.ndindex(P.shape):
        sel = [slice(None)] * value.ndim
        for d, i in zip(axes, idx):
            sel[d] = i
        P[idx] = literal_like(value[tuple(sel)], aval)
    return P
