"""Tenants documents in the database (design 9.12.1, 9.25.5) and CreateTask's admission read.

Versions and activations are `documents.Documents` over ``tenant_config_versions`` and
``tenant_config_activations`` (revision 0017), published, rolled back and audited exactly as
routing policies are. `queued_count` is what a tenant's ``max_queued`` is checked against;
`tenant_use` is each tenant's current use, for the console's and the metrics' limits view.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncConnection

from controlplane.domain.states import IN_FLIGHT_TASK_STATES, TaskState
from controlplane.persistence.documents import Documents
from controlplane.persistence.models import generation_tasks as T
from controlplane.persistence.models import tenant_config_activations as P
from controlplane.persistence.models import tenant_config_versions as V
from controlplane.persistence.queue import count_by_class

DOCUMENTS = Documents(V, P, "tenant-config-publication")


async def queued_count(conn: AsyncConnection, tenant_id: str, service_class: str) -> int:
    """The tenant's QUEUED tasks of the class (the queue's partial index serves it)."""
    query = select(func.count()).where(
        T.c.status == TaskState.QUEUED.value,
        T.c.service_class == service_class,
        T.c.tenant_id == tenant_id,
    )
    return int((await conn.execute(query)).scalar_one())


# The newest tasks `tenant_use` reads to count recent creations: a bounded backward scan of the
# primary key (ids grow with creation; there is no created_at index on the tasks), so a
# console load or a metrics pass costs the same at any table size. Past it, `creates_capped`.
RECENT_TASKS_READ = 5000


@dataclass(frozen=True, slots=True)
class TenantUse:
    """Current use per tenant: tasks in flight and queued per (tenant, class value), and tasks
    created since a time per tenant (`creates_capped`: the newest RECENT_TASKS_READ were all
    that recent, so the counts are lower bounds)."""

    in_flight: Mapping[tuple[str, str], int]
    queued: Mapping[tuple[str, str], int]
    created: Mapping[str, int]
    creates_capped: bool


async def tenant_use(conn: AsyncConnection, since: datetime) -> TenantUse:
    """Three grouped reads; the state counts are those the dispatcher makes every round."""
    in_flight = await count_by_class(conn, IN_FLIGHT_TASK_STATES)
    queued = await count_by_class(conn, (TaskState.QUEUED,))
    newest = (
        select(T.c.tenant_id, T.c.created_at).order_by(T.c.id.desc()).limit(RECENT_TASKS_READ)
    ).subquery()
    rows = (await conn.execute(select(newest.c.tenant_id, newest.c.created_at))).all()
    created: dict[str, int] = {}
    for tenant, at in rows:
        if at >= since:
            created[tenant] = created.get(tenant, 0) + 1
    capped = len(rows) == RECENT_TASKS_READ and all(at >= since for _, at in rows)
    return TenantUse(in_flight, queued, created, capped)
