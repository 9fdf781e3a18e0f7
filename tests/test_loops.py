"""Flattening calls and static loops (passes/flatten.py) so permutations become renaming.

The ChaCha20 block function as its author wrote it (a reconstruction from issue 12, kept in
bench/permutations.py as `chacha_loop` so the benchmark measures the same program): a jitted
quarter-round on a 4-vector, vmapped over the columns of the 4x4 state; a jitted double round
that moves diagonals into columns with `state.ravel()[diag_map]` (`diag_map` a `jnp.array`
literal) and back; a jitted block that runs 10 double rounds in `lax.fori_loop` (or `lax.scan`,
or a Python loop) and adds the input. Checked bit for bit against `jax.jit` and the RFC 8439
section 2.3.2 test vector; structure by primitive counts.
"""
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import jaxrewrite
from jaxrewrite.backend import cost as _cost
from jaxrewrite.testing import assert_equivalent, primitive_counts

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "bench"))
import permutations as P  # noqa: E402
from seed import COLFNS, PERMS  # noqa: E402


def block(kind, rounds=10):
    """The block function (bench/permutations.py `chacha_loop`: jitted `_quarterround` vmapped
    over columns, jitted `_double_round` with `jnp.array` index maps), its double rounds in
    `lax.fori_loop`, `lax.scan` or a Python loop."""
    return P.chacha_loop(kind, rounds)


_double_round = P._double_round
block_fori = block("fori")
KEYS = np.random.default_rng(0).integers(0, 2**32, (8, 4, 4), dtype=np.uint32)
KEYS[0] = P.RFC_STATE
KEYS = jnp.asarray(KEYS)


def _counts(fn, *args, **options):
    return primitive_counts(jaxrewrite.rewrite_jaxpr(jax.make_jaxpr(fn)(*args), **options))


def test_chacha_block_rfc_vector_and_bit_exact():
    """The fori_loop form, 10 double rounds: RFC 8439 2.3.2 and jax.jit, bit for bit."""
    f = jax.vmap(block_fori)
    out = np.asarray(jaxrewrite.optimize(f, target="gpu")(KEYS))
    np.testing.assert_array_equal(out[0], P.RFC_OUT)
    np.testing.assert_array_equal(out, np.asarray(jax.jit(f)(KEYS)))


@pytest.mark.parametrize("kind", ["fori", "scan", "python"])
def test_chacha_block_becomes_16_words(kind):
    f = jax.vmap(block(kind))
    counts = _counts(f, KEYS, target="gpu", debug_checks=True)
    # no loop, no gather left: the diagonal steps are renaming of 16 words; at most the block
    # function's own call stays (split inside it)
    for prim in ("gather", "scan", "while", "concatenate", "transpose"):
        assert prim not in counts, (prim, counts)
    assert counts.get("jit", 0) <= 1
    assert counts.get("stack", 0) == 1            # the one re-join: the output
    assert counts["add"] == 10 * 2 * 16 + 16       # 4 adds x 4 columns x 2 half rounds x 10, + x
    # bit for bit at 2 double rounds (10 are checked above; each compile of 10 takes ~30 s)
    f2 = jax.vmap(block(kind, rounds=2))
    np.testing.assert_array_equal(np.asarray(jaxrewrite.optimize(f2, target="gpu")(KEYS)),
                                  np.asarray(jax.jit(f2)(KEYS)))


def test_cpu_small_batch_stays_rolled_with_reason():
    """8 blocks on the CPU: scalarize would not split pieces of 8 words, so nothing is unrolled
    (compile time for nothing) and the decline says why."""
    res = jaxrewrite.rewrite_jaxpr_with_report(jax.make_jaxpr(jax.vmap(block_fori))(KEYS),
                                               target="cpu")
    counts = primitive_counts(res.jaxpr)
    assert counts["scan"] == 1 and counts["gather"] == 2
    reasons = [e.reason for e in res.report.declines if e.pass_name == "flatten"]
    assert reasons and all("would not be split" in r for r in reasons)


def test_flatten_off_keeps_loop_and_calls():
    """flatten=False keeps the loop and the double round's call; scalarize still inlines the
    small calls that hold static moves (`_quarterround`'s column stack) and splits inside."""
    counts = _counts(jax.vmap(block_fori), KEYS, target="gpu", flatten=False)
    assert counts["scan"] == 1 and counts["jit"] >= 1
    assert counts.get("gather", 0) == 0 and counts.get("concatenate", 0) == 0


def test_idempotent():
    once = jaxrewrite.rewrite_jaxpr(jax.make_jaxpr(jax.vmap(block_fori))(KEYS), target="gpu")
    twice = jaxrewrite.rewrite_jaxpr(once, target="gpu")
    assert primitive_counts(once) == primitive_counts(twice)


def test_jnp_array_constants_fold_like_numpy():
    """`jnp.array([...])` inside a jitted function is a constant like a numpy one: the gather's
    indices are known, and both spellings rewrite to the same structure."""
    np_map = np.array([0, 1, 2, 3, 5, 6, 7, 4, 10, 11, 8, 9, 15, 12, 13, 14])

    def with_np(s):
        return jax.jit(lambda s: s.ravel()[np_map].reshape(4, 4))(s)

    def with_jnp(s):
        return jax.jit(lambda s: s.ravel()[jnp.array(np_map.tolist())].reshape(4, 4))(s)

    # gathers="all": the gather is rewritten (a concatenate form), so fold's work is kept
    a = _counts(jax.vmap(with_np), KEYS, target="gpu", gathers="all")
    b = _counts(jax.vmap(with_jnp), KEYS, target="gpu", gathers="all")
    assert a == b
    np.testing.assert_array_equal(jaxrewrite.optimize(jax.vmap(with_jnp), target="gpu")(KEYS),
                                  jax.jit(jax.vmap(with_jnp))(KEYS))


# --- the seed program's inner function in a loop --------------------------------------------------

def seed_loop(perm, kind):
    """The seed program's inner function (bench/seed.py) in fori_loop(0, 7) or a scan of 7."""
    return P.rounds_loop(COLFNS["mix"], PERMS[perm], kind)


def _scans(cj):
    from jaxrewrite import _walk
    return [e for e in _walk.iter_eqns(cj) if e.primitive.name == "scan"]


def _carried_pieces(scan, shape):
    """How many of the scan's carried values have `shape` (a split carry: one per piece)."""
    nc, nk = scan.params["num_consts"], scan.params["num_carry"]
    return sum(1 for v in scan.invars[nc:nc + nk] if tuple(v.aval.shape) == shape)


@pytest.mark.parametrize("perm", ["gather", "take", "ravel"])
@pytest.mark.parametrize("kind", ["fori", "scan"])
@pytest.mark.parametrize("target", ["cpu", "gpu"])
def test_seed_inner_fn_in_loop(perm, kind, target):
    """GPU: unrolled (launches decide). CPU: one permutation per trip, which XLA fuses into its
    consumer in the rolled loop: kept as it is, with the reason (a split carry ran 1.2-2.2x
    slower: `backend.cost.LoopCosts.min_body_permutations`)."""
    ms = jnp.asarray(np.random.default_rng(2).integers(0, 2**32, (4096, 4, 4), np.uint32))
    f = seed_loop(perm, kind)
    cj = assert_equivalent(f, ms, vmap=False, target=target)   # default options, bit for bit
    counts = primitive_counts(cj)
    if target == "gpu":
        for prim in ("gather", "while", "jit", "scan"):
            assert prim not in counts, (prim, counts)
        assert counts["mul"] == 7 * 3 * 4        # split: 4 words x 3 muls x 7 trips
    else:
        assert counts["scan"] == 1 and counts.get("gather", 0) <= 1
        res = jaxrewrite.rewrite_jaxpr_with_report(jax.make_jaxpr(f)(ms), target="cpu")
        assert any(e.pass_name == "flatten" and "permutation(s) per trip" in e.reason
                   for e in res.report.declines)
    if target == "cpu":
        # with no permutation at all there is nothing to make renaming: loop and call stay
        none = primitive_counts(jaxrewrite.rewrite_jaxpr(
            jax.make_jaxpr(seed_loop("none", kind))(ms), target=target))
        assert none["scan"] == 1 and none["jit"] == 1


def test_cpu_chacha_fori_carry_split_compiles_the_body_once():
    """ChaCha20's fori_loop on the CPU: not unrolled (10x the compile for no launch saved) but
    rolled with its state carried as 16 words (not as one array: its body is too deep); the
    jitted quarter-rounds inlined, the diagonal permutations renaming; the estimate in the
    report; bit for bit at 4,096 blocks, block 0 the RFC 8439 2.3.2 vector."""
    keys = P._blocks(4096)
    f = jax.vmap(block_fori)
    res = jaxrewrite.rewrite_jaxpr_with_report(jax.make_jaxpr(f)(keys), target="cpu")
    counts = primitive_counts(res.jaxpr)
    for prim in ("gather", "concatenate", "while"):
        assert prim not in counts, (prim, counts)
    (scan,) = _scans(res.jaxpr)
    assert scan.params["length"] == 10 and _carried_pieces(scan, (4096,)) == 16
    assert counts["add"] == 2 * 16 + 2           # one double round on words, + x, + the counter
    (ev,) = [e for e in res.report.rewrites if e.pass_name == "flatten" and e.before == ("scan",)]
    assert "carry split" in ev.after[0] and "compiled once" in ev.after[0]
    assert "1 carried value(s) as 16 pieces;" in ev.after[0], ev.after[0]
    got = np.asarray(jaxrewrite.optimize(f)(keys))
    np.testing.assert_array_equal(got, np.asarray(jax.jit(f)(keys)))
    np.testing.assert_array_equal(got[0], P.RFC_OUT)


def test_cpu_split_carry_needs_trips_and_work():
    """From CI's long never-worse run: a 25-lane state in a fori_loop, its carry split in the
    rolled loop, compiled 3.7-6.1x jax.jit's time for a 0.74-1.11x run at 3 trips (the promise:
    over 3x only for a 1.5x run). XLA:CPU compiles a loop fusion and a copy per carried piece, so
    the split needs `min_split_trips` trips and more than `min_split_work` equations x trips per
    piece: 25 words of 16 equations a trip split from 8 trips (0.66-0.68x at 4-6, 0.71x at 7;
    14 equations a trip: 0.41-0.50x at 8), a 4x4 state of 95 equations a trip from 3
    (0.54-0.61x). Below
    that, unrolling and splitting costs the same compile time for the same trips (2 trips:
    3.7x / 0.74x): the loop stays jax.jit's, with the reason."""
    from jaxrewrite import strategies as S
    lc = _cost.loop_costs("cpu")
    assert (lc.min_split_trips, lc.min_split_work) == (3, 5.0)

    def rewritten(rounds, **kw):
        r = S.ArxRecipe(**{**dict(shape=(5, 5), rounds=rounds, batch=4096, seed=278,
                                  message=True, fanout=2, quarter=True, undo=True,
                                  out="state", wrap="fori"), **kw})
        res = jaxrewrite.rewrite_jaxpr_with_report(jax.make_jaxpr(r.fn)(*r.args), target="cpu")
        why = [d.reason for d in res.report.declines if d.pass_name == "flatten"]
        return r, res, primitive_counts(res.jaxpr), why

    for rounds, reason in ((1, "fewer than 3 trips"), (2, "fewer than 3 trips"),
                           (3, "too little work"), (7, "too little work")):
        r, res, counts, why = rewritten(rounds)
        assert counts["scan"] == 1 and counts["gather"] >= 1, rounds
        assert not res.report.rewrites, rounds        # jax.jit's program, nothing rewritten
        assert any("carry not split" in w and reason in w for w in why), (rounds, why)
    assert_equivalent(r.fn, *r.args, vmap=False)
    r, res, counts, why = rewritten(8)
    (scan,) = _scans(res.jaxpr)
    assert _carried_pieces(scan, (4096,)) == 25 and "gather" not in counts
    assert_equivalent(r.fn, *r.args, vmap=False)
    r, res, counts, why = rewritten(3, shape=(4, 4), seed=3)
    (scan,) = _scans(res.jaxpr)
    assert _carried_pieces(scan, (4096,)) == 16 and "gather" not in counts


def test_cpu_carry_not_split_without_scalarize():
    """From the accelerator bench's never-worse programs with `scalarize=False` (4,096 blocks,
    CPU): a 4x4 ARX state, 9 trips, a permutation and its inverse a trip. Its carry was split for
    a body scalarize would have split, and with scalarize off each trip re-joined the 16 pieces
    and split them again: compile 5.7x, run 1.18x jax.jit. Now the loop stays as written, with
    the reason; with the defaults the carry is split as before (0.26-0.27x)."""
    from jaxrewrite import strategies as S
    r = S.ArxRecipe(shape=(4, 4), rounds=9, batch=4096, seed=29, message=False, fanout=2,
                    quarter=False, undo=True, out="xor", wrap="fori")
    jaxpr = jax.make_jaxpr(r.fn)(*r.args)
    off = jaxrewrite.rewrite_jaxpr_with_report(jaxpr, target="cpu", scalarize=False)
    (scan,) = _scans(off.jaxpr)
    assert _carried_pieces(scan, (4096,)) == 0 and _carried_pieces(scan, (4096, 4, 4)) == 1
    assert not [e for e in off.report.rewrites if e.pass_name == "flatten"]
    assert any(d.pass_name == "flatten" and "carry not split: scalarize=False" in d.reason
               for d in off.report.declines)
    assert_equivalent(r.fn, *r.args, vmap=False, bitwise=True, target="cpu", scalarize=False)
    on = jaxrewrite.rewrite_jaxpr_with_report(jaxpr, target="cpu")
    (scan,) = _scans(on.jaxpr)
    assert _carried_pieces(scan, (4096,)) == 16 and "gather" not in primitive_counts(on.jaxpr)


def test_cpu_split_carry_cuts_a_batched_loop_constant():
    """From CI's long never-worse run: a 25-word state whose rounds each add words of a 16-word
    message (`ArxRecipe(shape=(5, 5), rounds=8, message=True, fanout=1)`, 65,536 blocks) ran
    0.69-0.73x jax.jit with its carry split, for 5.2-5.7x the compile time (over the promise:
    more than 3x needs a 1.5x run). Each piece's fusion read its message words as strided
    columns of the whole (N, 16) message every trip; cut into its 16 words once before the
    loop, it ran 0.33x. The loop's constants then include the message's words, and no equation
    of the split body reads the whole message."""
    from jaxrewrite import strategies as S
    r = S.ArxRecipe(shape=(5, 5), rounds=8, batch=4096, seed=0, message=True, fanout=1,
                    quarter=False, undo=True, out="state", wrap="fori")
    res = jaxrewrite.rewrite_jaxpr_with_report(jax.make_jaxpr(r.fn)(*r.args), target="cpu")
    (scan,) = _scans(res.jaxpr)
    assert _carried_pieces(scan, (4096,)) == 25
    consts = scan.invars[:scan.params["num_consts"]]
    assert sum(1 for v in consts if tuple(v.aval.shape) == (4096,)) == 16
    body = scan.params["jaxpr"].jaxpr
    assert not [e for e in body.eqns
                if any(tuple(getattr(a.aval, "shape", ())) == (4096, 16) for a in e.invars)]
    assert any("1 loop constant(s) cut" in " ".join(a.after) for a in res.report.rewrites
               if a.pass_name == "flatten")
    assert_equivalent(r.fn, *r.args, vmap=False)


def test_cpu_split_carry_keeps_a_constant_whole_where_the_body_needs_it():
    """A batched loop constant that the body uses whole (here sorted along its words, which
    scalarize does not split) would be re-joined every trip if cut: the loop is split as before
    and the constant passed whole."""
    p1 = np.random.default_rng(1).permutation(16)
    p2 = np.random.default_rng(2).permutation(16)

    def block(s, m):
        def body(i, s):
            a = s.ravel()[p1].reshape(4, 4)
            b = a + jnp.sort(m).reshape(4, 4)
            return (((b << 7) | (b >> 25)) ^ b.ravel()[p2].reshape(4, 4)) + a
        return lax.fori_loop(0, 8, body, s)

    rng = np.random.default_rng(0)
    s = jnp.asarray(rng.integers(0, 2 ** 32, (4096, 4, 4), dtype=np.uint32))
    m = jnp.asarray(rng.integers(0, 2 ** 32, (4096, 16), dtype=np.uint32))
    f = jax.vmap(block)
    res = jaxrewrite.rewrite_jaxpr_with_report(jax.make_jaxpr(f)(s, m), target="cpu")
    (scan,) = _scans(res.jaxpr)
    assert _carried_pieces(scan, (4096,)) == 16
    consts = [tuple(v.aval.shape) for v in scan.invars[:scan.params["num_consts"]]]
    assert (4096, 16) in consts and (4096,) not in consts
    assert_equivalent(f, s, m, vmap=False)


def test_cpu_split_carry_out_of_cache_needs_permutations(monkeypatch):
    """A split loop whose state stays out of the cache (larger than the cores' caches, and not
    tiled) goes to memory every trip as jax.jit's does: 25 u64 lanes (200 B a block, wider
    than a tile takes), 2 permutations a trip, 16,384-65,536 blocks ran 0.70-1.10x for 3.9-5.1x
    the compile time. Declined where fewer than `min_memory_permutations` move it each trip,
    with the reason; the same program with u32 words (100 B a block) is tiled, and split."""
    from jaxrewrite import strategies as S
    import dataclasses
    # this machine's caches: 2 cores of 1 MiB (the measurements'), whatever the runner has
    monkeypatch.setitem(_cost.COSTS, "cpu", dataclasses.replace(
        _cost.COSTS["cpu"], tile_cores=2, tile_cache_bytes=1 << 20))

    def rewritten(dtype, **opts):
        r = S.ArxRecipe(shape=(25,), dtype=dtype, rounds=12, batch=65536, seed=28,
                        message=False, fanout=1, quarter=False, undo=True, wrap="fori")
        with jax.enable_x64(dtype == "uint64"):
            res = jaxrewrite.rewrite_jaxpr_with_report(jax.make_jaxpr(r.fn)(*r.args),
                                                       target="cpu", **opts)
        return res, [d.reason for d in res.report.declines if d.pass_name == "flatten"]

    res, why = rewritten("uint64")
    assert any("out of the cores'" in w and "2 permutation(s)" in w for w in why), why
    assert not res.report.rewrites
    res, why = rewritten("uint32", tile=False)
    assert any("out of the cores'" in w and "tile=False" in w for w in why), why
    res, why = rewritten("uint32")
    assert [e for e in res.report.rewrites if e.pass_name == "flatten"]


def _kept_whole(res) -> bool:
    """No pass split the loop or its body. Movement may make the body's transposed stack of
    the state's rows the stack along the other axis (renaming: on that 12-trip recipe XLA:CPU's
    module has 5 -> 3 transposes, 8 -> 5 copies, 7 -> 6 fusions; run 1.02-1.12x with an A/A
    of 1.00-1.07x on a loaded machine, Dec 7)."""
    return all(e.pass_name == "movement" and e.before == ("transpose",) and e.after == ("stack",)
               for e in res.report.rewrites)


def test_cpu_loop_body_is_not_split_under_a_whole_carry():
    """Where flatten leaves a loop's carry whole, scalarize does not split the body on its own:
    its results, the next trip's carry, would be re-joined every trip. Taken, that compiled
    3.1-3.5x jax.jit's time and ran 0.99-1.0x (4x4 quarter rounds with a message, 65,536
    blocks, 2 trips), and 2.95x / 1.69x at 12 trips. Declined with the reason; jax.jit's
    program is kept."""
    from jaxrewrite import strategies as S
    r = S.ArxRecipe(shape=(4, 4), rounds=2, batch=4096, seed=3, message=True, fanout=2,
                    quarter=True, undo=True, wrap="fori")
    res = jaxrewrite.rewrite_jaxpr_with_report(jax.make_jaxpr(r.fn)(*r.args), target="cpu")
    assert _kept_whole(res)
    assert any(d.pass_name == "scalarize" and "re-joined every trip" in d.reason
               for d in res.report.declines)
    # not on the GPU: there flatten unrolls, and the launches decide
    res = jaxrewrite.rewrite_jaxpr_with_report(jax.make_jaxpr(r.fn)(*r.args), target="gpu")
    assert not any("re-joined every trip" in d.reason for d in res.report.declines)
    assert_equivalent(r.fn, *r.args, vmap=False)
    # its rows re-joined by the program's own `jnp.stack`, 12 trips, flatten declining (one
    # permutation a trip): split, it ran 1.69x jax.jit (`bench/never_worse.py --draw 30 --seed 2`)
    r = S.ArxRecipe(shape=(4, 4), rounds=12, batch=4096, seed=726, message=True, fanout=2,
                    quarter=True, undo=False, out="state", wrap="fori")
    res = jaxrewrite.rewrite_jaxpr_with_report(jax.make_jaxpr(r.fn)(*r.args), target="cpu")
    assert _kept_whole(res)
    assert any(d.pass_name == "scalarize" and "re-joined every trip" in d.reason
               for d in res.report.declines)


def test_cpu_carry_not_split_where_the_body_needs_it_whole():
    """A body that scans the whole state each trip would re-join the pieces every trip: the
    carry is not split, the loop stays as it was, and the decline says why. (An integer sum
    over the split axis is split: its pieces are added, tests/test_keccak.py.)"""
    p1, p2 = np.array([1, 2, 3, 0]), np.array([2, 0, 3, 1])

    def f(x):
        return lax.fori_loop(0, 4, lambda i, x: x[:, p1] ^ (x[:, p2] >> jnp.uint32(3))
                             ^ jnp.cumsum(x, axis=1), x)

    x = jnp.asarray(np.random.default_rng(6).integers(0, 2**32, (4096, 4), np.uint32))
    res = jaxrewrite.rewrite_jaxpr_with_report(jax.make_jaxpr(f)(x), target="cpu")
    counts = primitive_counts(res.jaxpr)
    assert counts["scan"] == 1
    why = [e.reason for e in res.report.declines if e.pass_name == "flatten"]
    assert why and all("carry not split" in w and "re-join" in w for w in why)
    assert_equivalent(f, x, vmap=False)


def test_while_fori_loop_with_folded_bound():
    """`fori_loop` with a traced bound lowers to `while`; once fold makes the bound a literal,
    the loop has a static trip count and is unrolled like a scan."""
    perm, p2 = np.array([1, 2, 3, 0]), np.array([2, 0, 3, 1])

    def f(x):
        n = jnp.int32(3) + 4
        return lax.fori_loop(0, n, lambda i, x: (x[:, perm] ^ (x[:, p2] << jnp.uint32(1)))
                             + i.astype(jnp.uint32), x)

    x = jnp.asarray(np.random.default_rng(3).integers(0, 2**32, (4096, 4), np.uint32))
    counts = primitive_counts(assert_equivalent(f, x, vmap=False, target="gpu"))
    assert "while" not in counts and "gather" not in counts
    assert counts["xor"] == 7 * 4                   # GPU: unrolled
    cj = assert_equivalent(f, x, vmap=False, target="cpu")  # CPU: a scan of 7, carry in 4 words
    counts = primitive_counts(cj)
    assert "while" not in counts and "gather" not in counts and counts["xor"] == 4
    (scan,) = _scans(cj)
    assert scan.params["length"] == 7 and _carried_pieces(scan, (4096,)) == 4


def test_scan_with_xs_ys_and_reverse():
    perm = np.array([3, 0, 1, 2])

    def f(x, xs):
        def body(c, xt):
            c = c[:, perm] + xt
            return c, c[:, ::-1] * jnp.uint32(3)
        return lax.scan(body, x, xs, reverse=True)

    rng = np.random.default_rng(4)
    x = jnp.asarray(rng.integers(0, 2**32, (64, 4), np.uint32))
    xs = jnp.asarray(rng.integers(0, 2**32, (5, 64, 4), np.uint32))
    counts = primitive_counts(assert_equivalent(f, x, xs, target="gpu", vmap=False))
    assert "scan" not in counts and "gather" not in counts


def test_cpu_carry_split_scan_with_xs_ys_reverse_and_two_carries():
    """CPU carry split of a reversed scan with xs and ys and two carried values, one of them
    without a small axis (carried whole): bit for bit, the scan kept with its split carry."""
    p1, p2 = np.array([3, 0, 1, 2]), np.array([1, 3, 0, 2])

    def f(x, acc, xs):
        def body(c, xt):
            s, a = c
            s = (s[:, p1] + xt) ^ (s[:, p2] >> jnp.uint32(7))
            a = a + s[:, 0]
            return (s, a), s[:, 3] * jnp.uint32(3)   # (a piece: no re-join per trip)
        return lax.scan(body, (x, acc), xs, reverse=True)

    rng = np.random.default_rng(4)
    x = jnp.asarray(rng.integers(0, 2**32, (4096, 4), np.uint32))
    acc = jnp.asarray(rng.integers(0, 2**32, (4096,), np.uint32))
    xs = jnp.asarray(rng.integers(0, 2**32, (5, 4096, 4), np.uint32))
    cj = assert_equivalent(f, x, acc, xs, vmap=False, target="cpu")
    (scan,) = _scans(cj)
    assert scan.params["reverse"] and scan.params["length"] == 5
    assert _carried_pieces(scan, (4096,)) == 4 + 1       # 4 words, and the whole accumulator
    assert "gather" not in primitive_counts(cj)


def test_float_movement_loop_gradients():
    """A float body of data movement and selection only is exact unrolled; gradients by value."""
    perm = np.array([2, 0, 3, 1])

    def f(x):
        return lax.fori_loop(0, 3, lambda i, x: jnp.maximum(x[:, perm], -x), x)

    x = jnp.asarray(np.random.default_rng(5).standard_normal((16, 4)), jnp.float32)
    counts = primitive_counts(assert_equivalent(f, x, target="gpu"))
    assert "scan" not in counts and "gather" not in counts


def test_inexact_body_stays_rolled_with_reason():
    perm = np.array([2, 0, 3, 1])

    def f(x):
        return lax.fori_loop(0, 3, lambda i, x: jnp.sin(x[:, perm]), x)

    x = jnp.ones((16, 4), jnp.float32)
    res = jaxrewrite.rewrite_jaxpr_with_report(jax.make_jaxpr(f)(x), target="gpu")
    assert primitive_counts(res.jaxpr)["scan"] == 1
    assert any(e.pass_name == "flatten" and "'sin'" in e.reason for e in res.report.declines)


def test_long_loop_stays_rolled_for_compile_time():
    def f(s):
        return lax.fori_loop(0, 1000, lambda i, s: _double_round(s), s)

    res = jaxrewrite.rewrite_jaxpr_with_report(jax.make_jaxpr(jax.vmap(f))(KEYS), target="gpu")
    assert primitive_counts(res.jaxpr)["scan"] == 1
    assert any(e.pass_name == "flatten" and "compile time" in e.reason
               for e in res.report.declines)


@pytest.mark.parametrize("target,permutes,piece,go", [
    ("gpu", False, 0, True),        # launches decide on the GPU: 10 trips -> 1 region
    ("cpu", False, 0, False),       # the CPU unrolls only what scalarize then splits
    ("cpu", True, 512, False),      # ... pieces below its minimum are not split
    ("cpu", True, 65536, True),
])
def test_unroll_decision_table(target, permutes, piece, go):
    plan = _cost.LoopPlan(trips=10, body_eqns=50, body_movers=2, permutes=permutes,
                          piece_elements=piece)
    why, summary = _cost.unroll_decision(plan, target, "auto")
    assert (why is None) == go
    assert "launches/call" in summary and "500 equations" in summary


def test_option_validated():
    with pytest.raises(ValueError):
        jaxrewrite.optimize(block_fori, flatten="yes")


def test_explain_shows_the_unroll_estimate():
    x = jnp.asarray(np.random.default_rng(6).integers(0, 2**32, (4096, 4, 4), np.uint32))
    e = jaxrewrite.explain(seed_loop("take", "fori"), target="gpu")(x)
    unrolled = [r for r in e.to_dict()["rewrites"] if r["pass_name"] == "flatten"]
    assert len(unrolled) == 1 and tuple(unrolled[0]["before"]) == ("scan",)
    assert "launches/call rolled" in unrolled[0]["after"][0]
    assert "equations (compile time)" in unrolled[0]["after"][0]
    assert "launches/call rolled" in str(e)
    # the CPU keeps ChaCha20's loop rolled: the estimate is the body's size, compiled once
    e = jaxrewrite.explain(jax.vmap(block_fori), target="cpu")(x)
    (split,) = [r for r in e.to_dict()["rewrites"]
                if r["pass_name"] == "flatten" and tuple(r["before"]) == ("scan",)]
    assert "carry split" in split["after"][0] and "compiled once" in str(e)


# --- H200 kernels (deviceless XLA compile; the gpu-aot extra, JAX_PLATFORMS=cpu) ----------------

def _h200(fn, spec):
    """(kernels, launches per call) of `fn` compiled for the H200 without a GPU."""
    pytest.importorskip("jax_plugins.xla_cuda12")
    if "cpu" not in (jax.config.jax_platforms or "").split(","):
        pytest.skip("the deviceless GPU compiler needs JAX_PLATFORMS=cpu")
    import _common
    from jaxrewrite.backend import xla as _xla
    c = _xla.gpu_compile(fn, spec)
    return _xla.gpu_kernels(c), _common.gpu_launches(c.as_text())


@pytest.mark.gpu_aot
@pytest.mark.parametrize("kind", ["fori", "scan"])
def test_h200_seed_inner_fn_in_loop_at_the_no_permutation_floor(kind):
    from seed import rounds_program
    spec = jax.ShapeDtypeStruct((65536, 4, 4), jnp.uint32)
    floor, _ = _h200(jax.jit(rounds_program(COLFNS["mix"], PERMS["none"])), spec)
    rolled = _h200(jax.jit(seed_loop("take", kind)), spec)
    kernels, launches = _h200(jaxrewrite.optimize(seed_loop("take", kind), target="gpu"), spec)
    assert kernels <= floor and launches == kernels      # no loop left: each kernel once
    assert launches < rolled[1]


@pytest.mark.gpu_aot
def test_h200_chacha_fori_as_few_kernels_as_the_hand_form():
    """Issue 12's size (65,536 blocks): the author's fori_loop program through optimize makes the
    hand-written 16-word form's kernels (2), each launched once; jax.jit's rolled loop
    launches its body's kernels every trip."""
    spec = jax.ShapeDtypeStruct((65536, 4, 4), jnp.uint32)
    _, rolled = _h200(jax.jit(jax.vmap(block_fori)), spec)
    kernels, launches = _h200(jaxrewrite.optimize(jax.vmap(block_fori), target="gpu"), spec)
    hand, _ = _h200(jax.jit(jax.vmap(P.chacha_words)), spec)
    assert kernels <= hand and kernels <= 2
    assert launches == kernels < rolled


def test_cpu_literal_initial_carry_is_split_into_broadcasts():
    """A loop whose initial state is one constant broadcast over the batch (BLAKE2s's IV under
    vmap; fold makes it a literal of the batch's size) has its carry split like a traced one:
    each piece starts as a broadcast of its one value, no constant of the batch's size is left,
    bit for bit jax.jit's. (Before, a literal carry was never split, so the same program was
    split at 1,048,576 blocks, past `fold_limit`, and not at 65,536.)"""
    iv = np.arange(16, dtype=np.uint32).reshape(4, 4) * np.uint32(0x9E3779B9)

    def one(m):
        def body(i, s):
            return _double_round(s + m)
        return lax.fori_loop(0, 10, body, jnp.asarray(iv))
    msgs = jnp.asarray(np.random.default_rng(5).integers(0, 2**32, (4096, 4, 4),
                                                         dtype=np.uint32))
    f = jax.vmap(one)
    res = jaxrewrite.rewrite_jaxpr_with_report(jax.make_jaxpr(f)(msgs), target="cpu", tile=False)
    (scan,) = _scans(res.jaxpr)
    assert _carried_pieces(scan, (4096,)) == 16
    nc, nk = scan.params["num_consts"], scan.params["num_carry"]
    from jaxrewrite import _compat as C
    producers = {v: e for e in res.jaxpr.jaxpr.eqns for v in e.outvars}
    inits = [v for v in scan.invars[nc:nc + nk] if tuple(v.aval.shape) == (4096,)]
    assert all(not C.is_literal(v) and producers[v].primitive.name == "broadcast_in_dim"
               and producers[v].invars[0].aval.shape == () for v in inits)
    assert not any(np.size(c) >= 4096 for c in res.jaxpr.consts)
    assert_equivalent(f, msgs, bitwise=True, target="cpu", tile=False)


def test_a_constant_piece_is_a_broadcast_only_of_one_bit_pattern():
    """Pieces of a literal initial carry become broadcasts only where every element has the
    same bits: 0.0 beside -0.0 stays the constant it is, and so does a NaN (its payload)."""
    from jaxrewrite.passes import loop_carry
    x = np.array([[0.0, 1.5, np.nan], [-0.0, 1.5, np.nan]], np.float32)
    zeros, same, nans = loop_carry._const_pieces(x, (1,))
    assert isinstance(zeros, np.ndarray) and np.signbit(zeros).tolist() == [False, True]
    assert not isinstance(same, np.ndarray)
    np.testing.assert_array_equal(np.asarray(same), [1.5, 1.5])
    assert isinstance(nans, np.ndarray)
