"""Catalog reads for routing and the admin API: accounts, the capability and price versions
effective at an instant (each capability with the price effective then), their history, queued
and in-flight tasks, the failover facts of queued tasks (``task_exclusions`` rows, read from
PostgreSQL, the source of truth, never from a cache), and health events.

Read-only: publication, decisions without an attempt and health rows are written through the
unit of work (`unit.SqlUnitOfWork.publish` / `record_decision` / `record_health_events`). The
record types of both sides live here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

from sqlalchemy import and_, func, or_, select

from controlplane.domain.requeue import RequeueFacts
from controlplane.domain.states import AttemptState, TaskState
from controlplane.persistence import _rows, exclusions
from controlplane.persistence.errors import PersistenceError
from controlplane.persistence.models import generation_tasks as T
from controlplane.persistence.models import (
    provider_accounts,
    provider_health_events,
    provider_jobs,
    provider_model_capabilities,
    provider_price_versions,
    task_attempts,
)
from controlplane.persistence.records import TaskRecord

if TYPE_CHECKING:
    from controlplane.persistence.database import Database

PA, PMC, PPV, PHE = (
    provider_accounts,
    provider_model_capabilities,
    provider_price_versions,
    provider_health_events,
)


class CatalogConflict(PersistenceError):
    """A publication contradicts what is stored (an immutable version with another body)."""


@dataclass(frozen=True, slots=True)
class AccountSpec:
    """A provider account to upsert; identity is (provider, account_name, region)."""

    provider: str
    account_name: str
    region: str
    credential_ref: str
    status: str = "ACTIVE"
    config: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class CapabilityVersion:
    """One capability version to publish; `document` is the schema-valid entry."""

    provider: str
    account_name: str
    region: str
    model: str
    model_version: str
    capability_version: str
    lifecycle: str
    document: Mapping[str, Any]
    effective_from: datetime


@dataclass(frozen=True, slots=True)
class PriceVersion:
    """One price version to publish, integer micros per `unit`."""

    provider: str
    account_name: str
    region: str
    model: str
    price_version: str
    unit: str
    price_micros_per_unit: int
    currency: str
    effective_from: datetime


@dataclass(frozen=True, slots=True)
class PublishCounts:
    accounts: int = 0
    capabilities_inserted: int = 0
    capabilities_unchanged: int = 0
    prices_inserted: int = 0
    prices_unchanged: int = 0


@dataclass(frozen=True, slots=True)
class AccountRecord:
    id: int
    provider: str
    account_name: str
    region: str
    credential_ref: str
    status: str
    config: Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class CapabilityRecord:
    """A stored capability version joined with its account and effective price."""

    id: int
    account: AccountRecord
    model: str
    model_version: str
    capability_version: str
    lifecycle: str
    document: Mapping[str, Any]
    effective_from: datetime
    effective_to: datetime | None
    price_version: str | None = None
    price_micros_per_unit: int | None = None
    currency: str | None = None


@dataclass(frozen=True, slots=True)
class HealthEvent:
    provider_account_id: int
    model: str | None
    operation: str
    old_state: str
    new_state: str
    reason: str
    metrics: Mapping[str, Any]
    occurred_at: datetime


def _account(row: Mapping[str, Any]) -> AccountRecord:
    return AccountRecord(
        id=row["id"],
        provider=row["provider"],
        account_name=row["account_name"],
        region=row["region"],
        credential_ref=row["credential_ref"],
        status=row["status"],
        config=dict(row["config"] or {}),
    )


def _effective(table: Any, at: datetime) -> Any:
    return and_(
        table.c.effective_from <= at, or_(table.c.effective_to.is_(None), table.c.effective_to > at)
    )


@dataclass(frozen=True, slots=True)
class FinishedJob:
    """A provider job that ended: what the routing health windows learn from it (9.13.3)."""

    job_id: int  # ours (provider_jobs.id): the page key with `completed_at`
    provider: str
    account_name: str
    model: str
    succeeded: bool
    started_at: datetime  # the submit's start (else the attempt's creation)
    completed_at: datetime
    actual_cost_micros: int | None
    estimated_cost_micros: int


# The states a provider job ends in (its `normalized_status` is its attempt's state).
_ENDED_JOB_STATES = tuple(
    s.value for s in (AttemptState.SUCCEEDED, AttemptState.FAILED, AttemptState.CANCELLED)
)


class CatalogQueries:
    """Read-only catalog queries over one `Database`; each call reads on its own connection."""

    def __init__(self, db: Database) -> None:
        self._db = db

    # ---- catalog reads ----------------------------------------------------------------------

    async def accounts(self) -> list[AccountRecord]:
        async with self._db.reading() as conn:
            rows = await conn.execute(select(PA).order_by(PA.c.id))
            return [_account(dict(r)) for r in rows.mappings()]

    async def effective_capabilities(self, at: datetime) -> list[CapabilityRecord]:
        """Capability versions effective at `at`, each with the price effective then."""
        async with self._db.reading() as conn:
            caps = (
                (
                    await conn.execute(
                        select(
                            PMC,
                            PA.c.provider,
                            PA.c.account_name,
                            PA.c.region,
                            PA.c.credential_ref,
                            PA.c.status,
                            PA.c.config,
                        )
                        .join(PA, PA.c.id == PMC.c.provider_account_id)
                        .where(_effective(PMC, at))
                        .order_by(PMC.c.id)
                    )
                )
                .mappings()
                .all()
            )
            prices = (
                (await conn.execute(select(PPV).where(_effective(PPV, at)).order_by(PPV.c.id)))
                .mappings()
                .all()
            )
        by_key: dict[tuple[int, str], list[Any]] = {}
        for p in prices:
            by_key.setdefault((p["provider_account_id"], p["model"]), []).append(p)
        out = []
        for row in caps:
            doc = dict(row["capabilities"])
            wanted = str(doc.get("commercial", {}).get("price_version", ""))
            options = by_key.get((row["provider_account_id"], row["model"]), [])
            price = next((p for p in options if p["price_version"] == wanted), None)
            price = price or (options[-1] if options else None)
            account = _account({**row, "id": row["provider_account_id"]})
            out.append(
                CapabilityRecord(
                    id=row["id"],
                    account=account,
                    model=row["model"],
                    model_version=row["model_version"],
                    capability_version=row["capability_version"],
                    lifecycle=row["lifecycle_status"],
                    document=doc,
                    effective_from=row["effective_from"],
                    effective_to=row["effective_to"],
                    price_version=price["price_version"] if price else None,
                    price_micros_per_unit=price["price_micros_per_unit"] if price else None,
                    currency=price["currency"] if price else None,
                )
            )
        return out

    async def capability_history(self, account_id: int, model: str) -> list[CapabilityRecord]:
        """Every stored version of a model on an account, oldest first (audit)."""
        async with self._db.reading() as conn:
            rows = (
                (
                    await conn.execute(
                        select(PMC, PA)
                        .join(PA, PA.c.id == PMC.c.provider_account_id)
                        .where(PMC.c.provider_account_id == account_id, PMC.c.model == model)
                        .order_by(PMC.c.effective_from)
                    )
                )
                .mappings()
                .all()
            )
        return [
            CapabilityRecord(
                id=r[PMC.c.id],
                account=_account({k.name: r[k] for k in PA.c}),
                model=r[PMC.c.model],
                model_version=r[PMC.c.model_version],
                capability_version=r[PMC.c.capability_version],
                lifecycle=r[PMC.c.lifecycle_status],
                document=dict(r[PMC.c.capabilities]),
                effective_from=r[PMC.c.effective_from],
                effective_to=r[PMC.c.effective_to],
            )
            for r in rows
        ]

    async def price_history(self, account_id: int, model: str) -> list[dict[str, Any]]:
        """Every stored price version of a model on an account, oldest first."""
        async with self._db.reading() as conn:
            rows = await conn.execute(
                select(PPV)
                .where(PPV.c.provider_account_id == account_id, PPV.c.model == model)
                .order_by(PPV.c.effective_from)
            )
            return [dict(r) for r in rows.mappings()]

    # ---- scheduling reads ------------------------------------------------------------------

    async def tasks_in_states(
        self, states: Sequence[TaskState], *, limit: int = 1000
    ) -> list[TaskRecord]:
        """Tasks in `states`, oldest first (the durable queue of 9.12.4)."""
        async with self._db.reading() as conn:
            rows = await conn.execute(
                select(T)
                .where(T.c.status.in_([s.value for s in states]))
                .order_by(T.c.id)
                .limit(limit)
            )
            return [_rows.task(r) for r in rows.mappings()]

    async def requeue_facts(self, task_ids: Sequence[int]) -> dict[int, RequeueFacts]:
        """The failover facts of every requeued task among `task_ids`, in one read."""
        async with self._db.reading() as conn:
            return await exclusions.load_facts(conn, task_ids)

    async def attempt_count(self, task_id: int) -> int:
        async with self._db.reading() as conn:
            n = await conn.scalar(
                select(func.count())
                .select_from(task_attempts)
                .where(task_attempts.c.task_id == task_id)
            )
            return int(n or 0)

    async def health_events(
        self, *, provider_account_id: int | None = None, limit: int = 100
    ) -> list[HealthEvent]:
        """Newest first."""
        query = select(PHE).order_by(PHE.c.id.desc()).limit(limit)
        if provider_account_id is not None:
            query = query.where(PHE.c.provider_account_id == provider_account_id)
        async with self._db.reading() as conn:
            rows = await conn.execute(query)
            return [
                HealthEvent(
                    r["provider_account_id"],
                    r["model"],
                    r["operation"],
                    r["old_state"],
                    r["new_state"],
                    r["reason"],
                    dict(r["metrics_snapshot"]),
                    r["occurred_at"],
                )
                for r in rows.mappings()
            ]

    async def finished_jobs(
        self, since: datetime, after: tuple[datetime, int] | None = None, limit: int = 10_000
    ) -> list[FinishedJob]:
        """Provider jobs that ended at or after `since`, oldest first, one page of `limit`
        after the (completed_at, job id) key `after` (the last job of the previous page): the
        history the health windows are rebuilt from at start."""
        PJ, TA = provider_jobs, task_attempts
        query = (
            select(
                PJ.c.id,
                PA.c.provider,
                PA.c.account_name,
                TA.c.provider_model,
                PJ.c.normalized_status,
                func.coalesce(TA.c.request_started_at, TA.c.created_at).label("started_at"),
                PJ.c.completed_at,
                TA.c.actual_cost_micros,
                TA.c.estimated_cost_micros,
            )
            .join(TA, TA.c.id == PJ.c.attempt_id)
            .join(PA, PA.c.id == PJ.c.provider_account_id)
            .where(
                PJ.c.completed_at >= since,
                PJ.c.normalized_status.in_(_ENDED_JOB_STATES),
            )
            .order_by(PJ.c.completed_at, PJ.c.id)
            .limit(limit)
        )
        if after is not None:
            at, job_id = after
            query = query.where(
                or_(PJ.c.completed_at > at, and_(PJ.c.completed_at == at, PJ.c.id > job_id))
            )
        async with self._db.reading() as conn:
            rows = await conn.execute(query)
            return [
                FinishedJob(
                    r["id"],
                    r["provider"],
                    r["account_name"],
                    r["provider_model"],
                    r["normalized_status"] == AttemptState.SUCCEEDED.value,
                    r["started_at"],
                    r["completed_at"],
                    r["actual_cost_micros"],
                    r["estimated_cost_micros"],
                )
                for r in rows.mappings()
            ]
