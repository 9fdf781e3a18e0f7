"""Compile and count: what XLA made of a program (CPU fusions, GPU and TPU programs with neither).

Counting walks the optimized HLO module structurally (`compiled.runtime_executable()
.hlo_modules()` → `HloModule.make_nonfusion_computations()` → `HloInstruction.opcode`), never
the HLO text: a launch is a launching instruction (fusion, custom-call, copy, sort, ...) in a
computation that is not itself fused (the entry computation, loop bodies, branches).

GPU kernels are counted with XLA's deviceless CUDA compiler: a compile-only H200 built from
`targets/h200.txtpb` (published H200 figures) by `jax.experimental.topologies`. This needs the
`gpu-aot` extra (jax-cuda12-plugin and jax-cuda12-pjrt at jax's version) and `JAX_PLATFORMS=cpu`
set before jax is imported (with no GPU present the CUDA plugin otherwise fails at start).
Autotuning is skipped deviceless, so GEMM tile choices are defaults; elementwise, gather and
reduction fusion decisions come from the same cost model a real H200 uses.

TPU programs are compiled the same way with libtpu's own compiler (the `tpu-aot` extra: libtpu
at jax's version), for a compile-only TPU v5e, on a host with no TPU: XLA:TPU's whole pipeline
and Mosaic's compile of every Pallas kernel. It fails where the chip's compile fails (it refused
unsigned max and min, a select between masks, and int64 grid index maps, as the chip did on
Dec 6), which `jax.export` for the TPU, running only Pallas's lowering, does not see.
"""
from __future__ import annotations

import collections
import functools
import importlib.util
import os
from typing import Callable

import jax

_TARGETS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "targets")

# Opcodes (HloOpcode names) that become a kernel launch (GPU) or an emitted loop (CPU) when they
# stand outside a fused computation. Control flow is counted too: a while/conditional is a
# host-side step with its own launches in its body, which are counted there.
LAUNCH_OPCODES = frozenset({
    "fusion", "custom-call", "copy", "sort", "gather", "scatter", "concatenate", "pad",
    "while", "conditional", "reduce", "reduce-window", "select-and-scatter", "dot",
    "convolution", "fft", "all-reduce", "all-gather", "reduce-scatter", "all-to-all",
    "collective-permute", "dynamic-slice", "dynamic-update-slice", "transpose", "slice",
    "reverse", "broadcast", "iota", "rng", "rng-bit-generator",
    # (a reshape left in an optimized module is not a bitcast: on the TPU, a relayout between
    # tilings, the glue around a kernel)
    "reshape",
})


def _opcode_name(inst) -> str:
    """`HloOpcode.kCustomCall` → 'custom-call' (XLA's printed opcode names)."""
    name = getattr(inst.opcode, "name", str(inst.opcode))
    name = name[1:] if name.startswith("k") else name
    out = []
    for ch in name:
        if ch.isupper() and out:
            out.append("-")
        out.append(ch.lower())
    return "".join(out)


def hlo_modules(compiled) -> list:
    """The optimized HLO modules of a `jax.stages.Compiled`."""
    return list(compiled.runtime_executable().hlo_modules())


def launches(compiled) -> dict[str, int]:
    """Launching instructions outside fused computations, by opcode name."""
    counts: collections.Counter = collections.Counter()
    for module in hlo_modules(compiled):
        for comp in module.make_nonfusion_computations():
            for inst in comp.instructions():
                op = _opcode_name(inst)
                if op in LAUNCH_OPCODES:
                    counts[op] += 1
    return dict(counts)


def cpu_fusions(compiled) -> int:
    """Fusions in a compiled CPU program (its optimized HLO module, walked structurally)."""
    return launches(compiled).get("fusion", 0)


def gpu_kernels(compiled) -> int:
    """Kernel launches of a (deviceless) GPU compile: every launching instruction, unfused.

    Control-flow instructions (while, conditional) are host steps, not kernels, and are left out.
    """
    return sum(n for op, n in launches(compiled).items() if op not in ("while", "conditional"))


# --- deviceless GPU ------------------------------------------------------------------------------

def gpu_aot_available() -> bool:
    """Whether the CUDA plugin (the `gpu-aot` extra) is importable in this environment."""
    try:
        return importlib.util.find_spec("jax_plugins.xla_cuda12") is not None
    except ModuleNotFoundError:  # no `jax_plugins` namespace package at all
        return False


def target_config(target: str = "h200") -> str:
    """The GpuTargetConfigProto text of a target: a name under `targets/`, or a file path."""
    path = target if os.path.exists(target) else os.path.join(_TARGETS, f"{target}.txtpb")
    if not os.path.exists(path):
        known = sorted(f[:-6] for f in os.listdir(_TARGETS) if f.endswith(".txtpb"))
        raise ValueError(f"unknown GPU target {target!r}; known: {known}, or a .txtpb path")
    with open(path) as f:
        return f.read()


@functools.lru_cache(maxsize=None)
def _gpu_sharding(target: str):
    if not gpu_aot_available():
        raise ImportError("counting GPU kernels deviceless needs the gpu-aot extra: "
                          "pip install 'jaxrewrite[gpu-aot]' (jax-cuda12-plugin and "
                          "jax-cuda12-pjrt at jax's version)")
    platforms = jax.config.jax_platforms or ""  # read from JAX_PLATFORMS when jax is imported
    if "cpu" not in platforms.split(",") and not any(
            d.platform == "gpu" for d in _devices_or_empty()):
        raise RuntimeError("the deviceless GPU compiler needs JAX_PLATFORMS=cpu set before jax is "
                           "imported (with no GPU present the CUDA plugin fails at start)")
    from jax.experimental import topologies
    topo = topologies.get_topology_desc(platform="cuda", topology="1x1x1",
                                        target_config=target_config(target))
    mesh = topologies.make_mesh(topo, (1,), ("x",))
    return jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())


def _devices_or_empty():
    try:
        return jax.devices()
    except RuntimeError:
        return []


def gpu_specs(*specs, target: str = "h200") -> list:
    """`specs` (pytrees of arrays or ShapeDtypeStructs) placed on the compile-only GPU of
    `target`."""
    return _placed(specs, _gpu_sharding(target))


def _placed(specs, sharding) -> list:
    return [jax.tree_util.tree_map(
        lambda s: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sharding), spec)
        for spec in specs]


def gpu_compile(fn: Callable, *specs, target: str = "h200"):
    """Compile `fn` (a function, `jax.jit` or `optimize` object) for the GPU `target`, deviceless.

    Goes through `.trace().lower().compile()` on arguments placed on a compile-only device, which
    runs XLA's whole GPU pipeline. (`lower(lowering_platforms=("cuda",))` alone would compile
    for the CPU afterwards.)
    """
    jitted = fn if hasattr(fn, "trace") else jax.jit(fn)
    return jitted.trace(*gpu_specs(*specs, target=target)).lower().compile()


# --- deviceless TPU ------------------------------------------------------------------------------

TPU_TOPOLOGY = "v5e:1x1"    # the chip the device tool lends: one TPU v5e (`TPU v5 lite`)


def tpu_aot_available() -> bool:
    """Whether libtpu (the `tpu-aot` extra) is importable in this environment."""
    return importlib.util.find_spec("libtpu") is not None


# the device kind JAX reports for each topology's chip: on a host that has it, its own device
# compiles the same as the compile-only one (and a second libtpu cannot open the chip it holds)
_TPU_KINDS = {"v5e:1x1": "TPU v5 lite"}


def _host_chip(topology: str):
    """This host's own TPU device where it is `topology`'s chip, else None."""
    if jax.default_backend() != "tpu" or topology not in _TPU_KINDS:
        return None
    device = jax.devices()[0]
    return device if device.device_kind == _TPU_KINDS[topology] else None


def tpu_compile_available(topology: str = TPU_TOPOLOGY) -> bool:
    """Whether `tpu_compile` can compile for `topology` here: libtpu with no TPU (the
    `tpu-aot` extra), or this host's own chip of that kind."""
    if jax.default_backend() == "tpu":
        return _host_chip(topology) is not None
    return tpu_aot_available()


@functools.lru_cache(maxsize=None)
def _tpu_sharding(topology: str):
    chip = _host_chip(topology)
    if chip is not None:
        return jax.sharding.SingleDeviceSharding(chip)
    if not tpu_aot_available():
        raise ImportError("compiling for the TPU with no TPU needs the tpu-aot extra: "
                          "pip install 'jaxrewrite[tpu-aot]' (libtpu at jax's version)")
    from jax.experimental import topologies
    # libtpu takes a lock file so that one process holds a host's chips; compiling for no chip
    # holds none, and pytest-xdist's workers each load libtpu
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    # (libtpu asks the host for a TPU first and logs that it found none; then it builds the
    # topology it is given: one host of one chip)
    topo = topologies.get_topology_desc(topology, "tpu", chips_per_host_bounds=(1, 1, 1))
    return jax.sharding.SingleDeviceSharding(topo.devices[0])


def tpu_specs(*specs, topology: str = TPU_TOPOLOGY) -> list:
    """`specs` (pytrees of arrays or ShapeDtypeStructs) placed on a compile-only TPU of
    `topology`."""
    return _placed(specs, _tpu_sharding(topology))


def tpu_compile(fn: Callable, *specs, topology: str = TPU_TOPOLOGY):
    """Compile `fn` (a function, `jax.jit` or `optimize` object) for a TPU, deviceless (on a
    host with that TPU, for its own chip: compiled, not run).

    Kernels that `fn`'s rewrite emits are emitted for Mosaic (`mosaic.emit_for("tpu")`), not
    for Pallas's interpreter, whatever this process runs on. The result can be inspected
    (`launches`, `hlo_modules`), not run."""
    from . import mosaic
    jitted = fn if hasattr(fn, "trace") else jax.jit(fn)
    with mosaic.emit_for("tpu"):
        return jitted.trace(*tpu_specs(*specs, topology=topology)).lower().compile()
