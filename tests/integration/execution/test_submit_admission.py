"""Every submit asks its SUBMIT breaker right before it leaves (9.15.2, 9.15.3), and a lease lost
before the send is replaced, not turned into a failed attempt (9.11.1).

The first send of an attempt, its retries on the same candidate, recovery's same-key re-send and
a probe all take the breaker's admission under the attempt's client request key: OPEN sends
nothing, HALF_OPEN sends at most the configured probes across replicas. A refused send is parked
(the attempt stays READY_TO_SUBMIT, its message due again when the cooldown ends), never failed.
"""

from __future__ import annotations

from typing import Any

from controlplane.domain.breaker import BreakerConfig, BreakerKey, BreakerRegistry, BreakerState
from controlplane.domain.outbox import Topic
from controlplane.domain.states import AttemptState, TaskState
from controlplane.execution.breakers import submit_key_of
from controlplane.execution.config import ExecutionConfig
from controlplane.execution.engine import ExecutionEngine
from controlplane.execution.outcomes import SubmitObserver
from controlplane.leases.base import Dimension, LeaseRequest
from controlplane.leases.memory_store import MemoryLeaseStore
from controlplane.persistence.records import AccountInfo, AttemptRecord
from controlplane.scheduling.health import HealthMonitor
from controlplane.scheduling.shared_state import InProcessSharedState
from tests.integration.execution.exec_harness import CAPACITY, Harness, lite
from vidroute_core.adapter import SubmitKind, SubmitOutcome
from vidroute_core.errors import ErrorClass, make_error

__all__ = ["lite"]

COOLDOWNS = (60.0, 120.0)
OVERLOADED = SubmitOutcome(
    SubmitKind.REJECTED, error=make_error(ErrorClass.PROVIDER_OVERLOADED, "503", "overloaded")
)


def monitor_on(h: Harness, shared: InProcessSharedState | None = None) -> HealthMonitor:
    """A health monitor on the harness's clock: two failures open, one probe at a time."""

    def clock() -> float:
        return h.clock.now.timestamp()

    config = BreakerConfig(
        consecutive_failures=2,
        cooldowns_s=COOLDOWNS,
        half_open_max_probes=1,
        half_open_successes_to_close=1,
    )
    return HealthMonitor(BreakerRegistry(config, clock), shared=shared, clock=clock)


def breaker_feed(monitor: HealthMonitor) -> SubmitObserver:
    """Submit outcomes to the SUBMIT breaker under the attempt's key, as the bootstrap wires it."""

    async def observe(
        account: AccountInfo, attempt: AttemptRecord, result: SubmitOutcome, took_s: float
    ) -> None:
        failure = None if result.error is None else result.error.error_class.value
        if result.kind is SubmitKind.ACCEPTED:
            failure = None
        await monitor.record_outcome(
            submit_key_of(account, attempt), failure, took_s, holder=attempt.client_request_key
        )

    return observe


async def harness_lease(attempt: AttemptRecord) -> LeaseRequest | None:
    """The lease the harness's 'dispatcher' takes for an attempt (`Harness.new_attempt`)."""
    return LeaseRequest(
        attempt.client_request_key,
        f"{attempt.compile_plan.get('provider', 'runway')}-{attempt.provider_account_id}",
        (Dimension("all", CAPACITY),),
        ttl_ms=3_600_000,
        max_term_ms=7_200_000,
    )


def engine_of(
    h: Harness, monitor: HealthMonitor | None = None, *, relet: bool = True, **config: Any
) -> ExecutionEngine:
    """An engine over the harness's database, fake adapter, clock and leases, its submits fed
    to and admitted by `monitor`, lost leases replaced through the harness's lease source."""
    engine = ExecutionEngine(
        h.db,
        {"runway": h.fake, "self_hosted": h.fake},
        config=ExecutionConfig(worker_id=f"w{len(h.engines)}", submitting_grace_s=60.0, **config),
        leases=h.leases,
        fetch=h.fetch,
        clock=h.clock,
        on_submit=None if monitor is None else breaker_feed(monitor),
        breakers=monitor,
        lease_source=harness_lease if relet else None,
    )
    h.engines.append(engine)
    return engine


async def key_of(h: Harness, attempt: AttemptRecord) -> BreakerKey:
    return submit_key_of(await h.reads.account(attempt.provider_account_id), attempt)


async def states(h: Harness, *attempts: AttemptRecord) -> list[AttemptState]:
    return [(await h.attempt(a.id)).state for a in attempts]


async def test_retries_behind_a_reopened_breaker_are_parked_and_one_probe_per_cooldown(
    lite: Harness,
) -> None:
    """Retries on the same candidate wait parked while the breaker is OPEN; each cooldown ends
    with exactly one probe send, whose failure reopens the breaker and parks the rest again."""
    first = await lite.task_with_attempt()
    second = await lite.task_with_attempt(account_id=first.provider_account_id)
    lite.fake.script_submit(*[OVERLOADED] * 10)
    monitor = monitor_on(lite)
    engine = engine_of(lite, monitor)
    key = await key_of(lite, first)

    await engine.run_until_idle()
    assert monitor.registry.get(key).state is BreakerState.OPEN
    assert len(lite.fake.submit_calls) == 2

    lite.clock.advance(30)  # the retries are due, the breaker still cools down
    await engine.run_until_idle()
    assert len(lite.fake.submit_calls) == 2
    assert await states(lite, first, second) == [AttemptState.READY_TO_SUBMIT] * 2
    assert engine.submitter.parked >= 2

    lite.clock.advance(COOLDOWNS[0] - 30 + 1)  # past the first cooldown: HALF_OPEN
    await engine.run_until_idle()
    assert len(lite.fake.submit_calls) == 3  # one probe, failed: OPEN for the next cooldown
    assert monitor.registry.get(key).state is BreakerState.OPEN

    lite.clock.advance(COOLDOWNS[1] - 10)
    await engine.run_until_idle()
    assert len(lite.fake.submit_calls) == 3
    lite.clock.advance(11)
    await engine.run_until_idle()
    assert len(lite.fake.submit_calls) == 4
    assert await states(lite, first, second) == [AttemptState.READY_TO_SUBMIT] * 2
    for attempt in (first, second):
        assert (await lite.detail(attempt.task_id)).task.state is not TaskState.FAILED


async def test_attempts_queued_when_the_breaker_opens_are_not_sent_into_it(lite: Harness) -> None:
    """Attempts dispatched before the breaker opened, still waiting for a submit worker, are
    parked once it is OPEN: not sent, not failed, their leases kept."""
    attempts = [await lite.task_with_attempt()]
    for _ in range(2):
        attempts.append(await lite.task_with_attempt(account_id=attempts[0].provider_account_id))
    lite.fake.script_submit(OVERLOADED, OVERLOADED)
    monitor = monitor_on(lite)
    engine = engine_of(lite, monitor, concurrency=1)

    await engine.run_until_idle()
    assert monitor.registry.get(await key_of(lite, attempts[0])).state is BreakerState.OPEN
    sent = {c.client_request_key for c in lite.fake.submit_calls}
    assert len(lite.fake.submit_calls) == 2
    [waiting] = [a for a in attempts if a.client_request_key not in sent]
    assert (await lite.attempt(waiting.id)).state is AttemptState.READY_TO_SUBMIT
    assert await lite.used(waiting.provider_account_id) == (3, 0)

    lite.clock.advance(COOLDOWNS[0] + 1)  # HALF_OPEN: the probe succeeds and closes it
    await engine.run_until_idle()
    assert (await lite.attempt(waiting.id)).state is AttemptState.ACCEPTED


async def test_half_open_sends_one_probe_across_two_replicas(lite: Harness) -> None:
    """Two replicas sharing the breaker state send one probe between them when the breaker of
    one of them opened, even though the other's own breaker never saw a failure."""
    shared = InProcessSharedState()
    mine, theirs = monitor_on(lite, shared), monitor_on(lite, shared)
    first = await lite.task_with_attempt()
    account = first.provider_account_id
    lite.fake.script_submit(OVERLOADED, OVERLOADED, *[OVERLOADED] * 4)
    tripping = engine_of(lite, mine, concurrency=1)
    await tripping.run_until_idle()
    await lite.task_with_attempt(account_id=account)
    await tripping.run_until_idle()
    key = await key_of(lite, first)
    assert mine.registry.get(key).state is BreakerState.OPEN
    assert theirs.registry.get(key).state is BreakerState.CLOSED
    assert len(lite.fake.submit_calls) == 2

    for _ in range(3):
        await lite.task_with_attempt(account_id=account)
    other = engine_of(lite, theirs)
    await other.run_until_idle()
    assert len(lite.fake.submit_calls) == 2  # OPEN for the other replica too

    lite.clock.advance(COOLDOWNS[0] + 1)
    await other.run_until_idle()
    await tripping.run_until_idle()
    assert len(lite.fake.submit_calls) == 3


async def test_recovery_resends_only_when_the_breaker_admits(lite: Harness) -> None:
    """Recovery's same-key re-send is a submit: while the breaker is OPEN recovery looks the
    job up instead and sends nothing."""
    attempt = await lite.task_with_attempt(provider="self_hosted")
    lite.fake.script_submit(
        SubmitOutcome(
            SubmitKind.UNKNOWN,
            error=make_error(ErrorClass.SUBMISSION_UNKNOWN, "TIMEOUT", "no answer"),
        )
    )
    monitor = monitor_on(lite)
    engine = engine_of(lite, monitor)
    await engine.run_until_idle()
    assert (await lite.attempt(attempt.id)).state is AttemptState.SUBMIT_UNKNOWN
    await monitor.force(await key_of(lite, attempt), BreakerState.OPEN, "test")

    lite.clock.advance(600)  # recovery is due
    await engine.run_until_idle()
    assert len(lite.fake.submit_calls) == 1
    assert len(lite.fake.recover_calls) >= 1
    assert engine.recovery.resubmits == 0


async def test_a_lease_lost_before_the_send_is_replaced_not_a_failed_attempt(
    harness: Harness,
) -> None:
    """An attempt whose lease the store lost is sent under a new lease, recorded on the attempt:
    one attempt, nothing failed, nothing requeued, one slot counted."""
    attempt = await harness.task_with_attempt()
    assert isinstance(harness.leases, MemoryLeaseStore)
    harness.leases.forget_everything()
    engine = engine_of(harness)
    await engine.run_until_idle()
    detail = await harness.detail(attempt.task_id)
    assert [a.state for a in detail.attempts] == [AttemptState.ACCEPTED]
    assert [c.client_request_key for c in harness.fake.submit_calls] == [attempt.client_request_key]
    assert await harness.messages(Topic.REQUEUE) == []
    [lease] = (await harness.leases.snapshot(f"runway-{attempt.provider_account_id}")).leases
    sent = detail.attempts[0]
    assert (sent.lease_token, sent.fencing_token) == (lease.token, lease.fencing_token)
    assert sent.lease_token != attempt.lease_token
    assert await harness.used(attempt.provider_account_id) == (1, 0)


async def test_a_lost_lease_without_capacity_waits_unsent_until_a_slot_frees(
    lite: Harness,
) -> None:
    """With the account full when its lease is gone, the attempt waits READY_TO_SUBMIT (parked,
    not failed) and is sent once a slot is free again."""
    attempt = await lite.task_with_attempt()
    account = f"runway-{attempt.provider_account_id}"
    assert isinstance(lite.leases, MemoryLeaseStore)
    lite.leases.forget_everything()
    fillers = []
    for n in range(CAPACITY):
        filler = await lite.leases.acquire(
            LeaseRequest(f"other-{n}", account, (Dimension("all", CAPACITY),), ttl_ms=3_600_000)
        )
        assert filler is not None
        fillers.append(filler)
    engine = engine_of(lite)
    await engine.run_until_idle()
    assert lite.fake.submit_calls == []
    assert (await lite.attempt(attempt.id)).state is AttemptState.READY_TO_SUBMIT
    assert engine.submitter.parked == 1

    await lite.leases.release(fillers[0])
    lite.clock.advance(ExecutionConfig().lease_wait_retry_s)
    await engine.run_until_idle()
    detail = await lite.detail(attempt.task_id)
    assert [a.state for a in detail.attempts] == [AttemptState.ACCEPTED]
    assert len(lite.fake.submit_calls) == 1


async def test_a_waiting_attempt_keeps_its_lease_past_the_lease_ttl(harness: Harness) -> None:
    """`WaitingLeases` renews a READY_TO_SUBMIT attempt's lease while it waits, so after longer
    than one lease TTL it is sent under the lease it was dispatched with."""
    attempt = await harness.task_with_attempt()
    [before] = (await harness.leases.snapshot(f"runway-{attempt.provider_account_id}")).leases
    engine = engine_of(harness, waiting_lease_renew_s=600.0)
    ttl_s = before.ttl_ms / 1000
    waited = 0.0
    while waited <= ttl_s:  # the backlog: nothing but the renewal runs meanwhile
        assert await engine.waiting.run_once() == 1
        harness.clock.advance(ttl_s / 2)
        waited += ttl_s / 2
    assert waited > ttl_s
    await engine.run_until_idle()
    assert (await harness.attempt(attempt.id)).state is AttemptState.ACCEPTED
    assert engine.deps.leases.relet == 0  # never lost: no new lease was needed
    [after] = (await harness.leases.snapshot(f"runway-{attempt.provider_account_id}")).leases
    assert (after.token, after.fencing_token) == (before.token, before.fencing_token)
    assert after.expires_at_ms > harness.clock.ms()
