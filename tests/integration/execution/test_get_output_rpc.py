"""Outputs for other services: every sample of a job stored, then read back over gRPC.

The execution engine runs with the real `fetch_output` (checks, PyAV probe) into a real object
store (a filesystem directory, or S3 on a moto server); the fake adapter reports a job with two
outputs, served over HTTP by the test's file server. A real control plane gRPC server (auth on,
two tenants) then answers GetTask, GetOutput (ranges, resume) and GetOutputUrl.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import grpc
import httpx
import pytest
from google.rpc import error_details_pb2, status_pb2

from controlplane.api.auth import Authenticator, hash_token, new_token, parse_entries
from controlplane.api.servicer import SchedulerServicer
from controlplane.domain.states import TaskState
from controlplane.execution.output_step import fetcher_for
from controlplane.server import ControlPlaneServer, start_server
from controlplane.service.outputs import OutputService
from controlplane.service.tasks import TaskService
from controlplane.storage import FilesystemObjectStore, ObjectStore, S3ObjectStore
from tests.integration.execution.exec_harness import Harness
from tests.integration.execution.file_server import FileServer
from tests.integration.execution.media_files import render_mp4
from tests.integration.storage.moto_s3 import REGION, MotoS3
from vidroute.scheduler.v1 import scheduler_service_pb2 as api
from vidroute.scheduler.v1 import scheduler_service_pb2_grpc
from vidroute_core.adapter import JobOutput, JobSnapshot, JobState

pytestmark = pytest.mark.timeout(60)
# Two different videos of what the harness's task asks (4 s, 16:9).
CLIPS = (render_mp4(4.0), render_mp4(4.0, colour=(200, 40, 40)))
CHUNK = 512  # the clips are a few KiB: small chunks make every read several messages


@dataclass
class Stack:
    task_id: str
    stub: scheduler_service_pb2_grpc.SchedulerServiceAsyncStub  # the .pyi's name, typing only
    tokens: dict[str, str]
    lite: Harness
    store: ObjectStore

    def md(self, who: str = "owner") -> tuple[tuple[str, str], ...]:
        return (("authorization", f"Bearer {self.tokens[who]}"),)

    async def read(
        self, *, sample: int = 0, offset: int = 0, limit: int = 0
    ) -> list[api.GetOutputResponse]:
        request = api.GetOutputRequest(
            task_id=self.task_id, sample_index=sample, offset=offset, limit=limit
        )
        return [m async for m in self.stub.GetOutput(request, metadata=self.md())]


async def _deliver(lite: Harness, file_server: FileServer, store: ObjectStore) -> int:
    """A task whose adopted job reported two outputs, run until its outputs are stored."""
    uris = [file_server.serve(f"/out/sample_{i}.mp4", clip) for i, clip in enumerate(CLIPS)]
    outputs = tuple(JobOutput(uri, "video/mp4") for uri in uris)
    lite.fake.set_job("job-2", JobSnapshot(JobState.SUCCEEDED, "DONE", "{}", 1.0, outputs))
    async with httpx.AsyncClient(timeout=5.0) as http:
        lite.fetch = fetcher_for(http, store)  # type: ignore[assignment]  # the test swaps in a recording or failing double
        attempt = await lite.task_with_attempt(provider="runway")
        lite.fake.script_submit(lite.fake.accepted("job-2"))
        engine = lite.engine()
        await engine.run_until_idle()
        for _ in range(3):
            lite.clock.advance(120)
            await engine.run_until_idle()
    assert (await lite.detail(attempt.task_id)).task.state is TaskState.SUCCEEDED
    return attempt.task_id


async def _serve(lite: Harness, store: ObjectStore, task_id: int) -> AsyncIterator[Stack]:
    tokens = {"owner": new_token(), "other": new_token()}
    entries = parse_entries(
        [
            f"{hash_token(tokens['owner'])}=tenant:tenant-a",
            f"{hash_token(tokens['other'])}=tenant:tenant-b",
        ]
    )
    tasks = TaskService(lite.db)

    async def probe() -> bool:
        return True

    running: ControlPlaneServer = await start_server(
        SchedulerServicer(tasks, outputs=OutputService(tasks, store, chunk_size=CHUNK)),
        listen="127.0.0.1:0",
        probe=probe,
        auth=Authenticator(entries),
    )
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{running.port}") as channel:
            stub = scheduler_service_pb2_grpc.SchedulerServiceStub(channel)
            yield Stack(str(task_id), stub, tokens, lite, store)
    finally:
        await running.stop(grace=1)


@pytest.fixture
async def on_disk(lite: Harness, file_server: FileServer, tmp_path: Path) -> AsyncIterator[Stack]:
    """Two samples delivered into a filesystem store, served over gRPC."""
    store = FilesystemObjectStore(tmp_path / "objects")
    task_id = await _deliver(lite, file_server, store)
    async for stack in _serve(lite, store, task_id):
        yield stack


@pytest.fixture
async def on_s3(lite: Harness, file_server: FileServer, moto_s3: MotoS3) -> AsyncIterator[Stack]:
    """Two samples delivered into an S3 bucket (moto), served over gRPC."""
    store = S3ObjectStore(
        moto_s3.create_bucket(),
        prefix="platform",
        endpoint_url=moto_s3.endpoint,
        region=REGION,
        session=moto_s3.session,
    )
    task_id = await _deliver(lite, file_server, store)
    async for stack in _serve(lite, store, task_id):
        yield stack


def _details(exc: grpc.aio.AioRpcError) -> status_pb2.Status:
    for key, value in exc.trailing_metadata() or ():
        if key == "grpc-status-details-bin":
            return status_pb2.Status.FromString(value)
    raise AssertionError(f"no status details on {exc.code()}: {exc.details()}")


def _violations(exc: grpc.aio.AioRpcError) -> dict[str, str]:
    assert exc.code() is grpc.StatusCode.INVALID_ARGUMENT, exc
    for detail in _details(exc).details:
        if detail.Is(error_details_pb2.BadRequest.DESCRIPTOR):
            bad = error_details_pb2.BadRequest()
            detail.Unpack(bad)
            return {v.field: v.description for v in bad.field_violations}
    raise AssertionError("no BadRequest")


def _error_info(exc: grpc.aio.AioRpcError) -> error_details_pb2.ErrorInfo:
    for detail in _details(exc).details:
        if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
            info = error_details_pb2.ErrorInfo()
            detail.Unpack(info)
            return info
    raise AssertionError("no ErrorInfo")


async def _every_sample_is_stored_with_its_own_key_checksum_and_probe(on_disk: Stack) -> None:
    """Both outputs of the job are stored under their own keys, each with its own checksum and
    probe, and listed in Task.outputs in sample order; Task.output is the first."""
    task = (
        await on_disk.stub.GetTask(
            api.GetTaskRequest(task_id=on_disk.task_id), metadata=on_disk.md()
        )
    ).task
    assert [o.sample_index for o in task.outputs] == [0, 1]
    assert task.output == task.outputs[0]
    assert len({o.uri for o in task.outputs}) == 2
    for output, clip in zip(task.outputs, CLIPS, strict=True):
        assert output.checksum_sha256 == hashlib.sha256(clip).hexdigest()
        assert output.size_bytes == len(clip)
        assert (output.width, output.height, output.mime_type) == (160, 90, "video/mp4")
        assert abs(output.duration_ms - 4000) <= 42
        stored = Path(output.uri.removeprefix("file://"))
        assert await asyncio.to_thread(stored.read_bytes) == clip


async def _get_output_streams_each_sample_exactly(on_disk: Stack) -> None:
    """GetOutput of each sample returns its stored bytes exactly, in order and in chunks of at
    most the chunk size; only the first message carries the StoredOutput."""
    for index, clip in enumerate(CLIPS):
        messages = await on_disk.read(sample=index)
        assert b"".join(m.data for m in messages) == clip
        assert messages[0].output.sample_index == index
        assert messages[0].output.checksum_sha256 == hashlib.sha256(clip).hexdigest()
        assert all(not m.HasField("output") for m in messages[1:])
        offsets = [m.offset for m in messages]
        assert offsets == [sum(len(m.data) for m in messages[:i]) for i in range(len(messages))]
        assert all(0 < len(m.data) <= CHUNK for m in messages)
        assert len(messages) == -(-len(clip) // CHUNK)


async def _ranges_and_resume_give_the_stored_bytes(on_disk: Stack) -> None:
    """offset/limit read exactly that range; a reader resuming from what it has rebuilds the
    file; offset == size is an empty read carrying the metadata."""
    clip = CLIPS[1]
    ranged = await on_disk.read(sample=1, offset=700, limit=1500)
    assert b"".join(m.data for m in ranged) == clip[700:2200]
    assert [m.offset for m in ranged] == [700, 1212, 1724]
    half = len(clip) // 2
    first = b"".join(m.data for m in await on_disk.read(sample=1, limit=half))
    rest = b"".join(m.data for m in await on_disk.read(sample=1, offset=len(first)))
    assert first + rest == clip
    [end] = await on_disk.read(sample=1, offset=len(clip))
    assert (end.offset, end.data, end.output.size_bytes) == (len(clip), b"", len(clip))
    past = await on_disk.read(sample=1, offset=len(clip) - 10, limit=len(clip))
    assert b"".join(m.data for m in past) == clip[-10:]
    for offset in range(0, len(clip) + 1, 331):  # a sweep across chunk boundaries
        for limit in (0, 1, CHUNK - 1, CHUNK, CHUNK + 1):
            messages = await on_disk.read(sample=1, offset=offset, limit=limit)
            stop = offset + limit if limit else None
            assert b"".join(m.data for m in messages) == clip[offset:stop], (offset, limit)
            assert messages[0].offset == offset


async def _bad_sample_offset_and_limit_are_invalid_argument(on_disk: Stack) -> None:
    """A sample the task does not have, a negative or past-the-end offset and a negative limit
    are INVALID_ARGUMENT naming the field, the sample count or the size."""
    with pytest.raises(grpc.aio.AioRpcError) as sample:
        await on_disk.read(sample=2)
    assert "2 stored sample(s)" in _violations(sample.value)["sample_index"]
    with pytest.raises(grpc.aio.AioRpcError) as past:
        await on_disk.read(offset=len(CLIPS[0]) + 1)
    assert f"is {len(CLIPS[0])} bytes" in _violations(past.value)["offset"]
    with pytest.raises(grpc.aio.AioRpcError) as negative:
        await on_disk.read(offset=-1, limit=-5)
    assert set(_violations(negative.value)) == {"offset", "limit"}


async def _another_tenants_task_is_not_found(on_disk: Stack) -> None:
    """Another tenant's GetOutput and GetOutputUrl are NOT_FOUND, worded as for a missing id."""
    request = api.GetOutputRequest(task_id=on_disk.task_id)
    with pytest.raises(grpc.aio.AioRpcError) as info:
        [m async for m in on_disk.stub.GetOutput(request, metadata=on_disk.md("other"))]
    assert info.value.code() is grpc.StatusCode.NOT_FOUND
    assert info.value.details() == f"task '{on_disk.task_id}' not found"
    with pytest.raises(grpc.aio.AioRpcError) as url:
        await on_disk.stub.GetOutputUrl(
            api.GetOutputUrlRequest(task_id=on_disk.task_id), metadata=on_disk.md("other")
        )
    assert url.value.code() is grpc.StatusCode.NOT_FOUND


async def _a_task_not_succeeded_is_failed_precondition(on_disk: Stack) -> None:
    """GetOutput of a task not yet SUCCEEDED is FAILED_PRECONDITION, its state in ErrorInfo."""
    attempt = await on_disk.lite.task_with_attempt(provider="runway")
    state = (await on_disk.lite.detail(attempt.task_id)).task.state
    assert state is not TaskState.SUCCEEDED
    request = api.GetOutputRequest(task_id=str(attempt.task_id))
    with pytest.raises(grpc.aio.AioRpcError) as info:
        [m async for m in on_disk.stub.GetOutput(request, metadata=on_disk.md())]
    assert info.value.code() is grpc.StatusCode.FAILED_PRECONDITION
    error = _error_info(info.value)
    assert error.reason == "TASK_NOT_SUCCEEDED"
    assert error.metadata["state"] == state.value


async def _filesystem_store_cannot_presign(on_disk: Stack) -> None:
    """GetOutputUrl with the filesystem store is FAILED_PRECONDITION STORE_CANNOT_PRESIGN."""
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await on_disk.stub.GetOutputUrl(
            api.GetOutputUrlRequest(task_id=on_disk.task_id), metadata=on_disk.md()
        )
    assert info.value.code() is grpc.StatusCode.FAILED_PRECONDITION
    assert _error_info(info.value).reason == "STORE_CANNOT_PRESIGN"
    assert "GetOutput" in (info.value.details() or "")


# Each scenario delivers two samples through the engine first (~1.5 s), so the read-only
# checks above share one delivery per group; each helper's docstring names what it proves.


async def test_every_sample_stored_listed_and_streamed_exactly(on_disk: Stack) -> None:
    """Every sample of the job is stored with its own key, checksum and probe, listed in
    Task.outputs, and GetOutput streams each one's bytes exactly."""
    await _every_sample_is_stored_with_its_own_key_checksum_and_probe(on_disk)
    await _get_output_streams_each_sample_exactly(on_disk)


async def test_ranges_resume_and_bad_arguments(on_disk: Stack) -> None:
    """Ranges and resume give the stored bytes; a bad sample, offset or limit is
    INVALID_ARGUMENT."""
    await _ranges_and_resume_give_the_stored_bytes(on_disk)
    await _bad_sample_offset_and_limit_are_invalid_argument(on_disk)


async def test_refusals_not_found_not_succeeded_cannot_presign(on_disk: Stack) -> None:
    """Another tenant's task is NOT_FOUND, a task not SUCCEEDED is FAILED_PRECONDITION with its
    state, and the filesystem store's GetOutputUrl is FAILED_PRECONDITION STORE_CANNOT_PRESIGN."""
    await _another_tenants_task_is_not_found(on_disk)
    await _a_task_not_succeeded_is_failed_precondition(on_disk)
    await _filesystem_store_cannot_presign(on_disk)


async def test_s3_get_output_and_presigned_url_return_the_bytes(on_s3: Stack) -> None:
    """With the S3 store, GetOutput streams each sample from the bucket (ranged GETs) and
    GetOutputUrl's URL, fetched with plain httpx and no credentials, returns the same bytes.
    Its lifetime is the asked one (else the configured default) both in the signature
    (X-Amz-Expires, which S3 enforces) and in expires_at; moto does not enforce X-Amz-Expires,
    so a refused GET after expiry cannot be shown here. An object gone from the store is
    FAILED_PRECONDITION OUTPUT_OBJECT_MISSING for both RPCs."""
    resumed = b"".join(m.data for m in await on_s3.read(sample=1, limit=1000))
    resumed += b"".join(m.data for m in await on_s3.read(sample=1, offset=1000))
    assert resumed == CLIPS[1]
    before = datetime.now(UTC)
    found = await on_s3.stub.GetOutputUrl(
        api.GetOutputUrlRequest(task_id=on_s3.task_id, sample_index=1, expires_in_s=120),
        metadata=on_s3.md(),
    )
    assert found.output.sample_index == 1
    assert found.output.checksum_sha256 == hashlib.sha256(CLIPS[1]).hexdigest()
    query = parse_qs(urlsplit(found.url).query)
    assert query["X-Amz-Expires"] == ["120"]
    signed_at = datetime.strptime(query["X-Amz-Date"][0], "%Y%m%dT%H%M%SZ").replace(tzinfo=UTC)
    expires_at = found.expires_at.ToDatetime(tzinfo=UTC)
    # The window S3 enforces (signed time + X-Amz-Expires) ends when expires_at says it does.
    assert abs((signed_at + timedelta(seconds=120) - expires_at).total_seconds()) <= 2
    assert 119 <= (expires_at - before).total_seconds() <= 125
    async with httpx.AsyncClient() as http:
        response = await http.get(found.url)
    assert response.status_code == 200
    assert response.content == CLIPS[1]
    default = await on_s3.stub.GetOutputUrl(
        api.GetOutputUrlRequest(task_id=on_s3.task_id), metadata=on_s3.md()
    )
    assert "X-Amz-Expires=3600" in default.url
    with pytest.raises(grpc.aio.AioRpcError) as too_long:
        await on_s3.stub.GetOutputUrl(
            api.GetOutputUrlRequest(task_id=on_s3.task_id, expires_in_s=7 * 24 * 3600 + 1),
            metadata=on_s3.md(),
        )
    assert "expires_in_s" in _violations(too_long.value)
    # The object vanishes from the store (emptied, or another store configured): refused.
    asset = (await on_s3.lite.detail(int(on_s3.task_id))).task.output_asset
    assert asset is not None
    await on_s3.store.delete(asset["samples"][1]["key"])
    with pytest.raises(grpc.aio.AioRpcError) as no_url:
        await on_s3.stub.GetOutputUrl(
            api.GetOutputUrlRequest(task_id=on_s3.task_id, sample_index=1), metadata=on_s3.md()
        )
    with pytest.raises(grpc.aio.AioRpcError) as no_bytes:
        await on_s3.read(sample=1)
    for missing in (no_url.value, no_bytes.value):
        assert missing.code() is grpc.StatusCode.FAILED_PRECONDITION
        assert _error_info(missing).reason == "OUTPUT_OBJECT_MISSING"


async def _rounds(lite: Harness, rounds: int) -> None:
    engine = lite.engines[-1]
    await engine.run_until_idle()
    for _ in range(rounds):
        lite.clock.advance(120)
        await engine.run_until_idle()


async def test_a_sample_failing_transiently_is_fetched_again_with_the_others(
    lite: Harness, file_server: FileServer, tmp_path: Path
) -> None:
    """While the second sample answers 503 the task stays OUTPUT_FETCHING with nothing recorded;
    once it answers, both samples are stored (the first fetched again, same key)."""
    first = file_server.serve("/out/a.mp4", CLIPS[0])
    second = file_server.serve("/out/b.mp4", b"busy", status=503, content_type="text/plain")
    outputs = (JobOutput(first, "video/mp4"), JobOutput(second, "video/mp4"))
    lite.fake.set_job("job-3", JobSnapshot(JobState.SUCCEEDED, "DONE", "{}", 1.0, outputs))
    attempt = await lite.task_with_attempt(provider="runway")
    lite.fake.script_submit(lite.fake.accepted("job-3"))
    async with httpx.AsyncClient(timeout=5.0) as http:
        lite.fetch = fetcher_for(http, FilesystemObjectStore(tmp_path / "objects"))  # type: ignore[assignment]  # the test swaps in a recording or failing double
        lite.engine()
        await _rounds(lite, 1)
        waiting = (await lite.detail(attempt.task_id)).task
        assert (waiting.state, waiting.output_asset) == (TaskState.OUTPUT_FETCHING, None)
        file_server.serve("/out/b.mp4", CLIPS[1])
        await _rounds(lite, 3)
    task = (await lite.detail(attempt.task_id)).task
    assert task.state is TaskState.SUCCEEDED
    assert task.output_asset is not None
    samples = task.output_asset["samples"]
    assert [s["checksum_sha256"] for s in samples] == [hashlib.sha256(c).hexdigest() for c in CLIPS]
    assert file_server.hits.count("/out/a.mp4?X-Signature=secret") == 2


async def test_one_invalid_sample_fails_the_task(
    lite: Harness, file_server: FileServer, tmp_path: Path
) -> None:
    """An HTML page as the second sample fails the task OUTPUT_INVALID_MIME_TYPE: a delivery is
    every sample or none."""
    first = file_server.serve("/out/a.mp4", CLIPS[0])
    second = file_server.serve("/out/b.mp4", b"<html>quota</html>", content_type="text/html")
    outputs = (JobOutput(first, "video/mp4"), JobOutput(second, "video/mp4"))
    lite.fake.set_job("job-4", JobSnapshot(JobState.SUCCEEDED, "DONE", "{}", 1.0, outputs))
    attempt = await lite.task_with_attempt(provider="runway")
    lite.fake.script_submit(lite.fake.accepted("job-4"))
    async with httpx.AsyncClient(timeout=5.0) as http:
        lite.fetch = fetcher_for(http, FilesystemObjectStore(tmp_path / "objects"))  # type: ignore[assignment]  # the test swaps in a recording or failing double
        lite.engine()
        await _rounds(lite, 3)
    task = (await lite.detail(attempt.task_id)).task
    assert task.state is TaskState.FAILED
    assert task.failure is not None
    assert task.failure.code == "OUTPUT_INVALID_MIME_TYPE"
    assert task.output_asset is None
