"""Parked capacity waits (design 9.12): a NO_CAPACITY task waits without being routed again.

A round that finds no capacity for a task parks it with what it waits for: the lease accounts
whose candidates were full (a release or an expiry there may free a slot), the candidates whose
breaker refused (a close or a free probe slot admits it), the instant a retry backoff ends, the
instant the earliest full rate or budget window of its candidates reopens (`reopens`, 9.11; a
release does not reopen a window, so those candidates are not among the full ones), and the
catalog version it was routed against. Until one of those changes the fair queue passes the
task over: no routing, no compile call, no decision row, no event (WatchTask is not flooded).

Wakes come from the code paths that change the facts, in process (`freed` from the lease
store's `on_freed`, `breaker_moved` from the health monitor, `catalog_changed` from a catalog
reload), and from each round's own reads as the safety net: a round reads capacity and breaker
refusals once anyway, and `wake_changed` wakes every parked task whose waits read differently
now (so a release in another process, or an expiry the store reclaimed, is seen in the next
round at the latest), plus `recheck_s`, after which a parked task is routed again whatever.

`outcome(task)` remembers the signature of the last decision stored for each task, so a woken
task that finds the same NO_CAPACITY again writes nothing (one decision row per distinct
outcome). Pure bookkeeping: no I/O, one instance per dispatcher.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime

__all__ = ["Park", "Parking", "Signature"]

Signature = tuple[str, tuple[tuple[str, str], ...]]
"""A decision's outcome and every candidate's (id, reason): what 'the same outcome' means."""


@dataclass(frozen=True, slots=True)
class Park:
    """What one parked task waits for."""

    accounts: frozenset[str]  # lease accounts of the full candidates
    full: frozenset[str]  # candidate ids that had no free slot
    breakers: frozenset[str]  # candidate ids whose breaker refused
    catalog_version: str
    not_after: float  # monotonic seconds: routed again by then whatever (the safety net)
    until: datetime | None = None  # a retry backoff's end (RETRY_BACKOFF), if any
    reopens: float | None = None  # monotonic seconds: the earliest window reopening, if any


class Parking:
    """The parked tasks of one dispatcher and the last stored outcome of each task."""

    def __init__(self, clock: Callable[[], float], *, recheck_s: float, limit: int = 200_000):
        self._clock, self.recheck_s, self._limit = clock, recheck_s, limit
        self._parked: dict[int, Park] = {}
        self._by_account: dict[str, set[int]] = {}
        self._by_full: dict[str, set[int]] = {}
        self._by_breaker: dict[str, set[int]] = {}
        self._outcomes: dict[int, Signature] = {}
        self.woken = 0

    def __len__(self) -> int:
        return len(self._parked)

    def __contains__(self, task_id: object) -> bool:
        return task_id in self._parked

    def park(
        self,
        task_id: int,
        *,
        accounts: Iterable[str],
        full: Iterable[str],
        breakers: Iterable[str],
        catalog_version: str,
        until: datetime | None = None,
        reopens: float | None = None,
    ) -> None:
        self.unpark(task_id)
        entry = Park(
            frozenset(accounts),
            frozenset(full),
            frozenset(breakers),
            catalog_version,
            self._clock() + self.recheck_s,
            until,
            reopens,
        )
        self._parked[task_id] = entry
        for a in entry.accounts:
            self._by_account.setdefault(a, set()).add(task_id)
        for c in entry.full:
            self._by_full.setdefault(c, set()).add(task_id)
        for b in entry.breakers:
            self._by_breaker.setdefault(b, set()).add(task_id)

    def unpark(self, task_id: int) -> bool:
        entry = self._parked.pop(task_id, None)
        if entry is None:
            return False
        for index, keys in (
            (self._by_account, entry.accounts),
            (self._by_full, entry.full),
            (self._by_breaker, entry.breakers),
        ):
            for k in keys:
                if (ids := index.get(k)) is not None:
                    ids.discard(task_id)
                    if not ids:
                        del index[k]
        return True

    def waiting(self, task_id: int, now: datetime) -> bool:
        """Whether the round passes the task over (parked, and nothing it waits for is due)."""
        entry = self._parked.get(task_id)
        if entry is None:
            return False
        mono = self._clock()
        if (
            mono >= entry.not_after
            or (entry.until is not None and now >= entry.until)
            or (entry.reopens is not None and mono >= entry.reopens)
        ):
            self.unpark(task_id)
            self.woken += 1
            return False
        return True

    # ---- wakes ----------------------------------------------------------------------------

    def freed(self, account: str) -> int:
        """Slots came back in `account`: wake the tasks that waited for it."""
        return self._wake(list(self._by_account.get(account, ())))

    def breaker_moved(self, candidate_id: str) -> int:
        """A breaker of `candidate_id` closed or admits probes again."""
        return self._wake(list(self._by_breaker.get(candidate_id, ())))

    def catalog_changed(self, version: str) -> int:
        """A new catalog: every task parked under another version is routed again."""
        return self._wake([t for t, e in self._parked.items() if e.catalog_version != version])

    def wake_changed(
        self, has_room: Callable[[str], bool], refusing: Mapping[str, str], catalog_version: str
    ) -> int:
        """The round's reads: wake the tasks one of whose full candidates `has_room` now, whose
        refusing breakers refuse no more, or that were parked under another catalog."""
        woken = 0
        for cid in [c for c in self._by_full if has_room(c)]:
            woken += self._wake(list(self._by_full.get(cid, ())))
        for cid in [b for b in self._by_breaker if b not in refusing]:
            woken += self.breaker_moved(cid)
        return woken + self.catalog_changed(catalog_version)

    def _wake(self, task_ids: list[int]) -> int:
        for t in task_ids:
            self.unpark(t)
        self.woken += len(task_ids)
        return len(task_ids)

    # ---- outcomes ---------------------------------------------------------------------------

    @property
    def remembered(self) -> int:
        """How many tasks' last outcomes are kept (at most the limit)."""
        return len(self._outcomes)

    def outcome(self, task_id: int) -> Signature | None:
        """The signature of the last decision stored for the task by this dispatcher."""
        return self._outcomes.get(task_id)

    def stored(self, task_id: int, signature: Signature) -> None:
        if len(self._outcomes) >= self._limit:  # bounded: forget the oldest half
            for t in list(self._outcomes)[: self._limit // 2]:
                del self._outcomes[t]
        self._outcomes[task_id] = signature

    def done(self, task_id: int) -> None:
        """The task left the queue (an attempt, a failure): forget it."""
        self.unpark(task_id)
        self._outcomes.pop(task_id, None)
