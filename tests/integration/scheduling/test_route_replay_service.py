"""ReplayService on a real database: decisions the dispatcher recorded are read page by page,
by window and by tenant, and re-decided; bad requests change nothing and name their fields."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import func, select, text

from controlplane.domain.scoring import example_policy
from controlplane.persistence.database import Database
from controlplane.persistence.models import route_decisions as D
from controlplane.persistence.replay_reads import page_query
from controlplane.scheduling.policy_book import SampleCheck
from controlplane.service.access import Caller, Role
from controlplane.service.replay import ReplayInput, ReplayService
from controlplane.service.routing_policies import RoutingPolicyService
from tests.integration.scheduling.conftest import DispatcherFactory
from tests.integration.scheduling.support import CompilingAdapter, make_spec
from tests.integration.scheduling.test_dispatcher import new_task
from vidroute_core.exceptions import InvalidSpec, PermissionDenied, Unavailable

ADMIN = Caller(Role.ADMIN)


def _document(version: str = "router-v17", **weights: float) -> str:
    policy = example_policy(version)
    sets = {n: {k: getattr(w, k) for k in _NAMES} for n, w in policy.weights.items()}
    if weights:
        sets = {"default": {k: weights.get(k, 0.0) for k in _NAMES}}
    return json.dumps(
        {
            "version": version,
            "weights": sets,
            "hysteresis_delta": policy.hysteresis_delta,
            "min_dwell_s": policy.min_dwell_s,
        }
    )


_NAMES = ("quality", "success", "latency", "cost", "capacity", "region", "preference")


async def _recorded(db: Database, make_dispatcher: DispatcherFactory) -> None:
    for i, tenant in enumerate(["tenant-a", "tenant-a", "tenant-b", "tenant-a", "tenant-b"]):
        await new_task(db, make_spec(tenant, seconds=4 + 2 * (i % 2)), key=f"k{i}")
    dispatcher = make_dispatcher()
    await dispatcher.tick()


async def test_replay_reads_every_page_and_filters_by_tenant_and_window(
    db: Database, make_dispatcher: DispatcherFactory
) -> None:
    """With pages of two, every recorded decision is replayed once and the recorded policy
    changes none; a tenant filter and a window after the last decision narrow the set."""
    await _recorded(db, make_dispatcher)
    async with db.reading() as conn:
        total = (await conn.execute(select(func.count()).select_from(D))).scalar_one()
        last = (await conn.execute(select(func.max(D.c.created_at)))).scalar_one()
    assert total == 5
    service = ReplayService(db, page_size=2)
    report = await service.replay(ReplayInput(_document()), ADMIN)
    assert (report.decisions, report.changed, report.skipped) == (5, 0, 0)
    assert report.recorded.policy_version == "router-v17"
    assert report.replayed.estimated_cost_micros == report.recorded.estimated_cost_micros
    only_b = await service.replay(ReplayInput(_document(), tenant_id="tenant-b"), ADMIN)
    assert only_b.decisions == 2
    after = await service.replay(ReplayInput(_document(), since=last + timedelta(seconds=1)), ADMIN)
    assert after.decisions == 0
    cheap = await service.replay(ReplayInput(_document("cheap", cost=1.0)), ADMIN)
    assert cheap.decisions == 5
    assert cheap.replayed.estimated_cost_micros <= cheap.recorded.estimated_cost_micros
    assert cheap.replayed.policy_version == "cheap"


async def test_a_bad_request_is_refused_with_its_fields_before_any_read(db: Database) -> None:
    """A tenant caller is refused; a bad policy file, tenant and window are field violations
    (the file's under ``policy_document.``), all at once."""
    service = ReplayService(db)
    with pytest.raises(PermissionDenied):
        await service.replay(ReplayInput(_document()), Caller(Role.TENANT, "tenant-a"))
    bad = _document().replace('"version": "router-v17"', '"version": ""')
    with pytest.raises(InvalidSpec) as refused:
        await service.replay(ReplayInput(bad, tenant_id="no spaces", since=None, until=None), ADMIN)
    fields = [v.field for v in refused.value.violations]
    assert "tenant_id" in fields
    assert any(f.startswith("policy_document.version") for f in fields), fields
    with pytest.raises(InvalidSpec) as empty:
        await service.replay(ReplayInput("  "), ADMIN)
    assert [v.field for v in empty.value.violations] == ["policy_document"]
    now = datetime.now(UTC)
    with pytest.raises(InvalidSpec) as window:
        await service.replay(ReplayInput(_document(), since=now, until=now), ADMIN)
    assert [v.field for v in window.value.violations] == ["since"]


async def test_pages_follow_decision_time_not_id(
    db: Database, make_dispatcher: DispatcherFactory
) -> None:
    """Decisions whose ids run against their times (interleaved batches) are each replayed
    once, with pages of two, and the window selects them by time: the two newest by time,
    whatever their ids, are exactly the ones at or after their time."""
    await _recorded(db, make_dispatcher)
    base = datetime(2026, 11, 20, tzinfo=UTC)
    async with db.unit(base) as u:
        ids = list((await u.conn.execute(select(D.c.id).order_by(D.c.id))).scalars())
        # ids 1..5 get times 5,4,4,2,1 hours after `base`: two share a time.
        for i, hours in zip(ids, [5, 4, 4, 2, 1], strict=True):
            await u.conn.execute(
                D.update().where(D.c.id == i).values(created_at=base + timedelta(hours=hours))
            )
    service = ReplayService(db, page_size=2)
    everything = await service.replay(ReplayInput(_document()), ADMIN)
    assert everything.decisions == 5
    late = await service.replay(ReplayInput(_document(), since=base + timedelta(hours=4)), ADMIN)
    assert late.decisions == 3
    middle = await service.replay(
        ReplayInput(_document(), since=base + timedelta(hours=2), until=base + timedelta(hours=5)),
        ADMIN,
    )
    assert middle.decisions == 3


async def test_a_page_reads_the_time_index_in_order(db: Database) -> None:
    """A later page's statement is a range scan of ``ix_route_decisions_created_at_id`` with
    no sort (the planner told to avoid both when it can), so it reads one page's rows however
    many decisions the table holds before or after the window."""
    now = datetime.now(UTC)
    query = page_query(
        since=now - timedelta(days=7),
        until=now,
        tenant_id="",
        after=(now - timedelta(days=1), 42),
        limit=500,
    )
    async with db.reading() as conn:
        sql = str(query.compile(conn.sync_connection, compile_kwargs={"literal_binds": True}))
        if conn.dialect.name == "postgresql":
            await conn.execute(text("SET LOCAL enable_seqscan = off"))
            await conn.execute(text("SET LOCAL enable_sort = off"))
            plan = "\n".join(r[0] for r in await conn.execute(text(f"EXPLAIN {sql}")))
            assert "Sort" not in plan, plan
        else:
            plan = "\n".join(r[-1] for r in await conn.execute(text(f"EXPLAIN QUERY PLAN {sql}")))
            assert "TEMP B-TREE" not in plan, plan
    assert "ix_route_decisions_created_at_id" in plan, plan


async def test_a_replayed_file_is_validated_as_a_publication(
    db: Database, make_dispatcher: DispatcherFactory
) -> None:
    """With the publication's validation wired, a file whose sample no candidate can serve,
    or whose shadow names an unpublished version, is refused under ``policy_document.`` before
    any decision is replayed; a file whose samples compile replays."""
    await _recorded(db, make_dispatcher)
    policies = RoutingPolicyService(db, sample_check=SampleCheck(make_dispatcher()))
    service = ReplayService(db, validate=policies.validate)
    sample = {"tenant_id": "t", "prompt": "p", "mode": "TEXT_TO_VIDEO"}
    ok = {**json.loads(_document()), "samples": [{**sample, "output": _output(4_000)}]}
    report = await service.replay(ReplayInput(json.dumps(ok)), ADMIN)
    assert report.decisions == 5
    impossible = {**ok, "samples": [{**sample, "output": _output(590_000)}]}
    with pytest.raises(InvalidSpec) as refused:
        await service.replay(ReplayInput(json.dumps(impossible)), ADMIN)
    assert [v.field for v in refused.value.violations] == ["policy_document.samples[0]"]
    unknown_shadow = {**ok, "shadow": "never-published"}
    with pytest.raises(InvalidSpec) as shadow:
        await service.replay(ReplayInput(json.dumps(unknown_shadow)), ADMIN)
    assert [v.field for v in shadow.value.violations] == ["policy_document.shadow"]


def _output(duration_ms: int) -> dict[str, int]:
    return {"width": 1280, "height": 720, "duration_ms": duration_ms}


async def test_a_sample_no_adapter_could_compile_is_unavailable_not_invalid(
    db: Database, make_dispatcher: DispatcherFactory, adapter: CompilingAdapter
) -> None:
    """When every adapter's Compile fails (unreachable), the publication check cannot judge a
    sample: it answers Unavailable (retry), not a field violation that blames the document; the
    same file is accepted once the adapters answer again, and nothing was published before."""
    policies = RoutingPolicyService(db, sample_check=SampleCheck(make_dispatcher()))
    sample = {"tenant_id": "t", "prompt": "p", "mode": "TEXT_TO_VIDEO", "output": _output(4_000)}
    doc = json.dumps({**json.loads(_document()), "samples": [sample]})
    adapter.fail_models = {c.model for c in adapter.capabilities}
    with pytest.raises(Unavailable) as down:
        await policies.publish(doc, caller=ADMIN)
    assert "samples[0]" in str(down.value)
    assert await policies.list_policies(ADMIN) == []
    adapter.fail_models = set()
    assert (await policies.publish(doc, caller=ADMIN)).active
