"""The POLL, CANCEL, DOWNLOAD_OUTPUT and USAGE_QUERY breakers (9.15) are fed by their workers'
calls and consulted before each: a refused call is not made and is tried again later."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from controlplane.domain.breaker import BreakerConfig, BreakerKey, BreakerRegistry, BreakerState
from controlplane.domain.breaker import Operation as Op
from controlplane.domain.states import AttemptState, TaskState
from controlplane.execution.breakers import OperationGate
from controlplane.execution.engine import ExecutionEngine
from controlplane.persistence.records import AttemptRecord
from controlplane.scheduling.health import HealthMonitor
from tests.integration.execution.exec_harness import Harness
from tests.integration.execution.test_cancel_poll_output import done, snap
from tests.integration.execution.test_recovery_flow import _unknown
from vidroute_core.adapter import CancelResult, JobState, PollResult, UsageRecord
from vidroute_core.errors import ErrorClass, make_error

RETRY_S = 30.0
OVERLOADED = make_error(ErrorClass.PROVIDER_OVERLOADED, "503", "overloaded")


def guarded(
    harness: Harness, successes_to_close: int = 1, **overrides: Any
) -> tuple[ExecutionEngine, HealthMonitor]:
    """An engine whose workers go through breakers on the harness's clock."""

    def clock() -> float:
        return harness.clock.now.timestamp()

    config = BreakerConfig(
        consecutive_failures=2,
        cooldowns_s=(60.0, 120.0),
        half_open_successes_to_close=successes_to_close,
    )
    monitor = HealthMonitor(BreakerRegistry(config, clock), clock=clock)
    engine = harness.engine(breaker_retry_s=RETRY_S, **overrides)
    engine.deps.gate = OperationGate(monitor)
    return engine, monitor


async def key_of(harness: Harness, attempt: AttemptRecord, op: Op) -> BreakerKey:
    account = await harness.reads.account(attempt.provider_account_id)
    return BreakerKey(account.provider, account.account_name, account.region, "gen4.5", op)


async def test_failing_polls_open_the_poll_breaker_which_then_delays_polls(lite: Harness) -> None:
    """Two overloaded polls open the POLL breaker; while it is open no get_job is made and the
    job is due again after breaker_retry_s; after the cooldown one probe poll succeeds, closes
    it and the job completes."""
    attempt = await lite.task_with_attempt()
    lite.fake.script_submit(lite.fake.accepted("job-b"))
    failing = PollResult(None, OVERLOADED)
    lite.fake.set_job("job-b", failing, failing, snap(JobState.RUNNING), done())
    engine, monitor = guarded(lite)
    key = await key_of(lite, attempt, Op.POLL)
    await engine.run_until_idle()
    while len(lite.fake.get_job_calls) < 2:
        lite.clock.advance(30)
        await engine.run_until_idle()
    assert monitor.registry.get(key).state is BreakerState.OPEN
    polled = len(lite.fake.get_job_calls)
    lite.clock.advance(40)  # due again by the poll schedule, still inside the 60 s cooldown
    await engine.run_until_idle()
    assert len(lite.fake.get_job_calls) == polled
    assert engine.poller.refused >= 1
    runtime = await lite.reads.runtime(attempt.id)
    assert runtime is not None
    assert runtime.next_poll_at is not None
    assert runtime.next_poll_at == lite.clock.now + timedelta(seconds=RETRY_S)
    for _ in range(8):
        lite.clock.advance(RETRY_S)
        await engine.run_until_idle()
    assert monitor.registry.get(key).state is BreakerState.CLOSED
    assert (await lite.detail(attempt.task_id)).task.state is TaskState.SUCCEEDED


async def test_an_open_cancel_breaker_defers_the_cancel_call(lite: Harness) -> None:
    """With CANCEL open, the cancel message is kept for later and cancel_job is not called;
    once the breaker closes the same message reaches the provider."""
    attempt = await lite.task_with_attempt()
    lite.fake.script_submit(lite.fake.accepted("job-c"))
    lite.fake.set_job("job-c", snap(JobState.RUNNING), snap(JobState.CANCELLED))
    lite.fake.script_cancel(CancelResult(acknowledged=True))
    engine, monitor = guarded(lite)
    await engine.run_until_idle()
    lite.clock.advance(5)
    await engine.run_until_idle()
    key = await key_of(lite, attempt, Op.CANCEL)
    await monitor.force(key, BreakerState.OPEN, "provider cancel endpoint down")
    await engine.cancel_service.cancel(attempt.task_id)
    await engine.canceller.run_once()
    assert lite.fake.cancel_calls == []
    assert (await lite.attempt(attempt.id)).state is AttemptState.CANCEL_REQUESTED
    await monitor.force(key, BreakerState.CLOSED, "recovered")
    lite.clock.advance(RETRY_S + 1)
    await engine.canceller.run_once()
    assert [j.provider_job_id for j in lite.fake.cancel_calls] == ["job-c"]


async def test_an_open_download_breaker_defers_the_output_fetch(lite: Harness) -> None:
    """With DOWNLOAD_OUTPUT open the output is not fetched and no fetch attempt is spent; after
    the breaker closes it is delivered."""
    attempt = await lite.task_with_attempt()
    lite.fake.script_submit(lite.fake.accepted("job-d"))
    lite.fake.set_job("job-d", done())
    engine, monitor = guarded(lite)
    key = await key_of(lite, attempt, Op.DOWNLOAD_OUTPUT)
    await monitor.force(key, BreakerState.OPEN, "cdn down")
    await engine.run_until_idle()
    for _ in range(2):
        lite.clock.advance(5)
        await engine.run_until_idle()
    assert lite.fetch.calls == []
    assert (await lite.detail(attempt.task_id)).task.state is TaskState.OUTPUT_FETCHING
    runtime = await lite.reads.runtime(attempt.id)
    assert runtime is None or runtime.fetch_attempts == 0
    await monitor.force(key, BreakerState.CLOSED, "cdn back")
    lite.clock.advance(RETRY_S + 1)
    await engine.run_until_idle()
    assert len(lite.fetch.calls) == 1
    assert (await lite.detail(attempt.task_id)).task.state is TaskState.SUCCEEDED


async def test_an_open_usage_breaker_leaves_the_usage_step_inconclusive(lite: Harness) -> None:
    """With USAGE_QUERY open recovery makes no usage call and adopts nothing; once it closes the
    usage record naming this attempt is found."""
    attempt = await lite.task_with_attempt()
    lite.fake.script_submit(_unknown())
    lite.fake.usage.append(
        UsageRecord(
            "job-usage",
            "gen4.5",
            lite.clock.now,
            1000,
            "s",
            250_000,
            "USD",
            "{}",
            client_request_key=attempt.client_request_key,
        )
    )
    engine, monitor = guarded(lite, usage_lookup_after_queries=1)
    key = await key_of(lite, attempt, Op.USAGE_QUERY)
    await monitor.force(key, BreakerState.OPEN, "usage api down")
    await engine.run_until_idle()
    lite.clock.advance(10)
    await engine.run_until_idle()
    assert lite.fake.usage_calls == []
    assert (await lite.detail(attempt.task_id)).provider_jobs == ()
    await monitor.force(key, BreakerState.CLOSED, "usage api back")
    for _ in range(4):
        lite.clock.advance(130)
        await engine.run_until_idle()
        if (await lite.detail(attempt.task_id)).provider_jobs:
            break
    detail = await lite.detail(attempt.task_id)
    assert [j.provider_job_id for j in detail.provider_jobs] == ["job-usage"]


async def test_an_attempt_cancelled_before_submit_frees_its_probe_slot(lite: Harness) -> None:
    """A HALF_OPEN probe slot taken for an attempt that is cancelled before its submit is given
    back at once, so the next probe need not wait for the slot's TTL."""
    attempt = await lite.task_with_attempt()
    engine, monitor = guarded(lite)
    key = await key_of(lite, attempt, Op.SUBMIT)
    await monitor.force(key, BreakerState.OPEN, "incident")
    await monitor.force(key, None, "probing")  # released into HALF_OPEN
    assert await monitor.admit(key, attempt.client_request_key)  # as the dispatcher did
    assert not await monitor.admit(key, "next-task")
    await engine.cancel_service.cancel(attempt.task_id)
    assert lite.fake.submit_calls == []
    assert await monitor.admit(key, "next-task")
