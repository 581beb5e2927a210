"""No acceptance is lost across the seam: a provider that stalls its create response, through a
real Runway sidecar (in process, real gRPC channel) to the Runway emulator over HTTP.

Time is compressed by one factor (1/15): the sidecar's shipped ``submit_read`` of 60 s becomes
4 s, the old fixed control-plane deadline of 30 s becomes 2 s, the 40 s stall of issue 8 becomes
2.7 s, so every timing keeps its production order.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from adapter_sidecars.common.config import parse_config
from adapter_sidecars.common.server import SidecarServer
from adapter_sidecars.emulators import RunwayConfig, RunwayEmulator
from adapter_sidecars.runway.adapter import RunwayAdapter
from controlplane.adapters.grpc_client import GrpcAdapterClient, SubmitDeadlineTooShort
from controlplane.domain.states import AttemptState, TaskState
from tests.integration.execution.exec_harness import Harness
from vidroute_core.adapter import (
    AdapterDescription,
    CompiledPlan,
    RecoverQuery,
    RecoveryVerdict,
    SubmitKind,
)
from vidroute_core.spec import GenerationSpec, Mode, OutputSpec

SCALE = 1 / 15
SUBMIT_READ_S = 60 * SCALE  # the sidecar's shipped submit_read
OLD_DEADLINE_S = 30 * SCALE  # the control plane's fixed Submit deadline before issue 8
STALL_S = 40 * SCALE  # the provider stall of issue 8
ROUTE = "POST /v1/text_to_video"


@dataclass
class Seam:
    emulator: RunwayEmulator
    server: SidecarServer
    address: str


@pytest.fixture
async def seam() -> AsyncIterator[Seam]:
    """A Runway emulator and a Runway sidecar whose timeouts are the shipped ones, scaled."""
    async with RunwayEmulator(RunwayConfig(queued_polls=1, running_polls=1)) as emulator:
        config = parse_config(
            {
                "provider": {"base_url": emulator.url, "options": {"recovery_settle_seconds": 30}},
                "timeouts": {"connect": 5, "write": 10, "read": 30, "submit_read": 60, "pool": 5},
                "accounts": [
                    {"name": "prod-us", "region": "us", "credential_ref": "env:K:-key_test"}
                ],
            },
            {"VIDROUTE_TIME_SCALE": str(SCALE)},
        )
        assert config.timeouts.submit_read == pytest.approx(SUBMIT_READ_S)
        server = SidecarServer(RunwayAdapter.from_config(config), "127.0.0.1:0")
        port = await server.start()
        try:
            yield Seam(emulator, server, f"127.0.0.1:{port}")
        finally:
            await server.stop()


class FixedDeadlineClient(GrpcAdapterClient):
    """The control plane before issue 8: a fixed Submit deadline, whatever the sidecar needs
    (here the old 30 s, scaled). Only the deadline differs; every call is the real one."""

    async def describe(self) -> AdapterDescription:
        described = await super().describe()
        self.submit_deadline_s = OLD_DEADLINE_S
        return described


async def _attempt(harness: Harness, client: GrpcAdapterClient) -> tuple[int, int]:
    spec = GenerationSpec(
        tenant_id="tenant-a",
        prompt="a red fox",
        mode=Mode.TEXT_TO_VIDEO,
        output=OutputSpec(width=1280, height=720, duration_ms=4000),
    )
    plan: CompiledPlan = await client.compile(spec, account="prod-us", model="gen4.5")
    assert plan.submittable
    attempt = await harness.task_with_attempt(compile_plan=dict(plan.plan_json))
    return attempt.id, attempt.task_id


async def test_a_stall_inside_the_sidecars_budget_is_simply_accepted(
    lite: Harness, seam: Seam
) -> None:
    """With the deadline derived from the sidecar's declared budget, a create that answers after
    the old fixed deadline but within submit_read is ACCEPTED at once: one job, no recovery."""
    client = GrpcAdapterClient(seam.address, submit_margin_s=5 * SCALE)
    try:
        await client.describe()
        assert client.submit_deadline_s is not None
        assert client.submit_deadline_s > SUBMIT_READ_S > STALL_S > OLD_DEADLINE_S
        attempt_id, task_id = await _attempt(lite, client)
        seam.emulator.add_faults({"route": ROUTE, "action": "stall_response", "seconds": STALL_S})
        await lite.engine({"runway": client}).run_until_idle()
        detail = await lite.detail(task_id)
        [truth] = seam.emulator.truth()
        assert next(a.state for a in detail.attempts) in (
            AttemptState.ACCEPTED,
            AttemptState.PROVIDER_QUEUED,
            AttemptState.RUNNING,
            AttemptState.SUCCEEDED,
        )
        assert [j.provider_job_id for j in detail.provider_jobs] == [truth["id"]]
        runtime = await lite.reads.runtime(attempt_id)
        assert runtime is not None
        assert runtime.recovery_queries == 0
    finally:
        await client.close()


async def test_an_acceptance_after_the_caller_left_is_adopted_from_the_journal(
    lite: Harness, seam: Seam
) -> None:
    """A control plane that gives up before the sidecar (the old fixed deadline) sees UNKNOWN;
    the sidecar journals the late ACCEPTED and recovery adopts exactly that job (method
    submit_journal), with exactly one job in the emulator's truth and no second submit."""
    client = FixedDeadlineClient(seam.address)
    try:
        attempt_id, task_id = await _attempt(lite, client)
        seam.emulator.add_faults({"route": ROUTE, "action": "stall_response", "seconds": STALL_S})
        engine = lite.engine({"runway": client}, recovery_base_s=0.01, recovery_cap_s=0.01)
        await engine.submitter.run_once()
        assert (await lite.attempt(attempt_id)).state is AttemptState.SUBMIT_UNKNOWN
        assert len(seam.emulator.truth()) == 1  # created; the provider holds its answer back
        deadline = time.monotonic() + 10 * STALL_S
        while (await lite.attempt(attempt_id)).state is AttemptState.SUBMIT_UNKNOWN:
            assert time.monotonic() < deadline, "recovery never adopted the journaled job"
            lite.clock.advance(1)
            await engine.recovery.run_once()
            await asyncio.sleep(0.05)
        await engine.run_until_idle()
        detail = await lite.detail(task_id)
        [truth] = seam.emulator.truth()
        assert [j.provider_job_id for j in detail.provider_jobs] == [truth["id"]]
        assert detail.attempts[0].state is not AttemptState.SUBMIT_UNKNOWN
        assert detail.task.state in (TaskState.RUNNING, TaskState.OUTPUT_FETCHING)
        reasons = [e.payload.get("reason", "") for e in await lite.tasks.task_events(task_id)]
        assert any("recovered by submit_journal" in r for r in reasons), reasons
        assert len(seam.emulator.truth()) == 1
    finally:
        await client.close()


async def test_a_configured_deadline_below_the_sidecars_budget_is_refused(seam: Seam) -> None:
    """A control plane configured with a Submit deadline shorter than the budget the sidecar
    declares refuses that adapter at Describe (so it is never published) and submits nothing."""
    client = GrpcAdapterClient(seam.address, submit_timeout_s=OLD_DEADLINE_S)
    try:
        with pytest.raises(SubmitDeadlineTooShort):
            await client.describe()
        assert client.submit_deadline_s is None
    finally:
        await client.close()
    assert seam.emulator.truth() == []


async def test_a_restarted_sidecar_still_knows_the_late_acceptance(tmp_path: Path) -> None:
    """With a journal file, an acceptance that landed after the caller left survives a restart
    of the sidecar: the new process answers RecoverSubmission FOUND by submit_journal."""
    journal = tmp_path / "journal" / "runway.jsonl"
    async with RunwayEmulator(RunwayConfig(queued_polls=1, running_polls=1)) as emulator:
        config = parse_config(
            {
                "provider": {"base_url": emulator.url},
                "timeouts": {"submit_read": 60},
                "submit_journal": {"path": str(journal)},
                "accounts": [
                    {"name": "prod-us", "region": "us", "credential_ref": "env:K:-key_test"}
                ],
            },
            {"VIDROUTE_TIME_SCALE": str(SCALE)},
        )
        first = SidecarServer(RunwayAdapter.from_config(config), "127.0.0.1:0")
        client = FixedDeadlineClient(f"127.0.0.1:{await first.start()}")
        spec = GenerationSpec(
            tenant_id="tenant-a",
            prompt="a kite",
            mode=Mode.TEXT_TO_VIDEO,
            output=OutputSpec(width=1280, height=720, duration_ms=4000),
        )
        plan = await client.compile(spec, account="prod-us", model="gen4.5")
        emulator.add_faults({"route": ROUTE, "action": "stall_response", "seconds": STALL_S})
        sent = await client.submit(plan, "crk-restart")
        await client.close()
        assert sent.kind is SubmitKind.UNKNOWN
        deadline = time.monotonic() + 10 * STALL_S
        while '"kind":"ACCEPTED"' not in (journal.read_text() if journal.exists() else ""):
            assert time.monotonic() < deadline, "the late outcome was never journaled"
            await asyncio.sleep(0.05)
        await first.stop()
        second = SidecarServer(RunwayAdapter.from_config(config), "127.0.0.1:0")
        again = GrpcAdapterClient(f"127.0.0.1:{await second.start()}")
        try:
            now = datetime.now(UTC)
            found = await again.recover(
                RecoverQuery(
                    account="prod-us",
                    model="gen4.5",
                    client_request_key="crk-restart",
                    request_hash=plan.request_hash,
                    plan=plan,
                    submitted_after=now - timedelta(minutes=5),
                    submitted_before=now,
                )
            )
        finally:
            await again.close()
            await second.stop()
        [truth] = emulator.truth()
        assert found.verdict is RecoveryVerdict.FOUND
        assert found.method == "submit_journal"
        assert found.job is not None
        assert found.job.provider_job_id == truth["id"]
