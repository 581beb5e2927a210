"""The console's task list reads a page in a fixed number of statements, whatever its size."""

from __future__ import annotations

import re
from typing import Any

import httpx
import pytest
from sqlalchemy import event
from sqlalchemy.ext.asyncio import AsyncEngine

from controlplane.api.auth import Authenticator
from controlplane.console.app import Console
from controlplane.persistence.database import Database
from controlplane.service.console_reads import ConsoleReads
from controlplane.service.tasks import TaskService
from tests.integration.persistence.builders import Scenario

pytestmark = pytest.mark.timeout(120)


def _statements(engine: AsyncEngine) -> list[str]:
    seen: list[str] = []

    @event.listens_for(engine.sync_engine, "before_cursor_execute")
    def _record(_conn: Any, _cursor: Any, statement: str, *_rest: Any) -> None:
        if not statement.startswith(("BEGIN", "COMMIT", "ROLLBACK")):  # SQLite's per read
            seen.append(statement)

    return seen


async def _list_page(console: Console, seen: list[str]) -> tuple[set[int], str, int]:
    """The task ids the /tasks page lists, its text, and the statements it ran."""
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=console.app), base_url="http://console.test"
    ) as browser:
        before = len(seen)
        page = await browser.get("/tasks")
        ran = len(seen) - before
    assert page.status_code == 200, page.text[:300]
    return {int(m) for m in re.findall(r'href="/tasks/(\d+)"', page.text)}, page.text, ran


async def test_the_task_list_reads_50_rows_in_the_statements_of_one(
    db: Database, engine: AsyncEngine
) -> None:
    """A page of 50 tasks with attempts runs as many queries as a page of 1 (the accounts, the
    page, its attempts: 3), and every row still names its attempt's provider."""
    build = Scenario(db)
    account = await build.account()
    console = Console(Authenticator({}), ConsoleReads(TaskService(db), db))
    first = await build.attempt(account)
    seen = _statements(engine)
    ids_one, _, one = await _list_page(console, seen)
    assert ids_one == {first.task_id}
    more = [await build.attempt(account) for _ in range(49)]
    ids_fifty, text, fifty = await _list_page(console, seen)
    assert ids_fifty == {first.task_id, *(a.task_id for a in more)}
    assert text.count("<td>runway</td>") == 50  # each row's provider, from the one attempts read
    assert fifty == one, seen[-fifty:]
    assert one == 3, seen[-one:]
