"""`CatalogStore`: the scheduler's queries beside `Store` (capabilities, prices, health, decisions).

What lives here:

* **Publication** (9.6.4, 9.25.5): accounts are upserted; capability and price versions are
  immutable, append-only rows with effective intervals. Publishing a new version closes the open
  one of the same (account, model) at the new ``effective_from``; nothing is ever deleted, and
  re-publishing an identical version is a no-op while a *different* body under an existing
  version is a `CatalogConflict`. One call is one transaction: a batch lands whole or not at all.
* **Reads for routing**: the versions effective at an instant, queued and in-flight tasks, the
  ``task.requeue`` messages of a task (failover exclusions are read from PostgreSQL, the source
  of truth, never from a cache).
* **Decisions without an attempt**: NO_CAPACITY (SCHEDULING -> QUEUED) and NO_ELIGIBLE_CANDIDATE
  (SCHEDULING -> FAILED) record their RouteDecision in the same transaction as the task CAS.
* **Health events** (9.19.6): breaker transitions and operator overrides.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import and_, func, insert, or_, select, update
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from controlplane.domain.states import TaskState
from controlplane.persistence import _rows, _sql
from controlplane.persistence.errors import PersistenceError
from controlplane.persistence.models import generation_tasks as T
from controlplane.persistence.models import outbox as O
from controlplane.persistence.models import (
    provider_accounts,
    provider_health_events,
    provider_model_capabilities,
    provider_price_versions,
    task_attempts,
)
from controlplane.persistence.records import (
    Failure,
    NewOutboxMessage,
    NewRouteDecision,
    RouteDecisionRecord,
    TaskRecord,
)

PA, PMC, PPV, PHE = (
    provider_accounts,
    provider_model_capabilities,
    provider_price_versions,
    provider_health_events,
)
IN_FLIGHT_TASK_STATES = (
    TaskState.SCHEDULING,
    TaskState.SUBMITTING,
    TaskState.RUNNING,
    TaskState.OUTPUT_FETCHING,
)
REQUEUE_TOPIC = "task.requeue"


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


class CatalogStore:
    """Async queries over one engine; every public method is one transaction."""

    def __init__(self, engine: AsyncEngine) -> None:
        self._engine = engine

    # ---- publication ------------------------------------------------------------------------

    async def publish(
        self,
        accounts: Sequence[AccountSpec],
        capabilities: Sequence[CapabilityVersion],
        prices: Sequence[PriceVersion],
        *,
        now: datetime,
    ) -> PublishCounts:
        """Upsert accounts and append capability/price versions, all in one transaction."""
        counts = {"cap_new": 0, "cap_same": 0, "price_new": 0, "price_same": 0}
        async with self._engine.begin() as conn:
            ids = {}
            for spec in accounts:
                ids[(spec.provider, spec.account_name, spec.region)] = await _upsert_account(
                    conn, spec, now
                )
            for cap in capabilities:
                account_id = ids.get((cap.provider, cap.account_name, cap.region))
                if account_id is None:
                    raise CatalogConflict(f"{cap.capability_version}: account not in the batch")
                inserted = await _append_version(
                    conn,
                    PMC,
                    account_id=account_id,
                    model=cap.model,
                    version_col="capability_version",
                    version=cap.capability_version,
                    effective_from=cap.effective_from,
                    body={
                        "model_version": cap.model_version,
                        "lifecycle_status": cap.lifecycle,
                        "capabilities": dict(cap.document),
                    },
                    now=now,
                )
                counts["cap_new" if inserted else "cap_same"] += 1
            for price in prices:
                account_id = ids.get((price.provider, price.account_name, price.region))
                if account_id is None:
                    raise CatalogConflict(f"{price.price_version}: account not in the batch")
                inserted = await _append_version(
                    conn,
                    PPV,
                    account_id=account_id,
                    model=price.model,
                    version_col="price_version",
                    version=price.price_version,
                    effective_from=price.effective_from,
                    body={
                        "unit": price.unit,
                        "price_micros_per_unit": price.price_micros_per_unit,
                        "currency": price.currency,
                    },
                    now=now,
                )
                counts["price_new" if inserted else "price_same"] += 1
        return PublishCounts(
            len(ids),
            counts["cap_new"],
            counts["cap_same"],
            counts["price_new"],
            counts["price_same"],
        )

    # ---- catalog reads ----------------------------------------------------------------------

    async def accounts(self) -> list[AccountRecord]:
        async with self._engine.connect() as conn:
            rows = await conn.execute(select(PA).order_by(PA.c.id))
            return [_account(dict(r)) for r in rows.mappings()]

    async def effective_capabilities(self, at: datetime) -> list[CapabilityRecord]:
        """Capability versions effective at `at`, each with the price effective then."""
        async with self._engine.connect() as conn:
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
        async with self._engine.connect() as conn:
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
        async with self._engine.connect() as conn:
            rows = await conn.execute(
                select(PPV)
                .where(PPV.c.provider_account_id == account_id, PPV.c.model == model)
                .order_by(PPV.c.effective_from)
            )
            return [dict(r) for r in rows.mappings()]

    # ---- scheduling reads and writes ---------------------------------------------------------

    async def tasks_in_states(
        self, states: Sequence[TaskState], *, limit: int = 1000
    ) -> list[TaskRecord]:
        """Tasks in `states`, oldest first (the durable queue of 9.12.4)."""
        async with self._engine.connect() as conn:
            rows = await conn.execute(
                select(T)
                .where(T.c.status.in_([s.value for s in states]))
                .order_by(T.c.id)
                .limit(limit)
            )
            return [_rows.task(r) for r in rows.mappings()]

    async def requeue_payloads(self, task_id: int) -> list[dict[str, Any]]:
        """Every ``task.requeue`` message ever written for the task (done or not), in order."""
        async with self._engine.connect() as conn:
            rows = await conn.execute(
                select(O.c.payload)
                .where(O.c.topic == REQUEUE_TOPIC, O.c.aggregate_id == str(task_id))
                .order_by(O.c.id)
            )
            return [dict(r[0]) for r in rows]

    async def attempt_count(self, task_id: int) -> int:
        async with self._engine.connect() as conn:
            n = await conn.scalar(
                select(func.count())
                .select_from(task_attempts)
                .where(task_attempts.c.task_id == task_id)
            )
            return int(n or 0)

    async def record_decision(
        self,
        task_id: int,
        expected_version: int,
        target: TaskState,
        decision: NewRouteDecision,
        *,
        now: datetime,
        reason: str = "",
        failure: Failure | None = None,
        outbox: Sequence[NewOutboxMessage] = (),
    ) -> RouteDecisionRecord | None:
        """CAS the task from SCHEDULING to `target` and store the decision; None if the CAS lost."""
        async with self._engine.begin() as conn:
            seq = await _sql.cas_task(
                conn,
                task_id,
                expected_version,
                target,
                now=now,
                events=1,
                extra=_sql.task_extra(failure, None, None),
            )
            if seq is None:
                return None
            record = await _sql.insert_decision(conn, task_id, decision, now)
            payload = _sql.state_payload(target, expected_version + 1, reason, failure)
            payload["route_decision_no"] = record.decision_no
            await _sql.append_event(conn, task_id, seq, "task.state_changed", payload, now=now)
            for message in outbox:
                await _sql.enqueue(conn, message, now)
            return record

    # ---- health events -----------------------------------------------------------------------

    async def record_health_events(self, events: Sequence[HealthEvent]) -> None:
        if not events:
            return
        async with self._engine.begin() as conn:
            await conn.execute(
                insert(PHE),
                [
                    {
                        "provider_account_id": e.provider_account_id,
                        "model": e.model,
                        "operation": e.operation,
                        "old_state": e.old_state,
                        "new_state": e.new_state,
                        "reason": e.reason,
                        "metrics_snapshot": dict(e.metrics),
                        "occurred_at": e.occurred_at,
                    }
                    for e in events
                ],
            )

    async def health_events(
        self, *, provider_account_id: int | None = None, limit: int = 100
    ) -> list[HealthEvent]:
        """Newest first."""
        query = select(PHE).order_by(PHE.c.id.desc()).limit(limit)
        if provider_account_id is not None:
            query = query.where(PHE.c.provider_account_id == provider_account_id)
        async with self._engine.connect() as conn:
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


async def _upsert_account(conn: AsyncConnection, spec: AccountSpec, now: datetime) -> int:
    key = and_(
        PA.c.provider == spec.provider,
        PA.c.account_name == spec.account_name,
        PA.c.region == spec.region,
    )
    existing = (await conn.execute(select(PA).where(key))).mappings().first()
    if existing is None:
        return int(
            await conn.scalar(
                insert(PA)
                .values(
                    provider=spec.provider,
                    account_name=spec.account_name,
                    region=spec.region,
                    credential_ref=spec.credential_ref,
                    status=spec.status,
                    config=dict(spec.config),
                    created_at=now,
                    updated_at=now,
                )
                .returning(PA.c.id)
            )
        )
    changed = (existing["credential_ref"], existing["status"], dict(existing["config"] or {})) != (
        spec.credential_ref,
        spec.status,
        dict(spec.config),
    )
    if changed:
        await conn.execute(
            update(PA)
            .where(PA.c.id == existing["id"])
            .values(
                credential_ref=spec.credential_ref,
                status=spec.status,
                config=dict(spec.config),
                updated_at=now,
            )
        )
    return int(existing["id"])


async def _append_version(
    conn: AsyncConnection,
    table: Any,
    *,
    account_id: int,
    model: str,
    version_col: str,
    version: str,
    effective_from: datetime,
    body: Mapping[str, Any],
    now: datetime,
) -> bool:
    """Insert a version row (closing the open one); False if the identical version exists."""
    same_key = and_(table.c.provider_account_id == account_id, table.c.model == model)
    stored = (
        (await conn.execute(select(table).where(same_key, table.c[version_col] == version)))
        .mappings()
        .all()
    )
    for row in stored:
        if all(row[k] == v for k, v in body.items()):
            return False
        raise CatalogConflict(
            f"{table.name} {version!r} of {model} already exists with other content; "
            "versions are immutable, publish a new version"
        )
    open_rows = (
        await conn.execute(
            select(table.c.id, table.c.effective_from).where(
                same_key, table.c.effective_to.is_(None)
            )
        )
    ).all()
    for row_id, since in open_rows:
        if since >= effective_from:
            raise CatalogConflict(
                f"{table.name} of {model}: a version is already effective from {since}, "
                f"not before {effective_from}"
            )
        await conn.execute(
            update(table).where(table.c.id == row_id).values(effective_to=effective_from)
        )
    await conn.execute(
        insert(table).values(
            provider_account_id=account_id,
            model=model,
            **{version_col: version},
            **body,
            effective_from=effective_from,
            effective_to=None,
            created_at=now,
        )
    )
    return True
