"""`exact=True`: the gate the passes call before a rewrite that could move float rounding.

XLA decides per fusion how floating-point arithmetic is rounded: its LLVM backends contract a
multiply feeding an add into one FMA (one rounding instead of two) wherever both land in one
basic block of one fused loop (XLA:CPU `CompilerTargetOptions`: `AllowFPOpFusion = Fast`, "always
allow FMA fusion"; the GPU backend and ptxas do the same), and it orders a reduction's sums by
the emitter and tiling it picks. Integer, boolean and pure data-movement results never depend on
that. So a rewrite that changes the code *around* float arithmetic can move a result by an ulp
with no rewrite computing anything differently (README, "Exactness"; tests/test_contract.py):

    (a*b)[REV] + c   jax.jit: XLA:CPU fuses the gather and contracts    -> fma(a, b, c)
    rev(a*b) + c     after `gathers`: one fusion too, but it rounds a*b  -> round(a*b) + c
                     first (measured: 61 of 256 elements an ulp apart; tests/test_contract.py)
    y = x[i]; y*u + y*v   CSE of two equal x[i]: under jax.grad the cotangents of the uses are
                     summed before the scatter instead of after it (another summation order)

With `exact=True` these rewrites decline where they touch an inexact (floating or complex)
value, each with the reason below; integer and boolean rewrites go ahead (exact in any fusion).
"""
from __future__ import annotations

import numpy as np

from .. import _compat as C
from ..report.records import Decline

_INEXACT: dict = {}  # dtype -> floating or complex (np.issubdtype is slow)


def _inexact(atom) -> bool:
    dt = getattr(C.aval_of(atom), "dtype", None)
    if dt is None:
        return False
    f = _INEXACT.get(dt)
    if f is None:
        try:
            f = bool(np.issubdtype(dt, np.inexact))
        except TypeError:  # extended dtypes (PRNG keys, float0): never rounded
            f = False
        _INEXACT[dt] = f
    return f


def on(ctx) -> bool:
    """Whether `ctx`'s options ask for float results bit for bit."""
    return bool(getattr(getattr(ctx, "options", None), "exact", False))


def reason(ctx, atoms, what: str) -> str | None:
    """Why `what` must not happen to `atoms` under `exact=True` (None: it may)."""
    if not on(ctx) or not any(_inexact(a) for a in atoms):
        return None
    return (f"exact=True: {what} floating-point values can change their rounding (XLA contracts "
            f"multiply-adds into FMAs per fusion; jax.grad sums cotangents per use)")


def check(ctx, atoms, what: str) -> None:
    """Raise `Decline` (the rules' way to decline) when `reason` gives one."""
    why = reason(ctx, atoms, what)
    if why is not None:
        raise Decline(why)


def eqn_atoms(eqn) -> list:
    """An equation's operands and results."""
    return [*eqn.invars, *eqn.outvars]
