"""The diff a publication shows against the active version: per path of the parsed document."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from controlplane.domain.document_diff import ABSENT, Change, diff_texts, diff_values

OLD = """
version: t-1
tenants:
  acme:
    service_classes:
      STANDARD: {weight: 2}
      BATCH: {weight: 1}
"""
NEW = """
version: t-2
tenants:
  acme:
    service_classes:
      STANDARD: {weight: 5}   # raised
  studio:
    service_classes: {INTERACTIVE: {weight: 1}}
"""


def test_changes_read_per_path_with_before_and_after() -> None:
    """A changed weight, a removed class and a new tenant each read as one path: before -> after."""
    lines = [str(c) for c in diff_texts(OLD, NEW)]
    assert lines == [
        'tenants.acme.service_classes.BATCH: {"weight": 1} -> (absent)',
        "tenants.acme.service_classes.STANDARD.weight: 2 -> 5",
        'tenants.studio: (absent) -> {"service_classes": {"INTERACTIVE": {"weight": 1}}}',
        "version: t-1 -> t-2",
    ]


def test_formatting_alone_changes_nothing() -> None:
    """Key order, comments and flow style are not changes: the parsed values are compared."""
    reordered = "tenants: {acme: {service_classes: {BATCH: {weight: 1}, STANDARD: {weight: 2}}}}\n"
    assert diff_texts(OLD, "# a comment\nversion: t-1\n" + reordered) == []


def test_nothing_active_shows_every_top_level_key_as_new() -> None:
    """The first publication's diff is against an empty document."""
    assert [c.path for c in diff_texts(None, NEW)] == ["tenants", "version"]
    assert all(c.before == ABSENT for c in diff_texts(None, NEW))


def test_lists_compare_by_position_and_growth_is_a_tail() -> None:
    """A list element that changes names its index; a longer list adds its tail."""
    assert diff_values({"s": [{"m": "a"}, 1]}, {"s": [{"m": "b"}, 1, 2]}) == [
        Change("s[0].m", "a", "b"),
        Change("s[2]", ABSENT, "2"),
    ]


def test_a_type_change_is_one_line_and_long_values_are_shortened() -> None:
    """An int that becomes a string is a change even when it prints alike; long values end '...'."""
    assert diff_values({"w": 1}, {"w": "1"}) == [Change("w", "1", "1")]
    (change,) = diff_values({}, {"big": "x" * 500})
    assert change.after.endswith("...")
    assert len(change.after) == 120


values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=5),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=3)
    ),
    max_leaves=10,
)


@given(values, values)
def test_no_diff_exactly_when_equal(a: object, b: object) -> None:
    """The diff is empty if and only if the two parsed documents are equal (types included)."""
    same = a == b and repr(a) == repr(b)
    assert (diff_values(a, b) == []) == same
