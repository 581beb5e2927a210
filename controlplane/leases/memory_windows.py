"""The rate and budget windows of `MemoryLeaseStore`: the ACQUIRE script's window part in Python.

Same rules as the Redis store (`controlplane.leases.windows`); the caller holds the store's lock,
so a check and the take after it are one atomic step. Rolling entries are kept per account in
admission order (a dict keeps insertion order; a rebuild re-sorts), so trimming reads only the
entries that leave.
"""

from __future__ import annotations

from dataclasses import dataclass

from controlplane.leases.windows import (
    DAY,
    MINUTE,
    MONTH,
    WINDOWS,
    WindowEntry,
    WindowRefusal,
    WindowRequest,
    WindowUse,
    month_bounds_ms,
)

__all__ = ["MemoryWindows"]


@dataclass(frozen=True, slots=True)
class _Took:
    """What one acquire added (an unsent release gives exactly this back)."""

    minute: bool
    day: bool
    month: int | None  # the month's start, if its spend was added
    generations: int
    cost: int


class _Rolling:
    """One rolling window of one account: attempt -> (admitted at, weight), oldest first."""

    def __init__(self) -> None:
        self.entries: dict[str, tuple[int, int]] = {}
        self.total = 0

    def trim(self, cutoff: int) -> int:
        """Drop the entries admitted at or before `cutoff`; the weight left."""
        gone = []
        for attempt_id, (at, _) in self.entries.items():
            if at > cutoff:
                break
            gone.append(attempt_id)
        for attempt_id in gone:
            self.total -= self.entries.pop(attempt_id)[1]
        return self.total

    def add(self, attempt_id: str, at: int, weight: int) -> bool:
        if attempt_id in self.entries:
            return False
        last = next(reversed(self.entries.values()), None)
        self.entries[attempt_id] = (at, weight)
        self.total += weight
        if last is not None and at < last[0]:  # a rebuilt entry older than the newest
            self.entries = dict(sorted(self.entries.items(), key=lambda kv: kv[1][0]))
        return True

    def restamp(self, attempt_id: str, at: int) -> None:
        """Move a held entry to `at` (never back), keeping admission order."""
        at_before, weight = self.entries.pop(attempt_id)
        self.total -= weight
        self.add(attempt_id, max(at, at_before), weight)

    def remove(self, attempt_id: str) -> None:
        found = self.entries.pop(attempt_id, None)
        if found is not None:
            self.total -= found[1]

    def reopens_in(self, excess: int, span: int, now: int) -> int | None:
        dropped = 0
        for at, weight in self.entries.values():
            dropped += weight
            if dropped >= excess:
                return at + span - now
        return None


class MemoryWindows:
    """Every account's windows in this process."""

    def __init__(self) -> None:
        self.forget()

    def forget(self) -> None:
        """Lose everything, as a Redis flush does."""
        self._rolling: dict[tuple[str, str], _Rolling] = {}
        self._month: dict[tuple[str, int], dict[str, int]] = {}
        self._seen: dict[str, WindowRequest] = {}
        self._took: dict[tuple[str, str], _Took] = {}

    def _window(self, account: str, window: str) -> _Rolling:
        return self._rolling.setdefault((account, window), _Rolling())

    def _spend(self, account: str, now: int) -> tuple[dict[str, int], int, int]:
        start, end = month_bounds_ms(now)
        return self._month.setdefault((account, start), {}), start, end

    def admit(
        self, account: str, attempt_id: str, req: WindowRequest, now: int
    ) -> WindowRefusal | None:
        """The first full window (in `WINDOWS` order) refusing this attempt, or None."""
        self._seen[account] = req
        spend, _, end = self._spend(account, now)
        for window in WINDOWS:
            limit, take = req.limit(window), req.take(window)
            span = req.span_ms(window)
            if window == MONTH:
                used, counted = sum(spend.values()), attempt_id in spend
            else:
                assert span is not None
                rolling = self._window(account, window)
                used, counted = rolling.trim(now - span), attempt_id in rolling.entries
            if limit is None or counted or used + take <= limit:
                continue
            reopens: int | None = None
            if take <= limit:
                if window == MONTH:
                    reopens = end - now
                else:
                    assert span is not None
                    reopens = self._window(account, window).reopens_in(
                        used + take - limit, span, now
                    )
            return WindowRefusal(account, window, limit, used, take, reopens)
        return None

    def take(self, account: str, attempt_id: str, req: WindowRequest, now: int) -> None:
        """Count the admitted attempt in every window (once per attempt)."""
        spend, start, _ = self._spend(account, now)
        month = None
        if attempt_id not in spend:
            spend[attempt_id] = req.cost_micros
            month = start
        self._took[(account, attempt_id)] = _Took(
            self._window(account, MINUTE).add(attempt_id, now, 1),
            self._window(account, DAY).add(attempt_id, now, req.generations),
            month,
            req.generations,
            req.cost_micros,
        )

    def stamp(
        self, account: str, attempt_id: str, req: WindowRequest, now: int
    ) -> WindowRefusal | None:
        """Sent now: counted entries move to `now`, uncounted windows must have room again."""
        refusal = self.admit(account, attempt_id, req, now)
        if refusal is not None:
            return refusal
        spend, _, _ = self._spend(account, now)
        spend.setdefault(attempt_id, req.cost_micros)
        for window, weight in ((MINUTE, 1), (DAY, req.generations)):
            rolling = self._window(account, window)
            if attempt_id in rolling.entries:
                rolling.restamp(attempt_id, now)
            else:
                rolling.add(attempt_id, now, weight)
        return None

    def dropped(self, account: str, attempt_id: str, *, unsent: bool) -> None:
        """The lease ended; `unsent` gives back what its acquire added."""
        took = self._took.pop((account, attempt_id), None)
        if took is None or not unsent:
            return
        if took.minute:
            self._window(account, MINUTE).remove(attempt_id)
        if took.day:
            self._window(account, DAY).remove(attempt_id)
        if took.month is not None:
            self._month.get((account, took.month), {}).pop(attempt_id, None)

    def restore(self, account: str, entries: list[WindowEntry], now: int) -> None:
        """Count PostgreSQL's entries (each attempt once; the spend only for this month)."""
        spend, start, end = self._spend(account, now)
        for e in entries:
            self._window(account, MINUTE).add(e.attempt_id, e.at_ms, 1)
            self._window(account, DAY).add(e.attempt_id, e.at_ms, e.generations)
            if start <= e.at_ms < end:
                spend.setdefault(e.attempt_id, e.cost_micros)

    def usage(self, account: str, now: int) -> list[WindowUse]:
        """Each window's use now and the last seen limit."""
        seen = self._seen.get(account)
        out = []
        for window in WINDOWS:
            if window == MONTH:
                used = sum(self._spend(account, now)[0].values())
            else:
                rolling = self._window(account, window)
                span = None if seen is None else seen.span_ms(window)
                used = rolling.total if span is None else rolling.trim(now - span)
            out.append(WindowUse(window, used, None if seen is None else seen.limit(window)))
        return out
