"""A Python loop of identical rounds becomes the loop it is (passes/rounds.py, `reroll="auto"`).

On the CPU, by default, rounds written as a Python loop are rolled into one `lax.scan` where
flatten then carries that loop split, as it does for the same rounds in a `fori_loop`: ChaCha20
as its author wrote it (a jitted double round called 10 times), its `jnp.take` form (inline
code), Keccak-f[1600] (24 rounds differing in their round constant). Everything else stays as
written: float rounds, a network's layers, the GPU (where flatten unrolls loops anyway),
`reroll=False`. Bit for bit with jax.jit; structure by primitive counts and the scan's operands.
"""
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxrewrite
from jaxrewrite import _compat as C
from jaxrewrite import _walk
from jaxrewrite.testing import primitive_counts

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bench"))
import keccak as K  # noqa: E402
import permutations as P  # noqa: E402

N = 4096   # CPU: pieces of at least 4,096 elements are split (backend.cost min_piece_elements)
MOVERS = ("gather", "scatter", "concatenate", "dynamic_update_slice")


def _rewrite(fn, *args, **opts):
    res = jaxrewrite.rewrite_jaxpr_with_report(jax.make_jaxpr(fn)(*args), **opts)
    scans = [e for e in _walk.iter_eqns(res.jaxpr) if e.primitive.name == "scan"]
    return res, scans


def _carried(scan):
    nc, nk = scan.params["num_consts"], scan.params["num_carry"]
    return [tuple(v.aval.shape) for v in scan.invars[nc:nc + nk]]


@pytest.mark.parametrize("form", ["python", "take"])
def test_chacha_rounds_rolled_and_carried_as_words(form):
    """10 double rounds as a Python loop: one scan of 10 trips carrying the 16 words apart, no
    gather or concatenate left, compiled with region-based copy insertion; bit for bit with
    jax.jit, block 0 the RFC 8439 2.3.2 vector. With `reroll=False` the rounds stay unrolled."""
    fn = jax.vmap(P.chacha_loop("python") if form == "python" else P.chacha_take)
    x = P._blocks(N)
    res, scans = _rewrite(fn, x, target="cpu")
    (scan,) = scans
    assert scan.params["length"] == 10
    assert _carried(scan).count((N,)) == 16, _carried(scan)
    counts = primitive_counts(res.jaxpr)
    assert not any(counts.get(p, 0) for p in MOVERS), counts
    assert res.report.counts["reroll.chains"] == 1
    assert res.report.counts["flatten.carries_split"] == 1
    assert res.compile_options == {"xla_cpu_copy_insertion_use_region_analysis": True}
    got = np.asarray(jaxrewrite.optimize(fn)(x))
    np.testing.assert_array_equal(got, np.asarray(jax.jit(fn)(x)))
    np.testing.assert_array_equal(got[0], P.RFC_OUT)
    off, scans = _rewrite(fn, x, target="cpu", reroll=False)
    assert not scans and not off.report.counts.get("reroll.chains")


def test_keccak_rounds_rolled_with_their_round_constants():
    """24 rounds that differ in a scalar literal (the round constant): one scan of 24 trips, the
    constants its xs (a literal), the 25 lanes carried apart; SHA3-256 of 4,096 messages equal
    to hashlib's."""
    import hashlib
    with jax.enable_x64(True):
        fn = jax.vmap(K.keccak_f)
        a = np.random.default_rng(0).integers(0, 2 ** 64, (N, 25), dtype=np.uint64)
        res, scans = _rewrite(fn, a, target="cpu")
        (scan,) = scans
        nc, nk = scan.params["num_consts"], scan.params["num_carry"]
        (xs,) = scan.invars[nc + nk:]
        assert scan.params["length"] == 24 and C.is_literal(xs)
        np.testing.assert_array_equal(np.asarray(C.literal_value(xs)), K.RC)
        assert _carried(scan).count((N,)) == 25
        body = primitive_counts(scan.params["jaxpr"])
        assert not any(body.get(p, 0) for p in MOVERS + ("reduce_xor",)), body
        f = jaxrewrite.optimize(fn)
        np.testing.assert_array_equal(np.asarray(f(a)), np.asarray(jax.jit(fn)(a)))
        msgs = [bytes(np.random.default_rng(i).integers(0, 256, 40, dtype=np.uint8))
                for i in range(N)]
        state = np.zeros((N, 25), np.uint64)
        for i, m in enumerate(msgs):
            p = bytearray(m) + b"\x06" + bytes(136 - len(m) - 1)
            p[-1] |= 0x80
            state[i, :17] = np.frombuffer(bytes(p), dtype="<u8")
        out = np.asarray(f(state))
        assert [out[i].astype("<u8").tobytes()[:32] for i in range(N)] == \
            [hashlib.sha3_256(m).digest() for m in msgs]


def test_rounds_left_as_written():
    """Not rolled by default, nothing declined in the report: float rounds (flatten splits only
    exact bodies), rounds whose carry has no small permuted axis (a network's layers), and every
    loop on the GPU (tests/test_reroll.py: what `reroll=True` rolls)."""
    perm = np.array([1, 2, 3, 0])

    def floats(x):
        for _ in range(4):
            x = jnp.sin(x[:, perm]) * 0.5
        return x

    def layers(w, x):
        for _ in range(4):
            x = jax.jit(lambda w, x: jnp.tanh(x @ w))(w, x)
        return x

    def words(x):
        for _ in range(6):
            x = (x[:, perm] ^ (x >> jnp.uint32(3))) + x
        return x

    xf = jnp.ones((N, 4), jnp.float32)
    w = jnp.ones((4, 4), jnp.float32)
    xu = jnp.asarray(np.random.default_rng(1).integers(0, 2 ** 32, (N, 4), dtype=np.uint32))
    for fn, args in ((floats, (xf,)), (layers, (w, xf))):
        res, scans = _rewrite(fn, *args, target="cpu")
        assert not scans
        assert not [d for d in res.report.declines if d.pass_name == "reroll"]
    # the GPU: flatten unrolls where launches decide; nothing is rolled first
    res, scans = _rewrite(words, xu, target="gpu")
    assert not scans and not res.report.counts.get("reroll.chains")
    # the same integer rounds on the CPU: rolled and carried as 4 words
    res, scans = _rewrite(words, xu, target="cpu")
    (scan,) = scans
    assert _carried(scan).count((N,)) == 4
    np.testing.assert_array_equal(np.asarray(jaxrewrite.optimize(words)(xu)),
                                  np.asarray(jax.jit(words)(xu)))
