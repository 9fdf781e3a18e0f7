"""The clients set: real libraries through `optimize` (the `clients` extra, its own venv).

    pip install -e ".[test,clients]" && python -m pytest -q -m clients tests/clients

Where a library is not importable (the README's test venv), every test here is skipped with the
reason, rather than failing; the default `-m "not slow and not clients"` deselects them anyway.
"""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "bench"))
from extras import skip_where_missing  # noqa: E402  (tests/extras.py)
import clients  # noqa: E402  (bench/clients.py: the programs; imports no library until called)

HERE = os.path.dirname(os.path.abspath(__file__))


def pytest_collection_modifyitems(config, items):
    skip_where_missing(items, HERE, clients.missing(), "test,clients")
