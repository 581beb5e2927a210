"""`download_output` against a test-side GetOutput (chunked, ranged, as the proto specifies) that
drops its stream part-way: the download resumes at the offset it reached, and a result that does
not match the stored size or SHA-256 is DataLoss with nothing left at the destination path.
"""

from __future__ import annotations

import hashlib
import io
import os
import threading
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import pytest

from clients.sdk import AsyncClient, Client, errors
from vidroute.scheduler.v1 import scheduler_pb2 as pb
from vidroute.scheduler.v1 import scheduler_service_pb2 as api
from vidroute.scheduler.v1 import scheduler_service_pb2_grpc as api_grpc

CHUNK = 1000


class Outputs(api_grpc.SchedulerServiceServicer):
    """GetOutput over `content`; the first `drops` streams end UNAVAILABLE after two chunks."""

    def __init__(self, content: bytes, checksum: str | None = None) -> None:
        self.content = content
        self.checksum = checksum or hashlib.sha256(content).hexdigest()
        self.drops = 0
        self.offsets: list[int] = []
        self._lock = threading.Lock()

    def GetOutput(self, request: api.GetOutputRequest, context: Any) -> Iterator[Any]:
        with self._lock:
            self.offsets.append(request.offset)
            drop = len(self.offsets) <= self.drops
        end = len(self.content) if not request.limit else request.offset + request.limit
        stored = pb.StoredOutput(
            uri="s3://bucket/out.mp4",
            sample_index=request.sample_index,
            size_bytes=len(self.content),
            checksum_sha256=self.checksum,
        )
        for n, start in enumerate(range(request.offset, end, CHUNK)):
            if drop and n == 2:
                context.abort(grpc.StatusCode.UNAVAILABLE, "connection reset")
            reply = api.GetOutputResponse(
                offset=start, data=self.content[start : min(start + CHUNK, end)]
            )
            if n == 0:
                reply.output.CopyFrom(stored)
            yield reply


def _serve(servicer: Outputs) -> Iterator[str]:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    api_grpc.add_SchedulerServiceServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        server.stop(grace=None)


CONTENT = os.urandom(5 * CHUNK + 123)


@pytest.fixture
def outputs() -> Iterator[tuple[Outputs, str]]:
    servicer = Outputs(CONTENT)  # type: ignore[abstract]  # only GetOutput is served
    for target in _serve(servicer):
        yield servicer, target


def test_download_resumes_at_its_offset_after_a_dropped_stream(
    outputs: tuple[Outputs, str], tmp_path: Path
) -> None:
    """Two streams drop after two chunks each: the download reopens at 2,000 then 4,000 bytes
    and the file holds exactly the stored bytes."""
    servicer, target = outputs
    servicer.drops = 2
    dest = tmp_path / "out.mp4"
    with Client(target, token="") as client:
        assert client.download_output("7", dest) == len(CONTENT)
    assert dest.read_bytes() == CONTENT
    assert servicer.offsets == [0, 2 * CHUNK, 4 * CHUNK]
    assert list(tmp_path.iterdir()) == [dest]  # no partial file left beside it


async def test_async_download_resumes_into_a_file_object(outputs: tuple[Outputs, str]) -> None:
    """The asyncio client resumes the same way, writing to a binary file object."""
    servicer, target = outputs
    servicer.drops = 1
    sink = io.BytesIO()
    async with AsyncClient(target, token="") as client:
        assert await client.download_output("7", sink, sample_index=1) == len(CONTENT)
    assert sink.getvalue() == CONTENT
    assert servicer.offsets == [0, 2 * CHUNK]


def test_a_checksum_mismatch_is_data_loss_and_leaves_no_file(tmp_path: Path) -> None:
    """Bytes whose SHA-256 is not the stored one raise DataLoss; the destination is not made."""
    servicer = Outputs(CONTENT, checksum="0" * 64)  # type: ignore[abstract]  # a partial servicer: only the RPC under test
    dest = tmp_path / "out.mp4"
    for target in _serve(servicer):
        with Client(target, token="") as client, pytest.raises(errors.DataLoss) as err:
            client.download_output("7", dest)
    assert "sha256" in str(err.value)
    assert list(tmp_path.iterdir()) == []
