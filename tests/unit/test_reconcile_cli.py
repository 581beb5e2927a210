"""`vidroute reconcile`: its arguments and printing (the run: tests/e2e)."""

from __future__ import annotations

import json
from datetime import UTC, date, datetime

import pytest

from clients import cli, reconcile_cli
from controlplane.domain.reconciliation import Discrepancy, DiscrepancyKind
from controlplane.reconciliation import AccountError, ReconciliationReport, RunReport

ROW = Discrepancy(
    kind=DiscrepancyKind.DUPLICATE_CHARGE,
    provider="google",
    account="main",
    model="veo",
    billed_micros=1_600_000,
    expected_micros=0,
    currency="USD",
    attempt_id=7,
    task_id=3,
    provider_job_id="op-1",
    record_ids=(1, 2),
    evidence={"matched_by": "provider_job_id"},
)
REPORT = ReconciliationReport(
    date(2026, 11, 30),
    (
        RunReport(
            run_id=1,
            provider="google",
            account="main",
            billed_micros=3_200_000,
            expected_micros=1_600_000,
            delta_micros=1_600_000,
            currency="USD",
            record_count=2,
            status_counts={"duplicate": 1, "matched": 1},
            discrepancies=(ROW,),
            created_at=datetime(2026, 12, 1, tzinfo=UTC),
        ),
    ),
    (AccountError("runway", "main", "UNAVAILABLE", "sidecar away"),),
    (1,),
)


def test_date_defaults_to_none_and_is_checked() -> None:
    """--date is optional (None: yesterday) and parsed as YYYY-MM-DD; anything else is a usage
    error (exit code 2)."""

    def day(*args: str) -> object:
        with reconcile_cli.command.make_context("reconcile", list(args)) as ctx:
            return ctx.params["day"]

    assert day() is None
    assert day("--date", "2026-11-30") == date(2026, 11, 30)
    assert cli.main(["reconcile", "--date", "30/11/2026"]) == 2


def test_table_prints_micros_exactly() -> None:
    text = "\n".join(reconcile_cli.report_lines(REPORT))
    assert "3.200000" in text
    assert "1.600000" in text
    assert "duplicate=1 matched=1" in text
    assert "DUPLICATE_CHARGE" in text
    assert "attempt 7 task 3 job op-1" in text
    assert "runway" in text
    assert "NOT RECONCILED: UNAVAILABLE" in text
    assert reconcile_cli.money(-1) == "-0.000001"


def test_json_has_every_row_field() -> None:
    data = json.loads(json.dumps(reconcile_cli.report_json(REPORT)))
    [run] = data["runs"]
    [row] = run["discrepancies"]
    assert row["kind"] == "DUPLICATE_CHARGE"
    assert row["record_ids"] == [1, 2]
    assert row["delta_micros"] == 1_600_000
    assert row["suggested_action"]
    assert data["errors"][0]["error_class"] == "UNAVAILABLE"
    assert data["written_runs"] == [1]


def test_a_future_day_is_refused_before_anything_runs(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["reconcile", "--date", "2999-01-01"]) == 2
    assert "after today" in capsys.readouterr().err
