"""The Runway emulator driven by Runway's official SDK (``runwayml``), as a real client would.

Every client here validates responses strictly (``_strict_response_validation=True``): a task
without its cost fields, a float where the SDK types an int, or a missing field raises
``APIResponseValidationError`` instead of silently parsing as another status (provider-apis.md
§5). Only the base URL points at the emulator; everything else is the SDK's own request code.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any, cast

import httpx
import pytest
import runwayml
from runwayml.types import task_retrieve_response as tasks

from adapter_sidecars.emulators import EmulatorThread

from .conftest import RUNWAY_KEY

pytestmark = pytest.mark.timeout(60)

PNG = b"\x89PNG\r\n\x1a\n" + b"\x00" * 64


def _client(emulator: EmulatorThread, **options: Any) -> runwayml.RunwayML:
    """A strict SDK client on the emulator; no SDK retries unless a test asks for them."""
    options.setdefault("max_retries", 0)
    return runwayml.RunwayML(
        api_key=options.pop("api_key", RUNWAY_KEY),
        base_url=emulator.url,
        _strict_response_validation=True,
        **options,
    )


def _run_to_end(client: runwayml.RunwayML, task_id: str) -> list[Any]:
    """Every status the SDK parses while polling `task_id` to a terminal one."""
    seen = []
    for _ in range(10):
        task = client.tasks.retrieve(task_id)
        seen.append(task)
        if task.status in ("SUCCEEDED", "FAILED", "CANCELLED"):
            return seen
    raise AssertionError(f"task {task_id} did not finish: {seen[-1]}")


def test_text_to_video_lifecycle_parses_with_cost_fields(runway_emulator: EmulatorThread) -> None:
    """gen4.5 text_to_video (with seed and outputFormat) creates one task whose estimatedCost,
    PENDING / RUNNING / SUCCEEDED statuses and final cost all pass the SDK's strict models."""
    with _client(runway_emulator) as client:
        created = client.text_to_video.create(
            model="gen4.5",
            prompt_text="a lighthouse at dusk",
            ratio="1280:720",
            duration=5,
            seed=7,
            output_format="mp4",
        )
        # An extra field the SDK's pydantic model keeps but does not declare.
        assert created.estimated_cost.credits == 60  # type: ignore[attr-defined]  # an extra field the SDK's model keeps undeclared
        seen = _run_to_end(client, created.id)
    assert [type(t).__name__ for t in seen][:2] == ["AwaitablePending", "AwaitableRunning"]
    assert isinstance(seen[0], tasks.Pending)
    assert seen[0].estimated_cost.credits == 60
    final = seen[-1]
    assert isinstance(final, tasks.Succeeded)
    assert final.cost.credits == 60
    assert httpx.get(final.output[0]).content[4:8] == b"ftyp"
    [job] = runway_emulator.truth()
    assert job["body"]["outputFormat"] == "mp4"
    assert job["body"]["seed"] == 7


def test_strict_validation_would_catch_a_task_without_cost(
    runway_emulator: EmulatorThread,
) -> None:
    """Control for the tests above: the strict SDK refuses a SUCCEEDED task without ``cost``
    (the emulator's shape before provider-apis.md §5), so a drift in the emulator fails them."""
    task: dict[str, Any] = {
        "id": "7b1c2d3e-0000-4000-8000-000000000000",
        "createdAt": "2026-03-02T10:15:30.120Z",
        "status": "SUCCEEDED",
        "output": ["https://cdn.example.com/out.mp4"],
    }
    runway_emulator.add_faults(
        {"route": "GET /v1/tasks/*", "action": "status", "code": 200, "body": task}
    )
    with _client(runway_emulator) as client, pytest.raises(runwayml.APIResponseValidationError):
        client.tasks.retrieve(task["id"])


def test_veo31_accepts_seed_and_bills_no_audio(runway_emulator: EmulatorThread) -> None:
    """veo3.1 via Runway takes the SDK's seed (runwayml >= 5.18) and prices audio=false at the
    no-audio rate (20 credits/s x 8 s)."""
    with _client(runway_emulator) as client:
        created = client.text_to_video.create(
            model="veo3.1", prompt_text="waves", ratio="1920:1080", seed=11, audio=False
        )
        final = _run_to_end(client, created.id)[-1]
    assert created.estimated_cost.credits == 160  # type: ignore[attr-defined]  # an extra field the SDK's model keeps undeclared
    assert isinstance(final, tasks.Succeeded)
    assert final.cost.credits == 160


def test_ephemeral_upload_feeds_image_to_video(runway_emulator: EmulatorThread) -> None:
    """uploads.create_ephemeral (POST /v1/uploads, then the multipart POST to uploadUrl) yields
    a runway:// URI that image_to_video accepts; the task runs to SUCCEEDED."""
    with _client(runway_emulator) as client:
        upload = client.uploads.create_ephemeral(file=("frame.png", PNG, "image/png"))
        assert upload.uri.startswith("runway://")
        created = client.image_to_video.create(
            model="gen4.5",
            prompt_image=upload.uri,
            prompt_text="the frame comes alive",
            ratio="1280:720",
            duration=5,
        )
        assert isinstance(_run_to_end(client, created.id)[-1], tasks.Succeeded)
    [job] = runway_emulator.truth()
    assert job["body"]["promptImage"] == upload.uri


def test_unknown_upload_uri_is_a_bad_request(runway_emulator: EmulatorThread) -> None:
    """A runway:// URI that was never uploaded is 400 (BadRequestError) and creates no task."""
    with _client(runway_emulator) as client, pytest.raises(runwayml.BadRequestError):
        client.image_to_video.create(
            model="gen4.5",
            prompt_image="runway://never-uploaded",
            prompt_text="x",
            ratio="1280:720",
            duration=5,
        )
    assert runway_emulator.truth() == []


def test_delete_cancels_with_zero_cost(runway_emulator: EmulatorThread) -> None:
    """tasks.delete of a pending task returns None (204) and the task then reads CANCELLED with
    cost 0 credits, parsed by the SDK's Cancelled model."""
    with _client(runway_emulator) as client:
        created = client.text_to_video.create(
            model="gen4.5", prompt_text="x", ratio="720:1280", duration=2
        )
        assert client.tasks.delete(created.id) is None  # type: ignore[func-returns-value]  # the test asserts the SDK's None on purpose
        cancelled = client.tasks.retrieve(created.id)
    assert isinstance(cancelled, tasks.Cancelled)
    assert cancelled.cost.credits == 0


def test_failed_task_parses_with_zero_cost(runway_emulator: EmulatorThread) -> None:
    """A task failed with a failureCode parses as the SDK's Failed with cost 0 credits."""
    runway_emulator.add_faults(
        {"route": "POST /v1/text_to_video", "action": "fail_job", "code": "SAFETY.INPUT.TEXT"}
    )
    with _client(runway_emulator) as client:
        created = client.text_to_video.create(
            model="gen4.5", prompt_text="x", ratio="1280:720", duration=5
        )
        final = _run_to_end(client, created.id)[-1]
    assert isinstance(final, tasks.Failed)
    assert (final.failure_code, final.cost.credits) == ("SAFETY.INPUT.TEXT", 0)


def test_organization_and_daily_usage(runway_emulator: EmulatorThread) -> None:
    """organization.retrieve and retrieve_usage parse strictly: the balance falls by the
    task's credits and the usage is one daily total per model (no task ids at all)."""
    with _client(runway_emulator) as client:
        created = client.text_to_video.create(
            model="gen4.5", prompt_text="x", ratio="1280:720", duration=5
        )
        _run_to_end(client, created.id)
        org = client.organization.retrieve()
        today = datetime.now(UTC).date()
        usage = client.organization.retrieve_usage(
            start_date=today - timedelta(days=1), before_date=today + timedelta(days=1)
        )
    assert org.credit_balance == 5000 - 60
    assert org.usage.models["gen4.5"].daily_generations == 1
    assert usage.models == ["gen4.5"]
    [day] = usage.results
    assert [(u.model, u.amount) for u in day.used_credits] == [("gen4.5", 60)]


@pytest.mark.parametrize(
    ("code", "exception"),
    [
        (400, runwayml.BadRequestError),
        (401, runwayml.AuthenticationError),
        (403, runwayml.PermissionDeniedError),
        (404, runwayml.NotFoundError),
        (409, runwayml.ConflictError),
        (422, runwayml.UnprocessableEntityError),
        (429, runwayml.RateLimitError),
        (500, runwayml.InternalServerError),
        (503, runwayml.InternalServerError),
    ],
)
def test_error_statuses_map_to_the_sdk_exceptions(
    runway_emulator: EmulatorThread, code: int, exception: type[Exception]
) -> None:
    """Each error status the emulator answers reaches the SDK as its exception class, with
    Runway's {"error": ...} body."""
    runway_emulator.add_faults({"route": "GET /v1/organization", "action": "status", "code": code})
    with _client(runway_emulator) as client, pytest.raises(exception) as caught:
        client.organization.retrieve()
    assert isinstance(caught.value, runwayml.APIStatusError)
    assert caught.value.status_code == code
    assert "error" in cast(Any, caught.value.body)


def test_real_errors_map_to_the_sdk_exceptions(runway_emulator: EmulatorThread) -> None:
    """The emulator's own errors: a wrong key is AuthenticationError, a bad body is
    BadRequestError with zod issues, an unknown task is NotFoundError, and the emulator-only
    task listing does not exist (404) unless a test names it."""
    with (
        _client(runway_emulator, api_key="key_wrong") as wrong,
        pytest.raises(runwayml.AuthenticationError),
    ):
        wrong.organization.retrieve()
    with _client(runway_emulator) as client:
        with pytest.raises(runwayml.BadRequestError) as bad:
            client.text_to_video.create(
                model="gen4.5", prompt_text="x", ratio="1280:720", duration=11
            )
        assert isinstance(bad.value.body, dict)
        assert bad.value.body["issues"]
        with pytest.raises(runwayml.NotFoundError):
            client.tasks.retrieve("00000000-0000-0000-0000-000000000000")
        with pytest.raises(runwayml.NotFoundError):
            client.get("/v1/tasks", cast_to=object)


def test_dropped_connection_is_api_connection_error(runway_emulator: EmulatorThread) -> None:
    """A connection reset after the body is APIConnectionError in the SDK, and the task exists:
    a client cannot tell "not sent" from "accepted" (why our adapter calls it UNKNOWN)."""
    runway_emulator.add_faults({"route": "POST /v1/text_to_video", "action": "drop_after_body"})
    with _client(runway_emulator) as client, pytest.raises(runwayml.APIConnectionError):
        client.text_to_video.create(model="gen4.5", prompt_text="x", ratio="1280:720", duration=5)
    assert len(runway_emulator.truth()) == 1


def test_sdk_default_retries_create_a_duplicate(runway_emulator: EmulatorThread) -> None:
    """With the SDK's default retries, a create whose response was lost is sent again and the
    provider holds two paid tasks for one request (§5): the hazard our adapter avoids by never
    retrying a create that may have been accepted."""
    runway_emulator.add_faults({"route": "POST /v1/text_to_video", "action": "drop_after_body"})
    with _client(runway_emulator, max_retries=1) as client:
        created = client.text_to_video.create(
            model="gen4.5", prompt_text="x", ratio="1280:720", duration=5
        )
    ids = [job["id"] for job in runway_emulator.truth()]
    assert len(ids) == 2
    assert created.id == ids[1]
