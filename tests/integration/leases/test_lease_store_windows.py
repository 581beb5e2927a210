"""The lease stores' rate and budget windows (9.11), one behavioural suite for both stores.

The same `Backend` as the lease contract: the memory store on a hand-moved clock, Redis on its
server TIME (waited for with a deadline, never slept). Rolling spans are a few hundred ms here, as
the time factor makes them in a scaled run.
"""

from __future__ import annotations

import asyncio
import dataclasses
from datetime import UTC, datetime

import pytest
from redis.asyncio import Redis

from controlplane.leases import (
    Dimension,
    Lease,
    LeaseRequest,
    LeaseStore,
    MemoryLeaseStore,
    WindowEntry,
    WindowRefusal,
    WindowRequest,
    WindowUse,
    _lua,
)
from controlplane.leases.redis_store import RedisLeaseStore
from controlplane.leases.windows import DAY, MINUTE, MONTH, month_bounds_ms
from tests.integration.leases.test_lease_store_contract import (
    ACCOUNT,
    ALL_VIDEO,
    GEN45,
    LONG_TTL,
    Backend,
    FakeClock,
    backend,
    memory_backend,
    redis_backend,
    request_for,
    usage,
)

__all__ = ["backend", "memory_backend", "redis_backend"]

SPAN = 400  # ms: the minute and the day of this suite (scaled)
WIDE = (ALL_VIDEO,)  # room for 4, so only a window refuses


def windowed(
    attempt_id: str,
    dims: tuple[Dimension, ...] = WIDE,
    **limits: int,
) -> LeaseRequest:
    """A request carrying windows: `limits` are `WindowRequest` fields."""
    spans = {"minute_ms": SPAN, "day_ms": SPAN}
    return dataclasses.replace(
        request_for(attempt_id, dims), windows=WindowRequest(**(spans | limits))
    )


async def admit(store: LeaseStore, req: LeaseRequest) -> Lease | WindowRefusal | None:
    return (await store.admit_many([req]))[0]


async def used(store: LeaseStore) -> dict[str, int]:
    return {u.window: u.used for u in await store.window_usage(ACCOUNT)}


async def test_a_full_minute_refuses_with_the_window_and_its_reopening(backend: Backend) -> None:
    """The submit window admits its limit; the next acquire is refused naming the window, its
    numbers and when it reopens, touches no dimension, and is admitted once the span passed."""
    store = backend.store
    for i in range(2):
        assert isinstance(await admit(store, windowed(f"m{i}", submits_per_minute=2)), Lease)
    refused = await admit(store, windowed("m2", submits_per_minute=2))
    assert isinstance(refused, WindowRefusal)
    assert (refused.window, refused.limit, refused.used, refused.requested) == (MINUTE, 2, 2, 1)
    assert refused.reopens_in_ms is not None
    assert 0 < refused.reopens_in_ms <= SPAN
    assert await store.used(ACCOUNT, "all-video") == 2
    assert store.metrics.rejected_window == 1
    assert await store.acquire(windowed("m2", submits_per_minute=2)) is None  # plain: None
    await backend.advance(refused.reopens_in_ms)
    assert isinstance(await admit(store, windowed("m2", submits_per_minute=2)), Lease)


async def test_windows_and_dimensions_are_taken_together_or_not_at_all(backend: Backend) -> None:
    """A full dimension takes no window use, and a full window takes no slot."""
    store = backend.store
    for i in range(2):
        assert await store.acquire(windowed(f"g{i}", (GEN45,), submits_per_minute=5)) is not None
    assert await admit(store, windowed("g2", (GEN45,), submits_per_minute=5)) is None
    assert (await used(store))[MINUTE] == 2
    refused = await admit(store, windowed("w", (ALL_VIDEO,), submits_per_minute=2))
    assert isinstance(refused, WindowRefusal)  # the limit travels with the request
    assert await usage(store, (ALL_VIDEO, GEN45)) == {"all-video": 0, "gen4.5": 2}
    assert (await used(store))[MINUTE] == 2


async def test_generations_weigh_the_day_window_by_sample_count(backend: Backend) -> None:
    """A 2-sample attempt counts 2 generations; a 1-sample one still fits after it, another
    2-sample one does not."""
    store = backend.store
    assert await store.acquire(windowed("d0", generations_per_day=3, generations=2)) is not None
    refused = await admit(store, windowed("d1", generations_per_day=3, generations=2))
    assert isinstance(refused, WindowRefusal)
    assert (refused.window, refused.used, refused.requested) == (DAY, 2, 2)
    assert await store.acquire(windowed("d2", generations_per_day=3)) is not None
    assert (await used(store))[DAY] == 3


async def test_month_spend_refuses_past_the_budget_until_the_month_ends(backend: Backend) -> None:
    """Estimated cost sums per calendar month; a refusal reopens at the month's end, and an
    attempt dearer than the whole budget never fits."""
    store = backend.store
    assert await store.acquire(windowed("s0", spend_per_month_micros=1000, cost_micros=600))
    refused = await admit(store, windowed("s1", spend_per_month_micros=1000, cost_micros=500))
    assert isinstance(refused, WindowRefusal)
    assert (refused.window, refused.used, refused.requested) == (MONTH, 600, 500)
    now = await store.now_ms()
    assert refused.reopens_in_ms is not None
    assert abs(now + refused.reopens_in_ms - month_bounds_ms(now)[1]) < 5_000
    assert await store.acquire(windowed("s2", spend_per_month_micros=1000, cost_micros=400))
    never = await admit(store, windowed("s3", spend_per_month_micros=100, cost_micros=101))
    assert isinstance(never, WindowRefusal)
    assert never.reopens_in_ms is None
    assert await store.window_usage(ACCOUNT) == [
        WindowUse(MINUTE, 2, None),
        WindowUse(DAY, 2, None),
        WindowUse(MONTH, 1000, 100),
    ]


async def test_concurrent_acquires_never_pass_a_window(backend: Backend) -> None:
    """Twenty acquires at once against a submit limit of 3 are granted exactly 3."""
    store = backend.store
    wide = (dataclasses.replace(ALL_VIDEO, capacity=50),)
    got = await asyncio.gather(
        *(store.acquire(windowed(f"c{i}", wide, submits_per_minute=3)) for i in range(20))
    )
    assert sum(g is not None for g in got) == 3


async def test_a_batch_sees_the_window_its_earlier_requests_took(backend: Backend) -> None:
    """admit_many in order: the third of three requests under a limit of 2 is refused."""
    got = await backend.store.admit_many(
        [windowed(f"b{i}", submits_per_minute=2) for i in range(3)]
    )
    assert [type(g) for g in got] == [Lease, Lease, WindowRefusal]


async def test_an_attempt_is_counted_once_and_an_unsent_release_gives_its_use_back(
    backend: Backend,
) -> None:
    """The same attempt admitted again (a re-let lease) counts once; a release after a send
    keeps the use, a release of an unsent lease returns it."""
    store = backend.store
    sent = await store.acquire(windowed("a", submits_per_minute=2, cost_micros=7))
    assert sent is not None
    assert await store.release(sent)
    again = await store.acquire(windowed("a", submits_per_minute=2, cost_micros=7))
    assert again is not None
    assert await used(store) == {MINUTE: 1, DAY: 1, MONTH: 7}
    unsent = await store.acquire(windowed("b", submits_per_minute=2, cost_micros=5))
    assert unsent is not None
    assert await store.release_many([unsent], unsent=True) == [True]
    assert await used(store) == {MINUTE: 1, DAY: 1, MONTH: 7}
    assert await store.release_many([again], unsent=True) == [True]
    assert await used(store) == {MINUTE: 1, DAY: 1, MONTH: 7}  # added by its first acquire


async def test_a_weighted_entry_counts_once_per_attempt_and_goes_back_whole(
    backend: Backend,
) -> None:
    """A 3-sample attempt re-let with another sample count is still one entry of weight 3; its
    unsent release returns all 3 generations, and the window has room for them again."""
    store = backend.store
    first = await store.acquire(windowed("w", generations_per_day=4, generations=3))
    assert first is not None
    assert await store.release(first)
    again = await store.acquire(windowed("w", generations_per_day=4, generations=1))
    assert again is not None
    assert (await used(store))[DAY] == 3
    other = await store.acquire(windowed("o", generations_per_day=4, generations=2))
    assert other is None
    assert await store.release_many([again], unsent=True) == [True]
    assert (await used(store))[DAY] == 3  # its first acquire added them, not this one
    fresh = await store.acquire(windowed("f", generations_per_day=6, generations=3))
    assert fresh is not None
    assert await store.release_many([fresh], unsent=True) == [True]
    assert (await used(store))[DAY] == 3
    assert await store.acquire(windowed("o", generations_per_day=4, generations=1)) is not None


async def test_a_send_counts_from_when_it_leaves(backend: Backend) -> None:
    """stamp_send moves an admitted attempt's entry to the send, so the window stays closed a
    span from then; an attempt sent after its entry left the window needs room again."""
    store = backend.store
    assert await store.acquire(windowed("a", submits_per_minute=1)) is not None
    await backend.advance(SPAN // 2)
    assert await store.stamp_send(windowed("a", submits_per_minute=1)) is None
    await backend.advance(SPAN // 2 + 50)  # past the admission's span, not the send's
    refused = await admit(store, windowed("b", submits_per_minute=1))
    assert isinstance(refused, WindowRefusal)
    assert refused.reopens_in_ms is not None
    assert refused.reopens_in_ms <= SPAN // 2
    await backend.advance(refused.reopens_in_ms)
    assert await store.acquire(windowed("b", submits_per_minute=1)) is not None
    late = await store.stamp_send(windowed("a", submits_per_minute=1))
    assert isinstance(late, WindowRefusal)  # its entry is gone and b holds the minute
    assert (await used(store))[MINUTE] == 1
    assert await store.stamp_send(request_for("plain")) is None  # no windows: nothing to do


async def test_restore_after_a_loss_rebuilds_the_windows_once(backend: Backend) -> None:
    """A flushed account gets PostgreSQL's window entries back before it is live, each attempt
    once; a restore into a live account leaves its windows alone."""
    store = backend.build(fail_closed=True)
    await store.restore(ACCOUNT, [], ttl_ms=LONG_TTL, max_term_ms=600_000)
    assert await store.acquire(windowed("r0", submits_per_minute=2, cost_micros=3))
    await backend.flush()
    now = await store.now_ms()
    entries = [WindowEntry("r0", now - 10, 1, 3), WindowEntry("r1", now - 5, 2, 4)]
    await store.restore(ACCOUNT, [], ttl_ms=LONG_TTL, max_term_ms=600_000, windows=entries)
    await store.restore(ACCOUNT, [], ttl_ms=LONG_TTL, max_term_ms=600_000, windows=entries)
    refused = await admit(store, windowed("r2", submits_per_minute=2))
    assert isinstance(refused, WindowRefusal)
    assert refused.used == 2
    assert await used(store) == {MINUTE: 2, DAY: 3, MONTH: 7}
    await store.restore(
        ACCOUNT, [], ttl_ms=LONG_TTL, max_term_ms=600_000, windows=[WindowEntry("r9", now, 1, 1)]
    )
    assert (await used(store))[MINUTE] == 2


async def test_month_spend_starts_afresh_in_a_new_month() -> None:
    """The memory store on a clock moved across a month's end: last month's spend is gone."""
    clock = FakeClock()
    clock.now = month_bounds_ms(clock.now)[1] - 1_000
    store = MemoryLeaseStore(clock=clock)
    assert await store.acquire(windowed("x", spend_per_month_micros=10, cost_micros=10))
    assert isinstance(
        await admit(store, windowed("y", spend_per_month_micros=10, cost_micros=10)), WindowRefusal
    )
    clock.now += 1_000
    assert isinstance(
        await admit(store, windowed("y", spend_per_month_micros=10, cost_micros=10)), Lease
    )


def test_month_bounds_are_calendar_months_in_utc() -> None:
    """Bounds of an instant inside a leap February and of December's last millisecond."""
    feb = int(datetime(2028, 2, 29, 23, tzinfo=UTC).timestamp() * 1000)
    assert month_bounds_ms(feb) == (
        int(datetime(2028, 2, 1, tzinfo=UTC).timestamp()) * 1000,
        int(datetime(2028, 3, 1, tzinfo=UTC).timestamp()) * 1000,
    )
    jan = int(datetime(2027, 1, 1, tzinfo=UTC).timestamp()) * 1000
    assert month_bounds_ms(jan - 1) == (jan - 31 * 86_400_000, jan)


@pytest.mark.redis
async def test_the_scripts_month_bounds_match_python(redis_client: Redis) -> None:
    """The Lua civil-date arithmetic gives Python's bounds, month ends and leap years included."""
    probe = _lua._WINDOWS + "local s, e = month_bounds(tonumber(ARGV[1])) return {s, e}"
    instants = []
    for year in (1999, 2000, 2024, 2026, 2100):
        for month in range(1, 13):
            start = int(datetime(year, month, 1, tzinfo=UTC).timestamp()) * 1000
            instants += [start - 1, start, start + 1, start + 13 * 86_400_000]
    for at in instants:
        start, end = await redis_client.eval(probe, 0, at)
        assert (int(start), int(end)) == month_bounds_ms(at), at


@pytest.mark.redis
async def test_window_keys_share_the_account_hash_tag(
    redis_client: Redis, redis_namespace: str
) -> None:
    """The window zsets, their hash and the month's spend carry `{account}` like the leases."""
    store = RedisLeaseStore(redis_client, namespace=redis_namespace)
    assert await store.acquire(windowed("k", submits_per_minute=1, cost_micros=1))
    keys = sorted([key.decode() async for key in redis_client.scan_iter(f"{redis_namespace}*")])
    tagged = [key for key in keys if not key.endswith(":accounts")]
    assert any(k.startswith(f"{redis_namespace}spend:{{{ACCOUNT}}}:") for k in tagged)
    assert f"{redis_namespace}win:{{{ACCOUNT}}}:minute" in tagged
    assert all(f"{{{ACCOUNT}}}" in key for key in tagged)
