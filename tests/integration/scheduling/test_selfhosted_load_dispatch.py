"""Self-hosted load through the real dispatcher (design 9.21), on SQLite and PostgreSQL.

One emulated model server serves two equal models ("wan-a", "wan-b": the shipped wan2.2-t2v
entry twice, same price) behind a real self-hosted sidecar over gRPC. Nothing is loaded at
first; a job of wan-b warms it. The dispatcher's `LoadBook` reads GetLoad through the sidecar
and every task then goes to the warm wan-b: wan-a's predicted latency carries its cold start.
Without the load the two are a near tie. The explain snapshot names both models' load.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
import redis.asyncio as aioredis
import yaml

from adapter_sidecars.common.config import parse_config
from adapter_sidecars.common.server import SidecarServer
from adapter_sidecars.emulators import SelfHostedConfig, SelfHostedEmulator
from adapter_sidecars.selfhosted.adapter import SelfHostedAdapter
from controlplane.adapters.fake import FakeAdapterClient
from controlplane.adapters.grpc_client import GrpcAdapterClient
from controlplane.capabilities.publish import (
    AccountConfig,
    publish_documents,
)
from controlplane.domain.scoring import example_policy
from controlplane.leases.memory_store import MemoryLeaseStore
from controlplane.persistence.catalog import CatalogQueries
from controlplane.persistence.database import Database
from controlplane.scheduling.dispatcher import Dispatcher, DispatcherConfig
from controlplane.scheduling.health import HealthMonitor
from controlplane.scheduling.leader import LocalLock
from controlplane.scheduling.load_book import LoadBook, LoadConfig, RedisLoadShare
from controlplane.scheduling.runtime import build_scheduling
from tests.integration.scheduling.support import (
    LOAD_ROUTER,
    NOW,
    route_new_task,
    two_model_documents,
)
from vidroute_core.adapter import LoadReport, ModelLoad

pytestmark = pytest.mark.timeout(120)
A, B = "self_hosted/wan-a/gpu-a", "self_hosted/wan-b/gpu-a"
# Wall seconds at speed 0.01: a cold start 0.5 s, a job 0.1 s; latency bands at the same scale.
SERVER = SelfHostedConfig(
    advance="time",
    api_key="key_test",
    workers=2,
    speed=0.01,
    queue_s=0.0,
    gpu_base_s=10.0,
    gpu_s_per_output_s=0.0,
    cold_start_s=50.0,
    preload=False,
    models=("wan-a", "wan-b"),
)


@pytest.fixture
async def server() -> AsyncIterator[SelfHostedEmulator]:
    async with SelfHostedEmulator(SERVER) as emu:
        yield emu


@pytest.fixture
async def client(server: SelfHostedEmulator, tmp_path: Path) -> AsyncIterator[GrpcAdapterClient]:
    """A real self-hosted sidecar (capability files for wan-a/wan-b) and a gRPC client to it."""
    for doc in two_model_documents():
        (tmp_path / f"{doc['model']}.yaml").write_text(yaml.safe_dump(doc))
    config = parse_config(
        {
            "provider": {"base_url": server.url},
            "capabilities_dir": str(tmp_path),
            "accounts": [
                {"name": "gpu-a", "region": "us", "credential_ref": "env:NO_SUCH_KEY:-key_test"}
            ],
        },
        {},
    )
    adapter = SelfHostedAdapter.from_config(config)
    sidecar = SidecarServer(
        adapter, "127.0.0.1:0", probe_interval_seconds=0.2, shutdown_grace_seconds=1
    )
    port = await sidecar.start()
    grpc_client = GrpcAdapterClient(f"127.0.0.1:{port}", timeout_s=10.0)
    yield grpc_client
    await grpc_client.close()
    await sidecar.stop()


async def _warm(server: SelfHostedEmulator, model: str) -> None:
    """Run one job of `model` on the server to the end (it loads the model first)."""
    async with httpx.AsyncClient() as http:
        reply = await http.post(
            f"{server.url}/v1/jobs",
            json={"model": model, "prompt": "warm-up", "duration_s": 1},
            headers={"authorization": "Bearer key_test"},
        )
        job = reply.json()["id"]
        deadline = asyncio.get_running_loop().time() + 30
        while True:
            status = await http.get(
                f"{server.url}/v1/jobs/{job}", headers={"authorization": "Bearer key_test"}
            )
            if status.json()["status"] == "succeeded":
                return
            assert asyncio.get_running_loop().time() < deadline, "warm-up job never finished"
            await asyncio.sleep(0.05)


async def test_dispatcher_routes_to_the_warm_model_from_getload(
    db: Database,
    catalogs: CatalogQueries,
    monitor: HealthMonitor,
    server: SelfHostedEmulator,
    client: GrpcAdapterClient,
) -> None:
    """With wan-b warm and wan-a cold on the server, every task goes to wan-b on its score;
    without load the same tasks are near ties; explain shows the load of both."""
    await publish_documents(
        db,
        two_model_documents(),
        [AccountConfig("self_hosted", "gpu-a", "us", "kms://gpu/a", "127.0.0.1:7003")],
        now=NOW,
        source="test",
    )

    def dispatcher_with(loads: LoadBook | None) -> Dispatcher:
        return Dispatcher(
            db=db,
            catalogs=catalogs,
            leases=MemoryLeaseStore(),
            adapters={"self_hosted": client},
            monitor=monitor,
            router=LOAD_ROUTER,
            leader=LocalLock("selfhosted-load"),
            config=DispatcherConfig(),
            clock=lambda: NOW,
            loads=loads,
        )

    dispatcher = dispatcher_with(None)
    blind = [await route_new_task(dispatcher, db, f"blind-{n}") for n in range(3)]
    assert {d["selection_reason"] for d in blind} == {"bucketed_near_tie"}
    assert "load" not in blind[0]["facts"]

    await _warm(server, "wan-b")
    book = LoadBook({"self_hosted": client}, LoadConfig(interval_s=60.0))
    await book.refresh()
    assert book.report("self_hosted")["wan-b"].warm
    assert not book.report("self_hosted")["wan-a"].warm
    dispatcher = dispatcher_with(book)
    for n in range(4):
        decision = await route_new_task(dispatcher, db, f"seen-{n}")
        assert decision["selected"] == B
        assert decision["selection_reason"] == "best_score"
    load = decision["facts"]["load"]
    assert load[A]["warm"] is False
    assert load[A]["predicted_extra_s"] == pytest.approx(0.5)
    assert load[B]["warm"] is True
    assert load[B]["predicted_extra_s"] == 0.0
    scores = {c["id"]: c["components"]["latency"] for c in decision["candidates"]}
    assert scores[B] - scores[A] == pytest.approx(0.5 / 2.0, abs=1e-5)


async def test_load_book_refreshes_per_interval_and_drops_stale_reports(
    client: GrpcAdapterClient,
) -> None:
    """The loop asks every adapter once per interval; a report older than its max age (the
    sidecar gone) counts as none, and an adapter that fails keeps nothing new."""
    book = LoadBook({"self_hosted": client}, LoadConfig(interval_s=0.1, timeout_s=2.0))
    stop = asyncio.Event()
    loop = asyncio.create_task(book.run(stop))
    try:
        deadline = asyncio.get_running_loop().time() + 10
        while book.refreshes < 3:
            assert asyncio.get_running_loop().time() < deadline, "the loop did not refresh"
            await asyncio.sleep(0.02)
        assert set(book.report("self_hosted")) == {"wan-a", "wan-b"}
    finally:
        stop.set()
        await loop
    ticks = [0.0]
    dead = GrpcAdapterClient("127.0.0.1:1", timeout_s=0.5)
    aged = LoadBook(
        {"self_hosted": client, "gone": dead},
        LoadConfig(interval_s=1.0, timeout_s=2.0),
        clock=lambda: ticks[0],
    )
    await aged.refresh()
    assert aged.report("self_hosted")
    assert not aged.report("gone")
    ticks[0] = 3.5  # past three intervals
    assert aged.report("self_hosted") == {}
    await dead.close()


async def test_runtime_runs_the_load_refresh_for_every_dispatcher(
    database_url: str, db: Database
) -> None:
    """As bootstrap wires it: every dispatcher reads the runtime's one LoadBook, and the
    started runtime calls GetLoad on each adapter once per interval until stopped."""
    fakes = {"self_hosted": FakeAdapterClient(), "runway": FakeAdapterClient()}
    fakes["self_hosted"].load = LoadReport((ModelLoad("wan-a", warm=True),))
    runtime = build_scheduling(
        db=db,
        database_url=database_url,
        leases=MemoryLeaseStore,
        adapters=fakes,
        policy=example_policy("router-load"),
        # Reports kept for 60 s: this test is about the loop, the age-out has its own test
        # (three 0.05 s intervals is shorter than a loaded machine's scheduling delay).
        load_config=LoadConfig(interval_s=0.05, max_age_s=60.0),
    )
    assert runtime.loads is not None
    assert all(d.loads is runtime.loads for d in runtime.dispatchers)
    runtime.start()
    try:
        deadline = asyncio.get_running_loop().time() + 10
        while min(f.load_calls for f in fakes.values()) < 3:
            assert asyncio.get_running_loop().time() < deadline, "no periodic GetLoad"
            await asyncio.sleep(0.02)
    finally:
        await runtime.stop()
    assert runtime.loads.report("self_hosted")["wan-a"].warm
    assert runtime.loads.report("runway") == {}
    calls = fakes["runway"].load_calls
    await asyncio.sleep(0.2)
    assert fakes["runway"].load_calls == calls  # stopped with the runtime


@pytest.mark.redis
async def test_followers_read_the_leaders_load_through_redis(redis_server_url: str) -> None:
    """With Redis only the leader calls GetLoad; a follower reads the leader's reports (its own
    adapters untouched) until Redis is gone, then asks its adapters itself."""
    client = aioredis.Redis.from_url(redis_server_url)
    prefix = f"test-{secrets.token_hex(4)}"
    on_leader = {"self_hosted": FakeAdapterClient(), "runway": FakeAdapterClient()}
    on_leader["self_hosted"].load = LoadReport((ModelLoad("wan-a", queue_length=4, warm=True),))
    on_follower = {"self_hosted": FakeAdapterClient(), "runway": FakeAdapterClient()}
    on_follower["self_hosted"].load = LoadReport((ModelLoad("wan-a", queue_length=9),))
    config = LoadConfig(interval_s=1.0)
    try:
        leader = LoadBook(
            on_leader, config, share=RedisLoadShare(client, prefix), is_leader=lambda: True
        )
        follower = LoadBook(
            on_follower, config, share=RedisLoadShare(client, prefix), is_leader=lambda: False
        )
        await leader.tick()
        await follower.tick()
        assert [f.load_calls for f in on_leader.values()] == [1, 1]
        assert [f.load_calls for f in on_follower.values()] == [0, 0]
        assert follower.report("self_hosted")["wan-a"] == ModelLoad(
            "wan-a", queue_length=4, warm=True
        )
        assert follower.report("runway") == {}
        await client.delete(f"{prefix}:model-load")  # no fresh shared report: ask ourselves
        await follower.tick()
        assert [f.load_calls for f in on_follower.values()] == [1, 1]
        assert follower.report("self_hosted")["wan-a"].queue_length == 9
    finally:
        await client.delete(f"{prefix}:model-load")
        await client.aclose()
    unreachable = aioredis.Redis.from_url("redis://127.0.0.1:1/0")
    gone = LoadBook(
        on_follower, config, share=RedisLoadShare(unreachable, prefix), is_leader=lambda: False
    )
    await gone.tick()  # Redis unreachable: the follower's own read
    assert gone.report("self_hosted")["wan-a"].queue_length == 9
    await unreachable.aclose()
