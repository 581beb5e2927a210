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


async def capacity_views(
    leases: LeaseStore, candidates: Sequence[Candidate], default_concurrency: int
) -> dict[str, CapacityView]:
    """Lease pre-check per candidate: O(1) counter reads, issued concurrently.

    (`LeaseStore.snapshot` would read every lease record of the account: too slow here.)
    A lease store error reads as "no free slot" for that candidate (fail safe).
    """
    accounts = sorted({c.lease_account for c in candidates})

    async def accepting(account: str) -> bool | None:
        try:
            return await leases.accepting_new(account)
        except LeaseError as exc:
            log.warning("lease pre-check for %s failed: %r", account, exc)
            return None

    async def view(c: Candidate, open_: bool | None) -> CapacityView:
        dims = lease_dimensions(c, default_concurrency)
        if open_ is None:
            return CapacityView(0, dims[-1].capacity)
        try:
            used = await asyncio.gather(*(leases.used(c.lease_account, d.key) for d in dims))
        except LeaseError as exc:
            log.warning("lease pre-check for %s failed: %r", c.id, exc)
            return CapacityView(0, dims[-1].capacity)
        free = min(d.capacity - n for d, n in zip(dims, used, strict=True))
        return CapacityView(max(0, free), dims[-1].capacity, open_)

    flags = dict(
        zip(accounts, await asyncio.gather(*(accepting(a) for a in accounts)), strict=True)
    )
    views = await asyncio.gather(*(view(c, flags[c.lease_account]) for c in candidates))
    return {c.id: v for c, v in zip(candidates, views, strict=True)}


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


async def compile_all(
    adapters: Mapping[str, AdapterClient],
    spec: GenerationSpec,
    candidates: Sequence[Candidate],
    *,
    timeout_s: float,
) -> tuple[dict[str, CompileResult], dict[str, CompiledPlan]]:
    """Compile `spec` for every candidate concurrently; failures become error results."""

    async def one(c: Candidate) -> tuple[str, CompileResult, CompiledPlan | None]:
        adapter = adapters.get(c.provider)
        if adapter is None:
            return c.id, CompileResult(False, error=f"no adapter for provider {c.provider}"), None
        try:
            async with asyncio.timeout(timeout_s):
                plan = await adapter.compile(
                    spec, account=c.account, model=c.model, model_version=c.model_version
                )
        except Exception as exc:  # any adapter failure only disqualifies this candidate
            return c.id, CompileResult(False, error=f"{type(exc).__name__}: {exc}"), None
        return c.id, compile_result(plan), plan

    results = await asyncio.gather(*(one(c) for c in candidates))
    verdicts = {cid: result for cid, result, _ in results}
    plans = {cid: plan for cid, _, plan in results if plan is not None}
    return verdicts, plans
