"""Changing the capability catalog under load on the real stack (issue 21 item 5's Done-when):
PostgreSQL, Redis, the Runway emulator and its sidecar process, `vidroute serve`.

Under a steady flow of gen4.5 tasks, a release with a new capability version and a 10% dearer
price is published, then rolled back: no task fails (the sidecar compiles the version the
control plane routed on, never NOT_FOUND), tasks created after the publish reserve at the new
price and run on the new version, tasks reserved before keep their reservations; a release
that would retire a serving model is refused with the reason, and a model typo and a missing
ratio mapping fail the dry run. Every wait polls with a deadline on the farm's time factor.
"""

from __future__ import annotations

import asyncio
import copy
import functools
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml
from sqlalchemy import select

from controlplane.capabilities.publish import documents_from_file
from controlplane.persistence.database import Database
from controlplane.persistence.models import credit_ledger
from tests.support.stack import ControlPlane, ProviderFarm, RedisDb, wait_for
from vidroute.common.v1 import generation_pb2 as gen
from vidroute.scheduler.v1 import scheduler_pb2
from vidroute.scheduler.v1 import scheduler_service_pb2 as api

pytestmark = [pytest.mark.timeout(300), pytest.mark.postgres]
TIME_SCALE = 0.02
ROOT = Path(__file__).resolve().parents[2]
RUNWAY_FILE = ROOT / "adapter_sidecars/runway/capabilities/runway-2026-06.yaml"
OLD_VERSION, NEW_VERSION = "runway/gen4.5/2026-06-01", "runway/gen4.5/2026-12-05"
SECONDS = 4
OLD_RESERVE, NEW_RESERVE = 120000 * SECONDS, 132000 * SECONDS


def gen45_spec(prompt: str) -> gen.GenerationSpec:
    """A 4 s 16:9 text-to-video that only gen4.5 may serve."""
    return gen.GenerationSpec(
        tenant_id="acme",
        prompt=prompt,
        mode=gen.MODE_TEXT_TO_VIDEO,
        output=gen.OutputSpec(width=1280, height=720, duration_ms=SECONDS * 1000),
        routing=gen.RoutingPolicy(
            mode=gen.ROUTING_MODE_STRICT_MODEL, required_provider="runway", required_model="gen4.5"
        ),
    )


@dataclass
class Flow:
    """Creates a task every `period_s` on its own thread; each with its CreateTask window."""

    cp: ControlPlane
    period_s: float
    created: list[tuple[str, float, float]] = field(default_factory=list)  # id, start, end
    stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        while not self.stop.is_set():
            request = api.CreateTaskRequest(
                spec=gen45_spec(f"release e2e {uuid.uuid4().hex[:8]}"),
                idempotency_key=uuid.uuid4().hex,
            )
            started = time.monotonic()
            reply = self.cp._call(functools.partial(_create, request))
            self.created.append((reply.task.task_id, started, time.monotonic()))
            self.stop.wait(self.period_s)

    def between(self, after: float, before: float) -> list[str]:
        """Tasks whose CreateTask ran wholly inside (after, before)."""
        return [t for t, s, e in list(self.created) if s > after and e < before]


def _create(request: api.CreateTaskRequest, stub: Any) -> api.CreateTaskResponse:
    reply: api.CreateTaskResponse = stub.CreateTask(request, timeout=30)
    return reply


@pytest.fixture
def stack(tmp_path: Path, fresh_postgres_url: str, redis_db: RedisDb) -> Iterator[ControlPlane]:
    with ProviderFarm(tmp_path / "farm", time_scale=TIME_SCALE, providers=["runway"]) as farm:
        (tmp_path / "cp").mkdir()
        cp = ControlPlane(
            tmp_path / "cp", farm, database_url=fresh_postgres_url, redis_url=redis_db.url
        )
        try:
            cp.start()
            yield cp
        finally:
            cp.kill()


def _yaml(entries: list[dict[str, Any]]) -> str:
    return yaml.safe_dump_all(entries, sort_keys=False)


def _newer() -> list[dict[str, Any]]:
    entries = documents_from_file(RUNWAY_FILE)
    gen45 = next(e for e in entries if e["model"] == "gen4.5")
    gen45["version"], gen45["capability_version"] = "2026-12-05", NEW_VERSION
    gen45["commercial"]["price_version"] = "runway-2026-12"
    gen45["commercial"]["price_micros_per_output_second"] = 132000
    return entries


def retried(call: Callable[[], Any], deadline_s: float = 90.0) -> Any:
    """As a client does: UNAVAILABLE (a sample compile that timed out on a loaded machine,
    before anything was written) is retried; the same request is idempotent."""
    until = time.monotonic() + deadline_s
    while True:
        try:
            return call()
        except grpc.RpcError as exc:
            if exc.code() != grpc.StatusCode.UNAVAILABLE or time.monotonic() > until:
                raise


def publish(cp: ControlPlane, text: str, **fields: Any) -> api.PublishCapabilitiesResponse:
    request = api.PublishCapabilitiesRequest(document=text, source="e2e", **fields)
    reply: api.PublishCapabilitiesResponse = retried(
        lambda: cp._call(lambda s: s.PublishCapabilities(request, timeout=120))
    )
    return reply


def refused(cp: ControlPlane, text: str, **fields: Any) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as info:
        publish(cp, text, **fields)
    return info.value


def reservations(cp: ControlPlane, task_ids: list[str]) -> dict[str, int]:
    """Each task's RESERVE ledger amount, read from PostgreSQL (the source of truth)."""

    async def read() -> dict[str, int]:
        db = Database.from_url(cp.database_url)
        try:
            async with db.reading() as conn:
                rows = await conn.execute(
                    select(credit_ledger.c.task_id, credit_ledger.c.amount_micros).where(
                        credit_ledger.c.kind == "RESERVE",
                        credit_ledger.c.task_id.in_([int(t) for t in task_ids]),
                    )
                )
                return {str(t): int(a) for t, a in rows}
        finally:
            await db.dispose()

    return asyncio.run(read())


def ran_on(cp: ControlPlane, task_id: str, version: str) -> bool:
    return any(a.capability_version == version for a in cp.get_task(task_id).attempts)


def test_a_release_and_its_rollback_under_load_fail_no_task(stack: ControlPlane) -> None:
    """The Done-when of issue 21 item 5 (module docstring), end to end."""
    cp = stack
    flow = Flow(cp, period_s=cp.farm.seconds(40.0))  # about what gen4.5's 2 slots serve
    runner = threading.Thread(target=flow.run, daemon=True)
    runner.start()
    try:
        wait_for(lambda: len(flow.created) >= 4, timeout_s=60, what="the first tasks")
        baseline = publish(cp, RUNWAY_FILE.read_text(encoding="utf-8"))  # the shipped file
        assert {c.kind for c in baseline.changes} == {"UNCHANGED"}
        before = time.monotonic()
        early = flow.between(0, before)
        early_reserved = reservations(cp, early)
        assert set(early_reserved.values()) == {OLD_RESERVE}

        release = publish(cp, _yaml(_newer()))
        after = time.monotonic()
        assert release.state == "ACTIVE"
        assert {c.model: c.kind for c in release.changes}["gen4.5"] == "CHANGED"
        wait_for(
            lambda: [
                t for t in flow.between(after, time.monotonic()) if ran_on(cp, t, NEW_VERSION)
            ],
            timeout_s=90,
            what="a task created after the release runs on the new version",
        )
        rollback = retried(
            lambda: cp._call(
                lambda s: s.RollbackCapabilities(api.RollbackCapabilitiesRequest(), timeout=120)
            )
        )
        rolled = time.monotonic()
        assert {c.model: c.new_capability_version for c in rollback.changes}["gen4.5"] == (
            OLD_VERSION
        )
        wait_for(lambda: flow.between(rolled, time.monotonic()), timeout_s=60, what="a task")
    finally:
        flow.stop.set()
        runner.join(timeout=30)

    finals = {t: cp.wait_terminal(t, timeout_s=120) for t, _, _ in flow.created}
    failed = {
        t: task.failure.message
        for t, task in finals.items()
        if task.state != scheduler_pb2.TASK_STATE_SUCCEEDED
    }
    assert failed == {}, failed
    print(f"\n{len(finals)} tasks under the release and its rollback, {len(failed)} failed")
    assert reservations(cp, early) == early_reserved  # reserved before: kept theirs
    during = flow.between(after, rolled)
    assert during
    assert set(reservations(cp, during).values()) == {NEW_RESERVE}
    late = flow.between(rolled, time.monotonic())
    assert set(reservations(cp, late).values()) == {OLD_RESERVE}

    refusals_name_the_reason(cp)
    history = cp._call(
        lambda s: s.ListCapabilityHistory(api.ListCapabilityHistoryRequest(), timeout=30)
    )
    assert [a.action for a in history.activations] == ["PUBLISHED", "PUBLISHED", "ROLLED_BACK"]


def refusals_name_the_reason(cp: ControlPlane) -> None:
    """Retiring serving gen4.5 is refused naming it; a typo and a missing ratio mapping fail
    the dry run."""
    retire = copy.deepcopy(_newer())
    retire[0]["status"], retire[0]["capability_version"] = "sunset", "runway/gen4.5/retired"
    error = refused(cp, _yaml(retire[:1]))
    assert error.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "runway/gen4.5@" in (error.details() or "")
    assert "retired" in (error.details() or "")

    typo = copy.deepcopy(_newer()[:1])
    typo[0]["model"], typo[0]["capability_version"] = "gen4.55", "runway/gen4.55/x"
    error = refused(cp, _yaml(typo), dry_run=True)
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "gen4.55" in (error.details() or "")

    ratio = copy.deepcopy(_newer()[:1])
    ratio[0]["output"]["aspect_ratios"].append("2:1")
    error = refused(cp, _yaml(ratio), dry_run=True)
    assert error.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "no Runway ratio for 2:1@720p" in (error.details() or "")
