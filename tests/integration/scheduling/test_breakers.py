"""Breakers fed by execution outcomes, forced by operators, shared by replicas, all audited."""

from __future__ import annotations

import asyncio
import secrets
import socket
import time

import pytest
import redis.asyncio as aioredis

from controlplane.api import provider_views
from controlplane.domain.breaker import BreakerConfig, BreakerKey, BreakerRegistry, BreakerState
from controlplane.domain.breaker import Operation as Op
from controlplane.domain.scoring import Window
from controlplane.domain.states import TaskState
from controlplane.leases.memory_store import MemoryLeaseStore
from controlplane.persistence.catalog import CatalogQueries
from controlplane.persistence.database import Database
from controlplane.persistence.tasks import TaskQueries
from controlplane.scheduling.health import HealthMonitor
from controlplane.scheduling.shared_state import InProcessSharedState, RedisSharedState
from controlplane.service.providers import ForceBreakerInput, ProviderAdminService
from tests.integration.scheduling.conftest import DispatcherFactory
from tests.integration.scheduling.support import dispatch_one, make_spec, strict
from tests.integration.scheduling.test_dispatcher import new_task
from vidroute_core.exceptions import InvalidSpec
from vidroute_core.spec import RoutingMode

GEN45 = BreakerKey("runway", "prod-us", "us", "gen4.5", Op.SUBMIT)


def force(state: BreakerState | None, reason: str = "incident 42") -> ForceBreakerInput:
    return ForceBreakerInput("runway", "prod-us", "us", "gen4.5", "SUBMIT", state, reason)


async def test_force_breaker_is_recorded_and_blocks_routing(
    db: Database,
    catalogs: CatalogQueries,
    monitor: HealthMonitor,
    make_dispatcher: DispatcherFactory,
) -> None:
    """ForceBreaker OPEN is persisted, shown as forced, and makes the candidate CIRCUIT_OPEN."""
    dispatcher = make_dispatcher()
    await dispatcher.catalog()
    admin = ProviderAdminService(catalogs, monitor)
    status = await admin.force_breaker(force(BreakerState.OPEN))
    assert status.state is BreakerState.OPEN
    assert status.forced
    (event,) = await catalogs.health_events()
    assert (event.operation, event.old_state, event.new_state) == ("SUBMIT", "CLOSED", "OPEN")
    assert event.reason == "forced:incident 42"
    assert event.model == "gen4.5"
    task = await new_task(db, make_spec())
    result = await dispatch_one(dispatcher, task)
    assert result.decision is not None
    assert result.decision.verdict("runway/gen4.5/prod-us").reason == "CIRCUIT_OPEN"
    released = await admin.force_breaker(force(None, "fixed"))
    assert released.state is BreakerState.HALF_OPEN
    assert not released.forced
    assert next(e.reason for e in await catalogs.health_events()) == "forced:released:fixed"
    (gen45,) = [s for s in await admin.provider_health("runway") if s.key == GEN45]
    assert provider_views.breaker(gen45).state == provider_views.breaker_state(
        BreakerState.HALF_OPEN
    )


async def test_force_breaker_validates_its_input(
    db: Database, catalogs: CatalogQueries, monitor: HealthMonitor
) -> None:
    """A missing reason or an unknown operation is rejected before anything changes."""
    admin = ProviderAdminService(catalogs, monitor)
    with pytest.raises(InvalidSpec):
        await admin.force_breaker(force(BreakerState.OPEN, reason=" "))
    assert await catalogs.health_events() == []


async def test_outcomes_trip_the_breaker_and_replicas_adopt_it(
    db: Database, catalogs: CatalogQueries, make_dispatcher: DispatcherFactory
) -> None:
    """Consecutive retryable failures open the breaker, persist it, and a peer replica follows."""
    await make_dispatcher().catalog()
    shared = InProcessSharedState()
    config = BreakerConfig(consecutive_failures=3)
    mine = HealthMonitor(BreakerRegistry(config, time.time), db=db, shared=shared)
    peer = HealthMonitor(BreakerRegistry(config, time.time), db=db, shared=shared)
    for _ in range(3):
        await mine.record_outcome(GEN45, "PROVIDER_OVERLOADED", 1.5)
    await mine.record_outcome(GEN45, "INVALID_INPUT", 0.1)  # not endpoint evidence
    assert mine.open_reason(GEN45) is not None
    events = await catalogs.health_events()
    assert [(e.new_state, e.reason) for e in events] == [("OPEN", "consecutive_failures")]
    await peer.sync()
    assert peer.open_reason(GEN45) is not None
    assert len(await catalogs.health_events()) == 1  # mirrors are not re-audited
    health = mine.health_view("runway/gen4.5/prod-us")
    assert health is not None
    assert health.success_lower_bound == 0.0


@pytest.mark.redis
async def test_redis_shared_state_carries_forced_overrides(
    db: Database,
    catalogs: CatalogQueries,
    redis_server_url: str,
    make_dispatcher: DispatcherFactory,
) -> None:
    """An override forced on one replica pins the same breaker on another through Redis."""
    await make_dispatcher().catalog()
    client = aioredis.Redis.from_url(redis_server_url)
    prefix = f"test-{secrets.token_hex(4)}"
    try:
        replicas = [
            HealthMonitor(
                BreakerRegistry(BreakerConfig(), time.time),
                db=db,
                shared=RedisSharedState(client, prefix),
            )
            for _ in range(2)
        ]
        await replicas[0].force(GEN45, BreakerState.OPEN, "maintenance")
        await replicas[1].sync()
        (status,) = replicas[1].statuses("runway")
        assert status.state is BreakerState.OPEN
        assert status.forced
    finally:
        keys = [k async for k in client.scan_iter(f"{prefix}:*")]
        if keys:
            await client.delete(*keys)
        await client.aclose()


async def test_generation_outcomes_feed_the_health_windows() -> None:
    """Finished jobs set the candidate's success bound and mean latency; refused submits count
    as failures without a latency."""
    monitor = HealthMonitor(BreakerRegistry(BreakerConfig(), time.time))
    candidate = "runway/gen4.5/prod-us"
    assert monitor.health_view(candidate) is None
    for _ in range(8):
        monitor.observe_generation(GEN45, succeeded=True, duration_s=40.0)
    healthy = monitor.health_view(candidate)
    assert healthy is not None
    assert healthy.mean_latency_s == pytest.approx(40.0)
    assert healthy.p95_latency_s == pytest.approx(40.0, rel=0.08)  # half a bucket
    for _ in range(8):
        await monitor.record_outcome(GEN45, "PROVIDER_OVERLOADED", 0.2)
    degraded = monitor.health_view(candidate)
    assert degraded is not None
    assert degraded.success_lower_bound < healthy.success_lower_bound
    assert degraded.mean_latency_s == pytest.approx(40.0)


async def test_an_error_burst_lowers_a_candidates_success_within_the_minute() -> None:
    """Half an hour of finished jobs, then a burst of refused submits within 20 s: the health
    view the router reads drops to the 1-minute window's figure at once, where the 15-minute
    window alone would still give most of its trust."""
    clock = [time.time()]
    monitor = HealthMonitor(BreakerRegistry(BreakerConfig(), time.time), clock=lambda: clock[0])
    candidate = "runway/gen4.5/prod-us"
    for _ in range(60):
        monitor.observe_generation(GEN45, succeeded=True, duration_s=40.0)
        clock[0] += 30.0
    before = monitor.health_view(candidate)
    assert before is not None
    for _ in range(8):
        await monitor.record_outcome(GEN45, "PROVIDER_OVERLOADED", 0.2)
        clock[0] += 2.5
    after = monitor.health_view(candidate)
    assert after is not None
    fifteen = monitor.window_stats()[candidate][Window.FIFTEEN_MINUTES]
    assert fifteen.success_lower_bound > 0.5
    assert after.success_lower_bound < 0.3 < before.success_lower_bound


# ---- HALF_OPEN probes, account breakers (9.15.2, 9.15.1) ------------------------------------


class ManualClock:
    """Wall-clock seconds that a test moves by hand."""

    def __init__(self) -> None:
        self.now = time.time()

    def __call__(self) -> float:
        return self.now


GEN45_ID = "runway/gen4.5/prod-us"
PROBING = BreakerConfig(
    consecutive_failures=2,
    cooldowns_s=(30.0, 60.0, 120.0),
    half_open_max_probes=1,  # below the candidate's capacity (2): leases never hide the limit
    half_open_successes_to_close=2,
)


def probing_monitor(
    db: Database, clock: ManualClock, shared: object | None = None
) -> HealthMonitor:
    return HealthMonitor(
        BreakerRegistry(PROBING, clock),
        db=db,
        shared=shared or InProcessSharedState(),  # type: ignore[arg-type]  # a double of the shared breaker state
        clock=clock,
    )


async def strict_tasks(db: Database, n: int, prefix: str = "t") -> list[int]:
    tasks = [
        await new_task(db, make_spec(**strict("gen4.5")), key=f"{prefix}{i}") for i in range(n)
    ]
    return [t.id for t in tasks]


async def attempts_on(db: Database, task_ids: list[int], model: str = "gen4.5") -> list[str]:
    """Client request keys of the attempts on `model` among `task_ids`."""
    keys = []
    for task_id in task_ids:
        detail = await TaskQueries(db).get_task(task_id)
        assert detail is not None
        keys += [a.client_request_key for a in detail.attempts if a.provider_model == model]
    return keys


async def trip_to_half_open(monitor: HealthMonitor, clock: ManualClock) -> float:
    """Open GEN45 with failures, then let its cooldown pass; returns the cooldown served."""
    for _ in range(PROBING.consecutive_failures):
        await monitor.record_outcome(GEN45, "PROVIDER_OVERLOADED", 1.0)
    until = monitor.registry.get(GEN45).open_until
    assert until is not None
    cooldown = until - clock.now
    clock.now = until + 0.001
    await monitor.sync()
    assert monitor.registry.get(GEN45).state is BreakerState.HALF_OPEN
    return cooldown


async def test_half_open_admits_exactly_the_configured_probes(
    db: Database, catalogs: CatalogQueries, make_dispatcher: DispatcherFactory
) -> None:
    """Of 6 tasks that can only run on a HALF_OPEN candidate, exactly half_open_max_probes get
    an attempt; the rest stay QUEUED with the breaker as the reason."""
    clock = ManualClock()
    monitor = probing_monitor(db, clock)
    dispatcher = make_dispatcher(monitor=monitor)
    await dispatcher.catalog()
    await trip_to_half_open(monitor, clock)
    ids = await strict_tasks(db, 6)
    assert await dispatcher.tick() == 6
    assert len(await attempts_on(db, ids)) == PROBING.half_open_max_probes
    waiting = [d for i in ids if (d := await TaskQueries(db).get_task(i)) and not d.attempts]
    assert len(waiting) == 6 - PROBING.half_open_max_probes
    for detail in waiting:
        assert detail.task.state is TaskState.QUEUED
        snapshot = detail.route_decisions[-1].candidate_snapshot
        (gen45,) = [c for c in snapshot["candidates"] if c["id"] == GEN45_ID]
        assert gen45["reason"] == "CIRCUIT_OPEN"
        assert "probes in flight" in gen45["detail"]


async def test_tasks_the_probe_limit_turns_away_go_to_other_candidates(
    db: Database, catalogs: CatalogQueries, make_dispatcher: DispatcherFactory
) -> None:
    """With the top-ranked candidate HALF_OPEN, one of 6 tasks (PREFERRED, not pinned) probes it
    (its capacity would take 2) and the other 5 are placed on other candidates in the same
    round."""
    clock = ManualClock()
    monitor = probing_monitor(db, clock)
    dispatcher = make_dispatcher(monitor=monitor)
    await dispatcher.catalog()
    await trip_to_half_open(monitor, clock)
    # PREFERRED runway: gen4.5 is the cheaper of Runway's two models and ranks first, so all 6
    # ask for it first; turned away, they fall back to the others (Runway's veo3.1 first).
    spec = make_spec("tenant-b", mode=RoutingMode.PREFERRED, preferred_providers=("runway",))
    ids = [(await new_task(db, spec, key=f"auto{i}")).id for i in range(6)]
    assert await dispatcher.tick() == 6
    details = [d for i in ids if (d := await TaskQueries(db).get_task(i)) is not None]
    assert all(len(d.attempts) == 1 for d in details)
    on_gen45 = [d for d in details if d.attempts[0].provider_model == "gen4.5"]
    assert len(on_gen45) == PROBING.half_open_max_probes
    for detail in details:
        if detail not in on_gen45:
            snapshot = detail.route_decisions[-1].candidate_snapshot
            (gen45,) = [c for c in snapshot["candidates"] if c["id"] == GEN45_ID]
            assert gen45["reason"] == "CIRCUIT_OPEN"


async def test_probe_successes_close_and_a_probe_failure_reopens_longer(
    db: Database, catalogs: CatalogQueries, make_dispatcher: DispatcherFactory
) -> None:
    """A failed probe reopens with the next cooldown of the ladder; in the next phase only its
    own probes count, one at a time, until the required successes close the breaker."""
    clock = ManualClock()
    monitor = probing_monitor(db, clock)

    async def dispatch_round() -> list[str]:
        # Fresh capacity each round: the probes' leases would end with their attempts.
        await make_dispatcher(monitor=monitor, leases=MemoryLeaseStore()).tick()
        return await attempts_on(db, ids)

    first = await trip_to_half_open(monitor, clock)
    assert first == pytest.approx(PROBING.cooldowns_s[0])
    ids = await strict_tasks(db, 4)
    (probe,) = await dispatch_round()
    await monitor.record_outcome(GEN45, "PROVIDER_OVERLOADED", 1.0, holder=probe)
    breaker = monitor.registry.get(GEN45)
    assert breaker.state is BreakerState.OPEN
    assert breaker.open_until == pytest.approx(clock.now + PROBING.cooldowns_s[1])
    assert await dispatch_round() == [probe]  # OPEN: nothing new
    clock.now = (breaker.open_until or 0) + 0.001
    await monitor.sync()
    assert breaker.state is BreakerState.HALF_OPEN  # type: ignore[comparison-overlap]  # the call above changed it; mypy keeps the old narrowing
    _, second = await dispatch_round()
    await monitor.record_outcome(GEN45, None, 1.0, holder=probe)  # an old phase's probe
    await monitor.record_outcome(GEN45, None, 1.0, holder=second)
    assert breaker.state is BreakerState.HALF_OPEN  # 1 of 2 successes
    *_, third = await dispatch_round()
    assert third != second
    await monitor.record_outcome(GEN45, None, 1.0, holder=third)
    assert breaker.state is BreakerState.CLOSED
    assert len(await dispatch_round()) == 4  # closed: the last task goes too
    events = [(e.old_state, e.new_state, e.reason) for e in await catalogs.health_events()]
    assert ("HALF_OPEN", "OPEN", "probe_failed") in events
    assert ("HALF_OPEN", "CLOSED", "probes_succeeded") in events


@pytest.mark.redis
async def test_two_replicas_sharing_redis_admit_the_configured_probes_together(
    db: Database,
    catalogs: CatalogQueries,
    redis_server_url: str,
    make_dispatcher: DispatcherFactory,
) -> None:
    """Two dispatchers with their own breakers but one Redis admit half_open_max_probes in
    total, and probe successes reported on either replica add up to close it for both."""
    clock = ManualClock()
    client = aioredis.Redis.from_url(redis_server_url)
    peer = aioredis.Redis.from_url(redis_server_url)  # each replica has its own connections
    prefix = f"test-{secrets.token_hex(4)}"
    try:
        monitors = [probing_monitor(db, clock, RedisSharedState(c, prefix)) for c in (client, peer)]
        dispatchers = [make_dispatcher(monitor=m) for m in monitors]
        for d in dispatchers:
            await d.catalog()
        await trip_to_half_open(monitors[0], clock)
        await monitors[1].sync()
        assert monitors[1].registry.get(GEN45).state is BreakerState.HALF_OPEN
        ids = await strict_tasks(db, 8)

        async def both_replicas_dispatch() -> list[str]:
            queued = [
                d.task for i in ids if (d := await TaskQueries(db).get_task(i)) and not d.attempts
            ]
            await asyncio.gather(
                *(dispatch_one(dispatchers[n % 2], task) for n, task in enumerate(queued))
            )
            return await attempts_on(db, ids)

        (first,) = await both_replicas_dispatch()
        await monitors[1].record_outcome(GEN45, None, 1.0, holder=first)  # worker on replica 1
        assert monitors[1].registry.get(GEN45).state is BreakerState.HALF_OPEN
        await monitors[0].sync()
        probes = await both_replicas_dispatch()
        assert len(probes) == 2  # the freed slot admitted one more probe, across both replicas
        (second,) = [p for p in probes if p != first]
        await monitors[0].record_outcome(GEN45, None, 1.0, holder=second)
        assert monitors[0].registry.get(GEN45).state is BreakerState.CLOSED  # 2 successes shared
        await monitors[1].sync()
        assert monitors[1].registry.get(GEN45).state is BreakerState.CLOSED
    finally:
        keys = [k async for k in client.scan_iter(f"{prefix}:*")]
        if keys:
            await client.delete(*keys)
        await client.aclose()
        await peer.aclose()


async def test_an_auth_failure_disables_the_account_from_the_next_task_on(
    db: Database, catalogs: CatalogQueries, make_dispatcher: DispatcherFactory
) -> None:
    """One AUTH result opens the account's breaker: every model of the account is CIRCUIT_OPEN
    for the next task; after the cooldown one probe is admitted and its success closes it."""
    clock = ManualClock()
    monitor = HealthMonitor(
        BreakerRegistry(BreakerConfig(half_open_successes_to_close=1), clock),
        db=db,
        clock=clock,
    )
    dispatcher = make_dispatcher(monitor=monitor)
    catalog = await dispatcher.catalog()
    await monitor.record_outcome(GEN45, "AUTH", 0.1, holder="revoked-1")
    account = BreakerKey("runway", "prod-us", "us", "", Op.SUBMIT)
    assert monitor.registry.get(account).state is BreakerState.OPEN
    assert monitor.registry.get(GEN45).state is BreakerState.CLOSED  # AUTH says nothing of it
    task = await new_task(db, make_spec())
    result = await dispatch_one(dispatcher, task)
    assert result.decision is not None
    runway = [result.decision.verdict(c.id) for c in catalog.candidates if c.account == "prod-us"]
    assert not any(v.eligible for v in runway)
    blocked = [v for v in runway if v.reason == "CIRCUIT_OPEN"]
    assert GEN45_ID in {v.candidate.id for v in blocked}
    assert all(v.detail.startswith("account breaker OPEN") for v in blocked)
    (event,) = [e for e in await catalogs.health_events() if e.model is None]
    assert (event.new_state, event.reason) == ("OPEN", "account_disabled:AUTH")
    clock.now = (monitor.registry.get(account).open_until or 0) + 0.001
    assert await monitor.admit(GEN45, "probe-1")
    assert not await monitor.admit(GEN45, "probe-2")  # one probe at a time
    await monitor.record_outcome(GEN45, None, 1.0, holder="probe-1")
    assert monitor.registry.get(account).state is BreakerState.CLOSED


@pytest.mark.redis
async def test_a_probe_slot_without_a_result_expires_after_its_ttl(redis_server_url: str) -> None:
    """A probe whose result never comes (its replica died) frees its slot after the probe TTL,
    in Redis as in process; until then the slot is held."""
    client = aioredis.Redis.from_url(redis_server_url)
    prefix = f"test-{secrets.token_hex(4)}"
    try:
        for shared in (RedisSharedState(client, prefix), InProcessSharedState()):
            assert await shared.acquire_probe(GEN45, "lost-probe", 1, 0.3)
            assert await shared.acquire_probe(GEN45, "lost-probe", 1, 0.3)  # idempotent
            assert not await shared.acquire_probe(GEN45, "next", 1, 0.3)
            deadline = time.monotonic() + 5
            while not await shared.acquire_probe(GEN45, "next", 1, 0.3):
                assert time.monotonic() < deadline, "the lost probe's slot never expired"
                await asyncio.sleep(0.05)
            finish = await shared.finish_probe(GEN45, "lost-probe", True, 0.3)
            assert not finish.was_probe  # its slot expired: a late result is not a probe
            assert finish.successes == 0
            assert (await shared.finish_probe(GEN45, "next", True, 0.3)).successes == 1
            await shared.clear_probes(GEN45)
            assert await shared.probes_free(GEN45, 1) == 1
    finally:
        keys = [k async for k in client.scan_iter(f"{prefix}:*")]
        if keys:
            await client.delete(*keys)
        await client.aclose()


async def test_breakers_keep_working_locally_while_redis_is_unreachable() -> None:
    """With the shared state unreachable, outcomes still trip the local breaker without raising
    into the worker, and HALF_OPEN admits no probe (the limit cannot be proven globally)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = s.getsockname()[1]  # nothing listens here once the socket is closed
    client = aioredis.Redis.from_url(f"redis://127.0.0.1:{dead}", socket_connect_timeout=0.5)
    clock = ManualClock()
    monitor = HealthMonitor(
        BreakerRegistry(PROBING, clock), shared=RedisSharedState(client), clock=clock
    )
    try:
        await monitor.record_outcome(GEN45, None, 1.0)
        for _ in range(PROBING.consecutive_failures):
            await monitor.record_outcome(GEN45, "PROVIDER_OVERLOADED", 1.0, holder="x")
        breaker = monitor.registry.get(GEN45)
        assert breaker.state is BreakerState.OPEN
        assert not await monitor.admit(GEN45, "t1")
        clock.now = (breaker.open_until or 0) + 0.001
        assert not await monitor.admit(GEN45, "t2")
        assert breaker.state is BreakerState.HALF_OPEN  # type: ignore[comparison-overlap]  # the call above changed it; mypy keeps the old narrowing
    finally:
        await client.aclose()


# ---- slow calls (9.15.1-9.15.2) ------------------------------------------------------------


async def test_a_slow_provider_opens_its_submit_breaker(
    db: Database, catalogs: CatalogQueries, make_dispatcher: DispatcherFactory
) -> None:
    """Thirty accepted submits at 1 s give gen4.5 a SUBMIT baseline; two accepted submits at
    5 s (over 4x it) are TIMEOUT_OVER_BASELINE and open the breaker as slow_calls, audited and
    blocking routing. The account breaker and the health windows hear accepted submits."""
    await make_dispatcher().catalog()
    clock = ManualClock()
    monitor = HealthMonitor(BreakerRegistry(BreakerConfig(), clock), db=db, clock=clock)
    for _ in range(30):
        await monitor.record_outcome(GEN45, None, 1.0)
        clock.now += 1.0
    assert monitor.baseline_s(GEN45) == pytest.approx(1.0, rel=0.08)
    assert monitor.open_reason(GEN45) is None
    await monitor.record_outcome(GEN45, None, 5.0)
    clock.now += 1.0
    assert monitor.open_reason(GEN45) is None  # one slow call in 31 is under 5 %
    await monitor.record_outcome(GEN45, None, 5.0)
    assert monitor.open_reason(GEN45) is not None
    (event,) = await catalogs.health_events()
    assert (event.operation, event.new_state, event.reason) == ("SUBMIT", "OPEN", "slow_calls")
    assert event.metrics["slow_calls"] == 2
    assert event.metrics["baseline_s"] == pytest.approx(1.0, rel=0.08)
    account = BreakerKey("runway", "prod-us", "us", "", Op.SUBMIT)
    assert monitor.registry.get(account).state is BreakerState.CLOSED
    assert monitor.health_view("runway/gen4.5/prod-us") is None  # accepted: no failed attempt


async def test_slow_polls_open_the_poll_breaker_only() -> None:
    """Polls slower than 4x the POLL baseline open the POLL breaker; the SUBMIT breaker of the
    same model, whose calls stay fast, stays closed: baselines are per operation."""
    clock = ManualClock()
    monitor = HealthMonitor(BreakerRegistry(BreakerConfig(), clock), clock=clock)
    poll = BreakerKey("runway", "prod-us", "us", "gen4.5", Op.POLL)
    for _ in range(25):
        await monitor.record_outcome(poll, None, 0.3)
        await monitor.record_outcome(GEN45, None, 2.0)
        clock.now += 1.0
    for _ in range(3):
        await monitor.record_outcome(poll, None, 3.0)  # fast for a submit, slow for a poll
        await monitor.record_outcome(GEN45, None, 2.0)
        clock.now += 1.0
    assert monitor.registry.get(poll).state is BreakerState.OPEN
    assert monitor.registry.get(GEN45).state is BreakerState.CLOSED
