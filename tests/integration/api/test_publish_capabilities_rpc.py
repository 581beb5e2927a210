"""Capability releases over gRPC (issue 21 item 5), on SQLite and PostgreSQL: a control plane
`start_control_plane` builds with the Runway emulator and its real sidecar (Redis holds the
leases), whose catalog starts from the sidecar's Describe.

Every publish is sample-compiled on the live sidecar, diffed against the catalog in effect and
refused when a serving model would break; what each test proves is in its docstring.
"""

from __future__ import annotations

import asyncio
import copy
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml
from google.rpc import error_details_pb2, status_pb2
from sqlalchemy import func, select

from controlplane.api.auth import hash_token, new_token
from controlplane.bootstrap import Settings, start_control_plane
from controlplane.capabilities.publish import (
    AccountConfig,
    documents_from_file,
    publish_documents,
)
from controlplane.capabilities.samples import sample_specs
from controlplane.persistence.catalog import CapabilityRecord, CatalogQueries
from controlplane.persistence.database import Database
from controlplane.persistence.models import provider_model_capabilities, provider_price_versions
from controlplane.service.access import Caller
from tests.support.stack import ProviderFarm, RedisDb
from vidroute.scheduler.v1 import scheduler_service_pb2 as api
from vidroute.scheduler.v1 import scheduler_service_pb2_grpc
from vidroute_core.capabilities.loader import load_file

ROOT = Path(__file__).resolve().parents[3]
RUNWAY_FILE = ROOT / "adapter_sidecars/runway/capabilities/runway-2026-06.yaml"
SHIPPED = RUNWAY_FILE.read_text(encoding="utf-8")
NEW_VERSION = "runway/gen4.5/2026-12-05"
TIME_SCALE = 0.2  # a release compiles ~150 samples: room for a loaded 2-core machine


@pytest.fixture(scope="module")
def farm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProviderFarm]:
    """The Runway emulator and its sidecar, shared by the module (the catalog is per test)."""
    with ProviderFarm(
        tmp_path_factory.mktemp("farm"), time_scale=TIME_SCALE, providers=["runway"]
    ) as started:
        yield started


async def retried(call: Callable[[], Awaitable[Any]], deadline_s: float = 60.0) -> Any:
    """As a client does: UNAVAILABLE (a sample compile that timed out on a loaded machine,
    before anything was written) is retried; the same request is idempotent."""
    until = time.monotonic() + deadline_s
    while True:
        try:
            return await call()
        except grpc.aio.AioRpcError as exc:
            if exc.code() is not grpc.StatusCode.UNAVAILABLE or time.monotonic() > until:
                raise


@dataclass
class Admin:
    stub: scheduler_service_pb2_grpc.SchedulerServiceAsyncStub  # the .pyi's name, typing only
    db: Database
    tokens: dict[str, str]

    def _auth(self, who: str = "admin") -> tuple[tuple[str, str]]:
        return (("authorization", f"Bearer {self.tokens[who]}"),)

    async def publish(
        self, document: str, *, who: str = "admin", **fields: Any
    ) -> api.PublishCapabilitiesResponse:
        request = api.PublishCapabilitiesRequest(document=document, source="runway.yaml", **fields)
        reply: api.PublishCapabilitiesResponse = await retried(
            lambda: self.stub.PublishCapabilities(request, metadata=self._auth(who), timeout=60)
        )
        return reply

    async def rollback(self, version: str = "", **fields: Any) -> api.RollbackCapabilitiesResponse:
        request = api.RollbackCapabilitiesRequest(version=version, **fields)
        reply: api.RollbackCapabilitiesResponse = await retried(
            lambda: self.stub.RollbackCapabilities(request, metadata=self._auth(), timeout=60)
        )
        return reply

    async def activate(self, version: str) -> api.ActivateCapabilitiesResponse:
        return await self.stub.ActivateCapabilities(
            api.ActivateCapabilitiesRequest(version=version), metadata=self._auth(), timeout=60
        )

    async def history(self) -> api.ListCapabilityHistoryResponse:
        return await self.stub.ListCapabilityHistory(
            api.ListCapabilityHistoryRequest(), metadata=self._auth(), timeout=30
        )

    async def effective(self, model: str) -> CapabilityRecord:
        records = await CatalogQueries(self.db).effective_capabilities(datetime.now(UTC))
        return next(r for r in records if r.model == model)

    async def rows(self) -> tuple[int, int]:
        async with self.db.reading() as conn:
            caps = await conn.scalar(select(func.count()).select_from(provider_model_capabilities))
            prices = await conn.scalar(select(func.count()).select_from(provider_price_versions))
        return int(caps or 0), int(prices or 0)


@pytest.fixture
async def admin(
    database_url: str, farm: ProviderFarm, redis_server_url: str
) -> AsyncIterator[Admin]:
    """A scheduling control plane on the farm's Runway sidecar, with an admin and a tenant;
    yielded once the sidecar's Describe is in the catalog."""
    tokens = {"admin": new_token(), "tenant": new_token()}
    with RedisDb(redis_server_url) as redis:
        server = await start_control_plane(
            Settings(
                database_url=database_url,
                redis_url=redis.url,
                listen="127.0.0.1:0",
                adapters={"runway": farm.sidecars["runway"].address},
                time_scale=TIME_SCALE,
                auth_tokens={
                    hash_token(tokens["admin"]): Caller.admin(),
                    hash_token(tokens["tenant"]): Caller.tenant("acme"),
                },
            )
        )
        db = Database.from_url(database_url)
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
                stub = scheduler_service_pb2_grpc.SchedulerServiceStub(channel)
                ready = Admin(stub, db, tokens)
                deadline = time.monotonic() + 30
                while (await ready.rows())[0] < 3:  # Describe's three Runway models
                    assert time.monotonic() < deadline, "the catalog was never published"
                    await _pause()
                yield ready
        finally:
            await db.dispose()
            await server.stop(grace=0.5)


async def _pause() -> None:
    """A poll's step while waiting for a condition under a deadline."""
    await asyncio.sleep(0.05)


def _entries() -> list[dict[str, Any]]:
    return documents_from_file(RUNWAY_FILE)


def _yaml(entries: list[dict[str, Any]]) -> str:
    return yaml.safe_dump_all(entries, sort_keys=False)


def _newer(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The shipped entries with gen4.5 under a new version and a 10% dearer price."""
    out = copy.deepcopy(entries)
    gen = next(e for e in out if e["model"] == "gen4.5")
    gen["version"] = "2026-12-05"
    gen["capability_version"] = NEW_VERSION
    gen["commercial"]["price_version"] = "runway-2026-12"
    gen["commercial"]["price_micros_per_output_second"] = 132000
    return out


def _changes(reply: Any) -> dict[str, Any]:
    return {c.model: c for c in reply.changes}


def _details(exc: grpc.aio.AioRpcError) -> tuple[dict[str, str], str]:
    """The BadRequest violations (field -> description) and the ErrorInfo reason."""
    raw = dict(exc.trailing_metadata() or ())["grpc-status-details-bin"]
    status = status_pb2.Status.FromString(raw)
    bad, info = error_details_pb2.BadRequest(), error_details_pb2.ErrorInfo()
    for detail in status.details:
        detail.Unpack(bad) or detail.Unpack(info)
    return {v.field: v.description for v in bad.field_violations}, info.reason


def _shipped_samples() -> int:
    return sum(len(sample_specs(c)) for c in load_file(RUNWAY_FILE))


async def test_the_shipped_file_republished_is_a_compiled_no_op(admin: Admin) -> None:
    """The shipped file the sidecar described publishes as a release that changes no model,
    after compiling every one of its samples on the sidecar; publishing it again is a retry."""
    first = await admin.publish(SHIPPED)
    assert first.state == "ACTIVE"
    assert not first.unchanged
    assert {c.kind for c in first.changes} == {"UNCHANGED"}
    assert set(_changes(first)) == {"gen4.5", "gen4_turbo", "veo3.1"}
    assert first.samples_compiled == _shipped_samples() > 100
    assert dict(first.counts)["capabilities"] == 0
    again = await admin.publish(SHIPPED)
    assert again.unchanged
    assert again.version == first.version
    history = await admin.history()
    assert [r.version for r in history.releases] == [first.version]
    assert [(a.action, a.actor) for a in history.activations] == [("PUBLISHED", "admin")]


async def test_a_new_version_and_price_are_diffed_then_served(admin: Admin) -> None:
    """A new capability version with a 10% price change: the dry run shows the diff and writes
    nothing; the publish makes it the version and price routing reads, and the sidecar
    compiled it (no NOT_FOUND for a version its files never had)."""
    before = await admin.rows()
    dry = await admin.publish(_yaml(_newer(_entries())), dry_run=True)
    change = _changes(dry)["gen4.5"]
    assert change.kind == "CHANGED"
    assert {"capability_version", "version", "commercial.price_micros_per_output_second"} <= set(
        change.fields
    )
    assert (change.old_price_micros_per_unit, change.new_price_micros_per_unit) == (
        120000,
        132000,
    )
    assert _changes(dry)["gen4_turbo"].kind == "UNCHANGED"
    assert await admin.rows() == before
    assert (await admin.history()).activations == []

    published = await admin.publish(_yaml(_newer(_entries())))
    assert published.state == "ACTIVE"
    assert published.samples_compiled > 0
    now = await admin.effective("gen4.5")
    assert (now.capability_version, now.price_version, now.price_micros_per_unit) == (
        NEW_VERSION,
        "runway-2026-12",
        132000,
    )


async def test_a_restart_describing_the_old_files_does_not_undo_a_release(admin: Admin) -> None:
    """The sidecars' Describe published again at a start (their files still say 2026-06-01)
    leaves the release's gen4.5 version and price in effect."""
    await admin.publish(_yaml(_newer(_entries())))
    accounts = [
        AccountConfig(a.provider, a.account_name, a.region, a.credential_ref, config=a.config)
        for a in await CatalogQueries(admin.db).accounts()
    ]
    await publish_documents(
        admin.db, _entries(), accounts, now=datetime.now(UTC), source="describe"
    )
    now = await admin.effective("gen4.5")
    assert (now.capability_version, now.price_micros_per_unit) == (NEW_VERSION, 132000)


async def test_rollback_returns_to_the_earlier_release_and_is_audited(admin: Admin) -> None:
    """Shipped, then the new version, then one rollback: gen4.5 serves its shipped version and
    price again, and the history says who did what and what each activation replaced."""
    shipped = await admin.publish(SHIPPED)
    newer = await admin.publish(_yaml(_newer(_entries())))
    back = await admin.rollback()
    assert back.version == shipped.version
    assert _changes(back)["gen4.5"].new_capability_version == "runway/gen4.5/2026-06-01"
    now = await admin.effective("gen4.5")
    assert (now.capability_version, now.price_micros_per_unit) == (
        "runway/gen4.5/2026-06-01",
        120000,
    )
    history = await admin.history()
    audit = [(a.action, a.version, a.previous_version) for a in history.activations]
    assert audit == [
        ("PUBLISHED", shipped.version, ""),
        ("PUBLISHED", newer.version, shipped.version),
        ("ROLLED_BACK", shipped.version, newer.version),
    ]
    replaced = history.activations[2].replaced
    assert [(c.model, c.old_capability_version) for c in replaced] == [("gen4.5", NEW_VERSION)]
    forward = await admin.rollback(newer.version)  # any earlier release, in one command
    assert (await admin.effective("gen4.5")).capability_version == NEW_VERSION
    assert forward.version == newer.version


async def test_a_typo_or_a_missing_ratio_mapping_fails_the_dry_run(admin: Admin) -> None:
    """A model the adapter cannot map is a field violation naming its entry; a serving model
    declaring a ratio the adapter has no mapping for is FAILED_PRECONDITION naming the model
    and the ratio; nothing is written."""
    before = await admin.rows()
    typo = copy.deepcopy(_entries()[0])
    typo["model"], typo["capability_version"] = "gen4.55", "runway/gen4.55/2026-12-05"
    with pytest.raises(grpc.aio.AioRpcError) as bad:
        await admin.publish(_yaml([typo]), dry_run=True)
    assert bad.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    violations, _ = _details(bad.value)
    assert "gen4.55" in violations["document[0]"]
    assert "cannot map" in violations["document[0]"]

    ratio = _newer(_entries())[:1]
    ratio[0]["output"]["aspect_ratios"].append("2:1")
    with pytest.raises(grpc.aio.AioRpcError) as broken:
        await admin.publish(_yaml(ratio), dry_run=True)
    assert broken.value.code() is grpc.StatusCode.FAILED_PRECONDITION
    _, reason = _details(broken.value)
    assert reason == "SERVING_MODEL_UNSERVABLE"
    assert "runway/gen4.5@" in (broken.value.details() or "")
    assert "no Runway ratio for 2:1@720p" in (broken.value.details() or "")
    assert await admin.rows() == before


async def test_retiring_a_serving_model_needs_force_and_a_recorded_reason(admin: Admin) -> None:
    """gen4_turbo set to sunset is refused naming it; force without a reason is a field
    violation; forced with one it publishes and the history records the reason."""
    entries = _entries()
    turbo = next(e for e in entries if e["model"] == "gen4_turbo")
    turbo["status"], turbo["capability_version"] = "sunset", "runway/gen4_turbo/retired"
    text = _yaml([turbo])
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await admin.publish(text)
    assert refused.value.code() is grpc.StatusCode.FAILED_PRECONDITION
    assert "gen4_turbo" in (refused.value.details() or "")
    assert "retired" in (refused.value.details() or "")
    with pytest.raises(grpc.aio.AioRpcError) as no_reason:
        await admin.publish(text, force=True)
    assert no_reason.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    forced = await admin.publish(text, force=True, reason="provider EOL notice 2026-12")
    assert forced.forced_reason == "provider EOL notice 2026-12"
    history = await admin.history()
    assert history.releases[0].forced_reason == "provider EOL notice 2026-12"
    assert history.activations[-1].reason == "provider EOL notice 2026-12"


async def test_staged_and_scheduled_releases_take_effect_when_told(admin: Admin) -> None:
    """A staged release changes nothing until activated; a scheduled one takes effect at its
    time by itself, and no other release may be activated before it."""
    staged = await admin.publish(_yaml(_newer(_entries())), staged=True)
    assert staged.state == "STAGED"
    assert (await admin.effective("gen4.5")).capability_version != NEW_VERSION
    activated = await admin.activate(staged.version)
    assert activated.release.state == "APPLIED"
    assert (await admin.effective("gen4.5")).capability_version == NEW_VERSION

    later = _newer(_entries())[:1]
    later[0]["capability_version"] = "runway/gen4.5/2027-01-01"
    at = datetime.now(UTC) + timedelta(seconds=1.5)
    request = api.PublishCapabilitiesRequest(document=_yaml(later), source="runway.yaml")
    request.activate_at.FromDatetime(at)
    scheduled = await admin.stub.PublishCapabilities(request, metadata=admin._auth(), timeout=60)
    assert scheduled.state == "SCHEDULED"
    assert (await admin.effective("gen4.5")).capability_version == NEW_VERSION
    with pytest.raises(grpc.aio.AioRpcError) as waiting:
        await admin.publish(SHIPPED)
    assert waiting.value.code() is grpc.StatusCode.FAILED_PRECONDITION
    deadline = time.monotonic() + 10
    while (await admin.effective("gen4.5")).capability_version != "runway/gen4.5/2027-01-01":
        assert time.monotonic() < deadline, "the scheduled release never took effect"
        await _pause()
    assert datetime.now(UTC) >= at
    assert [a.action for a in (await admin.history()).activations][-1] == "SCHEDULED"


async def test_two_activations_of_one_staged_release_apply_it_once(admin: Admin) -> None:
    """Two admins activate the same staged release at once: both pass the STAGED check before
    either writes, the release lock orders their writes, and the second finds it APPLIED and
    is refused (FAILED_PRECONDITION), so the history holds one activation of it."""
    staged = await admin.publish(_yaml(_newer(_entries())), staged=True)
    replies = await asyncio.gather(
        admin.activate(staged.version), admin.activate(staged.version), return_exceptions=True
    )
    applied = [r for r in replies if isinstance(r, api.ActivateCapabilitiesResponse)]
    refused = [r for r in replies if isinstance(r, grpc.aio.AioRpcError)]
    assert (len(applied), len(refused)) == (1, 1), replies
    assert refused[0].code() is grpc.StatusCode.FAILED_PRECONDITION
    assert "not staged" in (refused[0].details() or "")
    activations = [a for a in (await admin.history()).activations if a.version == staged.version]
    assert len(activations) == 1


async def test_an_immediate_release_is_not_pending_to_a_writer_with_an_earlier_clock(
    admin: Admin,
) -> None:
    """A writer that read its clock before another's immediate activation committed (two
    admins at once) sees that activation take effect after its own clock; it is in effect,
    not scheduled, so nothing is pending to that writer."""
    before = datetime.now(UTC)
    await admin.activate((await admin.publish(_yaml(_newer(_entries())), staged=True)).version)
    async with admin.db.unit(before) as u:
        assert await u.pending_capability_release() is None


async def test_bad_entries_reject_the_whole_document_with_field_violations(admin: Admin) -> None:
    """An unknown mode in entry 1 and no price in entry 2: INVALID_ARGUMENT naming both
    entries (the good entry 0 is not written either); a document that is not YAML, or nested
    past the parser's recursion, names `document`."""
    before = await admin.rows()
    broken = _newer(_entries())
    broken[1]["modes"] = ["TELEPATHY"]
    del broken[2]["commercial"]
    with pytest.raises(grpc.aio.AioRpcError) as bad:
        await admin.publish(_yaml(broken))
    assert bad.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    violations, _ = _details(bad.value)
    assert set(violations) == {"document[1]", "document[2]"}, violations
    assert "TELEPATHY" in violations["document[1]"]
    assert "no price" in violations["document[2]"]
    for text in ("provider: [runway\n", "[" * 5000 + "]" * 5000, json.dumps([])):
        with pytest.raises(grpc.aio.AioRpcError) as unparsable:  # never INTERNAL
            await admin.publish(text)
        assert unparsable.value.code() is grpc.StatusCode.INVALID_ARGUMENT
        assert set(_details(unparsable.value)[0]) == {"document"}
    assert await admin.rows() == before


async def test_a_tenant_may_not_publish_or_roll_back(admin: Admin) -> None:
    """A tenant's token is PERMISSION_DENIED for a publish and a rollback."""
    with pytest.raises(grpc.aio.AioRpcError) as denied:
        await admin.publish(SHIPPED, who="tenant")
    assert denied.value.code() is grpc.StatusCode.PERMISSION_DENIED
    with pytest.raises(grpc.aio.AioRpcError) as also:
        await admin.stub.RollbackCapabilities(
            api.RollbackCapabilitiesRequest(), metadata=admin._auth("tenant"), timeout=30
        )
    assert also.value.code() is grpc.StatusCode.PERMISSION_DENIED
