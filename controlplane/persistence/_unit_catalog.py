"""The catalog's writes of `SqlUnitOfWork`: provider accounts (and the accounts document's
settings of them, 9.19.1), capability and price versions (9.6.4, 9.25.5), health events
(9.19.6) and lease-audit rows (9.11.2) (internal; see `unit`).

Accounts are upserted; capability and price versions are immutable, append-only rows with
effective intervals. Publishing a new version closes the open one of the same (account, model) at
the new ``effective_from``; nothing is ever deleted, and re-publishing an identical version is a
no-op while a *different* body under an existing version is a `CatalogConflict`.

What "identical" means is the publisher's (`canon`: the entry as Describe would carry it, so a
file's entry and the sidecar's Describe of it agree); a capability version's identity excludes
its price (``commercial``), which is versioned on its own. With `reopen` (an admin release or a
rollback) the published versions become the current ones: an earlier version is re-opened as a
new interval; without it (the sidecars' Describe at start) a version stored once is left alone,
so a restart never undoes a release.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import and_, insert, select, update
from sqlalchemy.ext.asyncio import AsyncConnection

from controlplane.domain.accounts import AccountKey, Accounts
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

Canon = Callable[[Mapping[str, Any]], Mapping[str, Any]]


def _as_is(doc: Mapping[str, Any]) -> Mapping[str, Any]:
    return doc


def _without_price(doc: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in doc.items() if k != "commercial"}


def _same_document(canon: Canon, doc: Mapping[str, Any], row: Mapping[str, Any]) -> bool:
    return canon(row["capabilities"]) == doc


def _same_identity(canon: Canon, doc: Mapping[str, Any], row: Mapping[str, Any]) -> bool:
    return _without_price(canon(row["capabilities"])) == _without_price(doc)


#: ``provider_accounts.config`` key naming the accounts document a row's settings came from.
DOCUMENT_KEY = "accounts_version"


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
        *,
        reopen: bool = False,
        canon: Canon = _as_is,
    ) -> PublishCounts:
        """Upsert accounts and append capability/price versions (the unit lands whole or not);
        `reopen` and `canon` as the module docstring says."""
        counts = {"cap_new": 0, "cap_same": 0, "price_new": 0, "price_same": 0}
        ids = {}
        for spec in accounts:
            ids[(spec.provider, spec.account_name, spec.region)] = await self._upsert_account(spec)
        for cap in capabilities:
            account_id = ids.get((cap.provider, cap.account_name, cap.region))
            if account_id is None:
                raise CatalogConflict(f"{cap.capability_version}: account not in the batch")
            doc = canon(cap.document)
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
                same=functools.partial(_same_document, canon, doc),
                same_identity=functools.partial(_same_identity, canon, doc),
                reopen=reopen,
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
                reopen=reopen,
            )
            counts["price_new" if inserted else "price_same"] += 1
        return PublishCounts(
            len(ids),
            counts["cap_new"],
            counts["cap_same"],
            counts["price_new"],
            counts["price_same"],
        )

    async def close_versions(self, account_id: int, model: str, at: datetime) -> None:
        """End the open capability and price versions of a model on an account at `at` (a
        forced rollback to a catalog without it); the rows stay, their interval ends."""
        for table in (PMC, PPV):
            await self.conn.execute(
                update(table)
                .where(
                    table.c.provider_account_id == account_id,
                    table.c.model == model,
                    table.c.effective_to.is_(None),
                    table.c.effective_from < at,
                )
                .values(effective_to=at)
            )

    async def apply_account_settings(self, accounts: Accounts) -> int:
        """Mirror the active accounts document into ``provider_accounts`` (9.19.1): a listed
        account's rows get its ``credential_ref``, its regions (``config.regions``) and status
        DISABLED when it is disabled or the row's region is not one of them, else ACTIVE; a row
        an earlier document set and this one no longer lists goes back to ACTIVE. Routing reads
        the document itself; this keeps the catalog's rows telling the same. Rows changed."""
        changed = 0
        for row in (await self.conn.execute(select(PA))).mappings().all():
            config = dict(row["config"] or {})
            entry = accounts.accounts.get(AccountKey(row["provider"], row["account_name"]))
            if entry is None:
                if DOCUMENT_KEY not in config:
                    continue
                config.pop(DOCUMENT_KEY)
                config.pop("regions", None)
                values = {"status": "ACTIVE", "config": config}
            else:
                usable = entry.enabled and (not entry.regions or row["region"] in entry.regions)
                config[DOCUMENT_KEY] = accounts.version
                config["regions"] = list(entry.regions)
                values = {
                    "status": "ACTIVE" if usable else "DISABLED",
                    "credential_ref": entry.credential_ref,
                    "config": config,
                }
            await self.conn.execute(
                update(PA).where(PA.c.id == row["id"]).values(**values, updated_at=self.now)
            )
            changed += 1
        return changed

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
        same: Callable[[Any], bool] | None = None,
        same_identity: Callable[[Any], bool] | None = None,
        reopen: bool = False,
    ) -> bool:
        """Insert a version row (closing the open one); False when nothing changes: the version
        is the open one with the same body, or (without `reopen`) it is stored at all.
        `same` compares a stored row's body with this one (default: every body column equal),
        `same_identity` the part a version may never change (default: `same`)."""
        conn = self.conn

        def equal(row: Any) -> bool:
            return all(row[k] == v for k, v in body.items())

        same = same or equal
        same_identity = same_identity or same
        same_key = and_(table.c.provider_account_id == account_id, table.c.model == model)
        stored = (
            (await conn.execute(select(table).where(same_key, table.c[version_col] == version)))
            .mappings()
            .all()
        )
        for row in stored:
            if not same_identity(row):
                raise CatalogConflict(
                    f"{table.name} {version!r} of {model} already exists with other content; "
                    "versions are immutable, publish a new version"
                )
        open_rows = (
            (await conn.execute(select(table).where(same_key, table.c.effective_to.is_(None))))
            .mappings()
            .all()
        )
        if any(r[version_col] == version and same(r) for r in open_rows):
            return False
        if not reopen and any(same(r) for r in stored):
            return False
        for row in open_rows:
            if row["effective_from"] >= effective_from:
                raise CatalogConflict(
                    f"{table.name} of {model}: a version is already effective from "
                    f"{row['effective_from']}, not before {effective_from}"
                )
            await conn.execute(
                update(table).where(table.c.id == row["id"]).values(effective_to=effective_from)
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
