"""The execution engine's hooks that feed the control plane's metrics (design 9.24).

`submit_observer` and `attempt_end_observer` turn the engine's submit and attempt-end events
into `ControlPlaneMetrics` calls; `chain` runs several observers of one hook in turn (the
breakers first, then metrics).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from controlplane.execution.outcomes import AttemptEndObserver, SubmitObserver
from controlplane.persistence.records import AccountInfo, AttemptRecord
from vidroute_core.adapter import JobSnapshot, JobState, SubmitOutcome

if TYPE_CHECKING:
    from controlplane.metrics import ControlPlaneMetrics

__all__ = ["attempt_end_observer", "chain", "submit_observer"]


def submit_observer(metrics: ControlPlaneMetrics) -> SubmitObserver:
    """The execution engine's submit hook -> provider_submit_total and its latency."""

    async def observe(
        account: AccountInfo, attempt: AttemptRecord, result: SubmitOutcome, took_s: float
    ) -> None:
        error = "" if result.error is None else result.error.error_class.value
        metrics.submit(account.provider, attempt.provider_model, result.kind.value, error, took_s)

    return observe


def attempt_end_observer(metrics: ControlPlaneMetrics) -> AttemptEndObserver:
    """Finished provider jobs -> generation latency, success ratio, cost per success."""

    async def observe(account: AccountInfo, attempt: AttemptRecord, snapshot: JobSnapshot) -> None:
        started = attempt.request_started_at or attempt.created_at
        metrics.generation(
            account.provider,
            attempt.provider_model,
            succeeded=snapshot.state is JobState.SUCCEEDED,
            seconds=(attempt.updated_at - started).total_seconds(),
            cost_micros=snapshot.actual_cost_micros or 0,
        )

    return observe


def chain(*observers: Callable[..., Awaitable[None]]) -> Callable[..., Awaitable[None]]:
    """One observer that calls each of `observers` in turn (e.g. breakers, then metrics)."""

    async def observe(*args: Any) -> None:
        for observer in observers:
            await observer(*args)

    return observe
