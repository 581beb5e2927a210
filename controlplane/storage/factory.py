"""`object_store_from_url`: build the configured `ObjectStore` from one URL.

The composition root reads the URL from configuration and calls this; nothing else chooses a
backend. Accepted forms::

    file:///var/lib/vidroute/objects                  FilesystemObjectStore (the default)
    s3://bucket                                       S3ObjectStore, keys at the bucket root
    s3://bucket/some/prefix?endpoint_url=http://minio:9000&region=eu-west-1
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import parse_qs, unquote, urlsplit

from controlplane.storage.base import ObjectStore
from controlplane.storage.filesystem import FilesystemObjectStore
from controlplane.storage.s3 import S3ObjectStore

__all__ = ["object_store_from_url"]

_S3_PARAMS = frozenset({"endpoint_url", "region"})


def object_store_from_url(url: str) -> ObjectStore:
    """The store `url` names; `ValueError` for an unknown scheme or parameter."""
    parts = urlsplit(url)
    if parts.scheme == "file":
        if parts.netloc not in ("", "localhost") or parts.query or parts.fragment:
            raise ValueError(f"file URL must be file:///absolute/path: {url!r}")
        path = Path(unquote(parts.path))
        if not path.is_absolute():
            raise ValueError(f"file URL must hold an absolute path: {url!r}")
        return FilesystemObjectStore(path)
    if parts.scheme == "s3":
        if not parts.netloc or parts.fragment:
            raise ValueError(f"s3 URL must be s3://bucket[/prefix][?params]: {url!r}")
        query = parse_qs(parts.query, keep_blank_values=True, strict_parsing=bool(parts.query))
        unknown = set(query) - _S3_PARAMS
        if unknown:
            raise ValueError(f"unknown s3 URL parameters {sorted(unknown)} in {url!r}")
        repeated = [name for name, values in query.items() if len(values) != 1]
        if repeated:
            raise ValueError(f"s3 URL parameters given more than once: {sorted(repeated)}")
        return S3ObjectStore(
            parts.netloc,
            prefix=unquote(parts.path).strip("/"),
            endpoint_url=query["endpoint_url"][0] if "endpoint_url" in query else None,
            region=query["region"][0] if "region" in query else None,
        )
    raise ValueError(f"unsupported object store URL scheme {parts.scheme!r}: {url!r}")
