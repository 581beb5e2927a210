"""`vidroute reconcile` against databases that cannot be reconciled: clear errors, exit 2."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from clients import cli
from controlplane.persistence.migrate import upgrade


def test_unmigrated_database_is_a_precondition(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("VIDROUTE_DATABASE_URL", f"sqlite+aiosqlite:///{tmp_path / 'fresh.db'}")
    monkeypatch.delenv("VIDROUTE_ADAPTERS", raising=False)
    assert cli.main(["reconcile", "--date", "2026-11-30"]) == 2
    assert "FAILED_PRECONDITION" in capsys.readouterr().err


def test_database_away_is_unavailable(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("VIDROUTE_DATABASE_URL", "postgresql+asyncpg://postgres@127.0.0.1:1/none")
    monkeypatch.delenv("VIDROUTE_ADAPTERS", raising=False)
    assert cli.main(["reconcile", "--date", "2026-11-30"]) == 2
    assert "UNAVAILABLE" in capsys.readouterr().err


def test_migrated_database_without_adapters_reconciles_the_tenant_side(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"sqlite+aiosqlite:///{tmp_path / 'vidroute.db'}"
    asyncio.run(upgrade(url))
    monkeypatch.setenv("VIDROUTE_DATABASE_URL", url)
    monkeypatch.delenv("VIDROUTE_ADAPTERS", raising=False)
    assert cli.main(["reconcile", "--date", "2026-11-30", "--json"]) == 0
    out = capsys.readouterr().out
    assert '"provider": "credit_ledger"' in out
    assert '"discrepancies": []' in out
