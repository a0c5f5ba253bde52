"""Shared pytest configuration. Generic only: layer-specific fixtures live in
their own test modules (or below, in their own section)."""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

# -- hypothesis ---------------------------------------------------------------
# "ci" is the default everywhere (CI included): at least 1000 examples per
# property, no per-example deadline (a 2**2000 int or a slow CI box must not
# turn into a flaky DeadlineExceeded). A failure prints its falsifying example
# and a @reproduce_failure blob; the local example database (.hypothesis/,
# git-ignored) replays it first on the next run.
# HYPOTHESIS_PROFILE=<name> selects another registered profile.
settings.register_profile(
    "ci",
    max_examples=1000,
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
