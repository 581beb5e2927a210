"""Row-to-record conversion for the units of work and the query modules (internal)."""

from __future__ import annotations

from sqlalchemy.engine import RowMapping

from controlplane.domain.states import AttemptState, TaskState
from controlplane.domain.webhooks import WebhookSubscription
from controlplane.persistence.records import (
    AccountInfo,
    AttemptRecord,
    AttemptRuntime,
    Failure,
    OutboxRecord,
    ProviderEventRecord,
    ProviderJobRecord,
    RouteDecisionRecord,
    TaskEventRecord,
    TaskRecord,
)
from vidroute_core.codec import spec_from_dict
from vidroute_core.spec import ServiceClass


def failure_columns(failure: Failure | None) -> dict[str, str | None]:
    """The three failure columns for `failure` (all NULL when there is none)."""
    if failure is None:
        return {"failure_class": None, "failure_code": None, "failure_message": None}
    return {
        "failure_class": failure.failure_class,
        "failure_code": failure.code,
        "failure_message": failure.message,
    }


def _failure(m: RowMapping) -> Failure | None:
    if m["failure_class"] is None:
        return None
    return Failure(m["failure_class"], m["failure_code"] or "", m["failure_message"] or "")


def _webhook(m: RowMapping) -> WebhookSubscription | None:
    url = m.get("webhook_url")
    return None if url is None else WebhookSubscription.stored(url, m.get("webhook_events"))


def task(m: RowMapping) -> TaskRecord:
    return TaskRecord(
        id=m["id"],
        tenant_id=m["tenant_id"],
        user_id=m["user_id"],
        project_id=m["project_id"],
        idempotency_key=m["idempotency_key"],
        spec=spec_from_dict(m["spec"]),
        spec_hash=m["normalized_spec_hash"],
        service_class=ServiceClass(m["service_class"]),
        priority=m["priority"],
        state=TaskState(m["status"]),
        status_version=m["status_version"],
        failure=_failure(m),
        adopted_attempt_id=m["adopted_attempt_id"],
        output_asset=m["output_asset"],
        queue_deadline_at=m["queue_deadline_at"],
        deadline_at=m["deadline_at"],
        created_at=m["created_at"],
        updated_at=m["updated_at"],
        trace_context=m.get("trace_context"),
        webhook=_webhook(m),
    )


def attempt(m: RowMapping) -> AttemptRecord:
    return AttemptRecord(
        id=m["id"],
        task_id=m["task_id"],
        attempt_no=m["attempt_no"],
        provider_account_id=m["provider_account_id"],
        provider_model=m["provider_model"],
        provider_model_version=m["provider_model_version"],
        capability_version=m["capability_version"],
        price_version=m["price_version"],
        routing_policy_version=m["routing_policy_version"],
        client_request_key=m["client_request_key"],
        normalized_spec_hash=m["normalized_spec_hash"],
        request_hash=m["request_hash"],
        compile_plan=m["compile_plan"],
        route_decision_id=m["route_decision_id"],
        state=AttemptState(m["status"]),
        status_version=m["status_version"],
        estimated_cost_micros=m["estimated_cost_micros"],
        actual_cost_micros=m["actual_cost_micros"],
        currency=m["currency"],
        lease_token=m["lease_token"],
        fencing_token=m["fencing_token"],
        request_started_at=m["request_started_at"],
        request_body_sent_at=m["request_body_sent_at"],
        transport_error_stage=m["transport_error_stage"],
        failure=_failure(m),
        created_at=m["created_at"],
        updated_at=m["updated_at"],
    )


def provider_job(m: RowMapping) -> ProviderJobRecord:
    return ProviderJobRecord(
        id=m["id"],
        attempt_id=m["attempt_id"],
        provider_account_id=m["provider_account_id"],
        provider_job_id=m["provider_job_id"],
        provider_request_id=m["provider_request_id"],
        raw_status=m["raw_status"],
        normalized_status=AttemptState(m["normalized_status"]),
        output_locator=m["output_locator"],
        raw_failure=m["raw_failure"],
        submitted_at=m["submitted_at"],
        last_polled_at=m["last_polled_at"],
        completed_at=m["completed_at"],
        created_at=m["created_at"],
    )


def route_decision(m: RowMapping) -> RouteDecisionRecord:
    return RouteDecisionRecord(
        id=m["id"],
        task_id=m["task_id"],
        decision_no=m["decision_no"],
        policy_version=m["policy_version"],
        selected_candidate=m["selected_candidate"],
        candidate_snapshot=m["candidate_snapshot"],
        reason_code=m["reason_code"],
        created_at=m["created_at"],
    )


def task_event(m: RowMapping) -> TaskEventRecord:
    return TaskEventRecord(
        task_id=m["task_id"],
        seq=m["seq"],
        kind=m["kind"],
        payload=m["payload"],
        created_at=m["created_at"],
    )


def outbox_message(m: RowMapping) -> OutboxRecord:
    return OutboxRecord(
        id=m["id"],
        topic=m["topic"],
        aggregate_id=m["aggregate_id"],
        payload=m["payload"],
        created_at=m["created_at"],
        available_at=m["available_at"],
        claimed_by=m["claimed_by"],
        claimed_until=m["claimed_until"],
        attempts=m["attempts"],
    )


def runtime(m: RowMapping) -> AttemptRuntime:
    return AttemptRuntime(**{f: m[f] for f in AttemptRuntime.__dataclass_fields__})


def provider_event(m: RowMapping) -> ProviderEventRecord:
    return ProviderEventRecord(**{f: m[f] for f in ProviderEventRecord.__dataclass_fields__})


def account_info(m: RowMapping) -> AccountInfo:
    return AccountInfo(m["id"], m["provider"], m["account_name"], m["region"])
