"""The dispatcher's side of the rate and budget windows (design 9.11; `leases.windows`).

The lease store judges a window (atomically with the dimensions, in ACQUIRE); this module keeps
what the dispatcher learns from its refusals, so that a closed window is routed around and waited
for instead of asked again every round:

- `window_request`: the windows a lease request carries for a candidate's account, from the
  narrow `LimitsFor` the composition root gives the dispatcher (default `no_limits`: no window
  at all, nothing recorded, the hot path as before);
- `WindowBook`: per lease account, the window that refused last and until when it stays closed to
  this dispatcher. A closed account's candidates read as NO_CAPACITY whose detail names the
  window, its numbers and its reopening (explain shows it); a task with nothing else to wait for
  is parked until the earliest reopening (`Parking`, a monotonic instant, and a timer wakes the
  dispatcher then). A closure lasts at most `recheck_s`: the month's spend reopens only at the
  month's end, but a cheaper attempt may still fit, and only the store can say so.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta

from controlplane.domain.accounts import AccountLimits
from controlplane.leases.base import LeaseStore
from controlplane.leases.windows import WINDOWS, WindowRefusal, WindowRequest, WindowUse

__all__ = [
    "Closure",
    "LimitsFor",
    "WindowBook",
    "account_windows",
    "full_window",
    "no_limits",
    "window_request",
]

LimitsFor = Callable[[str, str], AccountLimits]
"""(provider, account) -> that provider account's limits (the accounts document's reader)."""

_NONE = AccountLimits()
_FULL = " window full: "


def full_window(detail: str) -> str:
    """The window a NO_CAPACITY verdict's detail says is full ("" for any other wait), so that
    a wait that turns from a full slot into a full window is a new outcome (a new decision)."""
    window, sep, _ = detail.partition(_FULL)
    return window if sep and window in WINDOWS else ""


def no_limits(provider: str, account: str) -> AccountLimits:
    """The default lookup: no account has a window limit."""
    return _NONE


async def account_windows(leases: LeaseStore, provider: str, account: str) -> list[WindowUse]:
    """A provider account's window use now and the limits its last acquire carried: the read
    an accounts usage RPC or page shows beside its limits (the store's lease account scope is
    ``provider:account``, as `Candidate.lease_account` names it)."""
    return await leases.window_usage(f"{provider}:{account}")


def window_request(
    limits: AccountLimits,
    *,
    generations: int,
    cost_micros: int,
    minute_ms: int,
    day_ms: int,
    send_allowance_ms: int,
) -> WindowRequest | None:
    """The windows of one attempt, or None when its account limits none of them."""
    if (
        limits.submits_per_minute is None
        and limits.generations_per_day is None
        and limits.spend_per_month_micros is None
    ):
        return None
    return WindowRequest(
        submits_per_minute=limits.submits_per_minute,
        generations_per_day=limits.generations_per_day,
        spend_per_month_micros=limits.spend_per_month_micros,
        generations=max(1, generations),
        cost_micros=max(0, cost_micros),
        minute_ms=minute_ms,
        day_ms=day_ms,
        send_allowance_ms=send_allowance_ms,
    )


@dataclass(frozen=True, slots=True)
class Closure:
    """A window that refused in an account: until when (monotonic s) it is closed here, why."""

    until: float
    detail: str
    refusal: WindowRefusal


class WindowBook:
    """The accounts whose windows refused lately, as this dispatcher saw them."""

    def __init__(
        self,
        monotonic: Callable[[], float],
        wall: Callable[[], datetime],
        *,
        recheck_s: float,
    ) -> None:
        self._monotonic, self._wall, self.recheck_s = monotonic, wall, recheck_s
        self._closed: dict[str, Closure] = {}

    def refused(self, refusal: WindowRefusal) -> Closure:
        """Record a store refusal; the closure it implies (the reopening, capped at recheck)."""
        wait_s = self.recheck_s
        if refusal.reopens_in_ms is None:
            when = "never for this request (it alone is over the limit)"
        else:
            reopens_s = refusal.reopens_in_ms / 1000
            wait_s = min(wait_s, reopens_s)
            at = self._wall() + timedelta(seconds=reopens_s)
            when = f"at {at.isoformat(timespec='milliseconds')} (in {refusal.reopens_in_ms} ms)"
        detail = (
            f"{refusal.window}{_FULL}{refusal.used} used + {refusal.requested} requested"
            f" > limit {refusal.limit}; reopens {when}"
        )
        closure = Closure(self._monotonic() + wait_s, detail, refusal)
        self._closed[refusal.account] = closure
        return closure

    def closed(self) -> Mapping[str, Closure]:
        """The accounts still closed now (the expired closures are dropped)."""
        now = self._monotonic()
        for account in [a for a, c in self._closed.items() if c.until <= now]:
            del self._closed[account]
        return dict(self._closed)

    def until(self, account: str) -> float | None:
        """When `account`'s closure ends (monotonic s), if it is closed now."""
        closure = self._closed.get(account)
        if closure is None or closure.until <= self._monotonic():
            return None
        return closure.until
