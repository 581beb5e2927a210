"""`vidroute replay`'s text report and time options."""

from __future__ import annotations

from datetime import UTC, datetime

import click
import pytest

from clients import cli_replay
from vidroute.scheduler.v1 import routing_pb2


def _report() -> routing_pb2.ReplayReport:
    return routing_pb2.ReplayReport(
        decisions=3,
        changed=2,
        recorded=routing_pb2.ReplayTotals(
            policy_version="router-v1",
            estimated_cost_micros=1_800_000,
            cost_per_success_micros=1_800_000,
            cost_per_success_low_micros=900_000,
            selected=2,
            expected_success=0.5,
            expected_latency_s=30.0,
        ),
        replayed=routing_pb2.ReplayTotals(
            policy_version="cheap",
            estimated_cost_micros=600_000,
            cost_per_success_micros=600_000,
            cost_per_success_low_micros=400_000,
            cost_per_success_high_micros=1_200_000,
            selected=2,
            expected_success=0.5,
            expected_latency_s=30.0,
        ),
        changes=[
            routing_pb2.ReplayChange(
                task_id="7",
                decision_no=1,
                recorded_selected="p/a/x",
                replayed_selected="p/b/x",
                cost_delta_micros=-600_000,
            )
        ],
        shadow_recorded=3,
        shadow_agreements=1,
    )


def test_the_text_report_puts_recorded_and_replayed_side_by_side() -> None:
    """Totals in two columns (an unbounded interval says so), shadow agreement, each listed
    change with its signed cost delta, and a count of the changes not listed."""
    lines = cli_replay.render(_report()).splitlines()
    assert lines[0] == "3 decisions replayed, 2 changed"
    cost = next(line for line in lines if line.startswith("estimated cost"))
    assert cost.split()[2:] == ["1.800000", "0.600000"]
    per = next(line for line in lines if line.startswith("cost per success"))
    assert "[0.900000 .. unbounded]" in per
    assert "[0.400000 .. 1.200000]" in per
    assert "hard-filter differences: none" in lines
    assert "recorded shadow picks agreeing: 1/3" in lines
    assert "7  1  p/a/x  ->  p/b/x  -0.600000" in lines
    assert lines[-1] == "(1 more changes not listed)"


def test_times_without_a_zone_are_utc_and_bad_ones_are_usage_errors() -> None:
    """--since 2026-11-24 means midnight UTC; a non-ISO time is a usage error naming the option."""
    ts = cli_replay._instant("2026-11-24", "--since")
    assert ts is not None
    assert ts.ToDatetime(tzinfo=UTC) == datetime(2026, 11, 24, tzinfo=UTC)
    assert cli_replay._instant(None, "--since") is None
    with pytest.raises(click.BadParameter, match="ISO 8601"):
        cli_replay._instant("last week", "--since")
