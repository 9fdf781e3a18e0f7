"""Tiling the batch axis (passes/tile.py): a loop over tiles with the rounds loop inside, bit for
bit jax.jit's results, and the declines (the axis not independent, the state fits the cache, the
GPU). The CPU's cache is set small here (`small_cache`) so programs of a few thousand elements
tile and the tests stay fast. Tiling is the CPU's (other targets decline): every rewrite here asks
for `target="cpu"`, on whatever backend the programs then run."""
import dataclasses
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import jaxrewrite
from jaxrewrite import _walk
from jaxrewrite.backend import cost as _cost
from jaxrewrite.testing import assert_equivalent, primitive_counts

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "bench"))
import permutations as P  # noqa: E402

OPTS = dict(strict=True, debug_checks=True, target="cpu")


@pytest.fixture
def small_cache(monkeypatch):
    """A 16 KiB cache: a tile's trip may hold 4 KiB live."""
    monkeypatch.setitem(_cost.COSTS, "cpu", dataclasses.replace(
        _cost.COSTS["cpu"], tile_cache_bytes=16384, tile_budget=0.25, tile_min=4, tile_cores=1,
        tile_array_carry=True))   # (the rebuild on loops whose carry is not split, too)


@pytest.fixture
def one_core(monkeypatch):
    """The CPU's own cache, one core (the tile is one core's share whatever this machine has)."""
    monkeypatch.setitem(_cost.COSTS, "cpu", dataclasses.replace(_cost.COSTS["cpu"], tile_cores=1))


def _blocks(n):
    return jnp.asarray(np.random.default_rng(n).integers(0, 2**32, (n, 4, 4), dtype=np.uint32))


def _rewrite(fn, *args, **opts):
    return jaxrewrite.rewrite_jaxpr_with_report(jax.make_jaxpr(fn)(*args), **{**OPTS, **opts})


def _tile_loops(cj):
    """The top level's scans (the tile loop is one, the only loop there)."""
    return [e for e in cj.jaxpr.eqns if e.primitive.name == "scan"]


def _tile_events(report, applied=True):
    return [e for e in (report.rewrites if applied else report.declines) if e.pass_name == "tile"]


def _declined(fn, *args, **opts) -> str:
    res = _rewrite(fn, *args, **opts)
    assert not _tile_events(res.report), "tiled where it should have declined"
    reasons = [e.reason for e in _tile_events(res.report, applied=False)]
    assert len(reasons) == 1, reasons
    return reasons[0]


def _rounds(x, rounds=3):
    """A 4-word ARX state in a rolled loop, as a vmapped function sees one element."""
    def body(i, s):
        return jnp.stack(P.quarter(s[0], s[1], s[2], s[3]))
    return lax.fori_loop(0, rounds, body, x) + x


# --- applied: structure and bits ------------------------------------------------------------

def test_chacha_author_form_is_a_loop_over_tiles_with_the_rounds_inside(small_cache):
    f = jax.vmap(P.chacha_loop("fori"))
    x = _blocks(1024)
    cj = assert_equivalent(f, x, bitwise=True, **OPTS)
    res = _rewrite(f, x)
    # 64 B carried a block; its gathers, transposes and stacks hold 384 B more in each trip
    # (the transposes of size-1 dims are reshapes since 0.3.0: 512 B more before)
    assert res.report.stats["tile"] == dict(T=8, B=1024, bytes_per_element=64,
                                            live_bytes_per_element=448)
    (loop,) = _tile_loops(cj)
    assert loop.params["length"] == 1024 // 8
    inner = [e for e in _walk.iter_eqns(loop.params["jaxpr"]) if e.primitive.name == "scan"]
    assert [e.params["length"] for e in inner] == [10]          # the rounds loop, per tile
    # inside the tile loop every value is at tile size, but the buffer a tile is written into
    for e in _walk.iter_eqns(loop.params["jaxpr"]):
        for v in e.outvars if e.primitive.name != "dynamic_update_slice" else ():
            assert 1024 not in getattr(v.aval, "shape", ()), e.primitive.name
    # the top level only slices tiles out and writes them back
    counts = primitive_counts(loop.params["jaxpr"])
    assert counts["dynamic_slice"] == 1 and counts["dynamic_update_slice"] == 1


def test_split_carry_form_exact_and_rfc_vector(small_cache):
    """ChaCha20 at 8,192 blocks: flatten splits the carry into 16 words first (pieces of at least
    4,096), then the split loop is tiled; block 0 is RFC 8439's test vector."""
    f = jax.vmap(P.chacha_loop("fori"))
    x = np.array(_blocks(8192))
    x[0] = P.RFC_STATE
    out = np.asarray(jaxrewrite.optimize(f, **OPTS)(jnp.asarray(x)))
    np.testing.assert_array_equal(out, np.asarray(jax.jit(f)(jnp.asarray(x))))
    np.testing.assert_array_equal(out[0], P.RFC_OUT)
    res = _rewrite(f, jnp.asarray(x))
    assert res.report.stats["tile"] == dict(T=64, B=8192, bytes_per_element=64,
                                            live_bytes_per_element=64)   # nothing but words
    assert primitive_counts(res.jaxpr).get("gather", 0) == 0    # the split form, tiled
    (loop,) = _tile_loops(res.jaxpr)
    (rounds,) = [e for e in _walk.iter_eqns(loop.params["jaxpr"]) if e.primitive.name == "scan"]
    assert rounds.params["num_carry"] == 17                      # the counter and 16 words


def test_explain_shows_the_tile_and_its_estimate(small_cache):
    res = _rewrite(jax.vmap(P.chacha_loop("fori")), _blocks(1024))
    (ev,) = _tile_events(res.report)
    assert ev.after == ("scan",) and "T=8 " in ev.reason and "448 B live" in ev.reason


def test_batch_not_a_multiple_of_the_preferred_tile(small_cache):
    """Tiles of 64 preferred; 1,000 = 8 x 125: the largest power of two dividing it is used;
    1,001: none of at least `tile_min` does."""
    f = jax.vmap(_rounds)
    x = jnp.asarray(np.random.default_rng(0).integers(0, 2**32, (1000, 4), dtype=np.uint32))
    cj = assert_equivalent(f, x, bitwise=True, **OPTS)
    assert _tile_loops(cj)[0].params["length"] == 125
    y = jnp.asarray(np.random.default_rng(0).integers(0, 2**32, (1001, 4), dtype=np.uint32))
    assert "divides the batch of 1001" in _declined(f, y)


def test_iota_along_the_batch_axis_is_made_per_tile(small_cache):
    """A block counter from `jnp.arange`: iota at tile size plus the tile's offset."""
    def f(x):
        return jax.vmap(lambda i, s: _rounds(s + i))(jnp.arange(x.shape[0], dtype=jnp.uint32), x)
    x = jnp.asarray(np.random.default_rng(1).integers(0, 2**32, (1024, 4), dtype=np.uint32))
    cj = assert_equivalent(f, x, bitwise=True, **OPTS)
    assert primitive_counts(cj)["iota"] == 1
    (loop,) = _tile_loops(cj)
    (iota,) = [e for e in _walk.iter_eqns(loop.params["jaxpr"]) if e.primitive.name == "iota"]
    # 32 B live a lane: 128 (the words stacked in the carry's (N, 4) layout by the movement
    # pass, not as (4, N) transposed: 48 B and 64 before)
    assert iota.params["shape"] == (128,)


def test_while_cond_and_uniform_values(small_cache):
    """A `while` whose condition reads only the counter, a `cond` on a value that does not
    depend on the batch, and a batch-sized constant computed once and sliced per tile."""
    table = np.arange(2048, dtype=np.uint32).reshape(512, 4) * 2654435761

    def one(s, k):
        def body(c):
            i, s = c
            s = lax.cond(k > 3, lambda s: s ^ (s << 3), lambda s: s + 1, s)
            return i + 1, jnp.stack(P.quarter(s[0], s[1], s[2], s[3]))
        return lax.while_loop(lambda c: c[0] < k, body, (0, s))[1]

    def f(x, k):
        return jax.vmap(one, in_axes=(0, None))(x + table, k)
    x = jnp.asarray(np.random.default_rng(2).integers(0, 2**32, (512, 4), dtype=np.uint32))
    for k in (2, 5):
        cj = assert_equivalent(f, x, jnp.int32(k), bitwise=True, **OPTS)
        (loop,) = _tile_loops(cj)
        kinds = primitive_counts(loop.params["jaxpr"])
        assert kinds["while"] == 1 and kinds["cond"] == 1


def test_float_program_within_contract_and_its_gradient(small_cache):
    def one(x):
        return lax.scan(lambda c, _: (jnp.tanh(c) * 0.9 + 0.1 * c[::-1], None), x, None,
                        length=5)[0]
    x = jnp.asarray(np.random.default_rng(3).normal(size=(1024, 8)), jnp.float32)
    cj = assert_equivalent(lambda x: jax.vmap(one)(x).sum(1), x, **OPTS)
    assert len(_tile_loops(cj)) == 1


def test_idempotent(small_cache):
    f = jax.vmap(P.chacha_loop("fori"))
    once = _rewrite(f, _blocks(1024)).jaxpr
    twice = jaxrewrite.rewrite_jaxpr_with_report(once, **OPTS)
    assert primitive_counts(twice.jaxpr) == primitive_counts(once)
    assert not _tile_events(twice.report)


# --- declines -------------------------------------------------------------------------------

def test_reduction_along_the_batch_axis_declines(small_cache):
    x = jnp.asarray(np.random.default_rng(4).integers(0, 2**32, (1024, 4), dtype=np.uint32))
    assert "reduce_max along the batch axis" in _declined(
        lambda x: jax.vmap(_rounds)(x).max(axis=0), x)


def test_contraction_along_the_batch_axis_declines(small_cache):
    x = jnp.asarray(np.random.default_rng(5).normal(size=(1024, 4)), jnp.float32)

    def f(x):
        y = jax.vmap(lambda v: lax.fori_loop(0, 3, lambda i, v: jnp.sin(v[::-1]), v))(x)
        return jnp.einsum("bi,bj->ij", y, x)
    assert "dot_general contracts the batch axis" in _declined(f, x)


def test_state_that_fits_the_cache_declines(one_core):
    """The CPU's own cache (1 MiB per core): 1,024 ChaCha20 blocks carry 64 KiB, a trip reads
    and writes 128 KiB."""
    reason = _declined(jax.vmap(P.chacha_loop("fori")), _blocks(1024))
    assert "128 KiB, within the cache of its 1 core(s) (1024 KiB each)" in reason


@pytest.mark.parametrize("cores", [1, 2, 4, 16])
def test_the_tile_is_one_cores_share_times_the_cores(monkeypatch, cores):
    """XLA:CPU splits a fusion over the cores only where it is long enough: a tile of one
    core's share would run on one core while the untiled program uses them all. So the tile is
    the share (4,096 ChaCha20 blocks in 256 KiB) times the cores, and where each core's share of
    a trip already fits its cache (16 cores: 512 KiB each), no tiles."""
    monkeypatch.setitem(_cost.COSTS, "cpu", dataclasses.replace(_cost.COSTS["cpu"],
                                                                tile_cores=cores))
    f, x = jax.vmap(P.chacha_loop("fori")), _blocks(65536)
    res = _rewrite(f, x)
    if cores < 16:
        assert res.report.stats["tile"]["T"] == 4096 * cores
        (loop,) = _tile_loops(res.jaxpr)
        assert loop.params["length"] == 65536 // (4096 * cores)
    else:
        assert "tile" not in res.report.stats
        reason = next(d.reason for d in res.report.declines if d.pass_name == "tile")
        assert "within the cache of its 16 core(s)" in reason, reason


def test_gpu_target_declines(small_cache):
    """(A loop of a trip count known only at run time: the GPU's passes keep it a loop.)"""
    def one(s, k):
        return lax.fori_loop(0, k, lambda i, s: jnp.stack(P.quarter(s[0], s[1], s[2], s[3])), s)
    x = jnp.asarray(np.random.default_rng(6).integers(0, 2**32, (1024, 4), dtype=np.uint32))
    f = jax.vmap(one, in_axes=(0, None))
    assert _rewrite(f, x, jnp.int32(3)).report.stats["tile"]["T"] == 128  # the CPU tiles it
    reason = _declined(f, x, jnp.int32(3), target="gpu")
    assert "target gpu" in reason


def test_off_leaves_the_program_alone(small_cache):
    f = jax.vmap(P.chacha_loop("fori"))
    res = _rewrite(f, _blocks(1024), tile=False)
    assert not _tile_events(res.report) and not _tile_events(res.report, applied=False)
    assert not _tile_loops(res.jaxpr)
    with pytest.raises(ValueError, match="tile"):
        jaxrewrite.optimize(f, tile="yes")


def test_blake2s_broadcast_initial_state_and_message_schedule(small_cache):
    """BLAKE2s as the ChaCha20 author would write it (bench/limit.py): the initial state is one
    constant broadcast over the batch (sliced per tile), each round reads its message words
    at the loop index (a gather on the word axis); the digest of block 0 is hashlib's."""
    import hashlib
    import limit as L
    msgs = np.random.default_rng(7).integers(0, 2**32, (1024, 16), dtype=np.uint32)
    f = jax.vmap(L.blake2s_block)
    cj = assert_equivalent(f, jnp.asarray(msgs), bitwise=True, **OPTS)
    (loop,) = _tile_loops(cj)
    assert loop.params["length"] == 1024 // 8                   # 512 B live a block
    out = np.asarray(jaxrewrite.optimize(f, **OPTS)(jnp.asarray(msgs)))
    assert out[0].astype("<u4").tobytes() == hashlib.blake2s(
        msgs[0].astype("<u4").tobytes()).digest()


def _words_loop(movement: bool):
    """16 words carried apart in a `fori_loop` of 8 trips (64 B a block). `movement`: each trip
    stacks them into a vector and permutes it 4 times (gathers and concatenates, as BLAKE2s in
    the author's form does with its carry split and its body not); else words only."""
    perm = np.random.default_rng(0).permutation(16)

    def body(i, ws):
        if not movement:
            return tuple(ws[(j + 3) % 16] ^ (ws[j] << np.uint32(1)) for j in range(16))
        s = jnp.stack(ws)
        for _ in range(4):
            s = jnp.stack([s[j] for j in range(16)])[perm] ^ (s << np.uint32(1))
        return tuple(s[j] for j in range(16))

    return jax.vmap(lambda x: jnp.stack(lax.fori_loop(0, 8, body,
                                                      tuple(x[j] for j in range(16)))))


def test_data_movement_in_the_body_counts_as_live_state(one_core):
    """The CPU's own costs, 65,536 blocks, 64 B carried a block as 16 words: a body whose
    gathers and stacks hold 832 B more in each trip gets a tile that fits them, smaller than
    the smallest worth a loop (declined; BLAKE2s in the author's form, its carry split and its
    body not, measured tiles of 4,096 1.04-1.16x slower), where a body of words alone is tiled
    by its carry. (gathers and scalarize off: the body's movement stays as written.)"""
    x = jnp.zeros((65536, 16), jnp.uint32)
    off = dict(scalarize=False, gathers=False)
    reason = _declined(_words_loop(True), x, **off)
    live = int(reason.split(" B live per batch element")[0])
    assert live >= 640 and "fewer than 512" in reason, reason
    res = _rewrite(_words_loop(False), x, **off)
    assert res.report.stats["tile"]["live_bytes_per_element"] == 64
    assert _tile_events(res.report)
    assert_equivalent(_words_loop(True), x[:1024], bitwise=True, **OPTS, **off)


def test_blake2s_split_carry_is_tiled_with_the_cpus_costs(one_core):
    """The same program with the defaults: its broadcast initial state (a literal after fold)
    is carried as 16 words, so a trip holds 192 B a block and tiles of 1,024 fit. Measured at
    65,536 blocks: 0.16-0.34x jax.jit, without tiles 0.29-0.34x (tiles win on one core, not
    where XLA splits the untiled loop's fusions over two idle cores). Bit for bit jax.jit's,
    block 0 hashlib's digest."""
    import hashlib
    import limit as L
    msgs = np.random.default_rng(11).integers(0, 2**32, (65536, 16), dtype=np.uint32)
    f = jax.vmap(L.blake2s_block)
    cj = assert_equivalent(f, jnp.asarray(msgs), bitwise=True, **OPTS)
    res = _rewrite(f, jnp.asarray(msgs))
    assert res.report.stats["tile"] == dict(T=1024, B=65536, bytes_per_element=64,
                                            live_bytes_per_element=192)
    (loop,) = _tile_loops(cj)
    assert loop.params["length"] == 65536 // 1024
    (rounds,) = [e for e in _walk.iter_eqns(loop.params["jaxpr"]) if e.primitive.name == "scan"]
    nc, nk = rounds.params["num_consts"], rounds.params["num_carry"]
    assert rounds.params["length"] == 10
    assert [tuple(v.aval.shape) for v in rounds.invars[nc:nc + nk]] == [()] + [(1024,)] * 16
    out = np.asarray(jaxrewrite.optimize(f, **OPTS)(jnp.asarray(msgs[:4096])))
    assert out[0].astype("<u4").tobytes() == hashlib.blake2s(
        msgs[0].astype("<u4").tobytes()).digest()


def test_constants_of_the_program_are_read_per_tile(small_cache):
    """A batch-sized constant the program closes over (kept a constant: fold_limit=0) is sliced
    per tile; a small one is read whole."""
    big = jnp.asarray(np.random.default_rng(8).integers(0, 2**32, (1024, 4), dtype=np.uint32))
    small = jnp.asarray(np.arange(4, dtype=np.uint32) * 77)

    def f(x):
        return jax.vmap(_rounds)(x ^ big) + small
    x = jnp.asarray(np.random.default_rng(9).integers(0, 2**32, (1024, 4), dtype=np.uint32))
    assert jax.make_jaxpr(f)(x).jaxpr.constvars
    cj = assert_equivalent(f, x, bitwise=True, fold_limit=0, **OPTS)
    assert len(_tile_loops(cj)) == 1


def test_an_unsplit_carry_is_not_tiled_with_the_cpus_costs(one_core):
    """A loop that carries its state as one (B, 4, 4) array (its permutation fused into the
    rolled loop, so not split) ran 1.3-8.8x jax.jit tiled: the CPU declines it, saying why."""
    from jaxrewrite.strategies import ArxRecipe
    r = ArxRecipe(shape=(4, 4), dtype="uint32", rounds=4, batch=65536, seed=0, message=False,
                  fanout=1, quarter=False, undo=False, out="state", wrap="fori")
    res = _rewrite(r.fn, *r.args)
    assert "tile" not in res.report.stats
    reason = next(d.reason for d in res.report.declines if d.pass_name == "tile")
    assert "(65536, 4, 4) arrays, not words" in reason, reason
