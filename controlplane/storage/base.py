"""The `ObjectStore` seam: where the platform keeps bytes it owns (design 9.22).

Provider output URLs expire, so every delivered video is copied into platform object storage
first. This module names what every backend shares and imports no boto3:

- `ObjectStore`: the protocol. `put` writes an object whole or not at all (readers never see a
  half-written object) and overwriting a key is allowed, so a repeated fetch is idempotent.
  `get` of a missing key raises `ObjectNotFoundError`; `delete` of a missing key is a no-op.
- `StoredObject`: what `put` returns: the backend URI, size and SHA-256 of the bytes written.
- `read_range` streams part of an object (offset and length, as an HTTP Range), so a reader can
  resume where it stopped without the store loading the object whole.
- `PresigningStore`: a store that can hand out a time-limited URL anyone may GET an object from
  (S3 presigns; the filesystem store cannot, since a ``file://`` path means nothing elsewhere).
- `PutSource`: bytes, a local file path, or an async iterable of byte chunks.
- Keys are relative ``/``-separated paths of safe segments (`validate_key`); the same key means
  the same object on every backend.

Exceptions::

    StorageError                  the backend failed (botocore/OS errors are translated here)
    ├── ObjectNotFoundError       `get` of a key that holds no object
    └── InvalidKeyError           (also ValueError) the key is not a safe relative path
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import AsyncGenerator, AsyncIterable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, runtime_checkable

__all__ = [
    "CHUNK_SIZE",
    "MAX_PRESIGN_S",
    "InvalidKeyError",
    "ObjectNotFoundError",
    "ObjectStore",
    "PresigningStore",
    "PutSource",
    "StorageError",
    "StoredObject",
    "check_range",
    "file_digest",
    "validate_key",
]

CHUNK_SIZE = 1024 * 1024
PutSource = bytes | Path | AsyncIterable[bytes]

# A segment never starts with "." (so never "." or ".."): dot names are the stores' temp files.
_SEGMENT = re.compile(r"^[A-Za-z0-9_=+@-][A-Za-z0-9._=+@-]*$")
_MAX_KEY_LEN = 1024  # the S3 limit; the filesystem store keeps the same rule
MAX_PRESIGN_S = 7 * 24 * 3600  # SigV4's longest presigned URL lifetime


class StorageError(Exception):
    """Root of every error an `ObjectStore` raises."""


class ObjectNotFoundError(StorageError):
    """The key holds no object."""

    def __init__(self, key: str) -> None:
        super().__init__(f"no object at key {key!r}")
        self.key = key


class InvalidKeyError(StorageError, ValueError):
    """The key is not a relative path of safe segments."""


@dataclass(frozen=True, slots=True)
class StoredObject:
    """An object as written: `uri` names it on its backend (``file://`` or ``s3://``)."""

    key: str
    uri: str
    size_bytes: int
    checksum_sha256: str  # lowercase hex of the bytes written
    content_type: str


@runtime_checkable
class ObjectStore(Protocol):
    """Platform object storage; every implementation passes the same behavioural suite."""

    async def put(self, key: str, source: PutSource, *, content_type: str) -> StoredObject:
        """Write `source` at `key` atomically, replacing any object already there."""
        ...

    async def get(self, key: str) -> bytes:
        """The whole object; `ObjectNotFoundError` if there is none."""
        ...

    async def exists(self, key: str) -> bool:
        """Whether an object is stored at `key`."""
        ...

    async def delete(self, key: str) -> None:
        """Remove the object at `key`; a missing key is not an error."""
        ...

    def read_range(
        self, key: str, offset: int = 0, length: int | None = None, *, chunk_size: int = CHUNK_SIZE
    ) -> AsyncGenerator[bytes, None]:
        """The bytes of `key` from `offset`, at most `length` of them (None: to the end), in
        chunks of at most `chunk_size`. An offset at or past the end yields nothing; a missing
        key raises `ObjectNotFoundError` at the first iteration; `ValueError` for a negative
        offset or length or a chunk size under 1. One read sees one version of the object."""
        ...

    def uri_for(self, key: str) -> str:
        """The URI an object at `key` has (or would have) on this backend."""
        ...


@runtime_checkable
class PresigningStore(Protocol):
    """A store that can hand out URLs other services GET objects from without credentials."""

    async def presigned_get_url(self, key: str, expires_in_s: int) -> str:
        """A URL that GETs the object at `key` for `expires_in_s` seconds (1..`MAX_PRESIGN_S`,
        else `ValueError`). The object's existence is not checked: callers know the key."""
        ...


def check_range(offset: int, length: int | None, chunk_size: int) -> None:
    """`ValueError` unless offset >= 0, length is None or >= 0 and chunk_size >= 1."""
    if offset < 0:
        raise ValueError(f"offset must not be negative: {offset}")
    if length is not None and length < 0:
        raise ValueError(f"length must not be negative: {length}")
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be positive: {chunk_size}")


def validate_key(key: str) -> str:
    """Return `key` if it is a safe relative key, else raise `InvalidKeyError`.

    Segments are non-empty, use only ``[A-Za-z0-9._=+@-]`` and do not start with ``.``, so a
    key can never escape the filesystem root, collide with a temp file, nor mean different
    things on different backends.
    """
    if not key or len(key) > _MAX_KEY_LEN:
        raise InvalidKeyError(f"key must be 1..{_MAX_KEY_LEN} characters: {key!r}")
    for segment in key.split("/"):
        if not _SEGMENT.match(segment):
            raise InvalidKeyError(f"unsafe key segment {segment!r} in {key!r}")
    return key


def file_digest(path: Path) -> tuple[int, str]:
    """Size and SHA-256 hex of a local file (blocking; call it in a thread)."""
    digest = hashlib.sha256()
    size = 0
    with path.open("rb") as fh:
        while chunk := fh.read(CHUNK_SIZE):
            digest.update(chunk)
            size += len(chunk)
    return size, digest.hexdigest()
