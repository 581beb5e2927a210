"""The sidecar process: ``grpc.aio`` server, health that follows the provider, clean shutdown.

* Health (``grpc.health.v1``): the overall status ("") and
  ``vidroute.adapter.v1.ProviderAdapterService`` start NOT_SERVING and become SERVING once the
  adapter's cheap probe reaches the provider; the probe repeats every
  ``health.probe_interval_seconds`` and flips the status both ways.
* Reflection lists the services by their generated descriptors' full names.
* SIGTERM/SIGINT: health enters graceful shutdown (NOT_SERVING for good), the server stops
  accepting and drains for ``shutdown_grace_seconds``, then the HTTP client closes. A second
  signal exits at once. `SidecarServer.stop` is idempotent.
* ``--port-file``: once the server listens, the bound port is written (atomically) so test
  harnesses never guess or race.
* ``metrics_listen`` (``--metrics-listen`` / ``VIDROUTE_METRICS_LISTEN``): Prometheus
  ``/metrics`` of the provider HTTP calls and Submit outcomes (`adapter_sidecars.common.metrics`).
* mTLS (`vidroute_core.tls`, ``VIDROUTE_TLS_*``): with certificate files the port serves TLS and
  REQUIRES a client certificate from the configured CA; without them it binds only a loopback
  address unless ``VIDROUTE_TLS=off``. ``health_listen`` (``--health-listen`` /
  ``VIDROUTE_HEALTH_LISTEN``) is a second, plaintext port serving only ``grpc.health.v1`` (the
  same statuses): Kubernetes' native gRPC probes cannot present a client certificate, and an
  exec probe would start a Python process per probe.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
from pathlib import Path

import grpc
import httpx
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from adapter_sidecars.common.metrics import SidecarMetrics
from adapter_sidecars.common.servicer import AdapterServicer
from adapter_sidecars.common.types import ProviderAdapter
from vidroute.adapter.v1 import adapter_service_pb2, adapter_service_pb2_grpc
from vidroute_core.metrics_http import serve_metrics
from vidroute_core.tls import TlsSettings
from vidroute_core.wire import tracing as tracing_edge
from vidroute_core.wire.listen import SERVER_OPTIONS, bind
from vidroute_core.wire.status import DomainErrorInterceptor
from vidroute_core.wire.tls import server_credentials

log = logging.getLogger(__name__)

ADAPTER_SERVICE = adapter_service_pb2.DESCRIPTOR.services_by_name[
    "ProviderAdapterService"
].full_name
_SERVING = health_pb2.HealthCheckResponse.SERVING
_NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


LIVENESS_SERVICE = "liveness"
# What to do about a taken port (`vidroute_core.wire.listen.PortInUse`).
LISTEN_FIX = (
    "another sidecar, or a vidroute up? Stop it, or set --listen (or VIDROUTE_ADAPTER_LISTEN) "
    "to a free address, e.g. 127.0.0.1:0"
)
HEALTH_LISTEN_FIX = "stop what holds it, or set --health-listen (or VIDROUTE_HEALTH_LISTEN)"


class SidecarServer:
    """One adapter served over gRPC (see the module docstring)."""

    def __init__(
        self,
        adapter: ProviderAdapter,
        listen: str,
        *,
        probe_interval_seconds: float = 10.0,
        shutdown_grace_seconds: float = 10.0,
        metrics: SidecarMetrics | None = None,
        tls: TlsSettings | None = None,
        health_listen: str = "",
    ) -> None:
        self.adapter = adapter
        self.tls = tls or TlsSettings()
        self.health_listen = health_listen
        self.health_port = 0
        self._health_server: grpc.aio.Server | None = None
        self.metrics = metrics
        self.listen = listen
        self.probe_interval = probe_interval_seconds
        self.grace = shutdown_grace_seconds
        self.health = health.aio.HealthServicer()
        # Tracing first (outermost): an INTERNAL is logged inside the call's span. Then the gRPC
        # server metrics, so they count the code the client sees after error mapping.
        rpc_metrics = [] if metrics is None else [metrics.grpc.interceptor()]
        # Without SO_REUSEPORT: a taken port is an error (`PortInUse`), never silently shared.
        self.server = grpc.aio.server(
            interceptors=[
                *tracing_edge.server_interceptors(),
                *rpc_metrics,
                DomainErrorInterceptor(),
            ],
            options=SERVER_OPTIONS,
        )
        self.port = 0
        self._prober: asyncio.Task[None] | None = None
        self._stopped = asyncio.Event()
        self._stopping = False
        self.provider_reachable = False

    async def start(self) -> int:
        """Bind, register services, start probing; return the bound port."""
        adapter_service_pb2_grpc.add_ProviderAdapterServiceServicer_to_server(
            AdapterServicer(self.adapter, metrics=self.metrics), self.server
        )
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        reflection.enable_server_reflection(
            (ADAPTER_SERVICE, health.SERVICE_NAME, reflection.SERVICE_NAME), self.server
        )
        for service in ("", ADAPTER_SERVICE):
            await self.health.set(service, _NOT_SERVING)
        # "liveness" answers whether this process works, whatever the provider's state: a
        # liveness probe on "" would restart healthy pods during a provider outage.
        await self.health.set(LIVENESS_SERVICE, _SERVING)
        self.port = self._bind()
        if self.health_listen:
            self._health_server = grpc.aio.server(options=SERVER_OPTIONS)
            health_pb2_grpc.add_HealthServicer_to_server(self.health, self._health_server)
            self.health_port = bind(
                self._health_server.add_insecure_port, self.health_listen, fix=HEALTH_LISTEN_FIX
            )
            await self._health_server.start()
        # An adapter that serves something of its own (the Cog backend's webhook receiver)
        # starts it before the first RPC can depend on it; `aclose` stops it.
        start_adapter = getattr(self.adapter, "start", None)
        if start_adapter is not None:
            await start_adapter()
        await self.server.start()
        await self.probe_once()
        self._prober = asyncio.get_running_loop().create_task(self._probe_forever())
        log.info("adapter listening on port %d", self.port)
        return self.port

    def _bind(self) -> int:
        if self.tls.files is not None:
            credentials = server_credentials(self.tls.files)
            return bind(
                lambda address: self.server.add_secure_port(address, credentials),
                self.listen,
                fix=LISTEN_FIX,
            )
        self.tls.check_plaintext(self.listen, role="plaintext listen address")
        return bind(self.server.add_insecure_port, self.listen, fix=LISTEN_FIX)

    async def probe_once(self) -> bool:
        """Probe the provider and publish the result as the health status."""
        reachable = await self.adapter.probe()
        if reachable != self.provider_reachable:
            log.info("provider %s", "reachable" if reachable else "unreachable")
        self.provider_reachable = reachable
        status = _SERVING if reachable else _NOT_SERVING
        for service in ("", ADAPTER_SERVICE):
            await self.health.set(service, status)
        return reachable

    async def _probe_forever(self) -> None:
        while True:
            # Retry sooner while unreachable so readiness follows the provider quickly.
            wait = self.probe_interval if self.provider_reachable else min(1.0, self.probe_interval)
            await asyncio.sleep(wait)
            try:
                await self.probe_once()
            except Exception:  # the prober must survive anything
                log.exception("health probe failed")

    async def stop(self) -> None:
        """Graceful shutdown; safe to call more than once."""
        if self._stopping:
            await self._stopped.wait()
            return
        self._stopping = True
        await self.health.enter_graceful_shutdown()
        if self._prober is not None:
            self._prober.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._prober
        await self.server.stop(self.grace)
        if self._health_server is not None:
            await self._health_server.stop(0)
        await self.adapter.aclose()
        self._stopped.set()

    async def wait(self) -> None:
        """Until `stop` completes."""
        await self._stopped.wait()


def write_port_file(path: Path, port: int) -> None:
    """Write `port` so readers never see a partial file."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(f"{port}\n", encoding="utf-8")
    os.replace(tmp, path)


async def serve(
    adapter: ProviderAdapter,
    listen: str,
    *,
    port_file: Path | None = None,
    probe_interval_seconds: float = 10.0,
    shutdown_grace_seconds: float = 10.0,
    metrics_listen: str = "",
    tls: TlsSettings | None = None,
    health_listen: str = "",
) -> None:
    """Run until SIGTERM/SIGINT (a second signal exits immediately); with `metrics_listen`, the
    sidecar's /metrics is served there; `tls` and `health_listen` as in `SidecarServer`."""
    # HttpAdapter's provider name (the control plane's label) and its one provider client.
    metrics = SidecarMetrics(str(getattr(adapter, "provider", "") or adapter.describe().adapter))
    client = getattr(adapter, "client", None)
    if isinstance(client, httpx.AsyncClient):
        metrics.instrument(client)
    exporter = serve_metrics(metrics.registry, metrics_listen) if metrics_listen else None
    server = SidecarServer(
        adapter,
        listen,
        probe_interval_seconds=probe_interval_seconds,
        shutdown_grace_seconds=shutdown_grace_seconds,
        metrics=metrics,
        tls=tls,
        health_listen=health_listen,
    )
    loop = asyncio.get_running_loop()
    signals = 0
    stopper: asyncio.Task[None] | None = None

    def on_signal(signum: int) -> None:
        nonlocal signals, stopper
        signals += 1
        if signals > 1:
            log.warning("second signal %d: exiting now", signum)
            os._exit(128 + signum)
        log.info("signal %d: shutting down (grace %.0fs)", signum, shutdown_grace_seconds)
        stopper = loop.create_task(server.stop())

    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, on_signal, signum)
    port = await server.start()
    if port_file is not None:
        write_port_file(port_file, port)
    await server.wait()
    if stopper is not None:
        await stopper
    if exporter is not None:
        await exporter.stop()
