"""`SqlReads`: the named reads of the services above persistence, on one read connection.

`Database.reads()` opens a connection and yields a `SqlReads`, as `Database.unit(now)` yields a
unit of work: every read a service makes outside a unit is a method here, so no module above
persistence holds a connection or calls a query function with one
(``tests/unit/test_sql_boundary.py``). A block of reads that belong together (a canary
evaluation, a document's active version and its text) stays on one connection, as before.

The methods only forward to the query functions of their room (`routing_policies`,
`canaries`, `capability_releases`, `ledger`, `reconciliation_store`, ...), which keep the SQL;
`documents(kind)` gives the read half of a versioned-document kind, the counterpart of the
unit's ``u.documents(kind)``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import date, datetime

from sqlalchemy.ext.asyncio import AsyncConnection

from controlplane.domain.margins import MoneyFact
from controlplane.domain.quality import BucketId, QualityCounts
from controlplane.domain.reconciliation import Discrepancy
from controlplane.domain.unit_cost import UnitCost
from controlplane.persistence import (
    batch,
    bill_imports,
    capability_releases,
    cost_reads,
    disputes,
    finance_reads,
    ledger,
    quality,
    reconciliation_store,
    replay_reads,
    routing_policies,
    tenant_configs,
)
from controlplane.persistence import canaries as canary_store
from controlplane.persistence.documents import ActivationRow, DocumentRow, Documents

__all__ = ["DocumentReads", "SqlReads"]


class DocumentReads:
    """The reads of one `Documents` kind on a `SqlReads` connection (no writes)."""

    __slots__ = ("_conn", "_kind")

    def __init__(self, kind: Documents, conn: AsyncConnection) -> None:
        self._kind, self._conn = kind, conn

    async def version(self, name: str) -> DocumentRow | None:
        return await self._kind.version(self._conn, name)

    async def versions(self) -> list[DocumentRow]:
        """Every published version, newest first."""
        return await self._kind.versions(self._conn)

    async def active(self) -> DocumentRow | None:
        return await self._kind.active(self._conn)

    async def active_version(self) -> str | None:
        """The active version's name only; None before any publish."""
        return await self._kind.active_version(self._conn)

    async def activations(self) -> list[ActivationRow]:
        """Every activation, pending ones included, oldest first."""
        return await self._kind.activations(self._conn)

    async def pending(self) -> list[ActivationRow]:
        """Scheduled activations not yet effective, soonest first."""
        return await self._kind.pending(self._conn)


class SqlReads:
    """Named reads on one open read connection (see the module docstring); made by
    `Database.reads`."""

    __slots__ = ("_conn",)

    def __init__(self, conn: AsyncConnection) -> None:
        self._conn = conn

    def documents(self, kind: Documents) -> DocumentReads:
        """`kind`'s versions and activations (routing policies, tenants, accounts)."""
        return DocumentReads(kind, self._conn)

    # ---- scheduling ------------------------------------------------------------------------

    async def task_numbers(self, task_ids: Iterable[int]) -> dict[int, batch.Numbers]:
        """The next attempt and decision numbers of each task (`batch.numbers`)."""
        return await batch.numbers(self._conn, task_ids)

    async def policy_snapshot(self) -> routing_policies.ActiveSnapshot | None:
        """The active routing policy version and every canary's stage, in one statement."""
        return await routing_policies.active_snapshot(self._conn)

    async def canaries(self) -> list[canary_store.CanaryRow]:
        return await canary_store.canaries(self._conn)

    async def canary_transitions(self) -> list[canary_store.TransitionRow]:
        return await canary_store.transitions(self._conn)

    async def attempt_window(
        self, since: datetime, *, exclude: Sequence[str] = (), only: Sequence[str] = ()
    ) -> dict[str, list[canary_store.WindowAttempt]]:
        """Finished attempts since `since` per candidate (`canaries.window_by_candidate`)."""
        return await canary_store.window_by_candidate(self._conn, since, exclude, only=only)

    async def quality_window(
        self, since: datetime, *, only: Sequence[str] = ()
    ) -> dict[str, list[tuple[datetime, bool, str]]]:
        """The output probe's checks since `since` per candidate: (at, clean, bucket)."""
        return await canary_store.quality_by_candidate(self._conn, since, only=only)

    async def quality_aggregates(self, model: str = "") -> dict[BucketId, QualityCounts]:
        """Every quality bucket's counters (only `model`'s when given)."""
        return await quality.aggregates(self._conn, model)

    async def queued_count(self, tenant_id: str, service_class: str) -> int:
        return await tenant_configs.queued_count(self._conn, tenant_id, service_class)

    async def tenant_use(self, since: datetime) -> tenant_configs.TenantUse:
        return await tenant_configs.tenant_use(self._conn, since)

    async def decision_page(
        self,
        *,
        since: datetime | None,
        until: datetime,
        tenant_id: str = "",
        after: replay_reads.Cursor | None = None,
        limit: int = 500,
    ) -> list[replay_reads.RecordedRow]:
        """Recorded route decisions of ``[since, until)`` after `after`, by (time, id)."""
        return await replay_reads.decision_page(
            self._conn, since=since, until=until, tenant_id=tenant_id, after=after, limit=limit
        )

    # ---- capability releases ---------------------------------------------------------------

    async def release(self, version: str) -> capability_releases.ReleaseRow | None:
        return await capability_releases.release(self._conn, version)

    async def releases(self) -> list[capability_releases.ReleaseRow]:
        return await capability_releases.releases(self._conn)

    async def release_activations(self) -> list[capability_releases.ActivationRow]:
        return await capability_releases.activations(self._conn)

    async def release_active_at(self, at: datetime) -> capability_releases.ActivationRow | None:
        return await capability_releases.active_at(self._conn, at)

    # ---- money ------------------------------------------------------------------------------

    async def balance(self, tenant_id: str, currency: str) -> ledger.Balance:
        return await ledger.balance(self._conn, tenant_id, currency)

    async def credit_entries(
        self,
        tenant_id: str,
        after_id: int,
        limit: int,
        *,
        task_id: int | None = None,
        start: datetime | None = None,
        end: datetime | None = None,
    ) -> list[ledger.CreditEntry]:
        """The tenant's entries after `after_id`, oldest first (`ledger.list_entries`)."""
        return await ledger.list_entries(
            self._conn, tenant_id, after_id, limit, task_id=task_id, start=start, end=end
        )

    async def unit_costs(
        self,
        start: datetime,
        end: datetime,
        *,
        provider: str | None = None,
        model: str | None = None,
    ) -> list[UnitCost]:
        return await cost_reads.unit_costs(self._conn, start, end, provider=provider, model=model)

    async def money_facts(self, start: datetime, end: datetime) -> list[MoneyFact]:
        return await finance_reads.money_facts(self._conn, start, end)

    # ---- reconciliation ----------------------------------------------------------------------

    async def billed_accounts(self) -> list[tuple[str, str]]:
        """Every (provider, account) to reconcile (`reconciliation_store.accounts_of`)."""
        return await reconciliation_store.accounts_of(self._conn)

    async def current_runs(self, day: str | None = None) -> list[reconciliation_store.RunRow]:
        return await reconciliation_store.current_runs(self._conn, day)

    async def discrepancies_of(self, run_ids: Sequence[int]) -> dict[int, list[Discrepancy]]:
        return await reconciliation_store.discrepancies_of(self._conn, run_ids)

    async def discrepancy_counts(self, after_id: int) -> tuple[dict[tuple[str, str], int], int]:
        return await reconciliation_store.discrepancy_counts(self._conn, after_id)

    async def disputes(
        self, *, state: str = "", start: date | None = None, end: date | None = None
    ) -> list[disputes.DisputeRow]:
        return await disputes.list_disputes(self._conn, state=state, start=start, end=end)

    async def bill_for_day(
        self, provider: str, account: str, day: date
    ) -> bill_imports.StoredBill | None:
        return await bill_imports.bill_for_day(self._conn, provider, account, day)
