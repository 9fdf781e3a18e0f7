"""Test configuration: hypothesis profiles.

`default` keeps the whole suite within its CI budget (2 cores); `long` is for .ci/run's
time-bounded extended fuzzing (`HYPOTHESIS_PROFILE=long`).
"""
import os

from hypothesis import HealthCheck, settings

settings.register_profile(
    "default", deadline=None, max_examples=25, derandomize=True, print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.register_profile(
    "long", deadline=None, max_examples=2000, print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))
