"""analysis/views: the affine view of a value made by data movement is where numpy puts it."""
import types

import numpy as np
from hypothesis import given, settings, strategies as st

from jaxrewrite.analysis import views as V


def _positions(v: V.View) -> np.ndarray:
    idx = np.indices(v.shape).reshape(len(v.shape), -1)
    return (v.offset + sum(i * s for i, s in zip(idx, v.strides))).reshape(v.shape)


@st.composite
def _chains(draw):
    shape = tuple(draw(st.lists(st.sampled_from([1, 2, 3, 4, 6]), min_size=1, max_size=4)))
    steps = []
    a = np.arange(int(np.prod(shape))).reshape(shape)
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["transpose", "slice", "reshape", "take"]))
        if kind == "transpose":
            steps.append((kind, tuple(draw(st.permutations(range(a.ndim))))))
        elif kind == "slice":
            lo = [draw(st.integers(0, d - 1)) for d in a.shape]
            hi = [draw(st.integers(l + 1, d)) for l, d in zip(lo, a.shape)]
            steps.append((kind, (lo, hi, [draw(st.integers(1, 2)) for _ in a.shape])))
        elif kind == "reshape":
            d = draw(st.sampled_from([k for k in range(1, a.size + 1) if a.size % k == 0]))
            steps.append((kind, (d, a.size // d)))
        elif a.ndim > 1:
            ax = draw(st.integers(0, a.ndim - 1))
            steps.append((kind, (ax, draw(st.integers(0, a.shape[ax] - 1)))))
        else:
            continue
        a = _numpy_step(a, steps[-1])
    return shape, steps


def _numpy_step(a, step):
    kind, arg = step
    if kind == "transpose":
        return a.transpose(arg)
    if kind == "slice":
        return a[tuple(slice(l, h, s) for l, h, s in zip(*arg))]
    if kind == "reshape":
        return a.reshape(arg)
    return np.take(a, arg[1], axis=arg[0])


def _eqn(name, **params):
    """What `views.apply` reads of an equation."""
    return types.SimpleNamespace(primitive=types.SimpleNamespace(name=name), params=params)


def _view_step(v, step):
    kind, arg = step
    if kind == "transpose":
        return V.apply(v, _eqn("transpose", permutation=arg))
    if kind == "slice":
        lo, hi, steps = arg
        return V.apply(v, _eqn("slice", start_indices=tuple(lo), limit_indices=tuple(hi),
                               strides=tuple(steps)))
    if kind == "reshape":
        return V.apply(v, _eqn("reshape", new_sizes=arg, dimensions=None))
    return V.take(v, *arg)


@settings(max_examples=400, deadline=None)
@given(_chains())
def test_a_view_holds_the_elements_numpy_moves_there(chain):
    shape, steps = chain
    a = np.arange(int(np.prod(shape))).reshape(shape)
    v = V.contiguous(shape)
    for step in steps:
        a = _numpy_step(a, step)
        v = _view_step(v, step)
        if v is None:          # (a reshape that would copy: no view, never a wrong one)
            return
        np.testing.assert_array_equal(_positions(v), a)


def test_chacha_s_pieces_are_found_in_either_layout():
    """Row i of the (16, N) words is the same view of the state whether the state is (N, 4, 4)
    transposed first or (4, 4, N) as it is; column i of (N, 16) is the former."""
    n = 4096
    rows = V.reshape(V.View((4, 4, n), (4, 1, 16)), (16, n))      # transpose[(1, 2, 0)] of (N,4,4)
    cols = V.reshape(V.contiguous((n, 4, 4)), (n, 16))
    assert V.take(rows, 0, 5).key() == V.take(cols, 1, 5).key() == ((n,), (16,), 5)
    assert V.reshape(V.View((4, n), (1, 16)), (4 * n,)) is None   # would need a copy


def test_a_copy_is_the_same_view():
    """`jnp.array(x)` (the author's state wrapper) leaves a `copy`: the same elements, in order,
    so a piece past it is still a view of the user's array (the kernel reads that in place)."""
    v = V.View((4, 16), (1, 4), 3)
    assert V.apply(v, _eqn("copy")) == v and V.apply(v, _eqn("copy_p")) == v


def test_the_results_of_an_unstack_are_views_of_its_operand():
    """`unstack(x, axis=1)` of a (N, 16) state (how scalarize splits Salsa20/8's words): result
    k is x[:, k], found through `view_of` as through a slice and a squeeze."""
    import jax
    import jax.numpy as jnp
    import pytest

    if not hasattr(jax.lax, "unstack"):
        pytest.skip("this JAX has no unstack primitive")
    cj = jax.make_jaxpr(lambda x: [w + 1 for w in jax.lax.unstack(x, axis=1)])(
        jnp.zeros((256, 16), jnp.uint32))
    assert cj.jaxpr.eqns[0].primitive.name == "unstack"
    producers = {v: e for e in cj.jaxpr.eqns for v in e.outvars}
    root = cj.jaxpr.invars[0]
    pieces = [e.invars[0] for e in cj.jaxpr.eqns if e.primitive.name == "add"]
    got = [V.view_of(p, root, producers.get, {}) for p in pieces]
    assert [g.key() for g in got] == [((256,), (16,), k) for k in range(16)]


def test_a_stack_s_operands_are_views_of_its_reshaped_result():
    """`views.stacked`: operand i of `stack[axis=1]` reshaped to (N, 4, 4) is x[:, i // 4, i % 4]
    (the feed-forward's and the in-place kernel's question); reshaped to any shape, its
    elements sit where the row-major (N, 16) result puts them."""
    import jax
    import jax.numpy as jnp

    n = 256
    cj = jax.make_jaxpr(lambda *p: jnp.stack(p, axis=1))(*[jnp.zeros((n,), jnp.uint32)] * 16)
    (st,) = [e for e in cj.jaxpr.eqns if e.primitive.name == "stack"]
    got = V.stacked((n, 4, 4), st)
    assert [w.key() for w in got] == [((n,), (16,), i) for i in range(16)]
    x = np.arange(n * 16).reshape(n, 4, 4)
    for i, w in enumerate(got):
        np.testing.assert_array_equal(_positions(w), x[:, i // 4, i % 4])
    flat = np.arange(n * 16).reshape(n, 16)
    for i, w in enumerate(V.stacked((4, n, 4), st)):
        np.testing.assert_array_equal(_positions(w), flat[:, i])
