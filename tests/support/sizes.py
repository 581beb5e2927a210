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

from hypothesis import settings

# Set by tests/conftest.py (pytest_configure) before any test module is imported.
LONG = False
LONG_PROFILE = "long"
settings.register_profile(LONG_PROFILE, max_examples=1_000)


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
