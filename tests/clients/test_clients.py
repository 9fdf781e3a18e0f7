"""Programs written with real libraries (bench/clients.py: Equinox, Flax NNX, Optax, Diffrax,
JAX MD, Pgx) through `optimize(..., strict=True)` against `jax.jit`, under the contract
(`clients.assert_result`: integers, booleans and keys bit for bit, floats within
`jaxrewrite.testing.CONTRACT_ULPS` eps of each output's largest magnitude, gradients of the whole
gradient's). `strict=True` re-raises a pass's error, so a fallback fails the
test with its traceback; the report is also checked for errors, and that something was rewritten
(otherwise the comparison would test jax.jit against itself).
"""
import jax
import pytest

import clients  # bench/clients.py, put on sys.path by conftest.py
import jaxrewrite
from jaxrewrite import _compat as C

pytestmark = pytest.mark.clients

# JAX MD's energy sums ask for float64 and JAX warns that it truncates to float32 (x64 off): the
# library's behaviour under jax.jit as much as under optimize, not ours.
_MARKS = {"jax_md_lj": pytest.mark.filterwarnings(
    "ignore:Explicitly requested dtype float64:UserWarning")}
PROGRAMS = [pytest.param(make, id=make.__name__, marks=_MARKS.get(make.__name__, ()))
            for make in clients.PROGRAMS]

_built = {}


def program(make):
    """Each program is built once per session (building traces nothing, but imports the library
    and initialises its parameters)."""
    if make not in _built:
        _built[make] = make()
    return _built[make]


def check(fn, args, record_property, what, direction):
    """optimize(fn, strict=True)(*args) equals jax.jit(fn)(*args) under the contract; no
    fallback; at least one rewrite applied; the rewritten jaxpr is well-formed. (Traced, lowered
    and compiled once: the set has to stay within CI's few minutes.)"""
    expected = jax.jit(fn)(*args)
    traced = jaxrewrite.optimize(fn, strict=True).trace(*args)
    report = jaxrewrite.last_report()
    assert report is not None and report.errors == [], f"{what}: fell back: {report.errors}"
    applied = clients.rewrites_applied(report)
    record_property(f"rewrites_{what}", dict(applied))
    assert applied, f"{what}: no rewrite applied, so nothing was compared"
    C.check_jaxpr(traced.jaxpr)
    actual = traced.lower().compile()(*args)
    clients.assert_result(direction, actual, expected, what)


@pytest.mark.parametrize("make", PROGRAMS)
def test_forward(make, record_property):
    p = program(make)
    check(p.forward, p.args, record_property, "forward", "forward")


@pytest.mark.parametrize("make", PROGRAMS)
def test_value_and_grad_rewritten(make, record_property):
    """The backward program itself goes through the rewrite: optimize(value_and_grad(loss))."""
    p = program(make)
    check(clients.grad_program(p), p.args, record_property, "grad", "grad")


@pytest.mark.parametrize("make", PROGRAMS)
def test_grad_of_optimized(make):
    """JAX differentiates through optimize's wrapper: value_and_grad(optimize(loss)), inside an
    outer jit (one compile, as a training step would be)."""
    p = program(make)
    expected = jax.jit(jax.value_and_grad(jax.jit(p.loss)))(*p.args)
    actual = jax.jit(jax.value_and_grad(jaxrewrite.optimize(p.loss, strict=True)))(*p.args)
    report = jaxrewrite.last_report()
    assert report is not None and report.errors == [], f"fell back: {report.errors}"
    clients.assert_result("grad", actual, expected, "grad of optimize")
