"""Kernel-count regressions with XLA's deviceless H200 compiler (the gpu-aot extra).

Run in an environment with jax-cuda12-plugin/-pjrt at jax's version and JAX_PLATFORMS=cpu:

    JAX_PLATFORMS=cpu .venv-gpu/bin/python -m pytest -q -m gpu_aot tests/test_kernels_gpu.py

Skipped cleanly where the plugin is absent (or JAX_PLATFORMS does not include cpu).
"""
import os
import sys

import pytest

pytest.importorskip("jax_plugins.xla_cuda12")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import jaxrewrite  # noqa: E402
from jaxrewrite.backend import xla as _xla  # noqa: E402
from jaxrewrite.testing import primitive_counts  # noqa: E402

if "cpu" not in (jax.config.jax_platforms or "").split(","):
    pytest.skip("the deviceless GPU compiler needs JAX_PLATFORMS=cpu", allow_module_level=True)

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "bench"))
import permutations as P  # noqa: E402

pytestmark = pytest.mark.gpu_aot

BATCH = jax.ShapeDtypeStruct((4096, 4, 4), jnp.uint32)


def kernels(fn, spec=BATCH, **options):
    return _xla.gpu_kernels(_xla.gpu_compile(jaxrewrite.optimize(fn, target="gpu", **options),
                                             spec))


def jit_kernels(fn, spec=BATCH):
    return _xla.gpu_kernels(_xla.gpu_compile(jax.jit(fn), spec))


def test_counts_structurally():
    c = _xla.gpu_compile(jax.jit(lambda x: jnp.sin(x) * 2 + x[::-1]),
                         jax.ShapeDtypeStruct((1024,), jnp.float32))
    assert _xla.launches(c) == {"fusion": 1}


def test_chacha_take_form_becomes_as_few_kernels_as_the_hand_form():
    fn = jax.vmap(lambda x: P.chacha_take(x, rounds=2))
    hand = jax.vmap(lambda x: P.chacha_words(x, rounds=2))
    before, after = jit_kernels(fn), kernels(fn)
    assert after < before          # 2 double rounds: 7 → 2 kernels (10 double rounds: 51 → 2)
    assert after <= 3
    assert after <= jit_kernels(hand)


def test_scalarize_off_keeps_the_gathers_kernels():
    """scalarize off: the gathers stay (no kernel of theirs is saved or added); the only change
    is movement's, the rounds' re-stacked words made in the layout their transpose wanted
    (2 rounds: 7 -> 4 kernels, Dec 7)."""
    fn = jax.vmap(lambda x: P.chacha_take(x, rounds=2))
    cj = jaxrewrite.make_jaxpr(fn, scalarize=False, target="gpu")(BATCH)
    assert "gather" in primitive_counts(cj)
    assert "transpose" not in primitive_counts(cj)
    assert kernels(fn, scalarize=False) < jit_kernels(fn)


def test_movement_never_adds_kernels():
    def fn(x):
        y = jnp.concatenate([x[:, :2], x[:, 2:]], 1).transpose(0, 2, 1).transpose(0, 2, 1)
        return jnp.array([y[:, 0] * 2, y[:, 1], y[:, 2], y[:, 3]])[1:3] + 1
    assert kernels(fn, scalarize=False) <= jit_kernels(fn)


def test_seed_program_fewer_kernels():
    from seed import COLFNS, PERMS, rounds_program
    fn = rounds_program(COLFNS["mix"], PERMS["take"])
    assert kernels(fn) < jit_kernels(fn)


def test_missing_target_is_a_clear_error():
    with pytest.raises(ValueError, match="unknown GPU target"):
        _xla.target_config("no-such-gpu")


def test_autotune_deviceless_from_cpu_process(tmp_path, monkeypatch):
    # autotune=True for target 'gpu' compiles both forms with the deviceless H200 compiler, picks
    # by kernels (tie: the model), caches the choice, and never makes more kernels than the model
    monkeypatch.setenv("JAXREWRITE_CACHE_DIR", str(tmp_path))
    from jaxrewrite.backend import autotune as _autotune
    f = jax.vmap(lambda x: P.chacha_take(x, rounds=2))
    before = _autotune.COMPILES
    tuned = kernels(f, autotune=True)
    assert _autotune.COMPILES > before
    assert tuned <= kernels(f)
    entries = (tmp_path / "autotune.json").read_text()
    assert "launches on gpu" in entries
    compiles = _autotune.COMPILES
    assert kernels(f, autotune=True) == tuned
    assert _autotune.COMPILES == compiles          # cached: nothing compiled again


def test_static_scatter_on_the_gpu_is_one_kernel_instead_of_copy_and_scatter():
    """The GPU row's default (`scatter_concat_pieces`): a select over one small concatenate."""
    fn = lambda x: x.at[:, np.array([1, 5, 9])].set(0.0)  # noqa: E731
    spec = jax.ShapeDtypeStruct((4096, 16), jnp.float32)
    assert jit_kernels(fn, spec) == 2      # a copy of the operand, then the scatter
    assert kernels(fn, spec) == 1
    assert kernels(fn, spec, gathers=False) == 2


def test_keccak_cut_into_fewer_kernels_where_autotune_counts_them(tmp_path, monkeypatch):
    """Keccak-f[1600], 16 rounds, 16,384 states (issue 25): the split region cut at its
    narrowest points (passes/_segments.py: 5 -> 3 kernels). Only `autotune=True` takes the cut,
    having counted both forms; the defaults decline it (how XLA fuses a cut region is not
    predictable from its size: ChaCha20's 20 double rounds cut 3 -> 22)."""
    import keccak as K
    monkeypatch.setenv("JAXREWRITE_CACHE_DIR", str(tmp_path))
    fn = jax.vmap(lambda a: K.keccak_f(a, 16))
    spec = jax.ShapeDtypeStruct((16384, 25), jnp.uint64)
    with jax.enable_x64(True):
        plain, tuned = kernels(fn, spec), kernels(fn, spec, autotune=True)
    assert tuned < plain and tuned <= 3
