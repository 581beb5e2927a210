"""Only a sidecar's verdict rejects (issue 20): a Compile that got no answer keeps the task
QUEUED and skips the candidate with a transient reason; two in a row open the candidate's COMPILE
breaker, so later rounds make no call; the sidecar's own refusal still rejects."""

from __future__ import annotations

from dataclasses import dataclass, field

from controlplane.adapters.grpc_client import CompileRefused, CompileUnavailable
from controlplane.domain.breaker import BreakerKey, BreakerState, Operation
from controlplane.domain.routing.decision import Outcome
from controlplane.domain.states import TaskState
from controlplane.persistence.database import Database
from controlplane.persistence.records import TaskRecord
from controlplane.persistence.tasks import TaskQueries
from controlplane.scheduling.dispatcher import DispatcherConfig, DispatchOutcome
from controlplane.scheduling.health import HealthMonitor
from controlplane.scheduling.reachability import AdapterReachability
from tests.integration.scheduling.conftest import DispatcherFactory
from tests.integration.scheduling.support import CompilingAdapter, dispatch_one, make_spec, strict
from tests.integration.scheduling.test_dispatcher import new_task
from vidroute_core.adapter import CompiledPlan
from vidroute_core.capabilities.loader import Capability
from vidroute_core.spec import GenerationSpec

PINNED = "self_hosted/wan2.2-t2v/gpu-a"
MODEL = "wan2.2-t2v"
COMPILE_KEY = BreakerKey("self_hosted", "gpu-a", "us", MODEL, Operation.COMPILE)


async def current(db: Database, task_id: int) -> TaskRecord:
    detail = await TaskQueries(db).get_task(task_id)
    assert detail is not None
    return detail.task


@dataclass
class FlakyAdapter(CompilingAdapter):
    """Compiles like the sidecars unless told the sidecar is away or refuses the request."""

    away: set[str] = field(default_factory=set)  # models whose Compile gets no answer
    refused: set[str] = field(default_factory=set)  # models the sidecar refuses (NOT_FOUND)

    async def compile(
        self,
        spec: GenerationSpec,
        *,
        account: str,
        model: str,
        model_version: str = "",
        capability: Capability | None = None,
    ) -> CompiledPlan:
        if model in self.away:
            self.compile_calls.append((account, model))
            raise CompileUnavailable("UNAVAILABLE: failed to connect to all addresses")
        if model in self.refused:
            self.compile_calls.append((account, model))
            raise CompileRefused(f"NOT_FOUND: unknown model {model}")
        return await super().compile(
            spec, account=account, model=model, model_version=model_version
        )


async def test_a_sidecar_without_an_answer_never_fails_a_pinned_task(
    db: Database, make_dispatcher: DispatcherFactory, monitor: HealthMonitor
) -> None:
    """A STRICT task whose sidecar does not answer stays QUEUED with 0 attempts, its candidate
    explained as COMPILE_UNAVAILABLE; once the sidecar answers the task gets its attempt."""
    flaky = FlakyAdapter(away={MODEL})
    reachability = AdapterReachability(["runway", "google", "self_hosted"])
    dispatcher = make_dispatcher(
        adapters=flaky.for_providers(["runway", "google", "self_hosted"]),
        reachability=reachability,
    )
    task = await new_task(db, make_spec(**strict(MODEL)))
    waiting = await dispatch_one(dispatcher, task)
    assert waiting.outcome is DispatchOutcome.NO_CAPACITY
    assert waiting.decision is not None
    assert waiting.decision.outcome is Outcome.NO_CAPACITY
    verdict = waiting.decision.verdict(PINNED)
    assert verdict.reason == "COMPILE_UNAVAILABLE"
    assert "UNAVAILABLE" in verdict.detail
    detail = await TaskQueries(db).get_task(task.id)
    assert detail is not None
    assert detail.task.state is TaskState.QUEUED
    assert detail.attempts == ()
    assert reachability.problem("self_hosted") is not None
    flaky.away.clear()
    ran = await dispatch_one(dispatcher, detail.task)
    assert ran.outcome is DispatchOutcome.SELECTED
    assert ran.decision is not None
    assert ran.decision.selected == PINNED
    assert reachability.problem("self_hosted") is None


async def test_two_silent_compiles_open_the_compile_breaker(
    db: Database, make_dispatcher: DispatcherFactory, monitor: HealthMonitor
) -> None:
    """Two Compile calls in a row without an answer open the candidate's COMPILE breaker: the
    next decision calls no Compile and explains the skip as CIRCUIT_OPEN (COMPILE), still a
    wait, never a failure; the SUBMIT breaker is untouched."""
    flaky = FlakyAdapter(away={MODEL})
    dispatcher = make_dispatcher(adapters=flaky.for_providers(["runway", "google", "self_hosted"]))
    task = await new_task(db, make_spec(**strict(MODEL)))
    for _ in range(2):
        task = await current(db, task.id)
        result = await dispatch_one(dispatcher, task)
        assert result.outcome is DispatchOutcome.NO_CAPACITY
    assert monitor.registry.get(COMPILE_KEY).state is BreakerState.OPEN
    submit = BreakerKey("self_hosted", "gpu-a", "us", MODEL, Operation.SUBMIT)
    assert monitor.registry.get(submit).state is BreakerState.CLOSED
    calls = len(flaky.compile_calls)
    task = await current(db, task.id)
    third = await dispatch_one(dispatcher, task)
    assert third.outcome is DispatchOutcome.NO_CAPACITY
    assert len(flaky.compile_calls) == calls
    assert third.decision is not None
    verdict = third.decision.verdict(PINNED)
    assert verdict.reason == "CIRCUIT_OPEN"
    assert "COMPILE" in verdict.detail
    assert (await current(db, task.id)).state is TaskState.QUEUED


async def test_the_sidecars_refusal_is_a_verdict(
    db: Database, make_dispatcher: DispatcherFactory
) -> None:
    """A sidecar that answers Compile with a refusal of the request (NOT_FOUND) rejects the
    candidate: the STRICT task fails with COMPILE_REJECT and the sidecar counts as reachable."""
    flaky = FlakyAdapter(refused={MODEL})
    reachability = AdapterReachability(["self_hosted"])
    dispatcher = make_dispatcher(
        adapters=flaky.for_providers(["runway", "google", "self_hosted"]),
        reachability=reachability,
        config=DispatcherConfig(),
    )
    task = await new_task(db, make_spec(**strict(MODEL)))
    result = await dispatch_one(dispatcher, task)
    assert result.outcome is DispatchOutcome.FAILED
    assert result.decision is not None
    verdict = result.decision.verdict(PINNED)
    assert verdict.reason == "COMPILE_REJECT"
    assert "NOT_FOUND" in verdict.detail
    assert reachability.problem("self_hosted") is None
