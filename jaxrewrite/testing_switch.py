"""A pytest plugin: run any test suite with the switch on, unchanged.

    python -m pytest -p jaxrewrite.testing_switch --pyargs optax
    JAXREWRITE_SWITCH_OPTIONS="reroll=True,gathers=all" \
        python -m pytest -p jaxrewrite.testing_switch ...

Loading the plugin turns the switch on (`jaxrewrite.enable`) before any test module is imported,
with the options in `JAXREWRITE_SWITCH_OPTIONS` (comma-separated `name=value`, as
`python -m jaxrewrite --option` takes them). The terminal summary ends with one line: how many
programs went through a rewrite, how many it changed, and how many fell back; under pytest-xdist
(`-n`), those of every worker.
"""
from __future__ import annotations

import os

import pytest

from . import _switch
from .__main__ import _option

ENV = "JAXREWRITE_SWITCH_OPTIONS"


def options_from_env() -> dict:
    text = os.environ.get(ENV, "").strip()
    return dict(_option(part.strip()) for part in text.split(",") if part.strip())


def pytest_configure(config):
    _switch.enable(**options_from_env())


def pytest_unconfigure(config):
    _switch.disable()


_KEY = "jaxrewrite_switch"
_WORKERS: dict[str, int] = {}   # the counts xdist's workers sent back (the controller's)


def pytest_sessionfinish(session):
    """On an xdist worker: send this process's counts to the controller."""
    out = getattr(session.config, "workeroutput", None)
    if out is not None:
        out[_KEY] = dict(_switch.STATS)


@pytest.hookimpl(optionalhook=True)   # an xdist hook: absent without xdist
def pytest_testnodedown(node, error):
    for k, v in getattr(node, "workeroutput", {}).get(_KEY, {}).items():
        _WORKERS[k] = _WORKERS.get(k, 0) + v


def pytest_terminal_summary(terminalreporter):
    s = {k: v + _WORKERS.get(k, 0) for k, v in _switch.STATS.items()}
    terminalreporter.write_line(
        f"jaxrewrite switch: {s['traced']} programs traced through a rewrite, "
        f"{s['rewritten']} changed by it, {s['fell_back']} fell back")
