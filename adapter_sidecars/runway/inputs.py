"""Runway's input assets from the platform's own object store: uploads and re-signed URLs.

Runway fetches every input URL itself (provider-apis.md §1.7), so an asset it cannot reach --
an ``s3://`` object in the platform's store -- is read here and sent through Runway's uploads
(§1.10): ``POST /v1/uploads {"filename", "type": "ephemeral"}``, then a multipart POST of the
slot's ``fields`` plus ``file`` to its ``uploadUrl`` (no Runway credentials: the fields are the
credential), and the ``runway://`` URI it returns goes into ``promptImage``.

An https URL on a host Runway cannot reach (``provider.options.private_input_hosts``: hosts
inside the platform's network) is downloaded here (`download`, at most ``asset_max_bytes``) and
uploaded the same way. Only those named hosts: the sidecar never fetches arbitrary URLs for the
provider, which would let a caller read internal services through it.

A presigned https URL of the same store is sent as is; when Runway refuses the create because it
could not fetch it (400, ASSET_UNAVAILABLE: the signature expired before the fetch) `refreshed`
signs a fresh URL for the same object (design 9.9.1: re-sign, then retry).

The store is ``provider.options.platform_store``, the same URL form as the control plane's
object store: ``s3://bucket[/prefix]?endpoint_url=https://...&region=...``. Credentials come from
boto3's standard chain (environment, workload identity); nothing here reads them. Failures are
provider errors of the asset classes, so a Submit that cannot prepare its inputs is REJECTED
with nothing sent to Runway.
"""

from __future__ import annotations

import asyncio
import mimetypes
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs, urlsplit

import boto3
import httpx
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError

from adapter_sidecars.common.config import ConfigError
from vidroute_core.errors import ErrorClass, ProviderError, make_error

#: Lifetime of a URL signed by `PlatformStore.presign` (the provider fetches it at create).
DEFAULT_URL_TTL_S = 3600
#: Cap of one input downloaded from a private host (Runway's URL cap for videos, §1.10).
DEFAULT_MAX_BYTES = 32 * 1024 * 1024
_NOT_FOUND = frozenset({"404", "NoSuchKey", "NotFound"})


@dataclass(frozen=True, slots=True)
class StoredObject:
    """One object's bytes and type, read from the platform's store."""

    key: str
    data: bytes
    content_type: str

    @property
    def filename(self) -> str:
        return self.key.rsplit("/", 1)[-1] or "input"


class PlatformStore:
    """The platform's S3-compatible bucket, as far as Runway's inputs need it."""

    def __init__(
        self, bucket: str, *, endpoint_url: str | None, region: str | None, url_ttl_s: int
    ) -> None:
        self.bucket = bucket
        self.endpoint_url = endpoint_url
        self.url_ttl_s = url_ttl_s
        config = Config(
            signature_version="s3v4",
            retries={"mode": "standard"},
            s3={"addressing_style": "path"} if endpoint_url else {},
        )
        self._client: Any = boto3.session.Session().client(
            "s3", endpoint_url=endpoint_url, region_name=region, config=config
        )

    @classmethod
    def from_options(cls, options: Mapping[str, Any]) -> PlatformStore | None:
        """``provider.options.platform_store`` (None when unset) and ``asset_url_ttl_seconds``."""
        url = options.get("platform_store")
        if not url:
            return None
        parts = urlsplit(str(url))
        query = parse_qs(parts.query)
        if parts.scheme != "s3" or not parts.netloc or set(query) - {"endpoint_url", "region"}:
            raise ConfigError(
                "provider.options.platform_store must be s3://bucket?endpoint_url=&region="
            )
        try:
            ttl = float(options.get("asset_url_ttl_seconds", DEFAULT_URL_TTL_S))
        except (TypeError, ValueError):
            ttl = 0.0
        if ttl <= 0:
            raise ConfigError("provider.options.asset_url_ttl_seconds must be positive")
        return cls(
            parts.netloc,
            endpoint_url=query["endpoint_url"][0] if "endpoint_url" in query else None,
            region=query["region"][0] if "region" in query else None,
            # Whole seconds, at least one: a scaled test lifetime may be a fraction.
            url_ttl_s=max(1, round(ttl)),
        )

    def key_of_s3(self, uri: str) -> str | None:
        """The key of an ``s3://<our bucket>/key`` URI, None for anything else."""
        parts = urlsplit(uri)
        key = parts.path.lstrip("/")
        return key if parts.scheme == "s3" and parts.netloc == self.bucket and key else None

    def key_of_url(self, uri: str) -> str | None:
        """The key of a path-style https URL of our bucket on our endpoint, None otherwise."""
        if not self.endpoint_url:
            return None
        ours, parts = urlsplit(self.endpoint_url), urlsplit(uri)
        prefix = f"/{self.bucket}/"
        if (parts.scheme, parts.netloc) != (ours.scheme, ours.netloc):
            return None
        if not parts.path.startswith(prefix) or len(parts.path) == len(prefix):
            return None
        return parts.path[len(prefix) :]

    async def read(self, key: str) -> StoredObject | ProviderError:
        """The object's bytes; ASSET_UNAVAILABLE when it cannot be read."""
        try:
            got = await asyncio.to_thread(self._client.get_object, Bucket=self.bucket, Key=key)
            data: bytes = await asyncio.to_thread(got["Body"].read)
        except ClientError as exc:
            code = str(exc.response.get("Error", {}).get("Code", ""))
            name = "ASSET_NOT_FOUND" if code in _NOT_FOUND else "ASSET_STORE_ERROR"
            return _unavailable(name, f"s3://{self.bucket}/{key}: {code or 'error'}")
        except BotoCoreError as exc:
            return _unavailable("ASSET_STORE_ERROR", f"s3://{self.bucket}/{key}: {exc}")
        content_type = str(got.get("ContentType") or "")
        if not content_type or content_type == "binary/octet-stream":
            content_type = mimetypes.guess_type(key)[0] or "application/octet-stream"
        return StoredObject(key, data, content_type)

    def presign(self, key: str) -> str:
        """A fresh presigned GET URL of `key` (signed locally: no request to the store)."""
        url: str = self._client.generate_presigned_url(
            "get_object", Params={"Bucket": self.bucket, "Key": key}, ExpiresIn=self.url_ttl_s
        )
        return url


@dataclass(frozen=True, slots=True)
class PrivateHosts:
    """``provider.options.private_input_hosts`` and ``asset_max_bytes``."""

    hosts: frozenset[str]
    max_bytes: int = DEFAULT_MAX_BYTES

    @classmethod
    def from_options(cls, options: Mapping[str, Any]) -> PrivateHosts:
        hosts = options.get("private_input_hosts") or []
        max_bytes = options.get("asset_max_bytes", DEFAULT_MAX_BYTES)
        if not isinstance(hosts, list) or not all(isinstance(h, str) and h for h in hosts):
            raise ConfigError("provider.options.private_input_hosts must be a list of host names")
        if not isinstance(max_bytes, int) or max_bytes <= 0:
            raise ConfigError("provider.options.asset_max_bytes must be a positive integer")
        return cls(frozenset(h.lower() for h in hosts), max_bytes)

    def holds(self, uri: str) -> bool:
        """Whether `uri` is an https URL on one of the private hosts."""
        parts = urlsplit(uri)
        return parts.scheme == "https" and (parts.hostname or "") in self.hosts


async def download(uri: str, max_bytes: int, limits: httpx.Timeout) -> StoredObject | ProviderError:
    """The bytes of a private input URL (no redirects: a hop could leave the named host)."""
    parts = urlsplit(uri)
    name = parts.path.rsplit("/", 1)[-1] or "input"
    shown = f"https://{parts.netloc}{parts.path}"
    try:
        async with (
            httpx.AsyncClient(timeout=limits, follow_redirects=False) as client,
            client.stream("GET", uri) as response,
        ):
            if response.status_code != 200:
                return _unavailable("ASSET_HTTP_ERROR", f"{shown}: HTTP {response.status_code}")
            data = bytearray()
            async for chunk in response.aiter_bytes():
                data.extend(chunk)
                if len(data) > max_bytes:
                    return make_error(
                        ErrorClass.ASSET_INVALID, "ASSET_TOO_LARGE", f"{shown}: over {max_bytes} B"
                    )
            content_type = response.headers.get("content-type", "").split(";")[0].strip()
    except httpx.HTTPError as exc:
        return _unavailable("ASSET_FETCH_FAILED", f"{shown}: {type(exc).__name__}")
    kind = content_type or mimetypes.guess_type(name)[0] or "application/octet-stream"
    return StoredObject(name, bytes(data), kind)


def image_slots(body: Mapping[str, Any]) -> Iterator[dict[str, Any]]:
    """The ``{"uri", "position"}`` items of a compiled ``promptImage``."""
    images = body.get("promptImage")
    for item in images if isinstance(images, list) else []:
        if isinstance(item, dict) and isinstance(item.get("uri"), str):
            yield item


def with_uris(body: Mapping[str, Any], replace: Callable[[str], str]) -> dict[str, Any]:
    """A copy of `body` whose ``promptImage`` URIs went through `replace`."""
    copy = dict(body)
    images = body.get("promptImage")
    if isinstance(images, list):
        copy["promptImage"] = [
            {**item, "uri": replace(item["uri"])}
            if isinstance(item, dict) and isinstance(item.get("uri"), str)
            else item
            for item in images
        ]
    return copy


async def upload(
    client: httpx.AsyncClient, headers: Mapping[str, str], stored: StoredObject
) -> str | ProviderError:
    """Send `stored` through Runway's ephemeral uploads; its ``runway://`` URI."""
    try:
        slot_reply = await client.post(
            "/v1/uploads",
            json={"filename": stored.filename, "type": "ephemeral"},
            headers=dict(headers),
        )
        slot = slot_reply.json() if slot_reply.status_code == 200 else None
        if not isinstance(slot, dict) or not all(
            k in slot for k in ("uploadUrl", "fields", "runwayUri")
        ):
            return _unavailable(
                "UPLOAD_SLOT_REFUSED", f"POST /v1/uploads answered HTTP {slot_reply.status_code}"
            )
        # The storage side is another host: a plain request, never Runway's credentials.
        async with httpx.AsyncClient(timeout=client.timeout) as storage:
            stored_reply = await storage.post(
                str(slot["uploadUrl"]),
                data={str(k): str(v) for k, v in dict(slot["fields"]).items()},
                files={"file": (stored.filename, stored.data, stored.content_type)},
            )
    except (httpx.HTTPError, ValueError) as exc:
        return _unavailable("UPLOAD_FAILED", f"upload of {stored.key}: {type(exc).__name__}")
    if stored_reply.status_code in (200, 201, 204):
        return str(slot["runwayUri"])
    if stored_reply.status_code == 400:
        # Over the size cap or not an image/video: the asset itself is what Runway refuses.
        return make_error(
            ErrorClass.ASSET_INVALID,
            "UPLOAD_REFUSED",
            f"upload of {stored.key} refused: {stored_reply.text[:200]}",
        )
    return _unavailable("UPLOAD_FAILED", f"upload of {stored.key}: HTTP {stored_reply.status_code}")


def _unavailable(code: str, message: str) -> ProviderError:
    return make_error(ErrorClass.ASSET_UNAVAILABLE, code, message)
