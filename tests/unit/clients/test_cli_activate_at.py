"""``--at`` of the document commands: a zoned ISO 8601 time or a delay from now, nothing else."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import click
import pytest

from clients.cli_documents import parse_at, release_fields

NOW = datetime(2026, 12, 5, 12, 0, tzinfo=UTC)


def test_delays_and_zoned_times() -> None:
    """+90s / +30m / +2h / +1d count from now; Z and offsets are read as given."""
    assert parse_at("+90s", NOW) == NOW + timedelta(seconds=90)
    assert parse_at("+30m", NOW) == NOW + timedelta(minutes=30)
    assert parse_at("+2h", NOW) == NOW + timedelta(hours=2)
    assert parse_at("+1d", NOW) == NOW + timedelta(days=1)
    assert parse_at("2026-12-05T14:00:00Z") == datetime(2026, 12, 5, 14, tzinfo=UTC)
    assert parse_at("2026-12-05T15:00:00+01:00") == datetime(2026, 12, 5, 14, tzinfo=UTC)


@pytest.mark.parametrize("text", ["2026-12-05T14:00:00", "tomorrow", "+5w", "-1h", ""])
def test_a_time_without_a_zone_or_a_bad_delay_is_a_usage_error(text: str) -> None:
    """A time without a zone is refused, not guessed; so is anything else unreadable."""
    with pytest.raises(click.BadParameter):
        parse_at(text, NOW)


def test_release_fields_leave_activate_at_unset_without_at() -> None:
    """No --at: no activate_at field (active now); --staged only where the request has it."""
    assert release_fields(None, "why", staged=True) == {"reason": "why", "staged": True}
    assert "staged" not in release_fields(None, "")
    stamp = release_fields("2026-12-05T14:00:00Z", "")["activate_at"]
    assert stamp.ToDatetime(UTC) == datetime(2026, 12, 5, 14, tzinfo=UTC)
