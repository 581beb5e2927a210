"""The estimated platform loss of a task and the failover limit on it (9.16.4)."""

from __future__ import annotations

from datetime import UTC, datetime

from hypothesis import given
from hypothesis import strategies as st

from controlplane.domain.failover import (
    MAX_ESTIMATED_PLATFORM_LOSS,
    AttemptCost,
    FailoverAction,
    FailoverInput,
    FailoverLimits,
    FailureStage,
    decide,
    estimated_platform_loss,
    platform_loss_exceeded,
)
from controlplane.domain.states import AttemptState
from vidroute_core.errors import ErrorClass, make_error
from vidroute_core.spec import RoutingMode

NOW = datetime(2026, 12, 1, tzinfo=UTC)
_S = AttemptState


def test_only_undelivered_possibly_billed_attempts_count() -> None:
    """Accepted-then-failed/cancelled jobs and unknown/abandoned submits count; nothing else."""
    attempts = [
        AttemptCost(_S.FAILED, 100, had_job=True),  # accepted, then failed: counts
        AttemptCost(_S.FAILED, 200, had_job=False),  # refused submit: no job, no bill
        AttemptCost(_S.ABANDONED, 300),  # may be running and billed
        AttemptCost(_S.SUBMIT_UNKNOWN, 400),
        AttemptCost(_S.CANCELLED, 500, had_job=True),
        AttemptCost(_S.SUCCEEDED, 600, had_job=True),  # delivered: not a loss
        AttemptCost(_S.RUNNING, 700, had_job=True),  # still may deliver
    ]
    assert estimated_platform_loss(attempts) == 100 + 300 + 400 + 500


def test_a_reported_actual_cost_replaces_the_estimate() -> None:
    """When the provider reported what a failed job cost, that figure is the loss."""
    assert estimated_platform_loss([AttemptCost(_S.FAILED, 900, 0, had_job=True)]) == 0
    assert estimated_platform_loss([AttemptCost(_S.FAILED, 900, 1200, had_job=True)]) == 1200


_COST = st.builds(
    AttemptCost,
    state=st.sampled_from(list(AttemptState)),
    estimated_cost_micros=st.integers(min_value=0, max_value=10**9),
    actual_cost_micros=st.none() | st.integers(min_value=0, max_value=10**9),
    had_job=st.booleans(),
)


@given(st.lists(_COST, max_size=8), st.lists(_COST, max_size=8))
def test_loss_is_additive_and_bounded_by_total_cost(
    first: list[AttemptCost], second: list[AttemptCost]
) -> None:
    """Loss is an integer sum over attempts, never negative, never above what was charged."""
    loss = estimated_platform_loss(first + second)
    assert isinstance(loss, int)
    assert loss == estimated_platform_loss(first) + estimated_platform_loss(second)
    charged = sum(
        a.actual_cost_micros if a.actual_cost_micros is not None else a.estimated_cost_micros
        for a in first + second
    )
    assert 0 <= loss <= charged


@given(
    limit=st.integers(min_value=0, max_value=10**8),
    loss=st.integers(min_value=0, max_value=10**8),
    next_cost=st.integers(min_value=0, max_value=10**8),
)
def test_the_limit_refuses_exactly_when_one_more_loss_would_pass_it(
    limit: int, loss: int, next_cost: int
) -> None:
    """0 is no limit; otherwise a new attempt is refused iff loss + its cost > limit."""
    limits = FailoverLimits(max_estimated_platform_loss_micros=limit)
    expected = limit > 0 and loss + next_cost > limit
    assert platform_loss_exceeded(limits, loss, next_cost) is expected


def _input(loss: int, next_cost: int) -> FailoverInput:
    return FailoverInput(
        error=make_error(ErrorClass.INTERNAL_PERMANENT, "GEN", "failed"),
        stage=FailureStage.EXECUTION,
        routing_mode=RoutingMode.AUTO,
        attempts_so_far=1,
        provider_switches_so_far=0,
        same_candidate_retries=0,
        now=NOW,
        platform_loss_micros=loss,
        next_attempt_cost_micros=next_cost,
    )


def test_decide_fails_the_task_instead_of_failing_over_past_the_limit() -> None:
    """A failover that could exceed the loss limit becomes FAIL_TASK with its reason."""
    limits = FailoverLimits(max_estimated_platform_loss_micros=1_000)
    over = decide(_input(600, 500), limits, unit_random=0.5)
    assert (over.action, over.reason) == (FailoverAction.FAIL_TASK, MAX_ESTIMATED_PLATFORM_LOSS)
    within = decide(_input(500, 500), limits, unit_random=0.5)
    assert within.action is FailoverAction.FAIL_OVER
