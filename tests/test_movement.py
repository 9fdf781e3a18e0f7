"""Data-movement algebra (passes/movement.py): exact, and the chains really cancel."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import jaxrewrite
from jaxrewrite._options import Options
from jaxrewrite.testing import assert_equivalent, primitive_counts

X = jnp.arange(24.0).reshape(4, 6)

# (function, primitives that must be gone after optimize)
CASES = {
    "index_of_array_literal": (lambda x: jnp.array([x[0] * 2, x[1], x[2], x[3]])[2],
                               ("concatenate", "broadcast_in_dim", "mul")),
    "index_of_stack": (lambda x: jnp.stack([x[0], x[1]])[0] + 1, ("stack",)),
    "adjacent_slices": (lambda x: jnp.concatenate([x[:, :2], x[:, 2:5], x[:, 5:]], 1) * 2,
                        ("slice", "concatenate")),
    "adjacent_slices_part": (lambda x: jnp.concatenate([x[1:, :2], x[1:, 2:4]], 1),
                             ("concatenate",)),
    "slice_of_concatenate": (lambda x: jnp.concatenate([x, x * 2], 0)[5:7], ("concatenate",)),
    "rev_rev": (lambda x: lax.rev(lax.rev(x, (0, 1)), (0, 1)) + 1, ("rev",)),
    "transpose_inverse": (lambda x: x.T.T + 1, ("transpose",)),
    "reshape_chain": (lambda x: x.reshape(2, 12).reshape(24).reshape(4, 6) - 1, ("reshape",)),
    "push_slice_through_add": (lambda x: (jnp.concatenate([x, x * 2], 0) + 1.0)[5:7],
                               ("concatenate",)),
    "push_transpose_through_mul": (lambda x: (x.T * 2.0).T - x, ("transpose",)),
    "push_through_select": (lambda x: lax.select(x.T > 3, x.T, (x * 2).T).T, ("transpose",)),
    "push_through_max": (lambda x: jnp.maximum(x.T, 3.0).T, ("transpose",)),
    "unstack_of_stack": (lambda x: lax.unstack(lax.stack([x[0], x[1]], 0), 0)[1] * 3,
                         ("stack", "unstack")),
    "transpose_of_stack": (lambda x: jnp.stack([x[i] * 2 for i in range(4)], axis=1).T,
                           ("transpose",)),
    # rows replaced at static indices, then the rows taken apart: renaming
    "unstack_of_scatter": (lambda x: lax.unstack(x.at[np.array([3, 1])].set(
        jnp.stack([x[0] * 2, x[2]])), 0)[1] * 3, ("scatter",)),
    "transpose_of_split_stack": (
        lambda x: jnp.stack([x[i] * 2 for i in range(4)], axis=1).reshape(6, 2, 2)
        .transpose(1, 2, 0), ("transpose",)),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_exact_and_cancels(name):
    fn, gone = CASES[name]
    cj = assert_equivalent(fn, X, scalarize=False, strict=True, debug_checks=True, bitwise=True)
    counts = primitive_counts(cj)
    for p in gone:
        assert p not in counts, (name, counts)


def test_partial_rev_keeps_the_difference():
    fn = lambda x: lax.rev(lax.rev(x, (0, 1)), (1,))  # noqa: E731
    cj = assert_equivalent(fn, X, strict=True, bitwise=True)
    assert primitive_counts(cj).get("rev") == 1


@pytest.mark.parametrize("name", sorted(CASES))
def test_idempotent(name):
    fn, _ = CASES[name]
    once = jaxrewrite.rewrite_jaxpr(jax.make_jaxpr(fn)(X), scalarize=False)
    twice = jaxrewrite.rewrite_jaxpr(once, scalarize=False)
    assert primitive_counts(once) == primitive_counts(twice)


def test_off_leaves_it():
    fn = CASES["transpose_inverse"][0]
    cj = jaxrewrite.rewrite_jaxpr(jax.make_jaxpr(fn)(X), movement=False, scalarize=False)
    assert primitive_counts(cj).get("transpose") == 2


def test_inside_scan_and_vmap():
    def f(x):
        def body(c, _):
            c = jnp.concatenate([c[:2], c[2:]], 0).T.T * 2
            return c, c[0]
        return lax.scan(body, x, None, length=3)
    cj = assert_equivalent(f, X, strict=True, bitwise=True)
    assert "concatenate" not in primitive_counts(cj)
    np.testing.assert_array_equal(jax.vmap(jaxrewrite.optimize(f))(jnp.stack([X, X]))[0],
                                  jax.vmap(jax.jit(f))(jnp.stack([X, X]))[0])


def test_no_push_when_the_elementwise_result_is_used_twice():
    def fn(x):
        y = x.T * 2.0
        return y.T, y
    cj = assert_equivalent(fn, X, strict=True, bitwise=True)
    assert primitive_counts(cj).get("mul") == 1  # never computed twice


def test_a_transpose_that_reorders_the_pieces_dims_is_kept():
    """Only the stacked axis may move: a transpose of the pieces' own dims stays."""
    fn = lambda x: jnp.stack([x * 2, x * 3], axis=0).transpose(0, 2, 1)  # noqa: E731
    cj = assert_equivalent(fn, X, scalarize=False, strict=True, bitwise=True)
    assert primitive_counts(cj).get("transpose") == 1


def _vmapped_word_major():
    def inner(s):  # a (4, 4) state's words, one by one, re-stacked; vmapped over the last axis
        w = s.reshape(16)
        return jnp.stack([w[i] * 3 for i in range(16)]).reshape(4, 4) + s
    return jax.vmap(jax.jit(inner), in_axes=2, out_axes=2)


def test_a_call_vmapped_with_out_axes_returns_the_caller_s_layout():
    """vmap puts the batch axis first inside the call and transposes its result after; the
    transpose moves into the call, where it cancels: the call returns (4, 4, N) itself."""
    f = _vmapped_word_major()
    x = jnp.arange(4 * 4 * 256, dtype=jnp.float32).reshape(4, 4, 256) - 100.0
    assert primitive_counts(jax.make_jaxpr(f)(x))["transpose"] > 1
    cj = assert_equivalent(f, x, scalarize=False, strict=True, bitwise=True)
    top = [e.primitive.name for e in cj.jaxpr.eqns]
    assert top == ["jit"], top
    assert cj.jaxpr.eqns[0].outvars[0].aval.shape == (4, 4, 256)
    # the stack of the words is made in the caller's layout; what is left is the input's side
    assert primitive_counts(cj)["transpose"] == 1


def test_a_transpose_that_does_not_cancel_in_the_call_stays_outside():
    f = jax.vmap(jax.jit(lambda s: jnp.sin(s) + 1.0), in_axes=0, out_axes=1)
    x = jnp.arange(24.0).reshape(4, 6)
    assert [e.primitive.name for e in jax.make_jaxpr(f)(x).jaxpr.eqns][-1] == "transpose"
    cj = assert_equivalent(f, x, scalarize=False, strict=True, bitwise=True)
    assert [e.primitive.name for e in cj.jaxpr.eqns][-1] == "transpose"


@pytest.mark.parametrize("name,fn", [
    ("a row written twice", lambda x: lax.unstack(x.at[np.array([1, 1])].set(x[:2] * 2), 0)),
    ("part of a row", lambda x: lax.unstack(x.at[1, :3].set(x[0, :3] * 2), 0)),
    ("scatter-add", lambda x: lax.unstack(x.at[np.array([0, 2])].add(x[:2]), 0)),
])
def test_a_scatter_that_is_not_whole_rows_once_stays(name, fn):
    """What XLA leaves undefined (a row written twice), a row written in part, and a scatter
    that computes are not renaming: the unstack stays, reading what the scatter made, and the
    result is jax.jit's. (Where the target is the TPU, the gathers pass makes the part of a row
    a select, its own rule; the CPU keeps the scatter.)"""
    cj = assert_equivalent(fn, X, scalarize=False, strict=True, bitwise=name != "a row written twice")
    counts = primitive_counts(cj)
    assert counts.get("unstack") == 1, (name, counts)
    if name != "part of a row" or Options().resolved_target() != "tpu":
        assert any(p.startswith("scatter") for p in counts), (name, counts)


def test_salsa20_8_written_with_at_set_is_one_kernel_on_the_tpu():
    """Salsa20/8's core as users write it (`s.at[idx].set(...)` per quarter round, on a vmapped
    16-word state; RFC 7914's vector): split for the TPU, every update is renaming, and the
    whole core is one kernel (it was nine, cut by the scatters: on the chip it ran 0.93x its
    split XLA form), which reads and writes the state where XLA:TPU keeps it."""
    import os
    import sys
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bench"))
    import accelerator as A
    x = jnp.asarray(np.random.default_rng(0).integers(0, 2 ** 32, (4096, 16), dtype=np.uint32))
    x = x.at[0].set(jnp.asarray(np.frombuffer(A.SALSA_IN, "<u4")))
    f = jax.vmap(A.salsa20_8)
    for kernel in (False, True):
        res = jaxrewrite.rewrite_jaxpr_with_report(jax.make_jaxpr(f)(x), target="tpu",
                                                   kernel=kernel)
        counts = primitive_counts(res.jaxpr)
        assert "scatter" not in counts and counts.get("pallas_call", 0) == int(kernel), counts
        if kernel:   # (the (N, 16) state read through its unstack and written in place)
            (stats,) = res.report.stats["kernel"]
            assert (stats["in_place_in"], stats["in_place_out"]) == (16, 16)
        got = jaxrewrite.optimize(f, target="tpu", kernel=kernel)(x)
        np.testing.assert_array_equal(np.asarray(got), np.asarray(jax.jit(f)(x)))
        assert np.asarray(got)[0].astype("<u4").tobytes() == A.SALSA_OUT
