"""`explain(fun, **options)(*args)`: what optimize does to one program, and what each step costs.

    e = jaxrewrite.explain(f, gathers="all")(x)
    print(e)              # a table: jax.jit beside optimize, then every rewrite and decline
    e.to_dict()           # the same, for JSON

It compiles ahead of time, twice: `optimize(f)` (trace → rewrite → lower → compile) and, as the
baseline column, `jax.jit(f)` (trace → lower → compile). Each runs on a fresh wrapper of `f`, so
neither hits the other's top-level caches; the optimized program goes first, so inner `jax.jit`
functions that both share are traced by it, not by the baseline (if anything, to its cost).
One sample each: for stable figures use `bench/` (paired medians). An entry point like `_api.py`
(it drives the pipeline), not a report helper.
"""
from __future__ import annotations

import collections
import dataclasses
import functools
import re
import time
from typing import Any, Callable

import jax

from . import _api
from . import _compat as C
from . import _pipeline
from . import _switch
from . import _walk
from ._options import DEFAULTS
from .backend import compile_options as _compile_options
from .report.records import Event, Report


@dataclasses.dataclass
class Explanation:
    """What `explain` measured. `*_before` is `jax.jit(fun)`, `*_after` is `optimize(fun)`.

    timings: seconds of the optimized program's phases: `trace` (the function to a jaxpr),
      `rewrite` and `pass.<name>` (each pass, summed over rounds), `restage` (the rest of
      `jax.jit`'s trace: staging the rewritten program), `lower`, `compile`, `total`.
    baseline_timings: `jax.jit(fun)`'s `trace`, `lower`, `compile`, `total` (empty when
      `baseline=False`).
    jaxprs_*: distinct inner jaxprs (each is traced, and may be lowered, once);
    functions_*: functions in the lowered MLIR module; fusions_*: fusions in the compiled program
    for the current backend; kernels_*: kernels of the program compiled for `gpu_target` without
    a GPU (needs the `gpu-aot` extra; None otherwise, with a note).
    """
    name: str
    shapes: str
    backend: str
    options: dict
    timings: dict[str, float]
    baseline_timings: dict[str, float]
    rewrites: list[Event]
    declines: list[Event]
    counts: dict[str, int]
    eqns_before: int
    eqns_after: int
    jaxprs_before: int
    jaxprs_after: int
    functions_before: int | None = None
    functions_after: int | None = None
    fusions_before: int | None = None
    fusions_after: int | None = None
    kernels_before: int | None = None
    kernels_after: int | None = None
    gpu_target: str | None = None
    errors: list[str] = dataclasses.field(default_factory=list)
    notes: list[str] = dataclasses.field(default_factory=list)
    report: Report | None = dataclasses.field(default=None, repr=False)
    # the rewritten ClosedJaxpr (where it failed to lower or compile: what ran in its place)
    jaxpr: Any = dataclasses.field(default=None, repr=False)
    compiled: Any = dataclasses.field(default=None, repr=False)   # optimize's jax.stages.Compiled

    def to_dict(self) -> dict:
        skip = {"report", "jaxpr", "compiled", "rewrites", "declines"}
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name not in skip}
        out["rewrites"] = [e.to_dict() for e in self.rewrites]
        out["declines"] = [e.to_dict() for e in self.declines]
        return out

    def __str__(self) -> str:
        return format_explanation(self)


def explain(fun: Callable, /, *, baseline: bool = True, gpu_target: str | None = "auto",
            **kwargs) -> Callable[..., Explanation]:
    """`explain(fun, **optimize_options)(*args, **kwargs)` traces, rewrites, lowers and compiles
    `optimize(fun, **optimize_options)` for these arguments, times each step, and returns an
    `Explanation` (print it for a table; `.to_dict()` for JSON).

    `kwargs` are what `optimize` takes (rewrite options and `jax.jit` parameters).
    `baseline=False` skips lowering and compiling `jax.jit(fun)` (its jaxpr is still traced, for
    the equation counts). `gpu_target`: "auto" counts H200 kernels when the `gpu-aot` extra is
    installed, a target name ("h200") requires it, None skips it.
    """
    if not callable(fun):
        raise TypeError(f"explain() expects a callable, got {type(fun).__name__}: {fun!r}")
    options, jit_kw = _api._split_kwargs(kwargs)

    def run(*args, **call_kwargs) -> Explanation:
        with _switch._off():  # the baseline is jax.jit's program, whether the switch is on or not
            return _explain(*args, **call_kwargs)

    def _explain(*args, **call_kwargs) -> Explanation:
        notes: list[str] = []
        # -- optimize(fun): a fresh wrapper, so nothing is cached from earlier calls
        opt = jax.jit(_api._rewriting(fun, options, jit_kw), **jit_kw)
        _pipeline.enabled_passes(options)  # imports the passes: a one-time cost, not the rewrite's
        prev = _api.last_report()
        t0 = time.perf_counter()
        traced = opt.trace(*args, **call_kwargs)
        t1 = time.perf_counter()
        report = _api.last_report()
        if report is None or report is prev:
            raise RuntimeError("explain: the optimized function was not traced")
        lowered = traced.lower()
        t2 = time.perf_counter()
        compiled = lowered.compile()
        t3 = time.perf_counter()
        timings = dict(report.timings)
        timings["restage"] = max(0.0, (t1 - t0) - timings.get("trace", 0.0)
                                 - timings.get("rewrite", 0.0))
        timings.update(lower=t2 - t1, compile=t3 - t2, total=t3 - t0)

        # -- jax.jit(fun), the baseline column
        base = jax.jit(_fresh(fun), **jit_kw)
        b0 = time.perf_counter()
        btraced = base.trace(*args, **call_kwargs)
        b1 = time.perf_counter()
        btimings = {}
        blowered = bcompiled = None
        if baseline:
            blowered = btraced.lower()
            b2 = time.perf_counter()
            bcompiled = blowered.compile()
            b3 = time.perf_counter()
            btimings = dict(trace=b1 - b0, lower=b2 - b1, compile=b3 - b2, total=b3 - b0)

        # where the rewritten program failed to lower or compile: the program that ran instead
        after_j, before_j = C.lowered_instead(traced.jaxpr) or traced.jaxpr, btraced.jaxpr
        target = _gpu_target(gpu_target, notes)
        kernels = (None, None)
        if target:
            # the cost model decides for the GPU here, unless the caller chose a target
            gpu_opts = options if options.target is not None else \
                dataclasses.replace(options, target="gpu")
            gpu_opt = jax.jit(_api._rewriting(fun, gpu_opts, jit_kw), **jit_kw)
            kernels = (_gpu_kernels(gpu_opt, args, call_kwargs, target, notes),
                       _gpu_kernels(base, args, call_kwargs, target, notes) if baseline else None)
        fallback = report.stats.get("fallback")
        if fallback and not fallback["original"]:
            dropped = ", ".join(f"'{p}'" for p in fallback["dropped"])
            notes.append(f"the rewritten program failed to lower or compile; the program made "
                         f"without {dropped} was used (see errors)")
        elif report.errors:
            notes.append("a pass failed; the original program was used (see errors)")
        asked = report.stats.get("compile_options", {})
        given = jit_kw.get("compiler_options") or {}
        notes.extend(f"compiled with {r}" for r in _compile_options.reasons(
            {k: v for k, v in asked.items() if k not in given}))
        notes.extend(f"the rewrite asked for {k}={asked[k]}; compiled with the jit's own "
                     f"{k}={given[k]}" for k in asked if k in given)
        return Explanation(
            name=_name(fun), shapes=_shapes(args, call_kwargs), backend=jax.default_backend(),
            options={k: v for k, v in dataclasses.asdict(options).items() if DEFAULTS[k] != v},
            timings=timings, baseline_timings=btimings,
            rewrites=list(report.rewrites), declines=list(report.declines),
            counts=dict(report.counts),
            eqns_before=_walk.count_eqns(before_j), eqns_after=_walk.count_eqns(after_j),
            jaxprs_before=inner_jaxprs(before_j), jaxprs_after=inner_jaxprs(after_j),
            functions_before=_mlir_functions(blowered), functions_after=_mlir_functions(lowered),
            fusions_before=_fusions(bcompiled, notes), fusions_after=_fusions(compiled, notes),
            kernels_before=kernels[1], kernels_after=kernels[0], gpu_target=target,
            errors=list(report.errors), notes=_unique(notes), report=report, jaxpr=after_j,
            compiled=compiled)

    return run


# --- measures ----------------------------------------------------------------------------------

def inner_jaxprs(cj) -> int:
    """Distinct jaxprs nested in `cj` (by identity of the open jaxpr; `cj` itself not counted)."""
    seen = set()
    for j in _walk.iter_jaxprs(cj):
        seen.add(id(getattr(j, "jaxpr", j)))
    return len(seen) - 1


def _mlir_functions(lowered) -> int | None:
    if lowered is None:
        return None
    try:
        module = lowered.compiler_ir("stablehlo")
        return sum(1 for op in module.body.operations if op.operation.name == "func.func")
    except Exception:  # noqa: BLE001 - a figure we cannot read is reported as missing
        return None


def _fusions(compiled, notes: list[str]) -> int | None:
    if compiled is None:
        return None
    try:
        from .backend import xla as _xla
        return _xla.cpu_fusions(compiled)
    except ImportError:
        notes.append("fusions counted from the HLO text (jaxrewrite.backend.xla not available)")
        return count_fusions(compiled.as_text())
    except Exception as e:  # noqa: BLE001 - recorded in the notes; the figure is left out
        notes.append(f"fusions not counted: {type(e).__name__}: {e}")
        return None


# An instruction whose opcode is `fusion`: `%fusion.3 = f32[4]{0} fusion(...)`, also with a tuple
# shape and as ROOT. Fusions nested inside a fusion's body (`calls=%fused_computation`) are part
# of that fusion and are not counted again.
_FUSION = re.compile(r"^\s*(?:ROOT\s+)?%?[\w.\-]+\s*=\s*(?:\([^()]*\)|[^\s(]+)\s+fusion\(")
_CALLS = re.compile(r"calls=%?([\w.\-]+)")
_COMPUTATION = re.compile(r"^(?:ENTRY\s+)?%?([\w.\-]+)\s.*\{\s*$")


def count_fusions(hlo_text: str) -> int:
    """Fusion instructions in an HLO module's text, outside fusion bodies."""
    bodies = {m.group(1) for line in hlo_text.splitlines() if _FUSION.match(line)
              for m in [_CALLS.search(line)] if m}
    count, current = 0, None
    for line in hlo_text.splitlines():
        m = _COMPUTATION.match(line)
        if m:
            current = m.group(1)
        elif current not in bodies and _FUSION.match(line):
            count += 1
    return count


def _gpu_target(requested, notes: list[str]) -> str | None:
    if requested is None:
        return None
    try:
        from .backend import xla as _xla
        ok = _xla.gpu_aot_available()
    except (ImportError, AttributeError):
        ok = False
    if not ok:
        if requested != "auto":
            raise RuntimeError(f"explain(gpu_target={requested!r}) needs the gpu-aot extra: "
                               f"pip install 'jaxrewrite[gpu-aot]'")
        notes.append("GPU kernels not counted (install the gpu-aot extra)")
        return None
    return "h200" if requested == "auto" else requested


def _gpu_kernels(jitted, args, kwargs, target: str, notes: list[str]) -> int | None:
    """Kernels of `jitted` compiled for `target` without a GPU (`backend.xla`'s deviceless
    compiler)."""
    from .backend import xla as _xla
    try:
        def place(x):
            if hasattr(x, "shape") and hasattr(x, "dtype"):
                return _xla.gpu_specs(x, target=target)[0]
            return x
        args, kwargs = jax.tree_util.tree_map(place, (args, kwargs))
        return _xla.gpu_kernels(jitted.trace(*args, **kwargs).lower().compile())
    except Exception as e:  # noqa: BLE001 - the CPU figures stand without it
        notes.append(f"{target} kernels not counted: {type(e).__name__}: {e}")
        return None


# --- naming ------------------------------------------------------------------------------------

def _fresh(fun):
    """A new function object calling `fun`: `jax.jit`'s caches have not seen it."""
    @functools.wraps(fun)
    def fresh(*args, **kwargs):
        return fun(*args, **kwargs)
    return fresh


def _name(fun) -> str:
    return getattr(fun, "__name__", None) or type(fun).__name__


def _shapes(args, kwargs) -> str:
    def one(x):
        try:
            t = jax.typeof(x)
        except TypeError:
            return repr(x)
        short = getattr(t, "str_short", None)
        return short(short_dtypes=True) if short is not None else str(t)
    leaves = jax.tree_util.tree_leaves((args, kwargs))
    return ", ".join(one(x) for x in leaves)


def _unique(xs):
    return list(dict.fromkeys(xs))


# --- the table ---------------------------------------------------------------------------------

def format_explanation(e: Explanation) -> str:
    opts = ", ".join(f"{k}={v!r}" for k, v in e.options.items()) or "defaults"
    lines = [f"explain {e.name}({e.shapes})  backend={e.backend}  options: {opts}", ""]
    rows = [("", "jax.jit", "optimize")]

    def row(label, before, after, fmt=str):
        rows.append((label, "-" if before is None else fmt(before),
                     "-" if after is None else fmt(after)))

    row("equations", e.eqns_before, e.eqns_after)
    row("inner jaxprs", e.jaxprs_before, e.jaxprs_after)
    row("MLIR functions", e.functions_before, e.functions_after)
    row(f"fusions ({e.backend})", e.fusions_before, e.fusions_after)
    if e.gpu_target:
        row(f"{e.gpu_target} kernels", e.kernels_before, e.kernels_after)
    ms = lambda s: f"{s * 1e3:.1f}"  # noqa: E731
    b, t = e.baseline_timings, e.timings
    row("trace ms", b.get("trace"), t.get("trace"), ms)
    row("rewrite ms", None, t.get("rewrite"), ms)
    for k, v in t.items():
        if k.startswith("pass."):
            row(f"  {k[5:]} ms", None, v, ms)
    row("restage ms", None, t.get("restage"), ms)
    row("lower ms", b.get("lower"), t.get("lower"), ms)
    row("compile ms", b.get("compile"), t.get("compile"), ms)
    row("total ms", b.get("total"), t.get("total"), ms)
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    for r in rows:
        lines.append(f"  {r[0]:<{widths[0]}}  {r[1]:>{widths[1]}}  {r[2]:>{widths[2]}}")
    lines += ["", f"rewrites applied: {len(e.rewrites)}"]
    lines += _events(e.rewrites)
    lines += [f"declined: {len(e.declines)}"]
    lines += _events(e.declines)
    for err in e.errors:
        lines.append(f"error: {err}")
    for n in e.notes:
        lines.append(f"note: {n}")
    return "\n".join(lines)


def _events(events) -> list[str]:
    """One line per distinct (pass, before, after, location, reason), with a count."""
    groups = collections.Counter((ev.pass_name, ev.before, ev.after, ev.location, ev.reason)
                                 for ev in events)
    out = []
    for (pass_name, before, after, loc, reason), n in groups.items():
        what = " ".join(before) or "-"
        if reason is None or after:  # (an applied rewrite's reason is its note)
            what += " -> " + (" ".join(after) or "-")
        line = f"  {pass_name:<10} {what:<40} {loc or '(no location)'}"
        if n > 1:
            line += f"  x{n}"
        if reason:
            line += f"  -- {reason}"
        out.append(line)
    return out
