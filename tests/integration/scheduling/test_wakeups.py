"""Wake-ups over a real NATS broker (a private ``nats-server`` each test starts on a free port).

Two replicas in one process: the writer's (the `after_commit` of its `Database` -> its bus) and the
dispatcher's (its bus -> `Dispatcher.wake`), so a wake-up reaches the dispatcher only through
the broker. Polling stays what is relied on: with the broker killed under load every task is
still dispatched within a poll interval, once, and the wake-ups resume when it is back.
"""

from __future__ import annotations

import asyncio
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from controlplane.domain.outbox import Topic
from controlplane.leases.memory_store import MemoryLeaseStore
from controlplane.persistence.database import Database
from controlplane.scheduling.dispatcher import DispatcherConfig
from controlplane.scheduling.leader import LocalLock
from controlplane.wakeups import LocalWakeBus, NatsWakeBus, PgNotifyWakeBus, wake_bus_for
from tests.conftest import require_server
from tests.integration.scheduling.conftest import DispatcherFactory
from tests.integration.scheduling.observe import AttemptWatch, attempt_counts, eventually
from tests.integration.scheduling.support import make_spec
from tests.integration.scheduling.test_dispatcher import new_task


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PrivateNats:
    """A ``nats-server`` of this test only, stoppable and restartable on the same port."""

    def __init__(self, workdir: Path) -> None:
        binary = shutil.which("nats-server")
        if binary is None:
            require_server("nats-server is not installed")
        self.binary = str(binary)
        self.port = free_port()
        self.workdir = workdir
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [self.binary, "-a", "127.0.0.1", "-p", str(self.port)],
            cwd=self.workdir,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 10
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                return
            except OSError:
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    raise RuntimeError("private nats-server did not start") from None
                time.sleep(0.05)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        self.proc = None


@pytest.fixture
def nats(tmp_path: Path) -> Iterator[PrivateNats]:
    server = PrivateNats(tmp_path)
    server.start()
    try:
        yield server
    finally:
        server.kill()


def test_embedded_default_is_in_process_and_wakes_local_subscribers() -> None:
    bus = wake_bus_for(None)
    assert type(bus) is LocalWakeBus
    woken: list[str] = []
    bus.subscribe(Topic.QUEUED, lambda: woken.append("dispatcher"))
    bus.subscribe(Topic.SUBMIT, lambda: woken.append("submit"))
    bus.notify({str(Topic.QUEUED)})
    assert woken == ["dispatcher"]
    assert isinstance(wake_bus_for("nats://127.0.0.1:4222"), NatsWakeBus)
    with pytest.raises(ValueError, match="unsupported scheme"):
        wake_bus_for("kafka://x")


async def wakes_the_other_replica(
    writer: NatsWakeBus,
    dispatcher_side: NatsWakeBus,
    db: Database,
    leases: MemoryLeaseStore,
    make_dispatcher: DispatcherFactory,
) -> None:
    """A task committed by `writer`'s replica is dispatched by the other replica's dispatcher
    long before its poll interval: only `dispatcher_side`'s wake-up can start that round."""
    poll = 30.0
    d = make_dispatcher(
        leader=LocalLock(f"wake-{id(writer)}"), config=DispatcherConfig(poll_interval_s=poll)
    )
    dispatcher_side.subscribe(Topic.QUEUED, d.wake)
    db = db.notifying(writer.notify)  # the writer replica's commits
    stop = asyncio.Event()
    run = None
    watch = AttemptWatch(db, leases)
    try:
        await watch.__aenter__()
        await writer.start()
        await dispatcher_side.start()
        assert await writer.wait_connected(10)
        assert await dispatcher_side.wait_connected(10)
        await asyncio.sleep(0.2)  # let the subscription reach the server: a pub before it is lost
        run = asyncio.create_task(d.run(stop))
        await eventually(lambda: d.leading)
        await asyncio.sleep(0.3)  # its first (empty) round is over: it now sleeps `poll`
        started = time.monotonic()
        task = await new_task(db, make_spec("tenant-w"), key="wake-1")
        await eventually(lambda: task.id in watch.first_seen, timeout_s=10)
        assert watch.first_seen[task.id] - started < poll / 3
        assert dispatcher_side.received >= 1  # through the broker, not this replica's bus
        assert writer.published >= 1
    finally:
        await watch.__aexit__()
        stop.set()
        if run is not None:
            await run
        await writer.close()
        await dispatcher_side.close()


async def test_a_committed_task_wakes_the_other_replicas_dispatcher_over_nats(
    nats: PrivateNats, db: Database, leases: MemoryLeaseStore, make_dispatcher: DispatcherFactory
) -> None:
    await wakes_the_other_replica(
        NatsWakeBus(nats.url), NatsWakeBus(nats.url), db, leases, make_dispatcher
    )


async def test_without_a_broker_postgresql_notify_wakes_the_other_replica(
    database_url: str, db: Database, leases: MemoryLeaseStore, make_dispatcher: DispatcherFactory
) -> None:
    if database_url.startswith("sqlite"):
        assert type(wake_bus_for(None, database_url)) is LocalWakeBus
        return
    writer, other = wake_bus_for(None, database_url), wake_bus_for(None, database_url)
    assert isinstance(writer, PgNotifyWakeBus)
    assert isinstance(other, PgNotifyWakeBus)
    await wakes_the_other_replica(writer, other, db, leases, make_dispatcher)


async def test_broker_killed_under_load_loses_nothing_and_wakeups_resume(
    nats: PrivateNats, db: Database, leases: MemoryLeaseStore, make_dispatcher: DispatcherFactory
) -> None:
    poll = 1.0
    d = make_dispatcher(
        leader=LocalLock(f"outage-{id(nats)}"),
        config=DispatcherConfig(poll_interval_s=poll, batch_size=16),
    )
    writer, dispatcher_side = NatsWakeBus(nats.url), NatsWakeBus(nats.url)
    dispatcher_side.subscribe(Topic.QUEUED, d.wake)
    db = db.notifying(writer.notify)  # the writer replica's commits
    stop = asyncio.Event()
    created: dict[int, float] = {}
    run = None
    watch = AttemptWatch(db, leases)

    async def load(prefix: str, count: int) -> None:
        for i in range(count):
            task = await new_task(db, make_spec(f"tenant-{i % 5}"), key=f"{prefix}-{i}")
            created[task.id] = time.monotonic()
            await asyncio.sleep(0.02)

    try:
        await watch.__aenter__()
        await writer.start()
        await dispatcher_side.start()
        assert await writer.wait_connected(10)
        assert await dispatcher_side.wait_connected(10)
        await asyncio.sleep(0.2)
        run = asyncio.create_task(d.run(stop))
        await eventually(lambda: d.leading)
        await load("before", 20)
        received_before = dispatcher_side.received
        assert received_before >= 1
        nats.kill()  # under load: tasks keep coming while the broker is gone
        await load("during", 40)
        nats.start()  # back on the same port: both buses reconnect by themselves
        await eventually(lambda: writer.connected and dispatcher_side.connected, timeout_s=20)
        await asyncio.sleep(0.3)  # the resubscription reaches the server
        await load("after", 20)
        await eventually(lambda: set(created) <= set(watch.first_seen), timeout_s=30)
        # Nothing lost, nothing dispatched twice: one attempt per task.
        attempts = await attempt_counts(db)
        assert all(attempts[t] == 1 for t in created), attempts
        # Every task within about one poll interval (plus a round) of its creation. A round on
        # SQLite beside a 3-worker suite has taken up to 2.5 s (five tasks waited 3.4-3.5 s in
        # one CI run, with nothing lost): the bound is the poll plus such a round; a task left
        # without a wake-up and without the poll would never be seen at all.
        waits = sorted(watch.first_seen[t] - created[t] for t in created)
        assert waits[-1] < poll + 3.0, waits[-5:]
        assert dispatcher_side.received > received_before  # wake-ups resumed after the outage
    finally:
        await watch.__aexit__()
        stop.set()
        if run is not None:
            await run
        await writer.close()
        await dispatcher_side.close()


async def test_many_commits_make_one_message_per_topic_per_interval(nats: PrivateNats) -> None:
    writer, other = NatsWakeBus(nats.url), NatsWakeBus(nats.url)
    woken: list[str] = []
    other.subscribe(Topic.QUEUED, lambda: woken.append("q"))
    try:
        await writer.start()
        await other.start()
        assert await writer.wait_connected(10)
        assert await other.wait_connected(10)
        await asyncio.sleep(0.2)  # the subscription reaches the server
        for _ in range(500):  # a burst of commits between two passes of the pump
            writer.notify({str(Topic.QUEUED)})
        await eventually(lambda: other.received >= 1, timeout_s=10)
        await asyncio.sleep(0.2)  # anything else the burst would have sent has arrived by now
        assert writer.published == 1
        assert woken == ["q"]
    finally:
        await writer.close()
        await other.close()
