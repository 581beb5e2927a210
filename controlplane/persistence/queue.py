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

Which groups a round reads: the (class, tenant) pairs come from a skip scan over tenants (one
probe each), filtered to the dispatcher's shard in the query (sha256 bucket of the tenant, as
`domain.scoring.bucket`; on SQLite that function is registered on the connection); of each
tenant only a *window* of users is read: from the first group past the tenant's cursor (the
last user the dispatcher's window went past, `UserCursors`, carried in the DRR checkpoint) in
index order, wrapping round, at most ~2x the round's share per tenant (at least 4 users). So a
round reads O(tenants x window) groups whatever the backlog and however many users a tenant
has; `max_groups` still bounds it.

``fair_queue_state`` is the deficit round robin's checkpoint per shard, written by the leader
after each round that served something: a new leader starts from it and serves in the order the
old one would have. Losing it loses no task, only the last round's credit and debt.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

from sqlalchemy import Integer, bindparam, func, select, text
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.engine import RowMapping
from sqlalchemy.ext.asyncio import AsyncConnection

from controlplane.domain.scoring import bucket
from controlplane.domain.states import TaskState
from controlplane.persistence import _rows
from controlplane.persistence.models import fair_queue_state as S
from controlplane.persistence.models import generation_tasks as T
from controlplane.persistence.records import TaskRecord
from vidroute_core.spec import ServiceClass

if TYPE_CHECKING:
    from controlplane.persistence.database import Database

__all__ = [
    "GroupKey",
    "QueueHead",
    "QueueHeads",
    "QueueQueries",
    "UserCursors",
    "oldest_by_class",
]

GroupKey = tuple[str, str, str, float]  # service class, tenant, user, priority (an integer)

_TYPED = frozenset({"created_at", "deadline_at", "queue_deadline_at"})

# The (class, tenant) pairs with QUEUED rows: one index probe per tenant (a skip scan), kept
# when the tenant hashes to this shard (`domain.scoring.bucket`: sha256, first 8 bytes, mod n).
_TENANTS = """
WITH RECURSIVE tn(sc, te) AS (
  SELECT * FROM (
    SELECT service_class, tenant_id FROM generation_tasks WHERE status = 'QUEUED'
    ORDER BY service_class, tenant_id LIMIT 1
  ) AS first_tenant
  UNION ALL
  SELECT t.service_class, t.tenant_id FROM tn JOIN generation_tasks t ON t.id = (
    SELECT t2.id FROM generation_tasks t2
    WHERE t2.status = 'QUEUED' AND (t2.service_class, t2.tenant_id) > (tn.sc, tn.te)
    ORDER BY t2.service_class, t2.tenant_id, t2.user_id, t2.priority, t2.id LIMIT 1
  )
),
mine AS (
  SELECT sc, te FROM tn WHERE CAST(:shards AS integer) = 1 OR {bucket} = CAST(:shard AS integer)
),
"""
_BUCKET_POSTGRESQL = (
    "mod(mod(CAST(CAST(CAST('x' || encode(substring(sha256(convert_to(te, 'UTF8')) FROM 1 FOR 8),"
    " 'hex') AS bit(64)) AS bigint) AS numeric) + 18446744073709551616,"
    " 18446744073709551616), CAST(:shards AS integer))"
)
_BUCKET_SQLITE = "vidroute_bucket(te, CAST(:shards AS integer))"
_CURSORS_POSTGRESQL = """
cur AS (
  SELECT * FROM jsonb_to_recordset(CAST(:cursors AS jsonb)) AS c(sc text, te text, us text, pr int)
),
"""
_CURSORS_SQLITE = """
cur AS (
  SELECT json_extract(value, '$.sc') AS sc, json_extract(value, '$.te') AS te,
         json_extract(value, '$.us') AS us, json_extract(value, '$.pr') AS pr
  FROM json_each(:cursors)
),
"""
# Each tenant's window of users: from the first group past the tenant's cursor (the last user
# served), in index order, wrapping round to its first group, at most `cap` groups: a round reads
# O(tenants x cap) groups, not every user's. cap = 2 x the round's share per tenant, at least
# :min_users, at most :per_group_max (a round of B tasks never serves more than B users).
_WINDOWS = """
caps(cap) AS (
  SELECT CASE WHEN count(*) = 0 THEN 1 ELSE {max}(CAST(:min_users AS integer), {min}(
    CAST(:per_group_max AS integer), (2 * :per_group_max + count(*) - 1) / count(*))) END
  FROM mine
),
g(sc, te, us, pr, n, wrapped, cus, cpr) AS (
  SELECT t.service_class, t.tenant_id, t.user_id, t.priority, 1,
         cur.us IS NOT NULL AND (t.user_id, t.priority) <= (cur.us, cur.pr), cur.us, cur.pr
  FROM mine LEFT JOIN cur ON cur.sc = mine.sc AND cur.te = mine.te
  JOIN generation_tasks t ON t.id = COALESCE(
    (SELECT t2.id FROM generation_tasks t2 WHERE t2.status = 'QUEUED'
       AND t2.service_class = mine.sc AND t2.tenant_id = mine.te
       AND cur.us IS NOT NULL AND (t2.user_id, t2.priority) > (cur.us, cur.pr)
     ORDER BY t2.service_class, t2.tenant_id, t2.user_id, t2.priority, t2.id LIMIT 1),
    (SELECT t2.id FROM generation_tasks t2 WHERE t2.status = 'QUEUED'
       AND t2.service_class = mine.sc AND t2.tenant_id = mine.te
     ORDER BY t2.service_class, t2.tenant_id, t2.user_id, t2.priority, t2.id LIMIT 1))
  UNION ALL
  SELECT t.service_class, t.tenant_id, t.user_id, t.priority, g.n + 1,
         g.wrapped OR (t.user_id, t.priority) <= (g.us, g.pr), g.cus, g.cpr
  FROM g JOIN generation_tasks t ON g.n < (SELECT cap FROM caps) AND t.id = COALESCE(
    (SELECT t2.id FROM generation_tasks t2 WHERE t2.status = 'QUEUED'
       AND t2.service_class = g.sc AND t2.tenant_id = g.te
       AND (t2.user_id, t2.priority) > (g.us, g.pr)
       AND (NOT g.wrapped OR (t2.user_id, t2.priority) <= (g.cus, g.cpr))
     ORDER BY t2.service_class, t2.tenant_id, t2.user_id, t2.priority, t2.id LIMIT 1),
    (SELECT t2.id FROM generation_tasks t2 WHERE t2.status = 'QUEUED'
       AND NOT g.wrapped AND g.cus IS NOT NULL
       AND t2.service_class = g.sc AND t2.tenant_id = g.te
       AND (t2.user_id, t2.priority) <= (g.cus, g.cpr)
     ORDER BY t2.service_class, t2.tenant_id, t2.user_id, t2.priority, t2.id LIMIT 1))
),
groups AS (SELECT sc, te, us, pr, n FROM g LIMIT :max_groups)
"""


def _groups_sql(postgres: bool) -> str:
    if postgres:
        return (
            _TENANTS.format(bucket=_BUCKET_POSTGRESQL)
            + _CURSORS_POSTGRESQL
            + _WINDOWS.format(max="greatest", min="least")
        )
    return (
        _TENANTS.format(bucket=_BUCKET_SQLITE)
        + _CURSORS_SQLITE
        + _WINDOWS.format(max="max", min="min")
    )


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
            _groups_sql(True)
            + f"""
SELECT h.*, groups.n AS window_rank, (SELECT cap FROM caps) AS window_cap,
  {per_group} AS per_group FROM groups CROSS JOIN LATERAL (
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
        _groups_sql(False)
        + f"""
SELECT ranked.*, (SELECT cap FROM caps) AS window_cap, {per_group} AS per_group FROM (
  SELECT {_LIGHT.format(t="t")}, {output}, groups.n AS window_rank, row_number() OVER (
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
    out: dict[str, int] = {}
    for (tenant, _), n in (await _count_by_class(conn, states)).items():
        out[tenant] = out.get(tenant, 0) + n
    return out


async def _count_by_class(
    conn: AsyncConnection, states: Sequence[TaskState]
) -> dict[tuple[str, str], int]:
    """Tasks in `states` per (tenant, service class value): one aggregate, no rows."""
    result = await conn.execute(
        select(T.c.tenant_id, T.c.service_class, func.count())
        .where(T.c.status.in_([s.value for s in states]))
        .group_by(T.c.tenant_id, T.c.service_class)
    )
    return {(tenant, str(sc)): int(n) for tenant, sc, n in result}


count_by_class = _count_by_class  # also the tenants' limits view (`tenant_configs.tenant_use`)


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
    """One round's view of the queue: due heads of every group read, grouped, oldest first."""

    tasks: list[QueueHead]
    # Groups that returned `per_group` rows and so may hold more due tasks than were read.
    partial: frozenset[GroupKey]
    groups: int
    per_group: int
    in_flight: dict[str, int]  # tasks per tenant in the states asked for
    # Each group's place in its tenant's window of users (1 = first after the cursor), and the
    # window's size this round: a tenant whose window is full may have users not read.
    ranks: dict[GroupKey, int] = field(default_factory=dict)
    window_cap: int = 0
    # Tasks per (tenant, service class value) in the states asked for (`in_flight` summed).
    in_flight_by_class: dict[tuple[str, str], int] = field(default_factory=dict)


UserCursors = Mapping[tuple[str, str], tuple[str, int]]
"""(service class, tenant) -> (user, priority) of the last group its window went past."""


def _sqlite_bucket(key: str, buckets: int) -> int:
    return bucket(key, buckets)


def _register_bucket(sync_conn: Any) -> None:
    """SQLite has no sha256: the shard filter calls `domain.scoring.bucket`, registered once per
    DBAPI connection."""
    record = sync_conn.connection
    if not record.info.get("vidroute_bucket"):
        record.dbapi_connection.create_function(
            "vidroute_bucket", 2, _sqlite_bucket, deterministic=True
        )
        record.info["vidroute_bucket"] = True


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
        shard: int = 0,
        shard_count: int = 1,
        cursors: UserCursors | None = None,
        min_users: int = 4,
    ) -> QueueHeads:
        """The due heads of the groups in every tenant's window of users: about `rows` rows in
        all, at most `per_group_max` each; only tenants of `shard` (of `shard_count`); each
        tenant's window starts after its cursor (see `_WINDOWS`); with the in-flight counts per
        tenant of `in_flight_states`, on the same connection."""
        rows, per_group_max = max(1, rows), max(1, per_group_max)
        shard_count = max(1, shard_count)
        cursor_rows = [
            {"sc": sc, "te": te, "us": us, "pr": int(pr)}
            for (sc, te), (us, pr) in (cursors or {}).items()
        ]
        async with self._db.reading() as conn:
            postgres = conn.dialect.name == "postgresql"
            if postgres:
                # The per-group LIMIT is a subquery, so the planner guesses thousands of rows per
                # group and JIT-compiles a ~1 ms query for ~350 ms (EXPLAIN on 1M queued rows).
                await conn.execute(text("SET LOCAL jit = off"))
            else:
                await conn.run_sync(_register_bucket)
            sql = _HEADS_POSTGRESQL if postgres else _HEADS_SQLITE
            stmt = (
                text(sql)
                .bindparams(bindparam("now", type_=T.c.created_at.type))
                .columns(
                    **_types(), per_group=Integer(), window_rank=Integer(), window_cap=Integer()
                )
            )
            result = await conn.execute(
                stmt,
                {
                    "now": now,
                    "rows": rows,
                    "per_group_max": per_group_max,
                    "max_groups": max_groups,
                    "shard": shard % shard_count,
                    "shards": shard_count,
                    "cursors": json.dumps(cursor_rows),
                    "min_users": max(1, min_users),
                },
            )
            found = result.mappings().all()
            by_class = await _count_by_class(conn, in_flight_states) if in_flight_states else {}
        in_flight: dict[str, int] = {}
        for (tenant, _), n in by_class.items():
            in_flight[tenant] = in_flight.get(tenant, 0) + n
        tasks = [_head(m) for m in found]
        per_group = int(found[0]["per_group"]) if found else 1
        cap = int(found[0]["window_cap"]) if found else 0
        counts: dict[GroupKey, int] = {}
        ranks: dict[GroupKey, int] = {}
        for task, m in zip(tasks, found, strict=True):
            key = task.group
            counts[key] = counts.get(key, 0) + 1
            ranks[key] = int(m["window_rank"])
        groups = len(counts)
        partial = frozenset(k for k, n in counts.items() if n >= per_group)
        return QueueHeads(tasks, partial, groups, per_group, in_flight, ranks, cap, by_class)

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
