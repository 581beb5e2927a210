"""The shared publish path of versioned documents, on SQLite and PostgreSQL, through the tenants
service: diff against the active version, dry run, scheduled and staged activation, rollback,
and the audit row of each; scheduled activation with an injected clock, never a sleep."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import func, select

from controlplane.persistence.database import Database
from controlplane.persistence.models import tenant_config_activations, tenant_config_versions
from controlplane.service.access import Caller
from controlplane.service.activator import DocumentActivator
from controlplane.service.tenants import TenantBook, TenantConfigService
from controlplane.service.versioned import Release
from vidroute_core.exceptions import InvalidSpec, PreconditionFailed

pytestmark = pytest.mark.timeout(60)
T0 = datetime(2026, 12, 5, 12, 0, tzinfo=UTC)
ADMIN = Caller.admin("ops")


class Clock:
    """A wall clock the test moves."""

    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> datetime:
        return self.now


def document(version: str, weight: int) -> str:
    body = {
        "version": version,
        "default": {"service_classes": {"STANDARD": {"weight": 1}}},
        "tenants": {"acme": {"service_classes": {"STANDARD": {"weight": weight}}}},
    }
    return json.dumps(body, indent=1)


def service(db: Database, clock: Clock, book: TenantBook | None = None) -> TenantConfigService:
    return TenantConfigService(db, book or TenantBook(db), clock=clock)


async def counts(db: Database) -> tuple[int, int]:
    async with db.reading() as conn:
        versions = (
            await conn.execute(select(func.count()).select_from(tenant_config_versions))
        ).scalar_one()
        activations = (
            await conn.execute(select(func.count()).select_from(tenant_config_activations))
        ).scalar_one()
    return int(versions), int(activations)


async def active(svc: TenantConfigService) -> str:
    return (await svc.get()).version


def audit(history: Any) -> list[tuple[str, str, str | None, bool]]:
    return [(a.action, a.version, a.previous_version, a.pending) for a in history.activations]


async def test_publish_and_dry_run_show_the_diff_and_a_dry_run_writes_nothing(
    db: Database,
) -> None:
    """A dry run returns the per-path diff against the active version and writes no row; the
    publication returns the same diff and records its reason."""
    clock = Clock()
    svc = service(db, clock)
    await svc.publish(document("t-1", 2), caller=ADMIN)
    before = await counts(db)
    dry = await svc.release(document("t-2", 5), dry_run=True, caller=ADMIN)
    assert [str(c) for c in dry.changes] == [
        "tenants.acme.service_classes.STANDARD.weight: 2 -> 5",
        "version: t-1 -> t-2",
    ]
    assert not dry.row.active
    assert await counts(db) == before
    done = await svc.release(document("t-2", 5), caller=ADMIN, release=Release(reason="more"))
    assert done.changes == dry.changes
    assert done.row.active
    last = (await svc.history()).activations[-1]
    assert (last.action, last.actor, last.reason, last.previous_version) == (
        "PUBLISHED",
        "ops",
        "more",
        "t-1",
    )


async def test_a_scheduled_version_becomes_active_at_its_time_and_is_audited(
    db: Database,
) -> None:
    """Published with activate_at, a version stays inactive until the clock reaches that time;
    then apply_due activates it once, recorded with requested and effective times and what it
    replaced, and the tenants book sees it on its next read."""
    clock, book = Clock(), TenantBook(db)
    svc = service(db, clock, book)
    await svc.publish(document("t-1", 2), caller=ADMIN)
    at = T0 + timedelta(minutes=10)
    out = await svc.release(
        document("t-2", 5), caller=ADMIN, release=Release(activate_at=at, reason="launch")
    )
    assert out.activate_at == at
    assert not out.row.active
    assert await svc.documents.next_due() == at
    clock.now = at - timedelta(seconds=1)
    assert await svc.documents.apply_due() == []
    assert await active(svc) == "t-1"
    clock.now = at + timedelta(milliseconds=5)
    assert [a.version for a in await svc.documents.apply_due()] == ["t-2"]
    assert await svc.documents.apply_due() == []  # once
    assert await active(svc) == "t-2"
    assert (await book.current(0.0)).version == "t-2"
    history = await svc.history()
    assert audit(history) == [("PUBLISHED", "t-1", None, False), ("SCHEDULED", "t-2", "t-1", False)]
    scheduled = history.activations[-1]
    assert scheduled.requested_at == T0
    assert scheduled.at == clock.now
    assert (scheduled.actor, scheduled.reason) == ("ops", "launch")
    assert await svc.documents.next_due() is None


async def test_replicas_racing_a_due_activation_apply_it_once(db: Database) -> None:
    """Three replicas' services applying the same due activation at once: one activation row,
    one active version (the publication lock serialises them)."""
    clock = Clock()
    replicas = [service(db, clock) for _ in range(3)]
    await replicas[0].publish(document("t-1", 2), caller=ADMIN)
    at = T0 + timedelta(seconds=30)
    await replicas[1].release(document("t-2", 5), caller=ADMIN, release=Release(activate_at=at))
    clock.now = at
    done = await asyncio.gather(*(r.documents.apply_due() for r in replicas))
    assert sorted(len(d) for d in done) == [0, 0, 1]
    assert audit(await replicas[2].history())[-1] == ("SCHEDULED", "t-2", "t-1", False)
    assert await counts(db) == (2, 2)


async def test_a_staged_version_waits_for_activate_and_rollback_skips_it(db: Database) -> None:
    """A staged publication is not active until `activate`, recorded as ACTIVATED with its
    reason; an empty rollback goes to the version before that was ever active, not a staged
    one never used."""
    clock = Clock()
    svc = service(db, clock)
    await svc.publish(document("t-1", 2), caller=ADMIN)
    staged = await svc.release(document("t-2", 5), caller=ADMIN, release=Release(staged=True))
    assert not staged.row.active
    assert await active(svc) == "t-1"
    await svc.release(document("t-3", 7), caller=ADMIN, release=Release(staged=True))
    clock.now += timedelta(minutes=1)
    row = await svc.activate("t-3", ADMIN, release=Release(reason="go"))
    assert row.active
    assert await active(svc) == "t-3"
    await svc.rollback(caller=ADMIN, reason="bad weights")
    assert await active(svc) == "t-1"  # not t-2: staged, never active
    history = await svc.history()
    assert audit(history)[1:] == [
        ("ACTIVATED", "t-3", "t-1", False),
        ("ROLLED_BACK", "t-1", "t-3", False),
    ]
    assert [a.reason for a in history.activations[1:]] == ["go", "bad weights"]


async def test_a_bad_release_is_refused_and_writes_nothing(db: Database) -> None:
    """An activation time in the past, or both staged and timed, is INVALID_ARGUMENT naming
    activate_at; activating nothing published is FAILED_PRECONDITION; nothing is written."""
    clock = Clock()
    svc = service(db, clock)
    await svc.publish(document("t-1", 2), caller=ADMIN)
    before = await counts(db)
    for release in (
        Release(activate_at=T0 - timedelta(seconds=1)),
        Release(activate_at=T0 + timedelta(hours=1), staged=True),
    ):
        with pytest.raises(InvalidSpec) as refused:
            await svc.release(document("t-2", 5), caller=ADMIN, release=release)
        assert [v.field for v in refused.value.violations] == ["activate_at"]
    with pytest.raises(PreconditionFailed):
        await svc.rollback(caller=ADMIN)  # t-1 is the first
    assert await counts(db) == before


async def test_the_activator_wakes_at_the_soonest_pending_time(db: Database) -> None:
    """The activator's pass applies what is due and sleeps until the next pending time (its
    poll bound otherwise), so an activation happens on time without a polling loop's lag."""
    clock = Clock()
    svc = service(db, clock)
    activator = DocumentActivator([svc.documents], poll_s=5.0, clock=clock)
    assert await activator.run_once() == 5.0
    await svc.publish(document("t-1", 2), caller=ADMIN)
    at = T0 + timedelta(seconds=2)
    await svc.release(document("t-2", 5), caller=ADMIN, release=Release(activate_at=at))
    assert await activator.run_once() == pytest.approx(2.0)
    clock.now = at
    assert await activator.run_once() == 5.0
    assert await active(svc) == "t-2"


async def test_the_running_activator_applies_a_schedule_made_here_on_time(db: Database) -> None:
    """With a poll period far longer than the wait, a schedule made in this process kicks the
    running activator, which sleeps until the time and applies it then (effective within a
    second of the time asked, never before it)."""
    kicked = asyncio.Event()
    svc = TenantConfigService(db, TenantBook(db), on_schedule=kicked.set)
    activator = DocumentActivator([svc.documents], poll_s=60.0, kicked=kicked)
    await svc.publish(document("t-1", 2), caller=ADMIN)
    activator.start()
    try:
        at = datetime.now(UTC) + timedelta(milliseconds=300)
        await svc.release(document("t-2", 5), caller=ADMIN, release=Release(activate_at=at))
        deadline = asyncio.get_running_loop().time() + 10.0
        while await active(svc) != "t-2":
            assert asyncio.get_running_loop().time() < deadline, "not applied within 10 s"
            await asyncio.sleep(0.02)
    finally:
        await activator.stop()
    effective = (await svc.history()).activations[-1].at
    assert at <= effective < at + timedelta(seconds=1), effective - at
