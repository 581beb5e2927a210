"""A provider that becomes slow opens its breaker (design 9.15.1-9.15.2), through a real Runway
sidecar (in process, real gRPC channel) to the Runway emulator over HTTP.

The POLL calls of ten running jobs set the (runway, gen4.5, POLL) baseline at the emulator's
normal speed; then the emulator holds every poll back (its ``delay_accept`` fault) for twice
the slow threshold (4x that baseline, at least the host's noise floor). Those polls answer,
successfully, but are recorded as TIMEOUT_OVER_BASELINE, and the breaker opens on the p95 rule
("slow_calls"); past its cooldown a single probe poll is made, which, as slow, reopens it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest

from adapter_sidecars.common.config import parse_config
from adapter_sidecars.common.server import SidecarServer
from adapter_sidecars.emulators import RunwayConfig, RunwayEmulator
from adapter_sidecars.runway.adapter import RunwayAdapter
from controlplane.adapters.grpc_client import GrpcAdapterClient
from controlplane.domain.baselines import slow_threshold_s
from controlplane.domain.breaker import (
    BreakerConfig,
    BreakerKey,
    BreakerRegistry,
    BreakerState,
    BreakerTransition,
    Operation,
)
from controlplane.execution.breakers import OperationGate
from controlplane.scheduling.health import HealthMonitor
from tests.integration.execution.exec_harness import Harness
from vidroute_core.adapter import CompiledPlan
from vidroute_core.spec import GenerationSpec, Mode, OutputSpec

pytestmark = [pytest.mark.timeout(240)]

JOBS = 10
POLL_ROUTE = "GET /v1/tasks/*"


@dataclass
class Seam:
    emulator: RunwayEmulator
    server: SidecarServer
    address: str


@pytest.fixture
async def seam() -> AsyncIterator[Seam]:
    """A Runway emulator whose jobs stay running for many polls, and a Runway sidecar."""
    emulator_config = RunwayConfig(
        queued_polls=1, running_polls=10_000, max_concurrent=JOBS, max_daily=1_000
    )
    async with RunwayEmulator(emulator_config) as emulator:
        config = parse_config(
            {
                "provider": {"base_url": emulator.url},
                "accounts": [
                    {"name": "prod-us", "region": "us", "credential_ref": "env:K:-key_test"}
                ],
            },
            {},
        )
        server = SidecarServer(RunwayAdapter.from_config(config), "127.0.0.1:0")
        port = await server.start()
        try:
            yield Seam(emulator, server, f"127.0.0.1:{port}")
        finally:
            await server.stop()


def polls_seen(seam: Seam) -> int:
    return sum(n for key, n in seam.emulator.counters.items() if key.startswith("GET /v1/tasks/"))


async def test_a_provider_whose_polls_turn_slow_opens_its_poll_breaker(
    lite: Harness, seam: Seam
) -> None:
    """Ten running jobs polled at the emulator's speed give the POLL breaker a baseline; polls
    held back twice the slow threshold open the breaker as slow_calls; after the cooldown only
    the probe reaches the provider, and its slow answer reopens the breaker."""
    client = GrpcAdapterClient(seam.address)
    try:
        spec = GenerationSpec(
            tenant_id="tenant-a",
            prompt="a red fox",
            mode=Mode.TEXT_TO_VIDEO,
            output=OutputSpec(width=1280, height=720, duration_ms=4000),
        )
        plan: CompiledPlan = await client.compile(spec, account="prod-us", model="gen4.5")
        account_id = await lite.account()
        for _ in range(JOBS):
            await lite.task_with_attempt(account_id=account_id, compile_plan=dict(plan.plan_json))
        account = await lite.reads.account(account_id)

        def clock() -> float:
            return lite.clock.now.timestamp()

        seen: list[BreakerTransition] = []
        monitor = HealthMonitor(
            BreakerRegistry(BreakerConfig(), clock), clock=clock, on_transition=seen.append
        )
        # One poll at a time: each call's latency is its own, not its batch's (the sidecar and
        # the emulator share this event loop).
        engine = lite.engine({"runway": client}, concurrency=1)
        engine.deps.gate = OperationGate(monitor)
        key = BreakerKey(
            account.provider, account.account_name, account.region, "gen4.5", Operation.POLL
        )
        await engine.run_until_idle()
        for _ in range(60):  # a baseline needs 20 polls
            if monitor.baseline_s(key) is not None:
                break
            lite.clock.advance(5)
            await engine.run_until_idle()
        assert monitor.registry.get(key).state is BreakerState.CLOSED
        # Twice the slow threshold: the polls' own latency here (on a loaded host, more than
        # the floor) sets the baseline, so the delay is relative to it.
        baseline = monitor.baseline_s(key)
        assert baseline is not None
        slow_ms = int(2_000 * slow_threshold_s(baseline, monitor.registry.get(key).config))
        seam.emulator.add_faults(
            {"route": POLL_ROUTE, "action": "delay_accept", "ms": slow_ms, "times": 1_000}
        )
        for _ in range(20):
            if monitor.registry.get(key).state is BreakerState.OPEN:
                break
            lite.clock.advance(5)
            await engine.run_until_idle()
        assert monitor.registry.get(key).state is BreakerState.OPEN
        opened = [t for t in seen if t.key == key and t.new is BreakerState.OPEN]
        assert [t.reason for t in opened] == ["slow_calls"]
        assert int(opened[0].metrics["slow_calls"] or 0) >= 2
        # Past the cooldown one probe is admitted; the provider is still slow, so the probe
        # (answered, but over the baseline) reopens the breaker and the others are refused.
        before = polls_seen(seam)
        config = monitor.registry.get(key).config
        until = opened[0].at + config.cooldowns_s[0] + 10
        while clock() < until:
            lite.clock.advance(5)
            await engine.run_until_idle()
        assert polls_seen(seam) - before == config.half_open_max_probes
        assert engine.poller.refused >= 1
        reopened = [t for t in seen if t.key == key and t.old is BreakerState.HALF_OPEN]
        assert [(t.new, t.reason) for t in reopened] == [(BreakerState.OPEN, "probe_failed")]
    finally:
        await client.close()
