"""What to do after a definite provider failure (design 9.9.1, 9.9.2, 9.16): a pure decision.

Three answers, in the order they are considered::

    FAIL_TASK   the task ends FAILED with the error (deadline passed, SAFETY_INPUT, a matrix row
                that forbids both retry and failover, a limit reached)
    RETRY_SAME  send the same attempt again to the same candidate after a backoff; only for a
                *rejected submit* whose class allows it (429/overload/5xx-not-created/quota),
                bounded by `FailoverLimits.max_same_candidate_retries`
    FAIL_OVER   fail the attempt and hand the task back to the scheduler for a new attempt,
                excluding the failed candidate; bounded by max_total_attempts,
                max_provider_switches and max_estimated_platform_loss_micros; STRICT_MODEL keeps
                the model (another account at most)

Exclusions (`exclusion_is_soft`): a FAIL_OVER excludes the failed (account, model) from the
task's next routing. After a failure of the endpoint's health (a class the circuit breaker
counts, 429, short-term quota, AUTH / PERMISSION, which open the account's breaker) the exclusion
is SOFT: routing prefers any other eligible candidate, but when nothing else is eligible the
softly excluded candidate stays eligible, paced by its breaker (OPEN keeps the task QUEUED) and
by `requeue_backoff` (no new attempt on it before ``retry_at``). A 30 s network blip at the only
provider of a pinned task therefore waits and retries instead of failing as "no eligible
candidate"; the attempt bounds still end the task, with the failure's true class. Any other
class (UNSUPPORTED_CAPABILITY, INVALID_INPUT, ASSET_*, permanent failures) excludes HARD: the
candidate said it cannot do this task.

The estimated platform loss of a task (9.16.4) is what providers may have billed for attempts
whose result was never delivered: a job accepted and then failed or cancelled, an ABANDONED or
still SUBMIT_UNKNOWN submit (`estimated_platform_loss`). A new attempt may end the same way, so a
failover is refused when the loss so far plus the failed attempt's cost (the best estimate of
the next one) would exceed the limit (`platform_loss_exceeded`).

A failure whose outcome is unknown (``provider_may_have_accepted``) never reaches this function:
it enters recovery (9.17). Calling `decide` with one is a programming error and raises.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from itertools import pairwise

from controlplane.domain.states import MAYBE_BILLED_ATTEMPT_STATES, AttemptState
from vidroute_core.errors import ErrorClass, ProviderError, may_fail_over, may_retry_same
from vidroute_core.spec import RoutingMode

__all__ = [
    "MAX_ESTIMATED_PLATFORM_LOSS",
    "SOFT_EXCLUSION_CLASSES",
    "AttemptCost",
    "FailoverAction",
    "FailoverDecision",
    "FailoverInput",
    "FailoverLimits",
    "FailureStage",
    "backoff_delay_s",
    "count_switches",
    "decide",
    "estimated_platform_loss",
    "exclusion_is_soft",
    "platform_loss_exceeded",
    "requeue_backoff_s",
]

MAX_ESTIMATED_PLATFORM_LOSS = "MAX_ESTIMATED_PLATFORM_LOSS"


class FailoverAction(enum.Enum):
    RETRY_SAME = "RETRY_SAME"
    FAIL_OVER = "FAIL_OVER"
    FAIL_TASK = "FAIL_TASK"


class FailureStage(enum.Enum):
    """Where the failure happened: a refused submit, or a job that failed after acceptance."""

    SUBMIT = "SUBMIT"
    EXECUTION = "EXECUTION"


@dataclass(frozen=True, slots=True)
class FailoverLimits:
    """The bounds of 9.16.4; `max_retry_after_s` caps how long a RETRY_SAME may wait."""

    max_total_attempts: int = 3
    max_provider_switches: int = 2
    # Integer micros of the task's currency; 0 means no limit. Ten dollars: one lost
    # long generation is absorbed, a second one on the same task is not.
    max_estimated_platform_loss_micros: int = 10_000_000
    # Count-bounded (9.9.1 "限次"), not time-bounded: after ~3.5-7 s of backoff a task with
    # another candidate fails over quickly; a task whose only candidate keeps failing is paced
    # from then on by the soft exclusion's `requeue_backoff_s` and the candidate's breaker
    # (fed by every one of these sends), which is what rides out a longer outage.
    max_same_candidate_retries: int = 3
    retry_base_s: float = 1.0
    retry_cap_s: float = 60.0
    max_retry_after_s: float = 300.0
    # The earliest a softly excluded candidate may get the task's next attempt: exponential
    # in the task's attempts so far, with equal jitter. 10 s base: an attempt's own retries
    # took ~3.5-7 s, so the second attempt's sends (which trip the breaker's 8 consecutive
    # failures) and the breaker's 30 s cooldown keep a third one off the endpoint for ~45 s.
    requeue_backoff_base_s: float = 10.0
    requeue_backoff_cap_s: float = 300.0
    # SAFETY_OUTPUT regeneration is a product decision (9.9.1); off by default.
    regenerate_on_safety_output: bool = False


@dataclass(frozen=True, slots=True)
class FailoverInput:
    """Everything `decide` looks at; `attempts_so_far` includes the failed attempt."""

    error: ProviderError
    stage: FailureStage
    routing_mode: RoutingMode
    attempts_so_far: int
    provider_switches_so_far: int
    same_candidate_retries: int
    now: datetime
    deadline_at: datetime | None = None
    # `estimated_platform_loss` of the task's attempts, the failed one included, and the
    # failed attempt's estimated cost (what a new attempt is expected to cost).
    platform_loss_micros: int = 0
    next_attempt_cost_micros: int = 0


@dataclass(frozen=True, slots=True)
class AttemptCost:
    """What the loss estimate needs of one attempt; `had_job`: a provider job was recorded."""

    state: AttemptState
    estimated_cost_micros: int
    actual_cost_micros: int | None = None
    had_job: bool = False


# Ended without delivering, though a provider job existed and may have been billed.
_JOB_LOST = frozenset({AttemptState.FAILED, AttemptState.CANCELLED})


def estimated_platform_loss(attempts: Iterable[AttemptCost]) -> int:
    """Micros providers may have billed for this task's attempts without a delivered result.

    A provider's reported actual cost replaces the estimate when known (a failed job is often
    free); a rejected submit (no job) costs nothing."""
    loss = 0
    for a in attempts:
        if (a.state in _JOB_LOST and a.had_job) or a.state in MAYBE_BILLED_ATTEMPT_STATES:
            cost = (
                a.actual_cost_micros
                if a.actual_cost_micros is not None
                else a.estimated_cost_micros
            )
            loss += max(0, cost)
    return loss


def platform_loss_exceeded(limits: FailoverLimits, loss_micros: int, next_cost_micros: int) -> bool:
    """Whether one more attempt could take the task's platform loss past the limit."""
    limit = limits.max_estimated_platform_loss_micros
    return limit > 0 and loss_micros + max(0, next_cost_micros) > limit


@dataclass(frozen=True, slots=True)
class FailoverDecision:
    """The answer; `reason` is a stable code recorded on the task or attempt."""

    action: FailoverAction
    reason: str
    retry_delay_s: float = 0.0
    same_model_only: bool = False


def backoff_delay_s(retry_no: int, *, base_s: float, cap_s: float, unit_random: float) -> float:
    """Exponential backoff with "equal jitter": half fixed, half random, capped at `cap_s`."""
    if retry_no < 0:
        raise ValueError("retry_no must be >= 0")
    ceiling = min(cap_s, base_s * (2.0**retry_no))
    return ceiling / 2.0 + (ceiling / 2.0) * unit_random


# The endpoint failed, not the task's fit to it: another try later may well succeed (9.15.1,
# 9.9.1 rows 配额耗尽 / 429 / 明确未受理的 5xx; AUTH / PERMISSION wait on the account breaker).
SOFT_EXCLUSION_CLASSES = frozenset(
    {
        ErrorClass.TRANSIENT_NETWORK,
        ErrorClass.PROVIDER_OVERLOADED,
        ErrorClass.RATE_LIMITED,
        ErrorClass.INTERNAL_RETRYABLE,
        ErrorClass.QUOTA,
        ErrorClass.AUTH,
        ErrorClass.PERMISSION,
    }
)


def exclusion_is_soft(error_class: str | ErrorClass | None) -> bool:
    """Whether a failure of this class excludes its candidate softly (see the module doc).

    Unknown or missing classes exclude hard: a soft exclusion must be earned by a known
    endpoint-health failure, never granted to a failure nobody classified."""
    if error_class is None:
        return False
    if isinstance(error_class, str):
        try:
            error_class = ErrorClass(error_class)
        except ValueError:
            return False
    return error_class in SOFT_EXCLUSION_CLASSES


def requeue_backoff_s(attempts_so_far: int, limits: FailoverLimits, *, unit_random: float) -> float:
    """How long a softly excluded candidate waits before the task's next attempt on it."""
    return backoff_delay_s(
        max(0, attempts_so_far - 1),
        base_s=limits.requeue_backoff_base_s,
        cap_s=limits.requeue_backoff_cap_s,
        unit_random=unit_random,
    )


def count_switches(candidates: list[tuple[int, str]]) -> int:
    """How many times consecutive attempts changed (account, model): 9.16.4's switch count."""
    return sum(1 for prev, cur in pairwise(candidates) if prev != cur)


def _retry_same(
    inp: FailoverInput, limits: FailoverLimits, unit_random: float
) -> FailoverDecision | None:
    """RETRY_SAME when a refused submit may be re-sent, within the bounds and the deadline."""
    retries = inp.same_candidate_retries
    if (
        inp.stage is not FailureStage.SUBMIT
        or not may_retry_same(inp.error)
        or retries >= limits.max_same_candidate_retries
    ):
        return None
    retry_after = (inp.error.retry_after_ms or 0) / 1000.0
    if retry_after > limits.max_retry_after_s:
        return None  # the window resets too late (long-term quota): try elsewhere instead
    wait = max(
        retry_after,
        backoff_delay_s(
            retries, base_s=limits.retry_base_s, cap_s=limits.retry_cap_s, unit_random=unit_random
        ),
    )
    if inp.deadline_at is not None and (inp.deadline_at - inp.now).total_seconds() <= wait:
        return None
    return FailoverDecision(FailoverAction.RETRY_SAME, "RETRY_SAME", wait)


def _fail(reason: str) -> FailoverDecision:
    return FailoverDecision(FailoverAction.FAIL_TASK, reason)


def decide(inp: FailoverInput, limits: FailoverLimits, *, unit_random: float) -> FailoverDecision:
    """Apply the handling matrix, the safety rule, the routing mode and the limits."""
    error = inp.error
    if error.provider_may_have_accepted or error.error_class is ErrorClass.SUBMISSION_UNKNOWN:
        raise ValueError("an outcome that may have been accepted enters recovery, not failover")
    if inp.deadline_at is not None and inp.now >= inp.deadline_at:
        return _fail("TASK_DEADLINE_EXCEEDED")
    if error.error_class is ErrorClass.SAFETY_INPUT:
        # 9.9.2: another provider accepting the same input is no reason to send it there.
        return _fail("SAFETY_INPUT_NO_FAILOVER")
    if error.error_class is ErrorClass.SAFETY_OUTPUT and not limits.regenerate_on_safety_output:
        return _fail("SAFETY_OUTPUT_NO_REGENERATE")

    retry = _retry_same(inp, limits, unit_random)
    if retry is not None:
        return retry

    if not may_fail_over(error):
        return _fail(f"NO_FAILOVER_{error.error_class.value}")
    if inp.attempts_so_far >= limits.max_total_attempts:
        return _fail("MAX_TOTAL_ATTEMPTS")
    if inp.provider_switches_so_far >= limits.max_provider_switches:
        return _fail("MAX_PROVIDER_SWITCHES")
    if platform_loss_exceeded(limits, inp.platform_loss_micros, inp.next_attempt_cost_micros):
        return _fail(MAX_ESTIMATED_PLATFORM_LOSS)
    strict = inp.routing_mode is RoutingMode.STRICT_MODEL
    return FailoverDecision(
        FailoverAction.FAIL_OVER,
        "FAIL_OVER_SAME_MODEL" if strict else "FAIL_OVER",
        same_model_only=strict,
    )
