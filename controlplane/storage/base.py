"""The `ObjectStore` seam: where the platform keeps bytes it owns (design 9.22).

Provider output URLs expire, so every delivered video is copied into platform object storage
first. This module names what every backend shares and imports no boto3:

- `ObjectStore`: the protocol. `put` writes an object whole or not at all (readers never see a
  half-written object) and overwriting a key is allowed, so a repeated fetch is idempotent.
  `get` of a missing key raises `ObjectNotFoundError`; `delete` of a missing key is a no-op.
- `StoredObject`: what `put` returns: the backend URI, size and SHA-256 of the bytes written.
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
from collections.abc import AsyncIterable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, runtime_checkable

__all__ = [
    "CHUNK_SIZE",
    "InvalidKeyError",
    "ObjectNotFoundError",
    "ObjectStore",
    "PutSource",
    "StorageError",
    "StoredObject",
    "file_digest",
    "validate_key",
]

CHUNK_SIZE = 1024 * 1024
PutSource = bytes | Path | AsyncIterable[bytes]

# A segment never starts with "." (so never "." or ".."): dot names are the stores' temp files.
_SEGMENT = re.compile(r"^[A-Za-z0-9_=+@-][A-Za-z0-9._=+@-]*$")
_MAX_KEY_LEN = 1024  # the S3 limit; the filesystem store keeps the same rule


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

    def uri_for(self, key: str) -> str:
        """The URI an object at `key` has (or would have) on this backend."""
        ...


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
