"""The dispatcher's fact gathering: lease pre-checks and compile calls.

Everything the pure pipeline (`controlplane.domain.routing`) needs but cannot fetch itself,
besides the failover history, which is rows read with the queued tasks
(`controlplane.persistence.exclusions.load_facts`).
Compiles run concurrently, one per candidate that passed the static filters, each under a
timeout; an adapter failure becomes that candidate's COMPILE_REJECT, never a failed dispatch.
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from collections.abc import Mapping, Sequence

from controlplane.adapters.grpc_client import AdapterClient
from controlplane.domain.routing.candidates import (
    Candidate,
    CapacityView,
    CompileResult,
    TransformKind,
)
from controlplane.leases.base import Dimension, LeaseError, LeaseStore
from vidroute_core.adapter import CompiledPlan
from vidroute_core.spec import GenerationSpec

log = logging.getLogger(__name__)


def lease_dimensions(candidate: Candidate, default_concurrency: int) -> tuple[Dimension, ...]:
    """Account total first (the lease store reads it as the account capacity), then the model."""
    model_cap = candidate.capability.max_concurrency or default_concurrency
    account_cap = max(model_cap, default_concurrency)
    return (
        Dimension("account", account_cap),
        Dimension(f"model:{candidate.model}", model_cap),
    )


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


class CompileCache:
    """Compile verdicts per (candidate, capability version, price version, normalized spec
    hash): deterministic for equal keys (the adapter's compile is a pure function of them), so
    a re-routed task (woken, requeued) calls no sidecar again. Bounded LRU; adapter failures
    are never cached (the next round asks again)."""

    def __init__(self, size: int = 4096) -> None:
        self.size = size
        self._entries: OrderedDict[tuple[str, str, str, str], tuple[CompileResult, CompiledPlan]]
        self._entries = OrderedDict()
        self.hits = 0
        self.misses = 0

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
        self._entries[key] = (result, plan)
        self._entries.move_to_end(key)
        while len(self._entries) > self.size:
            self._entries.popitem(last=False)

    def clear(self) -> None:
        self._entries.clear()


CompileJob = tuple[GenerationSpec, str, Sequence[Candidate]]
"""One task's compile needs: its spec, its normalized spec hash, the candidates to compile."""


async def compile_many(
    adapters: Mapping[str, AdapterClient],
    jobs: Sequence[CompileJob],
    cache: CompileCache,
    *,
    timeout_s: float,
) -> list[tuple[dict[str, CompileResult], dict[str, CompiledPlan]]]:
    """Compile a whole batch: cached verdicts first, every other call concurrently (one gather
    for the batch, each call under `timeout_s`); failures become error results, never cached;
    answers aligned with `jobs`."""
    out: list[tuple[dict[str, CompileResult], dict[str, CompiledPlan]]] = []
    missing: dict[tuple[str, str, str, str], tuple[GenerationSpec, Candidate]] = {}
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

    async def one(spec: GenerationSpec, c: Candidate) -> tuple[CompileResult, CompiledPlan | None]:
        adapter = adapters.get(c.provider)
        if adapter is None:
            return CompileResult(False, error=f"no adapter for provider {c.provider}"), None
        try:
            async with asyncio.timeout(timeout_s):
                plan = await adapter.compile(
                    spec, account=c.account, model=c.model, model_version=c.model_version
                )
        except Exception as exc:  # any adapter failure only disqualifies this candidate
            return CompileResult(False, error=f"{type(exc).__name__}: {exc}"), None
        return compile_result(plan), plan

    keys = list(missing)
    answers = await asyncio.gather(*(one(*missing[k]) for k in keys))
    fresh: dict[tuple[str, str, str, str], tuple[CompileResult, CompiledPlan | None]] = {}
    for key, (result, plan) in zip(keys, answers, strict=True):
        fresh[key] = (result, plan)
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


class RoundCapacity:
    """One round's view of the lease counters: read once (`read`), then moved in memory as the
    round assigns its batch, so the batch's tasks do not all pick the last free slot; the
    leases themselves are acquired afterwards in one round trip (`LeaseStore.acquire_many`),
    which stays the judge (a slot another process took meanwhile is refused there)."""

    def __init__(
        self,
        used: dict[tuple[str, str], int],
        accepting: Mapping[str, bool | None],
        default_concurrency: int,
    ) -> None:
        self._used, self._accepting, self._default = used, accepting, default_concurrency

    @classmethod
    async def read(
        cls, leases: LeaseStore, candidates: Sequence[Candidate], default_concurrency: int
    ) -> RoundCapacity:
        """Every account's accepting flag and every (account, dimension) counter, concurrently.
        A lease store error reads as "no free slot" (fail safe)."""
        accounts = sorted({c.lease_account for c in candidates})
        refs = sorted(
            {
                (c.lease_account, d.key)
                for c in candidates
                for d in lease_dimensions(c, default_concurrency)
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
        )

    def view(self, c: Candidate) -> CapacityView:
        dims = lease_dimensions(c, self._default)
        open_ = self._accepting.get(c.lease_account)
        if open_ is None:
            return CapacityView(0, dims[-1].capacity)
        free = min(d.capacity - self._used.get((c.lease_account, d.key), 0) for d in dims)
        return CapacityView(max(0, free), dims[-1].capacity, open_)

    def free_accounts(self, candidates: Sequence[Candidate]) -> set[str]:
        """Accounts where some candidate has a free slot and takes new work."""
        return {
            c.lease_account
            for c in candidates
            if (v := self.view(c)).accepting_new and v.available > 0
        }

    def take(self, c: Candidate, slots: int = 1) -> None:
        for d in lease_dimensions(c, self._default):
            ref = (c.lease_account, d.key)
            self._used[ref] = self._used.get(ref, 0) + slots

    def give(self, c: Candidate, slots: int = 1) -> None:
        self.take(c, -slots)

    def full(self, c: Candidate) -> None:
        """The store refused this candidate: another process took the slot; stop offering it."""
        for d in lease_dimensions(c, self._default):
            self._used[(c.lease_account, d.key)] = max(
                d.capacity, self._used.get((c.lease_account, d.key), 0)
            )
