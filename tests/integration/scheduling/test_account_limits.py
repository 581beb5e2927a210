"""The accounts document in dispatch (design 9.11, 9.19.1), on a real database: its limits are
lease dimensions of the next round (no restart), the modality's among them; the lease
reconciliation computes the same dimensions from PostgreSQL, so it corrects nothing that is
right and rebuilds what the store lost; a disabled account and a region outside an account's
own are named in explain."""

from __future__ import annotations

import pytest

from controlplane.domain.routing.filters import Reason
from controlplane.leases.memory_store import MemoryLeaseStore
from controlplane.persistence.database import Database
from controlplane.persistence.tasks import TaskQueries
from controlplane.scheduling.dispatcher import DispatchOutcome
from controlplane.scheduling.relet import lease_source
from controlplane.scheduling.upkeep import Upkeep
from controlplane.service.accounts import AccountBook, AccountConfigService
from tests.integration.scheduling.conftest import DispatcherFactory
from tests.integration.scheduling.support import NOW, dispatch_one, make_spec
from tests.integration.scheduling.test_dispatcher import new_task
from vidroute_core.spec import GenerationSpec, RoutingMode

pytestmark = pytest.mark.timeout(120)
RUNWAY = "runway:prod-us"


def document(version: str, limits: str = "", google: str = "") -> str:
    return f"""\
version: {version}
accounts:
  runway:
    prod-us:
      credential_ref: env:RUNWAY_API_KEY
      limits: {{{limits}}}
{google}"""


def _runway_gen45(tenant: str = "tenant-a") -> GenerationSpec:
    return make_spec(
        tenant, mode=RoutingMode.STRICT_MODEL, required_provider="runway", required_model="gen4.5"
    )


async def test_a_modality_limit_is_leased_and_reconciled_from_the_tasks_mode(
    db: Database, leases: MemoryLeaseStore, make_dispatcher: DispatcherFactory
) -> None:
    """TEXT_TO_VIDEO limited to 1 on runway/prod-us: one of two text-to-video tasks is leased
    (with a modality dimension), the other waits; reconciliation finds nothing to correct, and
    rebuilds the modality counter after the store loses it."""
    book = AccountBook(db)
    await AccountConfigService(db, book).publish(
        document("a-1", "modality_concurrency: {TEXT_TO_VIDEO: 1}")
    )
    first = await new_task(db, _runway_gen45())
    second = await new_task(db, _runway_gen45(), key="k2")
    dispatcher = make_dispatcher(accounts=book)
    assert (await dispatch_one(dispatcher, first)).outcome is DispatchOutcome.SELECTED
    assert (await dispatch_one(dispatcher, second)).outcome is DispatchOutcome.NO_CAPACITY
    snapshot = await leases.snapshot(RUNWAY)
    [lease] = snapshot.leases
    assert {d.key: d.capacity for d in lease.dimensions}["modality:TEXT_TO_VIDEO"] == 1
    assert snapshot.used["modality:TEXT_TO_VIDEO"] == 1
    detail = await TaskQueries(db).get_task(first.id)
    assert detail is not None
    [attempt] = detail.attempts
    async with db.unit(NOW) as u:
        await u.move_attempt(attempt, type(attempt.state).SUBMITTING)
    upkeep = Upkeep(
        db=db,
        leases=leases,
        catalog=dispatcher.catalog,
        is_leader=lambda: True,
        wake=lambda: None,
        worker_id="accounts-test",
        clock=lambda: NOW,
        limits_for=dispatcher.limits_for,
    )
    assert await upkeep.reconcile_leases() == []
    await leases.set_used(RUNWAY, "modality:TEXT_TO_VIDEO", 0)
    [drift] = await upkeep.reconcile_leases()
    assert (drift.dimension, drift.delta) == ("modality:TEXT_TO_VIDEO", 1)


@pytest.mark.parametrize(
    "limits", ["modality_concurrency: {TEXT_TO_VIDEO: 1}", "max_concurrency: 4"]
)
async def test_a_relet_lease_has_the_dimensions_the_round_leased(
    db: Database, leases: MemoryLeaseStore, make_dispatcher: DispatcherFactory, limits: str
) -> None:
    """The lease an attempt takes again before its send (`relet.lease_source`) asks for the
    dimensions its dispatch round leased: the task's modality among them where the account
    limits modalities (read from the task), none where it does not."""
    book = AccountBook(db)
    await AccountConfigService(db, book).publish(document("a-1", limits))
    task = await new_task(db, _runway_gen45())
    dispatcher = make_dispatcher(accounts=book)
    assert (await dispatch_one(dispatcher, task)).outcome is DispatchOutcome.SELECTED
    [lease] = (await leases.snapshot(RUNWAY)).leases
    detail = await TaskQueries(db).get_task(task.id)
    assert detail is not None
    [attempt] = detail.attempts
    request = await lease_source(dispatcher)(attempt)
    assert request is not None
    assert request.dimensions == lease.dimensions
    keys = {d.key for d in request.dimensions}
    assert ("modality:TEXT_TO_VIDEO" in keys) is ("modality" in limits)


async def test_a_published_total_counts_from_the_next_round(
    db: Database, leases: MemoryLeaseStore, make_dispatcher: DispatcherFactory
) -> None:
    """Without a document runway/prod-us's total is max(model cap, 4); a published total of 1
    holds from the next dispatch, with no restart, and a total of 2 lets one more in."""
    book = AccountBook(db)
    service = AccountConfigService(db, book)
    dispatcher = make_dispatcher(accounts=book)
    tasks = [await new_task(db, _runway_gen45(f"tenant-{n}"), key=f"k{n}") for n in range(4)]
    assert (await dispatch_one(dispatcher, tasks[0])).outcome is DispatchOutcome.SELECTED
    await service.publish(document("a-1", "max_concurrency: 1"))
    assert (await dispatch_one(dispatcher, tasks[1])).outcome is DispatchOutcome.NO_CAPACITY
    await service.publish(document("a-2", "max_concurrency: 2"))
    assert (await dispatch_one(dispatcher, tasks[2])).outcome is DispatchOutcome.SELECTED
    assert (await dispatch_one(dispatcher, tasks[3])).outcome is DispatchOutcome.NO_CAPACITY
    assert (await leases.snapshot(RUNWAY)).used["account"] == 2


async def test_a_disabled_account_and_an_account_region_are_named_in_explain(
    db: Database, make_dispatcher: DispatcherFactory
) -> None:
    """google/veo-prod-us disabled and google/veo-prod-apac restricted to us: every google
    candidate is refused with ACCOUNT_DISABLED or REGION_NOT_ALLOWED naming its account."""
    book = AccountBook(db)
    google = """\
  google:
    veo-prod-us:
      credential_ref: env:GEMINI_API_KEY
      enabled: false
    veo-prod-apac:
      credential_ref: env:GEMINI_API_KEY
      regions: [us]
"""
    await AccountConfigService(db, book).publish(document("a-1", google=google))
    task = await new_task(db, make_spec(required_provider="google"))
    result = await dispatch_one(make_dispatcher(accounts=book), task)
    assert result.decision is not None
    reasons = {
        (v.candidate.account, v.reason, v.detail)
        for v in result.decision.verdicts
        if v.candidate.provider == "google"
    }
    accounts = {account for account, _, _ in reasons}
    assert accounts == {"veo-prod-us", "veo-prod-apac"}
    for account, reason, detail in reasons:
        if account == "veo-prod-us":
            assert reason == Reason.ACCOUNT_DISABLED.value
            assert "google/veo-prod-us is disabled (accounts a-1)" in detail
        else:
            assert reason == Reason.REGION_NOT_ALLOWED.value
            assert "google/veo-prod-apac runs in us only" in detail
    assert result.outcome is DispatchOutcome.FAILED
