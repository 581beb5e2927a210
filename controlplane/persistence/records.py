"""Frozen views of stored rows, and the inputs of multi-row writes.

The units of work and the query modules return these instead of ORM objects, so nothing
outside the persistence package can lazily load, mutate or flush a row. JSON columns come back
as plain ``dict``s; treat them as read-only. Every timestamp is an aware UTC datetime.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from controlplane.domain.routing.decision import RouteDecisionSnapshot
from controlplane.domain.states import AttemptState, TaskState
from controlplane.domain.webhooks import WebhookSubscription
from vidroute_core.spec import GenerationSpec, ServiceClass


@dataclass(frozen=True, slots=True)
class Failure:
    """A normalized failure (design 9.9): class, stable code and a human message."""

    failure_class: str
    code: str = ""
    message: str = ""


@dataclass(frozen=True, slots=True)
class TaskRecord:
    """A row of ``generation_tasks``."""

    id: int
    tenant_id: str
    user_id: str
    project_id: str
    idempotency_key: str
    spec: GenerationSpec
    spec_hash: str
    service_class: ServiceClass
    priority: int
    state: TaskState
    status_version: int
    failure: Failure | None
    adopted_attempt_id: int | None
    output_asset: dict[str, Any] | None
    queue_deadline_at: datetime | None
    deadline_at: datetime | None
    created_at: datetime
    updated_at: datetime
    trace_context: str | None = None  # W3C traceparent of CreateTask (vidroute_core.tracing)
    webhook: WebhookSubscription | None = None  # the caller webhook (controlplane.domain.webhooks)


@dataclass(frozen=True, slots=True)
class AttemptRecord:
    """A row of ``task_attempts``."""

    id: int
    task_id: int
    attempt_no: int
    provider_account_id: int
    provider_model: str
    provider_model_version: str
    capability_version: str
    price_version: str
    routing_policy_version: str
    client_request_key: str
    normalized_spec_hash: str
    request_hash: str | None
    compile_plan: dict[str, Any]
    route_decision_id: int | None
    state: AttemptState
    status_version: int
    estimated_cost_micros: int
    actual_cost_micros: int | None
    currency: str
    lease_token: str | None
    fencing_token: int | None
    request_started_at: datetime | None
    request_body_sent_at: datetime | None
    transport_error_stage: str | None
    failure: Failure | None
    created_at: datetime
    updated_at: datetime


@dataclass(frozen=True, slots=True)
class ProviderJobRecord:
    """A row of ``provider_jobs``."""

    id: int
    attempt_id: int
    provider_account_id: int
    provider_job_id: str
    provider_request_id: str | None
    raw_status: str | None
    normalized_status: AttemptState
    output_locator: dict[str, Any] | None
    raw_failure: dict[str, Any] | None
    submitted_at: datetime
    last_polled_at: datetime | None
    completed_at: datetime | None
    created_at: datetime


@dataclass(frozen=True, slots=True)
class RouteDecisionRecord:
    """A row of ``route_decisions``."""

    id: int
    task_id: int
    decision_no: int
    policy_version: str
    selected_candidate: str | None
    candidate_snapshot: dict[str, Any]
    reason_code: str
    created_at: datetime


@dataclass(frozen=True, slots=True)
class TaskDetail:
    """A task with its whole execution history, each part in creation order."""

    task: TaskRecord
    attempts: tuple[AttemptRecord, ...]
    provider_jobs: tuple[ProviderJobRecord, ...]
    route_decisions: tuple[RouteDecisionRecord, ...]


@dataclass(frozen=True, slots=True)
class TaskEventRecord:
    """One entry of a task's history; `seq` is dense and starts at 1 per task."""

    task_id: int
    seq: int
    kind: str
    payload: dict[str, Any]
    created_at: datetime


@dataclass(frozen=True, slots=True)
class OutboxRecord:
    """A claimed outbox message. `attempts` counts claims, this one included."""

    id: int
    topic: str
    aggregate_id: str
    payload: dict[str, Any]
    created_at: datetime
    available_at: datetime
    claimed_by: str | None
    claimed_until: datetime | None
    attempts: int


@dataclass(frozen=True, slots=True)
class NewAttempt:
    """What the scheduler fixed for a new attempt (9.3.2); `attempt_no` is assigned by the store.

    The scheduler holds a capacity lease before it persists the attempt (9.20), so the attempt
    starts in READY_TO_SUBMIT unless `initial_state` says otherwise (CREATED or RESERVING).
    """

    provider_account_id: int
    provider_model: str
    provider_model_version: str
    capability_version: str
    price_version: str
    routing_policy_version: str
    client_request_key: str
    normalized_spec_hash: str
    compile_plan: dict[str, Any]
    estimated_cost_micros: int
    currency: str
    request_hash: str | None = None
    lease_token: str | None = None
    fencing_token: int | None = None
    initial_state: AttemptState = AttemptState.READY_TO_SUBMIT


@dataclass(frozen=True, slots=True)
class NewRouteDecision:
    """The explainable decision snapshot (9.10.2); `decision_no` is assigned by the store.

    `candidate_snapshot` is the routing decision itself, serialised once when the row is
    written (`persistence.explain`), or a document already built (tests, tools)."""

    policy_version: str
    reason_code: str
    candidate_snapshot: RouteDecisionSnapshot | Mapping[str, Any]
    selected_candidate: str | None = None


@dataclass(frozen=True, slots=True)
class NewProviderJob:
    """A job the provider acknowledged for an attempt (9.3.3)."""

    attempt_id: int
    provider_account_id: int
    provider_job_id: str
    normalized_status: AttemptState
    submitted_at: datetime
    provider_request_id: str | None = None
    raw_status: str | None = None
    output_locator: dict[str, Any] | None = None
    raw_failure: dict[str, Any] | None = None


@dataclass(frozen=True, slots=True)
class NewOutboxMessage:
    """A message to publish after the enclosing transaction commits."""

    topic: str
    aggregate_id: str
    payload: dict[str, Any] = field(default_factory=dict)
    available_at: datetime | None = None


@dataclass(frozen=True, slots=True)
class AttemptChanges:
    """Columns an attempt transition may set alongside its new state (None = leave as is)."""

    failure: Failure | None = None
    actual_cost_micros: int | None = None
    lease_token: str | None = None
    fencing_token: int | None = None
    request_hash: str | None = None
    request_started_at: datetime | None = None
    request_body_sent_at: datetime | None = None
    transport_error_stage: str | None = None
    provider_request_trace: dict[str, Any] | None = None


@dataclass(frozen=True, slots=True)
class TaskEnd:
    """A move of the task `record` into terminal `target` (`UnitOfWork.end_tasks`), with the
    columns `move_task` would set alongside it."""

    record: TaskRecord
    target: TaskState
    reason: str = ""
    failure: Failure | None = None
    output_asset: Mapping[str, Any] | None = None


@dataclass(frozen=True, slots=True)
class AttemptRuntime:
    """A row of ``attempt_runtime``: the execution engine's bookkeeping of one attempt."""

    attempt_id: int
    task_id: int
    submit_retries: int
    supports_idempotency_key: bool
    accepted_at: datetime | None
    next_poll_at: datetime | None
    poll_phase: str | None
    polls_in_phase: int
    poll_count: int
    last_polled_at: datetime | None
    stuck_since: datetime | None
    unknown_since: datetime | None
    next_recovery_at: datetime | None
    recovery_queries: int
    cancel_requested_at: datetime | None
    cancel_calls: int
    unrecognized_count: int
    last_unrecognized_status: str | None
    fetch_attempts: int
    output_refreshes: int
    job_not_found_since: datetime | None
    late_found_job_id: str | None
    late_found_method: str | None


@dataclass(frozen=True, slots=True)
class ProviderEventRecord:
    """A row of ``provider_events``: one stored observation of a provider job."""

    id: int
    provider_account_id: int
    provider_job_id: str
    attempt_id: int | None
    source: str
    job_state: str
    raw_status: str
    payload_hash: str
    raw_payload: str
    outcome: str
    received_at: datetime


@dataclass(frozen=True, slots=True)
class AccountInfo:
    """The provider account an attempt runs on."""

    id: int
    provider: str
    account_name: str
    region: str = ""


@dataclass(frozen=True, slots=True)
class LeaseDrift:
    """A lease counter the reconciler corrected: ``dimension`` is ``account/dimension``."""

    dimension: str
    expected: int
    actual: int
    delta: int
