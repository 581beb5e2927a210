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


def test_migrated_database_without_adapters_is_not_a_clean_day(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Without VIDROUTE_ADAPTERS no bill can be read: exit 2, NOT RECONCILED, no report (it
    once printed the tenant side alone, "discrepancies: 0", and exited 0)."""
    url = f"sqlite+aiosqlite:///{tmp_path / 'vidroute.db'}"
    asyncio.run(upgrade(url))
    monkeypatch.setenv("VIDROUTE_DATABASE_URL", url)
    monkeypatch.delenv("VIDROUTE_ADAPTERS", raising=False)
    assert cli.main(["reconcile", "--date", "2026-11-30", "--json"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "NOT RECONCILED" in captured.err
