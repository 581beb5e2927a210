"""The dispatcher's fact gathering: lease pre-checks and compile calls.

Everything the pure pipeline (`controlplane.domain.routing`) needs but cannot fetch itself,
besides the failover history, which is rows read with the queued tasks
(`controlplane.persistence.exclusions.load_facts`).
Compiles run concurrently, one per candidate that passed the static filters, each under a
timeout. Only the sidecar's answer is a verdict (a plan, or its refusal of the request,
`CompileRefused`); a call that got none (a timeout, UNAVAILABLE, a broken connection: the sidecar
stopped, restarting, overloaded) is a transient result, COMPILE_UNAVAILABLE to routing, so the
task waits and is decided again instead of failing (issue 20). Each call passes the candidate's
COMPILE breaker (`compile_key`): two calls in a row without an answer open it, and the round
stops calling that sidecar (CIRCUIT_OPEN) until its cooldown admits a probe. Every answer and
every silence is also told to the `AdapterReachability` (per-provider readiness).
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Protocol

from controlplane.adapters.grpc_client import AdapterClient, CompileRefused, CompileUnavailable
from controlplane.domain.accounts import AccountLimits
from controlplane.domain.breaker import BreakerKey, Operation
from controlplane.domain.routing.candidates import (
    Candidate,
    CapacityView,
    CompileResult,
    TransformKind,
)
from controlplane.leases.base import Dimension, LeaseError, LeaseStore
from controlplane.scheduling.windows import LimitsFor, no_limits
from vidroute_core.adapter import CompiledPlan
from vidroute_core.spec import GenerationSpec

log = logging.getLogger(__name__)

NO_LIMITS = AccountLimits()

#: What a Compile that got no answer reports to its breaker.
NO_ANSWER = "TRANSIENT_NETWORK"
#: What a Compile whose answer could not be read reports.
UNREADABLE = "MALFORMED_RESPONSE"


def compile_key(candidate: Candidate) -> BreakerKey:
    """The breaker a Compile call for `candidate` must pass (COMPILE operation)."""
    return BreakerKey(
        candidate.provider, candidate.account, candidate.region, candidate.model, Operation.COMPILE
    )


class CompileBreakers(Protocol):
    """What compiling needs of the scheduler's `HealthMonitor`: the bulk forms of `admit` and
    `record_outcome`, one call per candidate's breaker for a round's Compile calls."""

    async def admit_many(self, key: BreakerKey, holders: Sequence[str]) -> list[bool]: ...

    async def record_outcomes(
        self, key: BreakerKey, outcomes: Sequence[tuple[str | None, float | None, str | None]]
    ) -> object: ...


class Reachability(Protocol):
    """Where compiling reports whether a sidecar answered (`AdapterReachability`)."""

    def answered(self, provider: str) -> None: ...

    def lost(self, provider: str, why: str) -> None: ...


def lease_dimensions(
    candidate: Candidate,
    default_concurrency: int,
    limits: AccountLimits | None = None,
    mode: str = "",
) -> tuple[Dimension, ...]:
    """The slots an attempt of `candidate` holds: the account total first (the lease store
    reads it as the account capacity), then the model, then the task's modality (`mode`, the
    spec's generation mode) and the candidate's region when the accounts document limits them.

    The account total is the document's ``max_concurrency``, else max(model cap, default) as
    before accounts were configuration; the model's is the smaller of the document's and the
    capability's ``max_concurrency``. Every one is checked in the same atomic acquire."""
    limits = limits or NO_LIMITS
    model_cap = candidate.capability.max_concurrency or default_concurrency
    account_cap = limits.max_concurrency or max(model_cap, default_concurrency)
    configured = limits.model_concurrency.get(candidate.model)
    dims = [
        Dimension("account", account_cap),
        Dimension(f"model:{candidate.model}", min(model_cap, configured or model_cap)),
    ]
    if mode and (slots := limits.modality_concurrency.get(mode)) is not None:
        dims.append(Dimension(f"modality:{mode}", slots))
    if (slots := limits.region_concurrency.get(candidate.region)) is not None:
        dims.append(Dimension(f"region:{candidate.region}", slots))
    return tuple(dims)


def candidate_dimensions(
    c: Candidate, default_concurrency: int, limits_for: LimitsFor, mode: str = ""
) -> tuple[Dimension, ...]:
    """`lease_dimensions` with the candidate's account limits looked up."""
    return lease_dimensions(c, default_concurrency, limits_for(c.provider, c.account), mode)


def compile_result(plan: CompiledPlan) -> CompileResult:
    """The adapter's plan in the domain's terms."""
    return CompileResult(
        submittable=plan.submittable,
        transformations=tuple(
            (t.field, TransformKind(t.kind.value), t.detail) for t in plan.transformations
        ),
        estimated_cost_micros=plan.estimated_cost_micros,
        currency=plan.currency,
        request_hash=plan.request_hash,
    )


# What one cached verdict holds besides its provider request body, measured with tracemalloc on
# plans decoded by `plan_from_proto` (tests/unit/test_memory_bounds.py): ~6 KB of dataclasses,
# the plan's JSON form and the key. The body is held twice (the text and its copy in plan_json).
ENTRY_BASE_BYTES = 6 * 1024


def entry_bytes(plan: CompiledPlan) -> int:
    """About what a cached plan keeps alive, in bytes."""
    return ENTRY_BASE_BYTES + 2 * len(plan.native_request_json)


class CompileCache:
    """Compile verdicts per (candidate, capability version, price version, normalized spec
    hash): deterministic for equal keys (the adapter's compile is a pure function of them), so
    a re-routed task (woken, requeued) calls no sidecar again. Bounded LRU, by entries and by
    bytes (`entry_bytes`: a 4,000-character prompt makes an entry ~14 KB instead of ~6 KB, so
    4,096 entries alone could hold 58 MB); adapter failures are never cached (the next round
    asks again)."""

    def __init__(self, size: int = 4096, max_bytes: int = 24 * 1024 * 1024) -> None:
        self.size = size
        self.max_bytes = max_bytes
        self._entries: OrderedDict[tuple[str, str, str, str], tuple[CompileResult, CompiledPlan]]
        self._entries = OrderedDict()
        self.bytes = 0  # sum of `entry_bytes` of the entries held
        self.hits = 0
        self.misses = 0

    def __len__(self) -> int:
        return len(self._entries)

    @staticmethod
    def key(candidate: Candidate, spec_hash: str) -> tuple[str, str, str, str]:
        return (
            candidate.id,
            candidate.capability_version,
            candidate.price.price_version,
            spec_hash,
        )

    def get(self, key: tuple[str, str, str, str]) -> tuple[CompileResult, CompiledPlan] | None:
        found = self._entries.get(key)
        if found is None:
            self.misses += 1
            return None
        self._entries.move_to_end(key)
        self.hits += 1
        return found

    def put(
        self, key: tuple[str, str, str, str], result: CompileResult, plan: CompiledPlan
    ) -> None:
        old = self._entries.pop(key, None)
        if old is not None:
            self.bytes -= entry_bytes(old[1])
        self._entries[key] = (result, plan)
        self.bytes += entry_bytes(plan)
        while len(self._entries) > self.size or (
            self.bytes > self.max_bytes and len(self._entries) > 1
        ):
            _, (_, evicted) = self._entries.popitem(last=False)
            self.bytes -= entry_bytes(evicted)

    def clear(self) -> None:
        self._entries.clear()
        self.bytes = 0


CompileJob = tuple[GenerationSpec, str, Sequence[Candidate]]
"""One task's compile needs: its spec, its normalized spec hash, the candidates to compile."""


def unavailable(why: str) -> CompileResult:
    """A candidate's result when its sidecar gave no verdict: transient, never cached."""
    return CompileResult(False, error=why, transient=True)


CacheKey = tuple[str, str, str, str]
Answer = tuple[CompileResult, CompiledPlan | None]


class _Calls:
    """One batch's Compile calls: breaker admission, the call, and who hears of its outcome.

    The bookkeeping is per batch, not per call: the calls of one candidate are admitted by its
    COMPILE breaker in one `admit_many` before any starts (what per-call admissions amount to
    when every call is started together), and their outcomes are told to the breaker in one
    `record_outcomes` per candidate, in the order the calls ended, once the batch is over
    (its deadline bounds the delay); the reachability hears each one as it ends."""

    def __init__(
        self,
        adapters: Mapping[str, AdapterClient],
        breakers: CompileBreakers | None,
        reachability: Reachability | None,
    ) -> None:
        self.adapters, self.breakers, self.reachability = adapters, breakers, reachability
        self.holders: dict[CacheKey, str] = {}  # admitted calls not reported yet
        self.admitted: dict[CacheKey, bool] = {}
        self.started = time.monotonic()
        self._batch = secrets.token_hex(8)  # with a count: each call's holder, unique anywhere
        # The outcomes for the breakers, in the order the calls ended: (candidate, failure,
        # seconds since the batch started, holder).
        self._ended: list[tuple[Candidate, str | None, float, str]] = []
        self._breakers: dict[str, BreakerKey] = {}  # candidate id -> its COMPILE breaker

    def breaker(self, c: Candidate) -> BreakerKey:
        """`compile_key(c)`, built once per candidate in the batch."""
        key = self._breakers.get(c.id)
        if key is None:
            key = self._breakers[c.id] = compile_key(c)
        return key

    async def admit_all(self, missing: Mapping[CacheKey, tuple[GenerationSpec, Candidate]]) -> None:
        """Every call's admission, one `admit_many` per candidate's COMPILE breaker; a breaker
        backend that fails admits the calls (a breaker protects the sidecar, it must not stop
        routing). A call without an adapter is not admitted (it is not made)."""
        by_breaker: dict[BreakerKey, list[CacheKey]] = {}
        for key, (_, c) in missing.items():
            if c.provider in self.adapters:
                self.holders[key] = f"COMPILE:{self._batch}:{len(self.holders)}"
                by_breaker.setdefault(self.breaker(c), []).append(key)
        for breaker, keys in by_breaker.items():
            if self.breakers is None:
                answers = [True] * len(keys)
            else:
                try:
                    answers = await self.breakers.admit_many(
                        breaker, [self.holders[k] for k in keys]
                    )
                except Exception:
                    log.warning("compile breaker of %s: admission failed; calling anyway", breaker)
                    answers = [True] * len(keys)
            for key, admitted in zip(keys, answers, strict=True):
                self.admitted[key] = admitted
                if not admitted:
                    del self.holders[key]

    async def one(self, key: CacheKey, spec: GenerationSpec, c: Candidate) -> Answer:
        adapter = self.adapters.get(c.provider)
        if adapter is None:
            return CompileResult(False, error=f"no adapter for provider {c.provider}"), None
        if not self.admitted.get(key, False):
            return unavailable(f"COMPILE breaker of {c.provider} refuses calls for now"), None
        try:
            plan = await adapter.compile(
                spec,
                account=c.account,
                model=c.model,
                model_version=c.model_version,
                capability=c.capability,  # the version routed on is the version compiled
            )
        except CompileRefused as exc:  # the sidecar's verdict on this request
            self.ended(key, c, None)
            return CompileResult(False, error=f"sidecar refused: {exc}"), None
        except (CompileUnavailable, TimeoutError, OSError) as exc:
            why = f"{c.provider} sidecar gave no answer ({type(exc).__name__}: {exc})"
            self.ended(key, c, NO_ANSWER, why)
            return unavailable(why), None
        except Exception as exc:  # an answer we cannot read is no verdict either
            why = f"{c.provider} sidecar answer unreadable ({type(exc).__name__}: {exc})"
            log.warning("compile of %s: %s", c.id, why)
            self.ended(key, c, UNREADABLE, why)
            return unavailable(why), None
        self.ended(key, c, None)
        return compile_result(plan), plan

    def late(self, key: CacheKey, c: Candidate, timeout_s: float) -> tuple[Answer, str | None]:
        """A call cut at the batch deadline: its answer, and its admission if still unreported."""
        why = f"{c.provider} sidecar gave no answer within {timeout_s:g} s (TimeoutError)"
        return (unavailable(why), None), (why if key in self.holders else None)

    def ended(self, key: CacheKey, c: Candidate, failure: str | None, why: str = "") -> None:
        """A call ended (`failure` None: the sidecar answered): the reachability hears it now,
        its breaker when the batch reports (`report_all`)."""
        holder = self.holders.pop(key, None)
        if self.reachability is not None:
            if failure == NO_ANSWER:
                self.reachability.lost(c.provider, why)
            else:
                self.reachability.answered(c.provider)
        if holder is not None:
            self._ended.append((c, failure, time.monotonic() - self.started, holder))

    async def report_all(self) -> None:
        """The batch's outcomes to the breakers: one `record_outcomes` per candidate, in the
        order its calls ended; a breaker that fails to take them loses only those outcomes."""
        if self.breakers is None or not self._ended:
            return
        by_breaker: dict[BreakerKey, list[tuple[str | None, float | None, str | None]]] = {}
        for c, failure, took, holder in self._ended:
            by_breaker.setdefault(self.breaker(c), []).append((failure, took, holder))
        self._ended = []
        for breaker, outcomes in by_breaker.items():
            try:
                await self.breakers.record_outcomes(breaker, outcomes)
            except Exception:  # the verdicts stand; only the breaker misses these outcomes
                log.warning("compile breaker of %s: outcomes not recorded", breaker, exc_info=True)


async def compile_many(
    adapters: Mapping[str, AdapterClient],
    jobs: Sequence[CompileJob],
    cache: CompileCache,
    *,
    timeout_s: float,
    breakers: CompileBreakers | None = None,
    reachability: Reachability | None = None,
) -> list[tuple[dict[str, CompileResult], dict[str, CompiledPlan]]]:
    """Compile a whole batch: cached verdicts first, every other call concurrently, one per
    distinct (candidate, versions, normalized spec hash), all started together under ONE
    deadline `timeout_s` from now (a call still running then is cancelled and is that
    candidate's transient ``TimeoutError``: what a timeout per call would give, without a timer
    per call); a call its COMPILE breaker refuses is not made (transient too); failures become
    error results, never cached; answers aligned with `jobs`."""
    out: list[tuple[dict[str, CompileResult], dict[str, CompiledPlan]]] = []
    missing: dict[CacheKey, tuple[GenerationSpec, Candidate]] = {}
    for spec, spec_hash, candidates in jobs:
        verdicts: dict[str, CompileResult] = {}
        plans: dict[str, CompiledPlan] = {}
        for c in candidates:
            key = cache.key(c, spec_hash)
            found = cache.get(key)
            if found is not None:
                verdicts[c.id], plans[c.id] = found
            else:
                missing.setdefault(key, (spec, c))
        out.append((verdicts, plans))
    if not missing:
        return out
    fresh = await _call_all(_Calls(adapters, breakers, reachability), missing, timeout_s)
    for key, (result, plan) in fresh.items():
        if plan is not None:
            cache.put(key, result, plan)
    for (_, spec_hash, candidates), (verdicts, plans) in zip(jobs, out, strict=True):
        for c in candidates:
            if c.id in verdicts:
                continue
            result, maybe = fresh[cache.key(c, spec_hash)]
            verdicts[c.id] = result
            if maybe is not None:
                plans[c.id] = maybe
    return out


async def _call_all(
    calls: _Calls, missing: Mapping[CacheKey, tuple[GenerationSpec, Candidate]], timeout_s: float
) -> dict[CacheKey, Answer]:
    keys = list(missing)
    await calls.admit_all(missing)
    running = [asyncio.ensure_future(calls.one(k, *missing[k])) for k in keys]
    try:
        try:
            _, late = await asyncio.wait(running, timeout=timeout_s)
        finally:
            for call in running:
                call.cancel()  # no-op for the finished ones
        if late:
            await asyncio.gather(*late, return_exceptions=True)
        fresh: dict[CacheKey, Answer] = {}
        for key, call in zip(keys, running, strict=True):
            if call in late or call.cancelled():
                c = missing[key][1]
                fresh[key], why = calls.late(key, c, timeout_s)
                if why:  # admitted and cut: its breaker and readiness hear of the silence
                    calls.ended(key, c, NO_ANSWER, why)
            else:
                fresh[key] = call.result()
    finally:
        await calls.report_all()
    return fresh


class RoundCapacity:
    """One round's view of the lease counters: read once (`read`), then moved in memory as the
    round assigns its batch, so the batch's tasks do not all pick the last free slot; the
    leases themselves are acquired afterwards in one round trip (`LeaseStore.acquire_many`),
    which stays the judge (a slot another process took meanwhile is refused there).

    A view is per candidate and task mode (a modality limit counts only the tasks of its mode);
    mode "" reads every dimension but the modalities (the parking's wake check)."""

    def __init__(
        self,
        used: dict[tuple[str, str], int],
        accepting: Mapping[str, bool | None],
        default_concurrency: int,
        limits_for: LimitsFor = no_limits,
        closed: Mapping[str, str] | None = None,
    ) -> None:
        self._used, self._accepting, self._default = used, accepting, default_concurrency
        self._limits_for = limits_for
        # Lease accounts with a full rate or budget window: why (`scheduling.windows`).
        self._closed: dict[str, str] = dict(closed or {})
        # A round asks ~10 views per task: each candidate's dimensions and view are kept, the
        # view until a take/give/full in its account (`_moved`) changes what it reads.
        self._dims: dict[tuple[str, str], tuple[Dimension, ...]] = {}
        self._views: dict[tuple[str, str], tuple[int, CapacityView]] = {}
        self._moved: dict[str, int] = {}

    @classmethod
    async def read(
        cls,
        leases: LeaseStore,
        candidates: Sequence[Candidate],
        default_concurrency: int,
        limits_for: LimitsFor = no_limits,
        closed: Mapping[str, str] | None = None,
    ) -> RoundCapacity:
        """Every account's accepting flag and every (account, dimension) counter, concurrently.
        A lease store error reads as "no free slot" (fail safe). `closed`: the accounts whose
        window is full, and why; their candidates read as without a slot."""
        accounts = sorted({c.lease_account for c in candidates})
        refs = sorted(
            {
                (c.lease_account, d.key)
                for c in candidates
                for mode in ("", *limits_for(c.provider, c.account).modality_concurrency)
                for d in candidate_dimensions(c, default_concurrency, limits_for, mode)
            }
        )

        async def accepting(account: str) -> bool | None:
            try:
                return await leases.accepting_new(account)
            except LeaseError as exc:
                log.warning("lease pre-check for %s failed: %r", account, exc)
                return None

        async def used(ref: tuple[str, str]) -> int | None:
            try:
                return await leases.used(*ref)
            except LeaseError as exc:
                log.warning("lease pre-check for %s failed: %r", ref, exc)
                return None

        flags, counts = await asyncio.gather(
            asyncio.gather(*(accepting(a) for a in accounts)),
            asyncio.gather(*(used(r) for r in refs)),
        )
        unknown = {r[0] for r, n in zip(refs, counts, strict=True) if n is None}
        accept = {a: (None if a in unknown else f) for a, f in zip(accounts, flags, strict=True)}
        return cls(
            {r: n for r, n in zip(refs, counts, strict=True) if n is not None},
            accept,
            default_concurrency,
            limits_for,
            closed,
        )

    def dimensions(self, c: Candidate, mode: str = "") -> tuple[Dimension, ...]:
        """What an attempt of `c` for a task of `mode` holds (`candidate_dimensions`)."""
        dims = self._dims.get((c.id, mode))
        if dims is None:
            dims = candidate_dimensions(c, self._default, self._limits_for, mode)
            self._dims[(c.id, mode)] = dims
        return dims

    def view(self, c: Candidate, mode: str = "") -> CapacityView:
        account = c.lease_account
        moved = self._moved.get(account, 0)
        cached = self._views.get((c.id, mode))
        if cached is not None and cached[0] == moved:
            return cached[1]
        dims = self.dimensions(c, mode)
        open_ = self._accepting.get(account)
        if account in self._closed:
            view = CapacityView(0, dims[1].capacity, bool(open_), self._closed[account])
        elif open_ is None:
            view = CapacityView(0, dims[1].capacity)
        else:
            used = self._used
            free = dims[0].capacity - used.get((account, dims[0].key), 0)
            for d in dims[1:]:
                free = min(free, d.capacity - used.get((account, d.key), 0))
            view = CapacityView(max(0, free), dims[1].capacity, open_)
        self._views[(c.id, mode)] = (moved, view)
        return view

    def free_accounts(self, candidates: Sequence[Candidate]) -> set[str]:
        """Accounts where some candidate has a free slot and takes new work."""
        return {
            c.lease_account
            for c in candidates
            if (v := self.view(c)).accepting_new and v.available > 0
        }

    def take(self, c: Candidate, slots: int = 1, mode: str = "") -> None:
        for d in self.dimensions(c, mode):
            ref = (c.lease_account, d.key)
            self._used[ref] = self._used.get(ref, 0) + slots
        self._moved[c.lease_account] = self._moved.get(c.lease_account, 0) + 1

    def give(self, c: Candidate, slots: int = 1, mode: str = "") -> None:
        self.take(c, -slots, mode)

    def window_closed(self, c: Candidate, why: str) -> None:
        """The store refused a window of this candidate's account: no slot there this round."""
        self._closed[c.lease_account] = why
        self._moved[c.lease_account] = self._moved.get(c.lease_account, 0) + 1

    def full(self, c: Candidate, mode: str = "") -> None:
        """The store refused this candidate: another process took the slot; stop offering it."""
        for d in self.dimensions(c, mode):
            self._used[(c.lease_account, d.key)] = max(
                d.capacity, self._used.get((c.lease_account, d.key), 0)
            )
        self._moved[c.lease_account] = self._moved.get(c.lease_account, 0) + 1
