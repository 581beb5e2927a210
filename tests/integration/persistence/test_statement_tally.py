"""The statement tally (`persistence.statement_tally`): every statement, and every BEGIN, COMMIT
and ROLLBACK sent, is counted under the stage that sent it, including from tasks that stage
created; an autocommit statement costs no transaction."""

from __future__ import annotations

import asyncio
from collections import Counter

from sqlalchemy import select

from controlplane.persistence.database import Database
from controlplane.persistence.models import generation_tasks
from controlplane.persistence.statement_tally import count_statements, labelled
from tests.integration.persistence.builders import NOW


async def test_statements_and_transactions_are_counted_by_stage(db: Database) -> None:
    """Two statements in one transaction under "poll", one read in a task "submit" created,
    nothing unlabelled."""
    seen: Counter[tuple[str, str]] = Counter()
    count_statements(db.engine, lambda stage, kind: seen.update([(stage, kind)]))

    async def read() -> None:
        async with db.reading() as conn:
            await conn.execute(select(generation_tasks.c.id).limit(1))

    with labelled("poll"):
        async with db.unit(NOW) as u:
            await u.task(1)
            await u.attempt(1)
    with labelled("submit"):
        await asyncio.create_task(read())
    # SQLite's writer sends its BEGIN IMMEDIATE as a statement of its own.
    immediate = 0 if db.engine.dialect.name == "postgresql" else 1
    assert seen[("poll", "statement")] == 2 + immediate
    assert seen[("poll", "transaction")] == 1
    assert seen[("poll", "round_trip")] == 4 + immediate  # BEGIN, two statements, COMMIT
    assert seen[("submit", "statement")] == 1 + immediate  # SQLite: a plain BEGIN, too
    if not immediate:  # PostgreSQL: a read's BEGIN ... ROLLBACK
        assert seen[("submit", "transaction")] == 1
        assert seen[("submit", "round_trip")] == 3
    assert not [key for key in seen if key[0] == "other"]


async def test_an_autocommit_statement_costs_no_transaction(db: Database) -> None:
    """A one-statement unit is one round trip on PostgreSQL (SQLite keeps its transaction)."""
    seen: Counter[tuple[str, str]] = Counter()
    count_statements(db.engine, lambda stage, kind: seen.update([(stage, kind)]))
    with labelled("claim"):
        async with db.unit(NOW, one_statement=True) as u:
            await u.claim_polls("w", limit=4, lease_s=1.0)
    postgres = db.engine.dialect.name == "postgresql"
    assert seen[("claim", "transaction")] == (0 if postgres else 1)
    assert seen[("claim", "round_trip")] == seen[("claim", "statement")] + (0 if postgres else 2)
