"""Static-index updates (issue 23): jax.jit vs optimize, with a second jax.jit as the A/A control.

    python bench/updates.py [--quick] [--gpu-target h200]

Programs users write with `.at[...]` and `dynamic_update_slice` at static positions: a vmapped
cube face turn, a cube-environment step of 18 turns, a register shift (`jnp.roll(L, -1).at[i]
.set(t)`) straight-line, through a jitted helper and in a `fori_loop`, an LFSR of 8 words whose
words scalarize splits, and a float `dynamic_update_slice` under `jax.grad`; batch 1 to 65,536.

Per program and batch: the rewrites applied (0: optimize hands XLA `jax.jit`'s own program, and
its ratios measure only noise), updates (scatters, dynamic_update_slices) and selects left in the traced
program, CPU run time (paired medians, one process) and compile time (paired, caches cleared) of
optimize and of a second jax.jit, each as a ratio to the first jax.jit; GPU kernels from XLA's
deviceless compile where a `gpu_target` is given (the gpu-aot extra).
"""
from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _common  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax import lax  # noqa: E402

import jaxrewrite  # noqa: E402
from jaxrewrite import _walk  # noqa: E402
from jaxrewrite.testing import assert_contract_equal  # noqa: E402

NAME = "updates"
VARIANTS = ("jit", "opt", "jit_again")
UPDATES = ("scatter", "scatter-add", "scatter_add", "scatter-mul", "dynamic_update_slice")
COLUMNS = ("program", "batch", "rewrites_opt", "updates_jit", "updates_opt", "selects_opt",
           "fusions_jit", "fusions_opt", "kernels_jit", "kernels_opt", "run_us_jit", "run_ratio_opt",
           "run_ratio_jit_again", "compile_ratio_opt", "compile_ratio_jit_again")


# --- programs ---------------------------------------------------------------------------------

def face_turn(c):
    return c.at[2].set(jnp.rot90(c[2], k=-1))


# The four faces around each face and the row of each that a quarter turn cycles (a simplified
# cube: every turn moves row 0 of its neighbours), as an environment writes it.
_RING = {0: (1, 2, 3, 4), 1: (0, 4, 5, 2), 2: (0, 1, 5, 3), 3: (0, 2, 5, 4), 4: (0, 3, 5, 1),
         5: (1, 4, 3, 2)}


def _turn(c, face):
    c = c.at[face].set(jnp.rot90(c[face], k=-1))
    a, b, d, e = _RING[face]
    ra, rb, rd, re_ = c[a, 0], c[b, 0], c[d, 0], c[e, 0]
    return c.at[a, 0].set(re_).at[b, 0].set(ra).at[d, 0].set(rb).at[e, 0].set(rd)


def cube_step(c):
    """18 turns: each face a quarter, a half and a three-quarter turn."""
    for face in range(6):
        for quarter in (1, 2, 3):
            for _ in range(quarter):
                c = _turn(c, face)
    return c


def shift(L):
    return jnp.roll(L, -1).at[2].set(L[0] ^ (L[3] >> 1))


_shift_helper = jax.jit(shift)


def shift_straight(L):
    for _ in range(16):
        L = shift(L)
    return L


def shift_helper(L):
    for _ in range(16):
        L = _shift_helper(L)
    return L


def shift_loop(L):
    return lax.fori_loop(0, 16, lambda i, L: shift(L), L)


def lfsr8(L):
    for _ in range(16):
        t = L[0] ^ (L[3] >> 1) ^ (L[5] << 3)
        L = jnp.roll(L, -1).at[7].set(t)
    return L


def padded_grad(x):
    """A float dynamic_update_slice (a solver's boundary padding) under jax.grad."""
    def loss(x):
        buf = jnp.zeros((x.shape[0] + 2,), x.dtype)
        buf = lax.dynamic_update_slice(buf, jnp.tanh(x), (1,))
        return jnp.sum((buf[2:] - buf[:-2]) ** 2)
    return jax.grad(loss)(x)


def programs(quick: bool):
    rng = np.random.default_rng(0)
    batches = (1, 4096) if quick else (1, 256, 4096, 65536)
    cubes = lambda n: rng.integers(0, 6, (n, 6, 3, 3), dtype=np.int8)  # noqa: E731
    regs = lambda n, w: rng.integers(0, 2 ** 32, (n, w), dtype=np.uint32)  # noqa: E731
    out = []
    for n in batches:
        out += [("face turn, vmap", jax.vmap(face_turn), cubes(n)),
                ("cube step (18 turns), vmap", jax.vmap(cube_step), cubes(n)),
                ("register shift, straight-line, vmap", jax.vmap(shift_straight), regs(n, 5)),
                ("register shift, jitted helper, vmap", jax.vmap(shift_helper), regs(n, 5)),
                ("register shift, fori_loop, vmap", jax.vmap(shift_loop), regs(n, 5)),
                ("register shift, leading batch axis",
                 lambda L: L.at[:, 2].set(L[:, 0] ^ (L[:, 3] >> 1)), regs(n, 5)),
                ("LFSR, 8 words, 16 steps, vmap", jax.vmap(lfsr8), regs(n, 8)),
                ("padded tanh, grad, vmap", jax.vmap(padded_grad),
                 rng.standard_normal((n, 32), dtype=np.float32))]
    return out


# --- measuring ------------------------------------------------------------------------------------

def _make(variant, fn, target=None):
    if variant == "opt":
        return jaxrewrite.optimize(fn, **({"target": target} if target else {}))
    return jax.jit(fn)


def _count(jaxpr, names) -> int:
    return sum(1 for e in _walk.iter_eqns(jaxpr) if e.primitive.name in names)


def measure(name, fn, arg, quick: bool, gpu_target: str | None = None) -> dict:
    fns = {v: _make(v, fn) for v in VARIANTS}
    ref = np.asarray(fns["jit"](arg))
    got = np.asarray(fns["opt"](arg))
    # integers bit for bit, the float gradient within the contract (fusion-dependent rounding)
    assert_contract_equal(got, ref, meta=False, what=name)
    ph = _common.paired_phases({v: (lambda v=v: _make(v, fn)) for v in VARIANTS}, (arg,),
                               repeats=2 if quick else 5)
    row = dict(program=name, batch=arg.shape[0])
    for v in ("jit", "opt"):
        tj = fns[v].trace(arg).jaxpr
        row[f"updates_{v}"] = _count(tj, UPDATES)
        row[f"fusions_{v}"] = _common.cpu_fusions(ph[v]["compiled"])
    row["selects_opt"] = _count(_make("opt", fn).trace(arg).jaxpr, ("select_n",))
    # 0: optimize hands XLA jax.jit's own program, so its ratios are what noise is
    row["rewrites_opt"] = len(jaxrewrite.last_report().rewrites)
    inner = _common.calls_per_sample(fns["jit"], arg, 0.005 if quick else 0.02, cap=500)
    run = _common.paired_calls({v: (lambda f=fns[v]: f(arg)) for v in VARIANTS},
                               repeats=3 if quick else 9, inner=inner)
    row["run_us_jit"] = run["jit"] * 1e6
    for v in VARIANTS[1:]:
        row[f"run_ratio_{v}"] = run[v] / run["jit"]
        row[f"compile_ratio_{v}"] = ph[v]["compile"] / ph["jit"]["compile"]
    if gpu_target:
        from jaxrewrite.backend import xla as _xla
        for v in ("jit", "opt"):
            row[f"kernels_{v}"] = _xla.gpu_kernels(_xla.gpu_compile(_make(v, fn, "gpu"), arg,
                                                                    target=gpu_target))
    return row


def main(quick: bool = False, gpu_target: str | None = None) -> list[dict]:
    progs = programs(quick)
    rows = []
    for i, (name, fn, arg) in enumerate(progs, 1):
        print(f"[updates {i}/{len(progs)}] {name} x {arg.shape[0]}", file=sys.stderr, flush=True)
        rows.append(measure(name, fn, arg, quick, gpu_target))
    return rows


if __name__ == "__main__":
    argv = sys.argv[1:]
    target = argv[argv.index("--gpu-target") + 1] if "--gpu-target" in argv else None
    _common.cli(NAME, lambda quick: main(quick, target), COLUMNS)
