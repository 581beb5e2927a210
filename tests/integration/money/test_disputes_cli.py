"""`vidroute disputes` against the database (issue 23: a dispute's states changed by an admin
command): open books a row once, move walks the machine, a refused move exits 2 with the
numbers and changes nothing."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime, timedelta

import pytest

from clients import cli
from controlplane.persistence.database import Database
from controlplane.reconciliation import read_report, run_day
from tests.integration.api.test_billing_api import _Bill
from tests.integration.persistence.builders import Scenario

NOW = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)


async def _main(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = await asyncio.to_thread(cli.main, list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


async def test_open_move_and_refusals(
    db: Database,
    database_url: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A charge nobody made: open (OPEN, 250 000 confirmed), open again (the same dispute),
    disputed, a refund above the loss refused, refunded; a move from REFUNDED refused."""
    monkeypatch.setenv("VIDROUTE_DATABASE_URL", database_url)
    await Scenario(db).account()
    day = NOW.date() - timedelta(days=2)
    await run_day(db, {"runway": _Bill()}, day, now=NOW)
    [row] = [d for r in (await read_report(db, day)).runs for d in r.discrepancies]
    rid = str(row.row_id)
    code, out, err = await _main(capsys, "disputes", "open", rid, "--reason", "r", "--json")
    assert code == 0, err
    [opened] = json.loads(out)
    assert (opened["state"], opened["confirmed_micros"], opened["discrepancy_id"]) == (
        "OPEN", 250_000, row.row_id
    )  # fmt: skip
    code, out, _ = await _main(capsys, "disputes", "open", rid, "--reason", "again", "--json")
    assert code == 0
    assert json.loads(out)[0]["dispute_id"] == opened["dispute_id"]
    did = str(opened["dispute_id"])
    assert (await _main(capsys, "disputes", "move", did, "disputed", "--reason", "c"))[0] == 0
    code, _, err = await _main(
        capsys, "disputes", "move", did, "refunded", "--reason", "x", "--refunded-micros", "250001"
    )
    assert code == 2
    assert "FAILED_PRECONDITION" in err
    assert "booked_micros=250000" in err
    code, out, _ = await _main(
        capsys, "disputes", "move", did, "refunded", "--reason", "memo",
        "--refunded-micros", "250000", "--json",
    )  # fmt: skip
    assert code == 0
    assert json.loads(out)[0]["state"] == "REFUNDED"
    code, _, err = await _main(capsys, "disputes", "move", did, "written_off", "--reason", "no")
    assert code == 2
    assert "REFUNDED cannot become WRITTEN_OFF" in err
    code, out, _ = await _main(capsys, "disputes", "list", "--state", "REFUNDED")
    assert code == 0
    assert "REFUNDED" in out
    assert "refunded 0.250000" in out
