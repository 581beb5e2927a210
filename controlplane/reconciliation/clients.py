"""Adapter clients for one-shot runs (``vidroute reconcile``), built the way the control plane
builds them (its time scale and mTLS settings), so the CronJob talks to the sidecars exactly as
the Deployment does."""

from __future__ import annotations

from controlplane import bootstrap
from controlplane.adapters.connect import adapter_client
from controlplane.adapters.grpc_client import GrpcAdapterClient
from vidroute_core.timescale import scaled_defaults

__all__ = ["adapter_clients"]


def adapter_clients(settings: bootstrap.Settings) -> dict[str, GrpcAdapterClient]:
    """A client per configured sidecar (``VIDROUTE_ADAPTERS``); the caller closes them."""
    timing = scaled_defaults(GrpcAdapterClient, settings.time_scale)
    return {
        name: adapter_client(settings.adapter_tls, address, timing)
        for name, address in settings.adapters.items()
    }
