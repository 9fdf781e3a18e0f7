"""Static permutations (issue 5): ChaCha20 and the seed program in every form, jax.jit vs optimize.

    python bench/permutations.py [--quick] [--loops]    # --loops: the issue-12 rows only
    python bench/permutations.py [--quick] --keccak     # the issue-25 rows only (Keccak-f[1600])
    JAX_PLATFORMS=cpu .venv-gpu/bin/python bench/permutations.py   # + H200 kernels (gpu-aot)

1. The ChaCha20 block function (RFC 8439): a 4x4 uint32 state, quarter-rounds on the columns of
   the rows, the diagonal step written as
   - `take`:   `jnp.take` of the raveled state with a static map, and back (as users write it);
   - `roll`:   `jnp.roll` per row, then `jnp.stack`;
   - `concat`: one concatenate of the contiguous runs of the raveled state;
   - `rows`:   4 separate row arrays, a static `jnp.take` per row;
   - `words`:  by hand, 16 separate words (the diagonal step is renaming);
   - `take+optimize`: the `take` form through `jaxrewrite.optimize` (movement + scalarize);
   - `take+optimize(reroll)`: the same with `reroll=True`: the split double rounds become one
     scan of 10 trips (`unroll=2`: 5 trips of two double rounds).
   - `fori`: as its author wrote it (issue 12): a jitted quarter-round on a 4-vector vmapped over
     the columns, a jitted double round with `jnp.array` index maps, the double rounds in
     `lax.fori_loop` (jax.jit: a rolled loop);
   - `fori+optimize`, `scan+optimize`, `python+optimize`: that program through `optimize`, with
     the loop as `lax.fori_loop`, `lax.scan` or a Python loop (passes/flatten.py unrolls it and
     inlines the helpers, then scalarize splits).
   vmapped over 65,536 blocks (4,096 with --quick). Every form is checked bit-exact against the
   RFC 8439 section 2.3.2 test vector and against `jax.jit` of the `take` form.
2. The seed's 7-iteration program (bench/seed.py), interdependent column function, with the
   `lax.gather`, `jnp.take` and ravel-index-reshape permutations and with none; and (issue 12)
   the `jnp.take` and no-permutation inner functions in `lax.fori_loop(0, 7)` / `lax.scan`.

Columns: H200 kernels in the compiled module and launches per call (a loop's kernels once per
trip) (deviceless XLA compile, when the gpu-aot extra is importable and JAX_PLATFORMS=cpu;
`optimize` rows with target="gpu"), CPU fusions, CPU run time (paired
medians) and its ratio to the hand-written form (ChaCha) or to the no-permutation form (seed),
compile seconds for the CPU and the H200 (paired medians of 5, fresh caches; one sample with
--quick) — wall, and process CPU time (steadier on a shared machine) — each including trace
and, for `optimize`, the rewrite.
"""
from __future__ import annotations

import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _common  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import jaxrewrite  # noqa: E402
from jaxrewrite.backend import xla as _xla  # noqa: E402

NAME = "permutations"
COLUMNS = ("program", "form", "kernels_h200", "launches_h200", "cpu_fusions", "run_ms",
           "run_ratio",
           "compile_s_cpu", "compile_cpu_s_cpu", "compile_s_h200", "compile_cpu_s_h200", "exact")

# --- ChaCha20 ------------------------------------------------------------------------------------

DIAG = np.array([0, 1, 2, 3, 5, 6, 7, 4, 10, 11, 8, 9, 15, 12, 13, 14])  # diagonals → columns
UNDIAG = np.argsort(DIAG)
ROUNDS = 10  # double rounds


def rotl(x, n):
    return (x << np.uint32(n)) | (x >> np.uint32(32 - n))


def quarter(a, b, c, d):
    a = a + b; d = rotl(d ^ a, 16)  # noqa: E702
    c = c + d; b = rotl(b ^ c, 12)  # noqa: E702
    a = a + b; d = rotl(d ^ a, 8)  # noqa: E702
    c = c + d; b = rotl(b ^ c, 7)  # noqa: E702
    return a, b, c, d


def _columns(s):
    return jnp.stack(quarter(s[0], s[1], s[2], s[3]))


def _runs(flat, perm):
    """`flat[perm]` as one concatenate of the contiguous runs of `perm`."""
    pieces, start = [], 0
    for k in range(1, len(perm) + 1):
        if k == len(perm) or perm[k] != perm[k - 1] + 1:
            pieces.append(flat[perm[start]:perm[k - 1] + 1])
            start = k
    return jnp.concatenate(pieces)


def chacha_take(x, rounds=ROUNDS):
    s = x
    for _ in range(rounds):
        s = jnp.take(_columns(s).ravel(), DIAG).reshape(4, 4)
        s = jnp.take(_columns(s).ravel(), UNDIAG).reshape(4, 4)
    return s + x


def chacha_roll(x, rounds=ROUNDS):
    s = x
    for _ in range(rounds):
        s = _columns(s)
        s = jnp.stack([jnp.roll(s[i], -i) for i in range(4)])
        s = _columns(s)
        s = jnp.stack([jnp.roll(s[i], i) for i in range(4)])
    return s + x


def chacha_concat(x, rounds=ROUNDS):
    s = x
    for _ in range(rounds):
        s = _runs(_columns(s).ravel(), DIAG).reshape(4, 4)
        s = _runs(_columns(s).ravel(), UNDIAG).reshape(4, 4)
    return s + x


def chacha_rows(x, rounds=ROUNDS):
    r = [x[i] for i in range(4)]
    for _ in range(rounds):
        r = list(quarter(*r))
        r = [jnp.take(r[i], (np.arange(4) + i) % 4) for i in range(4)]
        r = list(quarter(*r))
        r = [jnp.take(r[i], (np.arange(4) - i) % 4) for i in range(4)]
    return jnp.stack(r) + x


def chacha_words(x, rounds=ROUNDS):
    w = [x[i // 4, i % 4] for i in range(16)]
    s = list(w)
    for _ in range(rounds):
        for c in range(4):
            s[c], s[4 + c], s[8 + c], s[12 + c] = quarter(s[c], s[4 + c], s[8 + c], s[12 + c])
        for c in range(4):
            i = [c, 4 + (c + 1) % 4, 8 + (c + 2) % 4, 12 + (c + 3) % 4]
            s[i[0]], s[i[1]], s[i[2]], s[i[3]] = quarter(*(s[k] for k in i))
    return jnp.stack([a + b for a, b in zip(s, w)]).reshape(4, 4)


FORMS = {"take": chacha_take, "roll": chacha_roll, "concat": chacha_concat,
         "rows": chacha_rows, "words": chacha_words}


# ChaCha20 as its author wrote it (issue 12): a jitted quarter-round on a 4-vector, vmapped over
# the columns; a jitted double round moving diagonals into columns with a `jnp.array` index map;
# a jitted block running the double rounds in `lax.fori_loop`, `lax.scan` or a Python loop.

@jax.jit
def _quarterround(x):
    a, b, c, d = quarter(x[0], x[1], x[2], x[3])
    return jnp.array([a, b, c, d], dtype=jnp.uint32)


@jax.jit
def _double_round(state):
    qr = jax.vmap(_quarterround, in_axes=1, out_axes=1)
    diag_map = jnp.array([0, 1, 2, 3, 5, 6, 7, 4, 10, 11, 8, 9, 15, 12, 13, 14])
    undiag_map = jnp.array([0, 1, 2, 3, 7, 4, 5, 6, 10, 11, 8, 9, 13, 14, 15, 12])
    state = qr(state).ravel()[diag_map].reshape(4, 4)
    return qr(state).ravel()[undiag_map].reshape(4, 4)


def chacha_loop(kind: str, rounds: int = ROUNDS):
    """The block function with its double rounds in `lax.fori_loop` ("fori"), `lax.scan`
    ("scan") or a Python loop ("python")."""
    @jax.jit
    def _block(state):
        if kind == "fori":
            s = jax.lax.fori_loop(0, rounds, lambda i, s: _double_round(s), state)
        elif kind == "scan":
            s = jax.lax.scan(lambda s, _: (_double_round(s), None), state, None, length=rounds)[0]
        else:
            s = state
            for _ in range(rounds):
                s = _double_round(s)
        return s + state
    _block.__name__ = f"chacha_{kind}"
    return _block


LOOP_FORMS = ("fori", "scan", "python")

# RFC 8439, section 2.3.2: key 00:01:..:1f, block count 1, nonce 00:00:00:09:00:00:00:4a:00..00
RFC_STATE = np.array([0x61707865, 0x3320646e, 0x79622d32, 0x6b206574,
                      0x03020100, 0x07060504, 0x0b0a0908, 0x0f0e0d0c,
                      0x13121110, 0x17161514, 0x1b1a1918, 0x1f1e1d1c,
                      0x00000001, 0x09000000, 0x4a000000, 0x00000000], np.uint32).reshape(4, 4)
RFC_OUT = np.array([0xe4e7f110, 0x15593bd1, 0x1fdd0f50, 0xc47120a3,
                    0xc7f4d1c7, 0x0368c033, 0x9aaa2204, 0x4e6cd4c3,
                    0x466482d2, 0x09aa9f07, 0x05d7c214, 0xa2028bd9,
                    0xd19c12b5, 0xb94e16de, 0xe883d0cb, 0x4e3c50a2], np.uint32).reshape(4, 4)


def _blocks(n):
    x = np.random.default_rng(0).integers(0, 2**32, (n, 4, 4), dtype=np.uint32)
    x[0] = RFC_STATE
    return jnp.asarray(x)


# --- measuring ------------------------------------------------------------------------------------

def _compile_s(jitted, arg):
    """Wall and process-CPU seconds of trace + rewrite + lower + compile (what a user waits
    for), from fresh caches."""
    jax.clear_caches()
    t, p = time.perf_counter(), time.process_time()
    compiled = jitted.lower(arg).compile()
    return time.perf_counter() - t, time.process_time() - p, compiled


def _h200(make, spec, trips: int = 1) -> dict:
    """H200 kernels in the compiled module, launches per call (a loop's kernels once per trip),
    and compile seconds, from XLA's deviceless compile."""
    if not (_xla.gpu_aot_available() and "cpu" in (jax.config.jax_platforms or "")):
        return {}
    jax.clear_caches()
    t, p = time.perf_counter(), time.process_time()
    c = _xla.gpu_compile(make(), spec)
    # process CPU seconds too: on a shared machine they vary less than wall seconds
    return dict(kernels_h200=_xla.gpu_kernels(c), compile_s_h200=time.perf_counter() - t,
                compile_cpu_s_h200=time.process_time() - p,
                launches_h200=_common.gpu_launches(c.as_text(), trips))


def _table(program, variants: dict, arg, baseline: str, reference, repeats: int,
           gpu_variants: dict, compile_repeats: int = 1, trips: dict | None = None) -> list[dict]:
    """`variants`: name → zero-argument maker of a fresh jitted callable; `gpu_variants` replaces
    some for the H200 compile (optimize with target="gpu": the GPU rows of the cost model)."""
    rows, calls = [], {}
    trips = trips or {}  # variant -> trips of its loop (rolled forms), for launches per call
    spec = jax.ShapeDtypeStruct(arg.shape, arg.dtype)
    # Compile seconds: paired (every variant once per round, fresh caches), medians.
    walls: dict = {k: [] for k in variants}
    cpus: dict = {k: [] for k in variants}
    compiled_by = {}
    for _ in range(compile_repeats):
        for name, make in variants.items():
            print(f"[{NAME}] {program} / {name}", file=sys.stderr, flush=True)
            cs, cpu_s, compiled = _compile_s(make(), arg)
            walls[name].append(cs)
            cpus[name].append(cpu_s)
            compiled_by.setdefault(name, compiled)
    # H200 compile seconds: paired rounds too, medians (kernels and launches do not vary).
    h200: dict = {k: [] for k in variants}
    for _ in range(compile_repeats):
        for name, make in variants.items():
            h200[name].append(_h200(gpu_variants.get(name, make), spec, trips.get(name, 1)))
    for name, make in variants.items():
        compiled = compiled_by[name]
        out = np.asarray(compiled(arg))
        # (the `_cpu` columns are the local backend's; on another one, its fusions go in
        # `fusions` and the JSON's `backend` says which)
        fusions = {"cpu_fusions" if _common.on_cpu() else "fusions": _common.cpu_fusions(compiled)}
        row = dict(program=program, form=name, **fusions,
                   compile_s_cpu=statistics.median(walls[name]),
                   compile_cpu_s_cpu=statistics.median(cpus[name]),
                   exact=bool(np.array_equal(out, reference)))
        if h200[name] and h200[name][0]:
            row.update(h200[name][0])
            for col in ("compile_s_h200", "compile_cpu_s_h200"):
                row[col] = statistics.median(r[col] for r in h200[name])
        rows.append(row)
        calls[name] = (lambda c=compiled: c(arg))
    med = _common.paired(calls, repeats=repeats)
    for row in rows:
        row["run_ms"] = med[row["form"]] * 1e3
        row["run_ratio"] = med[row["form"]] / med[baseline]
    return rows


def _add_loop_forms(variants: dict, gpu: dict) -> None:
    """Issue 12's rows: the author's block function, loop as `fori_loop`, `scan` or Python loop,
    through `optimize` (the CPU's cost model; `gpu`: the GPU's, for the H200 compile)."""
    for kind in LOOP_FORMS:
        variants[f"{kind}+optimize"] = lambda k=kind: jaxrewrite.optimize(jax.vmap(chacha_loop(k)))
        gpu[f"{kind}+optimize"] = lambda k=kind: jaxrewrite.optimize(jax.vmap(chacha_loop(k)),
                                                                     target="gpu")


def chacha(quick: bool) -> list[dict]:
    n = 4096 if quick else 65536
    x = _blocks(n)
    ref = np.asarray(jax.jit(jax.vmap(chacha_take))(x))
    assert np.array_equal(ref[0], RFC_OUT), "the take form does not match RFC 8439 2.3.2"
    variants = {k: (lambda f=f: jax.jit(jax.vmap(f))) for k, f in FORMS.items()}
    variants["take+optimize"] = lambda: jaxrewrite.optimize(jax.vmap(chacha_take))
    # reroll=True: the split double rounds roll into one scan of 10 trips (compile time);
    # unroll=2 trades some of it back for half the trips
    gpu = {"take+optimize": lambda: jaxrewrite.optimize(jax.vmap(chacha_take), target="gpu")}
    trips = {}
    for u in (1, 2):
        name = "take+optimize(reroll)" + ("" if u == 1 else f" unroll={u}")
        variants[name] = lambda u=u: jaxrewrite.optimize(jax.vmap(chacha_take), reroll=True,
                                                         unroll=u)
        gpu[name] = lambda u=u: jaxrewrite.optimize(jax.vmap(chacha_take), target="gpu",
                                                    reroll=True, unroll=u)
        trips[name] = -(-ROUNDS // u)
    # issue 12: jitted helpers and a loop; rolled under jax.jit, flattened by optimize
    variants["fori"] = lambda: jax.jit(jax.vmap(chacha_loop("fori")))
    _add_loop_forms(variants, gpu)
    if quick:  # the slow-to-compile forms are left to the full run
        variants = {k: v for k, v in variants.items()
                    if k in ("take", "words", "take+optimize", "take+optimize(reroll)", "fori",
                             "fori+optimize")}
    rows = _table("chacha20", variants, x, "words", ref, 3 if quick else 7, gpu,
                  compile_repeats=1 if quick else 5, trips=trips)
    single = np.asarray(jaxrewrite.optimize(chacha_take)(jnp.asarray(RFC_STATE)))
    for row in rows:
        row["exact"] = row["exact"] and (row["form"] != "take+optimize"
                                         or np.array_equal(single, RFC_OUT))
    return rows


def seed(quick: bool) -> list[dict]:
    from seed import COLFNS, PERMS, rounds_program
    n = 4096 if quick else 65536
    ms = jnp.asarray(np.random.default_rng(1).integers(0, 2**32, (n, 4, 4), dtype=np.uint32))
    variants = {"none": lambda: jax.jit(rounds_program(COLFNS["mix"], PERMS["none"]))}
    gpu = {}
    for p in ("gather", "take", "ravel"):
        fn = rounds_program(COLFNS["mix"], PERMS[p])
        variants[p] = lambda fn=fn: jax.jit(fn)
        variants[f"{p}+optimize"] = lambda fn=fn: jaxrewrite.optimize(fn)
        gpu[f"{p}+optimize"] = lambda fn=fn: jaxrewrite.optimize(fn, target="gpu")
    # issue 12: the inner function in lax.fori_loop(0, 7) / lax.scan of 7 trips
    for kind in ("fori", "scan"):
        for p in ("take", "none"):
            fn = rounds_loop(COLFNS["mix"], PERMS[p], kind)
            variants[f"{p}/{kind}"] = lambda fn=fn: jax.jit(fn)
            variants[f"{p}/{kind}+optimize"] = lambda fn=fn: jaxrewrite.optimize(fn)
            gpu[f"{p}/{kind}+optimize"] = lambda fn=fn: jaxrewrite.optimize(fn, target="gpu")
    if quick:
        variants = {k: v for k, v in variants.items() if "scan" not in k}
    ref = {}
    rows = []
    for p in ("gather", "take", "ravel"):
        ref[p] = np.asarray(jax.jit(rounds_program(COLFNS["mix"], PERMS[p]))(ms))
    rows = _table("seed/mix", variants, ms, "none", ref["take"], 3 if quick else 7, gpu,
                  compile_repeats=1 if quick else 5)
    for row in rows:
        if row["form"].startswith("none"):
            row["exact"] = "-"
    return rows


def rounds_loop(colfn, perm, kind: str):
    """bench/seed.py's 7-iteration program with the iterations in `lax.fori_loop(0, 7)`
    ("fori") or `lax.scan` ("scan") instead of a Python loop."""
    @jax.jit
    def inner(m):
        return perm(jax.vmap(colfn, in_axes=1, out_axes=1)(m))

    def one(m):
        if kind == "fori":
            return jax.lax.fori_loop(0, 7, lambda i, m: inner(m), m)
        return jax.lax.scan(lambda m, _: (inner(m), None), m, None, length=7)[0]

    def rounds(ms):
        return jax.vmap(one)(ms)

    rounds.__name__ = f"rounds_{kind}_{perm.__name__[5:]}"
    return rounds


def chacha_loops(quick: bool) -> list[dict]:
    """Only the issue-12 rows: the author's loop forms against the hand-written 16-word form
    (`--loops`: a few minutes on the CPU, where the full table takes much longer)."""
    n = 4096 if quick else 65536
    x = _blocks(n)
    ref = np.asarray(jax.jit(jax.vmap(chacha_words))(x))
    variants = {"words": lambda: jax.jit(jax.vmap(chacha_words)),
                "fori": lambda: jax.jit(jax.vmap(chacha_loop("fori")))}
    gpu = {}
    _add_loop_forms(variants, gpu)
    return _table("chacha20", variants, x, "words", ref, 3 if quick else 9, gpu,
                  compile_repeats=1 if quick else 5)


# --- Keccak-f[1600] (issue 25) -------------------------------------------------------------------

def keccak(quick: bool) -> list[dict]:
    """Keccak-f[1600] as users write it (bench/keccak.py: 25 uint64 lanes as a (25,) array, 24
    rounds as a Python loop, a `fori_loop` reading the round constant at the loop index, or a
    `lax.scan` over the constants), vmapped, against the hand-written 25-word form in a
    `fori_loop` (`words/fori`, the baseline). The straight-line 25-word form (`keccak.hand_f`)
    is left out: on the CPU its compile took 138 s at 16,384 states and the timing rounds with
    it had not finished after 13 minutes (each lane's loop fusion holds its whole 24-round
    cone, past XLA:CPU's fusion-emitter cliff, `backend.cost.TargetCosts.max_piece_cone`);
    H200: 5 kernels, 374 s to compile. 16,384 and 65,536 states (4,096 with --quick); x64 on inside."""
    import keccak as K
    rows = []
    with jax.enable_x64(True):
        for n in ((4096,) if quick else (16384, 65536)):
            a = jnp.asarray(np.random.default_rng(0).integers(0, 2 ** 64, (n, 25),
                                                              dtype=np.uint64))
            forms = {"python": K.keccak_f, "fori": K.keccak_fori, "scan": K.keccak_scan}
            # (A/A: the baseline again, a second jax.jit: what noise is)
            variants = {"words/fori": lambda: jax.jit(K.hand_fori),
                        "words/fori (A/A)": lambda: jax.jit(lambda s: K.hand_fori(s))}
            gpu = {}
            for kind, f in forms.items():
                variants[kind] = lambda f=f: jax.jit(jax.vmap(f))
                variants[f"{kind}+optimize"] = lambda f=f: jaxrewrite.optimize(jax.vmap(f))
                gpu[f"{kind}+optimize"] = lambda f=f: jaxrewrite.optimize(jax.vmap(f),
                                                                          target="gpu")
            # autotune=True: on the GPU it also counts the split region cut into kernels at its
            # narrowest points (passes/_segments.py), which the defaults decline
            variants["python+optimize(autotune)"] = lambda: jaxrewrite.optimize(
                jax.vmap(K.keccak_f), autotune=True)
            gpu["python+optimize(autotune)"] = lambda: jaxrewrite.optimize(
                jax.vmap(K.keccak_f), target="gpu", autotune=True)
            # reroll=True: the Python loop's rounds rolled into one scan (their round constants
            # as its xs), then split as the fori_loop form is (CPU; the GPU unrolls it again)
            variants["python+optimize(reroll)"] = lambda: jaxrewrite.optimize(
                jax.vmap(K.keccak_f), reroll=True)
            ref = np.asarray(jax.jit(K.hand_fori)(a))
            # rolled under jax.jit: their kernels launch once per round
            trips = {"words/fori": 24, "words/fori (A/A)": 24, "fori": 24, "scan": 24}
            rows += _table(f"keccak-f1600/{n}", variants, a, "words/fori", ref,
                           3 if quick else 7, gpu, compile_repeats=1 if quick else 3,
                           trips=trips)
    return rows


def main(quick: bool = False) -> list[dict]:
    return chacha(quick) + seed(quick)


if __name__ == "__main__":
    if "--loops" in sys.argv[1:]:
        _common.cli(NAME + "_loops", chacha_loops, COLUMNS)
    elif "--keccak" in sys.argv[1:]:
        _common.cli(NAME + "_keccak", keccak, COLUMNS)
    else:
        _common.cli(NAME, main, COLUMNS)
