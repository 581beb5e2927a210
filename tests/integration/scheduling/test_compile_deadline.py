"""A batch's compile calls share one deadline (issue 10): a sidecar that does not answer in time
skips only its candidates (COMPILE_UNAVAILABLE, a TimeoutError; issue 20: never a rejection),
and the batch is dispatched elsewhere."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from controlplane.persistence.database import Database
from controlplane.scheduling.dispatcher import DispatcherConfig, DispatchOutcome
from tests.integration.scheduling.conftest import DispatcherFactory
from tests.integration.scheduling.support import CompilingAdapter, make_spec
from tests.integration.scheduling.test_dispatcher import new_task
from vidroute_core.adapter import CompiledPlan
from vidroute_core.capabilities.loader import Capability
from vidroute_core.spec import GenerationSpec


@dataclass
class HangingAdapter(CompilingAdapter):
    """Compiles like the sidecars, except that one model's Compile never answers."""

    hang_model: str = "gen4.5"

    async def compile(
        self,
        spec: GenerationSpec,
        *,
        account: str,
        model: str,
        model_version: str = "",
        capability: Capability | None = None,
    ) -> CompiledPlan:
        if model == self.hang_model:
            await asyncio.Event().wait()
        return await super().compile(
            spec, account=account, model=model, model_version=model_version
        )


async def test_a_hanging_compile_disqualifies_only_its_candidate(
    db: Database, make_dispatcher: DispatcherFactory
) -> None:
    """Two tasks in one batch: gen4.5's Compile hangs past the 0.2 s deadline, so both tasks
    record it as COMPILE_UNAVAILABLE (TimeoutError) and are dispatched to another candidate."""
    tasks = [await new_task(db, make_spec(), key=f"k{i}") for i in range(2)]
    hanging = HangingAdapter()
    dispatcher = make_dispatcher(
        adapters=hanging.for_providers(["runway", "google", "self_hosted"]),
        config=DispatcherConfig(compile_timeout_s=0.2),
    )
    results = await dispatcher.dispatch_batch(tasks, {})
    assert [r.outcome for r in results] == [DispatchOutcome.SELECTED] * 2
    for r in results:
        assert r.decision is not None
        verdict = r.decision.verdict("runway/gen4.5/prod-us")
        assert verdict.reason == "COMPILE_UNAVAILABLE"
        assert "TimeoutError" in verdict.detail
        assert r.decision.selected != "runway/gen4.5/prod-us"
