"""The property tests' two sizes (tests/support/sizes.py): `make test` draws the suite's size,
``--long`` the long one, and a long size below the suite's is refused."""

from __future__ import annotations

import pytest

from tests.support import sizes


def test_the_suite_size_unless_long(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without --long `examples` gives the suite's count; with it, the long count."""
    monkeypatch.setattr(sizes, "LONG", False)
    assert sizes.examples(50, long=150) == 50
    monkeypatch.setattr(sizes, "LONG", True)
    assert sizes.examples(50, long=150) == 150


def test_a_long_size_below_the_suites_is_refused() -> None:
    """A long size smaller than the suite's would make `make test-long` the lighter run."""
    with pytest.raises(ValueError, match="must not be below"):
        sizes.examples(200, long=100)
