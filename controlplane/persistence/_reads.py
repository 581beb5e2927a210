"""Single-row reads shared by the unit of work (locked) and the query modules (internal)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

from sqlalchemy import select, tuple_
from sqlalchemy.engine import RowMapping
from sqlalchemy.ext.asyncio import AsyncConnection

from controlplane.persistence import _rows
from controlplane.persistence.models import attempt_runtime as R
from controlplane.persistence.models import generation_tasks as T
from controlplane.persistence.models import provider_accounts, provider_jobs
from controlplane.persistence.models import task_attempts as A
from controlplane.persistence.records import (
    AccountInfo,
    AttemptRecord,
    AttemptRuntime,
    ProviderJobRecord,
    TaskRecord,
)


async def attempt(conn: AsyncConnection, attempt_id: int, *, lock: bool) -> AttemptRecord | None:
    query = select(A).where(A.c.id == attempt_id)
    found = (await conn.execute(query.with_for_update() if lock else query)).mappings().first()
    return None if found is None else _rows.attempt(found)


async def task(conn: AsyncConnection, task_id: int, *, lock: bool) -> TaskRecord | None:
    query = select(T).where(T.c.id == task_id)
    found = (await conn.execute(query.with_for_update() if lock else query)).mappings().first()
    return None if found is None else _rows.task(found)


async def attempts_and_tasks(
    conn: AsyncConnection, attempt_ids: Sequence[int]
) -> dict[int, tuple[AttemptRecord, TaskRecord]]:
    """The attempts with their tasks, both rows locked, in attempt id order (one statement)."""
    if not attempt_ids:
        return {}
    columns = [c.label(f"a__{c.name}") for c in A.c] + [c.label(f"t__{c.name}") for c in T.c]
    query = (
        select(*columns)
        .join_from(A, T, T.c.id == A.c.task_id)
        .where(A.c.id.in_(sorted(set(attempt_ids))))
        .order_by(A.c.id)
        .with_for_update()
    )
    out = {}
    for m in (await conn.execute(query)).mappings():
        attempt = _rows.attempt(_part(m, "a__"))
        out[attempt.id] = (attempt, _rows.task(_part(m, "t__")))
    return out


def _part(m: RowMapping, prefix: str) -> RowMapping:
    """The columns of one table of a joined row, by their own names."""
    return cast(RowMapping, {k[len(prefix) :]: v for k, v in m.items() if k.startswith(prefix)})


async def task_by_key(
    conn: AsyncConnection, tenant_id: str, idempotency_key: str
) -> TaskRecord | None:
    query = select(T).where(T.c.tenant_id == tenant_id, T.c.idempotency_key == idempotency_key)
    found = (await conn.execute(query)).mappings().first()
    return None if found is None else _rows.task(found)


async def attempts_of(conn: AsyncConnection, task_id: int) -> list[AttemptRecord]:
    rows = await conn.execute(select(A).where(A.c.task_id == task_id).order_by(A.c.attempt_no))
    return [_rows.attempt(m) for m in rows.mappings()]


async def job_of(conn: AsyncConnection, attempt_id: int) -> ProviderJobRecord | None:
    rows = await conn.execute(select(provider_jobs).where(provider_jobs.c.attempt_id == attempt_id))
    found = rows.mappings().first()
    return None if found is None else _rows.provider_job(found)


async def job_by_ref(
    conn: AsyncConnection, account_id: int, job_id: str
) -> ProviderJobRecord | None:
    rows = await conn.execute(
        select(provider_jobs).where(
            provider_jobs.c.provider_account_id == account_id,
            provider_jobs.c.provider_job_id == job_id,
        )
    )
    found = rows.mappings().first()
    return None if found is None else _rows.provider_job(found)


async def account(conn: AsyncConnection, account_id: int) -> AccountInfo:
    query = select(provider_accounts).where(provider_accounts.c.id == account_id)
    return _rows.account_info((await conn.execute(query)).mappings().one())


async def runtime(conn: AsyncConnection, attempt_id: int) -> AttemptRuntime | None:
    rows = await conn.execute(select(R).where(R.c.attempt_id == attempt_id))
    found = rows.mappings().first()
    return None if found is None else _rows.runtime(found)


Held = tuple[AttemptRecord, TaskRecord, ProviderJobRecord | None, AttemptRuntime | None]


async def held(conn: AsyncConnection, attempt_ids: Sequence[int]) -> dict[int, Held]:
    """The attempts with their tasks locked (in attempt id order, as `attempts_and_tasks`),
    each with its job and runtime row (unique per attempt), in ONE statement."""
    if not attempt_ids:
        return {}
    parts = [(A, "a__"), (T, "t__"), (provider_jobs, "j__"), (R, "r__")]
    query = (
        select(*(c.label(f"{prefix}{c.name}") for table, prefix in parts for c in table.c))
        .join_from(A, T, T.c.id == A.c.task_id)
        .outerjoin(provider_jobs, provider_jobs.c.attempt_id == A.c.id)
        .outerjoin(R, R.c.attempt_id == A.c.id)
        .where(A.c.id.in_(sorted(set(attempt_ids))))
        .order_by(A.c.id)
        .with_for_update(of=[A, T])
    )
    out: dict[int, Held] = {}
    for m in (await conn.execute(query)).mappings():
        attempt = _rows.attempt(_part(m, "a__"))
        job = _rows.provider_job(_part(m, "j__")) if m["j__id"] is not None else None
        runtime = _rows.runtime(_part(m, "r__")) if m["r__attempt_id"] is not None else None
        out[attempt.id] = (attempt, _rows.task(_part(m, "t__")), job, runtime)
    return out


async def attempts_of_tasks(
    conn: AsyncConnection, task_ids: Sequence[int]
) -> dict[int, list[AttemptRecord]]:
    """`attempts_of` for many tasks in ONE statement (every task of `task_ids` has a list)."""
    out: dict[int, list[AttemptRecord]] = {t: [] for t in task_ids}
    if not task_ids:
        return out
    rows = await conn.execute(
        select(A)
        .where(A.c.task_id.in_(sorted(set(task_ids))))
        .order_by(A.c.task_id, A.c.attempt_no)
    )
    for m in rows.mappings():
        record = _rows.attempt(m)
        out[record.task_id].append(record)
    return out


async def jobs_by_refs(
    conn: AsyncConnection, refs: Sequence[tuple[int, str]]
) -> dict[tuple[int, str], ProviderJobRecord]:
    """`job_by_ref` for many (account id, provider job id) in ONE statement: the recorded ones."""
    if not refs:
        return {}
    wanted = sorted(set(refs))
    rows = await conn.execute(
        select(provider_jobs).where(
            tuple_(provider_jobs.c.provider_account_id, provider_jobs.c.provider_job_id).in_(wanted)
        )
    )
    out = {}
    for m in rows.mappings():
        job = _rows.provider_job(m)
        out[job.provider_account_id, job.provider_job_id] = job
    return out
