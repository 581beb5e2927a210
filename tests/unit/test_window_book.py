"""The dispatcher's book of full rate and budget windows (controlplane.scheduling.windows):
closures, their explain detail, and the windows a lease request carries."""

from __future__ import annotations

from datetime import UTC, datetime

from controlplane.domain.accounts import AccountLimits
from controlplane.leases import Dimension, LeaseRequest, MemoryLeaseStore
from controlplane.leases.windows import DAY, MINUTE, MONTH, WindowRefusal, WindowRequest
from controlplane.scheduling.dispatcher import DispatcherConfig
from controlplane.scheduling.windows import (
    WindowBook,
    account_windows,
    full_window,
    window_request,
)
from vidroute_core.timescale import scale_durations

WALL = datetime(2026, 6, 24, 10, 0, tzinfo=UTC)


class Clock:
    def __init__(self) -> None:
        self.now = 500.0

    def __call__(self) -> float:
        return self.now


def test_a_refusal_closes_its_account_until_the_reopening() -> None:
    """The closure lasts until the store's reopening and its detail names the window, the
    numbers and the wall-clock reopening; it is dropped once over."""
    clock = Clock()
    book = WindowBook(clock, lambda: WALL, recheck_s=30.0)
    closure = book.refused(WindowRefusal("runway:prod-us", MINUTE, 5, 5, 1, 1_500))
    assert closure.until == 501.5
    assert closure.detail == (
        "submits_per_minute window full: 5 used + 1 requested > limit 5; reopens at "
        "2026-06-24T10:00:01.500+00:00 (in 1500 ms)"
    )
    assert full_window(closure.detail) == MINUTE
    assert book.until("runway:prod-us") == 501.5
    assert set(book.closed()) == {"runway:prod-us"}
    clock.now = 501.5
    assert book.closed() == {}
    assert book.until("runway:prod-us") is None


def test_a_month_or_a_never_closure_is_capped_at_the_recheck() -> None:
    """A spend window reopening in weeks, or a request over the limit alone, closes the
    account for the park recheck only: a cheaper attempt may fit and only the store knows."""
    clock = Clock()
    book = WindowBook(clock, lambda: WALL, recheck_s=30.0)
    month = book.refused(WindowRefusal("veo:a", MONTH, 100, 90, 20, 20 * 86_400_000))
    assert month.until == 530.0
    never = book.refused(WindowRefusal("veo:b", DAY, 1, 0, 2, None))
    assert never.until == 530.0
    assert "reopens never" in never.detail


def test_full_window_tells_a_window_wait_from_a_slot_wait() -> None:
    """Only a window refusal's detail names a window; a full slot's does not."""
    assert full_window("generations_per_day window full: 3 used") == DAY
    assert full_window("0 of 2 slots free") == ""
    assert full_window("lease refused at acquire") == ""


def test_a_lease_request_carries_windows_only_when_the_account_limits_any() -> None:
    """No limit: no windows (nothing recorded); any limit: all three, with this attempt's take."""
    spans = {"minute_ms": 3_000, "day_ms": 4_320_000, "send_allowance_ms": 250}
    assert window_request(AccountLimits(), generations=2, cost_micros=9, **spans) is None
    got = window_request(
        AccountLimits(spend_per_month_micros=1_000), generations=0, cost_micros=9, **spans
    )
    assert got == WindowRequest(
        spend_per_month_micros=1_000,
        generations=1,
        cost_micros=9,
        minute_ms=3_000,
        day_ms=4_320_000,
        send_allowance_ms=250,
    )
    assert got.span_ms(MINUTE) == 3_250


def test_the_rolling_spans_scale_with_the_time_factor() -> None:
    """A scaled run's minute, day and send allowance are the production ones times the factor."""
    cfg = scale_durations(DispatcherConfig(), 0.05)
    assert (cfg.window_minute_ms, cfg.window_day_ms, cfg.window_send_allowance_ms) == (
        3_000,
        4_320_000,
        250,
    )


async def test_account_windows_reads_the_accounts_lease_scope() -> None:
    """The usage read takes (provider, account) and finds what the dispatcher's leases took."""
    store = MemoryLeaseStore()
    windows = WindowRequest(generations_per_day=10, generations=2)
    lease = await store.acquire(
        LeaseRequest("a", "runway:prod-us", (Dimension("account", 2),), windows=windows)
    )
    assert lease is not None
    uses = await account_windows(store, "runway", "prod-us")
    assert [(u.window, u.used, u.limit) for u in uses] == [
        (MINUTE, 1, None),
        (DAY, 2, 10),
        (MONTH, 0, None),
    ]
