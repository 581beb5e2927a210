"""The poller learns each candidate's p95 and max plausible job duration from the scheduler's
health windows (design 9.18.2 "接近供应商 P95：缩短到 10s"), through the real poller and
database."""

from __future__ import annotations

from controlplane.domain.breaker import BreakerConfig, BreakerKey, BreakerRegistry, Operation
from controlplane.persistence.records import AttemptRecord
from controlplane.scheduling.health import HealthMonitor
from tests.integration.execution.exec_harness import Harness
from tests.integration.execution.test_cancel_poll_output import snap
from vidroute_core.adapter import JobState


async def gap_s(harness: Harness, attempt: AttemptRecord) -> float:
    """Seconds between the attempt's last poll and its next one."""
    runtime = await harness.reads.runtime(attempt.id)
    assert runtime is not None
    assert runtime.next_poll_at is not None
    assert runtime.last_polled_at is not None
    return (runtime.next_poll_at - runtime.last_polled_at).total_seconds()


async def test_the_learned_p95_puts_a_running_job_in_the_near_p95_phase(lite: Harness) -> None:
    """Thirty finished jobs of about 100 s on one account: once its running job is past 80 %
    of that p95 it is polled every 10 s (plus jitter); the same job on an account with no
    history waits the running phase's 30 s step. Neither is stuck (the max plausible is the
    configured floor, past 3x the learned p99)."""
    learned = await lite.task_with_attempt()
    unknown = await lite.task_with_attempt()
    for n in range(2):
        lite.fake.script_submit(lite.fake.accepted(f"job-{n}"))
        lite.fake.set_job(f"job-{n}", snap(JobState.RUNNING))
    account = await lite.reads.account(learned.provider_account_id)

    def clock() -> float:
        return lite.clock.now.timestamp()

    monitor = HealthMonitor(BreakerRegistry(BreakerConfig(), clock), clock=clock)
    key = BreakerKey(
        account.provider, account.account_name, account.region, "gen4.5", Operation.SUBMIT
    )
    for _ in range(30):
        monitor.observe_generation(key, succeeded=True, duration_s=100.0)
    engine = lite.engine()
    engine.deps.durations = monitor
    policy = engine.config.polling
    await engine.run_until_idle()
    for _ in range(26):  # 130 s in 5 s steps: every due poll is made, one past 80 s at least
        lite.clock.advance(5)
        await engine.run_until_idle()
    near = policy.near_p95_cap_s * (1 + policy.jitter_max) * policy.scale
    assert await gap_s(lite, learned) <= near
    slow_step = policy.running[-1] * (1 + policy.jitter_min) * policy.scale
    assert await gap_s(lite, unknown) >= slow_step
    for attempt in (learned, unknown):
        runtime = await lite.reads.runtime(attempt.id)
        assert runtime is not None
        assert runtime.stuck_since is None
