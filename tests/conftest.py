"""Test configuration: hypothesis profiles.

`default` keeps the whole suite within its CI budget (2 cores); `long` is for .ci/run's
time-bounded extended fuzzing (`HYPOTHESIS_PROFILE=long`).
"""
import os

import numpy as np
import pytest
from hypothesis import HealthCheck, settings

settings.register_profile(
    "default", deadline=None, max_examples=25, derandomize=True, print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.register_profile(
    "long", deadline=None, max_examples=2000, print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))


@pytest.fixture
def map_sizes(monkeypatch):
    """`map_sizes("gather_map")`: spy on that `analysis.indexmap` function; the returned list
    collects the size (elements) of every operand shape it is asked to map."""
    from jaxrewrite.analysis import indexmap as _indexmap

    def record(name):
        sizes, real = [], getattr(_indexmap, name)

        def spy(operand_shape, *a, **k):
            sizes.append(int(np.prod(operand_shape)))
            return real(operand_shape, *a, **k)

        monkeypatch.setattr(_indexmap, name, spy)
        return sizes
    return record
