"""The one builder of adapter sidecar clients: mTLS when configured, else plaintext to a
loopback sidecar only. The composition root (`bootstrap`) and one-shot runs (``vidroute
reconcile``) both build their clients here, so they talk to the sidecars the same way."""

from __future__ import annotations

from typing import Any

from controlplane.adapters.grpc_client import GrpcAdapterClient
from controlplane.domain.baselines import ONE_SHOT_MIN_DEADLINE_S
from vidroute_core.tls import TlsSettings, channel_options
from vidroute_core.wire.tls import channel_credentials

__all__ = ["adapter_client", "one_shot_timing"]

#: The RPC deadlines of a client (`GrpcAdapterClient` keywords) that an operator's one-shot
#: action waits on.
_DEADLINES = ("timeout_s", "fetch_timeout_s")


def one_shot_timing(timing: dict[str, Any]) -> dict[str, Any]:
    """`timing` with no deadline under `ONE_SHOT_MIN_DEADLINE_S`, for the clients of an
    operator's one-shot action (a reconciliation run, a release check's sample compiles):
    scaled by a test's time factor, a deadline falls under what a loaded machine takes to
    answer; the other timings stay as given."""
    return {k: max(v, ONE_SHOT_MIN_DEADLINE_S) if k in _DEADLINES else v for k, v in timing.items()}


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
