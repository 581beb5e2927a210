"""Persistence records -> scheduler API messages (read side of the boundary)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from google.protobuf import timestamp_pb2

from controlplane.domain.outputs import stored_samples
from controlplane.domain.routing.decision import (
    candidate_explain,
    candidate_inputs,
    quality_bucket,
)
from controlplane.domain.states import AttemptState, TaskState
from controlplane.domain.webhooks import DeliveryState
from controlplane.persistence.records import (
    AttemptRecord,
    Failure,
    ProviderJobRecord,
    RouteDecisionRecord,
    TaskDetail,
    TaskEventRecord,
    TaskRecord,
)
from controlplane.persistence.webhooks import DeliveryRecord
from controlplane.service.tasks import CancelResult
from vidroute.adapter.v1 import adapter_pb2
from vidroute.common.v1 import error_pb2, money_pb2
from vidroute.scheduler.v1 import scheduler_pb2 as pb
from vidroute_core.wire.spec import spec_to_proto

_JOB_STATE = {
    AttemptState.ACCEPTED: adapter_pb2.JOB_STATE_QUEUED,
    AttemptState.PROVIDER_QUEUED: adapter_pb2.JOB_STATE_QUEUED,
    AttemptState.PROVIDER_THROTTLED: adapter_pb2.JOB_STATE_THROTTLED,
    AttemptState.RUNNING: adapter_pb2.JOB_STATE_RUNNING,
    AttemptState.SUCCEEDED: adapter_pb2.JOB_STATE_SUCCEEDED,
    AttemptState.FAILED: adapter_pb2.JOB_STATE_FAILED,
    AttemptState.CANCELLED: adapter_pb2.JOB_STATE_CANCELLED,
}


def timestamp(value: datetime | None) -> timestamp_pb2.Timestamp | None:
    if value is None:
        return None
    ts = timestamp_pb2.Timestamp()
    ts.FromDatetime(value)
    return ts


def task_state(state: TaskState) -> pb.TaskState.ValueType:
    return pb.TaskState.Value(f"TASK_STATE_{state.value}")


def attempt_state(state: AttemptState) -> pb.AttemptState.ValueType:
    return pb.AttemptState.Value(f"ATTEMPT_STATE_{state.value}")


def error(failure: Failure | None) -> error_pb2.Error | None:
    if failure is None:
        return None
    name = f"ERROR_CLASS_{failure.failure_class}"
    known = name in error_pb2.ErrorClass.keys()  # noqa: SIM118 - an enum wrapper, not a dict
    return error_pb2.Error(
        error_class=(
            error_pb2.ErrorClass.Value(name) if known else error_pb2.ERROR_CLASS_UNSPECIFIED
        ),
        code=failure.code,
        message=failure.message,
    )


def provider_job(job: ProviderJobRecord | None) -> pb.ProviderJob | None:
    if job is None:
        return None
    return pb.ProviderJob(
        provider_job_id=job.provider_job_id,
        provider_request_id=job.provider_request_id or "",
        raw_status=job.raw_status or "",
        normalized_status=_JOB_STATE.get(job.normalized_status, adapter_pb2.JOB_STATE_UNSPECIFIED),
        submitted_at=timestamp(job.submitted_at),
        last_polled_at=timestamp(job.last_polled_at),
        completed_at=timestamp(job.completed_at),
    )


def attempt(rec: AttemptRecord, job: ProviderJobRecord | None) -> pb.Attempt:
    plan = rec.compile_plan
    return pb.Attempt(
        attempt_id=str(rec.id),
        attempt_no=rec.attempt_no,
        provider=str(plan.get("provider", "")),
        account=str(plan.get("account", "")),
        model=rec.provider_model,
        model_version=rec.provider_model_version,
        capability_version=rec.capability_version,
        price_version=rec.price_version,
        routing_policy_version=rec.routing_policy_version,
        client_request_key=rec.client_request_key,
        request_hash=rec.request_hash or "",
        state=attempt_state(rec.state),
        status_version=rec.status_version,
        estimated_cost=money_pb2.Money(
            amount_micros=rec.estimated_cost_micros, currency_code=rec.currency
        ),
        actual_cost=(
            money_pb2.Money(amount_micros=rec.actual_cost_micros, currency_code=rec.currency)
            if rec.actual_cost_micros is not None
            else None
        ),
        provider_job=provider_job(job),
        error=error(rec.failure),
        created_at=timestamp(rec.created_at),
        updated_at=timestamp(rec.updated_at),
    )


def route_decision(rec: RouteDecisionRecord) -> pb.RouteDecision:
    snapshot = rec.candidate_snapshot
    candidates = []
    for c in snapshot.get("candidates", []):
        cost = c.get("estimated_cost_micros")
        cid = str(c.get("id", ""))
        explained = candidate_explain(snapshot, cid)
        candidates.append(
            pb.CandidateScore(
                candidate_id=cid,
                eligible=bool(c.get("eligible", False)),
                reject_reason=str(c.get("reason", "")),
                reject_detail=str(c.get("detail", "")),
                score=float(c.get("score", 0.0)),
                components={k: float(v) for k, v in c.get("components", {}).items()},
                penalties={k: float(v) for k, v in c.get("penalties", {}).items()},
                inputs=candidate_inputs(snapshot, cid),
                health_window=explained.window,
                call_baselines_s=explained.baselines_s,
                breaker_opened_for=explained.breaker_opened_for,
                breaker_opened_on_slow_calls=explained.opened_on_slow_calls,
                quality_prior_source=explained.quality_prior_source,
                estimated_cost=(
                    money_pb2.Money(amount_micros=int(cost), currency_code=c.get("currency", "USD"))
                    if cost is not None
                    else None
                ),
            )
        )
    return pb.RouteDecision(
        decision_no=rec.decision_no,
        policy_version=rec.policy_version,
        capability_version=str(snapshot.get("capability_version", "")),
        selected_candidate=rec.selected_candidate or "",
        candidates=candidates,
        reason_code=rec.reason_code,
        shadow_selected_candidate=str(snapshot.get("shadow_selected", "")),
        created_at=timestamp(rec.created_at),
        selection_reason=str(snapshot.get("selection_reason", "") or ""),
        quality_bucket=quality_bucket(snapshot),
    )


def stored_output(sample: Mapping[str, Any]) -> pb.StoredOutput:
    """One stored sample (a dict of `controlplane.domain.outputs`)."""
    return pb.StoredOutput(
        uri=str(sample.get("uri", "")),
        sample_index=int(sample.get("sample_index", 0)),
        mime_type=str(sample.get("mime_type", "")),
        size_bytes=int(sample.get("size_bytes", 0)),
        checksum_sha256=str(sample.get("checksum_sha256", "")),
        duration_ms=int(sample.get("duration_ms", 0)),
        width=int(sample.get("width", 0)),
        height=int(sample.get("height", 0)),
    )


def task(rec: TaskRecord, detail: TaskDetail | None = None) -> pb.Task:
    """A task message; attempts and decisions are filled only when `detail` is given."""
    msg = pb.Task(
        task_id=str(rec.id),
        spec=spec_to_proto(rec.spec),
        idempotency_key=rec.idempotency_key,
        normalized_spec_hash=rec.spec_hash,
        state=task_state(rec.state),
        status_version=rec.status_version,
        failure=error(rec.failure),
        adopted_attempt_id=str(rec.adopted_attempt_id) if rec.adopted_attempt_id else "",
        created_at=timestamp(rec.created_at),
        updated_at=timestamp(rec.updated_at),
    )
    samples = stored_samples(rec.output_asset)
    if samples:
        msg.outputs.extend(stored_output(s) for s in samples)
        msg.output.CopyFrom(msg.outputs[0])
    if rec.webhook is not None:
        msg.webhook.CopyFrom(
            pb.WebhookSubscription(url=rec.webhook.url, events=list(rec.webhook.events))
        )
    if detail is not None:
        jobs = {j.attempt_id: j for j in detail.provider_jobs}
        msg.attempts.extend(attempt(a, jobs.get(a.id)) for a in detail.attempts)
        msg.route_decisions.extend(route_decision(d) for d in detail.route_decisions)
    return msg


_EVENT_KIND = {
    "task.queued": pb.TASK_EVENT_KIND_CREATED,
    "task.state_changed": pb.TASK_EVENT_KIND_TASK_STATE_CHANGED,
    "attempt.created": pb.TASK_EVENT_KIND_ATTEMPT_CREATED,
    "attempt.state_changed": pb.TASK_EVENT_KIND_ATTEMPT_STATE_CHANGED,
    "provider_job.recorded": pb.TASK_EVENT_KIND_PROVIDER_PROGRESS,
    "provider.progress": pb.TASK_EVENT_KIND_PROVIDER_PROGRESS,
    "output.stored": pb.TASK_EVENT_KIND_OUTPUT_STORED,
}


def task_event(
    event: TaskEventRecord, last_task_state: pb.TaskState.ValueType | None
) -> pb.TaskEvent:
    """A stored task event; task_state is the state after it (carried over for attempt events)."""
    payload = event.payload
    kind = _EVENT_KIND.get(event.kind, pb.TASK_EVENT_KIND_UNSPECIFIED)
    is_task_event = event.kind.startswith("task.")
    state = payload.get("state")
    msg = pb.TaskEvent(
        cursor=str(event.seq),
        task_id=str(event.task_id),
        kind=kind,
        detail_json=json.dumps({"kind": event.kind, **payload}, sort_keys=True, default=str),
        created_at=timestamp(event.created_at),
    )
    if is_task_event and state:
        msg.task_state = task_state(TaskState(state))
    elif last_task_state is not None:
        msg.task_state = last_task_state
    if "attempt_id" in payload:
        msg.attempt_id = str(payload["attempt_id"])
        if not is_task_event and state in AttemptState.__members__:
            msg.attempt_state = attempt_state(AttemptState(state))
    if event.kind == "provider.progress":
        msg.progress.SetInParent()  # set even when a reading held neither field
        if isinstance(fraction := payload.get("fraction"), int | float):
            msg.progress.fraction = float(fraction)
        if isinstance(position := payload.get("queue_position"), int):
            msg.progress.queue_position = position
    return msg


_CANCEL_OUTCOME = {
    CancelResult.CANCELLED: pb.CANCEL_OUTCOME_CANCELLED,
    CancelResult.REQUESTED: pb.CANCEL_OUTCOME_REQUESTED,
    CancelResult.ALREADY_FINISHED: pb.CANCEL_OUTCOME_ALREADY_FINISHED,
}


def cancel_outcome(result: CancelResult) -> pb.CancelOutcome.ValueType:
    """What a CancelTask call did."""
    return _CANCEL_OUTCOME[result]


_DELIVERY_STATE = {
    DeliveryState.PENDING: pb.WEBHOOK_DELIVERY_STATE_PENDING,
    DeliveryState.DELIVERED: pb.WEBHOOK_DELIVERY_STATE_DELIVERED,
    DeliveryState.FAILED: pb.WEBHOOK_DELIVERY_STATE_FAILED,
    DeliveryState.REFUSED: pb.WEBHOOK_DELIVERY_STATE_REFUSED,
}


def webhook_delivery(rec: DeliveryRecord) -> pb.WebhookDelivery:
    """One caller-webhook message of a task and its attempts."""
    return pb.WebhookDelivery(
        webhook_id=rec.id,
        event_type=rec.event_type,
        url=rec.url,
        state=_DELIVERY_STATE[rec.state],
        attempts=[
            pb.WebhookAttempt(
                attempt_no=a.attempt_no,
                sent_at=timestamp(a.sent_at),
                status_code=a.status_code,
                error=a.error,
                duration_ms=a.duration_ms,
            )
            for a in rec.attempts
        ],
        next_attempt_at=(
            timestamp(rec.next_attempt_at) if rec.state is DeliveryState.PENDING else None
        ),
        created_at=timestamp(rec.created_at),
    )
