"""`vidroute usage import` against the database (issue 23: a bill for every provider): a file is
stored once, covers its days, and a row it cannot read stores nothing (exit 2, line and
column); `reconcile` then reads the imported day instead of the adapter."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, date, datetime
from pathlib import Path

import pytest

from clients import cli
from controlplane.persistence.database import Database
from controlplane.persistence.reconciliation_store import accounts_of
from controlplane.reconciliation import run_day
from controlplane.reconciliation.bills import imported_records
from tests.integration.persistence.builders import Scenario
from vidroute_core.adapter import UsageResult

DAY = date(2026, 12, 5)
ROW = {
    "service": {"description": "Generative Language API"},
    "sku": {"description": "Veo 3.1 Video Generation"},
    "usage_start_time": "2026-12-05 10:00:00 UTC",
    "usage_end_time": "2026-12-05 11:00:00 UTC",
    "usage": {"amount": 4, "unit": "seconds"},
    "cost": 1.6,
    "currency": "USD",
    "labels": [],
}


class _Unsupported:
    """An adapter without usage (the Gemini API): reconcile must not need it for the day."""

    async def usage_result(self, account: str, start: datetime, end: datetime) -> UsageResult:
        raise AssertionError("the imported bill is read, not the adapter")


async def _main(argv: list[str]) -> int:
    return await asyncio.to_thread(cli.main, argv)


async def test_import_once_then_reconcile_reads_it(
    db: Database,
    database_url: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Stored once (the same file again: created false), the day's charge is reconciled from
    it: one aggregate record of 1 600 000 micros, no local attempt, so one unexplained row."""
    await Scenario(db).account()
    monkeypatch.setenv("VIDROUTE_DATABASE_URL", database_url)
    path = tmp_path / "bill.json"
    path.write_text(json.dumps(ROW) + "\n", encoding="utf-8")
    argv = ["usage", "import", str(path), "--provider", "runway", "--json"]
    assert await _main(argv) == 0
    first = json.loads(capsys.readouterr().out)
    assert (first["created"], first["covers_from"], first["cost_micros"]) == (
        True,
        "2026-12-05",
        1_600_000,
    )
    assert await _main(argv) == 0
    assert json.loads(capsys.readouterr().out)["created"] is False
    found = await imported_records(db, "runway", first["account"], DAY)
    assert found is not None
    [record] = found[1]
    assert (record.model, record.cost_micros, record.provider_milliunits) == (
        "veo-3.1-generate-preview",
        1_600_000,
        4000,
    )
    report = await run_day(
        db, {"runway": _Unsupported()}, DAY, now=datetime(2026, 12, 6, tzinfo=UTC)
    )
    assert report.errors == ()
    assert [d.kind.value for d in report.discrepancies] == ["CHARGE_WITHOUT_LOCAL_JOB"]


async def test_an_unreadable_row_stores_nothing(
    db: Database,
    database_url: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A bad cost on line 2: exit 2, the line and column named, no import for the day."""
    await Scenario(db).account()
    monkeypatch.setenv("VIDROUTE_DATABASE_URL", database_url)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(ROW) + "\n" + json.dumps({**ROW, "cost": "1,6"}) + "\n", "utf-8")
    assert await _main(["usage", "import", str(path), "--provider", "runway"]) == 2
    err = capsys.readouterr().err
    assert "line 2: cost" in err
    assert await _main(["usage", "import", str(path), "--provider", "google"]) == 2
    assert "line 2" in capsys.readouterr().err
    async with db.reading() as conn:
        accounts = await accounts_of(conn)
    [(_, account)] = accounts
    assert await imported_records(db, "runway", account, DAY) is None
