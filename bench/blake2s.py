"""BLAKE2s written plainly from RFC 7693, as a new user would: `optimize` against `jax.jit`.

    python bench/blake2s.py [--quick]

The hash of messages of up to 64 bytes (one block each, zero-padded): the compression function
`compress(h, m, t, last)` of RFC 7693 section 3.2, the message schedule read as `m[SIGMA[r]]`,
the diagonals moved into columns with `jnp.take`, the byte counter and the final-block flag
written with `v.at[12].set(...)` and `v.at[14].set(...)`, ten rounds in a Python loop;
`jax.vmap` over the messages and their lengths. At 16,384 messages this program made
`optimize` raise before 0.2.0 (issue 38: a broadcast of a repeated literal the literals pass
emitted with the wrong rank, and a fallback that did not cover lowering).

Rows per batch (1, 64, 16,384, 65,536 messages; --quick: 1, 64, 4,096): `jit`, `jit (A/A)`
(a second jax.jit: what noise is), `optimize`; run time (paired rounds, medians, one
process) and its ratio to `jit`, compile seconds (trace + rewrite + lower + compile from fresh
caches), and whether every digest equals `hashlib.blake2s`'s.
"""
from __future__ import annotations

import hashlib
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _common  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import jaxrewrite  # noqa: E402

NAME = "blake2s"
COLUMNS = ("messages", "form", "run_ms", "run_ratio_jit", "compile_s", "compile_ratio_jit",
           "exact")

from limit import IV, SIGMA  # noqa: E402  (RFC 7693 section 2.6 and 2.7)
# v[0:4], v[4:8], v[8:12], v[12:16] are the columns' a, b, c, d; the diagonals' a, b, c, d:
DIAGONALS = np.array([0, 1, 2, 3, 5, 6, 7, 4, 10, 11, 8, 9, 15, 12, 13, 14])
COLUMNS_BACK = np.argsort(DIAGONALS)


def rotr(x, n):
    return (x >> n) | (x << (32 - n))


def mix(a, b, c, d, x, y):
    """G of RFC 7693 section 3.1, on four lanes at once."""
    a = a + b + x
    d = rotr(d ^ a, 16)
    c = c + d
    b = rotr(b ^ c, 12)
    a = a + b + y
    d = rotr(d ^ a, 8)
    c = c + d
    b = rotr(b ^ c, 7)
    return a, b, c, d


def compress(h, m, t, last):
    """F of RFC 7693 section 3.2: state `h` (8 words), block `m` (16 words), byte count `t`
    (below 2**32 here), `last` the final-block flag."""
    v = jnp.concatenate([h, jnp.asarray(IV)])
    v = v.at[12].set(v[12] ^ t)
    v = v.at[14].set(jnp.where(last, ~v[14], v[14]))
    for r in range(10):
        s = m[SIGMA[r]]
        a, b, c, d = mix(v[0:4], v[4:8], v[8:12], v[12:16], s[0:8:2], s[1:8:2])
        v = jnp.take(jnp.concatenate([a, b, c, d]), DIAGONALS)
        a, b, c, d = mix(v[0:4], v[4:8], v[8:12], v[12:16], s[8:16:2], s[9:16:2])
        v = jnp.take(jnp.concatenate([a, b, c, d]), COLUMNS_BACK)
    return h ^ v[:8] ^ v[8:]


def digest(m, length):
    """BLAKE2s-256 of a message of `length` <= 64 bytes, zero-padded into the 16 little-endian
    words `m` (unkeyed): its 8 digest words."""
    h = jnp.asarray(IV).at[0].set(IV[0] ^ np.uint32(0x01010020))   # 32-byte digest, unkeyed
    return compress(h, m, length, True)


hash_all = jax.vmap(digest)


def messages(n: int, seed: int = 0):
    """`n` random messages of 0-64 bytes: (words (n, 16) uint32, lengths (n,) uint32, bytes)."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(0, 65, n).astype(np.uint32)
    raw = rng.integers(0, 256, (n, 64), dtype=np.uint8)
    raw[np.arange(64)[None, :] >= lengths[:, None]] = 0
    words = raw.view("<u4").astype(np.uint32)
    return words, lengths, [bytes(raw[i, :lengths[i]]) for i in range(n)]


def matches_hashlib(digests, raw) -> bool:
    d = np.asarray(digests).astype("<u4")
    return all(d[i].tobytes() == hashlib.blake2s(raw[i]).digest() for i in range(len(raw)))


def _compile_s(make, args) -> float:
    jax.clear_caches()
    t = time.perf_counter()
    make().lower(*args).compile()
    return time.perf_counter() - t


def main(quick: bool = False) -> list[dict]:
    rows = []
    for n in ((1, 64, 4096) if quick else (1, 64, 16384, 65536)):
        words, lengths, raw = messages(n)
        args = (jnp.asarray(words), jnp.asarray(lengths))
        makers = {"jit": lambda: jax.jit(lambda m, t: hash_all(m, t)),
                  "jit (A/A)": lambda: jax.jit(lambda m, t: hash_all(m, t)),
                  "optimize": lambda: jaxrewrite.optimize(lambda m, t: hash_all(m, t))}
        comp = {k: _compile_s(mk, args) for k, mk in makers.items()}
        fns = {k: mk() for k, mk in makers.items()}
        runs = _common.paired({k: (lambda f: lambda: f(*args))(f) for k, f in fns.items()},
                              repeats=5 if quick else 9)
        for k, f in fns.items():
            rows.append(dict(messages=n, form=k, run_ms=runs[k] * 1e3,
                             run_ratio_jit=runs[k] / runs["jit"], compile_s=comp[k],
                             compile_ratio_jit=comp[k] / comp["jit"],
                             exact=matches_hashlib(f(*args), raw)))
    return rows


if __name__ == "__main__":
    _common.cli(NAME, main, COLUMNS)
