"""Keccak-f[1600] (SHA-3) as users write it, split by scalar replacement on both targets (issue 25).

The state is 25 uint64 lanes; the rounds reshape it to (5, 5) for the column parities, broadcast
them back over the rows, rotate by a per-lane table with a `where(n == 0, ...)` guard, permute with
`jnp.take`, and update lane 0 (bench/keccak.py). Checked bit for bit against `hashlib` (SHA3-256,
SHAKE128) under `vmap` and on a leading batch axis; structurally: no gather or scatter left where
the state is split, the `fori_loop` form kept rolled on the CPU with its carry split into 25 lanes.
Every test runs with x64 enabled inside it only.
"""
import hashlib
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxrewrite
from jaxrewrite.testing import primitive_counts

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "bench"))
import keccak as K  # noqa: E402

# CPU: pieces of at least 4,096 elements are split (backend.cost min_piece_elements)
N = 4096
MOVERS = ("gather", "scatter", "scatter-add", "dynamic_update_slice", "concatenate")


@pytest.fixture(autouse=True)
def x64():
    with jax.enable_x64(True):
        yield


def _states(n, seed=0):
    return np.random.default_rng(seed).integers(0, 2 ** 64, (n, 25), dtype=np.uint64)


def _messages(n, length, seed=1):
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 256, length, dtype=np.uint8).tobytes() for _ in range(n)]


def _batched_sponge(permute, messages, rate, suffix, out_len):
    """FIPS 202's sponge over equal-length messages at once: `permute` maps (n, 25) states."""
    blocks = []
    for m in messages:
        p = bytearray(m) + bytearray([suffix])
        p += bytes(-len(p) % rate)
        p[-1] |= 0x80
        blocks.append(np.frombuffer(bytes(p), dtype="<u8").reshape(-1, rate // 8))
    blocks = np.stack(blocks).astype(np.uint64)            # (n, blocks, rate / 8)
    state = np.zeros((len(messages), 25), np.uint64)
    for k in range(blocks.shape[1]):
        state[:, :rate // 8] ^= blocks[:, k]
        state = np.array(permute(state))
    digests = [state[i].astype("<u8").tobytes()[:rate] for i in range(len(messages))]
    while len(digests[0]) < out_len:
        state = np.asarray(permute(state))
        digests = [d + state[i].astype("<u8").tobytes()[:rate] for i, d in enumerate(digests)]
    return [d[:out_len] for d in digests]


def _counts(fn, *args, target="cpu", **opts):
    return primitive_counts(jaxrewrite.make_jaxpr(fn, target=target, **opts)(*args))


def test_spec_single_state_against_hashlib():
    """The user form on one (25,) state, every loop form, through optimize: SHA3-256 and
    SHAKE128 of messages across the rate boundary equal hashlib's."""
    for form in (K.keccak_f, K.keccak_fori, K.keccak_scan):
        f = jaxrewrite.optimize(form)
        for m in (b"", b"abc", bytes(range(200))):
            assert K.sha3_256(f, m) == hashlib.sha3_256(m).digest(), (form.__name__, m)
        assert K.shake128(f, b"jaxrewrite", 200) == hashlib.shake_128(b"jaxrewrite").digest(200)


@pytest.mark.parametrize("form", ["fori", "scan"])
def test_vmapped_loop_forms_against_hashlib(form):
    """4,096 messages at once under vmap (SHA3-256 of 2 blocks, SHAKE128 squeezing twice), the
    24 rounds in a fori_loop or scan: bit for bit with hashlib; on the CPU the loop stays rolled
    with its carry split into 25 lanes and no gather or scatter left."""
    fn = jax.vmap(K.keccak_fori if form == "fori" else K.keccak_scan)
    f = jaxrewrite.optimize(fn)
    msgs = _messages(N, 150)
    got = _batched_sponge(f, msgs, 136, 0x06, 32)
    assert got == [hashlib.sha3_256(m).digest() for m in msgs]
    msgs = _messages(N, 20, seed=2)
    got = _batched_sponge(f, msgs, 168, 0x1F, 200)
    assert got == [hashlib.shake_128(m).digest(200) for m in msgs]
    c = _counts(fn, _states(N))
    assert c.get("scan") == 1 and c.get("while", 0) == 0          # rolled
    assert not any(c.get(p, 0) for p in MOVERS), c
    assert c.get("stack", 0) == 1                                  # the result, once


def _rolled_split(fn, n):
    """The CPU rewrite of `fn` on n states: (the rolled scan, the flatten record)."""
    from jaxrewrite import _walk
    res = jaxrewrite.rewrite_jaxpr_with_report(jax.make_jaxpr(fn)(_states(n)), target="cpu")
    (scan,) = [e for e in _walk.iter_eqns(res.jaxpr) if e.primitive.name == "scan"]
    (ev,) = [e for e in res.report.rewrites if e.pass_name == "flatten"]
    return scan, ev.after[0]


@pytest.mark.parametrize("form", ["fori", "scan"])
def test_cpu_carry_carried_as_its_lanes(form):
    """4,096 states (800 KB, in cache) and 16,384 (3.2 MB): the rolled loop carries the 25
    lanes apart, (N,) each, no stack in its body (a carry kept as one array, cut and stacked
    every trip, ran 1.26-1.40x slower since split loops are compiled with region-based copy
    insertion) and no gather, scatter or reduction. Bit for bit with jax.jit."""
    fn = jax.vmap(K.keccak_fori if form == "fori" else K.keccak_scan)
    for n in (N, 4 * N):
        scan, why = _rolled_split(fn, n)
        nc, nk = scan.params["num_consts"], scan.params["num_carry"]
        carried = [tuple(v.aval.shape) for v in scan.invars[nc:nc + nk]]
        body = primitive_counts(scan.params["jaxpr"])
        assert len([c for c in carried if c == (n,)]) == 25 and (n, 25) not in carried, carried
        assert why.startswith("rolled, carry split: 1 carried value(s) as 25 pieces;"), why
        assert body.get("stack", 0) == 0, body
        assert not any(body.get(p, 0) for p in MOVERS + ("reduce_xor",)), body
        a = _states(n, seed=5)
        np.testing.assert_array_equal(np.asarray(jaxrewrite.optimize(fn)(a)),
                                      np.asarray(jax.jit(fn)(a)))


def test_cpu_python_loop_rolled_by_reroll_then_split():
    """reroll=True on the 24 rounds of the Python loop, which differ only in their round
    constant (a scalar literal): outlined as 24 calls of one skeleton, rolled into one scan with
    the 24 constants as its xs; flatten then carries the state as its 25 lanes and scalarize
    splits the body, as for the `fori_loop` form: no gather, scatter or xor-reduce left. Bit for bit with
    jax.jit, and SHA3-256 with hashlib."""
    from jaxrewrite import _compat as C
    from jaxrewrite import _walk
    fn = jax.vmap(K.keccak_f)
    res = jaxrewrite.rewrite_jaxpr_with_report(jax.make_jaxpr(fn)(_states(N)), target="cpu",
                                               reroll=True)
    (scan,) = [e for e in _walk.iter_eqns(res.jaxpr) if e.primitive.name == "scan"]
    nc, nk = scan.params["num_consts"], scan.params["num_carry"]
    (xs,) = scan.invars[nc + nk:]
    assert scan.params["length"] == 24 and C.is_literal(xs)
    np.testing.assert_array_equal(np.asarray(C.literal_value(xs)), K.RC)
    body = primitive_counts(scan.params["jaxpr"])
    assert not any(body.get(p, 0) for p in MOVERS + ("reduce_xor",)), body
    assert any(e.pass_name == "flatten" and "as 25 pieces" in e.after[0]
               for e in res.report.rewrites)
    f = jaxrewrite.optimize(fn, reroll=True)
    a = _states(N, seed=6)
    np.testing.assert_array_equal(np.asarray(f(a)), np.asarray(jax.jit(fn)(a)))
    msgs = _messages(N, 150, seed=7)
    assert (_batched_sponge(f, msgs, 136, 0x06, 32)
            == [hashlib.sha3_256(m).digest() for m in msgs])


def test_straight_line_split_cpu():
    """A round straight-line under vmap: computed on 25 pieces (no gather, no scatter, one
    re-join of the result), bit for bit with jax.jit. (More rounds straight-line are declined
    on the CPU by the fused-code estimate: XLA:CPU compiles each re-joined lane's whole cone;
    the hand-written 25-word form of 24 rounds took minutes to compile there.)"""
    fn = jax.vmap(lambda a: K.keccak_f(a, rounds=1))
    a = _states(N)
    np.testing.assert_array_equal(np.asarray(jaxrewrite.optimize(fn)(a)),
                                  np.asarray(jax.jit(fn)(a)))
    c = _counts(fn, a)
    assert not any(c.get(p, 0) for p in MOVERS), c
    assert c.get("stack", 0) == 1 and c.get("reduce_xor", 0) == 0


def test_leading_batch_axis_against_hashlib():
    """The same rounds written on an (N, 25) array without vmap: bit for bit with hashlib."""
    f = jaxrewrite.optimize(K.keccak_batched)
    msgs = _messages(N, 100, seed=3)
    got = _batched_sponge(f, msgs, 136, 0x06, 32)
    assert got == [hashlib.sha3_256(m).digest() for m in msgs]


def test_leading_batch_axis_split_cpu():
    fn = lambda a: K.keccak_batched(a, rounds=1)  # noqa: E731
    a = _states(N)
    np.testing.assert_array_equal(np.asarray(jaxrewrite.optimize(fn)(a)),
                                  np.asarray(jax.jit(fn)(a)))
    c = _counts(fn, a)
    assert not any(c.get(p, 0) for p in MOVERS), c


@pytest.mark.parametrize("form", ["python", "fori", "scan"])
def test_gpu_target_unrolled_on_pieces(form):
    """target='gpu' (rewrite only, no compile): every loop form unrolled and computed on 25
    pieces: no loop, gather, scatter or reduction left, one re-join of the result."""
    fn = jax.vmap({"python": K.keccak_f, "fori": K.keccak_fori, "scan": K.keccak_scan}[form])
    c = _counts(fn, _states(N), target="gpu")
    assert not any(c.get(p, 0) for p in MOVERS + ("scan", "while", "reduce_xor")), c
    assert c.get("stack", 0) == 1


def test_pieces_rules_unit():
    """The rules the split needs, each alone: an xor-reduce along a split axis, an operand
    broadcast along its size-1 dims (a per-lane table under vmap), a `where` call inlined."""
    def f(a):                                   # a: (N, 5, 5)
        c = jnp.bitwise_xor.reduce(a, axis=2)                      # reduce over a split axis
        s = a.reshape(-1, 25)[:, K.PI_SRC]                         # the seed permutation
        r = s << jnp.asarray(K.ROT)[None, :]                       # (1, 25) table
        r = jnp.where(jnp.asarray(K.ROT) == 0, s, r)                # a `_where` call
        return r.reshape(-1, 5, 5) ^ c[:, :, None]
    a = _states(N).reshape(N, 5, 5)
    # (scalarize=True, the GPU's row: one permutation for one re-join, 6 equations a piece,
    # which "auto" declines)
    opts = dict(target="gpu", scalarize=True)
    np.testing.assert_array_equal(np.asarray(jaxrewrite.optimize(f, **opts)(a)),
                                  np.asarray(jax.jit(f)(a)))
    c = _counts(f, a, **opts)
    assert not any(c.get(p, 0) for p in MOVERS + ("reduce_xor", "jit")), c


@pytest.mark.parametrize("target", ["cpu", "gpu"])
def test_vmapped_update_of_many_states_is_split(target):
    """65,536 states x 25 lanes is above fold_limit, but the update's map leaves the vmapped
    batch out (25 entries): iota's `.at[0].set` is renaming there too, not a re-join and an
    update every round (CPU, fori_loop, 65,536 states: 1.5-1.85x the hand-written form's run
    time before). (4 rounds: on the CPU, 3 do too little work per lane to split the loop's
    carry, `backend.cost.LoopCosts.min_split_work`.)"""
    fn = jax.vmap(lambda a: K.keccak_fori(a, rounds=4))
    c = _counts(fn, jax.ShapeDtypeStruct((65536, 25), np.uint64), target=target)
    assert not any(c.get(p, 0) for p in MOVERS), c
    assert c.get("stack", 0) == 1
