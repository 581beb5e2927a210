"""`S3ObjectStore`: objects in an S3 bucket or an S3-compatible server (MinIO, R2, moto).

boto3 is synchronous, so every call runs in a thread via `asyncio.to_thread`; one client is
built per store and shared (boto3 clients are thread-safe). Credentials come from the standard
boto3 chain (environment, shared config, instance or workload identity); nothing here reads them.

An object at key ``k`` is ``s3://<bucket>/<prefix>/k``. A PUT to S3 is atomic per object, so
readers see the old object or the new one. Files go up with the managed (multipart) uploader;
an async stream is spooled to a temp file first, because S3 needs the length or multipart parts.
The SHA-256 is stored as user metadata ``sha256`` so a reader can verify without downloading.
`read_range` is one ranged GET (``Range: bytes=a-b``) streamed in chunks; `presigned_get_url`
signs a GET locally (SigV4, at most 7 days), so a URL costs no request to S3.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import tempfile
from collections.abc import AsyncGenerator, AsyncIterable
from pathlib import Path
from typing import Any

import boto3
from boto3.exceptions import Boto3Error
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError

from controlplane.storage.base import (
    CHUNK_SIZE,
    MAX_PRESIGN_S,
    ObjectNotFoundError,
    PutSource,
    StorageError,
    StoredObject,
    check_range,
    file_digest,
    validate_key,
)

__all__ = ["S3ObjectStore"]

_NOT_FOUND_CODES = frozenset({"404", "NoSuchKey", "NotFound"})
_RANGE_NOT_SATISFIABLE = frozenset({"416", "InvalidRange"})


class S3ObjectStore:
    """Objects under `prefix` in `bucket`; the bucket must exist.

    `session` defaults to a new boto3 session (the standard credential chain). Passing one lets
    several stores share its credentials and its parsed service models (building a client from
    a fresh session costs a few hundred milliseconds of JSON parsing).
    """

    def __init__(
        self,
        bucket: str,
        *,
        prefix: str = "",
        endpoint_url: str | None = None,
        region: str | None = None,
        session: boto3.session.Session | None = None,
    ) -> None:
        if not bucket:
            raise ValueError("bucket must not be empty")
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        if self.prefix:
            validate_key(self.prefix)
        # Path-style addressing for custom endpoints: S3-compatible servers rarely serve
        # virtual-hosted buckets on an IP address or a single host name.
        # SigV4 for presigned URLs too: its X-Amz-Expires is what bounds a URL's lifetime.
        config = Config(
            signature_version="s3v4",
            retries={"mode": "standard"},
            s3={"addressing_style": "path"} if endpoint_url else {},
        )
        self._client: Any = (session or boto3.session.Session()).client(
            "s3", endpoint_url=endpoint_url, region_name=region, config=config
        )

    def __repr__(self) -> str:
        return f"S3ObjectStore(bucket={self.bucket!r}, prefix={self.prefix!r})"

    def _object_key(self, key: str) -> str:
        validate_key(key)
        return f"{self.prefix}/{key}" if self.prefix else key

    def uri_for(self, key: str) -> str:
        return f"s3://{self.bucket}/{self._object_key(key)}"

    async def put(self, key: str, source: PutSource, *, content_type: str) -> StoredObject:
        object_key = self._object_key(key)
        if isinstance(source, bytes):
            size, sha = len(source), hashlib.sha256(source).hexdigest()
            await self._call(
                key,
                self._client.put_object,
                Bucket=self.bucket,
                Key=object_key,
                Body=source,
                ContentType=content_type,
                Metadata={"sha256": sha},
            )
        elif isinstance(source, Path):
            size, sha = await self._upload_file(key, object_key, source, content_type)
        else:
            with tempfile.TemporaryDirectory(prefix="vidroute-s3-") as spool_dir:
                spool = Path(spool_dir) / "object"
                await _spool(source, spool)
                size, sha = await self._upload_file(key, object_key, spool, content_type)
        return StoredObject(key, self.uri_for(key), size, sha, content_type)

    async def _upload_file(
        self, key: str, object_key: str, path: Path, content_type: str
    ) -> tuple[int, str]:
        try:
            size, sha = await asyncio.to_thread(file_digest, path)
        except OSError as exc:
            raise StorageError(f"cannot read {path} for {key!r}: {exc}") from exc
        await self._call(
            key,
            self._client.upload_file,
            str(path),
            self.bucket,
            object_key,
            ExtraArgs={"ContentType": content_type, "Metadata": {"sha256": sha}},
        )
        return size, sha

    async def get(self, key: str) -> bytes:
        response = await self._call(
            key, self._client.get_object, Bucket=self.bucket, Key=self._object_key(key)
        )
        body = response["Body"]
        try:
            data: bytes = await asyncio.to_thread(body.read)
        except (BotoCoreError, OSError) as exc:
            raise StorageError(f"cannot read {key!r}: {exc}") from exc
        finally:
            body.close()
        return data

    async def read_range(
        self, key: str, offset: int = 0, length: int | None = None, *, chunk_size: int = CHUNK_SIZE
    ) -> AsyncGenerator[bytes, None]:
        check_range(offset, length, chunk_size)
        if length == 0:
            return
        last = "" if length is None else str(offset + length - 1)
        params = {
            "Bucket": self.bucket,
            "Key": self._object_key(key),
            "Range": f"bytes={offset}-{last}",
        }

        def open_range() -> Any:
            try:
                return self._client.get_object(**params)
            except ClientError as exc:  # an offset at or past the end: nothing to send
                if str(exc.response.get("Error", {}).get("Code", "")) in _RANGE_NOT_SATISFIABLE:
                    return None
                raise

        response = await self._call(key, open_range)
        if response is None:
            return
        body = response["Body"]
        try:
            while True:
                try:
                    chunk: bytes = await asyncio.to_thread(body.read, chunk_size)
                except (BotoCoreError, OSError) as exc:
                    raise StorageError(f"cannot read {key!r}: {exc}") from exc
                if not chunk:
                    return
                yield chunk
        finally:
            body.close()

    async def presigned_get_url(self, key: str, expires_in_s: int) -> str:
        if not 1 <= expires_in_s <= MAX_PRESIGN_S:
            raise ValueError(f"expires_in_s must be 1..{MAX_PRESIGN_S}: {expires_in_s}")
        url: str = await self._call(
            key,
            self._client.generate_presigned_url,
            "get_object",
            Params={"Bucket": self.bucket, "Key": self._object_key(key)},
            ExpiresIn=expires_in_s,
            HttpMethod="GET",
        )
        return url

    async def exists(self, key: str) -> bool:
        try:
            await self._call(
                key, self._client.head_object, Bucket=self.bucket, Key=self._object_key(key)
            )
        except ObjectNotFoundError:
            return False
        return True

    async def delete(self, key: str) -> None:
        # S3 DeleteObject succeeds for a missing key, which is the contract we want.
        await self._call(
            key, self._client.delete_object, Bucket=self.bucket, Key=self._object_key(key)
        )

    async def _call(self, key: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
        """Run one boto3 call in a thread, translating botocore errors into ours."""
        try:
            return await asyncio.to_thread(fn, *args, **kwargs)
        except ClientError as exc:
            code = str(exc.response.get("Error", {}).get("Code", ""))
            if code in _NOT_FOUND_CODES:
                raise ObjectNotFoundError(key) from exc
            raise StorageError(f"S3 refused {key!r} in {self.bucket!r}: {code} {exc}") from exc
        except (Boto3Error, BotoCoreError, OSError) as exc:
            # Boto3Error: the managed uploader wraps failures in S3UploadFailedError.
            raise StorageError(f"S3 call for {key!r} in {self.bucket!r} failed: {exc}") from exc


async def _spool(source: AsyncIterable[bytes], path: Path) -> None:
    """Write the stream to `path`; errors raised by the source itself propagate untranslated."""
    try:
        fh = await asyncio.to_thread(path.open, "wb")
    except OSError as exc:
        raise StorageError(f"cannot spool an upload to {path}: {exc}") from exc
    try:
        async for chunk in source:
            try:
                await asyncio.to_thread(fh.write, chunk)
            except OSError as exc:
                raise StorageError(f"cannot spool an upload to {path}: {exc}") from exc
    finally:
        with contextlib.suppress(OSError):
            fh.close()
