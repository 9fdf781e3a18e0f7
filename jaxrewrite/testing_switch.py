"""A pytest plugin: run any test suite with the switch on, unchanged.

    python -m pytest -p jaxrewrite.testing_switch --pyargs optax
    JAXREWRITE_SWITCH_OPTIONS="reroll=True,gathers=all" \
        python -m pytest -p jaxrewrite.testing_switch ...

Loading the plugin turns the switch on (`jaxrewrite.enable`) before any test module is imported,
with the options in `JAXREWRITE_SWITCH_OPTIONS` (comma-separated `name=value`, as
`python -m jaxrewrite --option` takes them). The terminal summary ends with one line: how many
programs went through a rewrite, how many it changed, and how many fell back.
"""
from __future__ import annotations

import os

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


def pytest_terminal_summary(terminalreporter):
    s = _switch.STATS
    terminalreporter.write_line(
        f"jaxrewrite switch: {s['traced']} programs traced through a rewrite, "
        f"{s['rewritten']} changed by it, {s['fell_back']} fell back")
