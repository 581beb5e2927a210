"""The administrative writes of `SqlUnitOfWork` (internal; see `unit`): versioned documents,
canary states, capability releases, tenant credits, quality feedback and reconciliation runs.

Each is a named method over the persistence module that owns its tables, run on the unit's
transaction at the unit's clock (``now``), so the services above persistence never hold the
connection (issue 22): the unit of work stays the one writer.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from controlplane.domain.reconciliation import Discrepancy, Expectation, Settlement
from controlplane.domain.routing.canary import CanaryStatus
from controlplane.persistence import (
    bill_imports,
    canaries,
    disputes,
    ledger,
    quality,
    reconciliation_store,
)
from controlplane.persistence import capability_releases as releases
from controlplane.persistence.documents import Documents, OpenDocuments
from vidroute_core.exceptions import PreconditionFailed

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncConnection


class AdminWrites:
    """Mixed into `SqlUnitOfWork`; `conn` and `now` are the unit's."""

    conn: AsyncConnection
    now: datetime

    # ---- versioned documents (routing policies, tenants, accounts) -------------------------

    def documents(self, kind: Documents) -> OpenDocuments:
        """`kind`'s versions and activations on this unit's transaction."""
        return OpenDocuments(kind, self.conn, self.now)

    # ---- bills and disputes (issue 23) -----------------------------------------------------

    def disputes(self) -> disputes.OpenDisputes:
        """Disputes and their booked losses on this unit's transaction."""
        return disputes.OpenDisputes(self.conn, self.now)

    async def store_bill(self, bill: bill_imports.BillImport) -> bill_imports.StoredBill:
        """An imported provider bill file: stored now, or the one stored before."""
        return await bill_imports.store_bill(self.conn, bill, self.now)

    # ---- canaries (9.13.5) -----------------------------------------------------------------

    async def note_canary_gates(self, row: canaries.CanaryRow, gates: dict[str, bool]) -> bool:
        """Keep the last evaluation of a canary that holds (no transition), unless another
        evaluation moved it since `row` was read (False)."""
        return await canaries.note_gates(self.conn, row, gates, self.now)

    async def move_canary(
        self,
        row: canaries.CanaryRow,
        *,
        stage: int,
        status: CanaryStatus,
        gates: dict[str, bool],
    ) -> bool:
        """Move `row` on if it is still ACTIVE at its stage; False if someone moved it first."""
        return await canaries.move_canary(
            self.conn, row, stage=stage, status=status, gates=gates, now=self.now
        )

    async def record_canary_transition(
        self,
        candidate_id: str,
        *,
        policy_version: str,
        action: str,
        reason: str,
        from_percent: float,
        to_percent: float,
        observed: dict[str, float],
    ) -> None:
        """A canary's step with the figures it was decided on."""
        await canaries.record_transition(
            self.conn,
            candidate_id,
            policy_version=policy_version,
            action=action,
            reason=reason,
            from_percent=from_percent,
            to_percent=to_percent,
            observed=observed,
            now=self.now,
        )

    async def start_changed_canaries(
        self,
        wanted: Mapping[str, tuple[str, Sequence[float]]],
        *,
        policy_version: str,
        reason: str,
    ) -> list[str]:
        """Start each wanted canary that is new or changed (`canaries.start_changed`)."""
        return await canaries.start_changed(
            self.conn, wanted, policy_version=policy_version, now=self.now, reason=reason
        )

    # ---- capability releases (9.6.4) -------------------------------------------------------

    async def lock_capability_releases(self) -> None:
        """Serialise this unit's release write with every other one."""
        await releases.lock(self.conn)

    async def pending_capability_release(self) -> releases.ActivationRow | None:
        """The scheduled release not yet in effect at the unit's clock, if any."""
        return await releases.pending(self.conn, self.now)

    async def capability_release_active_at(self, at: datetime) -> releases.ActivationRow | None:
        return await releases.active_at(self.conn, at)

    async def insert_capability_release(self, row: releases.ReleaseRow) -> None:
        await releases.insert_release(self.conn, row)

    async def mark_capability_release_applied(
        self, version: str, effective_from: datetime, forced_reason: str | None
    ) -> None:
        """A staged release is activated: APPLIED from `effective_from`; a release no longer
        STAGED (two activations raced, and the other committed first) refuses the unit."""
        if not await releases.mark_applied(self.conn, version, effective_from, forced_reason):
            raise PreconditionFailed(
                f"release {version!r} is not staged (another activation applied it)",
                {},
                reason="CAPABILITY_RELEASE_NOT_STAGED",
                labels={"version": version},
            )

    async def record_capability_activation(self, row: releases.ActivationRow) -> None:
        await releases.record_activation(self.conn, row)

    # ---- money and quality -----------------------------------------------------------------

    async def append_credit(
        self,
        tenant_id: str,
        amount_micros: int,
        currency: str,
        idempotency_key: str,
        *,
        actor: str,
        reason: str,
    ) -> tuple[ledger.CreditEntry, bool]:
        """A CREDIT entry, once per (tenant, key): ``(entry, created)`` (`ledger`)."""
        return await ledger.append_credit(
            self.conn, tenant_id, amount_micros, currency, idempotency_key, actor, reason, self.now
        )

    async def record_feedback(self, feedback: quality.NewFeedback) -> bool:
        """A caller's verdict on a task's output, once per task and verdict (`quality`)."""
        return await quality.record_feedback(self.conn, feedback, self.now)

    # ---- reconciliation (9.23.3) -----------------------------------------------------------

    async def store_usage_import(
        self,
        *,
        provider: str,
        account: str,
        window_start: datetime,
        window_end: datetime,
        payload: str,
        payload_sha256: str,
        records: Sequence[reconciliation_store.NewRecord],
    ) -> reconciliation_store.StoredImport:
        """The import of this payload (stored now, or the one stored before)."""
        return await reconciliation_store.store_import(
            self.conn,
            provider=provider,
            account=account,
            window_start=window_start,
            window_end=window_end,
            payload=payload,
            payload_sha256=payload_sha256,
            records=records,
            now=self.now,
        )

    async def usage_expectations(
        self, *, provider: str, account: str, start: datetime, end: datetime, window: timedelta
    ) -> list[Expectation]:
        """What we expect the provider billed for the account around ``[start, end)``."""
        return await reconciliation_store.expectations(
            self.conn, provider=provider, account=account, start=start, end=end, window=window
        )

    async def settlements(self, start: datetime, end: datetime) -> list[Settlement]:
        """The tenants' settlements in ``[start, end)``."""
        return await reconciliation_store.settlements(self.conn, start, end)

    async def save_reconciliation_run(
        self,
        *,
        day: str,
        provider: str,
        account: str,
        import_id: int | None,
        result_sha256: str,
        record_count: int,
        billed_micros: int,
        expected_micros: int,
        currency: str,
        statuses: Mapping[str, str],
        rows: Sequence[Discrepancy],
    ) -> tuple[reconciliation_store.RunRow, bool]:
        """The current run of (day, provider, account), written when its result changed."""
        return await reconciliation_store.save_run(
            self.conn,
            day=day,
            provider=provider,
            account=account,
            import_id=import_id,
            result_sha256=result_sha256,
            record_count=record_count,
            billed_micros=billed_micros,
            expected_micros=expected_micros,
            currency=currency,
            statuses=statuses,
            rows=rows,
            now=self.now,
        )
