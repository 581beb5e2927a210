"""A round's compile (`gather.compile_many` over the whole batch: one Compile call per distinct
candidate and normalized spec, admitted and reported per candidate breaker) gives every task
exactly the verdicts and plans it gets compiled on its own, makes one call per distinct
(candidate, spec) where the tasks one by one make one per task, and leaves the breakers and the
reachability where the tasks one by one leave them: answers, refusals, silences, no adapter."""

from __future__ import annotations

import time
from typing import Any

from controlplane.adapters.grpc_client import CompileRefused, CompileUnavailable
from controlplane.domain.breaker import BreakerConfig, BreakerRegistry
from controlplane.domain.routing.candidates import Candidate
from controlplane.scheduling.gather import CompileCache, CompileJob, compile_key, compile_many
from controlplane.scheduling.health import HealthMonitor
from controlplane.scheduling.reachability import AdapterReachability
from tests.integration.scheduling.support import catalog_capabilities, make_spec
from vidroute_core.adapter import CompiledPlan
from vidroute_core.hashing import normalized_spec_hash
from vidroute_core.spec import GenerationSpec


class Sidecar:
    """Compiles deterministically from the spec; refuses 16 s tasks, is silent for 4 s ones."""

    def __init__(self) -> None:
        self.calls = 0

    async def compile(
        self, spec: GenerationSpec, *, account: str, model: str, **_: Any
    ) -> CompiledPlan:
        self.calls += 1
        seconds = spec.output.duration_ms // 1000
        if seconds == 16:
            raise CompileRefused(f"{model} takes no 16 s")
        if seconds == 4:
            raise CompileUnavailable("connection reset")
        return CompiledPlan(
            provider="x",
            account=account,
            model=model,
            model_version="",
            capability_version="",
            price_version="",
            request_hash=normalized_spec_hash(spec),
            estimated_cost_micros=1000 * seconds,
            currency="USD",
            submittable=True,
            transformations=(),
        )


def candidates() -> list[Candidate]:
    return [Candidate.from_capability(cap, i + 1) for i, cap in enumerate(catalog_capabilities())]


def jobs() -> list[CompileJob]:
    """Tasks of five specs, two of them twice (equal normalized specs), one refused and one
    met with silence, over every candidate, those of one provider without a sidecar."""
    out: list[CompileJob] = []
    every = candidates()
    shapes = (("a", 8), ("b", 8), ("a", 16), ("a", 4), ("a", 8), ("b", 10), ("b", 10))
    for tenant, seconds in shapes:
        spec = make_spec(f"tenant-{tenant}", seconds=seconds)
        out.append((spec, normalized_spec_hash(spec), every))
    return out


async def compiled(one_by_one: bool) -> tuple[list[Any], int, Any, Any]:
    sidecar = Sidecar()
    adapters: dict[str, Any] = {"runway": sidecar, "google": sidecar}
    monitor = HealthMonitor(BreakerRegistry(BreakerConfig(), time.time))
    reach = AdapterReachability(["runway", "google", "self_hosted"])
    batches = [[job] for job in jobs()] if one_by_one else [jobs()]
    cache = CompileCache()
    answers: list[Any] = []
    for batch in batches:
        answers += await compile_many(
            adapters, batch, cache, timeout_s=30.0, breakers=monitor, reachability=reach
        )
    keys = {compile_key(c) for c in candidates()}
    breakers = sorted(
        (str(k), monitor.registry.get(k).state, monitor.registry.get(k).metrics()) for k in keys
    )
    return answers, sidecar.calls, breakers, reach.statuses()


async def test_a_round_compiles_each_task_as_it_would_alone() -> None:
    """Same verdicts and plans per task, same breaker counts and reachability; calls once per
    distinct (candidate, spec) both ways (the cache), each call's outcome told to its breaker
    once, and every task answered."""
    alone, calls_alone, breakers_alone, reach_alone = await compiled(one_by_one=True)
    batch, calls_batch, breakers_batch, reach_batch = await compiled(one_by_one=False)
    assert batch == alone
    assert breakers_batch == breakers_alone
    assert reach_batch == reach_alone
    distinct_specs = len({spec_hash for _, spec_hash, _ in jobs()})
    assert distinct_specs == 5
    sidecar_candidates = sum(c.provider in ("runway", "google") for c in candidates())
    assert calls_batch == calls_alone == sidecar_candidates * distinct_specs
    assert sum(m["samples"] for _, _, m in breakers_batch) == calls_batch  # each told once
    errors = [r.error or "" for verdicts, _ in batch for r in verdicts.values()]
    assert any("no adapter" in e for e in errors)
    assert any("refused" in e for e in errors)
    assert any("gave no answer" in e for e in errors)
