"""Load-aware routing against real Cog servers (design 9.21, issue 24), on SQLite and PostgreSQL.

A Cog server serves one predictor, so two equal models ("wan-a", "wan-b": the shipped
wan2.2-t2v entry twice, same price) run on two real Cog servers (coglet with
models/cog_video, one prediction slot each), both behind one real self-hosted sidecar on its
Cog backend (``servers: {model: URL}``) over gRPC. The dispatcher's `LoadBook` reads GetLoad,
which the sidecar answers from each server's ``/health-check``: READY has a free slot, BUSY
(every slot running; coglet answers 409 then) none. While a prediction submitted through the
sidecar holds wan-a's server, every task goes to wan-b on its score, and the other way round
once wan-b's server is the busy one; with both idle, or without load, the two are a near tie.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from adapter_sidecars.common.config import parse_config
from adapter_sidecars.common.server import SidecarServer
from adapter_sidecars.selfhosted.adapter import build_adapter
from controlplane.adapters.grpc_client import GrpcAdapterClient
from controlplane.capabilities.publish import (
    AccountConfig,
    publish_documents,
)
from controlplane.leases.memory_store import MemoryLeaseStore
from controlplane.persistence.catalog import CatalogQueries
from controlplane.persistence.database import Database
from controlplane.scheduling.dispatcher import Dispatcher, DispatcherConfig
from controlplane.scheduling.health import HealthMonitor
from controlplane.scheduling.leader import LocalLock
from controlplane.scheduling.load_book import LoadBook, LoadConfig
from tests.integration.scheduling.support import (
    LOAD_MODELS,
    LOAD_ROUTER,
    NOW,
    fox_spec,
    route_new_task,
    two_model_documents,
)
from tests.support.cog import CogServer
from vidroute_core.adapter import JobRef, SubmitKind

pytestmark = pytest.mark.timeout(240)
TOKEN = "key_test"  # the servers' WEBHOOK_AUTH_TOKEN = the account's credential
MODELS = LOAD_MODELS
A, B = "self_hosted/wan-a/gpu-a", "self_hosted/wan-b/gpu-a"
#: A held prediction runs 4 s x 60 s per output second: far longer than any test, so the
#: server stays BUSY until the test cancels it (no race with its end).
HOLD_INPUT = {"seconds_per_output_second": 60}
WAIT_S = 90.0  # generous: coglet answers within a second even at load 20


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, CogServer]]:
    """One real Cog server per model (module-wide: started once for both databases)."""
    started: dict[str, CogServer] = {}
    try:
        for model in MODELS:
            started[model] = CogServer(tmp_path_factory.mktemp(model), webhook_token=TOKEN)
        yield started
    finally:
        for server in started.values():
            server.stop()


@pytest.fixture
async def client(servers: dict[str, CogServer], tmp_path: Path) -> AsyncIterator[GrpcAdapterClient]:
    """The real self-hosted sidecar on its Cog backend, each model on its own server."""
    for doc in two_model_documents():
        (tmp_path / f"{doc['model']}.yaml").write_text(yaml.safe_dump(doc))
    config = parse_config(
        {
            "provider": {
                "base_url": servers["wan-a"].url,
                "options": {
                    "backend": "cog",
                    "servers": {m: s.url for m, s in servers.items()},
                    "webhook_listen": "127.0.0.1:0",
                    "extra_input": HOLD_INPUT,
                },
            },
            "capabilities_dir": str(tmp_path),
            "accounts": [
                {"name": "gpu-a", "region": "us", "credential_ref": f"env:NO_SUCH_KEY:-{TOKEN}"}
            ],
        },
        {},
    )
    sidecar = SidecarServer(
        build_adapter(config), "127.0.0.1:0", probe_interval_seconds=0.2, shutdown_grace_seconds=1
    )
    port = await sidecar.start()
    grpc_client = GrpcAdapterClient(f"127.0.0.1:{port}", timeout_s=30.0)
    yield grpc_client
    await grpc_client.close()
    await sidecar.stop()


async def _until(what: str, check: Any) -> None:
    """Poll `check()` (blocking, cheap) until true; fail after `WAIT_S`."""
    deadline = asyncio.get_running_loop().time() + WAIT_S
    while not await asyncio.to_thread(check):
        assert asyncio.get_running_loop().time() < deadline, f"never: {what}"
        await asyncio.sleep(0.1)


async def _hold(client: GrpcAdapterClient, model: str, key: str) -> JobRef:
    """Submit a long prediction of `model` through the sidecar (it occupies the one slot)."""
    plan = await client.compile(fox_spec("hold"), account="gpu-a", model=model)
    outcome = await client.submit(plan, key)
    assert outcome.kind is SubmitKind.ACCEPTED, outcome
    assert outcome.job is not None
    return outcome.job


async def _release(client: GrpcAdapterClient, job: JobRef, server: CogServer) -> None:
    assert (await client.cancel_job(job)).acknowledged
    await _until(f"{job.model}'s server idle", lambda: server.health() == "READY")


async def test_dispatcher_routes_away_from_the_busy_cog_server(  # noqa: PLR0917 - fixtures
    db: Database,
    catalogs: CatalogQueries,
    monitor: HealthMonitor,
    servers: dict[str, CogServer],
    client: GrpcAdapterClient,
    backend: str,
) -> None:
    """Idle servers (or no load) leave wan-a and wan-b a near tie; with wan-a's one slot held
    every task goes to wan-b, with wan-b's held every task goes to wan-a, on the load GetLoad
    read from each server's /health-check; each hold ran once, on its own model's server."""
    await publish_documents(
        db,
        two_model_documents(),
        [AccountConfig("self_hosted", "gpu-a", "us", "kms://gpu/a", "127.0.0.1:7003")],
        now=NOW,
        source="test",
    )
    book = LoadBook({"self_hosted": client}, LoadConfig(interval_s=60.0, timeout_s=30.0))

    def dispatcher_with(loads: LoadBook | None) -> Dispatcher:
        return Dispatcher(
            db=db,
            catalogs=catalogs,
            leases=MemoryLeaseStore(),
            adapters={"self_hosted": client},
            monitor=monitor,
            router=LOAD_ROUTER,
            leader=LocalLock("selfhosted-cog-load"),
            config=DispatcherConfig(),
            clock=lambda: NOW,
            loads=loads,
        )

    blind = await route_new_task(dispatcher_with(None), db, "blind")
    assert blind["selection_reason"] == "bucketed_near_tie"
    assert "load" not in blind["facts"]

    await book.refresh()
    idle = await route_new_task(dispatcher_with(book), db, "idle")
    assert idle["selection_reason"] == "bucketed_near_tie"
    for cid in (A, B):
        assert idle["facts"]["load"][cid]["warm"] is True
        assert idle["facts"]["load"][cid]["available_slots"] == 1
        assert idle["facts"]["load"][cid]["predicted_extra_s"] == 0.0

    for busy, other, chosen, busy_id in (("wan-a", "wan-b", B, A), ("wan-b", "wan-a", A, B)):
        key = f"hold-{busy}-{backend}"
        held = await _hold(client, busy, key)
        await _until(f"{busy}'s server BUSY", lambda s=servers[busy]: s.health() == "BUSY")
        try:
            await book.refresh()
            report = book.report("self_hosted")
            assert report[busy].available_slots == 0
            assert report[busy].queue_length == 1
            assert report[other].available_slots == 1
            dispatcher = dispatcher_with(book)
            for n in range(3):
                decision = await route_new_task(dispatcher, db, f"{busy}-busy-{n}")
                assert decision["selected"] == chosen
                assert decision["selection_reason"] == "best_score"
            load = decision["facts"]["load"]
            assert load[busy_id]["available_slots"] == 0
            assert load[busy_id]["capacity"] == 0.0
            assert load[busy_id]["predicted_extra_s"] > 0
            assert load[chosen]["available_slots"] == 1
            assert load[chosen]["predicted_extra_s"] == 0.0
            penalties = {c["id"]: c.get("penalties", {}) for c in decision["candidates"]}
            assert "GPU_UTILIZATION" in penalties[busy_id]
        finally:
            await _release(client, held, servers[busy])
        assert servers[busy].runs()[key] == 1
        assert key not in servers[other].runs()
