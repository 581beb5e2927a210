"""Which bills a day's reconciliation reads (issue 23 item 3), on SQLite and PostgreSQL.

Every configured provider account is read through the adapter that *describes* it, whatever
the adapter's key; an account nobody serves is reported, never taken for an empty bill; no
adapter or no account at all is an error that stores nothing; and ``vidroute reconcile`` exits
2 for both. The sources here are stand-ins at the adapter seam (a described account list and a
usage answer), not provider fakes: the real sidecars are tests/e2e.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import func, select

from clients import cli
from controlplane.persistence.database import Database
from controlplane.persistence.models import reconciliation_runs
from controlplane.reconciliation import NothingToReconcile, run_day
from vidroute_core.adapter import AdapterDescription, UsageResult

pytestmark = pytest.mark.timeout(60)
NOW = datetime(2026, 11, 30, 12, tzinfo=UTC)
DAY = NOW.date() - timedelta(days=1)


class _Empty:
    """A usage source billing nothing (a plain source: no Describe)."""

    async def usage_result(self, account: str, start: datetime, end: datetime) -> UsageResult:
        return UsageResult(records=())


class _Described(_Empty):
    """A sidecar stand-in that names the (provider, account) pairs it serves, or is away."""

    def __init__(self, serves: Sequence[tuple[str, str]] = (), away: bool = False) -> None:
        self.serves, self.away = list(serves), away

    async def describe(self) -> AdapterDescription:
        if self.away:
            raise ConnectionError("connect refused 127.0.0.1:1")
        docs = tuple({"provider": p, "account": a, "model": "m"} for p, a in self.serves)
        return AdapterDescription(adapter="x", adapter_version="1", capability_documents=docs)


async def _accounts(db: Database, *pairs: tuple[str, str]) -> None:
    async with db.unit(NOW) as u:
        for provider, name in pairs:
            await u.create_provider_account(
                provider=provider, account_name=name, region="us", credential_ref="sidecar:x"
            )


async def _runs(db: Database) -> int:
    async with db.reading() as conn:
        return int(
            (await conn.execute(select(func.count()).select_from(reconciliation_runs))).scalar_one()
        )


async def test_adapters_are_matched_by_the_accounts_they_describe(db: Database) -> None:
    """``veo`` and ``selfhosted`` (the keys of ``make up``) serve google/main and
    self_hosted/main because their Describe says so; both are read and stored."""
    await _accounts(db, ("google", "main"), ("self_hosted", "main"))
    sources = {
        "veo": _Described([("google", "main")]),
        "selfhosted": _Described([("self_hosted", "main")]),
    }
    report = await run_day(db, sources, DAY, now=NOW)
    assert report.errors == ()
    assert {r.provider for r in report.runs} == {"google", "self_hosted", "credit_ledger"}


async def test_an_account_nobody_serves_is_not_reconciled(db: Database) -> None:
    """An account no adapter describes is NO_ADAPTER; with an adapter away it is UNAVAILABLE
    and names that adapter; the served account is still read."""
    await _accounts(db, ("google", "main"), ("runway", "main"))
    report = await run_day(db, {"runway": _Empty()}, DAY, now=NOW)
    assert [(e.provider, e.error_class) for e in report.errors] == [("google", "NO_ADAPTER")]
    assert "runway" in {r.provider for r in report.runs}
    report = await run_day(db, {"runway": _Empty(), "veo": _Described(away=True)}, DAY, now=NOW)
    [error] = report.errors
    assert (error.provider, error.error_class) == ("google", "UNAVAILABLE")
    assert "veo" in error.message


async def test_nothing_configured_is_an_error_and_stores_nothing(db: Database) -> None:
    """No adapter, or adapters but no provider account: NothingToReconcile, and no run (not
    even the tenant side's) that a console could show as the day's clean report."""
    with pytest.raises(NothingToReconcile, match="adapter"):
        await run_day(db, {}, DAY, now=NOW)
    with pytest.raises(NothingToReconcile, match="account"):
        await run_day(db, {"runway": _Empty()}, DAY, now=NOW)
    assert await _runs(db) == 0


async def test_the_cli_without_adapters_exits_2_and_stores_nothing(
    db: Database,
    database_url: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`vidroute reconcile` beside ``make up`` without VIDROUTE_ADAPTERS: NOT RECONCILED on
    stderr, exit 2, nothing stored (it used to print "discrepancies: 0" and exit 0)."""
    await _accounts(db, ("runway", "main"))
    monkeypatch.setenv("VIDROUTE_DATABASE_URL", database_url)
    monkeypatch.delenv("VIDROUTE_ADAPTERS", raising=False)
    code = await _in_thread(lambda: cli.main(["reconcile", "--date", DAY.isoformat()]))
    assert code == 2
    captured = capsys.readouterr()
    assert "NOT RECONCILED" in captured.err
    assert "discrepancies" not in captured.out
    assert await _runs(db) == 0


async def _in_thread(call: Callable[[], int]) -> int:
    """The CLI runs its own event loop: call it off this test's loop."""
    return await asyncio.to_thread(call)
