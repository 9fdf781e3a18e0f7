"""The rewrite options: one table, one frozen object.

Each row is (keyword, default, what it does). `optimize`, `rewrite_jaxpr`, `make_jaxpr` and
`explain` take exactly these keywords (plus `jax.jit`'s own, for `optimize`).
"""
from __future__ import annotations

import dataclasses
from typing import Any

OPTIONS: tuple[tuple[str, Any, str], ...] = (
    ("dedup", True, "merge structurally identical inner jaxprs so each is lowered once"),
    ("cse", True, "compute identical pure equations on identical operands once"),
    ("reroll", "auto", "roll chains of identical calls into lax.scan (True, or the shortest run); "
                       "'auto': on the CPU and TPU only a loop of rounds whose carry flatten "
                       "then splits"),
    ("unroll", 1, "`unroll=` of the scans that reroll makes"),
    ("fold", True, "fold integer/boolean index arithmetic over constants"),
    ("fold_limit", 1 << 20, "largest constant (elements) that folding may materialize"),
    ("gathers", True, "static-index gathers/scatters become slices, reverses, reshapes...; "
                      "'all' also allows concatenate/pad forms"),
    ("movement", True, "simplify chains of data movement (slice/concat/transpose/reshape/rev)"),
    ("scalarize", "auto", "split small static axes into separate arrays so permutations are renaming"),
    ("flatten", "auto", "inline small jit calls and unroll small static loops that carry small "
                        "axes moved by permutations, so scalarize sees one region ('auto': the "
                        "cost model decides; True: every eligible loop)"),
    ("autotune", False, "decide between candidate forms by compiling them (True: launch counts "
                         "+ cost model; 'time': run times, opt-in, may differ between processes); "
                         "choices cached on disk"),
    ("tile", True, "CPU: run a batch-independent program whose loop state exceeds the cache as a "
                   "loop over tiles of its batch axis, its own loops inside (other targets: off)"),
    ("kernel", "auto", "TPU: one Pallas kernel for a region of integer work on split pieces "
                       "(a split loop with its words, or straight-line rounds), the loop inside "
                       "('auto': where the target's cost row says so; True: wherever one can be "
                       "emitted, any target, Pallas's interpreter off the TPU)"),
    ("target", None, "backend the cost model decides for: 'cpu', 'gpu', 'tpu' (default: current)"),
    ("max_rounds", 8, "fixed-point cap of the pass pipeline"),
    ("debug_checks", False, "check_jaxpr after every pass"),
    ("strict", False, "re-raise a pass's error instead of falling back to the original program"),
    ("exact", False, "float results bit for bit: decline rewrites that could change how XLA "
                     "rounds float arithmetic (float gathers/movement/splits, CSE of float values, "
                     "rolling float chains)"),
)

DEFAULTS = {name: default for name, default, _ in OPTIONS}


def _bool(v):
    return isinstance(v, bool)


def _count(v):
    return isinstance(v, int) and not isinstance(v, bool) and v >= 1


# What each option accepts: a typo such as `dedup="off"` is an error, not a truthy "on".
VALID = {
    "dedup": (_bool, "True or False"),
    "cse": (_bool, "True or False"),
    "reroll": (lambda v: _bool(v) or v == "auto" or (_count(v) and v >= 2),
               "True, False, 'auto', or an int >= 2"),
    "unroll": (lambda v: _bool(v) or _count(v), "an int >= 1 or a bool"),
    "fold": (_bool, "True or False"),
    "fold_limit": (lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 0, "an int >= 0"),
    "gathers": (lambda v: _bool(v) or v == "all", "True, False or 'all'"),
    "movement": (_bool, "True or False"),
    "scalarize": (lambda v: _bool(v) or v == "auto", "True, False or 'auto'"),
    "flatten": (lambda v: _bool(v) or v == "auto", "True, False or 'auto'"),
    "autotune": (lambda v: _bool(v) or v == "time", "True, False or 'time'"),
    "tile": (_bool, "True or False"),
    "kernel": (lambda v: _bool(v) or v == "auto", "True, False or 'auto'"),
    "target": (lambda v: v is None or v in ("cpu", "gpu", "cuda", "rocm", "tpu"),
               "None, 'cpu', 'gpu' or 'tpu'"),
    "max_rounds": (_count, "an int >= 1"),
    "debug_checks": (_bool, "True or False"),
    "strict": (_bool, "True or False"),
    "exact": (_bool, "True or False"),
}
NAMES = tuple(DEFAULTS)


@dataclasses.dataclass(frozen=True)
class Options:
    dedup: Any = DEFAULTS["dedup"]
    cse: Any = DEFAULTS["cse"]
    reroll: Any = DEFAULTS["reroll"]
    unroll: Any = DEFAULTS["unroll"]
    fold: Any = DEFAULTS["fold"]
    fold_limit: int = DEFAULTS["fold_limit"]
    gathers: Any = DEFAULTS["gathers"]
    movement: Any = DEFAULTS["movement"]
    scalarize: Any = DEFAULTS["scalarize"]
    flatten: Any = DEFAULTS["flatten"]
    autotune: Any = DEFAULTS["autotune"]
    tile: Any = DEFAULTS["tile"]
    kernel: Any = DEFAULTS["kernel"]
    target: Any = DEFAULTS["target"]
    max_rounds: int = DEFAULTS["max_rounds"]
    debug_checks: bool = DEFAULTS["debug_checks"]
    strict: bool = DEFAULTS["strict"]
    exact: bool = DEFAULTS["exact"]

    @classmethod
    def make(cls, **kw) -> "Options":
        unknown = sorted(set(kw) - set(NAMES))
        if unknown:
            raise TypeError(f"unknown jaxrewrite option(s) {unknown}; valid rewrite options: "
                            f"{', '.join(NAMES)}")
        for name, value in kw.items():
            ok, what = VALID.get(name, (lambda v: True, ""))
            if not ok(value):
                raise ValueError(f"jaxrewrite option {name}={value!r}: expected {what}")
        return cls(**kw)

    def key(self) -> tuple:
        return tuple(getattr(self, n) for n in NAMES)

    def resolved_target(self) -> str:
        if self.target is not None:
            return self.target
        import jax
        return jax.default_backend()


assert tuple(f.name for f in dataclasses.fields(Options)) == NAMES
