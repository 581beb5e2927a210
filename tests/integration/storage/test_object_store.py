"""One behavioural suite for every `ObjectStore`: the filesystem store and S3 on a moto server.

Each backend supplies `read_raw`, which reads an object behind the store's back, so the suite
can check what really landed on disk or in the bucket.
"""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from controlplane.storage import (
    FilesystemObjectStore,
    InvalidKeyError,
    ObjectNotFoundError,
    ObjectStore,
    S3ObjectStore,
    object_store_from_url,
)
from tests.integration.storage.moto_s3 import REGION, MotoS3, use_fake_aws_credentials

pytestmark = pytest.mark.timeout(30)


@dataclass
class Backend:
    """A store under test plus a way to read what it wrote without going through it."""

    name: str
    store: ObjectStore
    read_raw: Callable[[str], bytes]  # uri -> bytes
    content_type_of: Callable[[str], str | None]  # uri -> stored Content-Type, if kept


def _filesystem(tmp_path: Path) -> Backend:
    return Backend(
        "filesystem",
        FilesystemObjectStore(tmp_path / "objects"),
        read_raw=lambda uri: Path(urlsplit(uri).path).read_bytes(),
        content_type_of=lambda uri: None,
    )


def _locate(uri: str) -> tuple[str, str]:
    parts = urlsplit(uri)
    return parts.netloc, parts.path.lstrip("/")


def _s3(moto: MotoS3) -> Backend:
    store = S3ObjectStore(
        moto.create_bucket(),
        prefix="platform/objects",
        endpoint_url=moto.endpoint,
        region=REGION,
        session=moto.session,
    )

    def content_type_of(uri: str) -> str | None:
        bucket, key = _locate(uri)
        value: str = moto.client.head_object(Bucket=bucket, Key=key)["ContentType"]
        return value

    return Backend("s3", store, lambda uri: moto.read(*_locate(uri)), content_type_of)


@pytest.fixture(params=["filesystem", "s3"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Backend:
    """Each store in turn, empty."""
    if request.param == "filesystem":
        return _filesystem(tmp_path)
    return _s3(request.getfixturevalue("moto_s3"))


async def _chunks(*parts: bytes) -> AsyncIterator[bytes]:
    for part in parts:
        yield part


async def test_put_bytes_round_trips_with_size_and_checksum(backend: Backend) -> None:
    """Bytes put at a key come back from get, and StoredObject reports their size and SHA-256."""
    data = b"\x00\x01video bytes" * 1000
    stored = await backend.store.put("outputs/t1/a1/output.mp4", data, content_type="video/mp4")
    assert await backend.store.get("outputs/t1/a1/output.mp4") == data
    assert stored.size_bytes == len(data)
    assert stored.checksum_sha256 == hashlib.sha256(data).hexdigest()
    assert stored.uri == backend.store.uri_for("outputs/t1/a1/output.mp4")
    assert backend.read_raw(stored.uri) == data
    assert backend.content_type_of(stored.uri) in (None, "video/mp4")


async def test_put_from_file_and_from_stream_store_the_same_bytes(
    backend: Backend, tmp_path: Path
) -> None:
    """A local file and an async stream of chunks are stored byte for byte."""
    data = bytes(range(256)) * 5000
    source = tmp_path / "source.bin"
    source.write_bytes(data)
    from_file = await backend.store.put("k/file", source, content_type="application/octet-stream")
    from_stream = await backend.store.put(
        "k/stream", _chunks(data[:1000], data[1000:]), content_type="application/octet-stream"
    )
    assert await backend.store.get("k/file") == data
    assert await backend.store.get("k/stream") == data
    assert from_file.checksum_sha256 == from_stream.checksum_sha256
    assert from_file.size_bytes == from_stream.size_bytes == len(data)


async def test_exists_and_delete_follow_the_object(backend: Backend) -> None:
    """exists is false before put and after delete, and get of a deleted key raises NotFound."""
    key = "outputs/t2/a1/output.mp4"
    assert not await backend.store.exists(key)
    await backend.store.put(key, b"x", content_type="video/mp4")
    assert await backend.store.exists(key)
    await backend.store.delete(key)
    assert not await backend.store.exists(key)
    with pytest.raises(ObjectNotFoundError):
        await backend.store.get(key)


async def test_delete_of_a_missing_key_is_a_no_op(backend: Backend) -> None:
    """Deleting a key that holds nothing succeeds, so cleanup can be retried freely."""
    await backend.store.delete("never/written")
    assert not await backend.store.exists("never/written")


async def test_overwrite_replaces_the_object_and_repeats_idempotently(backend: Backend) -> None:
    """A second put at a key replaces the object; the same put twice yields the same result."""
    key = "outputs/t3/a1/output.mp4"
    await backend.store.put(key, b"first version", content_type="video/mp4")
    second = await backend.store.put(key, b"second", content_type="video/mp4")
    again = await backend.store.put(key, b"second", content_type="video/mp4")
    assert second == again
    assert await backend.store.get(key) == b"second"


async def test_a_failing_stream_leaves_the_previous_object_intact(backend: Backend) -> None:
    """A put whose source fails midway raises and the reader still sees the old object whole."""
    key = "outputs/t4/a1/output.mp4"
    await backend.store.put(key, b"old object", content_type="video/mp4")

    async def broken() -> AsyncIterator[bytes]:
        yield b"partial new bytes"
        raise ConnectionResetError("source went away")

    with pytest.raises(ConnectionResetError):
        await backend.store.put(key, broken(), content_type="video/mp4")
    assert await backend.store.get(key) == b"old object"


@pytest.mark.parametrize("key", ["", "/abs", "../escape", "a//b", "a/./b", ".hidden", "a b"])
async def test_unsafe_keys_are_refused(backend: Backend, key: str) -> None:
    """Keys that could escape the root, collide with temp files or differ by backend are refused."""
    with pytest.raises(InvalidKeyError):
        await backend.store.put(key, b"x", content_type="video/mp4")


async def test_filesystem_put_leaves_no_temp_files(tmp_path: Path) -> None:
    """After puts, failed or not, the filesystem store's directory holds only the objects."""
    store = FilesystemObjectStore(tmp_path)

    async def broken() -> AsyncIterator[bytes]:
        yield b"partial"
        raise ConnectionResetError("source went away")

    await store.put("d/ok", b"ok", content_type="video/mp4")
    with pytest.raises(ConnectionResetError):
        await store.put("d/broken", broken(), content_type="video/mp4")
    assert sorted(p.name for p in (tmp_path / "d").iterdir()) == ["ok"]


async def test_factory_builds_working_stores_from_urls(
    moto_s3: MotoS3, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """file:// and s3://bucket/prefix?endpoint_url=... URLs give stores writing where they say."""
    use_fake_aws_credentials(monkeypatch, str(tmp_path))
    bucket = moto_s3.create_bucket()
    fs = object_store_from_url((tmp_path / "objects").as_uri())
    s3 = object_store_from_url(f"s3://{bucket}/pre/fix?endpoint_url={moto_s3.endpoint}")
    assert isinstance(fs, FilesystemObjectStore)
    assert isinstance(s3, S3ObjectStore)
    fs_obj = await fs.put("a/b", b"fs", content_type="video/mp4")
    s3_obj = await s3.put("a/b", b"s3", content_type="video/mp4")
    assert fs_obj.uri == (tmp_path / "objects" / "a" / "b").as_uri()
    assert (tmp_path / "objects" / "a" / "b").read_bytes() == b"fs"
    assert s3_obj.uri == f"s3://{bucket}/pre/fix/a/b"
    assert moto_s3.read(bucket, "pre/fix/a/b") == b"s3"


@pytest.mark.parametrize(
    "url",
    [
        "file://relative/path",
        "file:///tmp/x?query=1",
        "s3://",
        "s3://bucket?endpoint=http://x",
        "s3://bucket?region=a&region=b",
        "gs://bucket/prefix",
    ],
)
def test_factory_refuses_malformed_urls(url: str) -> None:
    """object_store_from_url raises ValueError instead of guessing what a bad URL meant."""
    with pytest.raises(ValueError, match=r"."):
        object_store_from_url(url)
