"""Keccak-f[1600] (FIPS 202) written as JAX users write it, and by hand as 25 words (issue 25).

Every function here computes on uint64 lanes: trace and run them under `jax.enable_x64(True)`.

The user form (`round_`): the state is 25 lanes as a `(25,)` array, lane `x + 5*y`;
`reshape(5, 5).T` and an xor-reduce for the column parities, `c[XM1] ^ rotl(c[XP1], 1)` for
theta, `d[X]` broadcasts them over the rows, rho is `rotl(a, ROT)` with a per-lane table of
amounts and a `where(n == 0, ...)` guard, pi is `jnp.take(b, PI_SRC)`, chi is
`b ^ (~b[CHI1] & b[CHI2])`, iota `a.at[0].set(a[0] ^ rc)`. Its 24 rounds as a Python loop
(`keccak_f`), a `fori_loop` reading the round constant from a table at the loop index
(`keccak_fori`), or a `lax.scan` over the table (`keccak_scan`); vmap them over states.

The hand-written form (`hand_f`, `hand_fori`): 25 separate words on a leading batch axis
`(N, 25)`; pi, chi's neighbours and theta's are renaming.

`sha3_256` and `shake128` pad and absorb a message per FIPS 202 with any permutation.
"""
from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from jax import lax

RC = np.array([
    0x0000000000000001, 0x0000000000008082, 0x800000000000808A, 0x8000000080008000,
    0x000000000000808B, 0x0000000080000001, 0x8000000080008081, 0x8000000000008009,
    0x000000000000008A, 0x0000000000000088, 0x0000000080008009, 0x000000008000000A,
    0x000000008000808B, 0x800000000000008B, 0x8000000000008089, 0x8000000000008003,
    0x8000000000008002, 0x8000000000000080, 0x000000000000800A, 0x800000008000000A,
    0x8000000080008081, 0x8000000000008080, 0x0000000080000001, 0x8000000080008008,
], dtype=np.uint64)


def _rho_offsets() -> np.ndarray:
    rot = np.zeros(25, np.uint64)
    x, y = 1, 0
    for t in range(24):
        rot[x + 5 * y] = ((t + 1) * (t + 2) // 2) % 64
        x, y = y, (2 * x + 3 * y) % 5
    return rot


ROT = _rho_offsets()
PI_SRC = np.zeros(25, np.int32)     # pi: B[y, 2x + 3y] = A[x, y], as a source index per lane
for _x in range(5):
    for _y in range(5):
        PI_SRC[_y + 5 * ((2 * _x + 3 * _y) % 5)] = _x + 5 * _y
X = np.arange(25) % 5
Y = np.arange(25) // 5
XM1, XP1 = (X - 1) % 5, (X + 1) % 5
CHI1, CHI2 = (X + 1) % 5 + 5 * Y, (X + 2) % 5 + 5 * Y


# --- as users write it -----------------------------------------------------------------------

def rotl(a, n):
    n = jnp.asarray(n, jnp.uint64)
    return jnp.where(n == 0, a, (a << n) | (a >> (jnp.uint64(64) - n)))


def round_(a, rc):
    c = a.reshape(5, 5).T                      # c[x, y]
    c = jnp.bitwise_xor.reduce(c, axis=1)      # column parities
    d = c[XM1[:5]] ^ rotl(c[XP1[:5]], 1)
    a = a ^ d[X]
    b = rotl(a, ROT)
    b = jnp.take(b, PI_SRC)
    a = b ^ (~b[CHI1] & b[CHI2])
    return a.at[0].set(a[0] ^ rc)


def keccak_f(a, rounds: int = 24):
    for r in range(rounds):
        a = round_(a, RC[r])
    return a


def keccak_fori(a, rounds: int = 24):
    rc = jnp.asarray(RC)
    return lax.fori_loop(0, rounds, lambda r, a: round_(a, rc[r]), a)


def keccak_scan(a, rounds: int = 24):
    a, _ = lax.scan(lambda a, rc: (round_(a, rc), None), a, jnp.asarray(RC[:rounds]))
    return a


# --- by hand: 25 words ---------------------------------------------------------------------

def _rotl_word(x, n: int):
    return x if n == 0 else (x << np.uint64(n)) | (x >> np.uint64(64 - n))


def hand_round(a: list, rc) -> list:
    c = [a[x] ^ a[x + 5] ^ a[x + 10] ^ a[x + 15] ^ a[x + 20] for x in range(5)]
    d = [c[(x - 1) % 5] ^ _rotl_word(c[(x + 1) % 5], 1) for x in range(5)]
    b = [_rotl_word(a[i] ^ d[i % 5], int(ROT[i])) for i in range(25)]
    b = [b[PI_SRC[i]] for i in range(25)]
    a = [b[i] ^ (~b[CHI1[i]] & b[CHI2[i]]) for i in range(25)]
    a[0] = a[0] ^ rc
    return a


def hand_f(s, rounds: int = 24):
    """s: (N, 25) states; 25 words of (N,), straight-line rounds."""
    a = [s[:, i] for i in range(25)]
    for r in range(rounds):
        a = hand_round(a, np.uint64(RC[r]))
    return jnp.stack(a, axis=1)


def hand_fori(s, rounds: int = 24):
    """s: (N, 25) states; 25 words carried through a `fori_loop`."""
    rc = jnp.asarray(RC)
    a = tuple(s[:, i] for i in range(25))
    a = lax.fori_loop(0, rounds, lambda r, a: tuple(hand_round(list(a), rc[r])), a)
    return jnp.stack(a, axis=1)


# --- the sponge (FIPS 202 section 4, 6) --------------------------------------------------------

def _sponge(permute, message: bytes, rate: int, suffix: int, out_len: int) -> bytes:
    """Pad (suffix, pad10*1), absorb `rate`-byte blocks, squeeze `out_len` bytes; `permute`
    maps a (25,) uint64 state (numpy) to the next."""
    padded = bytearray(message) + bytearray([suffix])
    padded += bytes(-len(padded) % rate)
    padded[-1] |= 0x80
    state = np.zeros(25, np.uint64)
    for k in range(0, len(padded), rate):
        block = np.frombuffer(bytes(padded[k:k + rate]) + bytes(200 - rate), dtype="<u8")
        state = np.asarray(permute(state ^ block.astype(np.uint64)))
    out = b""
    while True:
        out += state.astype("<u8").tobytes()[:rate]
        if len(out) >= out_len:
            return out[:out_len]
        state = np.asarray(permute(state))


def sha3_256(permute, message: bytes) -> bytes:
    return _sponge(permute, message, 136, 0x06, 32)


def shake128(permute, message: bytes, out_len: int) -> bytes:
    return _sponge(permute, message, 168, 0x1F, out_len)


# --- as users write it on a leading batch axis (no vmap) -------------------------------------

def rotl_lanes(a, n):
    n = jnp.asarray(n, jnp.uint64)
    return jnp.where(n == 0, a, (a << n) | (a >> (jnp.uint64(64) - n)))


def round_batched(a, rc):
    """a: (N, 25) states."""
    c = jnp.bitwise_xor.reduce(a.reshape(-1, 5, 5), axis=1)      # c[:, x]
    d = c[:, XM1[:5]] ^ rotl_lanes(c[:, XP1[:5]], 1)
    a = a ^ d[:, X]
    b = jnp.take(rotl_lanes(a, ROT), PI_SRC, axis=1)
    a = b ^ (~b[:, CHI1] & b[:, CHI2])
    return a.at[:, 0].set(a[:, 0] ^ rc)


def keccak_batched(a, rounds: int = 24):
    for r in range(rounds):
        a = round_batched(a, RC[r])
    return a
