"""Technical quality signals of delivery (design 9.14): the probe's frozen / black frame checks on
real MP4s over a real HTTP server, and the output step recording one check per probed sample in
the unit that stores (or refuses) the output, counted in the model's bucket."""

from __future__ import annotations

import io
from dataclasses import replace
from datetime import UTC, datetime

import av
import httpx
import pytest
from sqlalchemy import select

from adapter_sidecars.emulators.media import MediaSpec
from adapter_sidecars.emulators.media import render_mp4 as emulator_mp4
from controlplane.domain.quality import bucket_key
from controlplane.domain.states import TaskState
from controlplane.execution.frame_checks import frame_defects
from controlplane.execution.output_fetch import (
    ExpectedMedia,
    FetchRequest,
    InvalidReason,
    OutputInvalid,
    StoredAsset,
    fetch_output,
)
from controlplane.persistence import quality as store
from controlplane.persistence.models import quality_checks
from controlplane.storage import FilesystemObjectStore
from tests.integration.execution.exec_harness import Harness, wait_for
from tests.integration.execution.file_server import FileServer
from tests.integration.execution.media_files import render_mp4
from tests.support.outputs import stored_mp4
from vidroute_core.adapter import JobOutput, JobSnapshot, JobState

pytestmark = pytest.mark.timeout(60)

STORED = stored_mp4("output.mp4")
ASKED = ExpectedMedia(duration_ms=1500, width=1280, height=720, with_audio=False)


async def _probe(file_server: FileServer, http: httpx.AsyncClient, store_: FilesystemObjectStore,
                 name: str, body: bytes) -> tuple[str, ...]:  # fmt: skip
    url = file_server.serve(f"/out/{name}.mp4", body)
    request = FetchRequest(
        task_id="t", attempt_id=name, source_uri=url, expected=ASKED, max_bytes=10 * 1024 * 1024
    )
    result = await fetch_output(http, store_, request)
    assert isinstance(result, StoredAsset), result
    return result.defects


async def test_probe_flags_frozen_and_black_clips_and_passes_a_moving_one(
    file_server: FileServer, http: httpx.AsyncClient, fs_store: FilesystemObjectStore
) -> None:
    """A one-colour clip is FROZEN_FRAMES, an all-black one BLACK_FRAMES too, the emulator's
    moving square nothing; every one of them is still stored (signals, not refusals)."""
    still = await _probe(file_server, http, fs_store, "still", render_mp4(1.5))
    black = await _probe(file_server, http, fs_store, "black", render_mp4(1.5, colour=(0, 0, 0)))
    moving = emulator_mp4(MediaSpec("a fox", 1.5, 160, 90))
    assert still == ("FROZEN_FRAMES",)
    assert black == ("BLACK_FRAMES", "FROZEN_FRAMES")
    assert await _probe(file_server, http, fs_store, "moving", moving) == ()


async def _deliver(lite: Harness, job: str) -> int:
    """Run a task through submit, poll and delivery on the fake adapter; its task id."""
    attempt = await lite.task_with_attempt()
    lite.fake.script_submit(lite.fake.accepted(job))
    output = JobOutput(
        "https://cdn.example/out.mp4", "video/mp4", datetime(2026, 6, 26, tzinfo=UTC)
    )
    lite.fake.set_job(job, JobSnapshot(JobState.SUCCEEDED, "SUCCEEDED", outputs=(output,)))
    engine = lite.engine()
    await engine.run_until_idle()
    lite.clock.advance(30)
    await engine.run_until_idle()

    async def finished() -> bool:
        state = (await lite.detail(attempt.task_id)).task.state
        return state in {TaskState.SUCCEEDED, TaskState.FAILED}

    await wait_for(finished)
    return attempt.task_id


async def _checks(lite: Harness) -> list[tuple[int, int, list[str]]]:
    async with lite.db.reading() as conn:
        rows = await conn.execute(
            select(
                quality_checks.c.task_id, quality_checks.c.sample_index, quality_checks.c.defects
            )
        )
        return [(r[0], r[1], list(r[2])) for r in rows]


async def test_a_stored_output_records_its_check_in_the_bucket(lite: Harness) -> None:
    """A delivered output with frozen frames: SUCCEEDED, one check naming FROZEN_FRAMES for its
    sample, counted for the model's bucket and whole mode; the output document has no defects."""
    lite.fetch.results.append(replace(STORED, defects=("FROZEN_FRAMES",)))
    task_id = await _deliver(lite, "job-q1")
    detail = await lite.detail(task_id)
    assert detail.task.state is TaskState.SUCCEEDED
    assert "defects" not in (detail.task.output_asset or {})
    assert await _checks(lite) == [(task_id, 0, ["FROZEN_FRAMES"])]
    async with lite.db.reading() as conn:
        counts = await store.aggregates(conn)
    bucket = bucket_key(detail.task.spec)
    model = detail.attempts[0].provider_model
    for b in (bucket, ""):
        c = counts[("runway", model, "TEXT_TO_VIDEO", b)]
        assert (c.technical_checks, c.technical_defects, c.verdicts) == (1, 1, 0)


async def test_a_refused_output_records_its_defect_with_the_failure(lite: Harness) -> None:
    """An output whose duration is not the asked one fails the task and counts a MEDIA_MISMATCH
    check in the same unit; a refusal that says nothing of the video (MIME type) counts none."""
    lite.fetch.results.append(OutputInvalid(InvalidReason.MEDIA_MISMATCH, "duration 8000 ms"))
    failed = await _deliver(lite, "job-q2")
    assert (await lite.detail(failed)).task.state is TaskState.FAILED
    assert await _checks(lite) == [(failed, 0, ["MEDIA_MISMATCH"])]
    lite.fetch.results.append(OutputInvalid(InvalidReason.MIME_TYPE, "text/html"))
    other = await _deliver(lite, "job-q3")
    assert (await lite.detail(other)).task.state is TaskState.FAILED
    assert [t for t, _, _ in await _checks(lite)] == [failed]


async def test_a_redelivered_check_counts_once(lite: Harness) -> None:
    """The same (attempt, sample) check written twice, as a redelivered step would, is stored
    and counted once."""
    attempt = await lite.task_with_attempt()
    subject = store.Subject("runway", "gen4.5", "TEXT_TO_VIDEO", "b")
    check = store.NewCheck(attempt.task_id, attempt.id, 0, subject)
    written = []
    for _ in range(2):
        async with lite.db.unit(lite.clock()) as u:
            written.append(await u.record_quality_checks([check]))
    assert written == [1, 0]
    async with lite.db.reading() as conn:
        counts = await store.aggregates(conn)
    assert counts[("runway", "gen4.5", "TEXT_TO_VIDEO", "b")].technical_checks == 1


def test_a_clip_too_short_to_sample_reports_nothing() -> None:
    """Two frames of one colour are too few to call frozen: no defect, whatever the content."""
    with av.open(io.BytesIO(render_mp4(2 / 24)), mode="r") as container:
        frames = container.decode(video=0)
        first = next(frames)
        assert frame_defects(first, frames, 2, 24.0) == ()
