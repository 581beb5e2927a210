"""One behavioural contract for every `LeaseStore`, run against the memory store and real Redis.

Every test gets a `Backend`: the store plus a way to move its clock forward. The memory store
advances its injected clock. Redis polls server TIME until the target passes, with a deadline.
Nothing sleeps a fixed time in the hope that something happened. `flush` loses the store's data as
a Redis FLUSHALL would (Redis: every key of the test's namespace; memory: `forget_everything`), and
`build` makes another store over the same data, e.g. a fail-closed one.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import pytest
from redis.asyncio import Redis

from controlplane.leases import (
    AccountSnapshot,
    CounterKind,
    Dimension,
    Drift,
    HeldLease,
    InFlightAttempt,
    InvalidLeaseRequest,
    Lease,
    LeaseBackendError,
    LeaseLostError,
    LeaseRequest,
    LeaseStore,
    MemoryLeaseStore,
    compute_drift,
    reconcile,
    unknown_slot_cap,
)
from controlplane.leases.base import LeaseStoreFactory
from controlplane.leases.redis_store import RedisLeaseStore

ACCOUNT = "runway:prod-us"
OTHER_ACCOUNT = "runway:prod-eu"
ALL_VIDEO = Dimension("all-video", 4)
GEN45 = Dimension("gen4.5", 2)
REGION = Dimension("region-us", 3)
DIMS = (ALL_VIDEO, GEN45, REGION)
LONG_TTL = 30_000
SHORT_TTL = 250  # leases meant to expire during the test
RENEW_TTL = 2_000  # leases that must survive the clock moving ~150 ms, with slack for slow machines
CLOCK_DEADLINE_S = 5.0


@dataclass
class Backend:
    """A store under test, plus a way to move its clock and the unknown-full events it reported."""

    name: str
    store: LeaseStore
    advance: Callable[[int], Awaitable[None]]
    flush: Callable[[], Awaitable[None]]
    build: LeaseStoreFactory  # a new store of the backend, with the hooks it is given
    full_events: list[str] = field(default_factory=list)


class FakeClock:
    """Millisecond clock for the memory store, moved by hand."""

    def __init__(self) -> None:
        self.now = 1_700_000_000_000

    def __call__(self) -> int:
        return self.now


async def wait_for_server_clock(store: LeaseStore, target_ms: int) -> None:
    """Poll the store clock until it passes `target_ms`, failing after a deadline."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + CLOCK_DEADLINE_S
    while await store.now_ms() < target_ms:
        assert loop.time() < deadline, "Redis server clock did not advance"
        await asyncio.sleep(0.01)


@pytest.fixture
def memory_backend() -> Backend:
    """The in-process store on a hand-moved clock."""
    clock = FakeClock()
    events: list[str] = []

    async def advance(ms: int) -> None:
        clock.now += ms

    store = MemoryLeaseStore(clock=clock, on_unknown_slots_full=events.append)

    async def flush() -> None:
        assert isinstance(made.store, MemoryLeaseStore)
        made.store.forget_everything()

    def build(
        *,
        fail_closed: bool = False,
        on_not_live: Callable[[str], None] | None = None,
        on_freed: Callable[[str], None] | None = None,
    ) -> LeaseStore:
        # The memory store's data lives in the instance, so the backend's store becomes the new one.
        made.store = MemoryLeaseStore(
            clock=clock, fail_closed=fail_closed, on_not_live=on_not_live, on_freed=on_freed
        )
        return made.store

    made = Backend("memory", store, advance, flush, build, events)
    return made


@pytest.fixture
def redis_backend(redis_client: Redis, redis_namespace: str) -> Backend:
    """The Redis store on real Redis, in a namespace of its own; time is the server's."""
    events: list[str] = []
    store = RedisLeaseStore(
        redis_client, namespace=redis_namespace, on_unknown_slots_full=events.append
    )

    async def advance(ms: int) -> None:
        await wait_for_server_clock(store, await store.now_ms() + ms)

    async def flush() -> None:
        keys = [key async for key in redis_client.scan_iter(match=f"{redis_namespace}*")]
        if keys:
            await redis_client.delete(*keys)

    def build(
        *,
        fail_closed: bool = False,
        on_not_live: Callable[[str], None] | None = None,
        on_freed: Callable[[str], None] | None = None,
    ) -> LeaseStore:
        return RedisLeaseStore(
            redis_client,
            namespace=redis_namespace,
            fail_closed=fail_closed,
            on_not_live=on_not_live,
            on_freed=on_freed,
        )

    return Backend("redis", store, advance, flush, build, events)


@pytest.fixture(params=["memory", pytest.param("redis", marks=pytest.mark.redis)])
def backend(request: pytest.FixtureRequest) -> Backend:
    """Each contract test runs once per store implementation."""
    chosen: Backend = request.getfixturevalue(f"{request.param}_backend")
    return chosen


def request_for(
    attempt_id: str,
    dims: tuple[Dimension, ...] = DIMS,
    *,
    account: str = ACCOUNT,
    slots: int = 1,
    ttl_ms: int = LONG_TTL,
    max_term_ms: int = 600_000,
) -> LeaseRequest:
    return LeaseRequest(attempt_id, account, dims, slots, ttl_ms, max_term_ms)


async def usage(store: LeaseStore, dims: tuple[Dimension, ...] = DIMS) -> dict[str, int]:
    return {d.key: await store.used(ACCOUNT, d.key) for d in dims}


async def must_acquire(store: LeaseStore, req: LeaseRequest) -> Lease:
    lease = await store.acquire(req)
    assert lease is not None, f"expected capacity for {req.attempt_id}"
    return lease


# -- reservation -----------------------------------------------------------------------------------


async def test_acquire_reserves_slots_in_every_dimension(backend: Backend) -> None:
    """A granted lease counts its slots in each of its dimensions and nowhere else."""
    lease = await must_acquire(backend.store, request_for("a-1", slots=2))
    assert await usage(backend.store) == {"all-video": 2, "gen4.5": 2, "region-us": 2}
    assert await backend.store.used(OTHER_ACCOUNT, "all-video") == 0
    assert lease.expires_at_ms == lease.acquired_at_ms + LONG_TTL
    assert (lease.slots, lease.unknown) == (2, False)


async def test_acquire_is_all_or_nothing_across_dimensions(backend: Backend) -> None:
    """When one dimension lacks room, no dimension is touched and the request gets None."""
    await must_acquire(backend.store, request_for("a-1", (ALL_VIDEO, GEN45), slots=2))
    before = await usage(backend.store)
    assert await backend.store.acquire(request_for("a-2")) is None  # gen4.5 is full
    assert await usage(backend.store) == before
    assert backend.store.metrics.rejected_no_capacity == 1


async def test_capacity_is_never_exceeded_by_concurrent_acquires(backend: Backend) -> None:
    """Many concurrent acquires against one small dimension are granted exactly its capacity."""
    results = await asyncio.gather(
        *(backend.store.acquire(request_for(f"a-{i}", (ALL_VIDEO,))) for i in range(20))
    )
    granted = [lease for lease in results if lease is not None]
    assert len(granted) == ALL_VIDEO.capacity
    assert await backend.store.used(ACCOUNT, "all-video") == ALL_VIDEO.capacity


async def test_reacquire_by_the_same_attempt_returns_the_held_lease(backend: Backend) -> None:
    """Acquiring again while the attempt holds a live lease returns it and reserves nothing more."""
    first = await must_acquire(backend.store, request_for("a-1"))
    again = await must_acquire(backend.store, request_for("a-1"))
    assert again == first
    assert await usage(backend.store) == {"all-video": 1, "gen4.5": 1, "region-us": 1}


async def test_fencing_tokens_increase_per_account(backend: Backend) -> None:
    """Each grant in an account carries a larger fencing token than the previous one."""
    fences = []
    for i in range(3):
        lease = await must_acquire(backend.store, request_for(f"a-{i}", (ALL_VIDEO,)))
        fences.append(lease.fencing_token)
        await backend.store.release(lease)
    assert fences == sorted(set(fences))


# -- release and tokens ----------------------------------------------------------------------------


async def test_release_is_idempotent(backend: Backend) -> None:
    """The first release returns the slots (True); a second returns False and subtracts nothing."""
    lease = await must_acquire(backend.store, request_for("a-1"))
    other = await must_acquire(backend.store, request_for("a-2"))
    assert await backend.store.release(lease) is True
    assert await backend.store.release(lease) is False
    assert await usage(backend.store) == {"all-video": 1, "gen4.5": 1, "region-us": 1}
    assert await backend.store.release(other) is True
    assert await usage(backend.store) == {"all-video": 0, "gen4.5": 0, "region-us": 0}


async def test_wrong_token_cannot_release_renew_or_mark(backend: Backend) -> None:
    """A lease copy whose token differs from the record is refused by every operation."""
    lease = await must_acquire(backend.store, request_for("a-1"))
    forged = dataclasses.replace(lease, token="not-the-token")
    assert await backend.store.release(forged) is False
    assert await backend.store.renew(forged) is None
    with pytest.raises(LeaseLostError):
        await backend.store.mark_unknown(forged, 2)
    assert await usage(backend.store) == {"all-video": 1, "gen4.5": 1, "region-us": 1}
    assert await backend.store.release(lease) is True


# -- renewal and expiry ----------------------------------------------------------------------------


async def test_renew_extends_the_expiry(backend: Backend) -> None:
    """A heartbeat moves the expiry to now + ttl, later than it was."""
    lease = await must_acquire(backend.store, request_for("a-1", ttl_ms=RENEW_TTL))
    await backend.advance(50)
    renewed = await backend.store.renew(lease)
    assert renewed is not None
    assert renewed.expires_at_ms > lease.expires_at_ms
    assert renewed.token == lease.token


async def test_renew_never_passes_the_max_term(backend: Backend) -> None:
    """Renewals stop extending at acquired_at + max_term, however often they come."""
    req = request_for("a-1", ttl_ms=RENEW_TTL, max_term_ms=RENEW_TTL + 100)
    lease = await must_acquire(backend.store, req)
    await backend.advance(150)
    renewed = await backend.store.renew(lease)
    assert renewed is not None
    assert renewed.expires_at_ms == lease.term_ends_at_ms
    again = await backend.store.renew(renewed)
    assert again is not None
    assert again.expires_at_ms == lease.term_ends_at_ms


async def test_expired_lease_is_reclaimed_exactly_once(backend: Backend) -> None:
    """An expired lease cannot be renewed, is reclaimed once, and a late release is refused."""
    lease = await must_acquire(backend.store, request_for("a-1", ttl_ms=SHORT_TTL))
    live = await must_acquire(backend.store, request_for("a-live"))
    await backend.advance(SHORT_TTL + 1)
    assert await backend.store.renew(lease) is None
    assert await backend.store.reclaim_expired() == ["a-1"]
    assert await backend.store.reclaim_expired() == []
    assert await backend.store.release(lease) is False
    assert await usage(backend.store) == {"all-video": 1, "gen4.5": 1, "region-us": 1}
    assert await backend.store.release(live) is True


async def test_reclaim_honours_an_explicit_now(backend: Backend) -> None:
    """reclaim_expired(now_ms) judges expiry at the given instant instead of the store clock."""
    lease = await must_acquire(backend.store, request_for("a-1", ttl_ms=LONG_TTL))
    assert await backend.store.reclaim_expired(now_ms=lease.expires_at_ms - 1) == []
    assert await backend.store.reclaim_expired(now_ms=lease.expires_at_ms) == ["a-1"]
    assert await usage(backend.store) == {"all-video": 0, "gen4.5": 0, "region-us": 0}


async def test_acquire_after_expiry_grants_a_fresh_lease(backend: Backend) -> None:
    """An attempt whose old lease expired unreclaimed gets a new lease without double counting."""
    old = await must_acquire(backend.store, request_for("a-1", ttl_ms=SHORT_TTL))
    await backend.advance(SHORT_TTL + 1)
    new = await must_acquire(backend.store, request_for("a-1", ttl_ms=SHORT_TTL))
    assert new.token != old.token
    assert new.fencing_token > old.fencing_token
    assert await usage(backend.store) == {"all-video": 1, "gen4.5": 1, "region-us": 1}
    assert await backend.store.release(old) is False
    assert await backend.store.release(new) is True


# -- unknown submissions (9.11.3) ------------------------------------------------------------------


def test_unknown_slot_cap_is_max_of_two_and_five_percent() -> None:
    """The unknown budget is max(2, ceil(5% of capacity))."""
    assert [unknown_slot_cap(c) for c in (0, 1, 20, 40, 41, 100, 1000)] == [2, 2, 2, 2, 3, 5, 50]
    with pytest.raises(InvalidLeaseRequest):
        unknown_slot_cap(-1)


async def test_unknown_cap_holds_and_stops_new_submissions(backend: Backend) -> None:
    """Unknown slots stop at the cap; a full budget makes accepting_new False until one drains."""
    store, cap = backend.store, unknown_slot_cap(ALL_VIDEO.capacity)
    leases = [await must_acquire(store, request_for(f"a-{i}", (ALL_VIDEO,))) for i in range(3)]
    assert await store.accepting_new(ACCOUNT) is True
    assert await store.mark_unknown(leases[0], cap) is True
    assert await store.accepting_new(ACCOUNT) is True
    assert await store.mark_unknown(leases[1], cap) is True
    assert await store.accepting_new(ACCOUNT) is False
    assert await store.mark_unknown(leases[2], cap) is False
    assert await store.unknown_used(ACCOUNT) == cap
    assert await store.used(ACCOUNT, "all-video") == 3  # unknown slots stay taken
    assert backend.full_events == [ACCOUNT, ACCOUNT]
    assert await store.accepting_new(OTHER_ACCOUNT) is True
    assert await store.release(leases[0]) is True
    assert await store.unknown_used(ACCOUNT) == 1
    assert await store.accepting_new(ACCOUNT) is True


async def test_refused_mark_blocks_new_submissions_even_below_the_cap(backend: Backend) -> None:
    """A multi-slot lease that does not fit is refused and accepting_new turns False."""
    lease = await must_acquire(backend.store, request_for("a-1", (ALL_VIDEO,), slots=3))
    assert await backend.store.mark_unknown(lease, 2) is False
    assert await backend.store.unknown_used(ACCOUNT) == 0
    assert await backend.store.accepting_new(ACCOUNT) is False
    assert backend.full_events == [ACCOUNT]


async def test_mark_unknown_is_idempotent_and_resolvable(backend: Backend) -> None:
    """Marking twice counts once, and resolving moves the slot back to confirmed."""
    lease = await must_acquire(backend.store, request_for("a-1"))
    assert await backend.store.mark_unknown(lease, 2) is True
    assert await backend.store.mark_unknown(lease, 2) is True
    assert await backend.store.unknown_used(ACCOUNT) == 1
    renewed = await backend.store.renew(lease)
    assert renewed is not None
    assert renewed.unknown is True
    assert await backend.store.resolve_unknown(lease) is True
    assert await backend.store.resolve_unknown(lease) is False
    assert await backend.store.unknown_used(ACCOUNT) == 0
    assert await usage(backend.store) == {"all-video": 1, "gen4.5": 1, "region-us": 1}


async def test_reclaiming_an_unknown_lease_drains_the_unknown_budget(backend: Backend) -> None:
    """An expired unknown lease returns both its dimension slots and its unknown slot."""
    lease = await must_acquire(backend.store, request_for("a-1", ttl_ms=SHORT_TTL))
    assert await backend.store.mark_unknown(lease, 1) is True
    assert await backend.store.accepting_new(ACCOUNT) is False
    await backend.advance(SHORT_TTL + 1)
    assert await backend.store.reclaim_expired() == ["a-1"]
    assert await backend.store.unknown_used(ACCOUNT) == 0
    assert await backend.store.accepting_new(ACCOUNT) is True


# -- snapshot and reconciliation (9.11.2) ----------------------------------------------------------


async def test_snapshot_reports_counters_leases_and_capacity(backend: Backend) -> None:
    """A snapshot shows each dimension's count and capacity, the unknown budget and the leases."""
    lease = await must_acquire(backend.store, request_for("a-1"))
    await backend.store.mark_unknown(lease, 2)
    snap = await backend.store.snapshot(ACCOUNT)
    assert dict(snap.used) == {"all-video": 1, "gen4.5": 1, "region-us": 1}
    assert dict(snap.capacity) == {"all-video": 4, "gen4.5": 2, "region-us": 3}
    assert (snap.unknown_used, snap.unknown_cap, snap.accepting_new) == (1, 2, True)
    assert [(lease.attempt_id, lease.unknown) for lease in snap.leases] == [("a-1", True)]
    assert ACCOUNT in await backend.store.accounts()


async def test_reconciler_repairs_injected_drift_and_reports_it(backend: Backend) -> None:
    """Counters that disagree with the facts are corrected and each correction is audited once."""
    store = backend.store
    await must_acquire(store, request_for("a-held", (ALL_VIDEO, GEN45)))
    await store.set_used(ACCOUNT, "all-video", 4)  # leaked: nothing holds the extra 3
    await store.set_unknown_used(ACCOUNT, 2)
    # The database knows an unknown attempt whose lease is already gone, e.g. after a worker crash.
    facts = [InFlightAttempt("a-lost", ACCOUNT, (ALL_VIDEO, REGION), 1, unknown=True)]
    audited: list[Drift] = []

    async def audit(drift: Drift) -> None:
        audited.append(drift)

    found = await reconcile(store, facts, audit)
    assert found == audited
    assert {(d.dimension, d.expected, d.actual, d.delta) for d in audited} == {
        ("all-video", 2, 4, -2),
        ("region-us", 1, 0, 1),
        ("unknown_submission_slots", 1, 2, -1),
    }
    assert await usage(store) == {"all-video": 2, "gen4.5": 1, "region-us": 1}
    assert await store.unknown_used(ACCOUNT) == 1
    assert await reconcile(store, facts, audit) == []


async def test_reconciler_does_not_add_back_a_lease_released_after_its_facts_were_read(
    backend: Backend,
) -> None:
    """An attempt read as in flight that ends and releases its lease before the snapshot is not
    counted when the re-read (`confirm`) no longer has it; without the re-read the pass would
    add back the released slot, a leak with no lease behind it."""
    store = backend.store
    lease = await must_acquire(store, request_for("a-ending", (ALL_VIDEO, GEN45)))
    facts = [InFlightAttempt("a-ending", ACCOUNT, (ALL_VIDEO, GEN45), 1)]  # read while running
    await store.release(lease)  # the attempt ends and its release lands before the snapshot

    async def audit(drift: Drift) -> None:
        pass

    async def now_in_flight() -> list[InFlightAttempt]:
        return []  # the re-read after the snapshot: it has ended

    assert await reconcile(store, facts, audit, confirm=now_in_flight) == []
    assert await usage(store) == {"all-video": 0, "gen4.5": 0, "region-us": 0}
    # Without the re-read the stale fact is counted and a slot leaks back in.
    leaked = await reconcile(store, facts, audit)
    assert {(d.dimension, d.delta) for d in leaked} == {("all-video", 1), ("gen4.5", 1)}


def test_compute_drift_counts_facts_and_lease_records_once_per_attempt() -> None:
    """An attempt both in the database and holding a lease counts once; the database wins."""
    lease = Lease("a-1", ACCOUNT, "t", 1, (ALL_VIDEO, GEN45), 1, 0, 10, 10, 10, unknown=False)
    snapshot = AccountSnapshot(ACCOUNT, {"all-video": 1, "gen4.5": 1}, {}, 0, 2, True, (lease,))
    facts = [
        InFlightAttempt("a-1", ACCOUNT, (ALL_VIDEO, GEN45), 1, unknown=True),
        InFlightAttempt("a-2", OTHER_ACCOUNT, (ALL_VIDEO,), 1),
    ]
    assert compute_drift(facts, snapshot) == [
        Drift(ACCOUNT, "unknown_submission_slots", 1, 0, 1, CounterKind.UNKNOWN_BUDGET)
    ]


def test_in_flight_fact_comes_only_from_in_flight_states() -> None:
    """Terminal states yield no fact and SUBMIT_UNKNOWN yields an unknown one."""

    def fact(state: str) -> InFlightAttempt | None:
        return InFlightAttempt.from_state(
            attempt_id="a", account=ACCOUNT, dimensions=DIMS, slots=1, state=state
        )

    assert fact("SUCCEEDED") is None
    assert fact("RUNNING") == InFlightAttempt("a", ACCOUNT, DIMS, 1, unknown=False)
    unknown = fact("SUBMIT_UNKNOWN")
    assert unknown is not None
    assert unknown.unknown is True


# -- expiry on acquire, fencing, and losing the store's data (9.11.2) ------------------------------


async def test_acquire_reclaims_expired_leases_of_the_account(backend: Backend) -> None:
    """A dead holder's expired slots come back on the next acquire, with no sweeper running."""
    one = (Dimension("all-video", 1),)
    await must_acquire(backend.store, request_for("a-dead", one, ttl_ms=SHORT_TTL))
    assert await backend.store.acquire(request_for("a-new", one)) is None
    await backend.advance(SHORT_TTL + 1)
    fresh = await must_acquire(backend.store, request_for("a-new", one))
    assert await backend.store.used(ACCOUNT, "all-video") == 1
    assert backend.store.metrics.reclaimed == 1
    assert await backend.store.reclaim_expired() == []
    assert [lease.attempt_id for lease in (await backend.store.snapshot(ACCOUNT)).leases] == [
        fresh.attempt_id
    ]


async def test_acquire_reclaims_an_expired_unknown_lease_from_both_budgets(
    backend: Backend,
) -> None:
    """An expired unknown lease reclaimed on acquire gives back its slots and its unknown slot."""
    dead = await must_acquire(backend.store, request_for("a-dead", ttl_ms=SHORT_TTL))
    assert await backend.store.mark_unknown(dead, 1) is True
    assert await backend.store.accepting_new(ACCOUNT) is False
    await backend.advance(SHORT_TTL + 1)
    await must_acquire(backend.store, request_for("a-new", (GEN45,)))
    assert await usage(backend.store) == {"all-video": 0, "gen4.5": 1, "region-us": 0}
    assert await backend.store.unknown_used(ACCOUNT) == 0
    assert await backend.store.accepting_new(ACCOUNT) is True


async def test_stale_fencing_token_cannot_renew_release_or_mark(backend: Backend) -> None:
    """A holder with the right token but an old fencing token is refused and changes nothing."""
    lease = await must_acquire(backend.store, request_for("a-1"))
    stale = dataclasses.replace(lease, fencing_token=lease.fencing_token - 1)
    assert await backend.store.renew(stale) is None
    assert await backend.store.release(stale) is False
    with pytest.raises(LeaseLostError):
        await backend.store.mark_unknown(stale, 2)
    assert await usage(backend.store) == {"all-video": 1, "gen4.5": 1, "region-us": 1}
    assert (await backend.store.snapshot(ACCOUNT)).leases == (lease,)
    assert await backend.store.release(lease) is True


async def test_after_a_flush_the_account_is_found_reclaimed_and_reconciled(
    backend: Backend,
) -> None:
    """The same store instance lists, reclaims and reconciles an account again after a flush."""
    store = backend.store
    await must_acquire(store, request_for("a-before"))
    await backend.flush()
    store = backend.store
    assert await store.accounts() == []
    await must_acquire(store, request_for("a-after", ttl_ms=SHORT_TTL))
    assert await store.accounts() == [ACCOUNT]
    await backend.advance(SHORT_TTL + 1)
    assert await store.reclaim_expired() == ["a-after"]
    await store.set_used(ACCOUNT, "gen4.5", 2)  # leaked after the flush

    async def audit(drift: Drift) -> None:
        pass

    drifts = await reconcile(store, [], audit)
    assert [(d.dimension, d.delta) for d in drifts] == [("gen4.5", -2)]


async def test_fail_closed_store_refuses_acquires_until_restored(backend: Backend) -> None:
    """A fail-closed store admits nothing in an account until restore (and says so), nor after a
    flush."""
    told: list[str] = []
    store = backend.build(fail_closed=True, on_not_live=told.append)
    assert await store.is_live(ACCOUNT) is False
    assert await store.acquire(request_for("a-1")) is None
    assert store.metrics.rejected_not_live == 1
    assert told == [ACCOUNT]
    assert await usage(store) == {"all-video": 0, "gen4.5": 0, "region-us": 0}
    assert await store.restore(ACCOUNT, [], ttl_ms=LONG_TTL, max_term_ms=600_000) == []
    assert await store.is_live(ACCOUNT) is True
    await must_acquire(store, request_for("a-1"))
    await backend.flush()
    assert await store.is_live(ACCOUNT) is False
    assert await store.acquire(request_for("a-2")) is None
    assert await usage(store) == {"all-video": 0, "gen4.5": 0, "region-us": 0}


async def test_restore_rebuilds_held_leases_with_their_tokens(backend: Backend) -> None:
    """Restored holders count against capacity, keep their tokens, and release as before."""
    store = backend.build(fail_closed=True)
    await store.restore(ACCOUNT, [], ttl_ms=LONG_TTL, max_term_ms=600_000)
    before = await must_acquire(store, request_for("a-1", (ALL_VIDEO, GEN45)))
    unknown = await must_acquire(store, request_for("a-2", (ALL_VIDEO, GEN45)))
    await backend.flush()
    held = [
        HeldLease("a-1", ACCOUNT, before.token, before.fencing_token, (ALL_VIDEO, GEN45)),
        HeldLease("a-2", ACCOUNT, unknown.token, 7, (ALL_VIDEO, GEN45), unknown=True),
    ]
    restored = await store.restore(
        ACCOUNT, held, ttl_ms=LONG_TTL, max_term_ms=600_000, unknown_cap=1
    )
    assert restored == ["a-1", "a-2"]
    assert await store.restore(ACCOUNT, held, ttl_ms=LONG_TTL, max_term_ms=600_000) == []
    assert await store.used(ACCOUNT, "gen4.5") == 2  # restored once, not twice
    assert await store.unknown_used(ACCOUNT) == 1
    assert await store.accepting_new(ACCOUNT) is False  # the unknown budget of 1 is full
    assert await store.acquire(request_for("a-3", (ALL_VIDEO, GEN45))) is None
    by_id = {lease.attempt_id: lease for lease in (await store.snapshot(ACCOUNT)).leases}
    assert (by_id["a-1"].token, by_id["a-1"].fencing_token) == (before.token, before.fencing_token)
    assert await store.release(dataclasses.replace(by_id["a-2"], fencing_token=6)) is False
    assert await store.release(by_id["a-1"]) is True
    assert await store.release(by_id["a-2"]) is True
    newer = await must_acquire(store, request_for("a-3", (ALL_VIDEO, GEN45)))
    assert newer.fencing_token > 7  # the fence counter rose past every restored holder


async def test_restore_into_a_live_account_leaves_unsent_holders_out(backend: Backend) -> None:
    """A live account gets back only its sent holders; an unsent one's lease expired for good."""
    store = backend.build(fail_closed=True)
    await store.restore(ACCOUNT, [], ttl_ms=LONG_TTL, max_term_ms=600_000)
    sent = HeldLease("a-sent", ACCOUNT, "t-sent", 1, (GEN45,))
    unsent = HeldLease("a-unsent", ACCOUNT, "t-unsent", 2, (GEN45,), sent=False)
    restored = await store.restore(ACCOUNT, [sent, unsent], ttl_ms=LONG_TTL, max_term_ms=600_000)
    assert restored == ["a-sent"]
    assert await store.used(ACCOUNT, "gen4.5") == 1
    await backend.flush()
    restored = await store.restore(ACCOUNT, [sent, unsent], ttl_ms=LONG_TTL, max_term_ms=600_000)
    assert restored == ["a-sent", "a-unsent"]
    assert await store.used(ACCOUNT, "gen4.5") == 2


# -- validation and backend errors -----------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs",
    [
        {"account": "runway:{prod}"},
        {"account": ""},
        {"dimensions": ()},
        {"dimensions": (ALL_VIDEO, ALL_VIDEO)},
        {"slots": 0},
        {"ttl_ms": 0},
        {"ttl_ms": 1000, "max_term_ms": 999},
    ],
)
def test_malformed_requests_are_rejected(kwargs: dict[str, object]) -> None:
    """Requests that would break hash tags, counting or expiry raise InvalidLeaseRequest."""
    base: dict[str, object] = {"attempt_id": "a", "account": ACCOUNT, "dimensions": DIMS}
    with pytest.raises(InvalidLeaseRequest):
        LeaseRequest(**{**base, **kwargs})  # type: ignore[arg-type]  # keyword overrides from a plain dict; the constructor checks them


@pytest.mark.redis
async def test_redis_keys_share_the_account_hash_tag(
    redis_client: Redis, redis_namespace: str
) -> None:
    """Every key of an account carries `{account}` so one script can touch them all on a Cluster."""
    store = RedisLeaseStore(redis_client, namespace=redis_namespace)
    await must_acquire(store, request_for("attempt-123"))
    keys = sorted([key.decode() async for key in redis_client.scan_iter(f"{redis_namespace}*")])
    tagged = [key for key in keys if not key.endswith(":accounts")]
    assert f"{redis_namespace}capacity:{{{ACCOUNT}}}:all-video" in tagged
    assert f"{redis_namespace}lease:{{{ACCOUNT}}}:attempt-123" in tagged
    assert all(f"{{{ACCOUNT}}}" in key for key in tagged)


async def test_unreachable_redis_raises_lease_backend_error() -> None:
    """Connection failures surface as LeaseBackendError, never as redis exceptions."""
    client = Redis.from_url("redis://127.0.0.1:1/0", socket_connect_timeout=0.5)
    try:
        store = RedisLeaseStore(client, namespace="vrtest-unreachable:")
        with pytest.raises(LeaseBackendError):
            await store.acquire(request_for("a-1"))
    finally:
        await client.aclose()


# -- batches (one round trip per dispatch round) ----------------------------------------------


async def test_acquire_many_grants_in_order_each_request_all_or_nothing(backend: Backend) -> None:
    """A batch is the single acquires in order: later requests see earlier grants, a full
    dimension refuses only the requests that need it, other accounts are unaffected."""
    store = backend.store
    reqs = [request_for(f"b{i}") for i in range(3)]  # GEN45 holds 2
    reqs.append(request_for("other", (ALL_VIDEO,), account=OTHER_ACCOUNT))
    reqs.append(request_for("b0"))  # the same attempt again: its held lease, unchanged
    got = await store.acquire_many(reqs)
    assert [g is not None for g in got] == [True, True, False, True, True]
    assert got[4] == got[0]
    assert await usage(store) == {"all-video": 2, "gen4.5": 2, "region-us": 2}
    assert await store.used(OTHER_ACCOUNT, "all-video") == 1
    assert await store.acquire_many([]) == []


async def test_release_many_returns_every_slot_once_and_reports_the_accounts(
    backend: Backend,
) -> None:
    """Releasing a batch gives back each lease's slots exactly once (a second release of the
    same leases changes nothing) and tells `on_freed` every account that got slots back."""
    freed: list[str] = []
    store = backend.build(on_freed=freed.append)
    got = await store.acquire_many(
        [
            request_for("r0"),
            request_for("r1", (ALL_VIDEO,)),
            request_for("r2", (ALL_VIDEO,), account=OTHER_ACCOUNT),
        ]
    )
    leases = [g for g in got if g is not None]
    assert len(leases) == 3
    assert await store.release_many(leases) == [True, True, True]
    assert sorted(set(freed)) == sorted({ACCOUNT, OTHER_ACCOUNT})
    assert await store.release_many(leases) == [False, False, False]
    assert await usage(store) == {"all-video": 0, "gen4.5": 0, "region-us": 0}
    assert await store.used(OTHER_ACCOUNT, "all-video") == 0
