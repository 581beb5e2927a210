"""Failover history: what a requeue asks of the task's next routing decision.

The execution side hands a task back to the scheduler with a `RequeueRequest`: in ONE
transaction it fails the attempt, moves the task to QUEUED, stores the request as rows (one
``task_requeues`` row, one ``task_exclusions`` row per excluded candidate) and enqueues a
``task.requeue`` wake-up (`controlplane.domain.outbox`). The dispatcher reads the rows of every
queued task it considers and turns them into `RequeueFacts` (`requeue_facts`, the one builder),
which it routes with exactly like a ``task.queued`` task plus three rules:

1. never select a candidate in `excluded`, and pass over one in `soft_excluded` (an
   endpoint-health failure) while any other is eligible: fall back to it only when none is,
   and not before its ``retry_at``;
2. when `same_model_only` is set (routing mode STRICT_MODEL), select only that model;
3. `attempts_so_far` / `provider_switches_so_far` are informative; the limits were already
   checked on the execution side (`controlplane.domain.failover`), so the scheduler must not
   fail the task for them, only for "no eligible candidate" (its own rule).

`not_before` asks the scheduler not to create the new attempt earlier (None = at once).

Across a task's requeues exclusions accumulate (`merge_exclusion`: hard beats soft, a soft one
waits for the latest retry instant any requeue gave it) and the latest requeue wins for the
rest. The counts are not stored: the task's attempts are their truth.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

from controlplane.domain.failover import count_switches

__all__ = [
    "ExcludedCandidate",
    "RequeueFacts",
    "RequeueRequest",
    "merge_exclusion",
    "requeue_facts",
]


@dataclass(frozen=True, slots=True)
class ExcludedCandidate:
    """A candidate the scheduler must not pick again for this task (`soft`: see rule 1).

    `attempt_id` / `error_class`: the failed attempt that caused the exclusion, and its class.
    """

    provider_account_id: int
    provider_model: str
    soft: bool = False
    retry_at: datetime | None = None
    attempt_id: int | None = None
    error_class: str = ""

    @property
    def key(self) -> tuple[int, str]:
        return self.provider_account_id, self.provider_model


def merge_exclusion(known: ExcludedCandidate | None, new: ExcludedCandidate) -> ExcludedCandidate:
    """One candidate excluded again: a hard exclusion wins over a soft one and stays hard; a
    soft one waits for the latest ``retry_at`` (None: no wait). The result keeps the cause of
    whichever exclusion decided it (the known one on a tie)."""
    if known is None:
        return new
    if not known.soft:
        return known
    if not new.soft:
        return replace(new, retry_at=None)
    if new.retry_at is not None and (known.retry_at is None or new.retry_at > known.retry_at):
        return new
    return known


@dataclass(frozen=True, slots=True)
class RequeueRequest:
    """The task needs a new attempt; why, and what the new attempt must avoid.

    `reason` is a stable code (e.g. ``FAIL_OVER``, ``PROVEN_ABSENT``, ``ABANDONED_NEW_ATTEMPT``);
    `error_class` is the `ErrorClass` value of the failure that caused it ("" if none).
    A PROVEN_ABSENT requeue does not exclude the candidate: nothing failed there, the submit
    simply never reached the provider. `required_model` is set exactly when the new attempt
    must keep the model (`same_model_only`).
    """

    task_id: int
    failed_attempt_id: int
    reason: str
    error_class: str
    excluded_candidates: tuple[ExcludedCandidate, ...]
    same_model_only: bool
    required_model: str
    not_before: datetime | None = None
    # 9.16.4: the task's estimated platform loss when the new attempt was allowed, and the
    # max_estimated_platform_loss limit it was held against (0: no limit), in micros.
    platform_loss_micros: int = 0
    platform_loss_limit_micros: int = 0

    def wake_up(self) -> dict[str, Any]:
        """The ``task.requeue`` message's payload: which task, after which attempt."""
        return {"task_id": self.task_id, "failed_attempt_id": self.failed_attempt_id}


@dataclass(frozen=True, slots=True)
class RequeueFacts:
    """What a task's requeues ask of its next decision (the default: it was never requeued)."""

    excluded: frozenset[tuple[int, str]] = frozenset()
    # Softly excluded candidates and the earliest instant of a new attempt on each.
    soft_excluded: Mapping[tuple[int, str], datetime | None] = field(default_factory=dict)
    same_model_only: str = ""
    not_before: datetime | None = None
    attempts_so_far: int = 0
    provider_switches_so_far: int = 0
    error_class: str = ""  # the latest failure's class (what a NO_ELIGIBLE ending reports)


def requeue_facts(
    exclusions: Iterable[ExcludedCandidate],
    tried: Sequence[tuple[int, str]],
    *,
    required_model: str,
    not_before: datetime | None,
    error_class: str,
) -> RequeueFacts:
    """A requeued task's facts: every exclusion of all its requeues (merged by
    `merge_exclusion`, in whichever order they come), the (account, model) of each of its
    attempts in order, and its latest requeue's model pin ("" = any), `not_before` and class."""
    merged: dict[tuple[int, str], ExcludedCandidate] = {}
    for c in exclusions:
        merged[c.key] = merge_exclusion(merged.get(c.key), c)
    return RequeueFacts(
        excluded=frozenset(k for k, c in merged.items() if not c.soft),
        soft_excluded={k: c.retry_at for k, c in merged.items() if c.soft},
        same_model_only=required_model,
        not_before=not_before,
        attempts_so_far=len(tried),
        provider_switches_so_far=count_switches(list(tried)),
        error_class=error_class,
    )
