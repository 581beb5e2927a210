"""A real control plane (in process, built by the composition root) in front of a Runway
sidecar and its emulator: it is not ready and fails no task until the sidecar has described its
capabilities, and a revoked account is skipped from the next task on (emulator truth)."""

from __future__ import annotations

import asyncio
import logging
import socket
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from adapter_sidecars.common.config import parse_config
from adapter_sidecars.common.server import SidecarServer
from adapter_sidecars.emulators import RunwayConfig, RunwayEmulator
from adapter_sidecars.runway.adapter import RunwayAdapter
from controlplane.bootstrap import Settings, start_control_plane
from controlplane.domain.states import AttemptState
from controlplane.persistence.catalog import CatalogQueries
from controlplane.persistence.database import Database
from controlplane.persistence.records import TaskDetail
from controlplane.persistence.tasks import TaskQueries
from controlplane.server import LIVENESS_SERVICE, SCHEDULER_SERVICE, ControlPlaneServer
from tests.support.stack import spec_for
from vidroute.scheduler.v1 import scheduler_service_pb2 as api
from vidroute.scheduler.v1 import scheduler_service_pb2_grpc as api_grpc

pytestmark = [pytest.mark.timeout(180), pytest.mark.postgres]

GOOD_KEY = "key-good"
TIME_SCALE = 0.1
SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
# A submit's outcome is known once the attempt has left these states.
UNDECIDED = frozenset({AttemptState.READY_TO_SUBMIT, AttemptState.SUBMITTING})


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def eventually(check: Callable[[], Awaitable[Any]], deadline_s: float, what: str) -> Any:
    """Poll `check` until it returns something truthy; fail after `deadline_s`."""
    deadline = time.monotonic() + deadline_s
    while True:
        result = await check()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {deadline_s} s: {what}")
        await asyncio.sleep(0.1)


def runway_sidecar(
    emulator: RunwayEmulator, port: int, *accounts: tuple[str, str]
) -> SidecarServer:
    """A Runway sidecar with `accounts` as (name, API key); the first one is probed."""
    config = parse_config(
        {
            "provider": {"base_url": emulator.url, "options": {}},
            "health": {"probe_interval_seconds": 0.5},
            "shutdown_grace_seconds": 1,
            "accounts": [
                {"name": name, "region": "us", "credential_ref": f"env:KEY_{n}"}
                for n, (name, _) in enumerate(accounts)
            ],
        },
        {f"KEY_{n}": key for n, (_, key) in enumerate(accounts)},
    )
    return SidecarServer(
        RunwayAdapter.from_config(config),
        f"127.0.0.1:{port}",
        probe_interval_seconds=0.5,
        shutdown_grace_seconds=1,
    )


@dataclass
class Stack:
    server: ControlPlaneServer
    db: Database
    stub: api_grpc.SchedulerServiceAsyncStub
    health: health_pb2_grpc.HealthStub

    async def create(self) -> int:
        reply = await self.stub.CreateTask(
            api.CreateTaskRequest(spec=spec_for("runway"), idempotency_key=uuid.uuid4().hex),
            timeout=10,
        )
        return int(reply.task.task_id)

    async def status(self, service: str) -> int:
        reply = await self.health.Check(health_pb2.HealthCheckRequest(service=service), timeout=5)
        return int(reply.status)

    async def detail(self, task_id: int) -> TaskDetail:
        detail = await TaskQueries(self.db).get_task(task_id)
        assert detail is not None
        return detail


@pytest.fixture
async def stack_factory(
    fresh_postgres_url: str, tmp_path: Path
) -> AsyncIterator[Callable[[int], Awaitable[Stack]]]:
    """Start the control plane with one Runway adapter expected at a given port."""
    started: list[tuple[ControlPlaneServer, grpc.aio.Channel, Any]] = []

    async def start(adapter_port: int) -> Stack:
        server = await start_control_plane(
            Settings(
                database_url=fresh_postgres_url,
                listen="127.0.0.1:0",
                adapters={"runway": f"127.0.0.1:{adapter_port}"},
                object_store_url=(tmp_path / "objects").as_uri(),
                worker_id="stack-test",
                # Production timings, compressed together (jobs end and free their leases
                # sooner); the account breaker's cooldown stays far longer than the test.
                time_scale=TIME_SCALE,
            )
        )
        channel = grpc.aio.insecure_channel(f"127.0.0.1:{server.port}")
        db = Database.from_url(fresh_postgres_url)
        started.append((server, channel, db))
        return Stack(
            server,
            db,
            api_grpc.SchedulerServiceStub(channel),
            health_pb2_grpc.HealthStub(channel),
        )

    yield start
    for server, channel, db in started:
        await channel.close()
        await server.stop(grace=1.0)
        await db.dispose()


async def test_not_ready_until_the_adapter_described_and_no_task_fails(
    stack_factory: Callable[[int], Awaitable[Stack]], caplog: pytest.LogCaptureFixture
) -> None:
    """Before its sidecar answers Describe the control plane is NOT_SERVING (liveness SERVING)
    and a task created then stays QUEUED through dispatcher rounds; once the sidecar is up the
    control plane turns SERVING and the task is SELECTED, after at most a transient wait
    (NO_CAPACITY), never failed."""
    caplog.set_level(logging.DEBUG, logger="controlplane.scheduling.dispatcher")
    port = free_port()
    stack = await stack_factory(port)
    assert await stack.status("") == NOT_SERVING
    assert await stack.status(SCHEDULER_SERVICE) == NOT_SERVING
    assert await stack.status(LIVENESS_SERVICE) == SERVING
    task_id = await stack.create()
    created = len(caplog.records)

    async def skipped_twice() -> bool:
        skipped = [r for r in caplog.records[created:] if "round skipped" in r.getMessage()]
        return len(skipped) >= 2

    await eventually(skipped_twice, 30, "two dispatcher rounds skipped as not ready")
    detail = await stack.detail(task_id)
    assert detail.task.state.value == "QUEUED"
    assert detail.route_decisions == ()
    async with RunwayEmulator(RunwayConfig(api_key=GOOD_KEY)) as emulator:
        sidecar = runway_sidecar(emulator, port, ("prod-us", GOOD_KEY))
        await sidecar.start()
        try:

            async def serving() -> bool:
                return bool(await stack.status(SCHEDULER_SERVICE) == SERVING)

            await eventually(serving, 60, "the control plane turns SERVING")
            assert await stack.status("") == SERVING

            async def selected() -> TaskDetail | None:
                d = await stack.detail(task_id)
                codes = [r.reason_code for r in d.route_decisions]
                return d if "SELECTED" in codes else None

            detail = await eventually(selected, 30, "the task is routed to the sidecar")
            codes = [d.reason_code for d in detail.route_decisions]
            # Its first round after the sidecar came up may find the sidecar's first Compile
            # still unanswered (a loaded machine; its deadline is 1 s) or the account's leases
            # being rebuilt: the task then waits (NO_CAPACITY, back to QUEUED) and is selected
            # a round later. A wait, never a failure.
            assert set(codes[: codes.index("SELECTED")]) <= {"NO_CAPACITY"}, codes
            assert detail.task.state.value != "FAILED"
        finally:
            await sidecar.stop()


async def test_a_revoked_account_is_skipped_from_the_next_task_on(
    stack_factory: Callable[[int], Awaitable[Stack]],
) -> None:
    """Tasks created one after another: the first that reaches the revoked account gets 401 and
    fails over; no later task is sent there. Emulator truth: exactly one submit reached the
    provider without creating a job, and every task has exactly one job.

    Routing reaches the revoked account once the good one is at its capacity (2 running jobs),
    which is why tasks are created until one lands there."""
    port = free_port()
    async with RunwayEmulator(RunwayConfig(api_key=GOOD_KEY)) as emulator:
        sidecar = runway_sidecar(emulator, port, ("prod-us", GOOD_KEY), ("revoked-us", "old"))
        await sidecar.start()
        try:
            stack = await stack_factory(port)

            async def serving() -> bool:
                return bool(await stack.status(SCHEDULER_SERVICE) == SERVING)

            await eventually(serving, 60, "the control plane turns SERVING")
            revoked = {
                a.id
                for a in await CatalogQueries(stack.db).accounts()
                if a.account_name == "revoked-us"
            }
            assert len(revoked) == 1

            async def run_one() -> TaskDetail:
                """Create a task and wait until one of its submits was accepted."""
                task_id = await stack.create()

                async def accepted() -> TaskDetail | None:
                    d = await stack.detail(task_id)
                    done = [a for a in d.attempts if a.state not in UNDECIDED]
                    ok = [a for a in done if a.state is not AttemptState.FAILED]
                    return d if ok else None

                result: TaskDetail = await eventually(accepted, 60, f"task {task_id} accepted")
                return result

            def on_revoked(d: TaskDetail) -> list[int]:
                return [a.id for a in d.attempts if a.provider_account_id in revoked]

            first_hit = None
            tasks: list[TaskDetail] = []
            for _ in range(6):
                tasks.append(await run_one())
                if on_revoked(tasks[-1]):
                    first_hit = len(tasks) - 1
                    break
            assert first_hit is not None, "routing never chose the revoked account"
            (hit,) = on_revoked(tasks[first_hit])
            assert next(a for a in tasks[first_hit].attempts if a.id == hit).state is (
                AttemptState.FAILED
            )
            for _ in range(3):
                tasks.append(await run_one())
                assert on_revoked(tasks[-1]) == []

            def truth() -> tuple[int, int]:
                submits = sum(
                    n for path, n in emulator.counters.items() if path.startswith("POST /v1/")
                )
                return submits, len(emulator.jobs)

            submits, jobs = truth()
            assert jobs == len(tasks)  # one provider job per task
            assert submits - jobs == 1  # the one 401
        finally:
            await sidecar.stop()
