"""The TPU's decisions, checked on any host (`target="tpu"`): CI has no TPU.

Each decision was measured on a TPU v5e (`bench/tpu_costs.py`; figures in `backend/cost.py` and
docs/measurements.md, "TPU v5e"); these tests keep the structure that measurement chose, and
run the rewritten program on the host's backend, bit for bit against jax.jit.
"""
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import jaxrewrite
from jaxrewrite import _walk
from jaxrewrite.backend import cost, tpu_layout
from jaxrewrite.backend import xla as _xla
from jaxrewrite.testing import assert_bitwise_equal, primitive_counts

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bench"))
import author_chacha as A  # noqa: E402
import permutations as P  # noqa: E402
from tpu_costs import bitonic_sort  # noqa: E402

MOVERS = ("rev", "reshape", "transpose", "concatenate", "slice")
_DEVICELESS = pytest.mark.skipif(
    not _xla.tpu_compile_available(),
    reason="compiles for a TPU v5e: needs libtpu (the tpu-aot extra), or a v5e host")
# bench/tpu_aot.py compiles in a child process with JAX_PLATFORMS=cpu and libtpu's dump on: a
# tool for a host with no TPU (on a TPU host the parent holds the chip, and the dump stops libtpu)
_NO_TPU_HOST = pytest.mark.skipif(
    not _xla.tpu_aot_available() or jax.default_backend() == "tpu",
    reason="bench/tpu_aot.py's child compiles with no TPU: needs libtpu on a host without one")


def _rewrite(fn, *args, **options):
    return jaxrewrite.rewrite_jaxpr_with_report(jax.make_jaxpr(fn)(*args), **options)


def _scans(cj):
    return [e for e in _walk.iter_eqns(cj) if e.primitive.name == "scan"]


@pytest.mark.parametrize("kind", ["fori", "python"])
def test_chacha_stays_a_loop_with_its_words_carried(kind):
    """ChaCha20 as its author wrote it, on the TPU: the loop is kept (unrolled it compiled 5-15x
    jax.jit's for a smaller gain) with its state carried as 16 words; a Python loop of the
    double rounds is rolled into that loop first."""
    keys = P._blocks(4096)
    f = jax.vmap(P.chacha_loop(kind))
    res = _rewrite(f, keys, target="tpu")
    counts = primitive_counts(res.jaxpr)
    assert "gather" not in counts and "while" not in counts, counts
    (scan,) = _scans(res.jaxpr)
    nc, nk = scan.params["num_consts"], scan.params["num_carry"]
    assert scan.params["length"] == 10
    assert sum(1 for v in scan.invars[nc:nc + nk] if v.aval.shape == (4096,)) == 16
    got = jaxrewrite.optimize(f, target="tpu")(keys)
    assert_bitwise_equal(got, jax.jit(f)(keys))
    np.testing.assert_array_equal(np.asarray(got)[0], P.RFC_OUT)


@pytest.mark.parametrize("kernel", [False, True])
def test_a_word_major_caller_keeps_its_layout_around_the_rounds(kernel):
    """ChaCha20's state as (4, 4, N), vmapped over its last axis (issue 44, item 4): the words
    are read as rows of it and written back as rows, with no transpose through the (N, 4, 4)
    layout vmap works in (on the chip each was a pass over (8, 128) tiles padded from 4: the
    kernel ran 2.12 ms there, where the hand-made one on word-major data ran 1.0-1.2 ms)."""
    x = P._blocks(4096)
    xw = jnp.asarray(np.transpose(np.asarray(x), (1, 2, 0)))
    f = jax.vmap(P.chacha_loop("fori"), in_axes=2, out_axes=2)
    assert "transpose" in primitive_counts(jax.make_jaxpr(f)(xw))
    res = _rewrite(f, xw, target="tpu", kernel=kernel)
    counts = primitive_counts(res.jaxpr)
    assert counts.get("pallas_call", 0) == int(kernel), counts
    if kernel:   # (the kernel reads and writes the state itself: its views are its own)
        _assert_in_place(res.jaxpr, (4, 4 * 4096 // 128, 128))
    else:
        assert "transpose" not in counts, counts
    got = jaxrewrite.optimize(f, target="tpu", kernel=kernel)(xw)
    assert_bitwise_equal(got, jax.jit(f)(xw))
    np.testing.assert_array_equal(np.asarray(got)[:, :, 0], P.RFC_OUT)


@pytest.mark.parametrize("keys", [32, 64])
def test_bitonic_sort_keeps_its_gathers_on_the_tpu(keys):
    """`x[..., i ^ j]` as a reshape, rev, reshape pads every (8, 128) tile on the TPU (bitonic
    sorts ran 1.64x / 1.83x): the gathers stay, each with the reason; the CPU takes the forms."""
    x = jnp.asarray(np.random.default_rng(keys).integers(-2**31, 2**31, (4096, keys),
                                                         dtype=np.int32))
    tpu = _rewrite(bitonic_sort, x, target="tpu")
    counts = primitive_counts(tpu.jaxpr)
    stages = {32: 15, 64: 21}[keys]
    assert counts.get("gather") == stages and not any(p in counts for p in ("rev", "reshape"))
    reasons = [d.reason for d in tpu.report.declines if d.pass_name == "gathers"]
    assert len(reasons) == stages and all("tiles" in r or "reverses" in r for r in reasons)
    cpu = primitive_counts(_rewrite(bitonic_sort, x, target="cpu").jaxpr)
    assert "gather" not in cpu and cpu.get("rev") == stages
    assert_bitwise_equal(jaxrewrite.optimize(bitonic_sort, target="tpu")(x),
                         jax.jit(bitonic_sort)(x))


@pytest.mark.parametrize("name,perm,kept", [
    ("rev", np.arange(64)[::-1].copy(), True),          # reverses 64 elements
    ("swap pairs", np.arange(64) ^ 1, True),            # (32, 2): pads the minor axis
    ("swap halves", np.arange(64) ^ 32, True),          # (2, 32): pads it too
])
def test_minor_axis_forms_that_pad_or_reverse_stay_gathers(name, perm, kept):
    x = jnp.zeros((65536, 64), jnp.uint32)
    f = lambda v: v[:, perm] ^ (v >> 3)  # noqa: E731
    counts = primitive_counts(_rewrite(f, x, target="tpu").jaxpr)
    assert ("gather" in counts) == kept, counts
    assert "gather" not in primitive_counts(_rewrite(f, x, target="gpu").jaxpr)


def test_a_slice_of_the_major_axis_is_still_taken():
    """What pads nothing and reverses nothing is data movement on the TPU too."""
    x = jnp.zeros((64, 4096), jnp.float32)
    f = lambda v: v[np.arange(8, 40)] * 2  # noqa: E731
    counts = primitive_counts(_rewrite(f, x, target="tpu").jaxpr)
    assert "gather" not in counts and counts.get("slice") == 1


def _chacha(layout: str, n: int, block):
    """(ChaCha20's block function vmapped over `n` states laid out as `layout`, the states:
    block 0 RFC 8439's)."""
    x = P._blocks(n)
    if layout == "(N, 4, 4)":
        return jax.vmap(block), x
    return (jax.vmap(block, in_axes=2, out_axes=2),
            jnp.asarray(np.transpose(np.asarray(x), (1, 2, 0))))


def _assert_rfc_bits(f, arg, layout: str, **options):
    """optimize(f) is jax.jit's bit for bit, and block 0 is RFC 8439's (section 2.3.2)."""
    got = jaxrewrite.optimize(f, **options)(arg)
    assert_bitwise_equal(got, jax.jit(f)(arg))
    block0 = np.asarray(got)[0] if layout == "(N, 4, 4)" else np.asarray(got)[:, :, 0]
    np.testing.assert_array_equal(block0, P.RFC_OUT)


@pytest.mark.parametrize("layout", ["(N, 4, 4)", "(4, 4, N)"])
def test_the_feed_forward_add_is_done_in_the_kernel(layout):
    """ChaCha20 adds its input to the rounds' result. That add, on the re-joined state, was
    XLA's after the kernel: it read the kernel's 16 words and the input again and wrote the
    result (on the chip the pass's kernel ran 2.08 ms where a hand-made kernel holding the add
    ran 1.88 ms, the same 320 vector operations a loop trip: bench/tpu_dump.py). Now it is done
    on the pieces the kernel already reads: 16 words in, 16 out, no add left outside. Where no
    kernel is made (below the TPU row's minimum) the add stays as it was."""
    f, arg = _chacha(layout, 4096, P.chacha_loop("fori"))
    res = _rewrite(f, arg, target="tpu", kernel=True)
    levels = [getattr(j, "jaxpr", j) for j in _walk.iter_jaxprs(res.jaxpr)]
    (level,) = [j for j in levels if any(e.primitive.name == "pallas_call" for e in j.eqns)]
    names = [e.primitive.name for e in level.eqns]
    assert "add" not in names and names.count("pallas_call") == 1, names
    (stats,) = res.report.stats["kernel"]
    assert (stats["pieces_in"], stats["pieces_out"]) == (16, 16)
    _assert_rfc_bits(f, arg, layout, target="tpu", kernel=True)
    auto = _rewrite(f, arg, target="tpu")           # 4,096 blocks: below kernel_min_elements
    assert "kernel" not in auto.report.stats["changed_by"]
    assert primitive_counts(auto.jaxpr).get("add", 0) >= 1


def _assert_in_place(cj, view):
    """The program's one kernel takes one array of shape `view` and gives one, and outside it
    nothing but the views of the state (no slice, squeeze, stack or concatenate of pieces)."""
    levels = [getattr(j, "jaxpr", j) for j in _walk.iter_jaxprs(cj)]
    (level,) = [j for j in levels if any(e.primitive.name == "pallas_call" for e in j.eqns)]
    (call,) = [e for e in level.eqns if e.primitive.name == "pallas_call"]
    assert [v.aval.shape for v in call.invars] == [view]
    assert [v.aval.shape for v in call.outvars] == [view]
    names = {e.primitive.name for e in level.eqns} - {"pallas_call"}
    assert names <= {"reshape", "transpose", "copy", "copy_p"}, names


@pytest.mark.parametrize("layout", ["(N, 4, 4)", "(4, 4, N)"])
def test_the_kernel_reads_and_writes_the_state_where_xla_keeps_it(layout):
    """The author's state, (N, 4, 4) or word-major (4, 4, N), is the kernel's one operand and
    its one result, as the (4, 4 * N/128, 128) view that is its layout on the TPU
    (`backend.tpu_layout`): each word read and written as sublane-strided rows, so XLA moves
    nothing around the kernel (compiled for a TPU v5e with no TPU: the only launch, where the
    16 pieces cost five relayouts). Bit for bit, RFC 8439's block."""
    n = 8192
    f, arg = _chacha(layout, n, A.block)
    res = _rewrite(f, arg, target="tpu", kernel=True)
    _assert_in_place(res.jaxpr, (4, 4 * n // 128, 128))
    (stats,) = res.report.stats["kernel"]
    assert (stats["in_place_in"], stats["in_place_out"]) == (16, 16)
    _assert_rfc_bits(f, arg, layout, target="tpu", kernel=True)
    with cost.override_row("tpu", kernel_in_place=False):
        pieces = _rewrite(f, arg, target="tpu", kernel=True)
    (call,) = [e for e in _walk.iter_eqns(pieces.jaxpr) if e.primitive.name == "pallas_call"]
    assert len(call.invars) == 16 and len(call.outvars) == 16


@pytest.mark.parametrize("shape,view", [((2, 8), (2, 512, 128)), ((8, 2), (8, 128, 128)),
                                        ((4, 2), (4, 128, 128)), ((8,), (1, 512, 128))])
def test_other_states_are_read_in_place_in_their_sublane_tiles(shape, view):
    """Generated ARX programs on states of other shapes (8,192 blocks): XLA:TPU tiles the last
    short axis in 2, 4 or 8 sublanes, so the strided loads step by 2 or 8 too. Bit for bit."""
    from jaxrewrite.strategies import ArxRecipe
    r = ArxRecipe(shape=shape, rounds=8, batch=8192, seed=5, message=False, fanout=1,
                  quarter=True, undo=False, out="xor", wrap="fori")
    res = _rewrite(r.fn, *r.args, target="tpu", kernel=True)
    _assert_in_place(res.jaxpr, view)
    assert_bitwise_equal(jaxrewrite.optimize(r.fn, target="tpu", kernel=True)(*r.args),
                         jax.jit(r.fn)(*r.args))


def test_a_region_reading_a_few_words_of_a_large_state_takes_them_as_pieces():
    """A region that reads 4 of the state's 16 words would bring in the whole (4, 4R, 128)
    block for them: those stay pieces (`kernel._whole`); its (N, 4) result is written in place."""
    perm = np.array([1, 2, 3, 0])

    def block(s):
        def body(i, w):
            w = w + jnp.take(w, perm)
            return w ^ ((w << 7) | (w >> 25))
        return jax.lax.fori_loop(0, 8, body, s[0])

    f = jax.vmap(block)
    x = P._blocks(8192)
    res = _rewrite(f, x, target="tpu", kernel=True)
    (stats,) = res.report.stats["kernel"]
    assert (stats["pieces_in"], stats["in_place_in"]) == (4, 0)
    assert (stats["pieces_out"], stats["in_place_out"]) == (4, 4)
    assert_bitwise_equal(jaxrewrite.optimize(f, target="tpu", kernel=True)(x), jax.jit(f)(x))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.sampled_from([1, 2, 3, 4, 5, 8, 16]), min_size=1, max_size=2),
       st.integers(0, 3), st.sampled_from([1024, 2048, 5120]))
def test_the_layout_model_s_view_holds_every_element_once(short, where, n):
    """`tpu_layout.native`: where it models an array, `to_view` and `from_view` are inverses
    and `slot` names the rows of V that hold x[..., :, ...] at each index of the short axes
    (numpy's reading of the same reshapes; where XLA keeps them is the deviceless test's)."""
    shape = tuple(short[:where]) + (n,) + tuple(short[where:])
    layout = tpu_layout.native(shape, 4)
    assert (layout is None) == (short[-1] not in (1, 2, 4) and short[-1] % 8 != 0)
    if layout is None:
        return
    x = np.arange(np.prod(shape), dtype=np.uint32).reshape(shape)
    v = np.asarray(layout.to_view(jnp.asarray(x)))
    assert v.shape == layout.view_shape()
    np.testing.assert_array_equal(np.asarray(layout.from_view(jnp.asarray(v))), x)
    for index in np.ndindex(*layout.short):
        slab, sub = layout.slot(index)
        column = x[index[:layout.axis] + (slice(None),) + index[layout.axis:]]
        np.testing.assert_array_equal(v[slab, sub::layout.sublanes].reshape(-1), column)


@_DEVICELESS
@pytest.mark.parametrize("shape", [(1 << 16, 4, 4), (4, 4, 1 << 16), (1 << 16, 16),
                                   (1 << 16, 8, 2), (1 << 16, 4, 1), (4, 1 << 16, 4),
                                   (2, 8, 1 << 16)])
def test_the_layout_model_is_where_xla_tpu_keeps_the_array(shape):
    """The model is libtpu's: a kernel on the view of an array, compiled for a TPU v5e here, is
    the program's only launch (the views around it are bitcasts). If a newer libtpu lays such
    arrays out otherwise, this fails and `backend/tpu_layout.py` is read again."""
    from jax.experimental import pallas as pl
    layout = tpu_layout.native(shape, 4)
    slabs, rows, lanes = layout.view_shape()
    block = (slabs, 16 * layout.sublanes, lanes)
    spec = pl.BlockSpec(block, lambda i: (0, i, 0))

    def plus_one(x_ref, o_ref):
        o_ref[...] = x_ref[...] + 1

    def f(x):
        v = layout.to_view(x)
        y = pl.pallas_call(plus_one, grid=(rows // block[1],), in_specs=[spec], out_specs=spec,
                           out_shape=jax.ShapeDtypeStruct(v.shape, v.dtype))(v)
        return layout.from_view(y)

    compiled = _xla.tpu_compile(f, jax.ShapeDtypeStruct(shape, np.uint32))
    assert _xla.launches(compiled) == {"custom-call": 1}


def _arx_23_rounds(batch):
    from jaxrewrite.strategies import ArxRecipe
    return ArxRecipe(shape=(2, 8), dtype="uint32", rounds=23, batch=batch, seed=53,
                     message=False, fanout=1, quarter=True, undo=False, out="xor", wrap="")


def test_a_split_no_kernel_takes_stays_within_the_tpu_s_compile_limit():
    """The never-worse sweep on the chip (Dec 7): an ARX level split from 210 to 2,960
    equations compiled 5.6-15.5x jax.jit at 4,096 blocks for a run of 0.98-1.01x, since XLA:TPU
    compiles the pieces as fusions of their own; at 65,536 the kernel takes the same split and
    it ran 0.43-0.73x. So below the kernel's minimum the TPU declines such a split, with the
    reason; where a kernel will take it (larger pieces, or `kernel=True`) it splits."""
    small = _arx_23_rounds(4096)
    res = _rewrite(small.fn, *small.args, target="tpu")
    assert "scalarize" not in res.report.stats["changed_by"]
    reasons = [d.reason for d in res.report.declines if d.pass_name == "scalarize"]
    assert any("no kernel takes" in r and "compile time" in r for r in reasons), reasons
    assert_bitwise_equal(jaxrewrite.optimize(small.fn, target="tpu")(*small.args),
                         jax.jit(small.fn)(*small.args))
    forced = _rewrite(small.fn, *small.args, target="tpu", kernel=True)
    assert "scalarize" in forced.report.stats["changed_by"]
    shapes = [jax.ShapeDtypeStruct((65536,) + a.shape[1:], a.dtype) for a in small.args]
    res = jaxrewrite.rewrite_jaxpr_with_report(jax.make_jaxpr(_arx_23_rounds(65536).fn)(*shapes),
                                               target="tpu")
    assert "scalarize" in res.report.stats["changed_by"]
    # the GPU's row has no such limit: one fusion grows instead
    assert "scalarize" in _rewrite(small.fn, *small.args, target="gpu").report.stats["changed_by"]


def test_splits_past_the_tpu_s_growth_limits_are_declined():
    """The never-worse generator's programs compiled for a TPU v5e with no TPU (Dec 7,
    `never_worse_sweep.py --compile-only`), under the limit of 600 equations and 8x both: an ARX
    level grown 5.8x to 1,739 equations compiled 3.5x `jax.jit`, one grown 9.7x to 502
    equations 3.5x, one 9.4x to 263 equations 3.2x, where on the chip such splits at 4,096 ran
    0.93-1.07x. Now each is declined with the reason (8x, and 5x past 500 equations);
    Salsa20/8 at 4,096 (3.0x, compile 1.19x on the chip) is still split."""
    from jaxrewrite.strategies import ArxRecipe
    for r in (ArxRecipe(shape=(8,), dtype="uint64", rounds=24, batch=4096, seed=1, message=True,
                        fanout=1, quarter=False, undo=False, out="xor", wrap="jit"),
              ArxRecipe(shape=(2, 8), dtype="uint64", rounds=3, batch=4096, seed=169,
                        message=True, fanout=3, quarter=False, undo=True, out="xor", wrap=""),
              ArxRecipe(shape=(4, 4), dtype="uint64", rounds=2, batch=4096, seed=789,
                        message=False, fanout=3, quarter=False, undo=False, out="state",
                        wrap="")):
        res = _rewrite(r.fn, *r.args, target="tpu")
        assert "scalarize" not in res.report.stats["changed_by"], r
        reasons = [d.reason for d in res.report.declines if d.pass_name == "scalarize"]
        assert any("no kernel takes" in why for why in reasons), reasons
        assert "scalarize" in _rewrite(r.fn, *r.args, target="gpu").report.stats["changed_by"]
    from accelerator import salsa20_8
    x = jnp.asarray(np.random.default_rng(0).integers(0, 2**32, (4096, 16), dtype=np.uint32))
    assert "scalarize" in _rewrite(jax.vmap(salsa20_8), x,
                                   target="tpu").report.stats["changed_by"]


_PERM16 = np.array([3, 0, 7, 1, 12, 5, 9, 2, 15, 4, 11, 6, 14, 8, 13, 10])


def _mix(x):
    """24 static permutations of a small axis, each mixed into the state elementwise."""
    for _ in range(24):
        x = (x[:, _PERM16] * np.float32(0.5) + x if x.dtype == np.float32
             else (x[:, _PERM16] + np.uint32(1)) ^ x)
    return x


def test_a_float_split_is_one_no_kernel_takes_at_any_size():
    """No kernel takes floats, and on the chip float stencils split at 65,536 ran 0.89-1.03x
    (Dec 7): the limit on a split no kernel takes (8x, 5x past 500 equations: compile time)
    holds for a float split at every size, where it had been taken for kernel work from
    65,536 elements. An integer split of the same size still goes to the kernel."""
    spec = jax.ShapeDtypeStruct((65536, 16), np.float32)
    res = jaxrewrite.rewrite_jaxpr_with_report(jax.make_jaxpr(_mix)(spec), target="tpu")
    assert "scalarize" not in res.report.stats["changed_by"]
    assert [d for d in res.report.declines if d.pass_name == "scalarize"]
    ints = jax.ShapeDtypeStruct((65536, 16), np.uint32)
    res = jaxrewrite.rewrite_jaxpr_with_report(jax.make_jaxpr(_mix)(ints), target="tpu")
    assert {"scalarize", "kernel"} <= set(res.report.stats["changed_by"])
    x = np.random.default_rng(0).standard_normal((65536, 16), dtype=np.float32)
    assert_bitwise_equal(jaxrewrite.optimize(_mix, target="tpu")(x), jax.jit(_mix)(x))


def test_padded_elements_model():
    assert cost.padded_elements((65536, 64), (8, 128)) == 65536 * 128
    assert cost.padded_elements((65536, 32, 2), (8, 128)) == 65536 * 32 * 128
    assert cost.padded_elements((16,), (8, 128)) == 8 * 128
    pairs = [("reshape", (65536, 64), (65536, 32, 2), ())]
    assert cost.movement_form_decision(pairs, "tpu") is not None
    assert cost.movement_form_decision(pairs, "cpu") is None
    assert cost.movement_form_decision([("rev", (2, 8, 128), (2, 8, 128), (2,))], "tpu") is None
    assert cost.movement_form_decision([("rev", (64, 128), (64, 128), (64,))], "tpu")


def test_the_chip_parts_name_each_test_file_once():
    """tests/tpu_parts.py: every part's file exists, none is in two parts, and a file no part
    names still runs (in the last part)."""
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path.insert(0, here)
    import tpu_parts
    named = [f for _, files in tpu_parts.PARTS for f in files]
    assert len(named) == len(set(named))
    assert all(os.path.exists(os.path.join(here, f)) for f in named)
    every = {f for _, files in tpu_parts.parts() for f in files}
    assert every == {f for f in os.listdir(here) if f.startswith("test_") and f.endswith(".py")}


def test_the_chip_parts_run_several_in_one_command(tmp_path, monkeypatch):
    """`tpu_parts.py --part one,two`: each part one pytest process writing its results and
    summary as it goes, and summary.txt a line a part (a chip's call runs several)."""
    import tpu_parts
    monkeypatch.setattr(tpu_parts, "parts",
                        lambda: [("one", ["test_views.py"]), ("two", ["test_views.py"])])
    # the runner is under test, not the chip: on a TPU host this process holds the chip, and a
    # child process that tried to open it would fail before its one test ran
    monkeypatch.setenv("JAX_PLATFORMS", "cpu")
    rc = tpu_parts.main(["--part", "one,2", "--out", str(tmp_path), "--limit", "120", "--",
                         "-k", "either_layout"])
    assert rc == 0
    lines = (tmp_path / "summary.txt").read_text().splitlines()
    assert [ln.split(":")[0] for ln in lines] == ["part 1 (one)", "part 2 (two)"]
    assert all("1 passed (1 of 1 tests)" in ln and "; complete" in ln for ln in lines), lines
    for i in (1, 2):
        results = (tmp_path / f"part-{i}.results").read_text().split()
        assert results[:2] == [
            "PASSED", "tests/test_views.py::test_chacha_s_pieces_are_found_in_either_layout"]


def test_the_chip_s_training_step_table_runs_on_any_host():
    """bench/tpu_layers.py (issue 46's table, run on the chip): at tiny sizes here, one row per
    form and the A/A control, plain's losses matched by the switch's, reroll=True rolling the
    plain-JAX transformer's 4 blocks, with the backend's cost row as it is and recomputing."""
    import tpu_layers
    forms = ["plain", "switch reroll=True", "switch reroll=True recompute"]
    rows = tpu_layers.measure("plain", 4, (32, 2, 16, 2, 64), forms, steps=2, repeats=1)
    by = {r["form"]: r for r in rows}
    assert set(by) == {*forms, "plain A/A"}
    assert by["plain"]["scans"] == 0 and by["switch reroll=True"]["scans"] >= 1
    assert by["switch reroll=True recompute"]["scans"] >= 1
    assert all(r["loss_rel"] <= 1e-3 for r in rows), rows
    assert by["plain"]["first_call_ratio"] == 1.0 and by["plain"]["step_ratio"] == 1.0


def test_the_mosaic_dump_bench_runs_on_any_host(tmp_path):
    """bench/tpu_dump.py (issue 44, item 4, run on the chip): the pass's kernel and the hand-made
    one at 4,096 blocks in Pallas's interpreter, RFC 8439's block from both (Salsa20/8's kernel:
    jax.jit's bits); and its reading of a Mosaic dump's last stage: the operations of the loop
    counted apart."""
    import tpu_dump
    rows = tpu_dump.main(["--quick", "author", "hand", "hand_native", "salsa"])
    assert [r["program"] for r in rows] == ["author", "hand", "hand_native", "salsa"]
    assert all(r.get("exact") is True for r in rows), rows
    (tmp_path / "k-0018-mosaic-dump-anonymous-post-finalize-llo.txt").write_text(
        "%0 = llo.vector_load %arg1 : i32 -> vector<8x128xi32>\n"
        "%1 = scf.for %i = %a to %b step %c iter_args(%x = %0) {\n"
        "  %2 = llo.vadd.s32 %x, %x : vector<8x128xi32>\n"
        "  %3 = llo.vshll.u32 %2, %2 : vector<8x128xi32>\n"
        "  scf.yield %3\n"
        "}\n"
        "%4 = llo.vadd.s32 %1, %0 : vector<8x128xi32>\n")
    (kernel,) = tpu_dump.llo_ops(str(tmp_path))
    assert kernel["ops"] == {"vadd": 2, "vector_load": 1, "vshll": 1}
    assert kernel["loop_ops"] == {"vadd": 1, "vshll": 1}


def test_the_op_profile_the_chip_s_benches_take_adds_up():
    """`_common.op_profile` (tpu_costs' and threefry's `--profile`, read on the chip): the
    compiled program's ops under JAX's profiler, per call; the kinds add up to the total, and
    a program of more ops shows more."""
    import _common
    x = jnp.ones((256, 256), jnp.float32)
    once = jax.jit(lambda x: jnp.sin(x) @ x)
    twice = jax.jit(lambda x: jnp.sin(jnp.sin(x) @ x) @ x)
    a, b = _common.op_profile(lambda: once(x)), _common.op_profile(lambda: twice(x))
    for p in (a, b):
        assert p["total_ms"] > 0 and p["top"], p
        assert abs(sum(p["by_kind"].values()) - p["total_ms"]) <= 1e-3 * max(p["total_ms"], 1)
        assert all(ms >= 0 and n >= 1 for _, ms, n, _ in p["top"])
    assert len(b["top"]) > len(a["top"])


def test_the_dump_bench_packs_what_a_device_call_brings_back(tmp_path):
    """`tpu_dump.pack`: libtpu's dump of a program as one archive under the size a device call
    brings back, the LLO files first where all of it does not fit, and a manifest of all."""
    import tarfile

    import tpu_dump
    dump = tmp_path / "jf"
    (dump / "sub").mkdir(parents=True)
    (dump / "sub" / "kernel-llo-final.txt").write_text("bundle { vadd.s32 }\n" * 50)
    (dump / "notes.txt").write_text("x" * 1000)
    (dump / "blob.bin").write_bytes(np.random.default_rng(0).bytes(300_000))  # incompressible
    dest = str(tmp_path / "bundles-k.tar.xz")
    everything = tpu_dump.pack(str(dump), dest, limit=1 << 20)
    assert everything == dict(files=3, packed=3, bytes=os.path.getsize(dest))
    some = tpu_dump.pack(str(dump), dest, limit=100_000)
    assert some["files"] == 3 and some["packed"] == 2 and some["bytes"] <= 100_000
    with tarfile.open(dest) as tar:
        assert sorted(tar.getnames()) == ["notes.txt", "sub/kernel-llo-final.txt"]
    with open(dest + ".manifest.txt") as fh:
        manifest = fh.read().split()
    assert manifest[1::2] == ["blob.bin", "notes.txt", "sub/kernel-llo-final.txt"]


def test_the_chip_s_reroll_rows_run_on_any_host(monkeypatch):
    """bench/tpu_costs.py's reroll section (issue 46, run on the chip) at its quick size here:
    a row per form, each form's loss jax.jit's (within 1e-5), the hand scan's loop in its
    module, and with --profile each form's ops."""
    import tpu_costs
    monkeypatch.setattr(tpu_costs, "ROWS", [])
    monkeypatch.setattr(tpu_costs, "PROFILE", [True])
    monkeypatch.delenv("OUT", raising=False)
    tpu_costs.reroll(quick=True)
    rows = {r["form"]: r for r in tpu_costs.ROWS}
    assert {"jit", "jit, layers in lax.scan by hand", "optimize reroll=True",
            "optimize reroll=True, recompute only"} <= set(rows)
    assert all(r["loss_rel"] <= 1e-5 and r["run_ratio"] > 0 for r in rows.values()), rows
    assert rows["jit, layers in lax.scan by hand"]["hlo"].get("loop:fusion", 0) > 0
    assert all(r["profile"]["total_ms"] > 0 for r in rows.values())


_FAKE_BUNDLES = """\
     0   :  { %s1 = smov 0 }
   0x1 LB: > { %v2 = vadd.s32 %v1, %v1 ;; %p1 = scmp.ge.s32.totalorder %s1, 3 /* loop exit test */ }
   0x2   : > { %v3 = vxor.u32 %v2, %v2 }
   0x3 LB: >> { %v4 = vshll.u32 %v3, 7 ;; %v5 = vshrl.u32 %v3, 25 ;; %p2 = scmp.ge.s32.totalorder %s2, 5 /* loop exit test */ }
   0x4   :  {}
   0x5   : >> { %v6 = vor.u32 %v4, %v5 ;; %7 = vst [vmem:[#a]] %v6 }
   0x6   : > { %8 = vsyncadd [#b], 1 }
   0x7 LB: > { %v9 = vadd.s32 %v6, %v6 ;; %p3 = scmp.ge.s32.totalorder %s3, 2 /* loop exit test */ }
   0x8   :  { %s10 = smov 1 }
"""


def test_the_bundle_counter_multiplies_each_bundle_by_its_loops_trips(tmp_path):
    """bench/tpu_aot.py's reading of libtpu's final bundles (a made-up dump of its form): a loop
    of 3 trips holding one of 5, then a loop of 2; an empty bundle keeps its loop's depth."""
    import tpu_aot
    path = tmp_path / "1-k-66-final_bundles.txt"
    path.write_text(_FAKE_BUNDLES)
    got = tpu_aot.bundles(str(path))
    # 0, 8: once; 1, 2, 6: 3 times; 3, 4, 5: 15 times; 7: twice
    assert (got["bundles"], got["dynamic"], got["loops"]) == (9, 2 + 9 + 45 + 2, [3, 5, 2])
    assert got["loop_ops"]["vadd"] == 2 and "vst" in got["loop_ops"]
    assert got["valu_per_loop_bundle"] == round(6 / 7, 2)    # (vst and vsyncadd are not ALU)


@_NO_TPU_HOST
def test_the_deviceless_bundle_bench_reads_xla_s_threefry_loop(tmp_path):
    """`bench/tpu_aot.py` on JAX's Threefry draw by jax.jit (524,288 words): the key's words and
    the draw, whose loop keeps the VALU near its 4 slots, the dynamic count above the static
    one. (At 65,536 words XLA emits no loop: straight-line bundles.)"""
    import tpu_aot
    (row,) = tpu_aot.main(["threefry_jit", "--n", "8192", "--out", str(tmp_path)])
    assert row["launches"] == {"fusion": 2}, row        # (the key's words, then the draw)
    (draw,) = [p for p in row["parts"].values() if p["loops"]]
    assert draw["dynamic"] > draw["bundles"] and 3.0 < draw["valu_per_loop_bundle"] <= 4.0
    assert (tmp_path / "tpu_aot.json").exists()


@_DEVICELESS
def test_the_author_s_state_in_place_is_the_program_s_only_launch():
    """Compiled for a TPU v5e here: the pass's kernel, reading and writing the author's
    (N, 4, 4) state in place, is the program's only launch, as the hand-made kernel that does
    the same (`tpu_dump._native`); on 16 pieces (`kernel_in_place=False`) XLA relayouts the
    state before and after it (five launches more at 1,048,576 blocks: 650K of 1.23M bundles)."""
    import tpu_dump
    spec = jax.ShapeDtypeStruct((1 << 16, 4, 4), np.uint32)
    native = _xla.launches(_xla.tpu_compile(tpu_dump.build("hand_native", 1 << 16)[0], spec))
    assert native == {"custom-call": 1}
    jax.clear_caches()        # (optimize's rewrite is cached per program, not per cost row)
    author = _xla.launches(_xla.tpu_compile(tpu_dump.build("author", 1 << 16)[0], spec))
    assert author == {"custom-call": 1}, author
    jax.clear_caches()
    with cost.override_row("tpu", kernel_in_place=False):
        pieces = _xla.launches(_xla.tpu_compile(tpu_dump.build("author", 1 << 16)[0], spec))
    jax.clear_caches()
    assert pieces["custom-call"] == 1 and sum(pieces.values()) > 1, pieces


@_NO_TPU_HOST
def test_the_deviceless_bench_compiles_an_accelerator_group(tmp_path):
    """`bench/tpu_aot.py acc:salsa:opt`: the accelerator bench's Salsa20/8 programs compiled
    for a TPU v5e here with the TPU's defaults; at 65,536 blocks the kernel reads and writes
    the state in place (fewer launches than on pieces)."""
    import tpu_aot
    rows = tpu_aot.main(["acc:salsa:opt", "acc:salsa:pieces", "--out", str(tmp_path)])
    opt, pieces = ({c["size"]: c["launches"] for c in r["cases"]} for r in rows)
    assert opt[65536] < pieces[65536] and opt[4096] == pieces[4096]
    assert (tmp_path / "tpu_aot_accelerator.json").exists()


@_DEVICELESS
def test_the_never_worse_sweep_compiles_for_the_tpu_without_one(tmp_path):
    """`never_worse_sweep.py --compile-only`: generated programs compiled for a TPU v5e here,
    jax.jit, its A/A and optimize (the TPU's decisions); a line each, resumable."""
    import never_worse_sweep as nws
    args = ["--out", str(tmp_path), "--compile-only", "--sizes", "4096", "--n", "2",
            "--budget", "300"]
    assert nws.main(args) == 0
    rows = nws.load(str(tmp_path / nws.COMPILE_FILE))
    compiled = [r for r in rows if r["kind"] == "compiled"]
    assert len(compiled) == 2 and not [r for r in rows if r["kind"] == "error"]
    for r in compiled:
        assert set(r["compile_s"]) == {"jit", "aa", "opt"} and r["compile"] > 0
        assert r["launches"]["jit"] >= 1 and isinstance(r["same"], bool)
    assert nws.main(args + ["--resume"]) == 0       # (nothing left: nothing added)
    assert len([r for r in nws.load(str(tmp_path / nws.COMPILE_FILE))
                if r["kind"] == "compiled"]) == 2
