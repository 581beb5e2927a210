"""Image assets of a Veo request: compiled as references, sent as inline bytes (§2.1).

The Gemini API takes ``instances[0].image``, ``lastFrame`` and ``referenceImages[].image`` only
as ``{"bytesBase64Encoded", "mimeType"}`` (``gcsUri``, ``inlineData`` and ``uri`` are refused).
Compile must stay deterministic and free of network I/O, and the request hash must not depend on
URL signatures, so a compiled plan carries an *asset reference* in each image slot::

    {"assetUri": "https://...", "mimeType": "image/png", "checksumSha256": "<64 hex>"}

(``mimeType`` and ``checksumSha256`` only when the spec has them). `resolve_body` turns each
reference into inline bytes at Submit time, before any byte goes to the provider: ``data:`` URIs
are decoded locally, ``http(s)`` assets are fetched with the adapter's client (redirects
followed, no provider credentials sent, `AssetLimits`). Failures are provider errors of the
asset classes, so the submit is REJECTED with nothing sent (design 9.17.3):

* not fetchable (connect error, timeout, non-2xx such as an expired signature or 404):
  ASSET_UNAVAILABLE;
* fetched but unusable (not ``image/*``, over the size cap, bytes whose SHA-256 differs from the
  spec's ``checksum_sha256``, undecodable ``data:``): ASSET_INVALID.

The ``mimeType`` sent is the reference's when it has one, else the fetched ``Content-Type``
(``data:``: its media type), so recovery can predict it from the plan. A legacy plan whose image
slot is ``{"uri": ...}`` is resolved the same way; media that already carry bytes are sent as is.

`fingerprints` reads the image slots of a request as (SHA-256 of the bytes, mimeType) pairs, the
form recovery compares (see `adapter.VeoAdapter.recover_submission`).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hashlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote_to_bytes, urlsplit, urlunsplit

import httpx

from adapter_sidecars.common.config import ConfigError
from vidroute_core.errors import ErrorClass, ProviderError, make_error

REF_URI = "assetUri"
LEGACY_URI = "uri"
FETCHABLE_SCHEMES = ("https", "http")
#: Schemes this adapter can turn into bytes (compile REJECTs the others: gs, s3, asset).
RESOLVABLE_SCHEMES = (*FETCHABLE_SCHEMES, "data")
DEFAULT_MAX_BYTES = 20 * 1024 * 1024
DEFAULT_FETCH_TIMEOUT_S = 30.0


@dataclass(frozen=True, slots=True)
class AssetLimits:
    """Per-asset byte cap and overall fetch deadline (``provider.options`` knobs)."""

    max_bytes: int = DEFAULT_MAX_BYTES
    fetch_timeout_s: float = DEFAULT_FETCH_TIMEOUT_S

    @classmethod
    def from_options(cls, options: Mapping[str, Any]) -> AssetLimits:
        """``asset_max_bytes`` / ``asset_fetch_timeout_seconds``, defaults otherwise."""
        try:
            limits = cls(
                int(options.get("asset_max_bytes", DEFAULT_MAX_BYTES)),
                float(options.get("asset_fetch_timeout_seconds", DEFAULT_FETCH_TIMEOUT_S)),
            )
        except (TypeError, ValueError):
            limits = cls(0, 0.0)
        if limits.max_bytes <= 0 or limits.fetch_timeout_s <= 0:
            raise ConfigError(
                "provider.options.asset_max_bytes and asset_fetch_timeout_seconds must be "
                "positive numbers"
            )
        return limits


@dataclass(frozen=True, slots=True)
class Fetched:
    """The bytes of one asset and the MIME type to send them with."""

    data: bytes
    mime_type: str

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.data).hexdigest()

    def media(self) -> dict[str, str]:
        """The Gemini wire form."""
        return {
            "bytesBase64Encoded": base64.b64encode(self.data).decode("ascii"),
            "mimeType": self.mime_type,
        }


def reference(uri: str, mime_type: str = "", checksum_sha256: str = "") -> dict[str, str]:
    """The compiled form of an image asset (see the module docstring)."""
    ref = {REF_URI: uri}
    if mime_type:
        ref["mimeType"] = mime_type
    if checksum_sha256:
        ref["checksumSha256"] = checksum_sha256.lower()
    return ref


def scheme_of(uri: str) -> str:
    """Lower-case scheme of `uri` ('' when it has none)."""
    head, sep, _ = uri.partition(":")
    return head.lower() if sep else ""


def reference_uri(media: Any) -> str | None:
    """The asset URI of an unresolved image slot, None when the slot already carries bytes."""
    if not isinstance(media, Mapping) or "bytesBase64Encoded" in media:
        return None
    uri = media.get(REF_URI, media.get(LEGACY_URI))
    return uri if isinstance(uri, str) else None


def image_slots(body: Mapping[str, Any]) -> Iterator[tuple[str, Any, str]]:
    """(path, container, key) of every image slot present in a predictLongRunning body."""
    instances = body.get("instances")
    if not isinstance(instances, list):
        return
    for i, instance in enumerate(instances):
        if not isinstance(instance, Mapping):
            continue
        for key in ("image", "lastFrame"):
            if key in instance:
                yield f"instances[{i}].{key}", instance, key
        refs = instance.get("referenceImages")
        for j, ref in enumerate(refs if isinstance(refs, list) else []):
            if isinstance(ref, Mapping) and "image" in ref:
                yield f"instances[{i}].referenceImages[{j}].image", ref, "image"


def _copy(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {k: _copy(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_copy(v) for v in value]
    return value


def skeleton(body: Mapping[str, Any]) -> dict[str, Any]:
    """`body` with every image slot replaced by a marker: the fields that are not images."""
    copy = _copy(body)
    for _, container, key in image_slots(copy):
        container[key] = "<image>"
    return dict(copy)


def _shown(uri: str) -> str:
    """`uri` fit for an error message: no signature, no inline payload."""
    if scheme_of(uri) == "data":
        return uri.split(",", 1)[0] + ",..."
    try:
        parts = urlsplit(uri)
    except ValueError:
        return "<unparsable URI>"
    return urlunsplit((parts.scheme, parts.netloc, parts.path, "", ""))


def _unavailable(code: str, message: str) -> ProviderError:
    return make_error(ErrorClass.ASSET_UNAVAILABLE, code, message)


def _invalid(code: str, message: str) -> ProviderError:
    return make_error(ErrorClass.ASSET_INVALID, code, message)


def _essence(content_type: str) -> str:
    return content_type.split(";", 1)[0].strip().lower()


def _check(
    path: str, uri: str, fetched: Fetched, ref: Mapping[str, Any], limits: AssetLimits
) -> Fetched | ProviderError:
    where = f"{path} ({_shown(uri)})"
    if len(fetched.data) > limits.max_bytes:
        return _invalid("ASSET_TOO_LARGE", f"{where} is over {limits.max_bytes} bytes")
    if not fetched.data:
        return _invalid("ASSET_EMPTY", f"{where} is empty")
    if not fetched.mime_type.startswith("image/"):
        shown = fetched.mime_type or "no Content-Type"
        return _invalid("ASSET_NOT_IMAGE", f"{where} is {shown}, not image/*")
    want = str(ref.get("checksumSha256") or "").lower()
    if want and fetched.sha256 != want:
        return _invalid(
            "ASSET_CHECKSUM_MISMATCH",
            f"{where} has SHA-256 {fetched.sha256}, the spec says {want}",
        )
    declared = str(ref.get("mimeType") or "")
    return Fetched(fetched.data, declared or fetched.mime_type)


def _decode_data_uri(uri: str) -> tuple[bytes, str] | None:
    header, sep, payload = uri[5:].partition(",")
    if not sep:
        return None
    params = header.split(";")
    mime = params[0].strip().lower()
    try:
        if "base64" in (p.strip().lower() for p in params[1:]):
            return base64.b64decode(unquote_to_bytes(payload), validate=True), mime
        return unquote_to_bytes(payload), mime
    except (binascii.Error, ValueError):
        return None


async def _download(
    client: httpx.AsyncClient, uri: str, where: str, limits: AssetLimits
) -> Fetched | ProviderError:
    try:
        async with asyncio.timeout(limits.fetch_timeout_s):
            async with client.stream("GET", uri, follow_redirects=True) as response:
                if response.status_code != 200:
                    return _unavailable(
                        "ASSET_HTTP_ERROR", f"{where}: HTTP {response.status_code} from the host"
                    )
                mime = _essence(response.headers.get("content-type", ""))
                if not mime.startswith("image/"):
                    shown = mime or "no Content-Type"
                    return _invalid("ASSET_NOT_IMAGE", f"{where} is {shown}, not image/*")
                declared = response.headers.get("content-length", "")
                if declared.isdigit() and int(declared) > limits.max_bytes:
                    return _invalid(
                        "ASSET_TOO_LARGE", f"{where} is {declared} bytes (cap {limits.max_bytes})"
                    )
                data = bytearray()
                async for chunk in response.aiter_bytes():
                    data.extend(chunk)
                    if len(data) > limits.max_bytes:
                        return _invalid(
                            "ASSET_TOO_LARGE", f"{where} is over {limits.max_bytes} bytes"
                        )
                return Fetched(bytes(data), mime)
    except (TimeoutError, httpx.TimeoutException):
        return _unavailable(
            "ASSET_FETCH_TIMEOUT", f"{where}: not fetched within {limits.fetch_timeout_s:g} s"
        )
    except (httpx.HTTPError, httpx.InvalidURL, OSError) as exc:
        return _unavailable("ASSET_FETCH_FAILED", f"{where}: {type(exc).__name__}")


async def fetch(
    client: httpx.AsyncClient,
    path: str,
    ref: Mapping[str, Any],
    limits: AssetLimits,
) -> Fetched | ProviderError:
    """The bytes and MIME type to send for one image reference, checked (module docstring)."""
    uri = reference_uri(ref) or ""
    where = f"{path} ({_shown(uri)})"
    scheme = scheme_of(uri)
    if scheme == "data":
        decoded = _decode_data_uri(uri)
        if decoded is None:
            return _invalid("ASSET_UNDECODABLE", f"{where} is not a decodable data: URI")
        data, mime = decoded
        fetched = Fetched(data, mime or str(ref.get("mimeType") or ""))
    elif scheme in FETCHABLE_SCHEMES:
        got = await _download(client, uri, where, limits)
        if isinstance(got, ProviderError):
            return got
        fetched = got
    else:
        return _invalid(
            "ASSET_SCHEME_UNSUPPORTED",
            f"{where}: the Gemini API needs inline bytes; "
            f"this adapter reads {', '.join(RESOLVABLE_SCHEMES)} assets only",
        )
    return _check(path, uri, fetched, ref, limits)


async def resolve_body(
    client: httpx.AsyncClient, body: Mapping[str, Any], limits: AssetLimits
) -> Mapping[str, Any] | ProviderError:
    """`body` with every image reference replaced by inline bytes (the same object when there
    is none), or the error of the first asset that could not be used."""
    slots = [
        (path, container, key)
        for path, container, key in image_slots(body)
        if reference_uri(container[key]) is not None
    ]
    if not slots:
        return body
    results = await asyncio.gather(
        *(fetch(client, path, container[key], limits) for path, container, key in slots)
    )
    for result in results:
        if isinstance(result, ProviderError):
            return result
    resolved = _copy(body)
    todo = [(p, c, k) for p, c, k in image_slots(resolved) if reference_uri(c[k]) is not None]
    for (_, container, key), fetched in zip(todo, results, strict=True):
        assert isinstance(fetched, Fetched)
        container[key] = fetched.media()
    return dict(resolved)


@dataclass(frozen=True, slots=True)
class Fingerprint:
    """What identifies one sent image: SHA-256 of its bytes and its mimeType.

    `sha256` None: unknown (matches anything). `mime_type` None: any. `trusted`: equal to what
    a Submit of the plan sent, whenever it sent anything (not a later re-fetch)."""

    sha256: str | None
    mime_type: str | None
    trusted: bool

    def admits(self, other: Fingerprint) -> bool:
        """Whether a listed image with fingerprint `other` may be this one."""
        return (self.sha256 is None or self.sha256 == other.sha256) and (
            self.mime_type is None or self.mime_type == other.mime_type
        )


def sent_fingerprint(media: Any) -> Fingerprint:
    """The fingerprint of an image slot of a request as the provider recorded it."""
    if not isinstance(media, Mapping):
        return Fingerprint("", None, True)
    encoded = media.get("bytesBase64Encoded")
    try:
        data = base64.b64decode(str(encoded), validate=True) if encoded is not None else None
    except (binascii.Error, ValueError):
        data = None
    sha = hashlib.sha256(data).hexdigest() if data is not None else ""
    mime = media.get("mimeType")
    return Fingerprint(sha, mime if isinstance(mime, str) else "", True)


async def expected_fingerprint(
    client: httpx.AsyncClient, path: str, media: Any, limits: AssetLimits
) -> Fingerprint:
    """The fingerprint a Submit of the plan's image slot `media` sent.

    Inline bytes, ``data:`` URIs and references with a checksum are exact (Submit refuses bytes
    that differ from the checksum). A reference without a checksum is re-fetched: the asset may
    have changed since, so that fingerprint is not trusted, and unknown if the fetch fails."""
    uri = reference_uri(media)
    if uri is None:
        return sent_fingerprint(media)
    declared = str(media.get("mimeType") or "") or None
    checksum = str(media.get("checksumSha256") or "").lower()
    if checksum:
        return Fingerprint(checksum, declared, True)
    fetched = await fetch(client, path, media, limits)
    if isinstance(fetched, ProviderError):
        return Fingerprint(None, declared, False)
    trusted = scheme_of(uri) == "data"
    return Fingerprint(fetched.sha256, fetched.mime_type if trusted else declared, trusted)
