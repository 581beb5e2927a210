"""``python -m controlplane.audit.invariants``: prints the report, exit status 1 on violations."""

from __future__ import annotations

import asyncio
import secrets
import sys
from pathlib import Path

import pytest

from controlplane.audit import Invariant
from controlplane.persistence.database import Database
from tests.integration.audit.history import History, build_history
from tests.integration.audit.tamper import Tamper

REPO_ROOT = Path(__file__).resolve().parents[3]


async def _cli(*args: str) -> tuple[int, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "controlplane.audit.invariants",
        *args,
        cwd=REPO_ROOT,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    out, _ = await proc.communicate()
    assert proc.returncode is not None
    return proc.returncode, out.decode()


async def test_cli_exits_nonzero_only_on_violations(
    database_url: str, history: History, tamper: Tamper
) -> None:
    """The CLI prints the report and exits 0 on a clean database and 1 once a rule is broken."""
    code, out = await _cli(database_url)
    assert (code, out.splitlines()[0]) == (0, "invariant check: OK"), out
    await tamper.sql(
        "UPDATE task_attempts SET attempt_no = 5 WHERE id = :a",
        a=history.attempts[("running", 1)],
    )
    code, out = await _cli(database_url)
    assert code == 1, out
    assert Invariant.I2_ATTEMPT_NUMBERING.value in out


@pytest.mark.redis
async def test_cli_checks_the_redis_lease_store(
    database_url: str, db: Database, redis_server_url: str
) -> None:
    """With --redis the CLI also checks the lease store, which for finished work holds nothing."""
    await build_history(db, live=False)
    namespace = f"vidroute-audit-{secrets.token_hex(4)}:"
    code, out = await _cli(
        database_url, "--redis", redis_server_url, "--redis-namespace", namespace
    )
    assert code == 0, out
    assert "leases=0" in out
