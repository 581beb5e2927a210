"""Contracts between the execution side and the scheduler: outbox topics and `RequeueRequest`.

Topics the execution engine consumes::

    attempt.submit   {task_id, attempt_id, [supports_idempotency_key]}   written by the scheduler
                     with `Store.create_attempt_with_decision`; the attempt is READY_TO_SUBMIT and
                     holds a lease whose token is on the attempt row.
    attempt.cancel   {task_id, attempt_id}        written by `CancelService`
    output.fetch     {task_id, attempt_id, provider_job_id}   written by the event normalizer

Topic the execution engine produces for the scheduler::

    task.requeue     `RequeueRequest.to_payload()`; the task is already QUEUED (moved there in
                     the same transaction that failed the attempt and wrote this message).

The scheduler consumes ``task.requeue`` exactly like ``task.queued`` with three extra rules:

1. never select a candidate listed in `excluded_candidates` (account id + model), unless the
   entry is ``soft`` (an endpoint-health failure): then prefer any other eligible candidate and
   fall back to it only when none is, not before its ``retry_at``;
2. when `same_model_only` is true (routing mode STRICT_MODEL), select only `required_model`;
3. `attempts_so_far` / `provider_switches_so_far` are informative; the limits were already
   checked here (`controlplane.domain.failover`), so the scheduler must not fail the task for
   them, only for "no eligible candidate" (its own rule).

`not_before` asks the scheduler not to create the new attempt earlier (None = at once).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

TOPIC_SUBMIT = "attempt.submit"
TOPIC_CANCEL = "attempt.cancel"
TOPIC_OUTPUT_FETCH = "output.fetch"
TOPIC_REQUEUE = "task.requeue"

__all__ = [
    "TOPIC_CANCEL",
    "TOPIC_OUTPUT_FETCH",
    "TOPIC_REQUEUE",
    "TOPIC_SUBMIT",
    "ExcludedCandidate",
    "RequeueRequest",
]


@dataclass(frozen=True, slots=True)
class ExcludedCandidate:
    """A candidate the scheduler must not pick again for this task (`soft`: see rule 1)."""

    provider_account_id: int
    provider_model: str
    soft: bool = False
    retry_at: datetime | None = None

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "provider_account_id": self.provider_account_id,
            "provider_model": self.provider_model,
        }
        if self.soft:  # a hard exclusion keeps the payload shape older readers know
            data["soft"] = True
            data["retry_at"] = self.retry_at.isoformat() if self.retry_at else None
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ExcludedCandidate:
        raw = data.get("retry_at")
        return cls(
            int(data["provider_account_id"]),
            str(data["provider_model"]),
            soft=bool(data.get("soft", False)),
            retry_at=datetime.fromisoformat(raw) if raw else None,
        )


@dataclass(frozen=True, slots=True)
class RequeueRequest:
    """The task needs a new attempt; why, and what the new attempt must avoid.

    `reason` is a stable code (e.g. ``FAIL_OVER``, ``PROVEN_ABSENT``, ``ABANDONED_NEW_ATTEMPT``);
    `error_class` is the `ErrorClass` value of the failure that caused it ("" if none).
    A PROVEN_ABSENT requeue does not exclude the candidate: nothing failed there, the submit
    simply never reached the provider.
    """

    task_id: int
    failed_attempt_id: int
    reason: str
    error_class: str
    excluded_candidates: tuple[ExcludedCandidate, ...]
    same_model_only: bool
    required_model: str
    attempts_so_far: int
    provider_switches_so_far: int
    not_before: datetime | None = None

    def to_payload(self) -> dict[str, Any]:
        return {
            "task_id": self.task_id,
            "failed_attempt_id": self.failed_attempt_id,
            "reason": self.reason,
            "error_class": self.error_class,
            "excluded_candidates": [c.to_json() for c in self.excluded_candidates],
            "same_model_only": self.same_model_only,
            "required_model": self.required_model,
            "attempts_so_far": self.attempts_so_far,
            "provider_switches_so_far": self.provider_switches_so_far,
            "not_before": self.not_before.isoformat() if self.not_before else None,
        }

    @classmethod
    def from_payload(cls, payload: dict[str, Any]) -> RequeueRequest:
        not_before = payload.get("not_before")
        return cls(
            task_id=int(payload["task_id"]),
            failed_attempt_id=int(payload["failed_attempt_id"]),
            reason=str(payload["reason"]),
            error_class=str(payload.get("error_class", "")),
            excluded_candidates=tuple(
                ExcludedCandidate.from_json(c) for c in payload.get("excluded_candidates", [])
            ),
            same_model_only=bool(payload.get("same_model_only", False)),
            required_model=str(payload.get("required_model", "")),
            attempts_so_far=int(payload.get("attempts_so_far", 0)),
            provider_switches_so_far=int(payload.get("provider_switches_so_far", 0)),
            not_before=datetime.fromisoformat(not_before) if not_before else None,
        )
