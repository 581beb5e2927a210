"""Stored outputs for other services (design 9.22): their bytes in ranges, or a presigned URL.

Transport-neutral, like `controlplane.service.tasks`: the task is read with the same tenant
scoping as GetTask (another tenant's task is NotFound, exactly as a missing one), then

- the task must be SUCCEEDED: else FAILED_PRECONDITION, reason ``TASK_NOT_SUCCEEDED``, the state
  in the ErrorInfo metadata (an output exists only once delivery succeeded);
- ``sample_index`` must name a stored sample, ``offset`` must lie within the object
  (``offset == size`` is a valid, empty, resume at the end), ``limit`` must not be negative:
  else INVALID_ARGUMENT with a field violation naming the sample count or the size. Chosen over
  OUT_OF_RANGE because the object never grows: its size is in Task.outputs, so an offset past
  it is a bad request, not a read racing a writer; and one code for every bad field is what
  every other RPC answers.

`read` streams the range from the `ObjectStore` in chunks (256 KiB by default, well under
gRPC's 4 MiB message limit). `presigned_url` asks a `PresigningStore` (S3) for a GET URL valid
for ``expires_in_s`` (0: the configured default; at most 7 days, SigV4's limit); the filesystem
store cannot presign (a ``file://`` path means nothing on another host), which is
FAILED_PRECONDITION ``STORE_CANNOT_PRESIGN``, pointing at GetOutput. An object the task names
but the store lacks (the store was changed or emptied) is FAILED_PRECONDITION
``OUTPUT_OBJECT_MISSING``; a store that fails is UNAVAILABLE.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from controlplane.domain.outputs import stored_samples
from controlplane.domain.states import TaskState
from controlplane.service.access import SYSTEM, Caller
from controlplane.service.tasks import TaskService
from controlplane.storage.base import (
    MAX_PRESIGN_S,
    ObjectNotFoundError,
    ObjectStore,
    PresigningStore,
    StorageError,
)
from vidroute_core.exceptions import InvalidSpec, PreconditionFailed, Unavailable
from vidroute_core.validation import FieldViolation

__all__ = ["DEFAULT_CHUNK", "DEFAULT_URL_TTL_S", "OutputChunk", "OutputService", "OutputUrl"]

DEFAULT_CHUNK = 256 * 1024
DEFAULT_URL_TTL_S = 3600


@dataclass(frozen=True, slots=True)
class OutputChunk:
    """Bytes of the object starting at `offset`."""

    offset: int
    data: bytes


@dataclass(frozen=True, slots=True)
class OutputUrl:
    """A presigned GET URL of one stored sample and when it stops working."""

    url: str
    expires_at: datetime
    sample: dict[str, Any]


def _utcnow() -> datetime:
    return datetime.now(UTC)


class OutputService:
    """Read a SUCCEEDED task's stored samples (see the module docstring for every rule)."""

    def __init__(
        self,
        tasks: TaskService,
        store: ObjectStore,
        *,
        url_ttl_s: int = DEFAULT_URL_TTL_S,
        chunk_size: int = DEFAULT_CHUNK,
        clock: Callable[[], datetime] = _utcnow,
    ) -> None:
        if not 1 <= url_ttl_s <= MAX_PRESIGN_S:
            raise ValueError(f"url_ttl_s must be 1..{MAX_PRESIGN_S}: {url_ttl_s}")
        if chunk_size < 1:
            raise ValueError("chunk_size must be positive")
        self._tasks = tasks
        self._store = store
        self._url_ttl_s = url_ttl_s
        self._chunk = chunk_size
        self._clock = clock

    async def sample(
        self, task_id: int, sample_index: int, caller: Caller = SYSTEM
    ) -> dict[str, Any]:
        """The stored sample, after the scoping, state and index checks."""
        detail = await self._tasks.get_task(task_id, caller)
        task = detail.task
        if task.state is not TaskState.SUCCEEDED:
            raise PreconditionFailed(
                f"task {task_id} is {task.state.value}: outputs exist once it is SUCCEEDED",
                {"status_version": task.status_version},
                reason="TASK_NOT_SUCCEEDED",
                labels={"state": task.state.value},
            )
        samples = stored_samples(task.output_asset)
        if not 0 <= sample_index < len(samples):
            raise InvalidSpec(
                [
                    FieldViolation(
                        "sample_index",
                        f"task {task_id} has {len(samples)} stored sample(s): "
                        f"0..{len(samples) - 1}, not {sample_index}",
                    )
                ]
            )
        return samples[sample_index]

    async def read(
        self,
        task_id: int,
        sample_index: int = 0,
        offset: int = 0,
        limit: int = 0,
        caller: Caller = SYSTEM,
    ) -> tuple[dict[str, Any], AsyncIterator[OutputChunk]]:
        """The sample and its bytes from `offset`, at most `limit` (0: to the end).

        Every check happens here, before the first byte is read; the chunks may still raise
        UNAVAILABLE or OUTPUT_OBJECT_MISSING when the store fails part-way."""
        found = [
            FieldViolation(f, "must not be negative") for f, v in _fields(offset, limit) if v < 0
        ]
        if found:  # before any read: bad input never touches the database
            raise InvalidSpec(found)
        sample = await self.sample(task_id, sample_index, caller)
        size = int(sample.get("size_bytes", 0))
        if offset > size:
            raise InvalidSpec(
                [FieldViolation("offset", f"the output is {size} bytes; offset must be 0..{size}")]
            )
        length = min(limit, size - offset) if limit else size - offset
        return sample, self._chunks(str(sample.get("key", "")), offset, length)

    async def _chunks(self, key: str, offset: int, length: int) -> AsyncIterator[OutputChunk]:
        if length == 0:
            return
        position = offset
        try:
            async for data in self._store.read_range(key, offset, length, chunk_size=self._chunk):
                yield OutputChunk(position, data)
                position += len(data)
        except ObjectNotFoundError as exc:
            raise _missing(key) from exc
        except StorageError as exc:
            raise Unavailable("object store") from exc
        if position != offset + length:  # the object is shorter than the task recorded
            raise _missing(key)

    async def presigned_url(
        self, task_id: int, sample_index: int = 0, expires_in_s: int = 0, caller: Caller = SYSTEM
    ) -> OutputUrl:
        """A URL other services GET the sample from, valid `expires_in_s` (0: the default)."""
        if expires_in_s > MAX_PRESIGN_S or expires_in_s < 0:
            raise InvalidSpec(
                [FieldViolation("expires_in_s", f"must be 0 (the default) to {MAX_PRESIGN_S}")]
            )
        sample = await self.sample(task_id, sample_index, caller)
        store = self._store
        if not isinstance(store, PresigningStore):
            raise PreconditionFailed(
                f"the object store {store!r} cannot presign URLs: read the bytes with "
                "GetOutput, or configure an s3:// VIDROUTE_OBJECT_STORE",
                reason="STORE_CANNOT_PRESIGN",
                labels={"store": type(store).__name__},
            )
        lifetime = expires_in_s or self._url_ttl_s
        key = str(sample.get("key", ""))
        now = self._clock()
        try:
            # One HEAD: a URL to nothing (the store was changed or emptied) is no answer.
            if not await store.exists(key):
                raise _missing(key)
            url = await store.presigned_get_url(key, lifetime)
        except StorageError as exc:
            raise Unavailable("object store") from exc
        return OutputUrl(url, now + timedelta(seconds=lifetime), sample)


def _fields(offset: int, limit: int) -> tuple[tuple[str, int], ...]:
    return (("offset", offset), ("limit", limit))


def _missing(key: str) -> PreconditionFailed:
    return PreconditionFailed(
        f"the stored output {key!r} is missing from the object store",
        reason="OUTPUT_OBJECT_MISSING",
        labels={"key": key},
    )
