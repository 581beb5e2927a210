"""The failover decision of 9.9.1/9.9.2/9.16 as a pure function."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from controlplane.domain.failover import (
    FailoverAction,
    FailoverInput,
    FailoverLimits,
    FailureStage,
    backoff_delay_s,
    count_switches,
    decide,
)
from vidroute_core.errors import ErrorClass, make_error
from vidroute_core.spec import RoutingMode

NOW = datetime(2026, 6, 24, tzinfo=UTC)
LIMITS = FailoverLimits()


def inp(
    error_class: ErrorClass,
    *,
    stage: FailureStage = FailureStage.SUBMIT,
    mode: RoutingMode = RoutingMode.AUTO,
    attempts: int = 1,
    switches: int = 0,
    retries: int = 0,
    deadline: datetime | None = None,
    retry_after_ms: int | None = None,
) -> FailoverInput:
    return FailoverInput(
        make_error(error_class, "E", "m", retry_after_ms=retry_after_ms),
        stage,
        mode,
        attempts,
        switches,
        retries,
        NOW,
        deadline,
    )


def test_safety_input_never_fails_over() -> None:
    """SAFETY_INPUT fails the task in every routing mode (9.9.2)."""
    for mode in RoutingMode:
        assert decide(inp(ErrorClass.SAFETY_INPUT, mode=mode), LIMITS, unit_random=0.5).action is (
            FailoverAction.FAIL_TASK
        )


def test_unknown_outcome_is_refused() -> None:
    """A possibly accepted submission must go to recovery; asking for failover is an error."""
    with pytest.raises(ValueError, match="recovery"):
        decide(inp(ErrorClass.SUBMISSION_UNKNOWN), LIMITS, unit_random=0)


def test_rate_limit_retries_same_then_fails_over() -> None:
    """429 retries the same candidate until the retry bound, then fails over."""
    first = decide(inp(ErrorClass.RATE_LIMITED, retry_after_ms=2500), LIMITS, unit_random=0)
    assert first.action is FailoverAction.RETRY_SAME
    assert first.retry_delay_s == 2.5
    spent = decide(inp(ErrorClass.RATE_LIMITED, retries=3), LIMITS, unit_random=0)
    assert spent.action is FailoverAction.FAIL_OVER


def test_execution_failures_never_retry_in_place() -> None:
    """A job that failed after acceptance is never re-sent as is: it fails over or fails."""
    decision = decide(
        inp(ErrorClass.INTERNAL_RETRYABLE, stage=FailureStage.EXECUTION), LIMITS, unit_random=0
    )
    assert decision.action is FailoverAction.FAIL_OVER


def test_strict_model_fails_over_within_the_model() -> None:
    """STRICT_MODEL may only fail over to the same model (another account)."""
    decision = decide(inp(ErrorClass.AUTH, mode=RoutingMode.STRICT_MODEL), LIMITS, unit_random=0)
    assert decision.action is FailoverAction.FAIL_OVER
    assert decision.same_model_only


@pytest.mark.parametrize(
    ("kwargs", "reason"),
    [
        ({"attempts": 3}, "MAX_TOTAL_ATTEMPTS"),
        ({"switches": 2}, "MAX_PROVIDER_SWITCHES"),
        ({"deadline": NOW - timedelta(seconds=1)}, "TASK_DEADLINE_EXCEEDED"),
    ],
)
def test_limits_end_the_task(kwargs: dict[str, object], reason: str) -> None:
    """max_total_attempts, max_provider_switches and the task deadline each stop failover."""
    decision = decide(inp(ErrorClass.UNSUPPORTED_CAPABILITY, **kwargs), LIMITS, unit_random=0)  # type: ignore[arg-type]  # keyword overrides from a plain dict; the constructor checks them
    assert (decision.action, decision.reason) == (FailoverAction.FAIL_TASK, reason)


def test_output_expired_and_invalid_input_fail() -> None:
    """Classes whose row forbids failover (INVALID_INPUT, OUTPUT_EXPIRED) fail the task."""
    for error_class in (
        ErrorClass.INVALID_INPUT,
        ErrorClass.OUTPUT_EXPIRED,
        ErrorClass.SAFETY_OUTPUT,
    ):
        assert decide(inp(error_class), LIMITS, unit_random=0).action is FailoverAction.FAIL_TASK


def test_count_switches_counts_changes_of_candidate() -> None:
    """Switches are changes of (account, model) between consecutive attempts."""
    assert count_switches([(1, "a"), (1, "a"), (2, "a"), (2, "b")]) == 2
    assert count_switches([]) == 0


@given(st.integers(0, 30), st.floats(0, 1))
def test_backoff_is_bounded_and_jittered(retry_no: int, u: float) -> None:
    """Backoff stays within [ceiling/2, ceiling] where ceiling = min(cap, base * 2^n)."""
    delay = backoff_delay_s(retry_no, base_s=1.0, cap_s=60.0, unit_random=u)
    ceiling = min(60.0, 2.0**retry_no)
    assert ceiling / 2 - 1e-9 <= delay <= ceiling + 1e-9


@given(
    st.sampled_from(list(ErrorClass)),
    st.sampled_from(list(RoutingMode)),
    st.sampled_from(list(FailureStage)),
)
def test_no_decision_ever_fails_over_a_safety_refusal(
    error_class: ErrorClass, mode: RoutingMode, stage: FailureStage
) -> None:
    """For every class, mode and stage: SAFETY_INPUT never fails over and RETRY_SAME only on
    submit.
    """
    if error_class is ErrorClass.SUBMISSION_UNKNOWN:
        return
    decision = decide(inp(error_class, mode=mode, stage=stage), LIMITS, unit_random=0.3)
    if error_class is ErrorClass.SAFETY_INPUT:
        assert decision.action is FailoverAction.FAIL_TASK
    if stage is FailureStage.EXECUTION:
        assert decision.action is not FailoverAction.RETRY_SAME
