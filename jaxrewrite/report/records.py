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

from .. import _compat as C

logger = logging.getLogger("jaxrewrite")


class Event:
    """One rewrite applied or declined.

    `location` (the user's `file.py:line`) is looked up when first read: finding the user's frame
    in a traceback costs more than recording the event (a 10k-equation program records over a
    thousand), and most reports are never read. Only source infos are kept until then, never
    equations (whose literals may be large).
    """
    __slots__ = ("pass_name", "before", "after", "reason", "_location", "_where")

    def __init__(self, pass_name: str, before: tuple, after: tuple, location: str | None = None,
                 reason: str | None = None, *, where=None):
        self.pass_name = pass_name
        self.before = before          # primitive name(s) replaced
        self.after = after            # primitive name(s) emitted
        self.reason = reason          # a decline's reason; an applied rewrite's note
        self._location = location
        self._where = where           # (source info, the call sites' source infos), unread

    @property
    def location(self) -> str | None:
        if self._where is not None:
            si, sites = self._where
            loc = C.source_location(si) if si is not None else None
            if loc is None:
                loc = next((l for l in map(C.source_location, reversed(sites)) if l is not None),
                           None)
            self._location, self._where = loc, None
        return self._location

    def _key(self):
        return (self.pass_name, self.before, self.after, self.location, self.reason)

    def __eq__(self, other):
        return isinstance(other, Event) and self._key() == other._key()

    def __hash__(self):
        return hash(self._key())

    def __repr__(self):
        return (f"Event(pass_name={self.pass_name!r}, before={self.before!r}, "
                f"after={self.after!r}, location={self.location!r}, reason={self.reason!r})")

    def to_dict(self) -> dict:
        return dict(pass_name=self.pass_name, before=self.before, after=self.after,
                    location=self.location, reason=self.reason)


@dataclasses.dataclass
class Report:
    rewrites: list[Event] = dataclasses.field(default_factory=list)
    declines: list[Event] = dataclasses.field(default_factory=list)
    counts: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    timings: dict[str, float] = dataclasses.field(default_factory=dict)
    stats: dict[str, Any] = dataclasses.field(default_factory=dict)
    errors: list[str] = dataclasses.field(default_factory=list)

    # -- recording (used by passes) --
    def applied(self, pass_name: str, eqn, after=(), n: int = 1, note: str | None = None) -> None:
        """`note`: the decision's estimate, shown after the rewrite (explain)."""
        after = tuple(a if isinstance(a, str) else a.primitive.name for a in after)
        self.rewrites.append(Event(pass_name, _prims(eqn), after, reason=note,
                                   where=_where(eqn)))
        self.counts[f"{pass_name}.applied"] += n

    def declined(self, pass_name: str, eqn, reason: str) -> None:
        ev = Event(pass_name, _prims(eqn), (), reason=reason, where=_where(eqn))
        self.declines.append(ev)
        self.counts[f"{pass_name}.declined"] += 1
        if logger.isEnabledFor(logging.DEBUG):
            logger.debug("%s declined at %s: %s", pass_name, ev.location, reason)

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


def _where(eqn) -> tuple:
    """What `Event.location` is looked up from: the equation's source info, then (where JAX cut
    the traceback at a jit boundary) the enclosing call sites' (outermost first; read from the
    innermost)."""
    if isinstance(eqn, (list, tuple)):
        eqn = eqn[0] if eqn else None
    sites = tuple(e.source_info for e in getattr(_SITES, "stack", ()))
    return (None if eqn is None else eqn.source_info, sites)


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
