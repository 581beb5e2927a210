"""Self-hosted GPU job API: idempotency, job shape, queue limits, worker pool, webhooks."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from adapter_sidecars.emulators.callbacks import SIGNATURE_HEADER, verify_signature
from adapter_sidecars.emulators.selfhosted import SelfHostedConfig, SelfHostedEmulator

from .conftest import Receiver, client, eventually, poll_until

JOB: dict[str, Any] = {
    "model": "wan2.2-t2v",
    "prompt": "a red kite",
    "duration_s": 2,
    "resolution": "720p",
    "aspect_ratio": "16:9",
    "seed": 42,
}
TIME_MODE = SelfHostedConfig(advance="time", queue_s=0.0, speed=0.005, workers=2)


@pytest.fixture
def sh_config() -> SelfHostedConfig:
    return SelfHostedConfig()


@pytest.fixture
async def sh(sh_config: SelfHostedConfig) -> AsyncIterator[SelfHostedEmulator]:
    async with SelfHostedEmulator(sh_config) as emu:
        yield emu


@pytest.fixture
async def sc(sh: SelfHostedEmulator) -> AsyncIterator[httpx.AsyncClient]:
    async with client(sh.url) as c:
        yield c


async def test_idempotency_key_returns_same_job_or_conflict(
    sh: SelfHostedEmulator, sc: httpx.AsyncClient
) -> None:
    """A reused Idempotency-Key returns the same job (200), a new body 409; lookup finds it."""
    first = await sc.post("/v1/jobs", json=JOB, headers={"Idempotency-Key": "k1"})
    again = await sc.post("/v1/jobs", json=JOB, headers={"Idempotency-Key": "k1"})
    clash = await sc.post("/v1/jobs", json={**JOB, "seed": 7}, headers={"Idempotency-Key": "k1"})
    assert first.status_code == 202
    assert first.json()["status"] == "queued"
    assert first.json()["queue_position"] == 1
    assert again.status_code == 200
    assert again.json()["id"] == first.json()["id"]
    assert clash.status_code == 409
    assert clash.json()["error"]["code"] == "IDEMPOTENCY_CONFLICT"
    found = (await sc.get("/v1/jobs", params={"idempotency_key": "k1"})).json()["jobs"]
    assert [j["id"] for j in found] == [first.json()["id"]]
    assert [(j["idempotency_key"], j["body"]) for j in sh.truth()] == [("k1", JOB)]


async def test_job_shape_after_success(sc: httpx.AsyncClient) -> None:
    """A succeeded job has outputs (url, type, duration, size, expiry) and gpu_seconds."""
    job_id = (await sc.post("/v1/jobs", json=JOB)).json()["id"]
    job = await poll_until(sc, f"/v1/jobs/{job_id}", "status", {"succeeded"})
    [output] = job["outputs"]
    assert output["content_type"] == "video/mp4"
    assert output["duration_s"] == 2.0
    assert (output["width"], output["height"]) == (320, 180)
    assert output["expires_at"].endswith("Z")
    assert job["error"] is None
    assert job["progress"] == 1.0
    assert job["metrics"]["gpu_seconds"] == pytest.approx(26.0)
    assert (await sc.get(output["url"])).status_code == 200


async def test_invalid_input_is_400(sc: httpx.AsyncClient) -> None:
    """Unknown models or fields are rejected with error.code INVALID_INPUT."""
    response = await sc.post("/v1/jobs", json={**JOB, "model": "nope"})
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "INVALID_INPUT"


@pytest.mark.parametrize("sh_config", [SelfHostedConfig(max_queue=1, retry_after_s=9)])
async def test_queue_full_is_503_with_retry_after(
    sh: SelfHostedEmulator, sc: httpx.AsyncClient
) -> None:
    """When the queue is full, submit answers 503 with Retry-After and creates nothing."""
    assert (await sc.post("/v1/jobs", json=JOB)).status_code == 202
    full = await sc.post("/v1/jobs", json=JOB)
    assert full.status_code == 503
    assert full.headers["retry-after"] == "9"
    assert len(sh.truth()) == 1
    health = (await sc.get("/v1/health")).json()
    assert health["queue_depth"] == 1
    assert health["workers"]["total"] == 2


async def test_delete_cancels_job(sc: httpx.AsyncClient) -> None:
    """DELETE answers 202 and the job reads cancelled, idempotently."""
    job_id = (await sc.post("/v1/jobs", json=JOB)).json()["id"]
    for _ in range(2):
        response = await sc.delete(f"/v1/jobs/{job_id}")
        assert response.status_code == 202
        assert response.json()["status"] == "cancelled"
    assert (await sc.get(f"/v1/jobs/{job_id}")).json()["status"] == "cancelled"


async def test_fail_job_reports_error_object(sh: SelfHostedEmulator, sc: httpx.AsyncClient) -> None:
    """fail_job OOM ends the job failed with error {code, message, retryable}."""
    sh.add_faults(
        {"route": "POST /v1/jobs", "action": "fail_job", "code": "OOM", "message": "CUDA OOM"}
    )
    job_id = (await sc.post("/v1/jobs", json=JOB)).json()["id"]
    job = await poll_until(sc, f"/v1/jobs/{job_id}", "status", {"failed"})
    assert job["error"] == {"code": "OOM", "message": "CUDA OOM", "retryable": False}


async def test_worker_pool_renders_and_bills_gpu_seconds() -> None:
    """In time mode at most `workers` jobs run at once; each renders and bills gpu_seconds."""
    async with SelfHostedEmulator(TIME_MODE) as emu, client(emu.url) as sc:
        ids = [
            (await sc.post("/v1/jobs", json={**JOB, "prompt": f"p{i}"})).json()["id"]
            for i in range(3)
        ]
        running_seen = []

        async def all_done() -> bool:
            health = (await sc.get("/v1/health")).json()  # one atomic snapshot of the pool
            running_seen.append(health["workers"]["busy"])
            jobs = [(await sc.get(f"/v1/jobs/{i}")).json() for i in ids]
            return all(j["status"] == "succeeded" for j in jobs)

        await eventually(all_done)
        assert max(running_seen) <= 2
        usage = (await sc.get("/v1/usage", params={"start": "2000-01-01T00:00:00Z"})).json()
        assert sorted(r["job_id"] for r in usage["rows"]) == sorted(ids)
        assert usage["total_gpu_seconds"] == pytest.approx(78.0)


async def test_webhooks_signed_twice_and_out_of_order(receiver: Receiver) -> None:
    """callback_twice duplicates every callback and callback_out_of_order sends terminal first."""
    async with SelfHostedEmulator(TIME_MODE) as emu, client(emu.url) as sc:
        emu.add_faults(
            [
                {"route": "POST /v1/jobs", "action": "callback_twice"},
                {"route": "POST /v1/jobs", "action": "callback_out_of_order"},
            ]
        )
        await sc.post("/v1/jobs", json={**JOB, "webhook_url": receiver.url})
        await eventually(lambda: len(receiver.requests) >= 4)
    statuses = [json.loads(r.body)["status"] for r in receiver.requests]
    assert statuses == ["succeeded", "succeeded", "running", "running"]
    for r in receiver.requests:
        assert verify_signature(TIME_MODE.callback_secret, r.header(SIGNATURE_HEADER) or "", r.body)


async def test_callback_can_arrive_before_submit_response(receiver: Receiver) -> None:
    """callback_before_response delivers a callback before the 202 reaches the client."""
    async with SelfHostedEmulator() as emu, client(emu.url) as sc:
        emu.add_faults({"route": "POST /v1/jobs", "action": "callback_before_response"})
        response = await sc.post("/v1/jobs", json={**JOB, "webhook_url": receiver.url})
        assert len(receiver.requests) == 1
        assert json.loads(receiver.requests[0].body)["id"] == response.json()["id"]
