"""Audio "stripped on delivery" really strips (9.7 LOSSLESS): real MP4s over a real HTTP server.

Veo 3 on the Gemini API always renders audio; a silent request compiles to a LOSSLESS strip, and
delivery must store a file without any audio track, the video stream copied bit for bit.
"""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime
from pathlib import Path

import av
import httpx
import pytest

from controlplane.execution.output_fetch import (
    ExpectedMedia,
    FetchRequest,
    StoredAsset,
    fetch_output,
)
from controlplane.execution.remux import strip_audio
from controlplane.storage import FilesystemObjectStore
from tests.integration.execution.exec_harness import Harness
from tests.integration.execution.file_server import FileServer
from tests.integration.execution.media_files import render_mp4
from vidroute_core.adapter import JobOutput, JobSnapshot, JobState

pytestmark = pytest.mark.timeout(30)

SILENT_ASK = ExpectedMedia(duration_ms=1500, width=1280, height=720, with_audio=False)
WITH_AUDIO = render_mp4(1.5, with_audio=True)


def request(url: str, *, strip_audio: bool) -> FetchRequest:
    return FetchRequest(
        task_id="task-1",
        attempt_id="attempt-1",
        source_uri=url,
        expected=SILENT_ASK,
        max_bytes=10 * 1024 * 1024,
        strip_audio=strip_audio,
    )


def streams(path: Path) -> tuple[int, int, list[str]]:
    """(video streams, audio streams, SHA-256 of every video packet) of an MP4 file."""
    with av.open(str(path)) as container:
        video = container.streams.video[0]
        digests = [hashlib.sha256(bytes(p)).hexdigest() for p in container.demux(video) if p.size]
        return len(container.streams.video), len(container.streams.audio), digests


async def test_audio_is_stripped_without_reencoding_the_video(
    file_server: FileServer,
    http: httpx.AsyncClient,
    fs_store: FilesystemObjectStore,
    tmp_path: Path,
) -> None:
    """With strip_audio the stored file has no audio track and the very same video packets."""
    source = tmp_path / "source.mp4"
    source.write_bytes(WITH_AUDIO)
    assert streams(source)[1] == 1  # the provider's file really has audio

    url = file_server.serve("/out/veo.mp4", WITH_AUDIO)
    result = await fetch_output(http, fs_store, request(url, strip_audio=True))

    assert isinstance(result, StoredAsset), result
    assert (result.has_audio, result.audio_stripped) == (False, True)
    stored = tmp_path / "stored.mp4"
    stored.write_bytes(await fs_store.get(result.key))
    n_video, n_audio, packets = streams(stored)
    assert (n_video, n_audio) == (1, 0)
    assert packets == streams(source)[2]  # copied, not re-encoded
    assert result.checksum_sha256 == hashlib.sha256(stored.read_bytes()).hexdigest()
    assert result.size_bytes == stored.stat().st_size < len(WITH_AUDIO)
    assert abs(result.duration_ms - 1500) <= 42


async def test_without_strip_audio_the_track_is_kept(
    file_server: FileServer, http: httpx.AsyncClient, fs_store: FilesystemObjectStore
) -> None:
    """strip_audio off stores the provider's bytes untouched, audio included."""
    url = file_server.serve("/out/keep.mp4", WITH_AUDIO)
    result = await fetch_output(http, fs_store, request(url, strip_audio=False))
    assert isinstance(result, StoredAsset), result
    assert (result.has_audio, result.audio_stripped) == (True, False)
    assert await fs_store.get(result.key) == WITH_AUDIO


async def test_a_silent_file_is_stored_as_it_came(
    file_server: FileServer, http: httpx.AsyncClient, fs_store: FilesystemObjectStore
) -> None:
    """Nothing to strip: the silent provider file is stored byte for byte."""
    silent = render_mp4(1.5)
    url = file_server.serve("/out/silent.mp4", silent)
    result = await fetch_output(http, fs_store, request(url, strip_audio=True))
    assert isinstance(result, StoredAsset), result
    assert result.audio_stripped is False
    assert await fs_store.get(result.key) == silent


async def test_delivery_asks_for_stripping_when_the_task_wants_no_audio(lite: Harness) -> None:
    """The output step requests strip_audio for a task whose spec asks for no audio."""
    attempt = await lite.task_with_attempt()
    lite.fake.script_submit(lite.fake.accepted("job-s"))
    output = JobOutput(
        "https://cdn.example/out.mp4", "video/mp4", datetime(2026, 6, 26, tzinfo=UTC)
    )
    lite.fake.set_job("job-s", JobSnapshot(JobState.SUCCEEDED, "SUCCEEDED", outputs=(output,)))
    engine = lite.engine()
    await engine.run_until_idle()
    lite.clock.advance(30)
    await engine.run_until_idle()
    spec = (await lite.detail(attempt.task_id)).task.spec
    assert spec.output.with_audio is False
    assert [c.strip_audio for c in lite.fetch.calls] == [True]


def test_a_file_that_cannot_be_remuxed_is_reported_not_stored(tmp_path: Path) -> None:
    """strip_audio names the problem for bytes it cannot remux, instead of writing a file."""
    broken = tmp_path / "broken.mp4"
    broken.write_bytes(WITH_AUDIO[: len(WITH_AUDIO) // 3])  # the index box (moov) is gone
    problem = strip_audio(broken, tmp_path / "silent.mp4")
    assert problem is not None
    assert "stripping the audio track failed" in problem
