"""A control plane that died after committing SUBMITTING but before its Submit left: the sole
submitter's journal proves the job absent, and a stale Submit of that key is refused unsent.

A real Runway sidecar (in process, real gRPC channel, shipped timeouts scaled by one factor)
in front of the Runway emulator with real-provider behaviour (no task listing), so nothing but
the journal can prove absence. The control plane's clock follows real time here, because the
journal compares the attempt's request start with its own (real) clock.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from adapter_sidecars.common.config import parse_config
from adapter_sidecars.common.journal import PROVEN_ABSENT
from adapter_sidecars.common.server import SidecarServer
from adapter_sidecars.emulators import RunwayConfig, RunwayEmulator
from adapter_sidecars.runway.adapter import RunwayAdapter
from controlplane.adapters.grpc_client import GrpcAdapterClient
from controlplane.domain.states import AttemptState, TaskState
from tests.integration.execution.exec_harness import Harness
from vidroute_core.adapter import CompiledPlan, RecoveryVerdict, SubmitKind, SubmitOutcome
from vidroute_core.spec import GenerationSpec, Mode, OutputSpec

SCALE = 1 / 50
# The journal may prove absence once submitted_before + budget (80 s) + settle (30 s) + skew
# (5 s) passed, scaled: 2.3 s here.
SETTLE_S = (80 + 30 + 5) * SCALE


class DiesBeforeSending(GrpcAdapterClient):
    """The control plane's client as a SIGKILL leaves it: SUBMITTING was committed, then the
    process died before one byte of the Submit reached the sidecar."""

    async def submit(
        self, plan: CompiledPlan, client_request_key: str, callback_url: str = ""
    ) -> SubmitOutcome:
        raise ConnectionResetError("the control plane died before its Submit left")


@pytest.fixture
async def runway(tmp_path: Path) -> AsyncIterator[tuple[RunwayEmulator, str, Path]]:
    """The Runway emulator and a sole-submitter Runway sidecar with a file journal."""
    journal = tmp_path / "journal.jsonl"
    async with RunwayEmulator(RunwayConfig(queued_polls=1, running_polls=1)) as emulator:
        config = parse_config(
            {
                "provider": {"base_url": emulator.url, "options": {"recovery_settle_seconds": 30}},
                "timeouts": {"connect": 5, "write": 10, "read": 30, "submit_read": 60, "pool": 5},
                "submit_journal": {"path": str(journal), "sole_submitter": True},
                "accounts": [
                    {"name": "prod-us", "region": "us", "credential_ref": "env:K:-key_test"}
                ],
            },
            {"VIDROUTE_TIME_SCALE": str(SCALE)},
        )
        server = SidecarServer(RunwayAdapter.from_config(config), "127.0.0.1:0")
        port = await server.start()
        try:
            yield emulator, f"127.0.0.1:{port}", journal
        finally:
            await server.stop()


async def test_a_submit_that_never_left_is_proven_absent_and_its_key_refused(
    lite: Harness, runway: tuple[RunwayEmulator, str, Path]
) -> None:
    """Recovery of the never-sent Submit gets NOT_FOUND by submit_journal once the window
    settled (INCONCLUSIVE before), the attempt FAILS PROVEN_ABSENT and the task is requeued;
    a stale Submit of the old key afterwards is refused and journaled, and the emulator's
    truth shows no job at all, while a fresh key still reaches the provider."""
    emulator, address, journal = runway
    # Past the journal's start + skew, so the request start lies inside its coverage.
    await asyncio.sleep(5 * SCALE + 0.05)
    lite.clock.now = datetime.now(UTC)
    dead = DiesBeforeSending(address)
    live = GrpcAdapterClient(address)
    try:
        await live.describe()
        spec = GenerationSpec(
            tenant_id="tenant-a",
            prompt="a red fox",
            mode=Mode.TEXT_TO_VIDEO,
            output=OutputSpec(width=1280, height=720, duration_ms=4000),
        )
        plan = await live.compile(spec, account="prod-us", model="gen4.5")
        attempt = await lite.task_with_attempt(compile_plan=dict(plan.plan_json))
        engine = lite.engine(
            {"runway": dead}, recovery_base_s=0.05, recovery_cap_s=0.05, max_recovery_queries=1000
        )
        # The window is counted from the attempt's unknown_since, the unit clock of the move to
        # SUBMIT_UNKNOWN: set it, and start the test's own count, at the same moment (counted
        # from later, a loaded machine's slow submit step made a conclusive answer look early).
        lite.clock.now = datetime.now(UTC)
        unknown_at = time.monotonic()
        await engine.submitter.run_once()
        assert (await lite.attempt(attempt.id)).state is AttemptState.SUBMIT_UNKNOWN
        recovery = lite.engine(
            {"runway": live}, recovery_base_s=0.05, recovery_cap_s=0.05, max_recovery_queries=1000
        )
        verdicts = []
        while (await lite.attempt(attempt.id)).state is AttemptState.SUBMIT_UNKNOWN:
            assert time.monotonic() < unknown_at + 10 * SETTLE_S, "absence was never proven"
            lite.clock.now = datetime.now(UTC)
            verdicts.append(
                (time.monotonic() - unknown_at, await recovery.recovery.step(attempt.id))
            )
            await asyncio.sleep(0.1)
        early = [v for t, v in verdicts if t < SETTLE_S * 0.9]
        assert early, verdicts
        assert all(v is RecoveryVerdict.INCONCLUSIVE for v in early), verdicts
        assert verdicts[-1][1] is RecoveryVerdict.NOT_FOUND
        failed = await lite.attempt(attempt.id)
        assert failed.state is AttemptState.FAILED
        assert failed.failure is not None
        assert failed.failure.code == "PROVEN_ABSENT"
        assert "method=submit_journal" in failed.failure.message
        detail = await lite.detail(attempt.task_id)
        assert detail.task.state in (TaskState.QUEUED, TaskState.SCHEDULING)
        assert emulator.truth() == []

        stale = await live.submit(plan, attempt.client_request_key)
        assert stale.kind is SubmitKind.REJECTED
        assert stale.error is not None
        assert stale.error.code == PROVEN_ABSENT
        assert emulator.truth() == []
        lines = [
            line for line in journal.read_text().splitlines() if attempt.client_request_key in line
        ]
        assert sum(PROVEN_ABSENT in line for line in lines) == 2  # the proof and the refusal

        fresh = await live.submit(plan, "crk-fresh")
        assert fresh.kind is SubmitKind.ACCEPTED
        assert len(emulator.truth()) == 1
    finally:
        await dead.close()
        await live.close()
