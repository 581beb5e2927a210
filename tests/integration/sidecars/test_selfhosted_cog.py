"""The self-hosted adapter's Cog backend against a real Cog server (coglet) running the repo's
predictor (models/cog_video): submit by PUT, outcomes only by webhook, no second GPU run."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml
from adapter_support import eventually, make_spec, sidecar_config

from adapter_sidecars.common.config import ConfigError, parse_config
from adapter_sidecars.common.types import CompileInput, FetchOutputInput, SubmitInput, UsageInput
from adapter_sidecars.selfhosted.adapter import build_adapter
from adapter_sidecars.selfhosted.cog_adapter import CogAdapter
from tests.support.cog import CogServer
from tests.support.stack import free_port
from vidroute_core.adapter import (
    JobRef,
    JobState,
    RecoverQuery,
    RecoveryVerdict,
    SubmitKind,
    SubmitOutcome,
)
from vidroute_core.errors import ErrorClass

TOKEN = "key_test"  # what sidecar_config's credential_ref resolves to
COG_EXAMPLE = (
    Path(__file__).resolve().parents[3] / "adapter_sidecars/selfhosted/config.cog.example.yaml"
)


@pytest.fixture(scope="module")
def cog(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CogServer]:
    server = CogServer(tmp_path_factory.mktemp("cog"), webhook_token=TOKEN)
    yield server
    server.stop()


def _config(cog: CogServer, tmp: Path, **options: Any) -> Any:
    opts = {
        "backend": "cog",
        "webhook_listen": f"127.0.0.1:{options.pop('webhook_port', 0)}",
        "webhook_grace_seconds": 1,
        **options,
    }
    config = sidecar_config(cog.url, "COG_TOKEN", options=opts)
    return replace(
        config,
        submit_journal_path=tmp / "submits.jsonl",
        timeouts=replace(config.timeouts, submit_read=5, read=5),
    )


def _adapter(config: Any) -> CogAdapter:
    adapter = build_adapter(config)
    assert isinstance(adapter, CogAdapter)
    return adapter


@pytest.fixture
async def adapter(
    cog: CogServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[CogAdapter]:
    made = _adapter(_config(cog, tmp_path))
    await made.start()
    yield made
    await made.aclose()
    await _idle(cog)


async def _idle(cog: CogServer) -> None:
    async def idle() -> bool:
        return cog.health() == "READY"

    await eventually(idle, deadline_s=20, interval=0.1)


async def _submit(adapter: CogAdapter, key: str, duration_ms: int = 2000) -> SubmitOutcome:
    spec = make_spec(duration_ms=duration_ms, prompt=f"a kite {key}")
    plan = adapter.compile(CompileInput(spec, "wan2.2-t2v", "prod-us"))
    return await adapter.submit(SubmitInput(plan, key, ""))


async def _state(adapter: CogAdapter, job: JobRef, state: JobState, deadline_s: float = 20) -> Any:
    seen: list[Any] = []

    async def reached() -> bool:
        result = await adapter.get_job(job)
        seen.append(result)
        return result.snapshot is not None and result.snapshot.state is state

    await eventually(reached, deadline_s=deadline_s, interval=0.1)
    return seen[-1].snapshot


async def test_prediction_runs_once_and_its_mp4_streams_through_the_sidecar(
    adapter: CogAdapter, cog: CogServer
) -> None:
    """A PUT is ACCEPTED with the key as job id; the completed webhook makes GetJob SUCCEEDED
    with a cost, the MP4 streams through FetchOutput, and the server ran it exactly once."""
    outcome = await _submit(adapter, "att-ok-1")
    assert outcome.kind is SubmitKind.ACCEPTED
    assert outcome.job is not None
    assert outcome.job.provider_job_id == "att-ok-1"
    snap = await _state(adapter, outcome.job, JobState.SUCCEEDED)
    assert snap.actual_cost_micros is not None
    assert snap.actual_cost_micros >= 0
    (output,) = snap.outputs
    assert output.fetch_through_adapter
    assert output.mime_type == "video/mp4"
    data = b""
    async for part in adapter.fetch_output(FetchOutputInput(outcome.job, output.uri, 0)):
        assert part.error is None
        data += part.data
    assert data[4:8] == b"ftyp"
    assert len(data) > 500
    assert cog.runs()["att-ok-1"] == 1
    usage = await adapter.list_usage(UsageInput("prod-us", _ago(60), _ago(-60)))
    assert [r.provider_job_id for r in usage.records] == ["att-ok-1"]


def _ago(seconds: float) -> datetime:
    return datetime.now(UTC) - timedelta(seconds=seconds)


async def test_busy_server_is_no_capacity_and_nothing_starts(
    cog: CogServer, tmp_path: Path
) -> None:
    """While the one slot runs a prediction, another PUT is 409: REJECTED PROVIDER_OVERLOADED
    (NO_CAPACITY) and the server never starts it; the load report says busy."""
    adapter = _adapter(_config(cog, tmp_path, extra_input={"seconds_per_output_second": 2}))
    await adapter.start()
    try:
        first = await _submit(adapter, "att-busy-1")
        assert first.kind is SubmitKind.ACCEPTED
        assert first.job is not None
        second = await _submit(adapter, "att-busy-2")
        assert second.kind is SubmitKind.REJECTED
        assert second.error is not None
        assert second.error.error_class is ErrorClass.PROVIDER_OVERLOADED
        assert second.error.code == "NO_CAPACITY"
        load = await adapter.get_load()
        assert load.models
        assert all(m.available_slots == 0 for m in load.models)
        await _state(adapter, first.job, JobState.SUCCEEDED)
        assert "att-busy-2" not in cog.runs()
    finally:
        await adapter.aclose()
        await _idle(cog)


async def test_cancel_ends_the_prediction_and_a_second_cancel_is_acknowledged(
    cog: CogServer, tmp_path: Path
) -> None:
    """Cancel reaches the running prediction (its webhook says canceled: CANCELLED); a cancel
    after the end is 404 at the server and still acknowledged."""
    adapter = _adapter(_config(cog, tmp_path, extra_input={"seconds_per_output_second": 5}))
    await adapter.start()
    try:
        outcome = await _submit(adapter, "att-cancel-1")
        assert outcome.job is not None
        await _state(adapter, outcome.job, JobState.RUNNING)
        assert (await adapter.cancel_job(outcome.job)).acknowledged
        await _state(adapter, outcome.job, JobState.CANCELLED)
        assert (await adapter.cancel_job(outcome.job)).acknowledged
    finally:
        await adapter.aclose()
        await _idle(cog)


async def test_outcome_survives_a_sidecar_restart_without_a_second_run(
    cog: CogServer, tmp_path: Path
) -> None:
    """The sidecar stops while the prediction runs; coglet retries the completed webhook until
    the restarted sidecar (same webhook port, same journal) takes it: SUCCEEDED, one run, and
    recovery of the key finds the job from the journal without asking the server."""
    port = free_port()
    config = _config(cog, tmp_path, webhook_port=port, extra_input={"seconds_per_output_second": 1})
    first = _adapter(config)
    await first.start()
    outcome = await _submit(first, "att-restart-1")
    assert outcome.job is not None
    await first.aclose()  # down while the prediction runs and ends

    async def ended() -> bool:
        return "Prediction worker completed" in cog.log.read_text() and cog.health() == "READY"

    await eventually(ended, deadline_s=20, interval=0.1)
    second = _adapter(config)
    await second.start()
    try:
        await _state(second, outcome.job, JobState.SUCCEEDED, deadline_s=30)
        found = await second.recover_submission(
            RecoverQuery("prod-us", "wan2.2-t2v", "att-restart-1")
        )
        assert found.verdict is RecoveryVerdict.FOUND
        assert cog.runs()["att-restart-1"] == 1
    finally:
        await second.aclose()


async def test_lost_outcome_is_job_not_found_once_the_server_is_idle(
    cog: CogServer, tmp_path: Path
) -> None:
    """A prediction whose terminal webhook never reaches the sidecar (its receiver address
    points nowhere) reads RUNNING-or-QUEUED while it may run, then JOB_NOT_FOUND once the
    one-slot server is idle past the grace: the control plane's lost-job rule, never a re-PUT."""
    config = _config(cog, tmp_path, webhook_url=f"http://127.0.0.1:{free_port()}")
    adapter = _adapter(config)
    await adapter.start()
    try:
        outcome = await _submit(adapter, "att-lost-1")
        assert outcome.job is not None
        job = outcome.job
        seen: list[Any] = []

        async def lost() -> bool:
            result = await adapter.get_job(job)
            seen.append(result)
            return result.error is not None

        await eventually(lost, deadline_s=20, interval=0.2)
        assert seen[-1].error.code == "JOB_NOT_FOUND"
        assert all(r.snapshot.state is JobState.QUEUED for r in seen[:-1])
        recovered = await adapter.recover_submission(
            RecoverQuery("prod-us", "wan2.2-t2v", "att-lost-1")
        )
        assert recovered.verdict is RecoveryVerdict.FOUND  # accepted here: it exists
        unknown = await adapter.recover_submission(
            RecoverQuery("prod-us", "wan2.2-t2v", "att-never-sent")
        )
        assert unknown.verdict is RecoveryVerdict.INCONCLUSIVE
        assert cog.runs()["att-lost-1"] == 1
    finally:
        await adapter.aclose()


async def test_a_prediction_the_journal_never_heard_of_is_lost_once_the_server_idles(
    adapter: CogAdapter,
) -> None:
    """A job this sidecar's journal has no word of (a memory journal that restarted) reads
    QUEUED within the webhook grace, then JOB_NOT_FOUND while the one-slot server is idle."""
    job = JobRef("att-never-heard", "prod-us", "wan2.2-t2v")
    first = await adapter.get_job(job)
    assert first.snapshot is not None
    assert first.snapshot.state is JobState.QUEUED

    async def lost() -> bool:
        result = await adapter.get_job(job)
        return result.error is not None and result.error.code == "JOB_NOT_FOUND"

    await eventually(lost, deadline_s=10, interval=0.1)


async def test_each_model_reads_its_own_servers_health_and_a_silent_one_is_left_out(
    cog: CogServer, tmp_path: Path
) -> None:
    """With ``servers``, GetLoad reports each model from its own server's /health-check: the
    model whose server does not answer is left out (no evidence), the other is warm with its
    free slot, and the sidecar stays ready while any server serves; a bad map is refused."""
    dead = f"http://127.0.0.1:{free_port()}"
    config = _config(cog, tmp_path, servers={"wan2.2-t2v": cog.url, "wan2.2-i2v": dead})
    adapter = _adapter(config)
    try:
        load = await adapter.get_load()
        assert [(m.model, m.warm, m.available_slots) for m in load.models] == [
            ("wan2.2-t2v", True, 1)
        ]
        assert await adapter.probe()
        assert adapter.server("wan2.2-i2v") == dead
    finally:
        await adapter.aclose()
    for servers in ({"no-such-model": cog.url}, {"wan2.2-t2v": "ftp://x"}, ["wan2.2-t2v"]):
        with pytest.raises(ConfigError, match=r"provider\.options\.servers"):
            _adapter(_config(cog, tmp_path, servers=servers))


async def test_the_shipped_cog_example_config_runs_a_prediction(cog: CogServer) -> None:
    """adapter_sidecars/selfhosted/config.cog.example.yaml, with only the server's address, the
    webhook port and the token substituted (what the README tells an operator to change), runs
    a prediction on a real Cog server to SUCCEEDED, once."""
    raw = yaml.safe_load(COG_EXAMPLE.read_text())
    port = free_port()
    raw["provider"]["base_url"] = cog.url
    raw["provider"]["options"]["webhook_listen"] = f"127.0.0.1:{port}"
    raw["provider"]["options"]["webhook_url"] = f"http://127.0.0.1:{port}"
    # The account's credential = the server's WEBHOOK_AUTH_TOKEN.
    adapter = _adapter(parse_config(raw, {"SELFHOSTED_API_KEY": TOKEN}))
    await adapter.start()
    try:
        spec = make_spec(duration_ms=2000, prompt="a kite from the example")
        account = adapter.config.accounts[0].name
        plan = adapter.compile(CompileInput(spec, "wan2.2-t2v", account))
        outcome = await adapter.submit(SubmitInput(plan, "att-example-1", ""))
        assert outcome.kind is SubmitKind.ACCEPTED
        assert outcome.job is not None
        await _state(adapter, outcome.job, JobState.SUCCEEDED)
        assert cog.runs()["att-example-1"] == 1
    finally:
        await adapter.aclose()
