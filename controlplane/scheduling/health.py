"""`HealthMonitor`: breakers and health windows fed by execution outcomes (9.13.3, 9.15).

The execution side reports every provider call through `record_outcome`; the monitor feeds
the process-local `BreakerRegistry` (9.15.4 "Pod 本地 breaker") and the EWMA `HealthWindows`
the scorer reads. Every breaker transition this replica causes, and every operator override,
is persisted to ``provider_health_events`` and published to the shared state so other replicas
adopt it on their next `sync` (mirrored transitions are not persisted again: the replica that
caused a transition owns its audit row).

Admission (9.15.2): every call asks `admit` with a holder (the attempt's client request key for
a submit, the worker's call id otherwise). CLOSED admits; OPEN refuses; HALF_OPEN admits at
most ``half_open_max_probes`` holders across all replicas (the shared probe ledger), and only
those holders' results, reported through `record_outcome(..., holder=...)`, decide whether the
breaker closes or reopens. A submit must also pass its account's breaker (`account_key`),
which AUTH / PERMISSION / a misconfigured account open at once (9.9.1 `disables_account`).

Health windows and incumbents are shared too (scale-out): each observation this replica makes
is appended to the shared state (a Redis stream) and every replica folds the others' into its
own windows on `sync`, so all replicas score a candidate on the same samples, and a replica that
starts or takes over a shard rebuilds them from the stream instead of starting blind. The routing
groups' incumbents (`incumbents`, what hysteresis keeps) are a shared hash the same way. Losing
Redis loses only this acceleration: each replica goes on with what it has seen itself.

Clock: wall-clock seconds, so OPEN-until instants mean the same thing on every replica.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import secrets
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TypeVar

from controlplane.domain.baselines import (
    JUDGED_OPERATIONS,
    BaselineKey,
    CallBaselines,
    judge_call,
)
from controlplane.domain.breaker import (
    DISABLES_ACCOUNT,
    BreakerKey,
    BreakerRegistry,
    BreakerState,
    BreakerTransition,
    CallOutcome,
    CircuitBreaker,
    Operation,
    Permit,
    account_key,
    open_detail,
)
from controlplane.domain.polling import DurationEvidence
from controlplane.domain.routing.candidates import BurstView, Candidate, HealthView, Incumbent
from controlplane.domain.scoring import HealthWindows, Window, WindowStats, routing_success
from controlplane.domain.unit_cost import observed_cost
from controlplane.persistence.catalog import CatalogQueries, HealthEvent
from controlplane.persistence.database import Database
from controlplane.scheduling.shared_state import (
    InProcessSharedState,
    Observation,
    ProbeFinish,
    SharedBreakerState,
    SharedRecord,
)

T = TypeVar("T")
Baselines = tuple[tuple[str, float], ...]

REBUILD_RETRY_S = 30.0  # a failed rebuild of the windows from PostgreSQL is tried again after

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


Group = tuple[str, str, str]  # a routing group: (tenant, service class, mode)


class SharedIncumbents(dict[Group, Incumbent]):
    """The dispatcher's incumbents; a new one is also written to the shared state, and `sync`
    merges what other replicas wrote (the later `since_s` wins)."""

    def __init__(self, share: Callable[[str, Incumbent], None]) -> None:
        super().__init__()
        self._share = share  # writes one to the shared state, in the background (the monitor)

    def __setitem__(self, group: Group, incumbent: Incumbent) -> None:
        super().__setitem__(group, incumbent)
        self._share(json.dumps(list(group), separators=(",", ":")), incumbent)

    def merge(self, shared: dict[str, tuple[str, float]]) -> None:
        for raw, (cid, since) in shared.items():
            tenant, service_class, mode = json.loads(raw)
            group = (str(tenant), str(service_class), str(mode))
            mine = self.get(group)
            if mine is None or since > mine.since_s:
                super().__setitem__(group, Incumbent(cid, since))


class HealthMonitor:
    """One per process; safe to call from any coroutine of the event loop that owns it."""

    def __init__(
        self,
        registry: BreakerRegistry,
        *,
        db: Database | None = None,
        shared: SharedBreakerState | None = None,
        clock: Callable[[], float] = time.time,
        on_transition: Callable[[BreakerTransition], None] | None = None,
        on_recovered: Callable[[BreakerKey], None] | None = None,
    ) -> None:
        """`on_transition` is told every breaker transition here (e.g. the metrics);
        `on_recovered` the key whenever a breaker closes or goes HALF_OPEN here (the
        dispatchers' wake for the tasks parked on it)."""
        self.registry = registry
        self._db = db
        self._shared = shared or InProcessSharedState()
        self._clock = clock
        self._windows: dict[str, HealthWindows] = {}
        # Call latencies per (provider, model, operation): the slow-call baselines (9.15.1).
        self.baselines = CallBaselines()
        self._forced: dict[BreakerKey, BreakerState] = {}
        self._applied: dict[BreakerKey, int] = {}
        self._account_ids: dict[tuple[str, str, str], int] = {}
        self.persist_failures = 0
        self._on_transition = on_transition
        self._on_recovered = on_recovered
        self.origin = secrets.token_hex(8)  # this replica, on the observations it shares
        self.incumbents = SharedIncumbents(self._share_incumbent)
        self._unsent: list[Observation] = []
        self._flushing: asyncio.Task[None] | None = None
        self._cursor: str | None = None  # the shared observations read so far
        self.windows_sync_s = 1.0
        self.incumbents_sync_s = 30.0
        self._windows_read_at = self._incumbents_read_at = -float("inf")
        # The windows are rebuilt from PostgreSQL's finished jobs before the first sync (24 h
        # and 7 d survive a restart); shared generation observations up to then are in it.
        self._rebuild_due = db is not None
        self._rebuild_retry_at = -float("inf")
        self._rebuilt_until = -float("inf")
        self._pending: set[asyncio.Task[None]] = set()
        # `_call_signals`' reads of this second (explain only); any breaker move clears them.
        self._signals: dict[str, tuple[Baselines, str]] = {}
        self._signals_at = -float("inf")
        self._opened: dict[BreakerKey, str] = {}
        self._regions: dict[tuple[str, str], str] = {}

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
        holder: str | None = None,
        permit: Permit | None = None,
    ) -> BreakerTransition | None:
        """Feed one call result: `error_class` None is success, else a 9.9 class / FailureKind.

        `holder` is the one `admit` was given: in HALF_OPEN only the admitted probes' results
        count. A disabling error (AUTH, PERMISSION) opens the account's breaker at once. A
        successful call slower than 4x its baseline reaches `key`'s breaker as
        TIMEOUT_OVER_BASELINE (`baselines.judge_call`); its account and the health windows
        hear what it was (a slow accepted submit is still an accepted submit).
        """
        outcome = CallOutcome(error_class, None if latency_s is None else latency_s * 1000)
        if key.operation is Operation.SUBMIT or error_class in DISABLES_ACCOUNT:
            await self._record_account(account_key(key), outcome, holder)
        judged, baseline = self._judged(key, outcome)
        result = await self._record_one(key, judged, holder, permit, baseline)
        if key.operation is Operation.SUBMIT and not outcome.neutral and not outcome.succeeded:
            # A refused submit is a failed attempt of this candidate. Accepted submits are
            # counted when their generation ends (`observe_generation`), with its real duration.
            self._observe(_candidate_id(key), False, None, cost_micros)
        return result

    async def record_outcomes(
        self, key: BreakerKey, outcomes: Sequence[tuple[str | None, float | None, str | None]]
    ) -> list[BreakerTransition | None]:
        """`record_outcome` for each (error_class, latency_s, holder) of `key`, in order: the
        bulk form a dispatch round's Compile calls report with (one key per candidate).

        The single form reads the shared state before each outcome (a Redis round trip per
        Compile call with `RedisSharedState`); here it is read once for a run of outcomes while
        the breaker stays CLOSED and no outcome moved it, and again, as the single form would,
        after a transition or while the breaker is not CLOSED. A SUBMIT key or a disabling
        error (which involve the account's breaker) takes the single form."""
        out: list[BreakerTransition | None] = []
        breaker: CircuitBreaker | None = None
        for error_class, latency_s, holder in outcomes:
            if key.operation is Operation.SUBMIT or error_class in DISABLES_ACCOUNT:
                out.append(await self.record_outcome(key, error_class, latency_s, holder=holder))
                breaker = None
                continue
            outcome = CallOutcome(error_class, None if latency_s is None else latency_s * 1000)
            judged, baseline = self._judged(key, outcome)
            if breaker is None or breaker.state is not BreakerState.CLOSED:
                breaker = await self._fresh(key)
            result = await self._record_on(breaker, judged, holder, None, baseline)
            if result is not None:
                breaker = None
            out.append(result)
        return out

    def _judged(self, key: BreakerKey, outcome: CallOutcome) -> tuple[CallOutcome, float | None]:
        """`outcome` against its baseline as it was before this call, and that baseline; a
        successful call then joins the baseline's window."""
        at = self._clock()
        held = BaselineKey(key.provider, key.model, key.operation)
        config = self.registry.get(key).config
        baseline = self.baselines.baseline_s(held, at, config)
        judged = judge_call(outcome, key.operation, baseline, config)
        if (
            outcome.succeeded
            and outcome.latency_ms is not None
            and key.operation in JUDGED_OPERATIONS
        ):
            self.baselines.observe(held, outcome.latency_ms / 1000.0, at)
        return judged, baseline

    def baseline_s(self, key: BreakerKey) -> float | None:
        """The learned call-latency baseline of `key`'s (provider, model, operation), or None
        before it has enough calls (the console, tests)."""
        baseline = BaselineKey(key.provider, key.model, key.operation)
        return self.baselines.baseline_s(baseline, self._clock(), self.registry.get(key).config)

    def observe_generation(
        self, key: BreakerKey, *, succeeded: bool, duration_s: float, cost_micros: int = 0
    ) -> None:
        """A provider job of this candidate ended: feeds success, latency and cost windows."""
        self._observe(_candidate_id(key), succeeded, duration_s, cost_micros)

    def _observe(
        self, candidate_id: str, succeeded: bool, latency_s: float | None, cost_micros: int
    ) -> None:
        at = self._clock()
        window = self._windows.setdefault(candidate_id, HealthWindows())
        window.observe(succeeded, latency_s, cost_micros, at)
        self._unsent.append(
            Observation(candidate_id, succeeded, latency_s, cost_micros, at, self.origin)
        )
        del self._unsent[:-10_000]  # bounded while the shared state is away
        if self._flushing is None or self._flushing.done():
            try:
                self._flushing = asyncio.get_running_loop().create_task(self.flush_observations())
            except RuntimeError:  # no loop (a synchronous caller): the next `sync` sends them
                self._flushing = None

    async def flush_observations(self) -> None:
        """Send this replica's new observations to the shared state (kept for later on failure)."""
        while self._unsent:
            batch, self._unsent = self._unsent, []
            try:
                await self._shared.add_observations(batch)
            except Exception:
                self._unsent[:0] = batch[-10_000:]
                log.warning("health observations not shared (kept for later)", exc_info=True)
                return

    async def sync_windows(self, *, force: bool = False) -> int:
        """Fold the other replicas' new observations into the windows; returns how many.

        Every dispatch round asks; the shared state is read at most every `windows_sync_s`
        (observations) and `incumbents_sync_s` (the incumbents hash, which only a shard's new
        leader needs) unless `force`."""
        now = time.monotonic()
        if not force and now - self._windows_read_at < self.windows_sync_s:
            return 0
        self._windows_read_at = now
        await self._rebuild_from_history(now)
        await self.flush_observations()
        folded = 0
        try:
            while True:
                batch, self._cursor = await self._shared.read_observations(self._cursor)
                for o in batch:
                    if o.origin != self.origin and not self._in_history(o):
                        window = self._windows.setdefault(o.candidate_id, HealthWindows())
                        window.observe(o.succeeded, o.latency_s, o.cost_micros, o.at)
                        folded += 1
                if len(batch) < 10_000:
                    break
            if force or now - self._incumbents_read_at >= self.incumbents_sync_s:
                self._incumbents_read_at = now
                self.incumbents.merge(await self._shared.read_incumbents())
        except Exception:
            log.warning("shared health windows not read; using this replica's", exc_info=True)
        return folded

    async def _rebuild_from_history(self, now: float) -> None:
        """Once, before the first read of the shared observations: every provider job that
        ended in the last 7 days, from PostgreSQL, folded into the windows at its own time
        (as `observe_generation` would have), so a restarted control plane routes on the
        24-hour and 7-day windows it had, whatever the shared stream still holds. A failed
        read is retried after `REBUILD_RETRY_S`; routing goes on meanwhile."""
        if not self._rebuild_due or now < self._rebuild_retry_at or self._db is None:
            return
        until = self._clock()
        since = datetime.fromtimestamp(until - Window.SEVEN_DAYS.seconds, UTC)
        windows: dict[str, HealthWindows] = {}
        after, jobs = None, 0
        queries = CatalogQueries(self._db)
        try:
            while page := await queries.finished_jobs(since, after):
                for job in page:
                    candidate = f"{job.provider}/{job.model}/{job.account_name}"
                    windows.setdefault(candidate, HealthWindows()).observe(
                        job.succeeded,
                        max(0.0, (job.completed_at - job.started_at).total_seconds()),
                        observed_cost(job.actual_cost_micros, job.estimated_cost_micros),
                        job.completed_at.timestamp(),
                    )
                jobs += len(page)
                after = (page[-1].completed_at, page[-1].job_id)
        except Exception:
            self._rebuild_retry_at = now + REBUILD_RETRY_S
            log.warning("health windows not rebuilt from PostgreSQL (retrying)", exc_info=True)
            return
        # A job this replica saw end before its first sync is in the history too: the rebuilt
        # windows replace its own (a refused submit it saw meanwhile is the only sample lost).
        self._windows.update(windows)
        self._rebuild_due, self._rebuilt_until = False, until
        log.info("health windows rebuilt from %d provider jobs of the last 7 days", jobs)

    def _in_history(self, o: Observation) -> bool:
        """Whether the rebuild already holds `o`: a generation outcome (it has a latency) that
        ended before the rebuild read PostgreSQL. Refused submits are not jobs: always folded."""
        return o.latency_s is not None and o.at <= self._rebuilt_until

    def _share_incumbent(self, group: str, incumbent: Incumbent) -> None:
        """Write a group's new incumbent to the shared state (`SharedIncumbents`)."""
        put = self._shared.put_incumbent(group, incumbent.candidate_id, incumbent.since_s)
        self._background("incumbent", put)

    def _background(self, what: str, call: Awaitable[None]) -> None:
        async def run() -> None:
            try:
                await call
            except Exception:
                log.warning("shared %s not written", what, exc_info=True)

        try:
            task = asyncio.get_running_loop().create_task(run())
        except RuntimeError:
            if asyncio.iscoroutine(call):
                call.close()
            return
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    async def admit(self, key: BreakerKey, holder: str, *, fresh: bool = False) -> bool:
        """May `holder` make one call on `key` now? HALF_OPEN admits the configured probes.

        A submit must pass its account's breaker as well. An admission whose call is never made
        goes back through `release`; otherwise `record_outcome(..., holder=holder)` ends it.
        `fresh` reads the shared state even when this replica's breaker is CLOSED (another
        replica may have opened it since the last `sync`): what a submit about to leave asks.
        """
        keys = self._keys(key)
        for n, k in enumerate(keys):
            if not await self._admit_one(k, holder, fresh):
                for taken in keys[:n]:
                    await self._release_one(taken, holder)
                return False
        return True

    async def admit_many(self, key: BreakerKey, holders: Sequence[str]) -> list[bool]:
        """`admit` for each holder in order: the bulk form a dispatch round's Compile calls
        are admitted with. A CLOSED breaker admits every call without a probe slot, so while
        `key` (not a SUBMIT key, which involves its account's breaker) is CLOSED after its
        clock one check answers for all; otherwise each holder is admitted in turn."""
        if holders and key.operation is not Operation.SUBMIT:
            breaker = self.registry.get(key)
            await self._emit(breaker.tick(), publish=False)
            if breaker.state is BreakerState.CLOSED:
                return [True] * len(holders)
        return [await self.admit(key, holder) for holder in holders]

    async def release(self, key: BreakerKey, holder: str) -> None:
        """Give back an admission whose call was never made (no lease, no attempt)."""
        for k in self._keys(key):
            await self._release_one(k, holder)

    # ---- what routing reads ----------------------------------------------------------------

    def open_reason(self, key: BreakerKey) -> str | None:
        """Why new work must not go to `key` (it or its account OPEN), else None."""
        for k in self._keys(key):
            breaker = self.registry.get(k)
            # Past its cooldown it is HALF_OPEN: routing may pick it. The move itself is left to
            # `sync`/`admit`, which announce it (log, metrics, audit row); a read must not.
            if breaker.state is not BreakerState.OPEN or breaker.cooldown_elapsed():
                continue
            until = breaker.open_until
            scope = "account breaker" if k.model == "" and k != key else "breaker"
            if until is None:
                return f"{scope} pinned OPEN by an operator"
            return open_detail(scope, breaker.opened_for, until - self._clock())
        return None

    def reopens_in(self, key: BreakerKey) -> float | None:
        """Seconds until `key` (or its account breaker) leaves OPEN for HALF_OPEN, when one of
        them is cooling down; None otherwise (closed, HALF_OPEN, or pinned by an operator).
        When a parked submit should ask again (`OperationGate.submit_reopens_in`)."""
        waits = [
            max(0.0, until - self._clock())
            for k in self._keys(key)
            if (b := self.registry.get(k)).state is BreakerState.OPEN
            and (until := b.open_until) is not None
        ]
        return max(waits) if waits else None

    async def refusal(self, key: BreakerKey) -> str | None:
        """`open_reason`, or why a HALF_OPEN `key` takes no probe now (every slot in flight).

        A hint for routing's records; `admit` is what decides. A breaker past its cooldown moves
        to HALF_OPEN here, announced like every other move.
        """
        for k in self._keys(key):
            await self._emit(self.registry.get(k).tick(), publish=False)
        reason = self.open_reason(key)
        if reason is not None:
            return reason
        for k in self._keys(key):
            breaker = self.registry.get(k)
            if breaker.state is not BreakerState.HALF_OPEN:
                continue
            limit = breaker.config.half_open_max_probes
            free = await self._safely("probe count", k, self._shared.probes_free(k, limit), limit)
            if free == 0:
                return f"breaker HALF_OPEN: {limit} of {limit} probes in flight"
        return None

    def health_view(self, candidate_id: str) -> HealthView | None:
        """The candidate's figures for routing: the 15-minute window (the 24-hour one while
        that is empty), the 1-minute window as the burst signal, and for the explain view its
        call baselines and why its breaker opened (None before any outcome of it)."""
        windows = self._windows.get(candidate_id)
        if windows is None:
            return None
        now = self._clock()
        window = Window.FIFTEEN_MINUTES
        stats = windows.stats(window, now)
        if stats.effective_samples < 1:
            window = Window.ONE_DAY
            stats = windows.stats(window, now)
        minute = windows.stats(Window.ONE_MINUTE, now)
        success = routing_success(stats, minute)
        baselines, opened_for = self._call_signals(candidate_id, now)
        return HealthView(
            success,
            stats.effective_samples,
            stats.mean_latency_s,
            stats.success_rate,
            stats.p95_latency_s,
            window.value,
            BurstView(
                minute.effective_samples,
                minute.success_rate,
                minute.success_lower_bound,
                success != stats.success_lower_bound,
            ),
            baselines,
            opened_for,
        )

    def _call_signals(self, candidate_id: str, now: float) -> tuple[Baselines, str]:
        """The candidate's learned call baselines per operation and why its SUBMIT (or its
        account's) breaker left CLOSED: explain only, so read at most once a second (and again
        after any breaker move), not once per task."""
        if now - self._signals_at >= 1.0:
            self._signals.clear()
            self._signals_at = now
        held = self._signals.get(candidate_id)
        if held is None:
            if not self._signals:
                self._opened = self.registry.opened_for()
                self._regions = {(k.provider, k.account): k.region for k in self.registry.states()}
            provider, model, account = candidate_id.split("/", 2)
            region = self._regions.get((provider, account), "")
            baselines = tuple(
                (op.value, round(b, 6))
                for op in sorted(JUDGED_OPERATIONS)
                if (b := self._baseline_now(BreakerKey(provider, account, region, model, op), now))
                is not None
            )
            opened = next(
                (
                    why
                    for key, why in self._opened.items()
                    if key.operation is Operation.SUBMIT
                    and (key.provider, key.account) == (provider, account)
                    and key.model in (model, "")  # its own, or its account's (model "")
                ),
                "",
            )
            held = self._signals[candidate_id] = (baselines, opened)
        return held

    def _baseline_now(self, key: BreakerKey, at: float) -> float | None:
        """As `baseline_s`, without creating a breaker for a key that has none."""
        held = BaselineKey(key.provider, key.model, key.operation)
        return self.baselines.baseline_s(held, at, self.registry.config_for(key))

    def job_durations(self, provider: str, account: str, model: str) -> DurationEvidence | None:
        """The candidate's finished jobs over the 24-hour window, for the poller (9.18.2)."""
        windows = self._windows.get(f"{provider}/{model}/{account}")
        if windows is None:
            return None
        return DurationEvidence(
            windows.latency_quantile(Window.ONE_DAY, 0.95),
            windows.latency_quantile(Window.ONE_DAY, 0.99),
            windows.latency_samples(Window.ONE_DAY, self._clock()),
        )

    def window_stats(self) -> dict[str, dict[Window, WindowStats]]:
        """Every candidate's stats over the four windows, now on this monitor's clock (the
        console's providers page; a read: nothing is observed or decayed)."""
        now = self._clock()
        return {c: {w: held.stats(w, now) for w in Window} for c, held in self._windows.items()}

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
        """Adopt what other replicas published, then apply clock-driven transitions (an adopted
        OPEN whose cooldown has passed is HALF_OPEN at once)."""
        for record in await self._shared.read_all():
            self._adopt(record)
        for transition in self.registry.tick():
            await self._emit(transition, publish=False)  # every replica times out alike
        await self.sync_windows()

    def _adopt(self, record: SharedRecord) -> None:
        if record.version <= self._applied.get(record.key, 0):
            return
        self._applied[record.key] = record.version
        self._signals.clear()
        breaker = self.registry.get(record.key)
        if record.forced:
            self._forced[record.key] = record.state
            breaker.force(record.state, f"remote:{record.reason}")
            return
        if self._forced.pop(record.key, None) is not None:
            breaker.force(BreakerState.CLOSED, "remote:override_released")  # unpin first
        if record.state is BreakerState.OPEN and record.until is None:
            return  # malformed: an unforced OPEN always carries its cooldown end
        level = record.level if record.level >= 0 else None
        breaker.apply_remote(record.state, record.until, record.reason, level)

    async def _fresh(self, key: BreakerKey) -> CircuitBreaker:
        """`key`'s breaker after its clock and the shared state: the replica that admitted a
        probe, or tripped the breaker, may not be this one."""
        breaker = self.registry.get(key)
        await self._emit(breaker.tick(), publish=False)
        record = await self._safely("read", key, self._shared.read(key), None)
        if record is not None:
            self._adopt(record)
        return breaker

    # ---- admission and results, one key -----------------------------------------------------

    @staticmethod
    def _keys(key: BreakerKey) -> list[BreakerKey]:
        return [account_key(key), key] if key.operation is Operation.SUBMIT else [key]

    async def _admit_one(self, key: BreakerKey, holder: str, fresh: bool = False) -> bool:
        breaker = self.registry.get(key)
        await self._emit(breaker.tick(), publish=False)
        if fresh or breaker.state is not BreakerState.CLOSED:
            breaker = await self._fresh(key)
        if breaker.state is BreakerState.CLOSED:
            return True
        if breaker.state is BreakerState.OPEN:
            return False
        cfg = breaker.config
        # Without the ledger the limit cannot be proven across replicas: no probe then.
        acquire = self._shared.acquire_probe(
            key, holder, cfg.half_open_max_probes, cfg.half_open_probe_ttl_s
        )
        return await self._safely("probe admission", key, acquire, False)

    async def _finish(self, breaker: CircuitBreaker, holder: str, succeeded: bool) -> ProbeFinish:
        ttl = breaker.config.half_open_probe_ttl_s
        finish = self._shared.finish_probe(breaker.key, holder, succeeded, ttl)
        # An unreachable ledger: the result is not counted; the slot frees after its TTL.
        return await self._safely("probe result", breaker.key, finish, ProbeFinish(False, 0))

    async def _safely(self, what: str, key: BreakerKey, call: Awaitable[T], fallback: T) -> T:
        """The shared state's answer, or `fallback` while it is unreachable (Redis lost): the
        local breakers keep working, and an outcome must never fail the worker reporting it."""
        try:
            return await call
        except Exception:
            log.warning(
                "breaker %s: shared %s failed; using %r", key, what, fallback, exc_info=True
            )
            return fallback

    async def _release_one(self, key: BreakerKey, holder: str) -> None:
        breaker = self.registry.get(key)
        if breaker.state is BreakerState.HALF_OPEN:
            await self._finish(breaker, holder, False)

    async def _record_one(
        self,
        key: BreakerKey,
        outcome: CallOutcome,
        holder: str | None,
        permit: Permit | None,
        baseline_s: float | None = None,
    ) -> BreakerTransition | None:
        return await self._record_on(await self._fresh(key), outcome, holder, permit, baseline_s)

    async def _record_on(
        self,
        breaker: CircuitBreaker,
        outcome: CallOutcome,
        holder: str | None,
        permit: Permit | None,
        baseline_s: float | None = None,
    ) -> BreakerTransition | None:
        """`_record_one` on a breaker already brought up to date (`_fresh`)."""
        if breaker.state is BreakerState.HALF_OPEN and holder is not None:
            finish = await self._finish(breaker, holder, breaker.probe_succeeded(outcome))
            result = breaker.record_probe(outcome, finish.successes) if finish.was_probe else None
        else:
            result = breaker.record(outcome, permit)
        if result is not None and baseline_s is not None:
            # The audit row says what "slow" meant when it moved (9.19.6 metrics).
            result = dataclasses.replace(
                result, metrics={**result.metrics, "baseline_s": round(baseline_s, 6)}
            )
        await self._emit(result)
        return result

    async def _record_account(
        self, key: BreakerKey, outcome: CallOutcome, holder: str | None
    ) -> None:
        """The account breaker hears only what speaks for the account: a disabling error trips
        it; a probe that got through (any non-disabling answer from the provider proves the
        credentials; a success counts toward closing) frees its slot."""
        breaker = await self._fresh(key)
        result = None
        if breaker.state is BreakerState.HALF_OPEN and holder is not None:
            finish = await self._finish(breaker, holder, outcome.succeeded)
            if finish.was_probe and outcome.succeeded:
                result = breaker.record_probe(outcome, finish.successes)
        if outcome.failure in DISABLES_ACCOUNT:
            result = breaker.trip(f"account_disabled:{outcome.failure}")
        await self._emit(result)

    async def _emit(
        self, transition: BreakerTransition | None, *, publish: bool = True, forced: bool = False
    ) -> None:
        if transition is None:
            return
        self._signals.clear()
        log.info(
            "breaker %s: %s -> %s (%s)",
            transition.key,
            transition.old.value,
            transition.new.value,
            transition.reason,
        )
        if self._on_transition is not None:
            self._on_transition(transition)
        if self._on_recovered is not None and transition.new is not BreakerState.OPEN:
            self._on_recovered(transition.key)  # parked tasks may run now (dispatcher)
        if publish:
            breaker = self.registry.get(transition.key)
            published = self._shared.publish(
                transition.key,
                transition.new,
                breaker.open_until,
                forced,
                transition.reason,
                level=breaker.level,
            )
            # An operator's override must reach every replica or fail loudly; a transition
            # learnt from outcomes still holds here (and is audited) while Redis is away.
            record = await (
                published if forced else self._safely("publish", transition.key, published, None)
            )
            if record is not None:
                self._applied[transition.key] = record.version
            if transition.old is BreakerState.HALF_OPEN:
                clear = self._shared.clear_probes(transition.key)  # the next phase starts empty
                await self._safely("probe reset", transition.key, clear, None)
        await self._persist([transition])

    async def _persist(self, transitions: Sequence[BreakerTransition]) -> None:
        if self._db is None:
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
        async with self._db.unit(datetime.fromtimestamp(self._clock(), UTC)) as u:
            await u.record_health_events(rows)

    async def _account_id(self, key: BreakerKey) -> int | None:
        ident = (key.provider, key.account, key.region)
        if ident not in self._account_ids and self._db is not None:
            self.set_account_ids(
                ((a.provider, a.account_name, a.region), a.id)
                for a in await CatalogQueries(self._db).accounts()
            )
        return self._account_ids.get(ident)


def _candidate_id(key: BreakerKey) -> str:
    return f"{key.provider}/{key.model}/{key.account}"
