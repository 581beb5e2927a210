"""Rate and budget windows of a provider account, taken with its leases (design 9.11).

Concurrency comes back when an attempt ends; a window's use comes back only when time moves on.
Three windows per lease account, each checked and taken in the same atomic step as the lease's
dimensions (the ACQUIRE script; `MemoryLeaseStore` under its lock), all or nothing:

- `MINUTE` (``submits_per_minute``): admitted attempts in any rolling `minute_ms`;
- `DAY` (``generations_per_day``): generations admitted in any rolling `day_ms`. A generation is
  one admitted attempt, weighted by its ``sample_count`` (a Veo call asking for 2 samples renders
  2 videos and the provider counts both);
- `MONTH` (``spend_per_month``): estimated cost micros admitted in the calendar month (UTC) of the
  store's clock.

Counting rules shared by both stores:

- An entry is stamped with the store's clock at admission and keyed by the attempt id, so the
  same attempt admitted again (a re-let lease, a rebuild from PostgreSQL) is never counted twice.
- Right before the submit leaves, `stamp_send` moves its rolling entries to that instant (and a
  window that stopped counting it, its admission older than the span, must have room again):
  two sends admitted a span apart could otherwise land closer than the span at the provider when
  the first one waited longer for its worker. With the stamp, a window's check at admission holds
  at the provider as long as no attempt waits longer than a span between its admission and its
  send unstamped (the stamp comes first), which the stamp itself makes true.
- A rolling entry counts for its span plus `send_allowance_ms`: what remains between the stamp
  and the provider's clock (the sidecar's call, the network) differs from one send to the next.
- A lease released *unsent* (`release_many(..., unsent=True)`: the dispatcher's batch did not
  commit, so no attempt exists and nothing was sent) gives its window use back. Any other release
  keeps it: the submit happened, or may have.
- The month does not scale with the time factor (it is a calendar period, not a duration); the
  rolling spans do (`minute_ms`, `day_ms` and `send_allowance_ms` are configuration durations).

Pure: no I/O, no redis.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

__all__ = [
    "DAY",
    "MINUTE",
    "MONTH",
    "WINDOWS",
    "WindowEntry",
    "WindowRefusal",
    "WindowRequest",
    "WindowUse",
    "month_bounds_ms",
]

MINUTE = "submits_per_minute"
DAY = "generations_per_day"
MONTH = "spend_per_month"
WINDOWS = (MINUTE, DAY, MONTH)


@dataclass(frozen=True, slots=True)
class WindowRequest:
    """An account's window limits (None: not limited) and what one attempt takes of them.

    Like `Dimension.capacity`, the limits travel with every request, so a changed accounts
    document counts from the next acquire. A store records the use of all three windows whenever a
    request carries a `WindowRequest`, limited or not, so the use is visible before a limit is set.
    """

    submits_per_minute: int | None = None
    generations_per_day: int | None = None
    spend_per_month_micros: int | None = None
    generations: int = 1  # this attempt's weight in the day window (its sample_count)
    cost_micros: int = 0  # this attempt's estimated cost, added to the month's spend
    minute_ms: int = 60_000
    day_ms: int = 86_400_000
    send_allowance_ms: int = 0

    def __post_init__(self) -> None:
        for name in ("submits_per_minute", "generations_per_day", "spend_per_month_micros"):
            value = getattr(self, name)
            if value is not None and value < 0:
                raise ValueError(f"{name} must be >= 0 or None, got {value}")
        if self.generations < 1 or self.cost_micros < 0:
            raise ValueError("generations must be >= 1 and cost_micros >= 0")
        if self.minute_ms < 1 or self.day_ms < 1 or self.send_allowance_ms < 0:
            raise ValueError("window spans must be >= 1 ms and the send allowance >= 0")

    def limit(self, window: str) -> int | None:
        """The limit of `window` (one of `WINDOWS`)."""
        return {
            MINUTE: self.submits_per_minute,
            DAY: self.generations_per_day,
            MONTH: self.spend_per_month_micros,
        }[window]

    def take(self, window: str) -> int:
        """What this attempt adds to `window`."""
        return {MINUTE: 1, DAY: self.generations, MONTH: self.cost_micros}[window]

    def span_ms(self, window: str) -> int | None:
        """How long a rolling entry counts (span + send allowance); None for the month."""
        if window == MINUTE:
            return self.minute_ms + self.send_allowance_ms
        if window == DAY:
            return self.day_ms + self.send_allowance_ms
        return None

    def encode(self) -> list[int]:
        """The ACQUIRE script's form: limits (-1 = none), takes, spans."""
        return [
            *(-1 if (v := self.limit(w)) is None else v for w in WINDOWS),
            self.generations,
            self.cost_micros,
            self.minute_ms + self.send_allowance_ms,
            self.day_ms + self.send_allowance_ms,
        ]


@dataclass(frozen=True, slots=True)
class WindowRefusal:
    """An acquire refused because a window of the account is full.

    `reopens_in_ms` is how long (store clock) until the window could take this request: the
    oldest entries leaving a rolling window, or the next month; None when it never can (the
    request alone is over the limit).
    """

    account: str
    window: str
    limit: int
    used: int
    requested: int
    reopens_in_ms: int | None

    def describe(self) -> str:
        """One line for a routing verdict: the window, the numbers and the reopening."""
        when = "never (the request alone is over it)"
        if self.reopens_in_ms is not None:
            when = f"in {self.reopens_in_ms} ms"
        return (
            f"{self.window} window full: {self.used} used + {self.requested} requested > "
            f"limit {self.limit}; reopens {when}"
        )


@dataclass(frozen=True, slots=True)
class WindowUse:
    """One window's current use in an account, and the limit the last acquire carried."""

    window: str
    used: int
    limit: int | None


@dataclass(frozen=True, slots=True)
class WindowEntry:
    """What PostgreSQL says an attempt took of its account's windows, to rebuild them after the
    store lost its data: stamped `at_ms` (wall-clock ms: its send, else its admission)."""

    attempt_id: str
    at_ms: int
    generations: int = 1
    cost_micros: int = 0


def month_bounds_ms(now_ms: int) -> tuple[int, int]:
    """[start, end) of the calendar month (UTC) holding `now_ms`, in ms since the epoch.

    The ACQUIRE script computes the same bounds from the server clock (`_lua.MONTH_BOUNDS`).
    """
    at = _EPOCH + timedelta(milliseconds=now_ms)  # exact: no float seconds near a boundary
    start = datetime(at.year, at.month, 1, tzinfo=UTC)
    end = datetime(at.year + at.month // 12, at.month % 12 + 1, 1, tzinfo=UTC)
    return _ms(start), _ms(end)


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def _ms(at: datetime) -> int:
    return (at - _EPOCH) // timedelta(milliseconds=1)
