"""The dispatcher end to end on a real database: route, lease, persist; wait; fail; fail over."""

from __future__ import annotations

import dataclasses
import json
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import select

from controlplane.api import views
from controlplane.domain.failover import FailoverLimits
from controlplane.domain.fairqueue import FairQueueConfig
from controlplane.domain.outbox import Topic
from controlplane.domain.requeue import ExcludedCandidate, RequeueRequest
from controlplane.domain.routing.selection import RouterConfig
from controlplane.domain.scoring import ScoreWeights, example_policy
from controlplane.domain.states import AttemptState, TaskState
from controlplane.leases.memory_store import MemoryLeaseStore
from controlplane.persistence import batch
from controlplane.persistence.catalog import CatalogQueries
from controlplane.persistence.database import Database
from controlplane.persistence.models import outbox
from controlplane.persistence.records import NewOutboxMessage, TaskRecord
from controlplane.persistence.tasks import TaskQueries
from controlplane.scheduling.dispatcher import DispatcherConfig, DispatchOutcome
from tests.integration.scheduling.conftest import DispatcherFactory
from tests.integration.scheduling.support import (
    NOW,
    CompilingAdapter,
    dispatch_one,
    make_spec,
    strict,
)
from vidroute_core.hashing import normalized_spec_hash
from vidroute_core.spec import GenerationSpec, Mode

SECOND = timedelta(seconds=1)


async def new_task(db: Database, spec: GenerationSpec, key: str = "k1") -> TaskRecord:
    async with db.unit(NOW) as u:
        record, _ = await u.create_task(
            spec, idempotency_key=key, spec_hash=normalized_spec_hash(spec)
        )
    return record


async def submit_messages(db: Database) -> list[dict[str, Any]]:
    async with db.reading() as conn:
        rows = await conn.execute(select(outbox.c.payload).where(outbox.c.topic == Topic.SUBMIT))
        return [dict(r[0]) for r in rows]


async def test_selected_task_gets_attempt_lease_and_explained_decision(
    db: Database,
    catalogs: CatalogQueries,
    leases: MemoryLeaseStore,
    make_dispatcher: DispatcherFactory,
) -> None:
    """A routable task becomes SUBMITTING with a leased, ready attempt and a full decision."""
    task = await new_task(db, make_spec())
    dispatcher = make_dispatcher()
    assert await dispatcher.tick() == 1
    detail = await TaskQueries(db).get_task(task.id)
    assert detail is not None
    assert detail.task.state is TaskState.SUBMITTING
    (attempt,) = detail.attempts
    assert attempt.state is AttemptState.READY_TO_SUBMIT
    assert attempt.client_request_key.startswith(f"{task.id}-1-")
    assert attempt.lease_token
    assert attempt.fencing_token
    assert attempt.request_hash
    assert attempt.compile_plan["model"] == attempt.provider_model
    assert attempt.routing_policy_version == "router-v17"
    (decision,) = detail.route_decisions
    snapshot = decision.candidate_snapshot
    catalog = await dispatcher.catalog()
    assert decision.reason_code == "SELECTED"
    assert decision.selected_candidate == snapshot["selected"]
    assert {c["id"] for c in snapshot["candidates"]} == {c.id for c in catalog.candidates}
    for c in snapshot["candidates"]:
        assert c["eligible"] == ("score" in c)
        assert c["eligible"] or (c["reason"] and c["detail"])
    chosen = catalog.by_id(decision.selected_candidate or "")
    assert chosen is not None
    assert await leases.used(chosen.lease_account, f"model:{chosen.model}") == 1
    assert [m["attempt_id"] for m in await submit_messages(db)] == [attempt.id]


async def test_no_capacity_keeps_the_task_queued_with_the_decision(
    db: Database, leases: MemoryLeaseStore, make_dispatcher: DispatcherFactory
) -> None:
    """With every account full the task returns to QUEUED (never FAILED) and says why."""
    dispatcher = make_dispatcher()
    for c in (await dispatcher.catalog()).candidates:
        await leases.set_used(c.lease_account, "account", 1000)
    task = await new_task(db, make_spec())
    await dispatcher.tick()
    detail = await TaskQueries(db).get_task(task.id)
    assert detail is not None
    assert detail.task.state is TaskState.QUEUED
    assert detail.attempts == ()
    (decision,) = detail.route_decisions
    assert decision.reason_code == "NO_CAPACITY"
    assert decision.selected_candidate is None
    reasons = {c["reason"] for c in decision.candidate_snapshot["candidates"]}
    assert "NO_CAPACITY" in reasons


@pytest.mark.parametrize("full", [False, True], ids=["selected", "no_capacity"])
async def test_explain_route_returns_the_decision_the_dispatcher_made(
    db: Database, leases: MemoryLeaseStore, make_dispatcher: DispatcherFactory, full: bool
) -> None:
    """The stored explain record (rendered once, when the batch writes it) is the dispatcher's
    decision as `to_json` gives it, and ExplainRoute's answer from the row equals the answer
    built from that decision: for a selected task (the bulk write) and a waiting one (the
    single-row write)."""
    dispatcher = make_dispatcher()
    if full:
        for c in (await dispatcher.catalog()).candidates:
            await leases.set_used(c.lease_account, "account", 1000)
    task = await new_task(db, make_spec())
    result = await dispatch_one(dispatcher, task)
    assert result.decision is not None
    made = json.loads(json.dumps(result.decision.to_json()))
    detail = await TaskQueries(db).get_task(task.id)
    assert detail is not None
    (stored,) = detail.route_decisions
    assert stored.reason_code == ("NO_CAPACITY" if full else "SELECTED")
    assert stored.candidate_snapshot == made
    explained = views.route_decision(stored)
    assert explained == views.route_decision(dataclasses.replace(stored, candidate_snapshot=made))
    assert [c.candidate_id for c in explained.candidates] == [c["id"] for c in made["candidates"]]
    assert full or any(c.components for c in explained.candidates)


async def test_no_eligible_candidate_fails_the_task_with_every_reason(
    db: Database, make_dispatcher: DispatcherFactory
) -> None:
    """A spec no model supports fails with a message naming each candidate's rejection."""
    spec = dataclasses.replace(make_spec(), mode=Mode.VIDEO_TO_VIDEO)
    task = await new_task(db, spec)
    result = await dispatch_one(make_dispatcher(), task)
    assert result.outcome is DispatchOutcome.FAILED
    detail = await TaskQueries(db).get_task(task.id)
    assert detail is not None
    assert detail.task.state is TaskState.FAILED
    assert detail.task.failure is not None
    assert detail.task.failure.code == "NO_ELIGIBLE_CANDIDATE"
    assert "runway/gen4.5/prod-us: UNSUPPORTED_MODE" in detail.task.failure.message
    assert detail.route_decisions[0].reason_code == "NO_ELIGIBLE_CANDIDATE"


async def test_shadow_policy_is_recorded_and_never_executed(
    db: Database, make_dispatcher: DispatcherFactory
) -> None:
    """A shadow policy's pick lands in the decision; only the production pick gets an attempt."""
    cheap = dataclasses.replace(
        example_policy("shadow-cost-only"),
        weights={"default": ScoreWeights(0, 0, 0, 1, 0, 0, 0)},
    )
    router = RouterConfig(policy=example_policy("router-v17"), shadow_policy=cheap)
    task = await new_task(db, make_spec())
    await make_dispatcher(router=router).tick()
    detail = await TaskQueries(db).get_task(task.id)
    assert detail is not None
    assert len(detail.attempts) == 1
    snapshot = detail.route_decisions[0].candidate_snapshot
    assert snapshot["shadow"]["policy_version"] == "shadow-cost-only"
    assert snapshot["shadow"]["executed"] is False
    assert snapshot["shadow_selected"]
    assert len(await submit_messages(db)) == 1


async def test_requeue_exclusions_and_strict_model_are_honoured(
    db: Database, make_dispatcher: DispatcherFactory
) -> None:
    """After a failover the failed candidate is excluded and STRICT keeps the model elsewhere."""
    model = "veo-3.1-fast-generate-preview"
    task = await new_task(db, make_spec(**strict(model)))
    dispatcher = make_dispatcher()
    first = await dispatch_one(dispatcher, task)
    assert first.outcome is DispatchOutcome.SELECTED
    assert first.decision is not None
    detail = await TaskQueries(db).get_task(task.id)
    assert detail is not None
    failed = detail.attempts[0]
    request = RequeueRequest(
        task_id=task.id,
        failed_attempt_id=failed.id,
        reason="FAIL_OVER",
        error_class="PROVIDER_OVERLOADED",
        excluded_candidates=(ExcludedCandidate(failed.provider_account_id, model),),
        same_model_only=True,
        required_model=model,
    )
    await _requeue(db, task.id, request)
    await dispatcher.tick()
    detail = await TaskQueries(db).get_task(task.id)
    assert detail is not None
    assert len(detail.attempts) == 2
    second = detail.attempts[1]
    assert second.attempt_no == 2
    assert second.provider_model == model
    assert second.provider_account_id != failed.provider_account_id
    snapshot = detail.route_decisions[1].candidate_snapshot
    by_id = {c["id"]: c for c in snapshot["candidates"]}
    assert by_id[first.decision.selected or ""]["reason"] == "EXCLUDED_BY_FAILOVER"


async def _requeue(db: Database, task_id: int, request: RequeueRequest) -> None:
    """Move the task back to QUEUED with `request`, as the execution side's `requeue` does: in
    one transaction, the failover history as rows and a wake-up message."""
    async with db.unit(NOW) as u:
        task = await u.task(task_id)
        assert task is not None
        assert await u.move_task(task, TaskState.QUEUED, request.reason)
        await u.record_requeue(request)
        await u.enqueue(NewOutboxMessage(Topic.REQUEUE, str(task_id), request.wake_up()))


async def test_soft_exclusion_keeps_the_only_candidate_after_its_backoff(
    db: Database, make_dispatcher: DispatcherFactory
) -> None:
    """STRICT to a one-account model whose submit was refused (TRANSIENT_NETWORK): the task
    waits QUEUED (RETRY_BACKOFF) until the requeue's retry instant, then gets a new attempt on
    the same candidate; it never fails as NO_ELIGIBLE_CANDIDATE."""
    model = "gen4.5"
    task = await new_task(db, make_spec(**strict(model)))
    first = await dispatch_one(make_dispatcher(), task)
    assert first.outcome is DispatchOutcome.SELECTED
    assert first.decision is not None
    detail = await TaskQueries(db).get_task(task.id)
    assert detail is not None
    failed = detail.attempts[0]
    retry_at = NOW + FailoverLimits().requeue_backoff_base_s * SECOND
    excluded = ExcludedCandidate(failed.provider_account_id, model, soft=True, retry_at=retry_at)
    request = RequeueRequest(
        task.id,
        failed.id,
        "FAIL_OVER_SAME_MODEL",
        "TRANSIENT_NETWORK",
        (excluded,),
        True,
        model,
    )
    await _requeue(db, task.id, request)

    await make_dispatcher().tick()
    detail = await TaskQueries(db).get_task(task.id)
    assert detail is not None
    assert detail.task.state is TaskState.QUEUED
    assert len(detail.attempts) == 1
    waiting = detail.route_decisions[-1]
    assert waiting.reason_code == "NO_CAPACITY"
    by_id = {c["id"]: c for c in waiting.candidate_snapshot["candidates"]}
    assert by_id[first.decision.selected or ""]["reason"] == "RETRY_BACKOFF"

    later = retry_at + SECOND
    await make_dispatcher(clock=lambda: later).tick()
    detail = await TaskQueries(db).get_task(task.id)
    assert detail is not None
    assert detail.task.state is TaskState.SUBMITTING
    second = detail.attempts[-1]
    assert (second.attempt_no, second.provider_account_id, second.provider_model) == (
        2,
        failed.provider_account_id,
        model,
    )
    chosen = detail.route_decisions[-1].candidate_snapshot
    assert chosen["selection_reason"].startswith("soft_exclusion_lifted")


async def test_no_eligible_after_a_hard_exclusion_reports_the_failure_class(
    db: Database, make_dispatcher: DispatcherFactory
) -> None:
    """When a hard failover exclusion removed the last candidate, the task fails with that
    failure's class (here INTERNAL_PERMANENT), not UNSUPPORTED_CAPABILITY."""
    model = "gen4.5"
    task = await new_task(db, make_spec(**strict(model)))
    assert (await dispatch_one(make_dispatcher(), task)).outcome is DispatchOutcome.SELECTED
    detail = await TaskQueries(db).get_task(task.id)
    assert detail is not None
    failed = detail.attempts[0]
    request = RequeueRequest(
        task.id,
        failed.id,
        "FAIL_OVER_SAME_MODEL",
        "INTERNAL_PERMANENT",
        (ExcludedCandidate(failed.provider_account_id, model),),
        True,
        model,
    )
    await _requeue(db, task.id, request)
    await make_dispatcher().tick()
    detail = await TaskQueries(db).get_task(task.id)
    assert detail is not None
    assert detail.task.state is TaskState.FAILED
    assert detail.task.failure is not None
    assert detail.task.failure.failure_class == "INTERNAL_PERMANENT"
    assert detail.task.failure.code == "NO_ELIGIBLE_CANDIDATE"


async def test_lease_is_released_when_the_attempt_transaction_fails(
    db: Database,
    leases: MemoryLeaseStore,
    make_dispatcher: DispatcherFactory,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """If persisting the attempt fails, the lease is returned and the task is queued again."""

    async def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("database went away")

    monkeypatch.setattr(batch, "write_selected", broken)
    task = await new_task(db, make_spec())
    dispatcher = make_dispatcher()
    with pytest.raises(RuntimeError, match="database went away"):
        await dispatch_one(dispatcher, task)
    for c in (await dispatcher.catalog()).candidates:
        assert await leases.used(c.lease_account, "account") == 0
    detail = await TaskQueries(db).get_task(task.id)
    assert detail is not None
    assert detail.task.state is TaskState.QUEUED
    assert detail.attempts == ()


async def test_compile_failure_and_reject_disqualify_only_that_candidate(
    db: Database, adapter: CompilingAdapter, make_dispatcher: DispatcherFactory
) -> None:
    """An unreachable adapter skips its candidate for now (COMPILE_UNAVAILABLE, issue 20);
    the others still run."""
    adapter.fail_models.add("gen4.5")
    task = await new_task(db, make_spec())
    result = await dispatch_one(make_dispatcher(), task)
    assert result.outcome is DispatchOutcome.SELECTED
    assert result.decision is not None
    verdict = result.decision.verdict("runway/gen4.5/prod-us")
    assert verdict.reason == "COMPILE_UNAVAILABLE"
    assert "unreachable" in verdict.detail


async def test_tenant_max_in_flight_limits_dispatch(
    db: Database, make_dispatcher: DispatcherFactory
) -> None:
    """A tenant at its in-flight limit waits while another tenant's task is dispatched."""
    for i in range(2):
        await new_task(db, make_spec("tenant-a"), key=f"a{i}")
    await new_task(db, make_spec("tenant-b"), key="b0")
    config = DispatcherConfig(fair_queue=FairQueueConfig(default_max_in_flight=1))
    dispatcher = make_dispatcher(config=config)
    assert await dispatcher.tick() == 2
    tasks, _ = await TaskQueries(db).list_tasks(state=TaskState.QUEUED)
    assert [t.tenant_id for t in tasks] == ["tenant-a"]
    assert await dispatcher.tick() == 0
