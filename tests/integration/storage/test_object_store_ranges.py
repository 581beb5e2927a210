"""Ranged reads and presigned GETs of the `ObjectStore` seam, on both backends (S3 on moto)."""

from __future__ import annotations

import os
from contextlib import aclosing
from pathlib import Path

import httpx
import pytest

from controlplane.storage import (
    FilesystemObjectStore,
    ObjectNotFoundError,
    ObjectStore,
    PresigningStore,
    S3ObjectStore,
)
from tests.integration.storage.moto_s3 import REGION, MotoS3

pytestmark = pytest.mark.timeout(30)
DATA = os.urandom(700_001)  # odd size: the last chunk is short


@pytest.fixture(params=["filesystem", "s3"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> ObjectStore:
    """Each store in turn, empty."""
    if request.param == "filesystem":
        return FilesystemObjectStore(tmp_path / "objects")
    moto: MotoS3 = request.getfixturevalue("moto_s3")
    return S3ObjectStore(
        moto.create_bucket(),
        prefix="p",
        endpoint_url=moto.endpoint,
        region=REGION,
        session=moto.session,
    )


async def _read(
    store: ObjectStore, key: str, offset: int = 0, length: int | None = None, chunk: int = 65536
) -> bytes:
    parts = [c async for c in store.read_range(key, offset, length, chunk_size=chunk)]
    assert all(0 < len(p) <= chunk for p in parts)
    return b"".join(parts)


@pytest.mark.parametrize(
    ("offset", "length"),
    [(0, None), (0, 1), (1, 100_000), (65_536, 65_536), (699_999, None), (699_999, 50)],
)
async def test_a_range_is_exactly_those_bytes(
    store: ObjectStore, offset: int, length: int | None
) -> None:
    """read_range(offset, length) is DATA[offset:offset+length], in chunks of at most chunk_size."""
    await store.put("o/v.mp4", DATA, content_type="video/mp4")
    end = None if length is None else offset + length
    assert await _read(store, "o/v.mp4", offset, length) == DATA[offset:end]


async def test_resuming_after_a_cut_rebuilds_the_object(store: ObjectStore) -> None:
    """A reader that stops part-way and resumes from the bytes it has gets the object exactly."""
    await store.put("o/v.mp4", DATA, content_type="video/mp4")
    got = b""
    async with aclosing(store.read_range("o/v.mp4", chunk_size=100_000)) as chunks:
        async for chunk in chunks:
            got += chunk
            if len(got) >= 300_000:
                break  # the connection "drops"
    got += await _read(store, "o/v.mp4", len(got))
    assert got == DATA


async def test_at_or_past_the_end_and_zero_length_yield_nothing(store: ObjectStore) -> None:
    """An offset at or past the end, or a zero length, is an empty read, not an error."""
    await store.put("o/v.mp4", DATA, content_type="video/mp4")
    assert await _read(store, "o/v.mp4", len(DATA)) == b""
    assert await _read(store, "o/v.mp4", len(DATA) + 10, 5) == b""
    assert await _read(store, "o/v.mp4", 10, 0) == b""


async def test_missing_key_and_bad_arguments(store: ObjectStore) -> None:
    """A missing key is ObjectNotFoundError; a negative offset or length is ValueError."""
    with pytest.raises(ObjectNotFoundError):
        await _read(store, "o/none.mp4")
    for offset, length in ((-1, None), (0, -1)):
        with pytest.raises(ValueError, match="negative"):
            await _read(store, "o/none.mp4", offset, length)


async def test_s3_presigned_url_gets_the_bytes(moto_s3: MotoS3) -> None:
    """The S3 store presigns a plain GET (no credentials) for the object; the filesystem store
    is not a presigning store; a lifetime outside 1 s..7 days is refused."""
    s3 = S3ObjectStore(
        moto_s3.create_bucket(),
        endpoint_url=moto_s3.endpoint,
        region=REGION,
        session=moto_s3.session,
    )
    await s3.put("o/v.mp4", DATA, content_type="video/mp4")
    url = await s3.presigned_get_url("o/v.mp4", 60)
    assert "X-Amz-Expires=60" in url
    async with httpx.AsyncClient() as http:
        response = await http.get(url)
    assert response.status_code == 200
    assert response.content == DATA
    assert isinstance(s3, PresigningStore)
    assert not isinstance(FilesystemObjectStore(Path("/tmp")), PresigningStore)
    for bad in (0, 7 * 24 * 3600 + 1):
        with pytest.raises(ValueError, match="expires_in_s"):
            await s3.presigned_get_url("o/v.mp4", bad)
