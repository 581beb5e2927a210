"""`FilesystemObjectStore`: the default `ObjectStore`, a directory tree on local disk.

An object at key ``a/b.mp4`` is the file ``<root>/a/b.mp4``. A write goes to a dot-prefixed temp
file in the same directory, is fsynced, then renamed over the target with `os.replace`, so
readers see the old object or the new one, never a mix (a `read_range` in progress keeps the
file it opened). Blocking file work runs in a thread. It cannot presign: a ``file://`` path means
nothing to another host, so it is not a `PresigningStore`.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import tempfile
from collections.abc import AsyncGenerator, Callable
from pathlib import Path
from typing import IO, Any, TypeVar

from controlplane.storage.base import (
    CHUNK_SIZE,
    ObjectNotFoundError,
    PutSource,
    StorageError,
    StoredObject,
    check_range,
    validate_key,
)

__all__ = ["FilesystemObjectStore"]

_T = TypeVar("_T")


class FilesystemObjectStore:
    """Objects as files under `root` (created on first write); URIs are ``file:///abs/path``."""

    def __init__(self, root: Path) -> None:
        self.root = root.expanduser().resolve()

    def __repr__(self) -> str:
        return f"FilesystemObjectStore({str(self.root)!r})"

    def _path(self, key: str) -> Path:
        return self.root.joinpath(*validate_key(key).split("/"))

    def uri_for(self, key: str) -> str:
        return self._path(key).as_uri()

    async def put(self, key: str, source: PutSource, *, content_type: str) -> StoredObject:
        target = self._path(key)
        try:
            fh = await asyncio.to_thread(_open_temp, target)
        except OSError as exc:
            raise StorageError(f"cannot create a temp file for {key!r}: {exc}") from exc
        tmp = Path(fh.name)
        digest = hashlib.sha256()
        try:
            if isinstance(source, bytes):
                size = await _io(key, _write, fh, source, digest)
            elif isinstance(source, Path):
                size = await _io(key, _copy_from, fh, source, digest)
            else:
                size = 0
                # An error raised by the source itself propagates untranslated.
                async for chunk in source:
                    size += await _io(key, _write, fh, chunk, digest)
            await _io(key, _finish, fh, tmp, target)
        except BaseException:
            # Whatever failed (disk, source, cancellation), leave no temp file behind.
            _discard(fh, tmp)
            raise
        return StoredObject(key, target.as_uri(), size, digest.hexdigest(), content_type)

    async def get(self, key: str) -> bytes:
        path = self._path(key)
        try:
            return await asyncio.to_thread(path.read_bytes)
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError) as exc:
            raise ObjectNotFoundError(key) from exc
        except OSError as exc:
            raise StorageError(f"cannot read {key!r}: {exc}") from exc

    async def read_range(
        self, key: str, offset: int = 0, length: int | None = None, *, chunk_size: int = CHUNK_SIZE
    ) -> AsyncGenerator[bytes, None]:
        check_range(offset, length, chunk_size)
        path = self._path(key)
        try:
            fh = await asyncio.to_thread(_open_at, path, offset)
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError) as exc:
            raise ObjectNotFoundError(key) from exc
        except OSError as exc:
            raise StorageError(f"cannot read {key!r}: {exc}") from exc
        try:
            remaining = length
            while remaining is None or remaining > 0:
                size = chunk_size if remaining is None else min(chunk_size, remaining)
                try:
                    chunk = await asyncio.to_thread(fh.read, size)
                except OSError as exc:
                    raise StorageError(f"cannot read {key!r}: {exc}") from exc
                if not chunk:
                    return
                if remaining is not None:
                    remaining -= len(chunk)
                yield chunk
        finally:
            fh.close()

    async def exists(self, key: str) -> bool:
        path = self._path(key)
        return await asyncio.to_thread(path.is_file)

    async def delete(self, key: str) -> None:
        path = self._path(key)
        try:
            # Empty parent directories stay: removing them would race a concurrent put.
            await asyncio.to_thread(path.unlink, missing_ok=True)
        except OSError as exc:
            raise StorageError(f"cannot delete {key!r}: {exc}") from exc


def _open_at(path: Path, offset: int) -> IO[bytes]:
    fh = path.open("rb")
    try:
        fh.seek(offset)
    except BaseException:
        fh.close()
        raise
    return fh


def _open_temp(target: Path) -> IO[bytes]:
    target.parent.mkdir(parents=True, exist_ok=True)
    return tempfile.NamedTemporaryFile(
        dir=target.parent, prefix=f".{target.name}.", suffix=".tmp", delete=False
    )


def _write(fh: IO[bytes], data: bytes, digest: hashlib._Hash) -> int:
    fh.write(data)
    digest.update(data)
    return len(data)


def _copy_from(fh: IO[bytes], source: Path, digest: hashlib._Hash) -> int:
    size = 0
    with source.open("rb") as src:
        while chunk := src.read(CHUNK_SIZE):
            size += _write(fh, chunk, digest)
    return size


async def _io(key: str, fn: Callable[..., _T], *args: Any) -> _T:
    """Run blocking file work in a thread, translating OSError into StorageError."""
    try:
        return await asyncio.to_thread(fn, *args)
    except OSError as exc:
        raise StorageError(f"cannot write {key!r}: {exc}") from exc


def _finish(fh: IO[bytes], tmp: Path, target: Path) -> None:
    fh.flush()
    os.fsync(fh.fileno())
    fh.close()
    os.replace(tmp, target)


def _discard(fh: IO[bytes], tmp: Path) -> None:
    """Close and remove a temp file after a failed write (a tiny blocking call on purpose)."""
    with contextlib.suppress(OSError):
        fh.close()
    with contextlib.suppress(OSError):
        tmp.unlink()
