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


def _report(*, rows: bool, errors: bool) -> ReconciliationReport:
    run = REPORT.runs[0]
    clean = RunReport(**{**{f: getattr(run, f) for f in run.__slots__}, "discrepancies": ()})
    return ReconciliationReport(
        REPORT.day,
        (run if rows else clean,),
        REPORT.errors if errors else (),
        (),
    )


@pytest.mark.parametrize(
    ("rows", "errors", "code", "verdict"),
    [
        (False, False, 0, "result: clean"),
        (True, False, 1, "result: discrepancies found"),
        (False, True, 2, "result: NOT RECONCILED"),
        (True, True, 2, "result: NOT RECONCILED"),
    ],
)
def test_exit_codes_clean_0_rows_1_unread_2(
    rows: bool, errors: bool, code: int, verdict: str
) -> None:
    """A clean day exits 0, a day with rows 1, and any unread account 2 even with rows (never
    0 with an account unread); the table and the JSON say the same verdict."""
    report = _report(rows=rows, errors=errors)
    assert reconcile_cli.exit_code(report) == code
    assert any(line.startswith(verdict) for line in reconcile_cli.report_lines(report))
    assert reconcile_cli.report_json(report)["exit_code"] == code


def test_an_unsupported_provider_is_not_reconciled() -> None:
    """The Gemini API's Veo has no usage export: its account is unread, so the day exits 2."""
    unsupported = AccountError("google", "main", "UNSUPPORTED_CAPABILITY", "no usage export")
    report = ReconciliationReport(REPORT.day, (), (unsupported,), ())
    assert reconcile_cli.exit_code(report) == 2
    assert "NOT RECONCILED: UNSUPPORTED_CAPABILITY" in "\n".join(reconcile_cli.report_lines(report))


def test_a_one_shot_runs_deadlines_keep_a_floor_the_time_factor_cannot_shrink(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """At time factor 0.02 the control plane's ListUsage deadline is 0.6 s; the reconcile run's
    is never under `ONE_SHOT_MIN_DEADLINE_S`, while its other timings stay scaled."""
    from controlplane import bootstrap
    from controlplane.reconciliation import clients

    built: dict[str, dict[str, object]] = {}

    def capture(tls: object, address: str, timing: dict[str, object]) -> object:
        built[address] = dict(timing)
        return object()

    monkeypatch.setattr(clients, "adapter_client", capture)
    clients.adapter_clients(
        bootstrap.Settings(time_scale=0.02, adapters={"runway": "127.0.0.1:50061"})
    )
    timing = built["127.0.0.1:50061"]
    assert timing["timeout_s"] == clients.ONE_SHOT_MIN_DEADLINE_S
    assert timing["fetch_timeout_s"] == 18.0  # 900 s x 0.02 is above the floor: kept
    assert timing["reconnect_max_s"] == pytest.approx(0.1)  # not a deadline: scaled as before
