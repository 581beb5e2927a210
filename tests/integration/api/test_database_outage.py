"""With PostgreSQL stopped (or Redis gone), the API answers UNAVAILABLE with a retry hint.

The test starts a private PostgreSQL (``initdb`` + ``pg_ctl`` in a temporary directory, on a
free port; as the ``postgres`` user when run as root, since PostgreSQL refuses to run as root),
serves the scheduler API on it, writes a task, stops the server (``-m immediate``: the pooled
connections die mid-life, as in a crash) and calls CreateTask, GetTask and ListTasks.
"""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
import redis.asyncio as redis_asyncio
from google.rpc import error_details_pb2
from grpc_status import rpc_status
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from controlplane.api.servicer import SchedulerServicer
from controlplane.domain.breaker import BreakerConfig, BreakerRegistry
from controlplane.persistence.catalog import CatalogQueries
from controlplane.persistence.database import Database
from controlplane.persistence.migrate import upgrade
from controlplane.scheduling.health import HealthMonitor
from controlplane.scheduling.shared_state import RedisSharedState
from controlplane.server import start_server
from controlplane.service.providers import ProviderAdminService
from controlplane.service.tasks import TaskService
from tests.conftest import require_server
from vidroute.common.v1 import generation_pb2 as gen
from vidroute.scheduler.v1 import scheduler_pb2 as pb
from vidroute.scheduler.v1 import scheduler_service_pb2 as api
from vidroute.scheduler.v1 import scheduler_service_pb2_grpc as api_grpc

_BINARIES = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class PrivatePostgres:
    bindir: Path
    datadir: Path
    port: int
    as_user: list[str]

    @property
    def url(self) -> str:
        return f"postgresql+asyncpg://postgres@127.0.0.1:{self.port}/postgres"

    def ctl(self, *args: str) -> None:
        cmd = [*self.as_user, str(self.bindir / "pg_ctl"), "-D", str(self.datadir), *args]
        subprocess.run(cmd, check=True, capture_output=True, timeout=60)

    def start(self) -> None:
        opts = f"-p {self.port} -k {self.datadir} -c listen_addresses=127.0.0.1 -c fsync=off"
        self.ctl("-w", "-l", str(self.datadir / "log"), "-o", opts, "start")

    def stop(self) -> None:
        self.ctl("-w", "-m", "immediate", "stop")


@pytest.fixture
def private_postgres() -> Iterator[PrivatePostgres]:
    if not _BINARIES:
        require_server("PostgreSQL server binaries (initdb, pg_ctl) not installed")
    bindir = Path(_BINARIES[-1]).parent
    root = Path(tempfile.mkdtemp(prefix="vidroute-pg-"))
    as_user: list[str] = []
    if os.geteuid() == 0:
        as_user = ["runuser", "-u", "postgres", "--"]
        shutil.chown(root, "postgres", "postgres")
    datadir = root / "data"
    subprocess.run(
        [*as_user, str(bindir / "initdb"), "-D", str(datadir), "-U", "postgres", "-A", "trust"],
        check=True,
        capture_output=True,
        timeout=120,
    )
    pg = PrivatePostgres(bindir, datadir, _free_port(), as_user)
    pg.start()
    try:
        yield pg
    finally:
        subprocess.run(
            [*as_user, str(bindir / "pg_ctl"), "-D", str(datadir), "-m", "immediate", "stop"],
            check=False,  # already stopped is fine
            capture_output=True,
            timeout=60,
        )
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
async def served(
    private_postgres: PrivatePostgres,
) -> AsyncIterator[tuple[api_grpc.SchedulerServiceAsyncStub, PrivatePostgres]]:
    await upgrade(private_postgres.url)
    db = Database.from_url(private_postgres.url)

    async def probe() -> bool:
        await db.ping()
        return True

    running = await start_server(
        SchedulerServicer(TaskService(db)), listen="127.0.0.1:0", probe=probe, cleanup=[db.dispose]
    )
    async with grpc.aio.insecure_channel(f"127.0.0.1:{running.port}") as channel:
        yield api_grpc.SchedulerServiceStub(channel), private_postgres
    await running.stop(grace=1)


def _spec() -> gen.GenerationSpec:
    return gen.GenerationSpec(
        tenant_id="acme",
        prompt="a red kite",
        mode=gen.MODE_TEXT_TO_VIDEO,
        output=gen.OutputSpec(width=1280, height=720, duration_ms=4000),
    )


def _retry_info(err: grpc.aio.AioRpcError) -> error_details_pb2.RetryInfo | None:
    status = rpc_status.from_call(err)
    for detail in status.details if status else ():
        info = error_details_pb2.RetryInfo()
        if detail.Unpack(info):
            return info
    return None


async def test_api_answers_unavailable_while_postgres_is_down(
    served: tuple[api_grpc.SchedulerServiceAsyncStub, PrivatePostgres],
) -> None:
    stub, pg = served
    created = await stub.CreateTask(
        api.CreateTaskRequest(spec=_spec(), idempotency_key="before-outage"), timeout=10
    )
    task_id = created.task.task_id
    await stub.ListTasks(api.ListTasksRequest(tenant_id="acme"), timeout=10)  # pool warmed
    pg.stop()

    calls: dict[str, Callable[[], Awaitable[Any]]] = {
        "CreateTask": lambda: stub.CreateTask(
            api.CreateTaskRequest(spec=_spec(), idempotency_key="during-outage"), timeout=10
        ),
        "GetTask": lambda: stub.GetTask(api.GetTaskRequest(task_id=task_id), timeout=10),
        "ListTasks": lambda: stub.ListTasks(api.ListTasksRequest(tenant_id="acme"), timeout=10),
    }
    # Twice each: the first call meets a pooled connection the server killed, the second a
    # refused new connection; both are outages.
    for _ in range(2):
        for name, call in calls.items():
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await call()
            assert err.value.code() is grpc.StatusCode.UNAVAILABLE, (name, err.value.details())
            info = _retry_info(err.value)
            assert info is not None, name
            assert info.retry_delay.seconds + info.retry_delay.nanos > 0

    pg.start()  # back: the same server answers again without a restart
    got = await stub.GetTask(api.GetTaskRequest(task_id=task_id), timeout=10)
    assert got.task.task_id == task_id


async def test_redis_outage_is_unavailable_for_the_admin_rpcs() -> None:
    """GetProviderHealth and ForceBreaker need the shared breaker state; Redis down is
    UNAVAILABLE with a retry hint (the local breakers still answer nothing stale silently)."""
    # No client-side retries: the answer, not redis-py's backoff, is under test.
    client = redis_asyncio.Redis(
        port=_free_port(), socket_connect_timeout=1, retry=Retry(NoBackoff(), 0)
    )
    monitor = HealthMonitor(
        BreakerRegistry(BreakerConfig(), clock=__import__("time").time),
        shared=RedisSharedState(client),
    )
    db = Database.from_url("sqlite+aiosqlite://")

    async def probe() -> bool:
        return True

    running = await start_server(
        SchedulerServicer(TaskService(db), ProviderAdminService(CatalogQueries(db), monitor)),
        listen="127.0.0.1:0",
        probe=probe,
        cleanup=[db.dispose, client.aclose],
    )
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{running.port}") as channel:
            stub = api_grpc.SchedulerServiceStub(channel)
            calls: list[Awaitable[Any]] = [
                stub.GetProviderHealth(api.GetProviderHealthRequest(), timeout=10),
                stub.ForceBreaker(
                    api.ForceBreakerRequest(
                        provider="veo",
                        account="a",
                        region="us",
                        state=pb.BREAKER_STATE_OPEN,
                        reason="drill",
                    ),
                    timeout=10,
                ),
            ]
            for call in calls:
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    await call
                assert err.value.code() is grpc.StatusCode.UNAVAILABLE, err.value.details()
                assert _retry_info(err.value) is not None
    finally:
        await running.stop(grace=1)
