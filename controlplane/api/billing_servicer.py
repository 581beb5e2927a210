"""`vidroute.scheduler.v1.BillingService`: a translator between protobuf and `BillingService`.

No SQL here: each method decodes the request, calls `controlplane.service.billing`, and encodes
the result (the small views below). Domain errors become statuses in
`vidroute_core.wire.status.DomainErrorInterceptor`; the caller comes from
`controlplane.api.auth`, as for the scheduler API.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

from google.protobuf import timestamp_pb2

from controlplane.api.auth import require_caller
from controlplane.domain.margins import Grouping
from controlplane.domain.money import CreditKind
from controlplane.domain.reconciliation import Discrepancy
from controlplane.domain.unit_cost import UnitCost
from controlplane.persistence.disputes import DisputeRow
from controlplane.persistence.ledger import CreditEntry
from controlplane.reconciliation import RunReport
from controlplane.service.access import Caller, ensure_admin
from controlplane.service.billing import (
    CREDIT_KEY_PREFIX,
    BillingService,
    CreditInput,
    ListEntriesInput,
    MarginsInput,
    UnitCostsInput,
)
from vidroute.scheduler.v1 import billing_pb2, billing_service_pb2, billing_service_pb2_grpc
from vidroute_core.exceptions import InvalidSpec
from vidroute_core.validation import FieldViolation

_KINDS = {
    name.removeprefix("LEDGER_ENTRY_KIND_"): number
    for name, number in billing_pb2.LedgerEntryKind.items()
    if number
}
_DISCREPANCY_KINDS = {
    name.removeprefix("DISCREPANCY_KIND_"): number
    for name, number in billing_pb2.DiscrepancyKind.items()
    if number
}
# Timestamp's own range (0001-01-01 .. 9999-12-31), in seconds since the epoch.
_MIN_SECONDS, _MAX_SECONDS = -62135596800, 253402300799


def _timestamp(at: datetime) -> timestamp_pb2.Timestamp:
    ts = timestamp_pb2.Timestamp()
    ts.FromDatetime(at.astimezone(UTC))
    return ts


def entry_view(entry: CreditEntry) -> billing_pb2.LedgerEntry:
    return billing_pb2.LedgerEntry(
        entry_id=str(entry.id),
        tenant_id=entry.tenant_id,
        kind=_KINDS.get(entry.kind.value, billing_pb2.LEDGER_ENTRY_KIND_UNSPECIFIED),
        amount_micros=entry.amount_micros,
        currency=entry.currency,
        task_id="" if entry.task_id is None else str(entry.task_id),
        idempotency_key=entry.idempotency_key.removeprefix(CREDIT_KEY_PREFIX)
        if entry.kind is CreditKind.CREDIT
        else entry.idempotency_key,
        reason=entry.reason or "",
        actor=entry.actor or "",
        created_at=_timestamp(entry.created_at),
    )


def unit_cost_view(row: UnitCost) -> billing_pb2.UnitCost:
    return billing_pb2.UnitCost(
        provider=row.provider,
        model=row.model,
        currency=row.currency,
        successes=row.successes,
        generation_micros=row.generation_micros,
        retry_micros=row.retry_micros,
        fetch_micros=row.fetch_micros,
        platform_loss_micros=row.platform_loss_micros,
        total_micros=row.total_micros,
        cost_per_success_micros=row.cost_per_success_micros,
    )


def _id(value: int | None) -> str:
    return "" if value is None else str(value)


def discrepancy_view(d: Discrepancy) -> billing_pb2.Discrepancy:
    return billing_pb2.Discrepancy(
        kind=_DISCREPANCY_KINDS.get(d.kind.value, billing_pb2.DISCREPANCY_KIND_UNSPECIFIED),
        provider=d.provider,
        account=d.account,
        model=d.model,
        currency=d.currency,
        billed_micros=d.billed_micros,
        expected_micros=d.expected_micros,
        delta_micros=d.delta_micros,
        attempt_id=_id(d.attempt_id),
        task_id=_id(d.task_id),
        provider_job_id=d.provider_job_id,
        evidence_json=json.dumps(
            {"record_ids": list(d.record_ids), **d.evidence}, sort_keys=True, default=str
        ),
        suggested_action=d.suggested_action,
        row_id=_id(d.row_id),
    )


def run_view(run: RunReport) -> billing_pb2.ReconciliationRun:
    return billing_pb2.ReconciliationRun(
        run_id=str(run.run_id),
        provider=run.provider,
        account=run.account,
        currency=run.currency,
        billed_micros=run.billed_micros,
        expected_micros=run.expected_micros,
        delta_micros=run.delta_micros,
        record_count=run.record_count,
        status_counts=dict(run.status_counts),
        discrepancies=[discrepancy_view(d) for d in run.discrepancies],
        created_at=_timestamp(run.created_at),
    )


def _window(
    request: billing_service_pb2.GetUnitCostsRequest,
) -> tuple[timedelta | None, datetime | None]:
    """The request's window and end, checked before they become datetimes (a forged Duration or
    Timestamp out of range is INVALID_ARGUMENT, never an OverflowError)."""
    violations = []
    window = end = None
    if request.HasField("window"):
        w = request.window
        if not (0 <= w.seconds <= 366 * 86400 and 0 <= w.nanos < 10**9):
            violations.append(FieldViolation("window", "must be between 0 and 366 days"))
        else:
            window = timedelta(seconds=w.seconds, microseconds=w.nanos // 1000)
    if request.HasField("end_time"):
        t = request.end_time
        if not (_MIN_SECONDS + 366 * 86400 <= t.seconds <= _MAX_SECONDS and 0 <= t.nanos < 10**9):
            violations.append(FieldViolation("end_time", "must be a valid timestamp"))
        else:
            end = t.ToDatetime(tzinfo=UTC)
    if violations:
        raise InvalidSpec(violations)
    return window, end


class BillingServicer(billing_service_pb2_grpc.BillingServiceServicer):
    """The public money API."""

    def __init__(self, billing: BillingService, *, default_caller: Caller | None = None) -> None:
        self._billing = billing
        self._default_caller = default_caller  # only for a servicer driven without the server

    def _caller(self) -> Caller:
        return require_caller(self._default_caller)

    async def GetBalance(
        self, request: billing_service_pb2.GetBalanceRequest, context: Any
    ) -> billing_service_pb2.GetBalanceResponse:
        view = await self._billing.balance(request.tenant_id, request.currency, self._caller())
        b = view.balance
        return billing_service_pb2.GetBalanceResponse(
            balance=billing_pb2.Balance(
                tenant_id=view.tenant_id,
                currency=b.currency,
                balance_micros=b.balance_micros,
                reserved_micros=b.reserved_micros,
                available_micros=b.available_micros,
                as_of_entry_id=str(b.as_of_entry_id or 0),
                as_of_time=_timestamp(view.read_at),
            )
        )

    async def ListLedgerEntries(
        self, request: billing_service_pb2.ListLedgerEntriesRequest, context: Any
    ) -> billing_service_pb2.ListLedgerEntriesResponse:
        entries, token = await self._billing.list_entries(
            ListEntriesInput(
                request.tenant_id,
                request.page_size,
                request.page_token,
                request.task_id,
                request.from_date,
                request.to_date,
            ),
            self._caller(),
        )
        return billing_service_pb2.ListLedgerEntriesResponse(
            entries=[entry_view(e) for e in entries], next_page_token=token or ""
        )

    async def CreditTenant(
        self, request: billing_service_pb2.CreditTenantRequest, context: Any
    ) -> billing_service_pb2.CreditTenantResponse:
        entry, created = await self._billing.credit(
            CreditInput(
                tenant_id=request.tenant_id,
                amount_micros=request.amount_micros,
                currency=request.currency,
                idempotency_key=request.idempotency_key,
                reason=request.reason,
            ),
            self._caller(),
        )
        return billing_service_pb2.CreditTenantResponse(entry=entry_view(entry), created=created)

    async def GetUnitCosts(
        self, request: billing_service_pb2.GetUnitCostsRequest, context: Any
    ) -> billing_service_pb2.GetUnitCostsResponse:
        caller = self._caller()
        ensure_admin(caller, "GetUnitCosts")  # the role before the request's figures
        window, end = _window(request)
        report = await self._billing.unit_costs(
            UnitCostsInput(request.provider, request.model, window, end), caller
        )
        return billing_service_pb2.GetUnitCostsResponse(
            unit_costs=[unit_cost_view(r) for r in report.rows],
            window_start=_timestamp(report.start),
            window_end=_timestamp(report.end),
        )

    async def GetReconciliationReport(
        self, request: billing_service_pb2.GetReconciliationReportRequest, context: Any
    ) -> billing_service_pb2.GetReconciliationReportResponse:
        report = await self._billing.reconciliation_report(request.date, self._caller())
        runs = sorted(report.runs, key=lambda r: (r.provider, r.account))
        return billing_service_pb2.GetReconciliationReportResponse(
            date=report.day.isoformat(), runs=[run_view(r) for r in runs]
        )

    async def ListDisputes(
        self, request: billing_service_pb2.ListDisputesRequest, context: Any
    ) -> billing_service_pb2.ListDisputesResponse:
        caller = self._caller()
        ensure_admin(caller, "ListDisputes")
        state = _DISPUTE_STATES_IN.get(request.state)
        if state is None:
            raise InvalidSpec([FieldViolation("state", "must be a DisputeState value")])
        rows = await self._billing.disputes(state, request.from_date, request.to_date, caller)
        return billing_service_pb2.ListDisputesResponse(disputes=[dispute_view(d) for d in rows])

    async def GetMargins(
        self, request: billing_service_pb2.GetMarginsRequest, context: Any
    ) -> billing_service_pb2.GetMarginsResponse:
        caller = self._caller()
        ensure_admin(caller, "GetMargins")
        by = _GROUPINGS.get(request.group_by)
        if by is None:
            raise InvalidSpec([FieldViolation("group_by", "must be a MarginGrouping value")])
        rows = await self._billing.margins(
            MarginsInput(request.from_date, request.to_date, by), caller
        )
        return billing_service_pb2.GetMarginsResponse(
            rows=[
                billing_pb2.MarginRow(
                    key=r.key,
                    currency=r.currency,
                    revenue_micros=r.revenue_micros,
                    provider_cost_micros=r.provider_cost_micros,
                    platform_loss_micros=r.platform_loss_micros,
                    margin_micros=r.margin_micros,
                )
                for r in rows
            ]
        )


_DISPUTE_STATES_IN = {
    billing_pb2.DISPUTE_STATE_UNSPECIFIED: "",
    billing_pb2.DISPUTE_STATE_OPEN: "OPEN",
    billing_pb2.DISPUTE_STATE_DISPUTED: "DISPUTED",
    billing_pb2.DISPUTE_STATE_REFUNDED: "REFUNDED",
    billing_pb2.DISPUTE_STATE_WRITTEN_OFF: "WRITTEN_OFF",
}
_DISPUTE_STATES_OUT = {v: k for k, v in _DISPUTE_STATES_IN.items() if v}
_GROUPINGS = {
    billing_pb2.MARGIN_GROUPING_UNSPECIFIED: Grouping.DAY,
    billing_pb2.MARGIN_GROUPING_DAY: Grouping.DAY,
    billing_pb2.MARGIN_GROUPING_TENANT: Grouping.TENANT,
    billing_pb2.MARGIN_GROUPING_PROVIDER: Grouping.PROVIDER,
    billing_pb2.MARGIN_GROUPING_MODEL: Grouping.MODEL,
}


def dispute_view(d: DisputeRow) -> billing_pb2.LossDispute:
    return billing_pb2.LossDispute(
        dispute_id=str(d.id),
        row_id=str(d.discrepancy_id),
        day=d.day,
        kind=_DISCREPANCY_KINDS.get(d.kind, billing_pb2.DISCREPANCY_KIND_UNSPECIFIED),
        provider=d.provider,
        account=d.account,
        model=d.model,
        attempt_id=_id(d.attempt_id),
        task_id=_id(d.task_id),
        currency=d.currency,
        billed_micros=d.billed_micros,
        expected_micros=d.expected_micros,
        confirmed_micros=d.confirmed_micros,
        new_loss_micros=d.new_loss_micros,
        refunded_micros=d.refunded_micros,
        state=_DISPUTE_STATES_OUT.get(d.state, billing_pb2.DISPUTE_STATE_UNSPECIFIED),
        created_at=_timestamp(d.created_at),
        updated_at=_timestamp(d.updated_at),
    )
