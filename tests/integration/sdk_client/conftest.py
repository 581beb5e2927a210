"""Control planes for the SDK tests, each on an event loop thread of its own so the blocking
`Client` and the asyncio `AsyncClient` both talk to them over real sockets.

* `plane`: the API alone (servicer + SQLite, no scheduler, bearer-token auth): tasks stay
  QUEUED, so a cancel is CANCELLED at once; `restart()` stops it and serves the same database
  on the same port again (the dropped stream `watch` must resume from).
* `stack`: the composition root (`start_control_plane`) routing to the Runway sidecar and its
  emulator (tests.support.stack.ProviderFarm, production timings scaled by one factor): tasks
  really run, succeed and store their output.
"""

from __future__ import annotations

import asyncio
import base64
import threading
import time
from collections.abc import Coroutine, Iterator
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from controlplane.api.auth import Authenticator, hash_token, new_token, parse_entry
from controlplane.api.servicer import SchedulerServicer
from controlplane.bootstrap import Settings, start_control_plane
from controlplane.persistence.database import Database
from controlplane.persistence.migrate import upgrade
from controlplane.server import ControlPlaneServer, start_server
from controlplane.service.tasks import TaskService
from controlplane.webhooks.config import parse_webhooks_document
from tests.support.stack import ProviderFarm, free_port

T = TypeVar("T")
# Tenant `hooked` may name caller webhooks; the test's receiver is plain http on loopback.
WEBHOOK_TENANT = "hooked"
WEBHOOK_SECRET = "whsec_" + base64.b64encode(b"sdk-test-webhook-secret-32-bytes").decode()


class LoopThread:
    """An asyncio loop running in a daemon thread; `run` blocks on a coroutine scheduled on it."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()

    def run(self, coro: Coroutine[Any, Any, T], timeout: float = 60) -> T:
        future: Future[T] = asyncio.run_coroutine_threadsafe(coro, self.loop)
        return future.result(timeout)

    async def _drain(self) -> None:
        """Wait for the tasks left on the loop (a stopped server's cut-off stream handler
        closing its database connection) so none reports to a closed loop."""
        current = asyncio.current_task()
        pending = [t for t in asyncio.all_tasks() if t is not current]
        if pending:
            _, stuck = await asyncio.wait(pending, timeout=10)
            for task in stuck:
                task.cancel()
        await self.loop.shutdown_asyncgens()

    def close(self) -> None:
        self.run(self._drain())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        self.loop.close()


@dataclass
class Plane:
    """The scheduler API on a SQLite file; restartable on the same port and database."""

    loop: LoopThread
    db: Database
    token: str
    port: int = 0
    server: ControlPlaneServer | None = None
    starts: int = 0
    _auth: Authenticator = field(default_factory=Authenticator)

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    async def _start(self) -> None:
        async def probe() -> bool:
            await self.db.ping()
            return True

        # The database outlives the servers: a restart is the API process coming back, and a
        # stream handler cut off by the stop still returns its connection to this pool.
        self.server = await start_server(
            SchedulerServicer(TaskService(self.db, watch_poll_interval_s=0.05)),
            listen=f"127.0.0.1:{self.port}",
            probe=probe,
            auth=self._auth,
        )
        self.port = self.server.port
        self.starts += 1

    def start(self) -> None:
        self._auth = Authenticator(dict([parse_entry(hash_token(self.token), "admin")]))
        self.loop.run(self._start())

    def stop(self, grace: float = 0) -> None:
        if self.server is not None:
            self.loop.run(self.server.stop(grace=grace))
            self.server = None

    def restart(self) -> None:
        """Drop every connection and stream, then serve the same database on the same port."""
        self.stop(grace=0)
        self.loop.run(self._start())


@pytest.fixture
def plane(tmp_path: Path) -> Iterator[Plane]:
    loop = LoopThread()
    url = f"sqlite+aiosqlite:///{tmp_path / 'vidroute.db'}"
    loop.run(upgrade(url))
    db = Database.from_url(url)
    running = Plane(loop, db, token=new_token())
    running.start()
    try:
        yield running
    finally:
        running.stop(grace=0)
        loop.run(db.dispose())
        loop.close()


@dataclass
class Stack:
    """A whole control plane (in process) on the Runway sidecar and emulator."""

    farm: ProviderFarm
    server: ControlPlaneServer
    token: str

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.server.port}"


def _until_serving(port: int, timeout_s: float = 60) -> None:
    """Readiness: the catalog holds what the sidecar described."""
    deadline = time.monotonic() + timeout_s
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        health = health_pb2_grpc.HealthStub(channel)
        while True:
            reply = health.Check(health_pb2.HealthCheckRequest(service=""), timeout=5)
            if reply.status == health_pb2.HealthCheckResponse.SERVING:
                return
            assert time.monotonic() < deadline, "control plane never ready"
            time.sleep(0.1)


@pytest.fixture(scope="package")  # one farm for every SDK test module
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    workdir = tmp_path_factory.mktemp("sdk-stack")
    token = new_token()
    loop = LoopThread()
    with ProviderFarm(workdir / "farm", providers=("runway",)) as farm:
        server = loop.run(
            start_control_plane(
                Settings(
                    database_url=f"sqlite+aiosqlite:///{workdir / 'vidroute.db'}",
                    listen=f"127.0.0.1:{free_port()}",
                    adapters={"runway": farm.sidecars["runway"].address},
                    object_store_url=(workdir / "objects").as_uri(),
                    worker_id="sdk-test",
                    time_scale=farm.time_scale,
                    auth_tokens=dict([parse_entry(hash_token(token), "admin")]),
                    webhooks=parse_webhooks_document(
                        f"tenants: {{{WEBHOOK_TENANT}: {{secret: {WEBHOOK_SECRET}}}}}",
                        allow_http=True,
                        allow_private=True,
                    ),
                )
            )
        )
        try:
            _until_serving(server.port)
            yield Stack(farm, server, token)
        finally:
            loop.run(server.stop(grace=1.0))
            loop.close()
