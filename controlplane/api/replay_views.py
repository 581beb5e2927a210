"""Protobuf in and out of route replay (`controlplane.service.replay`), for `routing_servicer`."""

from __future__ import annotations

from datetime import UTC

from controlplane.domain.routing.replay import ReplayReport, ReplayTotals
from controlplane.service.replay import ReplayInput
from vidroute.scheduler.v1 import routing_pb2, routing_service_pb2


def replay_input(request: routing_service_pb2.ReplayRoutesRequest) -> ReplayInput:
    return ReplayInput(
        policy_document=request.policy_document,
        since=request.since.ToDatetime(tzinfo=UTC) if request.HasField("since") else None,
        until=request.until.ToDatetime(tzinfo=UTC) if request.HasField("until") else None,
        tenant_id=request.tenant_id,
    )


def _totals(t: ReplayTotals) -> routing_pb2.ReplayTotals:
    return routing_pb2.ReplayTotals(
        policy_version=t.policy_version,
        selected=t.selected,
        estimated_cost_micros=t.estimated_cost_micros,
        expected_success=t.expected_success,
        expected_latency_s=t.expected_latency_s,
        cost_per_success_micros=t.cost_per_success_micros,
        cost_per_success_low_micros=t.cost_per_success_low_micros,
        cost_per_success_high_micros=t.cost_per_success_high_micros,
    )


def replay_report(report: ReplayReport) -> routing_pb2.ReplayReport:
    return routing_pb2.ReplayReport(
        decisions=report.decisions,
        changed=report.changed,
        recorded=_totals(report.recorded),
        replayed=_totals(report.replayed),
        changes=[
            routing_pb2.ReplayChange(
                task_id=c.task_id,
                decision_no=c.decision_no,
                recorded_selected=c.recorded_selected,
                replayed_selected=c.replayed_selected,
                cost_delta_micros=c.cost_delta_micros,
            )
            for c in report.changes
        ],
        hard_filter_differences=dict(report.hard_filter_differences),
        shadow_agreements=report.shadow_agreements,
        shadow_recorded=report.shadow_recorded,
    )
