"""The corpus: real programs held to the never-worse promise (the `corpus` extra, own venv).

    pip install -e ".[test,clients,corpus]" && python -m pytest -q -m corpus tests/corpus

Where a library is not importable (the README's test venv), every test here is skipped with the
reason; the default `-m "not slow and not clients and not corpus"` deselects them anyway.
"""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "bench"))
from extras import skip_where_missing  # noqa: E402  (tests/extras.py)
import corpus  # noqa: E402  (bench/corpus.py: the programs; imports no library until called)

HERE = os.path.dirname(os.path.abspath(__file__))


def pytest_collection_modifyitems(config, items):
    skip_where_missing(items, HERE, corpus.missing(), "test,clients,corpus")
