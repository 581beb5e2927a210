"""What `Client` and `AsyncClient` share: configuration, the retry policy, requests and results.

Nothing here does I/O except reading the token file (`clients.auth.token_from_env`).
"""

from __future__ import annotations

import json
import os
import random
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import grpc
from google.protobuf import json_format

from clients import auth
from clients.sdk import errors
from vidroute.common.v1 import generation_pb2
from vidroute.scheduler.v1 import scheduler_pb2 as pb
from vidroute.scheduler.v1 import scheduler_service_pb2 as api

DEFAULT_TARGET = "localhost:8051"
DEFAULT_TIMEOUT_S = 30.0
SERVICE = "vidroute.scheduler.v1.SchedulerService"
TERMINAL = frozenset({pb.TASK_STATE_SUCCEEDED, pb.TASK_STATE_FAILED, pb.TASK_STATE_CANCELLED})
# Read-only RPCs (and CreateTask, which the SDK always sends with an idempotency key) are
# retried by the channel on UNAVAILABLE; nothing else is. CancelTask is left out: a retried
# cancel whose first try landed would report ALREADY_FINISHED instead of what it did.
RETRIED_METHODS = (
    "GetTask",
    "ListTasks",
    "WatchTask",
    "ExplainRoute",
    "GetOutput",
    "GetOutputUrl",
    "ListProviders",
    "GetProviderHealth",
    "ListWebhookDeliveries",
    "CreateTask",
)
# RoutingService (`clients.sdk.routing`): its reads, and SubmitFeedback, idempotent per (task,
# verdict); publication and rollback are sent once.
ROUTING_SERVICE = "vidroute.scheduler.v1.RoutingService"
ROUTING_RETRIED_METHODS = (
    "GetQuality",
    "ListCanaries",
    "ListRoutingPolicies",
    "ReplayRoutes",
    "SubmitFeedback",
)
RETRY_POLICY = {
    "maxAttempts": 4,
    "initialBackoff": "0.1s",
    "maxBackoff": "2s",
    "backoffMultiplier": 2,
    "retryableStatusCodes": ["UNAVAILABLE"],
}
SERVICE_CONFIG: dict[str, Any] = {
    "methodConfig": [
        {
            "name": [{"service": SERVICE, "method": m} for m in RETRIED_METHODS]
            + [{"service": ROUTING_SERVICE, "method": m} for m in ROUTING_RETRIED_METHODS],
            "retryPolicy": RETRY_POLICY,
        }
    ],
    # Retries stop while more than half of recent calls failed: no retry storm on an outage.
    "retryThrottling": {"maxTokens": 10, "tokenRatio": 0.1},
}
# A dropped server comes back within seconds: do not let the channel's reconnect backoff grow
# to gRPC's default 120 s.
_RECONNECT = (("grpc.initial_reconnect_backoff_ms", 200), ("grpc.max_reconnect_backoff_ms", 5000))
RETRYING_OPTIONS: tuple[tuple[str, Any], ...] = (
    ("grpc.enable_retries", 1),
    ("grpc.service_config", json.dumps(SERVICE_CONFIG)),
    *_RECONNECT,
)
# The channel of a CreateTask without an idempotency key: never retried (it could create twice).
ONCE_OPTIONS: tuple[tuple[str, Any], ...] = (("grpc.enable_retries", 0), *_RECONNECT)
# Stream resumption (watch, download_output): consecutive failures without progress, and the
# backoff between them (0.2 s doubling to 5 s, with jitter: ~30 s in all).
RESUME_ATTEMPTS = 10
_RESUMABLE = frozenset(
    {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED, grpc.StatusCode.INTERNAL}
)


def resolve_target(target: str | None) -> str:
    """`target`, else ``VIDROUTE_TARGET``, else ``localhost:8051``."""
    return target or os.environ.get("VIDROUTE_TARGET") or DEFAULT_TARGET


def resolve_token(token: str | None) -> str:
    """`token`, else ``VIDROUTE_TOKEN``, else the dev admin token `vidroute up` left in ./var."""
    return token if token is not None else auth.token_from_env()


def metadata(token: str) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {token}"),) if token else ()


def resumable(err: grpc.RpcError) -> bool:
    """A dropped stream rather than an answer: UNAVAILABLE (server gone, restarting), a reset
    stream (CANCELLED or INTERNAL from RST_STREAM; the SDK never cancels a stream it reads)."""
    call: Any = err
    code = call.code()
    if code is grpc.StatusCode.INTERNAL:
        return "RST_STREAM" in (call.details() or "")
    return code in _RESUMABLE


def backoff_s(failures: int) -> float:
    """Delay before resumption number `failures` (1-based): doubling from 0.2 s, at most 5 s,
    with up to 25% jitter so many clients do not reconnect in step."""
    base = min(0.2 * 2 ** (failures - 1), 5.0)
    return float(base * (1 + random.random() / 4))


def as_spec(
    spec: generation_pb2.GenerationSpec | Mapping[str, Any],
) -> generation_pb2.GenerationSpec:
    """A GenerationSpec from a message or its proto-JSON dict; a bad dict is InvalidArgument."""
    if isinstance(spec, generation_pb2.GenerationSpec):
        return spec
    try:
        return json_format.ParseDict(dict(spec), generation_pb2.GenerationSpec())
    except json_format.ParseError as exc:
        raise errors.InvalidArgument(
            grpc.StatusCode.INVALID_ARGUMENT,
            "spec is not a GenerationSpec",
            field_violations=(errors.FieldViolation("spec", str(exc)),),
        ) from exc


def as_webhook(
    webhook: pb.WebhookSubscription | Mapping[str, Any] | str | None,
) -> pb.WebhookSubscription | None:
    """A WebhookSubscription from a message, a ``{"url", "events"}`` dict or a bare URL."""
    if webhook is None or isinstance(webhook, pb.WebhookSubscription):
        return webhook
    if isinstance(webhook, str):
        return pb.WebhookSubscription(url=webhook)
    return json_format.ParseDict(dict(webhook), pb.WebhookSubscription())


def create_request(
    spec: generation_pb2.GenerationSpec | Mapping[str, Any],
    idempotency_key: str | None,
    webhook: pb.WebhookSubscription | Mapping[str, Any] | str | None,
    generate_key: bool,
) -> api.CreateTaskRequest:
    key = idempotency_key or (str(uuid.uuid4()) if generate_key else "")
    request = api.CreateTaskRequest(spec=as_spec(spec), idempotency_key=key)
    subscription = as_webhook(webhook)
    if subscription is not None:
        request.webhook.CopyFrom(subscription)
    return request


def _enum_value(enum: Any, prefix: str, value: int | str | None, field: str) -> int:
    """An enum number from a number or a name with or without `prefix`; 0 for None."""
    if value is None or value == "":
        return 0
    if not isinstance(value, str):
        return int(value)
    name = value.upper()
    try:
        return int(enum.Value(name if name.startswith(prefix) else prefix + name))
    except ValueError:
        names = ", ".join(n.removeprefix(prefix) for n in enum.keys()[1:])
        raise errors.InvalidArgument(
            grpc.StatusCode.INVALID_ARGUMENT,
            f"unknown {field} {value!r}",
            field_violations=(errors.FieldViolation(field, f"one of {names}"),),
        ) from None


def task_state(state: int | str | None) -> pb.TaskState.ValueType:
    """ListTasks' filter from an enum value or a name (``"RUNNING"``, ``"TASK_STATE_RUNNING"``)."""
    return pb.TaskState.ValueType(_enum_value(pb.TaskState, "TASK_STATE_", state, "state"))


def breaker_state(state: int | str | None) -> pb.BreakerState.ValueType:
    """ForceBreaker's state from an enum value or a name (``"OPEN"``); None releases."""
    return pb.BreakerState.ValueType(_enum_value(pb.BreakerState, "BREAKER_STATE_", state, "state"))


def force_request(
    provider: str,
    account: str,
    region: str,
    model: str,
    *,
    state: int | str | None,
    reason: str,
    operation: str,
) -> api.ForceBreakerRequest:
    return api.ForceBreakerRequest(
        provider=provider,
        account=account,
        region=region,
        model=model,
        operation=operation,
        state=breaker_state(state),
        reason=reason,
    )


@dataclass(frozen=True, slots=True)
class Created:
    """The result of `create`: the task, whether this call created it, and the key it used."""

    task: pb.Task
    created: bool
    idempotency_key: str


@dataclass(frozen=True, slots=True)
class Cancelled:
    """The result of `cancel`: the task after the call and what the call did."""

    task: pb.Task
    outcome: pb.CancelOutcome.ValueType

    @property
    def cancelled(self) -> bool:
        """The task is CANCELLED by this call (it was not yet at a provider)."""
        return self.outcome == pb.CANCEL_OUTCOME_CANCELLED

    @property
    def requested(self) -> bool:
        """A running attempt was asked to cancel; the task ends CANCELLED once it confirms."""
        return self.outcome == pb.CANCEL_OUTCOME_REQUESTED

    @property
    def already_finished(self) -> bool:
        """The task had already ended before the call; nothing changed."""
        return self.outcome == pb.CANCEL_OUTCOME_ALREADY_FINISHED


def is_terminal_event(event: pb.TaskEvent) -> bool:
    """The event that ends a watch: the task's change into a terminal state."""
    return event.kind == pb.TASK_EVENT_KIND_TASK_STATE_CHANGED and event.task_state in TERMINAL


def capabilities_request(
    document: str | bytes | Path,
    source: str,
    dry_run: bool,
    *,
    version: str = "",
    activate_at: datetime | None = None,
    staged: bool = False,
    force_reason: str = "",
) -> api.PublishCapabilitiesRequest:
    """A capability document given as its text, its bytes or a path to its file; a
    `force_reason` forces the release past the serving check (recorded)."""
    if isinstance(document, Path):
        source = source or str(document)
        document = document.read_text(encoding="utf-8")
    elif isinstance(document, bytes):
        document = document.decode("utf-8")
    request = api.PublishCapabilitiesRequest(
        document=document,
        source=source,
        dry_run=dry_run,
        version=version,
        staged=staged,
        force=bool(force_reason),
        reason=force_reason,
    )
    if activate_at is not None:
        request.activate_at.FromDatetime(activate_at.astimezone(UTC))
    return request
