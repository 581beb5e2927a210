"""Vertex request labels carry the attempt's identity within Cloud's label rules."""

from __future__ import annotations

import re

from hypothesis import given
from hypothesis import strategies as st

from vidroute_core.cloud_labels import label_value

VALID = re.compile(r"[a-z0-9_-]{0,63}")


@given(st.text(max_size=200))
def test_every_key_becomes_a_legal_label_value(key: str) -> None:
    """Whatever the key, its label is at most 63 chars of [a-z0-9_-], the same every time."""
    value = label_value(key)
    assert VALID.fullmatch(value), value
    assert label_value(key) == value


@given(st.from_regex(VALID, fullmatch=True))
def test_a_legal_key_is_its_own_label(key: str) -> None:
    """A key that already obeys the rules is kept verbatim (searchable as is)."""
    assert label_value(key) == key


@given(st.text(min_size=1, max_size=120), st.text(min_size=1, max_size=120))
def test_different_keys_get_different_labels(a: str, b: str) -> None:
    """A rewritten key carries a 48-bit digest of the original: distinct keys get distinct
    labels (barring a digest collision)."""
    if a != b:
        assert label_value(a) != label_value(b)
