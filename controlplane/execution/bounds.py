"""Bounds on giving a task another attempt (9.16.4), shared by every requeue path.

`requeue_refusal` is asked by `controlplane.execution.outcomes.requeue` before a task goes back
to the scheduler: past the task deadline, or when a new attempt could push the task's estimated
platform loss (`controlplane.domain.failover.estimated_platform_loss`) past
``max_estimated_platform_loss_micros``, the answer is a (code, detail) refusal and the task
fails instead.
"""

from __future__ import annotations

from dataclasses import replace

from controlplane.domain.deadlines import TASK_DEADLINE_EXCEEDED
from controlplane.domain.failover import (
    MAX_ESTIMATED_PLATFORM_LOSS,
    AttemptCost,
    FailoverLimits,
    estimated_platform_loss,
    platform_loss_exceeded,
)
from controlplane.domain.states import ATTEMPT_MACHINE, AttemptState
from controlplane.persistence.ports import UnitOfWork
from controlplane.persistence.records import AttemptRecord, TaskRecord

__all__ = ["as_failed", "loss_after", "platform_loss", "requeue_refusal"]


def as_failed(attempt: AttemptRecord) -> AttemptRecord:
    """`attempt` as it is once ended: a live attempt counts as FAILED."""
    if ATTEMPT_MACHINE.is_terminal(attempt.state):
        return attempt
    return replace(attempt, state=AttemptState.FAILED)


async def platform_loss(u: UnitOfWork, attempts: list[AttemptRecord]) -> int:
    """The task's estimated platform loss over `attempts` (`estimated_platform_loss`)."""
    costs = [
        AttemptCost(
            state=a.state,
            estimated_cost_micros=a.estimated_cost_micros,
            actual_cost_micros=a.actual_cost_micros,
            had_job=await u.job_of(a.id) is not None,
        )
        for a in attempts
    ]
    return estimated_platform_loss(costs)


async def loss_after(u: UnitOfWork, attempt: AttemptRecord, attempts: list[AttemptRecord]) -> int:
    """The task's estimated platform loss once `attempt` ended (`attempts`: all of the task's)."""
    # `attempts` may predate the ended attempt's last move; `attempt` is its final row.
    others = [a for a in attempts if a.id != attempt.id]
    return await platform_loss(u, [*others, as_failed(attempt)])


async def requeue_refusal(
    u: UnitOfWork,
    task: TaskRecord,
    attempt: AttemptRecord,
    attempts: list[AttemptRecord],
    limits: FailoverLimits,
    *,
    loss: int | None = None,
) -> tuple[str, str] | None:
    """(code, detail) when the task must not get a new attempt, else None; `loss` is
    `loss_after` when the caller already has it."""
    if task.deadline_at is not None and u.now >= task.deadline_at:
        return TASK_DEADLINE_EXCEEDED, f"task deadline {task.deadline_at.isoformat()} passed"
    if loss is None:
        loss = await loss_after(u, attempt, attempts)
    if platform_loss_exceeded(limits, loss, attempt.estimated_cost_micros):
        limit = limits.max_estimated_platform_loss_micros
        return MAX_ESTIMATED_PLATFORM_LOSS, (
            f"estimated platform loss {loss} micros plus a new attempt's "
            f"{attempt.estimated_cost_micros} would exceed {limit}"
        )
    return None
