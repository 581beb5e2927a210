"""How many examples the heaviest property tests draw: the `make test` size or the long one.

    make test           # examples(50, long=150) draws 50
    make test-long      # pytest --long: draws 150, and hypothesis's "long" profile (every
                        # test without its own count draws 1,000 instead of 100)

The suite's size is what proves each rule on every run (a differential test of two pipelines
still compares hundreds of decisions); the long size is what these tests drew before, for a
deeper search before a release or after touching the code under test. A failing example is
saved in hypothesis's database and replayed first on the next run, whichever the size.
"""

from __future__ import annotations

from hypothesis import HealthCheck, settings

# Set by tests/conftest.py (pytest_configure) before any test module is imported.
LONG = False
LONG_PROFILE = "long"
SUITE_PROFILE = "suite"
# A slow draw is the machine's load, not the test's strategy: on 2 cores at load 20 one draw
# took 1.1 s and failed a health check; a time-based check cannot be part of an honest suite
# (the same reason the tests set `deadline=None`). Both profiles drop both.
settings.register_profile(
    SUITE_PROFILE, suppress_health_check=[HealthCheck.too_slow], deadline=None
)
settings.register_profile(LONG_PROFILE, settings.get_profile(SUITE_PROFILE), max_examples=1_000)
settings.load_profile(SUITE_PROFILE)


def examples(suite: int, *, long: int) -> int:
    """`suite` examples in `make test`, `long` under ``--long``."""
    if suite > long:
        raise ValueError(f"the long size ({long}) must not be below the suite's ({suite})")
    return long if LONG else suite


def use_long_sizes() -> None:
    """Switch to the long sizes (``--long``): call before test modules are imported."""
    global LONG  # noqa: PLW0603 -- one switch for the whole run, read at import time
    LONG = True
    settings.load_profile(LONG_PROFILE)
