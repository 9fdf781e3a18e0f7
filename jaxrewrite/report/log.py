"""`JAXREWRITE_LOG=1`: one log line per optimized function and argument shapes.

Like `JAX_LOG_COMPILES`, the variable makes the `jaxrewrite` logger speak at WARNING level (so a
plain script shows the lines on stderr without configuring logging); without it, nothing is
logged and nothing is measured. A line reads

    jaxrewrite: f(f32[8,4,4]) rewrites: dedup 9, cse 2 | ms: trace 1.20, rewrite 0.81
    (fold 0.10, dedup 0.52, cse 0.19), jit_trace 2.40, lower 3.41, compile 25.10

`trace` (the user's function to a jaxpr), `rewrite` and each pass are measured by jaxrewrite;
`jit_trace` (all of `jax.jit`'s trace: tracing, rewriting, staging the result), `lower` and
`compile` are the durations JAX itself reports through `jax.monitoring` (the events below, from
`jax/_src/dispatch.py`). The rewrite runs inside `jax.jit`'s trace, before JAX lowers and compiles,
so the line is held back until the next compile in the same thread (normally its own: JAX traces,
lowers and compiles in one go). A function traced but not compiled itself (nested in another
jit, or only `.trace()`d) is logged at that next compile, when its name is traced again, or at
exit, without the phases it did not go through.
"""
from __future__ import annotations

import atexit
import dataclasses
import os
import threading

import jax

from .records import Report, logger

ENV = "JAXREWRITE_LOG"

# jax.monitoring duration events (names as in jax/_src/dispatch.py) -> our phase names. The
# trace event carries the function's name, lowering and compiling carry "jit(<name>)".
_EVENTS = {
    "/jax/core/compile/jaxpr_trace_duration": ("jit_trace", "{}"),
    "/jax/core/compile/jaxpr_to_mlir_module_duration": ("lower", "jit({})"),
    "/jax/core/compile/backend_compile_duration": ("compile", "jit({})"),
}
_BACKLOG = 64  # pending lines per thread before the oldest is written without JAX's phases


def enabled() -> bool:
    """Whether `JAXREWRITE_LOG` asks for logging (read on every trace, so tests can set it)."""
    return os.environ.get(ENV, "").strip().lower() not in ("", "0", "false", "no", "off")


@dataclasses.dataclass
class _Pending:
    name: str
    shapes: str
    report: Report
    jax_phases: dict = dataclasses.field(default_factory=dict)


_local = threading.local()
_installed = False
_install_lock = threading.Lock()
_all_pending: list[list[_Pending]] = []  # every thread's backlog, flushed at exit


def _backlog() -> list[_Pending]:
    b = getattr(_local, "pending", None)
    if b is None:
        b = _local.pending = []
        _all_pending.append(b)
    return b


def rewritten(fun, args, report: Report) -> None:
    """Called by `optimize`'s wrapper right after the rewrite (inside `jax.jit`'s trace)."""
    if not enabled():
        return
    _install()
    name = getattr(fun, "__name__", None) or type(fun).__name__
    backlog = _backlog()
    for old in [p for p in backlog if p.name == name]:  # traced again without a compile between
        backlog.remove(old)
        _emit(old)
    if len(backlog) >= _BACKLOG:
        _emit(backlog.pop(0))
    backlog.append(_Pending(name, ", ".join(_shape(a) for a in args), report))


def _shape(x) -> str:
    t = jax.typeof(x)
    short = getattr(t, "str_short", None)
    return short(short_dtypes=True) if short is not None else str(t)


def _install() -> None:
    global _installed
    with _install_lock:
        if not _installed:
            jax.monitoring.register_event_duration_secs_listener(_on_duration)
            atexit.register(_flush_all)
            _installed = True


def _on_duration(event: str, seconds: float, fun_name: str | None = None, **_kw) -> None:
    spec = _EVENTS.get(event)
    backlog = getattr(_local, "pending", None)
    if spec is None or not backlog:
        return
    phase, pattern = spec
    for p in reversed(backlog):
        if pattern.format(p.name) == fun_name:
            p.jax_phases[phase] = p.jax_phases.get(phase, 0.0) + seconds
            break
    if phase == "compile":
        # A compile ends the trace -> lower -> compile sequence of this thread: whatever was
        # traced before it either belongs to this program (optimized functions nested in it) or
        # was only traced; write them all now rather than later.
        done, backlog[:] = list(backlog), []
        for d in done:
            _emit(d)


def _flush_all() -> None:
    for backlog in _all_pending:
        while backlog:
            _emit(backlog.pop(0))


def _emit(p: _Pending) -> None:
    logger.warning("%s", format_line(p.name, p.shapes, p.report, p.jax_phases))


def format_line(name: str, shapes: str, report: Report, jax_phases: dict | None = None) -> str:
    """The one-line summary: name(shapes), rewrites applied (declines), phases in ms."""
    applied = _per_pass(report.counts, ".applied")
    declined = _per_pass(report.counts, ".declined")
    parts = [f"jaxrewrite: {name}({shapes}) rewrites: {applied or 'none'}"]
    if declined:
        parts.append(f" (declined: {declined})")
    t = dict(report.timings)
    passes = ", ".join(f"{k[5:]} {_ms(v)}" for k, v in t.items() if k.startswith("pass."))
    phases = [f"trace {_ms(t['trace'])}"] if "trace" in t else []
    if "rewrite" in t:
        phases.append(f"rewrite {_ms(t['rewrite'])}" + (f" ({passes})" if passes else ""))
    for k, v in (jax_phases or {}).items():
        phases.append(f"{k} {_ms(v)}")
    if report.errors:
        parts.append(f" FELL BACK: {'; '.join(report.errors)}")
    parts.append(" | ms: " + ", ".join(phases))
    return "".join(parts)


def _per_pass(counts, suffix: str) -> str:
    return ", ".join(f"{k[:-len(suffix)]} {n}" for k, n in sorted(counts.items())
                     if k.endswith(suffix) and n)


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.2f}"
