"""Downloads of stored outputs: chunk checks (place, size, SHA-256) and the verified file."""

from __future__ import annotations

import contextlib
import hashlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO

import grpc

from clients.sdk import errors
from vidroute.scheduler.v1 import scheduler_pb2 as pb
from vidroute.scheduler.v1 import scheduler_service_pb2 as api


class OutputCheck:
    """Running size and SHA-256 of a download, checked against its StoredOutput at the end."""

    def __init__(self, task_id: str) -> None:
        self.task_id = task_id
        self.expected: pb.StoredOutput | None = None
        self.offset = 0
        self._sha = hashlib.sha256()

    def chunk(self, reply: api.GetOutputResponse) -> bytes:
        """Check one chunk's place (and the output's identity on a resumed stream)."""
        if reply.HasField("output"):
            if self.expected is not None and (
                reply.output.checksum_sha256 != self.expected.checksum_sha256
            ):
                raise self._error("the stored output changed while it was being downloaded")
            self.expected = reply.output
        if reply.offset != self.offset:
            raise self._error(f"chunk at offset {reply.offset}, expected {self.offset}")
        self.offset += len(reply.data)
        self._sha.update(reply.data)
        return reply.data

    def finish(self) -> int:
        """The size downloaded, once it matches the output's size and checksum."""
        if self.expected is None:
            raise self._error("the stream carried no output metadata")
        if self.offset != self.expected.size_bytes:
            raise self._error(f"{self.offset} bytes downloaded, {self.expected.size_bytes} stored")
        digest = self._sha.hexdigest()
        if self.expected.checksum_sha256 and digest != self.expected.checksum_sha256.lower():
            raise self._error(f"sha256 {digest} downloaded, {self.expected.checksum_sha256} stored")
        return self.offset

    def _error(self, what: str) -> errors.DataLoss:
        return errors.DataLoss(grpc.StatusCode.DATA_LOSS, f"output of task {self.task_id}: {what}")


def output_request(task_id: str, sample_index: int, offset: int) -> api.GetOutputRequest:
    return api.GetOutputRequest(task_id=task_id, sample_index=sample_index, offset=offset)


@contextlib.contextmanager
def verified_file(dest: str | os.PathLike[str]) -> Iterator[IO[bytes]]:
    """A temporary file beside `dest` that becomes `dest` only if the block completes (the
    download verified); on any error nothing is left behind."""
    path = Path(dest)
    fd, part = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".part", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            yield fh
        os.replace(part, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(part)
