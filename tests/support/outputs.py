"""A fetched output as the output step stores it: the 4 s 1280x720 H.264 clip the tests' fake
fetchers hand back."""

from __future__ import annotations

from controlplane.execution.output_fetch import StoredAsset

__all__ = ["stored_mp4"]


def stored_mp4(key: str, uri: str = "") -> StoredAsset:
    """The stored clip under `key` (at ``file:///assets/<key>`` unless `uri` says otherwise)."""
    return StoredAsset(
        uri=uri or f"file:///assets/{key}",
        key=key,
        mime_type="video/mp4",
        size_bytes=1024,
        checksum_sha256="0" * 64,
        duration_ms=4000,
        width=1280,
        height=720,
        fps=24.0,
        codec="h264",
        has_audio=False,
    )
