"""Fixtures for the adapter sidecar tests: emulators on real sockets, adapters, an in-process
gRPC server with a real channel, and spec builders."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

import grpc
import pytest
from adapter_support import AssetServer, sidecar_config

from adapter_sidecars.common.server import SidecarServer
from adapter_sidecars.common.types import ProviderAdapter
from adapter_sidecars.emulators import (
    RunwayConfig,
    RunwayEmulator,
    SelfHostedConfig,
    SelfHostedEmulator,
    VeoConfig,
    VeoEmulator,
)
from adapter_sidecars.runway.adapter import RunwayAdapter
from adapter_sidecars.selfhosted.adapter import SelfHostedAdapter
from adapter_sidecars.veo.adapter import VeoAdapter
from vidroute.adapter.v1 import adapter_service_pb2_grpc


@pytest.fixture
async def runway_emulator() -> AsyncIterator[RunwayEmulator]:
    """A Runway emulator advancing one step per poll."""
    async with RunwayEmulator(RunwayConfig(queued_polls=1, running_polls=2)) as emu:
        yield emu


@pytest.fixture
async def veo_emulator() -> AsyncIterator[VeoEmulator]:
    """A Veo emulator advancing one step per poll."""
    async with VeoEmulator(VeoConfig(queued_polls=1, running_polls=2)) as emu:
        yield emu


@pytest.fixture
async def runway_search_emulator() -> AsyncIterator[RunwayEmulator]:
    """A Runway emulator with its emulator-only task listing (tests of the search itself)."""
    config = RunwayConfig(queued_polls=1, running_polls=2, extensions=frozenset({"task_listing"}))
    async with RunwayEmulator(config) as emu:
        yield emu


@pytest.fixture
async def veo_search_emulator() -> AsyncIterator[VeoEmulator]:
    """A Veo emulator with its emulator-only operations listing and billing export."""
    extensions = frozenset({"operation_list", "billing_export"})
    async with VeoEmulator(
        VeoConfig(queued_polls=1, running_polls=2, extensions=extensions)
    ) as emu:
        yield emu


@pytest.fixture
async def runway_search_adapter(
    runway_search_emulator: RunwayEmulator,
) -> AsyncIterator[RunwayAdapter]:
    """A Runway adapter with provider.options.task_listing on, against the listing emulator."""
    options = {"recovery_settle_seconds": 0, "task_listing": True}
    config = sidecar_config(runway_search_emulator.url, "RUNWAY_API_KEY", options=options)
    adapter = RunwayAdapter.from_config(config)
    yield adapter
    await adapter.aclose()


@pytest.fixture
async def veo_search_adapter(veo_search_emulator: VeoEmulator) -> AsyncIterator[VeoAdapter]:
    """A Veo adapter with operation_list and billing_export on, against the extended emulator."""
    options = {"recovery_settle_seconds": 0, "operation_list": True, "billing_export": True}
    config = sidecar_config(veo_search_emulator.url, "GEMINI_API_KEY", options=options)
    adapter = VeoAdapter.from_config(config)
    yield adapter
    await adapter.aclose()


@pytest.fixture
async def asset_server() -> AsyncIterator[AssetServer]:
    """A real HTTP server for image assets."""
    async with AssetServer() as server:
        yield server


@pytest.fixture
async def selfhosted_emulator() -> AsyncIterator[SelfHostedEmulator]:
    """A self-hosted job API emulator advancing one step per poll."""
    async with SelfHostedEmulator(SelfHostedConfig(queued_polls=1, running_polls=2)) as emu:
        yield emu


@pytest.fixture
async def runway_adapter(runway_emulator: RunwayEmulator) -> AsyncIterator[RunwayAdapter]:
    """A Runway adapter talking to the emulator."""
    config = sidecar_config(
        runway_emulator.url, "RUNWAY_API_KEY", options={"recovery_settle_seconds": 0}
    )
    adapter = RunwayAdapter.from_config(config)
    yield adapter
    await adapter.aclose()


@dataclass
class Sidecar:
    """A running in-process sidecar and a stub on a real channel."""

    server: SidecarServer
    channel: grpc.aio.Channel
    stub: adapter_service_pb2_grpc.ProviderAdapterServiceAsyncStub


# What the sidecar_factory fixture hands a test: start a sidecar for an adapter.
SidecarFactory = Callable[[ProviderAdapter], Awaitable[Sidecar]]


@pytest.fixture
async def sidecar_factory() -> AsyncIterator[SidecarFactory]:
    """Start sidecars for adapters; all are stopped at teardown."""
    started: list[Sidecar] = []

    async def start(adapter: ProviderAdapter) -> Sidecar:
        server = SidecarServer(
            adapter, "127.0.0.1:0", probe_interval_seconds=0.2, shutdown_grace_seconds=1
        )
        port = await server.start()
        channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
        sidecar = Sidecar(
            server, channel, adapter_service_pb2_grpc.ProviderAdapterServiceStub(channel)
        )
        started.append(sidecar)
        return sidecar

    yield start
    for sidecar in started:
        await sidecar.channel.close()
        await sidecar.server.stop()


@pytest.fixture
async def veo_adapter(veo_emulator: VeoEmulator) -> AsyncIterator[VeoAdapter]:
    """A Veo adapter talking to the emulator (settle 0 so NOT_FOUND can be conclusive)."""
    config = sidecar_config(
        veo_emulator.url, "GEMINI_API_KEY", options={"recovery_settle_seconds": 0}
    )
    adapter = VeoAdapter.from_config(config)
    yield adapter
    await adapter.aclose()


@pytest.fixture
async def selfhosted_adapter(
    selfhosted_emulator: SelfHostedEmulator,
) -> AsyncIterator[SelfHostedAdapter]:
    """A self-hosted adapter talking to the emulator (settle 0 so NOT_FOUND can be conclusive)."""
    adapter = SelfHostedAdapter.from_config(
        sidecar_config(
            selfhosted_emulator.url, "SELFHOSTED_API_KEY", options={"recovery_settle_seconds": 0}
        )
    )
    yield adapter
    await adapter.aclose()
