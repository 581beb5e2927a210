"""The durable fair queue's reads: group heads, in-flight counts, the DRR checkpoint (9.12.4).

PostgreSQL holds the queue: every QUEUED row of ``generation_tasks``. The dispatcher never scans
it. It reads, per (service class, tenant, user, priority) group, the next few *due* tasks (a
requeue whose ``not_before`` is still ahead does not block its group: it is skipped in the head
query itself), so a light tenant's one task behind a million-task flood is as visible as the
flood's own head. How, per backend:

* PostgreSQL: a recursive skip scan walks the partial index ``ix_generation_tasks_queued_group``
  (revision 0008) from one group to the next, one index probe per group, and a LATERAL join reads
  each group's first rows by id. Work per round is O(groups x rows per group), never O(backlog).
  On 1M queued rows (20 groups) it runs in ~1.2 ms; a window function (``row_number() OVER
  (PARTITION BY group ORDER BY id)``) over the same rows took 8.8 s, so PostgreSQL does not use it.
* SQLite (the embedded default): the same skip scan; heads by that window function over the
  QUEUED rows of the found groups. Simpler, O(backlog), fine for its scale.

How many rows a group gets is set per round: ``rows // groups``, clipped to
``[1, per_group_max]``. A group that returned that many may hold more (`QueueHeads.partial`):
when the fair queue needs it again after its rows ran out, it names it (`FairQueue.drained`)
and the dispatcher reads its next rows (`more`), so the order is that of reading every row.
In-flight tasks are one ``GROUP BY tenant_id`` aggregate, not rows. Heads are a light
projection (no spec); the full rows of a round's take are read once (`tasks`).

The known limit: a round costs O(groups), ~70 us per group (bench/RESULTS.md: 3,601 groups,
263 ms), and past ``max_groups`` the groups last in index order are not seen that round. A
per-tenant user cursor (read only the next users of the tenants served) would remove it.

``fair_queue_state`` is the deficit round robin's checkpoint per shard, written by the leader
after each round that served something: a new leader starts from it and serves in the order the
old one would have. Losing it loses no task, only the last round's credit and debt.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from sqlalchemy import Integer, bindparam, func, select, text
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.engine import RowMapping
from sqlalchemy.ext.asyncio import AsyncConnection

from controlplane.domain.states import TaskState
from controlplane.persistence import _rows
from controlplane.persistence.models import fair_queue_state as S
from controlplane.persistence.models import generation_tasks as T
from controlplane.persistence.records import TaskRecord
from vidroute_core.spec import ServiceClass

if TYPE_CHECKING:
    from controlplane.persistence.database import Database

__all__ = ["GroupKey", "QueueHead", "QueueHeads", "QueueQueries", "oldest_by_class"]

GroupKey = tuple[str, str, str, float]  # service class, tenant, user, priority (an integer)

_TYPED = frozenset({"created_at", "deadline_at", "queue_deadline_at"})

# Next group after g: the index's first QUEUED entry past g's key (row comparison, one probe).
_GROUPS = """
WITH RECURSIVE g(sc, te, us, pr) AS (
  SELECT * FROM (
    SELECT service_class, tenant_id, user_id, priority FROM generation_tasks
    WHERE status = 'QUEUED'
    ORDER BY service_class, tenant_id, user_id, priority LIMIT 1
  ) AS first_group
  UNION ALL
  SELECT t.service_class, t.tenant_id, t.user_id, t.priority
  FROM g JOIN generation_tasks t ON t.id = (
    SELECT t2.id FROM generation_tasks t2
    WHERE t2.status = 'QUEUED'
      AND (t2.service_class, t2.tenant_id, t2.user_id, t2.priority) > (g.sc, g.te, g.us, g.pr)
    ORDER BY t2.service_class, t2.tenant_id, t2.user_id, t2.priority, t2.id LIMIT 1
  )
),
groups AS (SELECT * FROM g LIMIT :max_groups)
"""

# A requeued task whose latest requeue asks to wait is not a head yet.
_DUE = """
  (t.status_version = 0 OR NOT EXISTS (
    SELECT 1 FROM task_requeues r
    WHERE r.task_id = t.id AND r.not_before > :now
      AND r.id = (SELECT max(r2.id) FROM task_requeues r2 WHERE r2.task_id = t.id)
  ))
"""

_PER_GROUP = (
    "(SELECT CASE WHEN count(*) = 0 THEN 1"
    " ELSE {max}(1, {min}(:per_group_max, :rows / count(*))) END FROM groups)"
)
_OUTPUT_FIELDS = ("duration_ms", "width", "height", "sample_count")
# Only what ordering, deadlines and cost units need: parsing every head's spec was most of a
# round's cost (~0.2 ms a row); the full rows of the round's take are read afterwards (`tasks`).
_LIGHT = (
    "{t}.id, {t}.tenant_id, {t}.user_id, {t}.project_id, {t}.service_class, {t}.priority,"
    " {t}.status_version, {t}.created_at, {t}.deadline_at, {t}.queue_deadline_at"
)


def _heads_sql(postgres: bool) -> str:
    if postgres:
        per_group = _PER_GROUP.format(max="greatest", min="least")
        output = ", ".join(
            f"CAST(t.spec -> 'output' ->> '{f}' AS bigint) AS {f}" for f in _OUTPUT_FIELDS
        )
        return (
            _GROUPS
            + f"""
SELECT h.*, {per_group} AS per_group FROM groups CROSS JOIN LATERAL (
  SELECT {_LIGHT.format(t="t")}, {output} FROM generation_tasks t
  WHERE t.status = 'QUEUED' AND t.service_class = groups.sc AND t.tenant_id = groups.te
    AND t.user_id = groups.us AND t.priority = groups.pr AND {_DUE}
  ORDER BY t.id LIMIT {per_group}
) AS h
ORDER BY h.service_class, h.tenant_id, h.user_id, h.priority, h.id
"""
        )
    per_group = _PER_GROUP.format(max="max", min="min")
    output = ", ".join(f"json_extract(t.spec, '$.output.{f}') AS {f}" for f in _OUTPUT_FIELDS)
    return (
        _GROUPS
        + f"""
SELECT ranked.*, {per_group} AS per_group FROM (
  SELECT {_LIGHT.format(t="t")}, {output}, row_number() OVER (
    PARTITION BY t.service_class, t.tenant_id, t.user_id, t.priority ORDER BY t.id
  ) AS head_rank
  FROM generation_tasks t JOIN groups
    ON t.service_class = groups.sc AND t.tenant_id = groups.te
   AND t.user_id = groups.us AND t.priority = groups.pr
  WHERE t.status = 'QUEUED' AND {_DUE}
) AS ranked
WHERE head_rank <= {per_group}
ORDER BY service_class, tenant_id, user_id, priority, id
"""
    )


_HEADS_POSTGRESQL, _HEADS_SQLITE = _heads_sql(True), _heads_sql(False)


def _more_sql(postgres: bool) -> str:
    """One group's next due rows after an id (a refill: one index range scan)."""
    if postgres:
        output = ", ".join(
            f"CAST(t.spec -> 'output' ->> '{f}' AS bigint) AS {f}" for f in _OUTPUT_FIELDS
        )
    else:
        output = ", ".join(f"json_extract(t.spec, '$.output.{f}') AS {f}" for f in _OUTPUT_FIELDS)
    return f"""
SELECT {_LIGHT.format(t="t")}, {output} FROM generation_tasks t
WHERE t.status = 'QUEUED' AND t.service_class = :sc AND t.tenant_id = :te AND t.user_id = :us
  AND t.priority = :pr AND t.id > :after AND {_DUE}
ORDER BY t.service_class, t.tenant_id, t.user_id, t.priority, t.id LIMIT :k
"""


_MORE_POSTGRESQL, _MORE_SQLITE = _more_sql(True), _more_sql(False)


@dataclass(frozen=True, slots=True)
class QueueHead:
    """A QUEUED task as the fair queue sees it (no spec: its output size is enough)."""

    id: int
    tenant_id: str
    user_id: str
    project_id: str
    service_class: ServiceClass
    priority: int
    status_version: int
    created_at: datetime
    deadline_at: datetime | None
    queue_deadline_at: datetime | None
    duration_ms: int
    width: int
    height: int
    sample_count: int

    @property
    def group(self) -> GroupKey:
        return (self.service_class.value, self.tenant_id, self.user_id, self.priority)


def _head(m: RowMapping) -> QueueHead:
    return QueueHead(
        id=m["id"],
        tenant_id=m["tenant_id"],
        user_id=m["user_id"],
        project_id=m["project_id"],
        service_class=ServiceClass(m["service_class"]),
        priority=m["priority"],
        status_version=m["status_version"],
        created_at=m["created_at"],
        deadline_at=m["deadline_at"],
        queue_deadline_at=m["queue_deadline_at"],
        # Absent in a spec means the codec's default: one sample; a size of 0 is refused earlier.
        duration_ms=int(m["duration_ms"] or 0),
        width=int(m["width"] or 0),
        height=int(m["height"] or 0),
        sample_count=int(m["sample_count"] or 1),
    )


def _types() -> dict[str, Any]:
    """Result types the text queries need: timestamps as aware UTC (SQLite), JSON numbers."""
    out: dict[str, Any] = {c.name: c.type for c in T.c if c.name in _TYPED}
    return out | {f: Integer() for f in _OUTPUT_FIELDS}


async def _count_by_tenant(conn: AsyncConnection, states: Sequence[TaskState]) -> dict[str, int]:
    result = await conn.execute(
        select(T.c.tenant_id, func.count())
        .where(T.c.status.in_([s.value for s in states]))
        .group_by(T.c.tenant_id)
    )
    return {tenant: int(n) for tenant, n in result}


def oldest_by_class(heads: Iterable[QueueHead], now: datetime) -> dict[str, float]:
    """Seconds the oldest queued task of each service class has waited (groups are FIFO, so
    the heads hold each class's oldest)."""
    out: dict[str, float] = {}
    for h in heads:
        cls = h.service_class.value
        out[cls] = max(out.get(cls, 0.0), (now - h.created_at).total_seconds())
    return out


@dataclass(frozen=True, slots=True)
class QueueHeads:
    """One round's view of the queue: due heads of every group, grouped, oldest first."""

    tasks: list[QueueHead]
    # Groups that returned `per_group` rows and so may hold more due tasks than were read.
    partial: frozenset[GroupKey]
    groups: int
    per_group: int
    in_flight: dict[str, int]  # tasks per tenant in the states asked for


class QueueQueries:
    """The dispatcher's queue reads and its DRR checkpoint (one I/O seam: the database)."""

    def __init__(self, db: Database) -> None:
        self._db = db

    async def heads(
        self,
        *,
        now: datetime,
        rows: int,
        per_group_max: int,
        max_groups: int = 10_000,
        in_flight_states: Sequence[TaskState] = (),
    ) -> QueueHeads:
        """The due heads of every group: about `rows` rows in all, at most `per_group_max` each;
        with the in-flight counts per tenant of `in_flight_states`, on the same connection."""
        rows, per_group_max = max(1, rows), max(1, per_group_max)
        async with self._db.reading() as conn:
            postgres = conn.dialect.name == "postgresql"
            if postgres:
                # The per-group LIMIT is a subquery, so the planner guesses thousands of rows per
                # group and JIT-compiles a ~1 ms query for ~350 ms (EXPLAIN on 1M queued rows).
                await conn.execute(text("SET LOCAL jit = off"))
            sql = _HEADS_POSTGRESQL if postgres else _HEADS_SQLITE
            stmt = (
                text(sql)
                .bindparams(bindparam("now", type_=T.c.created_at.type))
                .columns(**_types(), per_group=Integer())
            )
            result = await conn.execute(
                stmt,
                {
                    "now": now,
                    "rows": rows,
                    "per_group_max": per_group_max,
                    "max_groups": max_groups,
                },
            )
            found = result.mappings().all()
            in_flight = await _count_by_tenant(conn, in_flight_states) if in_flight_states else {}
        tasks = [_head(m) for m in found]
        per_group = int(found[0]["per_group"]) if found else 1
        counts: dict[GroupKey, int] = {}
        for task in tasks:
            counts[task.group] = counts.get(task.group, 0) + 1
        groups = len(counts)
        partial = frozenset(k for k, n in counts.items() if n >= per_group)
        return QueueHeads(tasks, partial, groups, per_group, in_flight)

    async def more(
        self, group: GroupKey, *, after_id: int, now: datetime, limit: int
    ) -> list[QueueHead]:
        """The group's next `limit` due tasks after `after_id` (a drained partial group)."""
        async with self._db.reading() as conn:
            sql = _MORE_POSTGRESQL if conn.dialect.name == "postgresql" else _MORE_SQLITE
            stmt = (
                text(sql)
                .bindparams(bindparam("now", type_=T.c.created_at.type))
                .columns(**_types())
            )
            sc, te, us, pr = group
            result = await conn.execute(
                stmt,
                {
                    "now": now,
                    "sc": sc,
                    "te": te,
                    "us": us,
                    "pr": int(pr),
                    "after": after_id,
                    "k": max(1, limit),
                },
            )
            return [_head(m) for m in result.mappings()]

    async def tasks(self, ids: Sequence[int]) -> dict[int, TaskRecord]:
        """The full rows of `ids` that are still QUEUED (a round's take), in one read."""
        if not ids:
            return {}
        async with self._db.reading() as conn:
            result = await conn.execute(
                select(T).where(T.c.id.in_(list(ids)), T.c.status == TaskState.QUEUED.value)
            )
            return {m["id"]: _rows.task(m) for m in result.mappings()}

    async def in_flight_by_tenant(self, states: Sequence[TaskState]) -> dict[str, int]:
        """How many tasks each tenant has in `states`: one aggregate, no rows."""
        async with self._db.reading() as conn:
            return await _count_by_tenant(conn, states)

    async def load_state(self, shard: int) -> dict[str, Any] | None:
        """The shard's last DRR checkpoint, or None."""
        async with self._db.reading() as conn:
            state = await conn.scalar(select(S.c.state).where(S.c.shard == shard))
            return dict(state) if state is not None else None

    async def save_state(self, shard: int, state: Mapping[str, Any], now: datetime) -> None:
        """Replace the shard's checkpoint (one upsert)."""
        async with self._db.unit(now) as u:
            conn = u.conn
            insert = pg_insert if conn.dialect.name == "postgresql" else sqlite_insert
            stmt = insert(S).values(shard=shard, state=dict(state), updated_at=now)
            await conn.execute(
                stmt.on_conflict_do_update(
                    index_elements=[S.c.shard],
                    set_={"state": stmt.excluded.state, "updated_at": stmt.excluded.updated_at},
                )
            )
