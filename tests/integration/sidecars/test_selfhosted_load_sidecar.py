"""GetLoad through a real sidecar (design 9.21): the self-hosted adapter reports the emulated
model server's queue, warm/cold state, GPU use and VRAM from its real job state; a SaaS adapter
reports nothing."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import datetime
from typing import Any

import httpx
import pytest
from adapter_support import eventually, sidecar_config

from adapter_sidecars.common.types import ProviderAdapter
from adapter_sidecars.emulators import SelfHostedConfig, SelfHostedEmulator
from adapter_sidecars.runway.adapter import RunwayAdapter
from adapter_sidecars.selfhosted.adapter import SelfHostedAdapter
from vidroute.adapter.v1 import adapter_service_pb2 as svc
from vidroute_core.adapter import LoadReport, ModelLoad
from vidroute_core.wire.adapter import load_from_proto

MODEL = "wan2.2-t2v"
# Wall seconds (speed 0.01): a cold start takes 0.6 s, a job 0.4 s, a model idle 0.5 s unloads.
CONFIG = SelfHostedConfig(
    advance="time",
    api_key="key_test",
    workers=1,
    speed=0.01,
    queue_s=0.0,
    gpu_base_s=40.0,
    gpu_s_per_output_s=0.0,
    cold_start_s=60.0,
    idle_unload_s=50.0,
    preload=False,
)
Start = Callable[[ProviderAdapter], Awaitable[Any]]  # conftest's Sidecar


@pytest.fixture
async def cold_server() -> AsyncIterator[SelfHostedEmulator]:
    """A one-GPU model server in time mode with no model loaded yet."""
    async with SelfHostedEmulator(CONFIG) as emu:
        yield emu


async def _load(sidecar: Any) -> tuple[LoadReport, ModelLoad]:
    report = load_from_proto(await sidecar.stub.GetLoad(svc.GetLoadRequest()))
    return report, next(m for m in report.models if m.model == MODEL)


async def _submit(emu: SelfHostedEmulator, client: httpx.AsyncClient) -> str:
    reply = await client.post(
        f"{emu.url}/v1/jobs",
        json={"model": MODEL, "prompt": "a fox", "duration_s": 1},
        headers={"authorization": "Bearer key_test"},
    )
    assert reply.status_code == 202
    return str(reply.json()["id"])


def _at(value: str) -> float:
    return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


async def test_load_follows_queued_and_running_jobs_and_warm_cold(
    cold_server: SelfHostedEmulator, sidecar_factory: Start
) -> None:
    """Cold and idle at first; two jobs queue while the model loads (no slot free, GPU busy),
    then run one by one warm (queue 1, less free VRAM), the second without a cold start; idle
    again the model stays warm until it unloads after idle_unload_s."""
    adapter = SelfHostedAdapter.from_config(sidecar_config(cold_server.url, "SELFHOSTED_API_KEY"))
    sidecar = await sidecar_factory(adapter)
    report, idle = await _load(sidecar)
    assert report.observed_at is not None
    assert abs(report.observed_at.timestamp() - time.time()) < 5
    assert (idle.warm, idle.queue_length, idle.available_slots) == (False, 0, 1)
    assert (idle.ready_replicas, idle.gpu_utilization) == (0, 0.0)
    assert idle.cold_start_s == pytest.approx(0.6)
    assert idle.vram_total_mb == CONFIG.gpu_vram_mb

    async with httpx.AsyncClient() as client:
        first = await _submit(cold_server, client)
        second = await _submit(cold_server, client)
        seen: dict[str, ModelLoad] = {}

        async def phase(name: str, test: Callable[[ModelLoad], bool]) -> bool:
            _, m = await _load(sidecar)
            if test(m):
                seen[name] = m
            return name in seen

        await eventually(
            lambda: phase("loading", lambda m: not m.warm and m.queue_length == 2),
            deadline_s=10,
            interval=0.02,
        )
        loading = seen["loading"]
        assert (loading.available_slots, loading.gpu_utilization) == (0, 1.0)
        await eventually(
            lambda: phase("running", lambda m: m.warm and m.queue_length == 1),
            deadline_s=10,
            interval=0.02,
        )
        running = seen["running"]
        assert (running.available_slots, running.ready_replicas) == (0, 1)
        assert running.gpu_utilization == 1.0
        assert running.vram_free_mb == (
            CONFIG.gpu_vram_mb - CONFIG.model_vram_mb - CONFIG.job_vram_mb
        )
        await eventually(
            lambda: phase(
                "done", lambda m: m.warm and m.queue_length == 0 and m.available_slots > 0
            ),
            deadline_s=10,
            interval=0.02,
        )
        assert seen["done"].gpu_utilization == 0.0
        auth = {"authorization": "Bearer key_test"}
        one = (await client.get(f"{cold_server.url}/v1/jobs/{first}", headers=auth)).json()
        two = (await client.get(f"{cold_server.url}/v1/jobs/{second}", headers=auth)).json()
    assert one["status"] == two["status"] == "succeeded"
    assert _at(one["started_at"]) - _at(one["created_at"]) >= 0.6 - 0.01  # the cold start
    # Warm: no second load, which would hold the second job for a whole cold start (0.6 s).
    assert _at(two["started_at"]) - _at(one["finished_at"]) < CONFIG.cold_start_s * CONFIG.speed
    await eventually(
        lambda: phase("unloaded", lambda m: not m.warm and m.ready_replicas == 0),
        deadline_s=10,
        interval=0.02,
    )
    await adapter.aclose()


async def test_load_reports_the_capability_models_only(
    selfhosted_adapter: SelfHostedAdapter, sidecar_factory: Start
) -> None:
    """Every model of the capability files is reported warm (preloaded) and idle; a model the
    server serves but no capability names (ltx-video) is not."""
    sidecar = await sidecar_factory(selfhosted_adapter)
    report = load_from_proto(await sidecar.stub.GetLoad(svc.GetLoadRequest()))
    assert sorted(m.model for m in report.models) == ["wan2.2-i2v", "wan2.2-t2v"]
    assert all(m.warm and m.queue_length == 0 and m.available_slots == 2 for m in report.models)


async def test_unreadable_server_and_saas_adapter_answer_empty(
    cold_server: SelfHostedEmulator, runway_adapter: RunwayAdapter, sidecar_factory: Start
) -> None:
    """A model server refusing the key and a SaaS adapter (Runway) both answer an empty report,
    never an RPC error."""
    wrong = SelfHostedAdapter.from_config(
        sidecar_config(
            cold_server.url,
            "SELFHOSTED_API_KEY",
            accounts=[{"name": "prod-us", "region": "us", "credential_ref": "env:NOPE:-bad"}],
        )
    )
    for adapter in (wrong, runway_adapter):
        sidecar = await sidecar_factory(adapter)
        reply = await sidecar.stub.GetLoad(svc.GetLoadRequest())
        assert list(reply.models) == []
    await wrong.aclose()
