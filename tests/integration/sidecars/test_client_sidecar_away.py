"""What the control plane's adapter client makes of a sidecar that is away (issue 20).

A real Runway sidecar (in process, real gRPC channel, shipped timeouts scaled by one factor) in
front of the Runway emulator: its refusal of a Compile is a verdict (`CompileRefused`); while it
is stopped a Compile is `CompileUnavailable` and a Submit is a retryable refusal that provably
sent nothing (never UNKNOWN); started again on its address, the same client compiles and
submits within the capped reconnect backoff.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import pytest

from adapter_sidecars.common.config import parse_config
from adapter_sidecars.common.server import SidecarServer
from adapter_sidecars.emulators import RunwayConfig, RunwayEmulator
from adapter_sidecars.runway.adapter import RunwayAdapter
from controlplane.adapters.grpc_client import (
    CompileRefused,
    CompileUnavailable,
    GrpcAdapterClient,
)
from vidroute_core.adapter import SubmitKind
from vidroute_core.errors import ErrorClass
from vidroute_core.spec import GenerationSpec, Mode, OutputSpec
from vidroute_core.timescale import scaled_defaults

SCALE = 1 / 50
SPEC = GenerationSpec(
    tenant_id="tenant-a",
    prompt="a red fox",
    mode=Mode.TEXT_TO_VIDEO,
    output=OutputSpec(width=1280, height=720, duration_ms=4000),
)


def _sidecar(emulator: RunwayEmulator, listen: str) -> SidecarServer:
    config = parse_config(
        {
            "provider": {"base_url": emulator.url},
            "accounts": [{"name": "prod-us", "region": "us", "credential_ref": "env:K:-key_test"}],
        },
        {"VIDROUTE_TIME_SCALE": str(SCALE)},
    )
    return SidecarServer(RunwayAdapter.from_config(config), listen)


@pytest.fixture
async def emulator() -> AsyncIterator[RunwayEmulator]:
    async with RunwayEmulator(RunwayConfig(queued_polls=1, running_polls=1)) as started:
        yield started


async def test_a_sidecar_away_gives_no_verdict_and_sends_nothing(
    emulator: RunwayEmulator,
) -> None:
    """Refusal -> CompileRefused; stopped -> CompileUnavailable and a Submit REJECTED as
    TRANSIENT_NETWORK ADAPTER_NOT_CONNECTED (no job); restarted -> compiles and submits."""
    server = _sidecar(emulator, "127.0.0.1:0")
    port = await server.start()
    client = GrpcAdapterClient(f"127.0.0.1:{port}", **scaled_defaults(GrpcAdapterClient, SCALE))
    try:
        await client.describe()
        plan = await client.compile(SPEC, account="prod-us", model="gen4.5")
        with pytest.raises(CompileRefused, match="NOT_FOUND"):
            await client.compile(SPEC, account="prod-us", model="no-such-model")

        await server.stop()
        with pytest.raises(CompileUnavailable, match="UNAVAILABLE"):
            await client.compile(SPEC, account="prod-us", model="gen4.5")
        unsent = await client.submit(plan, "crk-while-away")
        assert unsent.kind is SubmitKind.REJECTED
        assert unsent.error is not None
        assert unsent.error.error_class is ErrorClass.TRANSIENT_NETWORK
        assert unsent.error.code == "ADAPTER_NOT_CONNECTED"
        assert not unsent.error.provider_may_have_accepted
        assert emulator.truth() == []

        server = _sidecar(emulator, f"127.0.0.1:{port}")
        await server.start()
        deadline = time.monotonic() + 30
        while True:  # the client reconnects on its own, within the capped backoff
            try:
                await client.compile(SPEC, account="prod-us", model="gen4.5")
                break
            except CompileUnavailable:
                assert time.monotonic() < deadline, "the client never reconnected"
                await asyncio.sleep(0.05)
        sent = await client.submit(plan, "crk-after-restart")
        assert sent.kind is SubmitKind.ACCEPTED
        assert len(emulator.truth()) == 1
    finally:
        await client.close()
        await server.stop()
