"""Delivery of outputs that need the provider's credentials (``fetch_through_adapter``).

The engine runs with the real `fetch_output` (checks, PyAV probe, filesystem store); the fake
adapter's `fetch_output` plays the sidecar's FetchOutput stream. The URI's host does not
resolve, so a success proves the bytes did not come from a direct HTTP GET.
"""

from __future__ import annotations

from pathlib import Path

import httpx

from controlplane.domain.states import TaskState
from controlplane.execution.output_fetch import FetchRequest, FetchResult
from controlplane.execution.output_step import fetcher_for
from controlplane.storage import FilesystemObjectStore
from tests.integration.execution.exec_harness import Harness
from tests.integration.execution.media_files import render_mp4
from vidroute_core.adapter import JobOutput, JobSnapshot, JobState, OutputChunk
from vidroute_core.errors import ErrorClass, make_error

GEMINI_FILE = "https://generativelanguage.invalid/v1beta/files/f1:download?alt=media"
CLIP = render_mp4(4.0)  # the harness's task asks 4 s of 16:9; 160x90 is 16:9


def _done(uri: str = GEMINI_FILE, *, through_adapter: bool = True) -> JobSnapshot:
    output = JobOutput(uri, "video/mp4", fetch_through_adapter=through_adapter)
    return JobSnapshot(JobState.SUCCEEDED, "DONE", f'{{"done":true,"uri":"{uri}"}}', 1.0, (output,))


class RecordingFetch:
    """The production fetcher, recording each request."""

    def __init__(self, http: httpx.AsyncClient, store: FilesystemObjectStore) -> None:
        self._fetch = fetcher_for(http, store)
        self.calls: list[FetchRequest] = []

    async def __call__(self, request: FetchRequest) -> FetchResult:
        self.calls.append(request)
        return await self._fetch(request)


async def _run(lite: Harness, tmp_path: Path, rounds: int = 3) -> tuple[int, RecordingFetch]:
    store = FilesystemObjectStore(tmp_path / "objects")
    async with httpx.AsyncClient(timeout=2.0) as http:
        lite.fetch = RecordingFetch(http, store)  # type: ignore[assignment]  # the test swaps in a recording or failing double
        attempt = await lite.task_with_attempt(provider="runway")
        lite.fake.script_submit(lite.fake.accepted("job-v"))
        engine = lite.engine()
        await engine.run_until_idle()
        for _ in range(rounds):
            lite.clock.advance(120)
            await engine.run_until_idle()
    return attempt.task_id, lite.fetch  # type: ignore[return-value]  # lite.fetch is the RecordingFetch set above


async def test_flagged_output_is_fetched_through_the_adapter_stored_and_probed(
    lite: Harness, tmp_path: Path
) -> None:
    """The adapter's stream is the byte source: the MP4 is checked, probed and stored, the flag
    is kept on the job's output locator, and the adapter got the job, URI and size cap."""
    lite.fake.set_job("job-v", _done())
    lite.fake.set_output(GEMINI_FILE, CLIP, chunk_size=64 * 1024)
    task_id, fetch = await _run(lite, tmp_path)

    detail = await lite.detail(task_id)
    assert detail.task.state is TaskState.SUCCEEDED, detail.task
    asset = detail.task.output_asset
    assert asset is not None
    assert asset["size_bytes"] == len(CLIP)
    assert (asset["width"], asset["height"], asset["codec"]) == (160, 90, "h264")
    assert abs(asset["duration_ms"] - 4000) <= 42
    stored = tmp_path / "objects" / asset["key"]
    assert stored.read_bytes() == CLIP
    [(job, uri, max_bytes)] = lite.fake.fetch_output_calls
    assert (job.provider_job_id, job.model, uri) == ("job-v", "gen4.5", GEMINI_FILE)
    assert max_bytes == lite.config.max_output_bytes
    assert fetch.calls[0].source is not None
    snap = await lite.reads.snapshot(detail.attempts[0].id)
    assert snap is not None
    assert snap[1] is not None
    locator = snap[1].output_locator
    assert locator is not None
    assert locator["outputs"][0]["fetch_through_adapter"] is True


async def test_unflagged_output_is_still_fetched_directly(lite: Harness, tmp_path: Path) -> None:
    """Without the flag the adapter is not asked; the (unresolvable) URL is fetched directly."""
    lite.fake.set_job("job-v", _done(through_adapter=False))
    lite.fake.set_output(GEMINI_FILE, CLIP)
    task_id, fetch = await _run(lite, tmp_path, rounds=1)
    assert lite.fake.fetch_output_calls == []
    assert fetch.calls
    assert fetch.calls[0].source is None
    assert (await lite.detail(task_id)).task.state is TaskState.OUTPUT_FETCHING  # retrying


async def test_expired_through_the_adapter_refreshes_the_job(lite: Harness, tmp_path: Path) -> None:
    """The adapter's OUTPUT_EXPIRED re-queries the job (never resubmits); the fresh URI then
    streams and is stored."""
    fresh = GEMINI_FILE.replace("f1", "f2")
    lite.fake.set_job("job-v", _done(), _done(fresh))
    lite.fake.set_output(
        GEMINI_FILE,
        [OutputChunk(error=make_error(ErrorClass.OUTPUT_EXPIRED, "OUTPUT_EXPIRED", "HTTP 404"))],
    )
    lite.fake.set_output(fresh, CLIP)
    task_id, _ = await _run(lite, tmp_path)
    assert (await lite.detail(task_id)).task.state is TaskState.SUCCEEDED
    assert [c[1] for c in lite.fake.fetch_output_calls] == [GEMINI_FILE, fresh]
    assert len(lite.fake.submit_calls) == 1


async def test_stream_broken_midway_is_retried(lite: Harness, tmp_path: Path) -> None:
    """A TRANSIENT_NETWORK error after some chunks is a transient fetch error: fetched again."""
    broken = [
        OutputChunk(CLIP[:1000], "video/mp4", len(CLIP)),
        OutputChunk(error=make_error(ErrorClass.TRANSIENT_NETWORK, "TRANSPORT", "reset")),
    ]
    lite.fake.set_job("job-v", _done())
    lite.fake.set_output(GEMINI_FILE, broken)
    task_id, _ = await _run(lite, tmp_path, rounds=1)
    assert (await lite.detail(task_id)).task.state is TaskState.OUTPUT_FETCHING
    lite.fake.set_output(GEMINI_FILE, CLIP)
    await _more(lite, rounds=3)
    assert (await lite.detail(task_id)).task.state is TaskState.SUCCEEDED
    assert len(lite.fake.fetch_output_calls) == 2


async def test_html_through_the_adapter_is_invalid(lite: Harness, tmp_path: Path) -> None:
    """The same checks apply to the adapter's bytes: an HTML page fails OUTPUT_INVALID."""
    lite.fake.set_job("job-v", _done())
    lite.fake.set_output(GEMINI_FILE, b"<html>quota</html>", content_type="text/html")
    task_id, _ = await _run(lite, tmp_path)
    detail = await lite.detail(task_id)
    assert detail.task.state is TaskState.FAILED
    assert detail.task.failure is not None
    assert detail.task.failure.code == "OUTPUT_INVALID_MIME_TYPE"


async def _more(lite: Harness, rounds: int) -> None:
    engine = lite.engines[-1]
    for _ in range(rounds):
        lite.clock.advance(120)
        await engine.run_until_idle()


async def test_gs_output_through_the_adapter_is_stored(lite: Harness, tmp_path: Path) -> None:
    """A flagged ``gs://`` locator (Veo on Vertex AI) is a usable source: the adapter streams
    it and the MP4 is stored; the locator's scheme is the adapter's business."""
    gcs = "gs://vidroute-out/runs/op1/sample_0.mp4"
    lite.fake.set_job("job-v", _done(gcs))
    lite.fake.set_output(gcs, CLIP)
    task_id, _ = await _run(lite, tmp_path)
    detail = await lite.detail(task_id)
    assert detail.task.state is TaskState.SUCCEEDED, detail.task
    assert [c[1] for c in lite.fake.fetch_output_calls] == [gcs]


async def test_unflagged_gs_output_is_an_unusable_locator(lite: Harness, tmp_path: Path) -> None:
    """Without the flag a ``gs://`` locator cannot be fetched by us: OUTPUT_EXPIRED as an
    unusable locator, and the adapter is never asked."""
    gcs = "gs://vidroute-out/runs/op1/sample_0.mp4"
    lite.fake.set_job("job-v", _done(gcs, through_adapter=False))
    task_id, _ = await _run(lite, tmp_path)
    detail = await lite.detail(task_id)
    assert lite.fake.fetch_output_calls == []
    assert detail.task.failure is not None
    assert "http(s)" in detail.task.failure.message
