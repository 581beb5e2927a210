"""The catalog's writes of `SqlUnitOfWork`: provider accounts, capability and price versions
(9.6.4, 9.25.5), health events (9.19.6) and lease-audit rows (9.11.2) (internal; see `unit`).

Accounts are upserted; capability and price versions are immutable, append-only rows with
effective intervals. Publishing a new version closes the open one of the same (account, model) at
the new ``effective_from``; nothing is ever deleted, and re-publishing an identical version is a
no-op while a *different* body under an existing version is a `CatalogConflict`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import and_, insert, select, update
from sqlalchemy.ext.asyncio import AsyncConnection

from controlplane.persistence.catalog import (
    AccountSpec,
    CapabilityVersion,
    CatalogConflict,
    HealthEvent,
    PriceVersion,
    PublishCounts,
)
from controlplane.persistence.models import lease_audit_events
from controlplane.persistence.models import provider_accounts as PA
from controlplane.persistence.models import provider_health_events as PHE
from controlplane.persistence.models import provider_model_capabilities as PMC
from controlplane.persistence.models import provider_price_versions as PPV
from controlplane.persistence.records import LeaseDrift


class CatalogWrites:
    """Mixed into `SqlUnitOfWork`; uses its connection and clock."""

    conn: AsyncConnection
    now: datetime

    async def create_provider_account(
        self,
        *,
        provider: str,
        account_name: str,
        region: str,
        credential_ref: str,
        status: str = "ACTIVE",
        config: Mapping[str, Any] | None = None,
    ) -> int:
        """Insert a provider account (credential *reference* only) and return its id."""
        return int(
            await self.conn.scalar(
                insert(PA)
                .values(
                    provider=provider,
                    account_name=account_name,
                    region=region,
                    credential_ref=credential_ref,
                    status=status,
                    config=dict(config or {}),
                    created_at=self.now,
                    updated_at=self.now,
                )
                .returning(PA.c.id)
            )
        )

    async def publish(
        self,
        accounts: Sequence[AccountSpec],
        capabilities: Sequence[CapabilityVersion],
        prices: Sequence[PriceVersion],
    ) -> PublishCounts:
        """Upsert accounts and append capability/price versions (the unit lands whole or not)."""
        counts = {"cap_new": 0, "cap_same": 0, "price_new": 0, "price_same": 0}
        ids = {}
        for spec in accounts:
            ids[(spec.provider, spec.account_name, spec.region)] = await self._upsert_account(spec)
        for cap in capabilities:
            account_id = ids.get((cap.provider, cap.account_name, cap.region))
            if account_id is None:
                raise CatalogConflict(f"{cap.capability_version}: account not in the batch")
            inserted = await self._append_version(
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
            )
            counts["cap_new" if inserted else "cap_same"] += 1
        for price in prices:
            account_id = ids.get((price.provider, price.account_name, price.region))
            if account_id is None:
                raise CatalogConflict(f"{price.price_version}: account not in the batch")
            inserted = await self._append_version(
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
            )
            counts["price_new" if inserted else "price_same"] += 1
        return PublishCounts(
            len(ids),
            counts["cap_new"],
            counts["cap_same"],
            counts["price_new"],
            counts["price_same"],
        )

    async def record_health_events(self, events: Sequence[HealthEvent]) -> None:
        """Breaker transitions and operator overrides (9.19.6)."""
        if not events:
            return
        await self.conn.execute(
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

    async def record_lease_drifts(self, drifts: Sequence[LeaseDrift]) -> None:
        """One ``lease_audit_events`` row per counter the reconciler corrected, at ``now``."""
        if not drifts:
            return
        await self.conn.execute(
            insert(lease_audit_events),
            [
                {
                    "dimension": d.dimension,
                    "expected": d.expected,
                    "actual": d.actual,
                    "delta": d.delta,
                    "at": self.now,
                }
                for d in drifts
            ],
        )

    async def _upsert_account(self, spec: AccountSpec) -> int:
        key = and_(
            PA.c.provider == spec.provider,
            PA.c.account_name == spec.account_name,
            PA.c.region == spec.region,
        )
        existing = (await self.conn.execute(select(PA).where(key))).mappings().first()
        if existing is None:
            return await self.create_provider_account(
                provider=spec.provider,
                account_name=spec.account_name,
                region=spec.region,
                credential_ref=spec.credential_ref,
                status=spec.status,
                config=spec.config,
            )
        stored = (existing["credential_ref"], existing["status"], dict(existing["config"] or {}))
        if stored != (spec.credential_ref, spec.status, dict(spec.config)):
            await self.conn.execute(
                update(PA)
                .where(PA.c.id == existing["id"])
                .values(
                    credential_ref=spec.credential_ref,
                    status=spec.status,
                    config=dict(spec.config),
                    updated_at=self.now,
                )
            )
        return int(existing["id"])

    async def _append_version(
        self,
        table: Any,
        *,
        account_id: int,
        model: str,
        version_col: str,
        version: str,
        effective_from: datetime,
        body: Mapping[str, Any],
    ) -> bool:
        """Insert a version row (closing the open one); False if the identical version exists."""
        conn = self.conn
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
                created_at=self.now,
            )
        )
        return True
