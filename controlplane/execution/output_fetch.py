"""Copy a provider's output into platform storage and prove it is the video asked for (9.22).

A provider's SUCCEEDED is not delivery: the output URL expires within a day or two, so the
engine calls `fetch_output` to stream it, check it and store it, and only a `StoredAsset` lets
the task succeed. This module touches no database and calls no adapter; the engine owns state.

Where the bytes come from is pluggable (`ByteSource`, carried by ``FetchRequest.source``):
`HttpSource` GETs the URL itself (the default, for signed links anyone may download), and
`StreamSource` takes a stream someone else downloads: the adapter sidecar's FetchOutput, for
outputs that need the provider's credentials (``fetch_through_adapter``). A source only turns
its transport's answer into a declared Content-Type/Length plus chunks, or a typed failure
(`SourceFailed`); every check below applies to both in one place.

The outcome is a value, one of (``FetchResult``)::

    StoredAsset          delivered: the bytes are in the ObjectStore and match the request
    OutputExpired        OUTPUT_EXPIRED (9.9): re-query the provider job for a fresh locator;
                         never generate again. HTTP 401/403/404/410 (and any other 4xx but
                         408/425/429: GCS answers an expired signature with 400), or an
                         ``expires_at`` already past, in which case nothing is requested.
    OutputInvalid        the bytes are not the asked video (MIME, size, checksum, probe);
                         fetching the same URL again cannot help.
    TransientFetchError  connection error, timeout, 408/425/429/5xx, a redirect loop or another
                         unexpected status: fetch the same URL again later.

`StorageError` from the store propagates: our storage failing says nothing about the output.

Checks, in order: status; Content-Type is `expected_mime`, a generic binary type or absent; the
Content-Length and the streamed byte count stay within `max_bytes`; the body starts with an
ISO-BMFF box (``ftyp`` and kin) so an HTML error page is refused after 8 bytes; the provider
checksum; then a PyAV probe: an mp4/mov container with a decodable video stream.

Tolerances against `ExpectedMedia` (chosen here; see design 9.22's ffprobe step):

* Duration: ``|actual - asked| <= max(one frame at the actual fps, 10% of asked)``. Providers
  round to whole frames or GOPs and pad by a fraction of a second; a 5 s ask answered with
  8 s is a different product.
* Size: only the display aspect ratio (coded size times sample aspect) must be within 1% of the
  asked ratio. Providers render at their native resolution (720p asked, 1080p delivered), so
  pixel counts are reported, not enforced.
* Audio: required when asked. When not asked, an audio track is not a reason to refuse (that
  would push the engine towards paying for a new generation): with ``strip_audio`` it is
  removed before storing (the LOSSLESS "stripped on delivery" transform of models that always
  render audio, like Veo 3 on the Gemini API) by `controlplane.execution.remux`: the video
  stream copied without re-encoding and the result proven silent and identical in video, or
  the fetch is a `TransientFetchError` and nothing is stored. The stored asset's size and
  SHA-256 are those of the stripped file; the provider checksum is checked on the download.
"""

from __future__ import annotations

import asyncio
import enum
import hashlib
import tempfile
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from fractions import Fraction
from pathlib import Path
from typing import Protocol
from urllib.parse import urlsplit

import av
import httpx

from controlplane.domain.quality import Defect
from controlplane.execution.frame_checks import frame_defects
from controlplane.execution.remux import size_and_sha256, strip_audio
from controlplane.storage import ObjectStore, validate_key

__all__ = [
    "Body",
    "ByteSource",
    "ExpectedMedia",
    "FetchRequest",
    "FetchResult",
    "HttpSource",
    "InvalidReason",
    "OutputExpired",
    "OutputInvalid",
    "ProviderChecksum",
    "SourceFailed",
    "StoredAsset",
    "StreamPart",
    "StreamSource",
    "TransientFetchError",
    "fetch_output",
]

_CHUNK = 256 * 1024
_GENERIC_MIME = frozenset({"application/octet-stream", "binary/octet-stream"})
# Top-level ISO-BMFF boxes an MP4/MOV file may open with (bytes 4..8).
_BOX_TYPES = frozenset({b"ftyp", b"styp", b"moov", b"mdat", b"free", b"skip", b"wide", b"pdin"})
_TRANSIENT_4XX = frozenset({408, 425, 429})


@dataclass(frozen=True, slots=True)
class ExpectedMedia:
    """What the task asked for; the tolerances are the module docstring's rules."""

    duration_ms: int
    width: int
    height: int
    with_audio: bool
    duration_tolerance_ratio: float = 0.10
    aspect_tolerance_ratio: float = 0.01

    def __post_init__(self) -> None:
        if min(self.duration_ms, self.width, self.height) <= 0:
            raise ValueError("duration_ms, width and height must be positive")
        if self.duration_tolerance_ratio < 0 or self.aspect_tolerance_ratio < 0:
            raise ValueError("tolerances must not be negative")


@dataclass(frozen=True, slots=True)
class ProviderChecksum:
    """A digest the provider published, e.g. ``ProviderChecksum("md5", "9e10...")``."""

    algorithm: str  # a hashlib name: "sha256", "md5", "sha1", ...
    hex_digest: str

    def __post_init__(self) -> None:
        hashlib.new(self.algorithm)  # ValueError for an unknown algorithm
        digest = self.hex_digest.strip().lower()
        if not digest or any(c not in "0123456789abcdef" for c in digest):
            raise ValueError(f"hex_digest is not hexadecimal: {self.hex_digest!r}")
        object.__setattr__(self, "hex_digest", digest)


@dataclass(frozen=True, slots=True)
class Body:
    """An opened download: what the sender declared, and the bytes in order.

    `chunks` may raise `SourceFailed` when the download fails part-way."""

    content_type: str  # "" when not declared
    content_length: int | None  # None when not declared
    chunks: AsyncIterator[bytes]
    where: str  # the redacted locator, for messages


class ByteSource(Protocol):
    """Where an output's bytes come from (see the module docstring)."""

    def open(self) -> AbstractAsyncContextManager[Body]:
        """Open the download; raises `SourceFailed` when it cannot be had."""
        ...


@dataclass(frozen=True, slots=True)
class FetchRequest:
    """One output of one attempt to copy. `source_uri` may carry a signature: kept out of repr.

    `source` is where the bytes come from; None means an `HttpSource` GET of `source_uri`.
    `via_adapter` marks an output the adapter downloads (``fetch_through_adapter``): its locator
    is the provider's own and may be any scheme the adapter reads (Vertex ``gs://``); any other
    locator must be http(s)."""

    task_id: str
    attempt_id: str
    source_uri: str = field(repr=False)
    expected: ExpectedMedia
    max_bytes: int
    expected_mime: str = "video/mp4"
    provider_checksum: ProviderChecksum | None = None
    expires_at: datetime | None = None  # when the provider says the locator stops working
    key_prefix: str = "outputs"
    source: ByteSource | None = field(default=None, repr=False, compare=False)
    strip_audio: bool = False  # remove any audio track before storing (see the module doc)
    sample_index: int = 0  # which output of the job (a job may render several samples)
    via_adapter: bool = False

    def __post_init__(self) -> None:
        scheme = urlsplit(self.source_uri).scheme
        if scheme not in ("http", "https") and not (self.via_adapter and scheme):
            raise ValueError("source_uri must be an http(s) URL")
        if self.max_bytes <= 0:
            raise ValueError("max_bytes must be positive")
        if self.expires_at is not None and self.expires_at.tzinfo is None:
            raise ValueError("expires_at must be timezone-aware")
        if self.sample_index < 0:
            raise ValueError("sample_index must not be negative")
        validate_key(self.storage_key)

    @property
    def storage_key(self) -> str:
        """Deterministic per attempt and sample, so a refetch after a refreshed URL overwrites
        in place (the first sample keeps the name single-output tasks always had)."""
        name = "output.mp4" if self.sample_index == 0 else f"output-{self.sample_index}.mp4"
        return f"{self.key_prefix}/{self.task_id}/{self.attempt_id}/{name}"


@dataclass(frozen=True, slots=True)
class StoredAsset:
    """The delivered output: where it is stored and what the probe saw."""

    uri: str
    key: str
    mime_type: str
    size_bytes: int
    checksum_sha256: str
    duration_ms: int
    width: int
    height: int
    fps: float | None
    codec: str
    has_audio: bool
    audio_stripped: bool = False  # the provider's file had audio; the stored one has none
    sample_index: int = 0
    # Technical quality signals of the probe (`frame_checks`: Defect values); not stored in
    # the output document, recorded as the sample's quality check.
    defects: tuple[str, ...] = ()


class InvalidReason(enum.Enum):
    """Why the bytes are not the asked video."""

    MIME_TYPE = "MIME_TYPE"
    TOO_LARGE = "TOO_LARGE"
    NOT_MP4 = "NOT_MP4"  # the body does not start like an MP4/MOV file
    CHECKSUM_MISMATCH = "CHECKSUM_MISMATCH"
    UNREADABLE_MEDIA = "UNREADABLE_MEDIA"  # PyAV cannot open or decode it
    MEDIA_MISMATCH = "MEDIA_MISMATCH"  # readable, but not what was asked


@dataclass(frozen=True, slots=True)
class OutputExpired:
    """The locator no longer works; re-query the provider job. Never regenerate."""

    reason: str
    status_code: int | None = None


@dataclass(frozen=True, slots=True)
class OutputInvalid:
    """The output is wrong in itself; fetching the same URL again cannot fix it."""

    code: InvalidReason
    reason: str


@dataclass(frozen=True, slots=True)
class TransientFetchError:
    """The fetch failed for a reason that may pass; retry the same URL later."""

    reason: str
    status_code: int | None = None
    retry_after_s: float | None = None


FetchResult = StoredAsset | OutputExpired | OutputInvalid | TransientFetchError
_Failure = OutputExpired | OutputInvalid | TransientFetchError


class SourceFailed(Exception):
    """A `ByteSource` could not deliver; `failure` says how (expired, invalid, transient)."""

    def __init__(self, failure: _Failure) -> None:
        super().__init__(failure)
        self.failure = failure


class HttpSource:
    """GET `uri` with `http`, following redirects; the status decides the failure:

    408/425/429/5xx and transport errors are transient, any other 4xx is OUTPUT_EXPIRED, any
    other non-200 is transient."""

    def __init__(self, http: httpx.AsyncClient, uri: str) -> None:
        self._http = http
        self._uri = uri

    @asynccontextmanager
    async def open(self) -> AsyncIterator[Body]:
        where = _redact(self._uri)
        try:
            async with self._http.stream("GET", self._uri, follow_redirects=True) as response:
                failure = _status_failure(response)
                if failure is not None:
                    raise SourceFailed(failure)
                length = response.headers.get("content-length", "")
                yield Body(
                    content_type=response.headers.get("content-type", ""),
                    content_length=int(length) if length.isdigit() else None,
                    chunks=response.aiter_bytes(_CHUNK),
                    where=_redact(str(response.url)),
                )
        except httpx.RequestError as exc:  # transport errors, timeouts, redirect loops, bad gzip
            raise SourceFailed(
                TransientFetchError(f"{type(exc).__name__} fetching {where}: {exc}")
            ) from exc


@dataclass(frozen=True, slots=True)
class StreamPart:
    """One piece of a stream handed to `StreamSource`: the first declares the Content-Type and
    Length (0: unknown); a part with `failure` ends the stream."""

    chunk: bytes = b""
    content_type: str = ""
    content_length: int = 0
    failure: _Failure | None = None


class StreamSource:
    """Bytes someone else downloads, e.g. the adapter sidecar's FetchOutput stream.

    `open_stream` is called once per fetch; `where` (already redacted) names it in messages."""

    def __init__(self, open_stream: Callable[[], AsyncIterator[StreamPart]], where: str) -> None:
        self._open_stream = open_stream
        self._where = where

    @asynccontextmanager
    async def open(self) -> AsyncIterator[Body]:
        parts = self._open_stream()
        try:
            first = await anext(parts, None) or StreamPart()
            if first.failure is not None:
                raise SourceFailed(first.failure)
            chunks = _stream_chunks(first, parts)
            try:
                yield Body(
                    content_type=first.content_type,
                    content_length=first.content_length or None,
                    chunks=chunks,
                    where=self._where,
                )
            finally:
                await chunks.aclose()
        finally:
            aclose = getattr(parts, "aclose", None)
            if aclose is not None:
                await aclose()


async def _stream_chunks(
    first: StreamPart, rest: AsyncIterator[StreamPart]
) -> AsyncGenerator[bytes, None]:
    if first.chunk:
        yield first.chunk
    async for part in rest:
        if part.failure is not None:
            raise SourceFailed(part.failure)
        if part.chunk:
            yield part.chunk


@dataclass(frozen=True, slots=True)
class _Probe:
    duration_ms: int
    width: int
    height: int
    display_aspect: float
    fps: float | None
    codec: str
    has_audio: bool
    defects: tuple[str, ...] = ()


async def fetch_output(
    http: httpx.AsyncClient,
    store: ObjectStore,
    request: FetchRequest,
    *,
    now: datetime | None = None,
) -> FetchResult:
    """Stream the output from `request.source` (default: GET `request.source_uri` with `http`),
    check it, store it at `request.storage_key`."""
    current = now if now is not None else datetime.now(UTC)
    if request.expires_at is not None and request.expires_at <= current:
        return OutputExpired(f"locator expired at {request.expires_at.isoformat()}")
    with tempfile.TemporaryDirectory(prefix="vidroute-fetch-") as spool_dir:
        spool = Path(spool_dir) / "output"
        source = request.source or HttpSource(http, request.source_uri)
        downloaded = await _download(source, request, spool)
        if not isinstance(downloaded, tuple):
            return downloaded
        size, sha256 = downloaded
        probe = await asyncio.to_thread(_probe, spool)
        if isinstance(probe, OutputInvalid):
            return probe
        mismatch = _compare(probe, request.expected)
        if mismatch is not None:
            return mismatch
        stripped = False
        if request.strip_audio and probe.has_audio:
            silent = Path(spool_dir) / "silent.mp4"
            problem = await asyncio.to_thread(strip_audio, spool, silent)
            if problem is not None:  # our remux failed, not the provider: try again later
                return TransientFetchError(problem)
            spool, stripped = silent, True
            size, sha256 = await asyncio.to_thread(size_and_sha256, silent)
        stored = await store.put(request.storage_key, spool, content_type=request.expected_mime)
    return StoredAsset(
        uri=stored.uri,
        key=stored.key,
        mime_type=request.expected_mime,
        size_bytes=size,
        checksum_sha256=sha256,
        duration_ms=probe.duration_ms,
        width=probe.width,
        height=probe.height,
        fps=probe.fps,
        codec=probe.codec,
        has_audio=probe.has_audio and not stripped,
        audio_stripped=stripped,
        sample_index=request.sample_index,
        defects=probe.defects,
    )


async def _download(
    source: ByteSource, request: FetchRequest, spool: Path
) -> tuple[int, str] | _Failure:
    """Stream the body into `spool`; (size, sha256) or the failure."""
    try:
        async with source.open() as body:
            failure = _check_body(body, request)
            if failure is not None:
                return failure
            sha256 = hashlib.sha256()
            extra = (
                hashlib.new(request.provider_checksum.algorithm)
                if request.provider_checksum
                else None
            )
            size, head = 0, b""
            with spool.open("wb") as fh:
                async for chunk in body.chunks:
                    size += len(chunk)
                    if size > request.max_bytes:
                        return OutputInvalid(
                            InvalidReason.TOO_LARGE, f"body exceeds {request.max_bytes} bytes"
                        )
                    if len(head) < 8:
                        head += chunk[: 8 - len(head)]
                        if len(head) == 8 and head[4:8] not in _BOX_TYPES:
                            return OutputInvalid(InvalidReason.NOT_MP4, f"body starts {head!r}")
                    sha256.update(chunk)
                    if extra is not None:
                        extra.update(chunk)
                    await asyncio.to_thread(fh.write, chunk)
    except SourceFailed as exc:
        return exc.failure
    if len(head) < 8:
        return OutputInvalid(InvalidReason.NOT_MP4, f"body is only {size} bytes")
    expected = request.provider_checksum
    if expected is not None and extra is not None and extra.hexdigest() != expected.hex_digest:
        return OutputInvalid(
            InvalidReason.CHECKSUM_MISMATCH,
            f"{expected.algorithm} is {extra.hexdigest()}, provider said {expected.hex_digest}",
        )
    return size, sha256.hexdigest()


def _status_failure(response: httpx.Response) -> _Failure | None:
    """The failure an HTTP status means, None for 200."""
    status, where = response.status_code, _redact(str(response.url))
    if status in _TRANSIENT_4XX or status >= 500:
        retry_after = _retry_after_s(response.headers.get("retry-after"))
        return TransientFetchError(f"HTTP {status} from {where}", status, retry_after)
    if 400 <= status < 500:
        return OutputExpired(f"HTTP {status} from {where}", status)
    if status != 200:
        return TransientFetchError(f"unexpected HTTP {status} from {where}", status)
    return None


def _check_body(body: Body, request: FetchRequest) -> _Failure | None:
    """The declared Content-Type and Content-Length, whatever the source."""
    mime = body.content_type.split(";")[0].strip().lower()
    if mime and mime != request.expected_mime.lower() and mime not in _GENERIC_MIME:
        return OutputInvalid(InvalidReason.MIME_TYPE, f"Content-Type {mime!r} from {body.where}")
    if body.content_length is not None and body.content_length > request.max_bytes:
        return OutputInvalid(
            InvalidReason.TOO_LARGE,
            f"Content-Length {body.content_length} exceeds {request.max_bytes}",
        )
    return None


def _probe(path: Path) -> _Probe | OutputInvalid:
    """What the container holds (blocking; run in a thread)."""
    try:
        with av.open(str(path), mode="r") as container:
            fmt = container.format.name
            if "mp4" not in fmt and "mov" not in fmt:
                return OutputInvalid(InvalidReason.UNREADABLE_MEDIA, f"container is {fmt!r}")
            if not container.streams.video:
                return OutputInvalid(InvalidReason.MEDIA_MISMATCH, "no video stream")
            video = container.streams.video[0]
            ctx = video.codec_context
            if video.duration is not None and video.time_base is not None:
                duration_ms = round(float(video.duration * video.time_base) * 1000)
            elif container.duration is not None:
                duration_ms = round(container.duration / 1000)  # AV_TIME_BASE is microseconds
            else:
                return OutputInvalid(InvalidReason.UNREADABLE_MEDIA, "no duration")
            rate = video.average_rate or video.guessed_rate
            sar = ctx.sample_aspect_ratio or Fraction(1)
            # One decoding thread: the probe already runs beside others in the thread pool, and
            # the codec's own slice or frame threads, started per output, cost more CPU than
            # they save on a few dozen frames.
            ctx.thread_type = "NONE"
            ctx.thread_count = 1
            # Decoding one frame proves the stream is playable, not merely well labelled.
            decoded = container.decode(video=0)
            first = next(decoded, None)
            if first is None:
                return OutputInvalid(InvalidReason.UNREADABLE_MEDIA, "no decodable frame")
            fps = float(rate) if rate else None
            count = video.frames or round(duration_ms / 1000 * (fps or 0))
            try:  # signals for the quality score (frame_checks), never a refusal
                defects = frame_defects(first, decoded, count, fps)
            except av.FFmpegError:
                defects = (Defect.DECODE_ERROR,)
            return _Probe(
                duration_ms=duration_ms,
                width=ctx.width,
                height=ctx.height,
                display_aspect=float(ctx.width * sar) / ctx.height,
                fps=fps,
                codec=ctx.name,
                has_audio=bool(container.streams.audio),
                defects=tuple(d.value for d in defects),
            )
    except (av.FFmpegError, ZeroDivisionError) as exc:
        return OutputInvalid(InvalidReason.UNREADABLE_MEDIA, f"probe failed: {exc}")


def _compare(probe: _Probe, expected: ExpectedMedia) -> OutputInvalid | None:
    problems: list[str] = []
    frame_ms = 1000 / probe.fps if probe.fps else 0.0
    allowed_ms = max(frame_ms, expected.duration_ms * expected.duration_tolerance_ratio)
    if abs(probe.duration_ms - expected.duration_ms) > allowed_ms:
        problems.append(
            f"duration {probe.duration_ms} ms, asked {expected.duration_ms} ± {allowed_ms:.0f} ms"
        )
    asked_aspect = expected.width / expected.height
    if abs(probe.display_aspect - asked_aspect) / asked_aspect > expected.aspect_tolerance_ratio:
        problems.append(
            f"aspect {probe.display_aspect:.4f} ({probe.width}x{probe.height}), "
            f"asked {asked_aspect:.4f} ({expected.width}x{expected.height})"
        )
    if expected.with_audio and not probe.has_audio:
        problems.append("no audio stream, audio was asked")
    return OutputInvalid(InvalidReason.MEDIA_MISMATCH, "; ".join(problems)) if problems else None


def _retry_after_s(value: str | None) -> float | None:
    if not value:
        return None
    if value.strip().isdigit():
        return float(value.strip())
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, (when - datetime.now(UTC)).total_seconds()) if when.tzinfo else None


def _redact(url: str) -> str:
    """The URL without query or fragment: signed locators carry credentials there."""
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}{parts.path}"
