"""Test configuration: hypothesis profiles, and what changes on an accelerator host.

Profiles (`HYPOTHESIS_PROFILE=...`): `default` keeps the whole suite within its CI budget
(2 cores); `long` is for .ci/run's time-bounded extended fuzzing; `tpu` draws 8 examples where
`default` draws 25 (tests/test_fuzz.py caps its own counts at the profile's), for a run on the
chip, where every example's compiles cost more.

On a TPU host (JAX 0.10.2, Python 3.11; the project not installed), from the repository root,
in one process (one process at a time may hold the chip: no `-n`):

    export PYTHONPATH=$PWD:$PYTHONPATH HYPOTHESIS_PROFILE=tpu
    python3 -m pytest -q -p no:cacheprovider

or, where a command may run 10 minutes at most, in parts of at most 8 minutes each, one part
a command (tests/tpu_parts.py: the parts by the files' CPU times; a new file lands in the last
part; each part writes its counts and failures to DIR as it goes, and pytest's junit file):

    python3 tests/tpu_parts.py --list
    python3 tests/tpu_parts.py --part 1 --out DIR      (then 2, 3, ...; --part 1,2,3; --part all)

On Dec 7 the eight parts took 1,150 s of pytest on the chip: `--part 1,2,3`, `4,5,6`, `7,8`
fit three 10-minute calls.

On the CPU, `JAXREWRITE_TEST_TARGET=tpu` makes every rewrite that names no target decide as on
the TPU (the programs still run on the CPU; kernels take Pallas's interpreter): the TPU host's
decisions, without its compiler. A test about one target's row pins it: `target="cpu"` in its
calls, or `@pytest.mark.default_target("cpu")` (a file's `pytestmark`) for every rewrite in it.

What differs there, and why (tests/ says so where it matters):
- JAX's import-time notices ("Transparent hugepages are not enabled", "cloud_tpu_init failed")
  are ignored by name in setup.cfg; every other warning is still an error.
- Float matmuls run at full f32 precision in every test (`jax_default_matmul_precision`
  "highest", below): the TPU's default passes bf16, so one rounding more or less before a
  contraction would move results by far more than the contract's tolerance, which is defined
  against XLA's fusion-dependent f32 rounding. bench/accelerator.py measures the default.
- A test about one target's decisions asks for that target (`target="cpu"`); the programs it
  checks still run on the default backend. Tests of what XLA:CPU itself does (its compile
  options, fusion counts, autotune compiling for target 'cpu', run times held to the CPU's
  never-worse promise) are skipped elsewhere, each with its reason.
- Child processes run with JAX_PLATFORMS=cpu (the parent holds the chip) and compare integers
  or the contract, not float bits across backends.
"""
import os

import numpy as np
import pytest
from hypothesis import HealthCheck, settings

settings.register_profile(
    "default", deadline=None, max_examples=25, derandomize=True, print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.register_profile(
    "long", deadline=None, max_examples=2000, print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.register_profile(
    "tpu", deadline=None, max_examples=8, derandomize=True, print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))


def _defaulting_to(target):
    """`Options.resolved_target` with `target` where the options name none."""
    if target not in ("cpu", "gpu", "tpu"):
        raise ValueError(f"default target {target!r}: expected cpu, gpu or tpu")

    def resolved_target(self) -> str:
        return self.target if self.target is not None else target
    return resolved_target


# `JAXREWRITE_TEST_TARGET=tpu`: every rewrite that names no target decides as on that target,
# while the programs still run here. On the CPU this shows the TPU's decisions (not its
# compiler's bits, nor Mosaic: kernels take Pallas's interpreter), as a TPU host would.
if os.environ.get("JAXREWRITE_TEST_TARGET"):
    from jaxrewrite import _options
    _options.Options.resolved_target = _defaulting_to(os.environ["JAXREWRITE_TEST_TARGET"])


@pytest.fixture(autouse=True)
def default_target(request, monkeypatch):
    """`@pytest.mark.default_target("cpu")` (or a module's `pytestmark`): within the test,
    rewrites that name no target decide as on that target (a file about one target's row of a
    pass, whatever the host or JAXREWRITE_TEST_TARGET); the programs still run on the default
    backend."""
    mark = request.node.get_closest_marker("default_target")
    if mark is not None:
        from jaxrewrite import _options
        monkeypatch.setattr(_options.Options, "resolved_target", _defaulting_to(mark.args[0]))


@pytest.fixture(autouse=True, scope="session")
def f32_matmuls_off_the_cpu():
    """On an accelerator, float matmuls at full f32 precision for the whole session (every
    thread: a config value, not a context). On the CPU nothing is set (XLA:CPU computes f32)."""
    import jax
    if jax.default_backend() == "cpu":
        yield
        return
    before = jax.config.jax_default_matmul_precision
    jax.config.update("jax_default_matmul_precision", "highest")
    try:
        yield
    finally:
        jax.config.update("jax_default_matmul_precision", before)


@pytest.fixture
def map_sizes(monkeypatch):
    """`map_sizes("gather_map")`: spy on that `analysis.indexmap` function; the returned list
    collects the size (elements) of every operand shape it is asked to map."""
    from jaxrewrite.analysis import indexmap as _indexmap

    def record(name):
        sizes, real = [], getattr(_indexmap, name)

        def spy(operand_shape, *a, **k):
            sizes.append(int(np.prod(operand_shape)))
            return real(operand_shape, *a, **k)

        monkeypatch.setattr(_indexmap, name, spy)
        return sizes
    return record
