"""The queue's group reads at scale (issue 10, 9.12.4): the shard filter runs in the head query,
and a tenant with more users than a round's window is read a window at a time, rotating, with
the window's cursor carried in the DRR checkpoint."""

from __future__ import annotations

import dataclasses
from typing import Any

from sqlalchemy import delete, select

from controlplane.domain.scoring import bucket
from controlplane.domain.states import TaskState
from controlplane.persistence.database import Database
from controlplane.persistence.models import fair_queue_state
from controlplane.persistence.models import generation_tasks as T
from controlplane.persistence.queue import QueueQueries
from controlplane.persistence.records import TaskRecord
from controlplane.scheduling.dispatcher import Dispatcher, DispatcherConfig
from tests.integration.scheduling.conftest import DispatcherFactory
from tests.integration.scheduling.support import NOW, make_spec
from tests.integration.scheduling.test_dispatcher import new_task

USERS = 12


async def wide_tenant(db: Database, tasks_per_user: int = 2) -> None:
    """One tenant with `USERS` users (u00..u11), each user's tasks created together."""
    for u in range(USERS):
        for i in range(tasks_per_user):
            spec = dataclasses.replace(make_spec("wide"), user_id=f"u{u:02d}")
            await new_task(db, spec, key=f"wide-{u}-{i}")


def record_takes(dispatcher: Dispatcher) -> list[list[str]]:
    """Each round's take (its tasks' users, in order), whatever the dispatch outcome."""
    rounds: list[list[str]] = []
    original = dispatcher.dispatch_batch

    async def recording(tasks: list[TaskRecord], facts: Any, **kw: Any) -> Any:
        rounds.append([t.user_id for t in tasks])
        return await original(tasks, facts, **kw)

    dispatcher.dispatch_batch = recording  # type: ignore[method-assign]  # the test swaps in a recording or failing double
    return rounds


async def test_the_shard_filter_runs_in_the_head_query(db: Database) -> None:
    """Each of three shards' head reads holds exactly the tenants hashing to it, and the three
    together hold every tenant."""
    tenants = [f"tenant-{i}" for i in range(12)]
    for t in tenants:
        await new_task(db, make_spec(t), key=f"k-{t}")
    queue = QueueQueries(db)
    seen: set[str] = set()
    for shard in range(3):
        heads = await queue.heads(now=NOW, rows=512, per_group_max=64, shard=shard, shard_count=3)
        mine = {h.tenant_id for h in heads.tasks}
        assert mine == {t for t in tenants if bucket(t, 3) == shard}
        seen |= mine
    assert seen == set(tenants)


async def test_a_tenant_with_many_users_is_read_a_window_at_a_time(db: Database) -> None:
    """Of a tenant with 12 users a round of 2 reads a window of 4 users (the minimum), the
    first 4 in index order when no cursor is set, and from past the cursor when one is."""
    await wide_tenant(db)
    queue = QueueQueries(db)
    heads = await queue.heads(now=NOW, rows=512, per_group_max=2)
    assert heads.window_cap == 4
    assert sorted(g[2] for g in heads.ranks) == ["u00", "u01", "u02", "u03"]
    later = await queue.heads(
        now=NOW, rows=512, per_group_max=2, cursors={("STANDARD", "wide"): ("u09", 0)}
    )
    by_rank = sorted((rank, g[2]) for g, rank in later.ranks.items())
    assert by_rank == [(1, "u10"), (2, "u11"), (3, "u00"), (4, "u01")]  # wrapped round


async def test_every_user_of_a_wide_tenant_is_served_once_before_any_twice(
    db: Database, make_dispatcher: DispatcherFactory
) -> None:
    """Real rounds of 2 over the 12 users walk the windows in index order: the first 6 rounds
    take each user once, the 7th wraps round to the first users again."""
    await wide_tenant(db)
    dispatcher = make_dispatcher(config=DispatcherConfig(batch_size=2))
    rounds = record_takes(dispatcher)
    for _ in range(7):
        await dispatcher.tick()
    taken = [u for r in rounds for u in r]
    assert taken[:USERS] == [f"u{u:02d}" for u in range(USERS)]
    assert taken[USERS:] == ["u00", "u01"]


async def test_a_new_leader_continues_the_windows_from_the_checkpoint(
    db: Database, make_dispatcher: DispatcherFactory
) -> None:
    """After two rounds a new dispatcher's next round is the old one's (the cursor is in the
    checkpoint); without the checkpoint it would start again at the first users."""
    await wide_tenant(db)
    config = DispatcherConfig(batch_size=2)
    first = make_dispatcher(config=config)
    for _ in range(2):
        await first.tick()
    before = await first.next_round()
    assert await make_dispatcher(config=config).next_round() == before
    async with db.unit(NOW) as u:
        await u.conn.execute(delete(fair_queue_state))
    afresh = await make_dispatcher(config=config).next_round()
    assert afresh != before
    async with db.reading() as conn:
        rows = await conn.execute(select(T.c.id, T.c.user_id, T.c.status))
        users = {task_id: (user, status) for task_id, user, status in rows}
    assert [users[i][0] for i in before] == ["u04", "u05"]
    assert all(users[i][1] == TaskState.QUEUED.value for i in before)
