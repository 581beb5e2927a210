"""A sidecar's Prometheus metrics: its provider HTTP calls and its Submit outcomes (design 9.24).

`SidecarMetrics` keeps its own `CollectorRegistry`, so several sidecars in one test process never
collide. The provider HTTP calls are counted by httpx event hooks on the adapter's one client
(`instrument`), labelled by a route *template*: job ids, operation names and file names in a
path become ``{id}`` (9.24: no id is ever a label). Submit outcomes are counted by the servicer
where it journals them. The names start with ``adapter_`` so a sum over the control plane's
``provider_submit_total`` never counts a submit twice. The gRPC server families
(``grpc_server_started_total``, ``grpc_server_handled_total{grpc_method,grpc_code}``,
``grpc_server_handling_seconds``) are the kernel's (`vidroute_core.wire.grpc_metrics`), the
same as the control plane's, fed by the interceptor `SidecarServer` puts first.

Served over HTTP by `serve_metrics` on ``--metrics-listen`` / ``VIDROUTE_METRICS_LISTEN``.
"""

from __future__ import annotations

import logging
import re
import time

import httpx
from prometheus_client import CollectorRegistry, Counter, Histogram

from vidroute_core.adapter import SubmitOutcome
from vidroute_core.wire.grpc_metrics import GrpcServerMetrics

log = logging.getLogger(__name__)

_LATENCY_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
# Path segments after these are provider-chosen names (job ids, operations, files).
_ID_PARENTS = frozenset({"tasks", "jobs", "operations", "outputs", "files", "download", "assets"})
_ID_LIKE = re.compile(
    r"^(\d+|[0-9a-fA-F-]{16,}|[A-Za-z0-9_-]{32,}|.*\.[A-Za-z0-9]{2,5})$"  # numbers, uuids, files
)
_MAX_SEGMENTS = 6
_T0 = "vidroute_metrics_t0"


def route_template(path: str) -> str:
    """``/v1/tasks/7c1e...`` -> ``/v1/tasks/{id}``: a label with a bounded set of values."""
    out: list[str] = []
    for segment in [s for s in path.split("/") if s][:_MAX_SEGMENTS]:
        name, colon, verb = segment.partition(":")  # Veo's ``models/m:predictLongRunning``
        if (out and out[-1] in _ID_PARENTS) or _ID_LIKE.match(name):
            name = "{id}"
        out.append(f"{name}{colon}{verb}")
    return "/" + "/".join(out)


class SidecarMetrics:
    """The families one sidecar reports."""

    def __init__(self, provider: str, registry: CollectorRegistry | None = None) -> None:
        self.provider = provider
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.http_requests = Counter(
            "adapter_provider_http_requests",
            "HTTP calls to the provider by route template and status",
            ["provider", "method", "route", "status"],
            registry=r,
        )
        self.http_latency = Histogram(
            "adapter_provider_http_request_duration_seconds",
            "HTTP call latency to the provider (headers received)",
            ["provider", "method", "route"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.submits = Counter(
            "adapter_submit",
            "Submit outcomes as journaled",
            ["provider", "outcome", "error_class"],
            registry=r,
        )
        self.submit_latency = Histogram(
            "adapter_submit_latency_seconds",
            "Submit handling time, provider call included",
            ["provider"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.grpc = GrpcServerMetrics(r)

    def instrument(self, client: httpx.AsyncClient) -> None:
        """Count every request `client` sends from now on."""
        client.event_hooks["request"].append(self._on_request)
        client.event_hooks["response"].append(self._on_response)

    async def _on_request(self, request: httpx.Request) -> None:
        request.extensions[_T0] = time.perf_counter()

    async def _on_response(self, response: httpx.Response) -> None:
        request = response.request
        route = route_template(request.url.path)
        self.http_requests.labels(
            self.provider, request.method, route, str(response.status_code)
        ).inc()
        started = request.extensions.get(_T0)
        if isinstance(started, float):
            self.http_latency.labels(self.provider, request.method, route).observe(
                time.perf_counter() - started
            )

    def submitted(self, outcome: SubmitOutcome, seconds: float) -> None:
        error = "" if outcome.error is None else outcome.error.error_class.value
        self.submits.labels(self.provider, outcome.kind.value, error).inc()
        self.submit_latency.labels(self.provider).observe(max(0.0, seconds))
