"""`HealthMonitor`: breakers and health windows fed by execution outcomes (9.13.3, 9.15).

The execution side reports every provider call through `record_outcome`; the monitor feeds
the process-local `BreakerRegistry` (9.15.4 "Pod 本地 breaker") and the EWMA `HealthWindows`
the scorer reads. Every breaker transition this replica causes, and every operator override,
is persisted to ``provider_health_events`` and published to the shared state so other replicas
adopt it on their next `sync` (mirrored transitions are not persisted again: the replica that
caused a transition owns its audit row).

Clock: wall-clock seconds, so OPEN-until instants mean the same thing on every replica.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from controlplane.domain.breaker import (
    BreakerKey,
    BreakerRegistry,
    BreakerState,
    BreakerTransition,
    CallOutcome,
    Operation,
    Permit,
)
from controlplane.domain.routing import Candidate, HealthView
from controlplane.domain.scoring import HealthWindows, Window
from controlplane.persistence.catalog_store import CatalogStore, HealthEvent
from controlplane.scheduling.shared_state import InProcessSharedState, SharedBreakerState

log = logging.getLogger(__name__)


def submit_key(candidate: Candidate) -> BreakerKey:
    """The breaker a new attempt on `candidate` must pass (SUBMIT operation)."""
    return BreakerKey(
        candidate.provider, candidate.account, candidate.region, candidate.model, Operation.SUBMIT
    )


@dataclass(frozen=True, slots=True)
class BreakerStatus:
    key: BreakerKey
    state: BreakerState
    forced: bool
    open_until: datetime | None


class HealthMonitor:
    """One per process; safe to call from any coroutine of the event loop that owns it."""

    def __init__(
        self,
        registry: BreakerRegistry,
        *,
        events: CatalogStore | None = None,
        shared: SharedBreakerState | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.registry = registry
        self._events = events
        self._shared = shared or InProcessSharedState()
        self._clock = clock
        self._windows: dict[str, HealthWindows] = {}
        self._forced: dict[BreakerKey, BreakerState] = {}
        self._applied: dict[BreakerKey, int] = {}
        self._account_ids: dict[tuple[str, str, str], int] = {}
        self.persist_failures = 0

    def set_account_ids(self, ids: Iterable[tuple[tuple[str, str, str], int]]) -> None:
        """(provider, account, region) -> provider_accounts.id, for health event rows."""
        self._account_ids.update(ids)

    # ---- the execution hook --------------------------------------------------------------

    async def record_outcome(
        self,
        key: BreakerKey,
        error_class: str | None,
        latency_s: float | None,
        *,
        cost_micros: int = 0,
        permit: Permit | None = None,
    ) -> BreakerTransition | None:
        """Feed one call result: `error_class` None is success, else a 9.9 class / FailureKind.

        In HALF_OPEN a result without a permit counts as a probe while probe slots are free.
        """
        outcome = CallOutcome(error_class, None if latency_s is None else latency_s * 1000)
        breaker = self.registry.get(key)
        transition = breaker.tick()
        await self._emit(transition)
        if permit is None and breaker.state is BreakerState.HALF_OPEN:
            admitted = breaker.try_acquire()
            permit = admitted if isinstance(admitted, Permit) else None
        result = breaker.record(outcome, permit)
        await self._emit(result)
        if key.operation is Operation.SUBMIT and not outcome.neutral and not outcome.succeeded:
            # A refused submit is a failed attempt of this candidate. Accepted submits are
            # counted when their generation ends (`observe_generation`), with its real duration.
            window = self._windows.setdefault(_candidate_id(key), HealthWindows())
            window.observe(False, None, cost_micros, self._clock())
        return result

    def observe_generation(
        self, key: BreakerKey, *, succeeded: bool, duration_s: float, cost_micros: int = 0
    ) -> None:
        """A provider job of this candidate ended: feeds success, latency and cost windows."""
        window = self._windows.setdefault(_candidate_id(key), HealthWindows())
        window.observe(succeeded, duration_s, cost_micros, self._clock())

    def admit(self, key: BreakerKey) -> Permit | None:
        """A permit for one call (HALF_OPEN probes are limited), or None while refused."""
        admitted = self.registry.try_acquire(key)
        return admitted if isinstance(admitted, Permit) else None

    # ---- what routing reads ----------------------------------------------------------------

    def open_reason(self, key: BreakerKey) -> str | None:
        """Why new work must not go to `key` (OPEN), else None; HALF_OPEN admits probes."""
        breaker = self.registry.get(key)
        breaker.tick()
        if breaker.state is not BreakerState.OPEN:
            return None
        until = breaker.open_until
        if until is None:
            return "breaker pinned OPEN by an operator"
        return f"breaker OPEN for {max(0.0, until - self._clock()):.0f} s more"

    def health_view(self, candidate_id: str) -> HealthView | None:
        windows = self._windows.get(candidate_id)
        if windows is None:
            return None
        now = self._clock()
        stats = windows.stats(Window.FIFTEEN_MINUTES, now)
        if stats.effective_samples < 1:
            stats = windows.stats(Window.ONE_DAY, now)
        return HealthView(stats.success_lower_bound, stats.effective_samples, stats.mean_latency_s)

    def statuses(self, provider: str | None = None) -> list[BreakerStatus]:
        out = []
        for key, state in sorted(self.registry.states().items(), key=lambda kv: str(kv[0])):
            if provider and key.provider != provider:
                continue
            until = self.registry.get(key).open_until
            out.append(
                BreakerStatus(
                    key,
                    state,
                    self._forced.get(key) is state,
                    datetime.fromtimestamp(until, UTC) if until is not None else None,
                )
            )
        return out

    # ---- operators and replicas ------------------------------------------------------------

    async def force(
        self, key: BreakerKey, state: BreakerState | None, reason: str
    ) -> BreakerStatus:
        """Pin OPEN, force CLOSED, or (None) release the override into HALF_OPEN probing."""
        if state is None:
            self._forced.pop(key, None)
            transition = self.registry.force(key, BreakerState.HALF_OPEN, f"released:{reason}")
        else:
            self._forced[key] = state
            transition = self.registry.force(key, state, reason)
        await self._emit(transition, forced=state is not None)
        return next(s for s in self.statuses() if s.key == key)

    async def sync(self) -> None:
        """Apply clock-driven transitions and adopt what other replicas published."""
        for transition in self.registry.tick():
            await self._emit(transition, publish=False)  # every replica times out alike
        for record in await self._shared.read_all():
            if record.version <= self._applied.get(record.key, 0):
                continue
            self._applied[record.key] = record.version
            breaker = self.registry.get(record.key)
            if record.forced:
                self._forced[record.key] = record.state
                breaker.force(record.state, f"remote:{record.reason}")
                continue
            if self._forced.pop(record.key, None) is not None:
                breaker.force(BreakerState.CLOSED, "remote:override_released")  # unpin first
            if record.state is BreakerState.OPEN and record.until is None:
                continue  # malformed: an unforced OPEN always carries its cooldown end
            breaker.apply_remote(record.state, record.until, record.reason)

    async def _emit(
        self, transition: BreakerTransition | None, *, publish: bool = True, forced: bool = False
    ) -> None:
        if transition is None:
            return
        log.info(
            "breaker %s: %s -> %s (%s)",
            transition.key,
            transition.old.value,
            transition.new.value,
            transition.reason,
        )
        if publish:
            until = self.registry.get(transition.key).open_until
            record = await self._shared.publish(
                transition.key, transition.new, until, forced, transition.reason
            )
            self._applied[transition.key] = record.version
        await self._persist([transition])

    async def _persist(self, transitions: Sequence[BreakerTransition]) -> None:
        if self._events is None:
            return
        rows = []
        for t in transitions:
            account_id = await self._account_id(t.key)
            if account_id is None:
                log.warning("breaker %s: unknown provider account; event not persisted", t.key)
                self.persist_failures += 1
                continue
            rows.append(
                HealthEvent(
                    account_id,
                    t.key.model or None,
                    t.key.operation.value,
                    t.old.value,
                    t.new.value,
                    t.reason,
                    {k: v for k, v in t.metrics.items()},
                    datetime.fromtimestamp(t.at, UTC),
                )
            )
        await self._events.record_health_events(rows)

    async def _account_id(self, key: BreakerKey) -> int | None:
        ident = (key.provider, key.account, key.region)
        if ident not in self._account_ids and self._events is not None:
            self.set_account_ids(
                ((a.provider, a.account_name, a.region), a.id)
                for a in await self._events.accounts()
            )
        return self._account_ids.get(ident)


def _candidate_id(key: BreakerKey) -> str:
    return f"{key.provider}/{key.model}/{key.account}"
