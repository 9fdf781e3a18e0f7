"""Static gathers/scatters/dynamic slices become structural forms, bit-exact with jax.jit."""
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from jax import lax

import jaxrewrite
from jaxrewrite import _walk
from jaxrewrite.testing import assert_equivalent, primitive_counts

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # any pytest import mode
from test_indexmap import gathers as gather_cases  # noqa: E402

# The CPU's row of the gathers pass, on any host: which structural forms the TPU takes is its
# cost row's (it keeps a rev of more than 2 elements, and a reshape that pads its (8, 128)
# tiles, as gathers: bench/tpu_costs.py), kept by tests/test_tpu.py. The programs still run on
# the default backend, bit for bit against jax.jit.
pytestmark = pytest.mark.default_target("cpu")

# The passes this area owns, alone (other areas' passes are tested in their own files).
OPTS = dict(movement=False, scalarize=False)
STRUCTURAL = {"slice", "rev", "transpose", "reshape", "broadcast_in_dim", "select_n", "jit",
              "squeeze", "expand_dims"}

X = np.arange(16.0, dtype=np.float32).reshape(4, 4)
PERM = np.array([3, 2, 1, 0])


def _counts(fn, *args, **opts):
    return primitive_counts(jaxrewrite.rewrite_jaxpr(jax.make_jaxpr(fn)(*args), **OPTS, **opts))


def _rewritten(fn, *args, **opts):
    cj = assert_equivalent(fn, *args, **OPTS, **opts, bitwise=True)
    return primitive_counts(cj)


STATIC_FORMS = {
    "x[np_idx]": lambda x: x[PERM],
    "x[:, np_idx]": lambda x: x[:, PERM],
    "x[a, b]": lambda x: x[np.arange(4)[:, None], np.arange(4)[None, ::-1]],
    "x[i, i] diagonal": lambda x: x[np.arange(4), np.arange(4)],
    "transpose as fancy indexing": lambda x: x[np.arange(4)[None, :], np.arange(4)[:, None]],
    "take clip": lambda x: jnp.take(x, np.array([1, 2, 9]), axis=1, mode="clip"),
    "take fill": lambda x: jnp.take(x, np.array([0, 1, 9]), axis=1, mode="fill", fill_value=-3.0),
    "take default": lambda x: jnp.take(x, np.array([-1, -2]), axis=0),
    "take_along_axis": lambda x: jnp.take_along_axis(x, np.tile(PERM, (4, 1)), axis=1),
    "ravel-perm-reshape": lambda x: x.ravel()[np.arange(16).reshape(4, 4).T.ravel()].reshape(4, 4),
    "fft bit reversal": lambda x: x.ravel()[np.array([int(f"{i:04b}"[::-1], 2) for i in range(16)])],
    "broadcast rows": lambda x: x[np.array([1, 1, 1])],
    "strided": lambda x: x[:, np.array([0, 2])],
    "lax.gather explicit": lambda x: lax.gather(
        x, np.array([[1], [2]]), lax.GatherDimensionNumbers((1,), (0,), (0,)), (1, 4),
        mode="promise_in_bounds"),
    "dynamic_slice vmap": lambda x: jax.vmap(lambda r: lax.dynamic_slice(r, (1,), (2,)))(x),
    "dynamic_slice clamped": lambda x: lax.dynamic_slice(x, (3, -9), (2, 2)),
    "dynamic_update_slice": lambda x: lax.dynamic_update_slice(x, x[:2, :2] * 2.0, (1, 2)),
    "dynamic_update_slice clamped": lambda x: lax.dynamic_update_slice(x, x[:1] * 2.0, (5, 0)),
    "at[slice, i].set": lambda x: x.at[1:3, 2].set(7.0),
    "at.set": lambda x: x.at[np.array([0, 2])].set(x[:2] * 2.0),
    "at.add int": lambda x: x.astype(np.int32).at[np.array([3, 1])].add(x[:2].astype(np.int32)),
    "at.mul int": lambda x: x.astype(np.int32).at[:, np.array([1])].multiply(3),
    "at.min int": lambda x: x.astype(np.int32).at[np.array([2])].min(3),
    "at.max int": lambda x: x.astype(np.int32).at[np.array([2, 0])].max(7),
}


# Static updates take the select form where the target's cost row says so (the GPU); the CPU
# keeps them in place (`test_updates_stay_in_place_on_the_cpu`). The form is checked here, on the
# GPU row, run on this host.
UPDATE_FORMS = {name for name in STATIC_FORMS if name.startswith("at") or "update" in name}
SELECT = dict(target="gpu")


@pytest.mark.parametrize("name", sorted(STATIC_FORMS))
def test_static_forms_are_rewritten(name):
    counts = _rewritten(STATIC_FORMS[name], X, **(SELECT if name in UPDATE_FORMS else {}))
    assert not {"gather", "scatter", "scatter-add", "scatter-mul", "scatter-min", "scatter-max",
                "dynamic_slice", "dynamic_update_slice", "concatenate", "pad"} & set(counts), counts


NEEDS_CONCAT = {
    "roll": lambda x: x[np.roll(np.arange(4), 1)],
    "per-row rotation": lambda x: jnp.take_along_axis(
        x, (np.arange(4)[None, :] + np.arange(4)[:, None]) % 4, axis=1),
    "diagonals to columns": lambda x: x[(np.arange(4)[:, None] + np.arange(4)[None, :]) % 4,
                                        np.arange(4)[None, :]],
}


@pytest.mark.parametrize("name", sorted(NEEDS_CONCAT))
def test_concatenate_forms_only_with_all(name):
    fn = NEEDS_CONCAT[name]
    default = _rewritten(fn, X)
    before = primitive_counts(jax.make_jaxpr(fn)(X))
    assert default.get("gather") == 1
    assert default.get("concatenate", 0) == before.get("concatenate", 0)   # none added
    report = jaxrewrite.rewrite_jaxpr_with_report(jax.make_jaxpr(fn)(X), **OPTS).report
    assert any("concatenate" in (e.reason or "") for e in report.declines)
    allowed = _rewritten(fn, X, gathers="all")
    assert "gather" not in allowed and allowed.get("concatenate", 0) >= 1


def test_dynamic_indices_are_left_alone():
    def f(x, i):
        return x[i] + jnp.take(x, i, axis=1, mode="clip") + x.at[i].add(1.0)

    i = np.array([2, 0, 1, 3], np.int32)
    counts = _rewritten(f, X, i)
    assert counts.get("gather") == 2 and counts.get("scatter-add") == 1


def test_promise_in_bounds_out_of_range_keeps_the_gather():
    def f(x):
        return lax.gather(x, np.array([[7]]), lax.GatherDimensionNumbers((1,), (0,), (0,)),
                          (1, 4), mode="promise_in_bounds")

    res = jaxrewrite.rewrite_jaxpr_with_report(jax.make_jaxpr(f)(X), **OPTS)
    assert primitive_counts(res.jaxpr).get("gather") == 1
    assert any("implementation-defined" in (e.reason or "") for e in res.report.declines)


def test_scatter_duplicates():
    dup = np.array([1, 1, 2])
    # set with duplicates: order-dependent, declined.
    assert _counts(lambda x: x.at[dup].set(x[:3]), X, **SELECT).get("scatter") == 1
    # float add with duplicates: rounding depends on order, declined.
    assert _counts(lambda x: x.at[dup].add(x[:3]), X, **SELECT).get("scatter-add") == 1
    # integer add / max with duplicates: exact in any order, rewritten.
    xi = np.arange(16, dtype=np.int32).reshape(4, 4)
    assert "scatter-add" not in _rewritten(lambda x: x.at[dup].add(x[:3]), xi, **SELECT)
    assert "scatter-max" not in _rewritten(lambda x: x.at[dup].max(x[:3]), xi, **SELECT)
    # float min/max: JAX's own gradient rule, kept; float mul too (see _updates.SCATTERS).
    assert _counts(lambda x: x.at[np.array([2])].min(x[:1]), X, **SELECT).get("scatter-min") == 1
    assert _counts(lambda x: x.at[np.array([2])].multiply(2.0), X,
                   **SELECT).get("scatter-mul") == 1


@pytest.mark.parametrize("dtype", ["bool", "int4", "uint8", "int8", "bfloat16", "float16",
                                   "complex64", "int32"])
def test_operand_dtypes(dtype):
    x = (np.arange(16).reshape(4, 4) % 5).astype(jnp.dtype(dtype))
    counts = _rewritten(lambda x: (x[PERM], jnp.take(x, np.array([1, 7]), axis=1, mode="fill"),
                                   x[np.arange(4), np.arange(4)]), x)
    assert "gather" not in counts


def test_prng_key_operands():
    keys = jax.random.split(jax.random.key(0), 4)
    counts = _rewritten(lambda k: jax.random.key_data(k[PERM]), keys)
    assert "gather" not in counts


def test_empty_operands_and_indices():
    e = np.zeros((0, 3), np.float32)
    _rewritten(lambda x: x[np.zeros((0,), np.int32)], X)
    _rewritten(lambda x: jnp.take(x, np.array([], np.int32), axis=1), e)


@pytest.mark.parametrize("where", ["scan", "cond", "while", "vmap", "custom_jvp", "jit"])
def test_inside_control_flow(where):
    @jax.custom_jvp
    def cj_fn(x):
        return x[PERM]

    cj_fn.defjvp(lambda p, t: (cj_fn(p[0]), t[0][PERM]))
    inner = jax.jit(lambda x: jax.jit(lambda y: y[:, PERM])(x))

    def f(x):
        if where == "scan":
            return lax.scan(lambda c, _: (c[PERM] * 2.0, None), x, None, length=3)[0]
        if where == "cond":
            return lax.cond(x[0, 0] > 0, lambda y: y[PERM], lambda y: y, x)
        if where == "while":
            return lax.while_loop(lambda c: c[1] < 2, lambda c: (c[0][PERM], c[1] + 1), (x, 0))[0]
        if where == "vmap":
            return jax.vmap(lambda r: r[PERM])(x)
        if where == "custom_jvp":
            return cj_fn(x)
        return inner(x)

    counts = _rewritten(f, X, grad=where != "while")
    assert "gather" not in counts


def test_x64_indices():
    with jax.enable_x64(True):
        x = np.arange(16.0).reshape(4, 4)
        idx = np.array([3, 2, 1, 0], np.int64)
        counts = _rewritten(lambda x: (x[idx], jnp.take(x, idx, axis=1, mode="fill"),
                                       x.at[idx].set(x)), x, **SELECT)
        assert not {"gather", "scatter"} & set(counts)


def test_idempotent():
    cj = jaxrewrite.rewrite_jaxpr(jax.make_jaxpr(STATIC_FORMS["x[:, np_idx]"])(X), **OPTS)
    again = jaxrewrite.rewrite_jaxpr(cj, **OPTS)
    assert primitive_counts(again) == primitive_counts(cj)


def test_gathers_off():
    assert _counts(STATIC_FORMS["x[np_idx]"], X, gathers=False).get("gather") == 1


def test_mask_permutation_integer():
    m = np.eye(4, dtype=np.int32)[PERM]  # one 1 per column

    def f(x):
        return x @ m, jnp.sum(x[:, :, None] * m[None], axis=1)

    xi = np.arange(16, dtype=np.int32).reshape(4, 4)
    counts = _rewritten(f, xi)
    assert not {"dot_general", "reduce_sum", "gather"} & set(counts), counts
    # floats: 0 * inf is NaN, left alone.
    assert _counts(lambda x: x @ m.astype(np.float32), X).get("dot_general") == 1


@settings(max_examples=max(15, settings.default.max_examples))
@given(gather_cases(max_rank=3), st.sampled_from(["clip", "fill", "promise_in_bounds"]),
       st.sampled_from([None, 0.5, -np.inf]), st.sampled_from([True, "all"]))
def test_random_gathers_exact(g, mode, fill, option):
    shape, idx, dn, sizes = g

    def f(x):
        return lax.gather(x, idx, dn, sizes, mode=mode, fill_value=fill)

    x = np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape) - 3.5
    counts = _rewritten(f, x, gathers=option)
    if option is True:  # the default never adds a concatenate or a pad
        assert not {"concatenate", "pad"} & set(counts), counts
    # Every static gather is either rewritten or declined with a reason.
    report = jaxrewrite.rewrite_jaxpr_with_report(jax.make_jaxpr(f)(x), gathers=option, **OPTS).report
    if counts.get("gather"):
        assert report.declines and all(e.reason for e in report.declines)
    else:
        assert report.counts["gathers.applied"] >= 1


def test_no_structural_regressions_in_walk():
    cj = jaxrewrite.rewrite_jaxpr(jax.make_jaxpr(STATIC_FORMS["take fill"])(X), **OPTS)
    names = {e.primitive.name for e in _walk.iter_eqns(cj)}
    assert names <= STRUCTURAL, names


SCATTER_OPS = {"set": "set", "add": "add", "mul": "multiply", "min": "min", "max": "max"}


@settings(max_examples=max(10, settings.default.max_examples // 2))
@given(st.lists(st.integers(-8, 8), min_size=0, max_size=5), st.sampled_from(sorted(SCATTER_OPS)),
       st.sampled_from(["clip", "drop", "promise_in_bounds"]), st.sampled_from(["int32", "float32"]))
def test_random_static_scatters_exact(idx, op, mode, dtype):
    idx = np.array(idx, np.int32)
    x = (np.arange(18).reshape(6, 3) - 4).astype(dtype)

    def f(x):
        upd = jnp.ones((len(idx), 3), x.dtype) * 3
        return getattr(x.at[idx], SCATTER_OPS[op])(upd, mode=mode)

    cj = assert_equivalent(f, x, **OPTS, bitwise=True)
    report = jaxrewrite.rewrite_jaxpr_with_report(jax.make_jaxpr(f)(x), **OPTS).report
    left = {k for k in primitive_counts(cj) if k.startswith("scatter")}
    assert not left or (report.declines and all(e.reason for e in report.declines))


def test_every_pass_output_type_checks():
    # check_jaxpr after every pass (debug_checks), errors re-raised (strict), rewrite only.
    for name, fn in sorted({**STATIC_FORMS, **NEEDS_CONCAT}.items()):
        for option in (True, "all"):
            cj = jaxrewrite.rewrite_jaxpr(jax.make_jaxpr(fn)(X), gathers=option, debug_checks=True,
                                          strict=True, **OPTS)
            again = jaxrewrite.rewrite_jaxpr(cj, gathers=option, **OPTS)
            assert primitive_counts(again) == primitive_counts(cj), name


def test_indices_built_from_iota():
    # jnp.arange is an iota: large, so folding keeps it as an equation, but an index operand
    # derived from it is still materialized for the gathers pass.
    x = np.arange(200.0, dtype=np.float32)
    counts = _rewritten(lambda x: x[jnp.arange(200)[::-1]] + x[jnp.arange(0, 200, 2)].sum(), x)
    assert "gather" not in counts and counts.get("rev") == 1


def test_inside_shard_map():
    from jax.sharding import PartitionSpec as P
    mesh = jax.make_mesh((1,), ("i",), axis_types=(jax.sharding.AxisType.Auto,))

    def f(x):
        body = lambda v: jnp.take(v, np.arange(4)[::-1].copy(), axis=-1) * 2  # noqa: E731
        return jax.shard_map(body, mesh=mesh, in_specs=P("i"), out_specs=P("i"))(x)

    counts = _rewritten(f, jnp.arange(8.0).reshape(2, 4), vmap=False)
    assert "gather" not in counts


def test_float_scatter_add_is_kept_exact():
    # Floating scatter-add stays a scatter (XLA:CPU compiled the select form an ulp apart, see
    # tests/test_regressions.py); results and gradients stay jax.jit's.
    def f(x):
        y = x.at[np.array([2, 3])].add(x[:2])
        return (x[::-1] * y * 1000).sum() * y

    x = jnp.asarray(np.random.RandomState(21).uniform(-2, 2, (4,)), jnp.float32)
    assert "scatter-add" in _rewritten(f, x)
    signed = np.array([-0.0, 0.0, np.nan, -np.inf], np.float32)
    _rewritten(lambda x: x.at[np.array([1, 2])].add(x[:2]), signed)


# --- vmapped gathers: the batch dims every window takes whole pass through ------------------------

ROWS = np.arange(256 * 8, dtype=np.float32).reshape(256, 8) - 1000.5
REV8 = np.arange(8)[::-1].copy()

BATCHED_FORMS = {
    "vmap take": lambda x: jax.vmap(lambda r: jnp.take(r, REV8))(x),
    "vmap take, batch in and out at dim 1": lambda x: jax.vmap(
        lambda r: r[REV8[:4]], in_axes=1, out_axes=1)(x.T),
    "vmap take fill": lambda x: jax.vmap(
        lambda r: jnp.take(r, np.array([0, 1, 9]), mode="fill", fill_value=-2.0))(x),
    "two batch dims": lambda x: jax.vmap(jax.vmap(lambda r: r[REV8[:2]]))(x.reshape(16, 16, 8)),
}


@pytest.mark.parametrize("name", sorted(BATCHED_FORMS))
def test_batched_static_gather_passes_the_batch_through(name):
    fn = BATCHED_FORMS[name]
    assert "gather" in primitive_counts(jax.make_jaxpr(fn)(ROWS)), "a gather before the rewrite"
    counts = _rewritten(fn, ROWS)
    assert "gather" not in counts
    assert set(counts) <= STRUCTURAL | {"concatenate", "broadcast_in_dim", "select_n"}


def test_batched_gather_map_is_the_size_of_one_window(map_sizes):
    """65,536 rows of a 16-word permutation: the index map analysed is one row's (16 entries),
    not 1M (the analysis of a 1M-entry map took a second of ChaCha20's compile)."""
    sizes = map_sizes("gather_map")
    x = jnp.arange(65536 * 16, dtype=jnp.uint32).reshape(65536, 16)
    perm = np.array([1, 2, 3, 0, 6, 7, 4, 5, 11, 8, 9, 10, 12, 13, 14, 15])
    fn = jax.vmap(lambda r: r[perm])
    jaxrewrite.rewrite_jaxpr(jax.make_jaxpr(fn)(x), **OPTS)
    assert sizes and max(sizes) == 16


def test_static_scatter_concatenate_form_is_the_gpu_default_only():
    """GPU row of the cost model: a static scatter becomes a select over a small concatenate
    (H200: 2 kernels -> 1, tests/test_kernels_gpu.py); the CPU keeps the scatter."""
    fn = lambda x: x.at[:, np.array([1, 5, 9])].set(-0.0)  # noqa: E731
    x = np.arange(64.0, dtype=np.float32).reshape(4, 16)
    gpu = _rewritten(fn, x, target="gpu")
    assert "scatter" not in gpu and gpu.get("concatenate", 0) == 1
    assert "scatter" in _counts(fn, x, target="cpu")


def test_gathers_all_searches_no_concatenate_for_a_large_vmapped_gather():
    """Concatenate forms are searched up to `SPLIT_MAX_ELEMENTS` of the whole gather, batch
    included (a large batch of concatenates costs more kernels than it saves)."""
    from jaxrewrite.analysis import indexmap as _indexmap
    rot = np.array([1, 2, 3, 0])
    fn = jax.vmap(lambda r: r[rot])
    small = np.zeros((16, 4), np.float32)
    big = np.zeros((_indexmap.SPLIT_MAX_ELEMENTS // 4 + 64, 4), np.float32)
    assert "concatenate" in _counts(fn, small, gathers="all")
    counts = _counts(fn, big, gathers="all")
    assert "concatenate" not in counts and "gather" in counts


def test_large_vmapped_gather_decline_says_why():
    """gathers='all' past SPLIT_MAX_ELEMENTS: the decline names the size limit, not the option
    that is already on."""
    from jaxrewrite.analysis import indexmap as _indexmap
    fn = jax.vmap(lambda r: r[np.array([1, 2, 3, 0])])
    big = np.zeros((_indexmap.SPLIT_MAX_ELEMENTS // 4 + 64, 4), np.float32)
    for options in ({"gathers": "all"}, {}):
        res = jaxrewrite.rewrite_jaxpr_with_report(jax.make_jaxpr(fn)(big), **OPTS, **options)
        reasons = [d.reason for d in res.report.declines if d.pass_name == "gathers"]
        assert primitive_counts(res.jaxpr).get("gather") == 1
        assert reasons and all(str(_indexmap.SPLIT_MAX_ELEMENTS) in r and "allows it" not in r
                               for r in reasons), reasons
    # below the limit, without gathers='all', the option is what would allow it
    res = jaxrewrite.rewrite_jaxpr_with_report(jax.make_jaxpr(fn)(big[:16]), **OPTS)
    assert any("gathers='all' allows it" in d.reason for d in res.report.declines)


def test_repeated_gathers_trace_their_form_once_and_jax_clear_caches_clears_it():
    """A form emitted many times (a circuit's gates, an unrolled loop) is traced once
    (`Emitter.call_shared`), and `jax.clear_caches()` clears those traces: a compile timed after
    it is cold for the rewrite too. The batch dims pass through without tracing `vmap`."""
    xs = np.arange(8 * 16.0, dtype=np.float32).reshape(8, 16)

    def f(x):
        y = x
        for _ in range(6):
            y = jax.vmap(lambda r: r[np.arange(15, -1, -1)])(y) * 2.0
        return y

    jax.clear_caches()
    assert _walk._traced.cache_info().currsize == 0
    counts = _rewritten(f, xs)
    assert "gather" not in counts and counts["rev"] == 6
    info = _walk._traced.cache_info()
    assert info.currsize == 1 and info.hits >= 5
    jax.clear_caches()
    assert _walk._traced.cache_info().currsize == 0


def test_shared_forms_keep_each_fill_value_bit_for_bit():
    """Forms traced once are keyed by the fill value's bits: -0.0 and 0.0 (equal as floats, one
    hash) are two forms. Found in review: the -0.0 gather reused the 0.0 gather's trace."""
    idx = np.array([3, 9, 1, 12])[:, None]     # 9 and 12 out of bounds: filled
    dn = lax.GatherDimensionNumbers(offset_dims=(), collapsed_slice_dims=(0,),
                                    start_index_map=(0,))
    x = np.arange(8.0, dtype=np.float32)
    for fill in (0.0, -0.0, np.nan, 0.0):
        f = lambda v, fill=fill: lax.gather(  # noqa: E731
            v, idx, dn, (1,), mode=lax.GatherScatterMode.FILL_OR_DROP, fill_value=fill)
        counts = _rewritten(f, x, vmap=False)  # bit for bit with jax.jit, -0.0 included
        assert "gather" not in counts
