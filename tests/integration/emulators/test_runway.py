"""Runway emulator: auth, validation, task lifecycle, limits, deletes, usage, outputs."""

from __future__ import annotations

import asyncio
import io

import av
import httpx
import pytest

from adapter_sidecars.emulators.runway import RunwayConfig, RunwayEmulator

from .conftest import RUNWAY_HEADERS, T2V_BODY, client, poll_until


async def _create(rw: httpx.AsyncClient, body: dict[str, object] | None = None) -> str:
    response = await rw.post("/v1/text_to_video", json=body or T2V_BODY)
    assert response.status_code == 200, response.text
    return str(response.json()["id"])


async def test_auth_headers_are_required(runway: RunwayEmulator) -> None:
    """A missing Bearer key is 401 and a missing X-Runway-Version is 400."""
    async with client(runway.url) as c:
        no_key = await c.post(
            "/v1/text_to_video", json=T2V_BODY, headers={"X-Runway-Version": "2024-11-06"}
        )
        no_version = await c.post(
            "/v1/text_to_video", json=T2V_BODY, headers={"Authorization": "Bearer k"}
        )
    assert no_key.status_code == 401
    assert "error" in no_key.json()
    assert no_version.status_code == 400
    assert "X-Runway-Version" in no_version.json()["error"]


async def test_validation_reports_zod_issues(rw: httpx.AsyncClient) -> None:
    """Unknown keys, bad ratio and out-of-range duration come back as zod-style issues."""
    body = {**T2V_BODY, "ratio": "1:1", "duration": 11, "colour": "red"}
    response = await rw.post("/v1/text_to_video", json=body)
    assert response.status_code == 400
    issues = {i["code"]: i for i in response.json()["issues"]}
    assert issues["unrecognized_keys"]["keys"] == ["colour"]
    assert issues["invalid_value"]["path"] == ["ratio"]
    assert issues["too_big"]["path"] == ["duration"]
    assert issues["too_big"]["maximum"] == 10


@pytest.mark.parametrize(
    ("path", "body", "bad_path"),
    [
        (
            "/v1/text_to_video",
            {"model": "veo3", "promptText": "p", "ratio": "1280:720", "duration": 6},
            "duration",
        ),
        (
            "/v1/text_to_video",
            {"model": "gen4_turbo", "promptText": "p", "ratio": "1280:720"},
            "model",
        ),
        ("/v1/image_to_video", {"model": "gen4_turbo", "ratio": "1280:720"}, "promptImage"),
        (
            "/v1/text_to_video",
            {"model": "gen4.5", "promptText": "p", "ratio": "1280:720"},
            "duration",
        ),
    ],
)
async def test_model_matrix_is_enforced(
    rw: httpx.AsyncClient, path: str, body: dict[str, object], bad_path: str
) -> None:
    """Per-model rules from the §1.3 table reject the offending field."""
    response = await rw.post(path, json=body)
    assert response.status_code == 400
    assert bad_path in [i["path"][0] for i in response.json()["issues"] if i["path"]]


async def test_image_to_video_accepts_first_and_last_for_veo31(rw: httpx.AsyncClient) -> None:
    """veo3.1 image_to_video accepts first+last frames and an optional duration."""
    body = {
        "model": "veo3.1",
        "ratio": "1280:720",
        "promptImage": [
            {"uri": "https://cdn.example.com/a.png", "position": "first"},
            {"uri": "https://cdn.example.com/b.png", "position": "last"},
        ],
    }
    assert (await rw.post("/v1/image_to_video", json=body)).status_code == 200


async def test_task_progresses_per_poll_to_success_with_playable_output(
    rw: httpx.AsyncClient,
) -> None:
    """In polls mode a task goes PENDING, RUNNING with progress, then SUCCEEDED with an MP4 URL."""
    task_id = await _create(rw)
    seen = [(await rw.get(f"/v1/tasks/{task_id}")).json() for _ in range(4)]
    assert [t["status"] for t in seen] == ["PENDING", "RUNNING", "RUNNING", "SUCCEEDED"]
    assert 0 < seen[1]["progress"] < seen[2]["progress"] < 1
    assert seen[0]["createdAt"].endswith("Z")
    assert seen[0]["id"] == task_id
    media = await rw.get(seen[3]["output"][0])
    assert media.status_code == 200
    assert media.headers["content-type"] == "video/mp4"
    with av.open(io.BytesIO(media.content)) as container:
        assert container.streams.video[0].codec_context.name == "h264"


async def test_expired_output_is_403_and_regetting_gives_fresh_url(
    runway: RunwayEmulator, rw: httpx.AsyncClient
) -> None:
    """expire_output hands out an expired link (403); the next GET of the task gives a fresh one."""
    runway.add_faults({"route": "GET /v1/tasks/*", "action": "expire_output"})
    task_id = await _create(rw)
    done = await poll_until(rw, f"/v1/tasks/{task_id}", "status", {"SUCCEEDED"})
    assert (await rw.get(done["output"][0])).status_code == 403
    fresh = (await rw.get(f"/v1/tasks/{task_id}")).json()["output"][0]
    assert fresh != done["output"][0]
    assert (await rw.get(fresh)).status_code == 200


@pytest.mark.parametrize("runway_config", [RunwayConfig(max_concurrent=1)])
async def test_concurrency_over_tier_is_throttled(rw: httpx.AsyncClient) -> None:
    """With one concurrent slot a second task reports THROTTLED until the first finishes."""
    first, second = await _create(rw), await _create(rw)
    await poll_until(rw, f"/v1/tasks/{first}", "status", {"RUNNING"})
    statuses = {(await rw.get(f"/v1/tasks/{second}")).json()["status"] for _ in range(2)}
    assert statuses == {"THROTTLED"}
    await poll_until(rw, f"/v1/tasks/{first}", "status", {"SUCCEEDED"})
    await poll_until(rw, f"/v1/tasks/{second}", "status", {"SUCCEEDED"})


@pytest.mark.parametrize("runway_config", [RunwayConfig(max_daily=2)])
async def test_daily_limit_is_429(runway: RunwayEmulator, rw: httpx.AsyncClient) -> None:
    """Creating more tasks than the rolling daily limit is answered 429 and creates nothing."""
    await _create(rw)
    await _create(rw)
    response = await rw.post("/v1/text_to_video", json=T2V_BODY)
    assert response.status_code == 429
    assert len(runway.truth()) == 2


async def test_delete_cancels_and_is_not_billed(rw: httpx.AsyncClient) -> None:
    """DELETE answers 204, the task reads CANCELLED and no credits are billed."""
    task_id = await _create(rw)
    assert (await rw.delete(f"/v1/tasks/{task_id}")).status_code == 204
    assert (await rw.get(f"/v1/tasks/{task_id}")).json()["status"] == "CANCELLED"
    assert (await rw.post("/v1/organization/usage", json={})).json()["results"] == []


async def test_a_throttled_task_cancelled_reads_cancelled(
    runway: RunwayEmulator, rw: httpx.AsyncClient
) -> None:
    """A task held THROTTLED and then deleted reads CANCELLED: THROTTLED describes a task still
    waiting in the queue, never one that has ended."""
    runway.add_faults({"route": "POST /v1/text_to_video", "action": "throttle_polls", "n": 100})
    task_id = await _create(rw)
    assert (await rw.get(f"/v1/tasks/{task_id}")).json()["status"] == "THROTTLED"
    assert (await rw.delete(f"/v1/tasks/{task_id}")).status_code == 204
    assert (await rw.get(f"/v1/tasks/{task_id}")).json()["status"] == "CANCELLED"


@pytest.mark.parametrize(
    "runway_config", [RunwayConfig(advance="time", queue_s=0.0, run_s=0.05, tick_s=0.01)]
)
async def test_in_time_mode_a_throttled_task_waits_in_the_queue(
    runway: RunwayEmulator, rw: httpx.AsyncClient
) -> None:
    """In time mode the clock does not run a throttled task: it waits queued (never started)
    for as long as it is throttled, then runs to SUCCEEDED once the throttle lifts."""
    runway.add_faults({"route": "POST /v1/text_to_video", "action": "throttle_polls", "n": 3})
    task_id = await _create(rw)
    job = runway.jobs[task_id]
    await asyncio.sleep(0.2)  # four run times: an unheld task would have finished
    assert job.started_at is None
    assert not job.phase.terminal
    statuses = [(await rw.get(f"/v1/tasks/{task_id}")).json()["status"] for _ in range(3)]
    assert statuses == ["THROTTLED"] * 3
    await poll_until(rw, f"/v1/tasks/{task_id}", "status", {"SUCCEEDED"})


@pytest.mark.parametrize("runway_config", [RunwayConfig(delete_mode="delete")])
async def test_delete_mode_makes_task_disappear(rw: httpx.AsyncClient) -> None:
    """In delete mode a later GET is 404 Could not find Task."""
    task_id = await _create(rw)
    assert (await rw.delete(f"/v1/tasks/{task_id}")).status_code == 204
    response = await rw.get(f"/v1/tasks/{task_id}")
    assert (response.status_code, response.json()) == (404, {"error": "Could not find Task"})


async def test_fail_job_sets_failure_code(runway: RunwayEmulator, rw: httpx.AsyncClient) -> None:
    """fail_job ends the task FAILED with the injected failureCode and bills nothing."""
    runway.add_faults(
        {
            "route": "POST /v1/text_to_video",
            "action": "fail_job",
            "code": "SAFETY.INPUT.TEXT",
            "message": "Input prompt text was rejected.",
        }
    )
    task_id = await _create(rw)
    done = await poll_until(rw, f"/v1/tasks/{task_id}", "status", {"FAILED"})
    assert done["failureCode"] == "SAFETY.INPUT.TEXT"
    assert done["failure"]
    assert (await rw.post("/v1/organization/usage", json={})).json()["results"] == []


async def test_throttle_polls_and_unknown_status(
    runway: RunwayEmulator, rw: httpx.AsyncClient
) -> None:
    """throttle_polls and unknown_status override what the next polls report."""
    runway.add_faults(
        [
            {"route": "POST /v1/text_to_video", "action": "throttle_polls", "n": 2},
            {
                "route": "POST /v1/text_to_video",
                "action": "unknown_status",
                "value": "QUEUED_FOR_GPU",
            },
        ]
    )
    task_id = await _create(rw)
    statuses = [(await rw.get(f"/v1/tasks/{task_id}")).json()["status"] for _ in range(4)]
    assert statuses == ["THROTTLED", "THROTTLED", "QUEUED_FOR_GPU", "PENDING"]


async def test_success_is_billed_by_price_table(rw: httpx.AsyncClient) -> None:
    """A succeeded gen4.5 5 s task bills 12 credits/s = 60 credits and lowers the balance."""
    task_id = await _create(rw)
    await poll_until(rw, f"/v1/tasks/{task_id}", "status", {"SUCCEEDED"})
    usage = (await rw.post("/v1/organization/usage", json={})).json()
    assert usage["models"] == ["gen4.5"]
    assert usage["results"][0]["usedCredits"] == [{"model": "gen4.5", "amount": 60.0}]
    org = (await rw.get("/v1/organization")).json()
    assert org["creditBalance"] == 4940
    assert org["usage"]["models"]["gen4.5"]["dailyGenerations"] == 1


@pytest.mark.parametrize("runway_config", [RunwayConfig(extensions=frozenset({"task_listing"}))])
async def test_task_list_extension_filters_by_creation_time(rw: httpx.AsyncClient) -> None:
    """With the task_listing extension named, GET /v1/tasks lists tasks with their request
    bodies inside the createdAfter window."""
    task_id = await _create(rw)
    listed = (await rw.get("/v1/tasks", params={"createdAfter": "2000-01-01T00:00:00Z"})).json()
    assert [(t["id"], t["request"]) for t in listed["data"]] == [(task_id, T2V_BODY)]
    empty = (await rw.get("/v1/tasks", params={"createdAfter": "2999-01-01T00:00:00Z"})).json()
    assert empty["data"] == []


async def test_task_list_is_off_by_default_like_the_real_api(rw: httpx.AsyncClient) -> None:
    """By default GET /v1/tasks does not exist: 404 with Runway's error body, as the real API."""
    await _create(rw)
    response = await rw.get("/v1/tasks")
    assert (response.status_code, response.json()) == (404, {"error": "Not found"})


def test_unknown_extension_names_are_refused() -> None:
    """Naming an extension the emulator does not have fails at construction, listing the
    known names."""
    with pytest.raises(ValueError, match="task_listing"):
        RunwayEmulator(RunwayConfig(extensions=frozenset({"operation_list"})))


async def test_time_mode_progresses_by_the_clock() -> None:
    """In time mode a task completes on its own after queue_s + run_s."""
    config = RunwayConfig(advance="time", queue_s=0.05, run_s=0.2)
    async with RunwayEmulator(config) as emu, client(emu.url, headers=RUNWAY_HEADERS) as rw:
        task_id = await _create(rw)
        await poll_until(rw, f"/v1/tasks/{task_id}", "status", {"SUCCEEDED"})


async def test_every_status_carries_its_cost_field(
    runway: RunwayEmulator, rw: httpx.AsyncClient
) -> None:
    """Create and PENDING / THROTTLED / RUNNING carry estimatedCost, SUCCEEDED / FAILED /
    CANCELLED carry cost in whole credits (0 when not billed), as runwayml >= 5.14 requires."""
    runway.add_faults({"route": "POST /v1/text_to_video", "action": "throttle_polls", "n": 1})
    created = await rw.post("/v1/text_to_video", json=T2V_BODY)
    assert created.json()["estimatedCost"] == {"credits": 60}
    task_id = created.json()["id"]
    seen = [(await rw.get(f"/v1/tasks/{task_id}")).json() for _ in range(5)]
    by_status = {t["status"]: t for t in seen}
    assert set(by_status) == {"THROTTLED", "PENDING", "RUNNING", "SUCCEEDED"}
    for status in ("THROTTLED", "PENDING", "RUNNING"):
        assert by_status[status]["estimatedCost"] == {"credits": 60}, status
        assert "cost" not in by_status[status]
    assert by_status["SUCCEEDED"]["cost"] == {"credits": 60}
    assert "estimatedCost" not in by_status["SUCCEEDED"]
    cancelled_id = await _create(rw)
    assert (await rw.delete(f"/v1/tasks/{cancelled_id}")).status_code == 204
    assert (await rw.get(f"/v1/tasks/{cancelled_id}")).json()["cost"] == {"credits": 0}
    runway.add_faults({"route": "POST /v1/text_to_video", "action": "fail_job", "code": "INTERNAL"})
    failed_id = await _create(rw)
    failed = await poll_until(rw, f"/v1/tasks/{failed_id}", "status", {"FAILED"})
    assert failed["cost"] == {"credits": 0}


async def test_seed_on_veo31_and_output_format_on_gen45(rw: httpx.AsyncClient) -> None:
    """veo3.1 accepts seed; gen4.5 accepts outputFormat (a non-mp4 format adds its surcharge)
    and refuses an unknown one; outputFormat on veo3.1 is an unrecognized key."""
    veo = {"model": "veo3.1", "promptText": "p", "ratio": "1280:720", "seed": 5}
    assert (await rw.post("/v1/text_to_video", json=veo)).status_code == 200
    prores = await rw.post("/v1/text_to_video", json={**T2V_BODY, "outputFormat": "prores"})
    assert prores.json()["estimatedCost"] == {"credits": (12 + 5) * 5}
    bad = await rw.post("/v1/text_to_video", json={**T2V_BODY, "outputFormat": "gif"})
    assert [i["path"] for i in bad.json()["issues"]] == [["outputFormat"]]
    other = await rw.post("/v1/text_to_video", json={**veo, "outputFormat": "mp4"})
    assert other.json()["issues"][0]["code"] == "unrecognized_keys"


async def test_upload_slot_takes_only_its_own_fields(
    runway: RunwayEmulator, rw: httpx.AsyncClient
) -> None:
    """POST /v1/uploads hands out a slot; a multipart POST with wrong fields is 403 and leaves
    the runway:// URI unusable (400 on create); the right fields are 204 and make it usable."""
    slot = (await rw.post("/v1/uploads", json={"filename": "a.png", "type": "ephemeral"})).json()
    assert slot["runwayUri"].startswith("runway://")
    body = {**T2V_BODY, "promptImage": slot["runwayUri"]}
    async with client(runway.url) as storage:
        forged = {**slot["fields"], "x-amz-signature": "0" * 64}
        denied = await storage.post(
            slot["uploadUrl"], data=forged, files={"file": ("a.png", b"png")}
        )
        assert denied.status_code == 403
        assert (await rw.post("/v1/image_to_video", json=body)).status_code == 400
        stored = await storage.post(
            slot["uploadUrl"], data=slot["fields"], files={"file": ("a.png", b"png")}
        )
        assert stored.status_code == 204
    assert (await rw.post("/v1/image_to_video", json=body)).status_code == 200
    bad = await rw.post("/v1/uploads", json={"filename": "a.png", "type": "permanent"})
    assert bad.status_code == 400
