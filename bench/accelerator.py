"""The accelerator bench (issue 39): the project's programs on one device, in one process.

    python bench/accelerator.py [--quick] [--only GROUP[,GROUP...]] [--budget SECONDS]
                                [--forms [OPTIONS;OPTIONS...]] [--match TEXT] [--sizes N,...]
                                [--out PATH]

Made for a TPU (one process holds the chip; opening it costs ~15 s), and runs anywhere JAX runs:
`--quick` (tiny sizes) takes a few minutes on a 2-core CPU. The programs come from the other
benches' builders and `jaxrewrite.strategies` (nothing is copied here); the programs written here
are the few no bench had yet (bitonic sorts by key count, xoshiro128**, a 64-point FFT, Philox,
Salsa20/8). Groups, in the order they run (`--only` picks some; `plain` = the four ciphers/FFT):

| group | programs | sizes (full) |
| --- | --- | --- |
| `seed` | bench/seed.py's loop and 7-iteration programs | as seed.py's full run |
| `chacha` | ChaCha20: the author's `fori_loop` form, its Python loop, the `jnp.take` form, the hand-written 16 words (bench/permutations.py); the author's code as written (bench/author_chacha.py), x64 off and on | 65,536 and 1,048,576 blocks |
| `keccak` | Keccak-f[1600]: Python loop, `fori_loop`, `scan`, hand-written 25 words in a `fori_loop` (bench/keccak.py; uint64 lanes, x64 on inside) | 65,536 and 1,048,576 states |
| `transformer` | a training step (loss, grad, adam) of bench/models.py's Flax NNX transformer LM, 8 blocks; without flax/optax a plain-JAX stack's SGD step (bench/dedup.py's layers), and the row says so | one batch |
| `sorts` | bitonic sorts, `x[:, i ^ j]` and min/max per stage (bench/gathers.py `_bitonic`), 16 / 32 / 64 keys a row | 65,536 and 4,096 rows |
| `xoshiro`, `fft`, `philox`, `salsa` | xoshiro128** through index tables, a radix-2 FFT of 64 points (complex64) with a bit-reversal gather, Philox-4x32-10 (x64 products), Salsa20/8 (scrypt's core), each written plainly and vmapped | 65,536 and 4,096 |
| `gathers` | bench/gathers.py's static permutations | as gathers.py's full run |
| `updates` | bench/updates.py's static `.at[]` updates | batches 1, 4,096, 65,536 |
| `never_worse` | 10 generated programs (bench/never_worse.py `_draw`, seed 1, and one of each other recipe kind of `jaxrewrite.strategies`) | 4,096 and 65,536 |

Per program, the forms: `jax.jit` (the baseline), `jax.jit (A/A)` (a second `jax.jit` of a
wrapper: what noise is), `optimize` (defaults), and with `--forms` more `optimize` variants
(default set: `reroll=True`, `gathers=False`, `scalarize=False`, `target="gpu"`; or
`--forms "reroll=True;flatten=False,scalarize=False"`). Each row:
- `run_ms`: median of paired rounds (every form once per round, the order alternating; >= 7
  rounds, 5 for the transformer, 3 with --quick), each sample a back-to-back batch of calls of
  about 20 ms; `ratio`: run_ms / jax.jit's;
- `compile_s`: trace + rewrite + lower + compile of a fresh wrapper after `jax.clear_caches()`
  (paired rounds too: 3 where the first round took under 2 s, else 1; medians); `compile_ratio`;
- `launches`: instructions in the ENTRY computation of the compiled module (`as_text()`, parsed),
  leaving out those that launch nothing (parameter, constant, tuple, get-tuple-element, bitcast);
  `loops`: how many of them are `while` (a loop's body runs once per trip: its launches are not
  counted here);
- `exact`: the form's outputs against jax.jit's, integers bit for bit, floats within the contract
  (`jaxrewrite.testing.assert_contract_equal`); `check` says which; `max_rel_diff` (floats): the
  largest difference over the outputs, relative to each output's largest magnitude; `rewrites`:
  rewrites the optimize form applied (0: nothing was rewritten, and its ratio is noise);
  `same_hlo`: XLA compiled the form to jax.jit's program (its optimized HLO up to instruction
  names, metadata and the order of independent instructions): whatever was rewritten, its run
  ratio is noise (on a shared 2-core CPU such a form measured 0.84-1.34x, Philox's 0.93-1.26x);
- `ratio_hand` (chacha, keccak): run_ms / the hand-written form's jax.jit run_ms, same size.

`--budget SECONDS`: a program whose estimated time (compiles as measured on a TPU v5e host:
0.2-1 s for small programs, 5-10 s for ChaCha20's split forms at 1,048,576 blocks, 26 s for an
8-layer transformer step) would end past the budget is not started; the JSON lists it under
`meta.skipped`. The JSON (`$OUT/accelerator.json` when OUT is set, else
bench/results/accelerator.json, `accelerator_quick.json` with --quick; `--out` overrides) is
rewritten after every program, so a run stopped from outside keeps what it measured. A program
that raises becomes a row with `error` and the run goes on.
"""
from __future__ import annotations

import argparse
import ast
import contextlib
import dataclasses
import gc
import importlib.util
import json
import os
import random
import re
import statistics
import sys
import time
import warnings
from typing import Callable

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(1, os.path.join(HERE, "..", "tests"))   # test_never_worse's HLO comparison

import _common  # noqa: E402
import author_chacha  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import jaxrewrite  # noqa: E402
from jaxrewrite.testing import assert_contract_equal  # noqa: E402

GROUPS = ("seed", "chacha", "keccak", "transformer", "sorts", "xoshiro", "fft", "philox",
          "salsa", "gathers", "updates", "never_worse")
ALIASES = {"plain": ("xoshiro", "fft", "philox", "salsa")}
DEFAULT_FORMS = ({"reroll": True}, {"gathers": False}, {"scalarize": False}, {"target": "gpu"})
BASE, AA, OPT = "jax.jit", "jax.jit (A/A)", "optimize"


@dataclasses.dataclass
class Case:
    """One program at one size: `fn(*make_args())`; `x64`: built, traced and run with x64 on;
    `est_s`: what its compiles and runs should take on a TPU v5e (for --budget)."""
    group: str
    program: str
    size: int
    fn: Callable
    make_args: Callable[[], tuple]
    est_s: float = 4.0
    x64: bool = False
    hand: str | None = None         # the program whose jax.jit run is this one's `ratio_hand`
    check: Callable | None = None   # check(jax.jit's outputs, args) -> note (a known answer)
    rounds: int = 7
    note: str = ""


# --- programs no bench had: written as a user would ------------------------------------------

def _rotl32(x, n: int):
    return (x << np.uint32(n)) | (x >> np.uint32(32 - n))


XO_HI, XO_LO, XO_SWAP = np.array([2, 3]), np.array([0, 1]), np.array([1, 0])


def xoshiro128ss(s, steps: int = 16):
    """xoshiro128** (Blackman and Vigna): `steps` outputs of the (4,) uint32 state `s`, the
    state words updated through index tables; returns (state, outputs)."""
    out = []
    for _ in range(steps):
        out.append(_rotl32(s[1] * np.uint32(5), 7) * np.uint32(9))
        t = s[1] << np.uint32(9)
        s = s.at[XO_HI].set(s[XO_HI] ^ s[XO_LO])          # s2 ^= s0; s3 ^= s1
        s = s.at[XO_SWAP].set(s[XO_SWAP] ^ s[XO_HI])      # s1 ^= s2; s0 ^= s3
        s = s.at[2].set(s[2] ^ t)
        s = s.at[3].set(_rotl32(s[3], 11))
    return s, jnp.stack(out)


def _xoshiro_reference(s, steps: int = 16) -> list[int]:
    s = [int(v) for v in s]
    m = 0xFFFFFFFF
    rotl = lambda x, k: ((x << k) | (x >> (32 - k))) & m  # noqa: E731
    out = []
    for _ in range(steps):
        out.append(rotl(s[1] * 5 & m, 7) * 9 & m)
        t = s[1] << 9 & m
        s[2] ^= s[0]; s[3] ^= s[1]; s[1] ^= s[2]; s[0] ^= s[3]; s[2] ^= t  # noqa: E702
        s[3] = rotl(s[3], 11)
    return out


FFT_N = 64


def fft64(x):
    """Radix-2 decimation-in-time FFT of 64 complex64 points: a bit-reversal gather, then six
    butterfly stages, each reading and writing its pairs through static index tables."""
    import gathers
    x = x[gathers._bitrev(FFT_N)]
    k, m = np.arange(FFT_N), 2
    while m <= FFT_N:
        top = k[k % m < m // 2]
        bot = top + m // 2
        w = np.exp(-2j * np.pi * (top % m) / m).astype(np.complex64)
        u, t = x[top], x[bot] * w
        x = x.at[top].set(u + t).at[bot].set(u - t)
        m *= 2
    return x


PHILOX_M = (0xD2511F53, 0xCD9E8D57)
PHILOX_W = np.array([0x9E3779B9, 0xBB67AE85], np.uint32)


def philox4x32_10(ctr, key):
    """Philox-4x32-10 (Salmon et al., Random123): a (4,) uint32 counter under a (2,) key; the
    32x32 -> 64-bit products in uint64 (x64 on)."""
    c, k = ctr, key
    for r in range(10):
        if r:
            k = k + PHILOX_W
        p0 = c[0].astype(jnp.uint64) * np.uint64(PHILOX_M[0])
        p1 = c[2].astype(jnp.uint64) * np.uint64(PHILOX_M[1])
        hi0, lo0 = (p0 >> np.uint64(32)).astype(jnp.uint32), p0.astype(jnp.uint32)
        hi1, lo1 = (p1 >> np.uint64(32)).astype(jnp.uint32), p1.astype(jnp.uint32)
        c = jnp.stack([hi1 ^ c[1] ^ k[0], lo1, hi0 ^ c[3] ^ k[1], lo0])
    return c


# Random123's known answer: counter 0, key 0
PHILOX_ZERO = np.array([0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8], np.uint32)

SALSA_COLUMNS = tuple(np.array(v) for v in ([0, 5, 10, 15], [4, 9, 14, 3], [8, 13, 2, 7],
                                            [12, 1, 6, 11]))
SALSA_ROWS = tuple(np.array(v) for v in ([0, 5, 10, 15], [1, 6, 11, 12], [2, 7, 8, 13],
                                         [3, 4, 9, 14]))


def _salsa_quarter(s, a, b, c, d):
    s = s.at[b].set(s[b] ^ _rotl32(s[a] + s[d], 7))
    s = s.at[c].set(s[c] ^ _rotl32(s[b] + s[a], 9))
    s = s.at[d].set(s[d] ^ _rotl32(s[c] + s[b], 13))
    return s.at[a].set(s[a] ^ _rotl32(s[d] + s[c], 18))


def salsa20_8(x):
    """Salsa20/8's core (scrypt, RFC 7914 section 3) on 16 uint32 words: four double rounds,
    each quarter round applied to four columns (then rows) at once through index tables."""
    s = x
    for _ in range(4):
        s = _salsa_quarter(s, *SALSA_COLUMNS)
        s = _salsa_quarter(s, *SALSA_ROWS)
    return s + x


# RFC 7914 section 8: Salsa20/8 core test vector (little-endian bytes)
SALSA_IN = bytes.fromhex(
    "7e879a214f3ec9867ca940e641718f26baee555b8c61c1b50df846116dcd3b1d"
    "ee24f319df9b3d8514121e4b5ac5aa3276021d2909c74829edebc68db8b8c25e")
SALSA_OUT = bytes.fromhex(
    "a41f859c6608cc993b81cacb020cef05044b2181a2fd337dfd7b1c6396682f29"
    "b4393168e3c9e6bcfe6bc5b7a06d96bae424cc102c91745c24ad673dc7618f81")


def plain_transformer(layers: int):
    """Without flax/optax: bench/dedup.py's pre-norm transformer stack (checkpointed layers in
    a Python loop), one SGD step of its loss."""
    import dedup

    def step(params, x):
        loss, g = jax.value_and_grad(dedup.stack)(params, x)
        return loss, jax.tree_util.tree_map(lambda p, d: p - 1e-3 * d, params, g)

    def make():
        x = jax.random.normal(jax.random.key(1), (256, 128))
        return dedup._params(layers, 128), x
    return step, make


# --- the groups --------------------------------------------------------------------------------

def _u32(shape, seed=0):
    return jnp.asarray(np.random.default_rng(seed).integers(0, 2 ** 32, shape, dtype=np.uint32))


def _known(name: str, ok: bool) -> str:
    return f"{name}: {'ok' if ok else 'WRONG'}"


def seed_cases(quick):
    import seed
    out = []
    for name, fn, x in seed.programs(quick):
        out.append(Case("seed", f"seed {name}", int(x.shape[0]), fn, lambda x=x: (x,), 3.0))
    return out


def chacha_cases(quick):
    from permutations import RFC_OUT, _blocks, chacha_loop, chacha_take, chacha_words
    forms = (("chacha20 fori (author)", lambda: jax.vmap(chacha_loop("fori")), 3.0),
             ("chacha20 Python loop", lambda: jax.vmap(chacha_loop("python")), 6.0),
             ("chacha20 take form", lambda: jax.vmap(chacha_take), 6.0),
             ("chacha20 hand (16 words)", lambda: jax.vmap(chacha_words), 4.0))

    def check(out, _):
        return _known("RFC 8439 2.3.2", np.array_equal(np.asarray(out)[0], RFC_OUT))

    out = []
    for n in ((1024,) if quick else (65536, 1 << 20)):
        for name, make, est in forms:
            out.append(Case("chacha", name, n, make(), lambda n=n: (_blocks(n),),
                            est * (4 if n > 65536 else 1), hand="chacha20 hand (16 words)",
                            check=check))
        # the seed author's code as written (bench/author_chacha.py), x64 off and on
        for x64 in (False, True):
            out.append(Case("chacha", f"chacha20 as written (author){', x64' if x64 else ''}",
                            n, jax.vmap(author_chacha.fresh_copy().block),
                            lambda n=n: (_blocks(n),), 3.0 * (4 if n > 65536 else 1), x64=x64,
                            hand="chacha20 hand (16 words)", check=check))
    return out


def keccak_cases(quick):
    import keccak as K

    def states(n):
        a = np.random.default_rng(0).integers(0, 2 ** 64, (n, 25), dtype=np.uint64)
        a[0] = 0                                   # Keccak-f[1600] of the zero state: known
        return (jnp.asarray(a),)

    def check(out, _):
        return _known("Keccak-f[1600](0) lane 0", int(np.asarray(out)[0, 0]) == 0xF1258F7940E1DDE7)

    forms = (("keccak-f1600 Python loop", lambda: jax.vmap(K.keccak_f), 12.0),
             ("keccak-f1600 fori", lambda: jax.vmap(K.keccak_fori), 5.0),
             ("keccak-f1600 scan", lambda: jax.vmap(K.keccak_scan), 5.0),
             ("keccak-f1600 hand (25 words, fori)", lambda: K.hand_fori, 5.0))
    out = []
    for n in ((1024,) if quick else (65536, 1 << 20)):
        for name, make, est in forms:
            out.append(Case("keccak", name, n, make(), lambda n=n: states(n),
                            est * (2 if n > 65536 else 1), x64=True,
                            hand="keccak-f1600 hand (25 words, fori)", check=check))
    return out


def transformer_cases(quick):
    layers = 2 if quick else 8
    if importlib.util.find_spec("flax") and importlib.util.find_spec("optax"):
        import models as M
        step, args = M.build("nnx", layers)
        return [Case("transformer", f"flax nnx transformer LM step ({layers} blocks, adam)",
                     layers, step, lambda: args, 110.0, rounds=5,
                     note=f"bench/models.py nnx: d {M.D}, {M.HEADS} heads, seq {M.SEQ}, "
                          f"batch {M.BATCH}")]
    missing = [m for m in ("flax", "optax") if importlib.util.find_spec(m) is None]
    step, make = plain_transformer(layers)
    return [Case("transformer", f"plain-JAX transformer stack step ({layers} layers, SGD)",
                 layers, step, make, 90.0, rounds=5,
                 note=f"{', '.join(missing)} not installed: bench/dedup.py's stack instead of "
                      "the Flax NNX model")]


def sort_cases(quick):
    import gathers

    def check(out, _):
        return _known("rows sorted", bool(np.all(np.diff(np.asarray(out), axis=-1) >= 0)))

    out = []
    for batch in ((256,) if quick else (65536, 4096)):
        for keys in ((16, 32) if quick else (16, 32, 64)):
            out.append(Case(
                "sorts", f"bitonic sort, {keys} keys a row", batch, gathers._bitonic,
                lambda b=batch, k=keys: (jnp.asarray(np.random.default_rng(k).integers(
                    -1000, 1000, (b, k)), jnp.int32),), 3.0 + keys / 16, check=check))
    return out


def _plain_sizes(quick):
    return (256,) if quick else (65536, 4096)


def xoshiro_cases(quick):
    def check(out, args):
        return _known("xoshiro128** row 0", [int(v) for v in np.asarray(out[1])[0]]
                      == _xoshiro_reference(np.asarray(args[0])[0]))
    return [Case("xoshiro", "xoshiro128**, 16 outputs", n, jax.vmap(xoshiro128ss),
                 lambda n=n: (_u32((n, 4), 7),), 3.0, check=check) for n in _plain_sizes(quick)]


def fft_cases(quick):
    def data(n):
        r = np.random.default_rng(3)
        return (jnp.asarray((r.standard_normal((n, FFT_N)) + 1j * r.standard_normal(
            (n, FFT_N))).astype(np.complex64)),)

    def check(out, args):
        x = np.asarray(args[0])[0].astype(np.complex128)
        err = np.max(np.abs(np.asarray(out)[0] - np.fft.fft(x))) / np.max(np.abs(np.fft.fft(x)))
        return f"against numpy.fft: {err:.1e} of the largest"
    return [Case("fft", "radix-2 FFT, 64 points (complex64)", n, jax.vmap(fft64),
                 lambda n=n: data(n), 3.0, check=check) for n in _plain_sizes(quick)]


def philox_cases(quick):
    def data(n):
        ctr = np.random.default_rng(5).integers(0, 2 ** 32, (n, 4), dtype=np.uint32)
        ctr[0] = 0
        key = np.zeros((n, 2), np.uint32)
        key[1:] = np.random.default_rng(6).integers(0, 2 ** 32, (n - 1, 2), dtype=np.uint32)
        return jnp.asarray(ctr), jnp.asarray(key)

    def check(out, _):
        return _known("Random123 known answer", np.array_equal(np.asarray(out)[0], PHILOX_ZERO))

    return [Case("philox", "Philox-4x32-10", n, jax.vmap(philox4x32_10), lambda n=n: data(n),
                 3.0, x64=True, check=check) for n in _plain_sizes(quick)]


def salsa_cases(quick):
    def data(n):
        x = np.random.default_rng(8).integers(0, 2 ** 32, (n, 16), dtype=np.uint32)
        x[0] = np.frombuffer(SALSA_IN, "<u4")
        return (jnp.asarray(x),)

    def check(out, _):
        return _known("RFC 7914 section 8",
                      np.asarray(out)[0].astype("<u4").tobytes() == SALSA_OUT)

    return [Case("salsa", "Salsa20/8 core", n, jax.vmap(salsa20_8), lambda n=n: data(n), 3.0,
                 check=check) for n in _plain_sizes(quick)]


def gathers_cases(quick):
    import gathers
    return [Case("gathers", name, int(x.shape[0]), fn, lambda x=x: (x,), 3.0)
            for name, fn, x in gathers.permutations(quick)]


def updates_cases(quick):
    """updates.py's programs at batch 1 (a launch's cost), 4,096 and 65,536 (its 256 left out:
    the chip's time goes to the other groups)."""
    import updates
    return [Case("updates", name, int(x.shape[0]), fn, lambda x=x: (x,), 3.0)
            for name, fn, x in updates.programs(quick) if quick or x.shape[0] != 256]


def drawn_recipes(n_arx: int, seed: int = 1) -> list:
    """`n_arx` ARX recipes from bench/never_worse.py's generator (its `_draw`, a seeded
    random.Random), their loops taken round-robin as `fori_loop`, Python loop and jitted
    helpers; then one recipe of each other kind in `jaxrewrite.strategies`, its fields drawn
    by a `random.Random` of the same seed."""
    import never_worse
    from jaxrewrite import strategies as S
    arx = [dataclasses.replace(r, wrap=("fori", "", "jit")[k % 3])
           for k, r in enumerate(never_worse._draw(n_arx, seed))]
    rng = random.Random(seed)
    return arx + [
        S.FieldRecipe(shape=rng.choice([(8,), (4, 4), (5, 5)]), steps=rng.randint(2, 8),
                      seed=rng.randint(0, 999)),
        S.ScatterRecipe(kind="face", dtype="int8", steps=rng.randint(2, 6),
                        seed=rng.randint(0, 999)),
        S.ScatterRecipe(kind="shift", dtype="uint32", steps=rng.randint(2, 6), wrap="fori",
                        seed=rng.randint(0, 999)),
        S.SwitchRecipe(dtype="uint32", form=rng.choice(["switch", "select"]),
                       seed=rng.randint(0, 999)),
        S.SymmetryRecipe(side=4, group="translations", seed=rng.randint(0, 999))]


def never_worse_cases(quick):
    out = []
    for r in drawn_recipes(1 if quick else 5):
        for n in ((256,) if quick else (4096, 65536)):
            rn = dataclasses.replace(r, batch=n)
            out.append(Case("never_worse", repr(dataclasses.replace(r, batch=0)).replace(
                ", batch=0", ""), n, rn.fn, lambda rn=rn: rn.args, 4.0,
                x64=getattr(r, "dtype", "") == "uint64"))
    return out


BUILDERS = {"seed": seed_cases, "chacha": chacha_cases, "keccak": keccak_cases,
            "transformer": transformer_cases, "sorts": sort_cases, "xoshiro": xoshiro_cases,
            "fft": fft_cases, "philox": philox_cases, "salsa": salsa_cases,
            "gathers": gathers_cases, "updates": updates_cases,
            "never_worse": never_worse_cases}


# --- measuring ------------------------------------------------------------------------------

_NO_LAUNCH = {"parameter", "constant", "tuple", "get-tuple-element", "bitcast"}
_INSTR = re.compile(r"^\s*(?:ROOT\s+)?%?[\w.\-]+\s*=\s*(?:\([^=]*?\)|\S+)\s+([a-z][a-z0-9\-]*)\(")


def entry_instructions(hlo_text: str) -> dict[str, int]:
    """Opcodes of the instructions in the ENTRY computation of an HLO module's text."""
    counts: dict[str, int] = {}
    inside = False
    for line in hlo_text.splitlines():
        if not inside:
            inside = line.startswith("ENTRY ")
            continue
        if line.startswith("}"):
            break
        m = _INSTR.match(line)
        if m:
            counts[m.group(1)] = counts.get(m.group(1), 0) + 1
    return counts


def launches(compiled) -> tuple[int, int]:
    """(instructions in ENTRY that launch something, `while` loops among them)."""
    ops = entry_instructions(compiled.as_text())
    return sum(n for op, n in ops.items() if op not in _NO_LAUNCH), ops.get("while", 0)


def _inexact(tree) -> bool:
    return any(hasattr(x, "dtype") and jnp.issubdtype(x.dtype, jnp.inexact)
               for x in jax.tree_util.tree_leaves(tree))


def compare(got, want) -> tuple[bool, str]:
    try:
        assert_contract_equal(got, want, meta=False)
    except AssertionError as e:
        return False, " ".join(str(e).split())[:240]
    return True, ""


def max_rel_diff(got, want) -> float:
    worst = 0.0
    for a, b in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)):
        a, b = np.asarray(a), np.asarray(b)
        if not jnp.issubdtype(b.dtype, jnp.inexact) or not b.size:
            continue
        a, b = a.astype(np.complex128 if b.dtype.kind == "c" else np.float64), \
            b.astype(np.complex128 if b.dtype.kind == "c" else np.float64)
        fin = np.isfinite(b)
        if fin.any():
            scale = max(float(np.max(np.abs(b[fin]))), 1e-30)
            worst = max(worst, float(np.max(np.abs(a[fin] - b[fin]))) / scale)
    return worst


def _form_name(opts: dict) -> str:
    return "optimize(" + ", ".join(f"{k}={v!r}" for k, v in opts.items()) + ")"


def variants(fn, forms) -> dict[str, Callable]:
    """name -> maker of a fresh jitted callable. A form's `inject=PASS` is no option: that
    pass's output fails to lower (`jaxrewrite.testing.inject_lowering_failure`), and the
    fallback by pass decides what runs."""
    out = {BASE: lambda: jax.jit(fn), AA: lambda: jax.jit(lambda *a: fn(*a)),
           OPT: lambda: jaxrewrite.optimize(fn)}
    for opts in forms:
        rest = {k: v for k, v in opts.items() if k != "inject"}
        if "inject" in opts:
            out[_form_name(opts)] = lambda o=rest, p=opts["inject"]: _Injected(
                jaxrewrite.optimize(fn, **o), p)
        else:
            out[_form_name(opts)] = lambda o=rest: jaxrewrite.optimize(fn, **o)
    return out


@dataclasses.dataclass
class _Injected:
    """A jitted function lowered with `pass_name`'s output failing to lower."""
    jitted: Callable
    pass_name: str

    def lower(self, *args):
        from jaxrewrite.testing import inject_lowering_failure
        with inject_lowering_failure(self.pass_name), warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)   # (the one fallback warning)
            return self.jitted.lower(*args)


def _compile(make, args):
    jax.clear_caches()
    gc.collect()
    t = time.perf_counter()
    compiled = make().lower(*args).compile()
    return time.perf_counter() - t, compiled


def _sample(c, args, n):
    t = time.perf_counter()
    for _ in range(n):
        out = c(*args)
    _common.block(out)
    return (time.perf_counter() - t) / n


def measure(case: Case, forms, quick: bool) -> list[dict]:
    x64 = jax.enable_x64(True) if case.x64 else contextlib.nullcontext()
    with x64:
        args = case.make_args()
        makers = variants(case.fn, forms)
        names = list(makers)
        comp: dict = {k: [] for k in names}
        compiled, rewrites, errors = {}, {}, {}
        for r in range(3):
            t0 = time.perf_counter()
            for name in (names if r % 2 == 0 else names[::-1]):
                s, c = _compile(makers[name], args)
                comp[name].append(s)
                if name not in compiled:
                    compiled[name] = c
                    if name.startswith(OPT):
                        rep = jaxrewrite.last_report()
                        rewrites[name] = len(rep.rewrites) if rep is not None else ""
                        errors[name] = "; ".join(map(str, rep.errors))[:200] if rep else ""
            if quick or time.perf_counter() - t0 > 2.0:
                break
        outs = {k: _common.block(c(*args)) for k, c in compiled.items()}
        want = outs[BASE]
        check = "contract" if _inexact(want) else "bits"
        known = case.check(jax.device_get(want), args) if case.check else ""
        t = time.perf_counter()
        _common.block(compiled[BASE](*args))
        once = max(time.perf_counter() - t, 1e-6)
        n = max(1, min(1000, int((0.005 if quick else 0.02) / once)))
        samples: dict = {k: [] for k in names}
        rounds = 3 if quick else case.rounds
        for r in range(rounds):
            for name in (names if r % 2 == 0 else names[::-1]):
                samples[name].append(_sample(compiled[name], args, n))
        run = {k: statistics.median(v) for k, v in samples.items()}
        ccomp = {k: statistics.median(v) for k, v in comp.items()}
        from test_never_worse import _program_text
        text = {k: _program_text(c) for k, c in compiled.items()}
        rows = []
        for name in names:
            ok, why = (True, "") if name == BASE else compare(outs[name], want)
            diff = max_rel_diff(outs[name], want) if check == "contract" else ""
            nl, loops = launches(compiled[name])
            rows.append(dict(
                group=case.group, program=case.program, size=case.size, form=name,
                run_ms=run[name] * 1e3, ratio=run[name] / run[BASE], compile_s=ccomp[name],
                compile_ratio=ccomp[name] / ccomp[BASE], launches=nl, loops=loops, exact=ok,
                check=check, max_rel_diff=diff, rewrites=rewrites.get(name, ""),
                calls_per_sample=n, same_hlo=name != BASE and text[name] == text[BASE],
                rounds=rounds, note="; ".join(x for x in (case.note, known, why,
                                                          errors.get(name, "")) if x)))
        del compiled, outs, want, args
        return rows


# --- the run --------------------------------------------------------------------------------

def _device() -> dict:
    return dict(_common.device(), platform_version=getattr(jax.devices()[0].client,
                                                           "platform_version", ""))


def out_path(arg: str | None, quick: bool) -> str:
    if arg:
        return arg
    name = "accelerator_quick.json" if quick else "accelerator.json"
    if os.environ.get("OUT"):
        return os.path.join(os.environ["OUT"], name)
    return os.path.join(_common.RESULTS, name)


def parse_forms(spec: str | None) -> list[dict]:
    """`--forms` alone: DEFAULT_FORMS; else ';'-separated forms of ','-separated k=v."""
    if spec is None:
        return []
    if spec == "default":
        return [dict(f) for f in DEFAULT_FORMS]
    forms = []
    for form in filter(None, (f.strip() for f in spec.split(";"))):
        opts = {}
        for kv in filter(None, (p.strip() for p in form.split(","))):
            k, v = kv.split("=", 1)
            try:
                opts[k.strip()] = ast.literal_eval(v.strip())
            except (ValueError, SyntaxError):
                opts[k.strip()] = v.strip()
        jaxrewrite.Options.make(**{k: v for k, v in opts.items() if k != "inject"})  # (typos)
        forms.append(opts)
    return forms


def groups_of(only: str | None) -> list[str]:
    if not only:
        return list(GROUPS)
    picked = []
    for g in (s.strip() for s in only.split(",") if s.strip()):
        for name in ALIASES.get(g, (g,)):
            if name not in BUILDERS:
                sys.exit(f"--only {g}: unknown group; groups: {', '.join(GROUPS)}, "
                         f"{', '.join(ALIASES)}")
            picked.append(name)
    return [g for g in GROUPS if g in picked]


def _hand_ratios(rows: list[dict]) -> None:
    hand = {(r["group"], r["program"], r["size"]): r["run_ms"] for r in rows
            if r.get("form") == BASE and "run_ms" in r}
    for r in rows:
        key = (r["group"], r.get("hand"), r["size"])
        if r.get("hand") and key in hand and "run_ms" in r:
            r["ratio_hand"] = r["run_ms"] / hand[key]


def write(path: str, rows: list[dict], meta: dict) -> None:
    _hand_ratios(rows)
    payload = dict(name="accelerator", jax=jax.__version__, **_device(),
                   date=time.strftime("%Y-%m-%d %H:%M:%S"), xla_flags=os.environ.get("XLA_FLAGS"),
                   meta=meta, rows=rows)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(payload, f, indent=1, default=str)
    os.replace(tmp, path)


def _line(rows: list[dict]) -> str:
    """One program in one line: jax.jit's run, then every other form's ratio."""
    by = {r["form"]: r for r in rows}
    b = by.get(BASE)
    if b is None:
        return f"{rows[0]['program']} x {rows[0]['size']}: {rows[0].get('error', '')}"
    parts = [f"jit {b['run_ms']:.3f} ms, compile {b['compile_s']:.2f} s, launches "
             f"{b['launches']}"]
    for name, r in by.items():
        if name == BASE:
            continue
        flag = ("" if r["exact"] else " DIFFERS") + (" same HLO" if r.get("same_hlo") else "")
        parts.append(f"{name} {r['ratio']:.2f}x (compile {r['compile_ratio']:.2f}x, launches "
                     f"{r['launches']}{', rewrites ' + str(r['rewrites']) if r['rewrites'] != '' else ''})"
                     f"{flag}")
    return f"{b['program']} x {b['size']}: " + "; ".join(parts)


def table(rows: list[dict]) -> str:
    """The compact table: one line per program and size."""
    cols = ("program", "size", "jit ms", "A/A", "optimize", "opt compile", "launches",
            "exact", "vs hand")
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    seen = []
    for r in rows:
        key = (r["group"], r["program"], r["size"])
        if key not in seen:
            seen.append(key)
    for key in seen:
        by = {r.get("form"): r for r in rows if (r["group"], r["program"], r["size"]) == key}
        b, a, o = by.get(BASE), by.get(AA), by.get(OPT)
        if b is None or o is None:
            err = next(iter(by.values())).get("error", "")
            lines.append(f"| {key[1]} | {key[2]} | error: {err[:80]} |" + " |" * 6)
            continue
        extra = [f"{k[len(OPT):]} {r['ratio']:.2f}x{' same HLO' if r.get('same_hlo') else ''}"
                 for k, r in by.items()
                 if k not in (BASE, AA, OPT)]
        cells = [key[1], str(key[2]), f"{b['run_ms']:.3f}", f"{a['ratio']:.2f}x",
                 f"{o['ratio']:.2f}x" + (" (same HLO)" if o.get("same_hlo") else "")
                 + (f" ({', '.join(extra)})" if extra else ""),
                 f"{o['compile_s']:.2f} s ({o['compile_ratio']:.2f}x)",
                 f"{b['launches']} -> {o['launches']}",
                 ("yes" if all(r["exact"] for r in by.values()) else "NO") + f" ({b['check']})",
                 f"{o['ratio_hand']:.2f}x" if "ratio_hand" in o else ""]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="tiny sizes, 3 rounds")
    ap.add_argument("--only", default=None, help=f"groups: {', '.join(GROUPS)}; plain")
    ap.add_argument("--budget", type=float, default=None,
                    help="seconds: start no program whose estimate ends past it")
    ap.add_argument("--forms", nargs="?", const="default", default=None,
                    help="extra optimize forms: 'k=v,k=v;k=v' (alone: a default set)")
    ap.add_argument("--out", default=None, help="the JSON file to write")
    ap.add_argument("--sizes", default=None,
                    help="only these sizes, comma-separated (e.g. 4096)")
    ap.add_argument("--match", default=None,
                    help="only programs whose name holds this text (e.g. 'as written')")
    args = ap.parse_args(argv)
    t_start = time.perf_counter()
    forms = parse_forms(args.forms)
    path = out_path(args.out, args.quick)
    groups = groups_of(args.only)
    dev = _device()
    print(f"accelerator bench: {dev['backend']} ({dev['device_kind']}), jax {jax.__version__}, "
          f"groups {','.join(groups)}, budget {args.budget or 'none'} s -> {path}", flush=True)
    meta = dict(quick=args.quick, groups=groups, budget_s=args.budget,
                forms=[_form_name(f) for f in forms], argv=sys.argv[1:], skipped=[],
                flax=importlib.util.find_spec("flax") is not None, seconds=0.0)
    rows: list[dict] = []
    done = 0
    for g in groups:
        try:
            group_cases = BUILDERS[g](args.quick)
        except Exception as e:  # noqa: BLE001 - the other groups still run
            rows.append(dict(group=g, program=g, size=0, error=f"{type(e).__name__}: {e}"))
            print(f"[{g}] building failed: {type(e).__name__}: {e}", flush=True)
            continue
        for case in group_cases:
            if args.match and args.match not in case.program:
                continue
            if args.sizes and case.size not in {int(n) for n in args.sizes.split(",")}:
                continue
            elapsed = time.perf_counter() - t_start
            est = case.est_s * (len(forms) + 3) / 3
            if args.budget is not None and elapsed + est > args.budget:
                meta["skipped"].append(f"{case.program} x {case.size} (est. {est:.0f} s at "
                                       f"{elapsed:.0f} s)")
                print(f"[{g}] skipped (budget): {case.program} x {case.size}", flush=True)
                continue
            done += 1
            t0 = time.perf_counter()
            try:
                new = measure(case, forms, args.quick)
            except Exception as e:  # noqa: BLE001 - recorded; the run goes on
                new = [dict(group=case.group, program=case.program, size=case.size,
                            error=f"{type(e).__name__}: {' '.join(str(e).split())[:400]}")]
            for r in new:
                r["hand"] = case.hand
                r["seconds"] = time.perf_counter() - t0
            rows += new
            jax.clear_caches()
            gc.collect()
            meta["seconds"] = time.perf_counter() - t_start
            write(path, rows, meta)
            print(f"[{g} {done} {meta['seconds']:.0f} s] {_line(new)}", flush=True)
    meta["seconds"] = time.perf_counter() - t_start
    write(path, rows, meta)
    print("\n" + table(rows), flush=True)
    failed = [r for r in rows if "error" in r]
    differs = sorted({f"{r['program']} x {r['size']} / {r['form']}" for r in rows
                      if r.get("exact") is False})
    print(f"\n{len(rows)} rows, {len(failed)} errors, {len(differs)} forms not exact, "
          f"{len(meta['skipped'])} skipped (budget), {meta['seconds']:.0f} s -> {path}",
          flush=True)
    for d in differs:
        print(f"  not exact: {d}", flush=True)
    for r in failed:
        print(f"  error: {r['program']} x {r['size']}: {r['error']}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
