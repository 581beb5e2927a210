"""The one builder of adapter sidecar clients: mTLS when configured, else plaintext to a
loopback sidecar only. The composition root (`bootstrap`) and one-shot runs (``vidroute
reconcile``) both build their clients here, so they talk to the sidecars the same way."""

from __future__ import annotations

from typing import Any

from controlplane.adapters.grpc_client import GrpcAdapterClient
from vidroute_core.tls import TlsSettings, channel_options
from vidroute_core.wire.tls import channel_credentials

__all__ = ["adapter_client"]


def adapter_client(tls: TlsSettings, address: str, timing: dict[str, Any]) -> GrpcAdapterClient:
    """A sidecar client at `address` with `timing` (`GrpcAdapterClient` keywords)."""
    if tls.files is None:
        tls.check_plaintext(address, role="adapter sidecar")
        return GrpcAdapterClient(address, **timing)
    return GrpcAdapterClient(
        address,
        credentials=channel_credentials(tls.files),
        channel_options=channel_options(tls),
        **timing,
    )
