"""What a rewrite did: applied rewrites, declines with their reasons, counts and timings.

Passes never print; they record into the `Report` they are handed (`report.applied(...)`,
`report.declined(...)`, `report.count(...)`), and the API, `explain()` and the logger read it.
"""
from __future__ import annotations

import collections
import contextlib
import threading
import dataclasses
import logging
from typing import Any

from . import _compat as C

logger = logging.getLogger("jaxrewrite")


@dataclasses.dataclass(frozen=True)
class Event:
    """One rewrite applied or declined."""
    pass_name: str
    before: tuple[str, ...]          # primitive name(s) replaced
    after: tuple[str, ...]           # primitive name(s) emitted ('' entries never appear)
    location: str | None             # user's `file.py:line`
    reason: str | None = None        # set for a decline

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


@dataclasses.dataclass
class Report:
    rewrites: list[Event] = dataclasses.field(default_factory=list)
    declines: list[Event] = dataclasses.field(default_factory=list)
    counts: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    timings: dict[str, float] = dataclasses.field(default_factory=dict)
    stats: dict[str, Any] = dataclasses.field(default_factory=dict)
    errors: list[str] = dataclasses.field(default_factory=list)

    # -- recording (used by passes) --
    def applied(self, pass_name: str, eqn, after=(), n: int = 1) -> None:
        after = tuple(a if isinstance(a, str) else a.primitive.name for a in after)
        self.rewrites.append(Event(pass_name, _prims(eqn), after, _loc(eqn)))
        self.counts[f"{pass_name}.applied"] += n

    def declined(self, pass_name: str, eqn, reason: str) -> None:
        self.declines.append(Event(pass_name, _prims(eqn), (), _loc(eqn), reason))
        self.counts[f"{pass_name}.declined"] += 1
        logger.debug("%s declined at %s: %s", pass_name, _loc(eqn), reason)

    def count(self, key: str, n: int = 1) -> None:
        self.counts[key] += n

    def time(self, key: str, seconds: float) -> None:
        self.timings[key] = self.timings.get(key, 0.0) + seconds

    def to_dict(self) -> dict:
        return dict(rewrites=[e.to_dict() for e in self.rewrites],
                    declines=[e.to_dict() for e in self.declines],
                    counts=dict(self.counts), timings=dict(self.timings),
                    stats=dict(self.stats), errors=list(self.errors))


def _prims(eqn) -> tuple[str, ...]:
    if eqn is None:
        return ()
    if isinstance(eqn, (list, tuple)):
        return tuple(e.primitive.name for e in eqn)
    return (eqn.primitive.name,)


def _loc(eqn):
    if isinstance(eqn, (list, tuple)):
        eqn = eqn[0] if eqn else None
    loc = C.user_location(eqn) if eqn is not None else None
    if loc is None:
        stack = getattr(_SITES, "stack", ())
        loc = next((l for l in map(C.user_location, reversed(stack)) if l is not None), None)
    return loc


_SITES = threading.local()


def current_call_site():
    """The equation whose nested jaxprs the walker is in now (None at the top level)."""
    stack = getattr(_SITES, "stack", None)
    return stack[-1] if stack else None


@contextlib.contextmanager
def call_site(eqn):
    """While the walker is inside `eqn`'s nested jaxprs, `eqn`'s user line is the fallback
    location of events recorded there."""
    stack = getattr(_SITES, "stack", None)
    if stack is None:
        stack = _SITES.stack = []
    stack.append(eqn)  # its location is computed only if an event needs it
    try:
        yield
    finally:
        stack.pop()


class Decline(Exception):
    """Raised inside a rule when a rewrite does not apply; the message is the reason.

    A decline is normal, not an error: the driver catches it, records it with
    `report.declined(...)` and keeps the original equation.
    """
