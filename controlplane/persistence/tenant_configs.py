"""Tenants documents in the database (design 9.12.1, 9.25.5) and CreateTask's admission read.

Versions and activations are `documents.Documents` over ``tenant_config_versions`` and
``tenant_config_activations`` (revision 0017), published, rolled back and audited exactly as
routing policies are. `queued_count` is what a tenant's ``max_queued`` is checked against.
"""

from __future__ import annotations

from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncConnection

from controlplane.domain.states import TaskState
from controlplane.persistence.documents import Documents
from controlplane.persistence.models import generation_tasks as T
from controlplane.persistence.models import tenant_config_activations as P
from controlplane.persistence.models import tenant_config_versions as V

DOCUMENTS = Documents(V, P, "tenant-config-publication")


async def queued_count(conn: AsyncConnection, tenant_id: str, service_class: str) -> int:
    """The tenant's QUEUED tasks of the class (the queue's partial index serves it)."""
    query = select(func.count()).where(
        T.c.status == TaskState.QUEUED.value,
        T.c.service_class == service_class,
        T.c.tenant_id == tenant_id,
    )
    return int((await conn.execute(query)).scalar_one())
