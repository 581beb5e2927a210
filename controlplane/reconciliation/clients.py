"""Adapter clients for one-shot runs (``vidroute reconcile``), built the way the control plane
builds them (its time scale and mTLS settings), so the CronJob talks to the sidecars exactly as
the Deployment does, except that no RPC deadline is shorter than `ONE_SHOT_MIN_DEADLINE_S`
(the other timings keep their scaled values).

A reconcile is a batch job that nobody waits on: a deadline the time factor shrank below what a
loaded host takes to answer (30 s x 0.02 = 0.6 s for ListUsage) only turns a provider's bill into
NOT RECONCILED. A sidecar that is away still fails at once (a refused connection is UNAVAILABLE,
not a timeout)."""

from __future__ import annotations

from controlplane import bootstrap
from controlplane.adapters.connect import adapter_client, one_shot_timing
from controlplane.adapters.grpc_client import GrpcAdapterClient
from controlplane.domain.baselines import ONE_SHOT_MIN_DEADLINE_S
from vidroute_core.timescale import scaled_defaults

__all__ = ["ONE_SHOT_MIN_DEADLINE_S", "adapter_clients"]


def adapter_clients(settings: bootstrap.Settings) -> dict[str, GrpcAdapterClient]:
    """A client per configured sidecar (``VIDROUTE_ADAPTERS``); the caller closes them."""
    timing = one_shot_timing(scaled_defaults(GrpcAdapterClient, settings.time_scale))
    return {
        name: adapter_client(settings.adapter_tls, address, timing)
        for name, address in settings.adapters.items()
    }
