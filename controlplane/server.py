"""The control plane's gRPC server: scheduler API, health, reflection, graceful shutdown.

Every SchedulerService call is authenticated first (`controlplane.api.auth`: bearer tokens;
health and reflection stay open), then domain errors are mapped to statuses.

Health reflects dependencies: the scheduler service reports SERVING only while its database
answers and its capability catalog is ready (the probe says both; re-checked every few seconds,
five times as often while not serving, so readiness follows a finished start quickly).
On SIGTERM/SIGINT the server enters graceful shutdown (health NOT_SERVING for every service),
stops accepting, drains in-flight RPCs for `grace` seconds, then runs the cleanup callbacks
(closing the database engine and Redis). A second signal exits at once. Shutdown is idempotent.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from controlplane.api.auth import Authenticator, AuthInterceptor
from controlplane.api.servicer import SchedulerServicer
from controlplane.startup import LISTEN_FIX
from vidroute.scheduler.v1 import (
    account_service_pb2,
    account_service_pb2_grpc,
    billing_service_pb2,
    billing_service_pb2_grpc,
    routing_service_pb2,
    routing_service_pb2_grpc,
    scheduler_service_pb2,
    scheduler_service_pb2_grpc,
    tenant_service_pb2,
    tenant_service_pb2_grpc,
)
from vidroute_core.wire.listen import SERVER_OPTIONS, bind
from vidroute_core.wire.status import DomainErrorInterceptor

log = logging.getLogger(__name__)

SCHEDULER_SERVICE = scheduler_service_pb2.DESCRIPTOR.services_by_name["SchedulerService"].full_name
BILLING_SERVICE = billing_service_pb2.DESCRIPTOR.services_by_name["BillingService"].full_name
ROUTING_SERVICE = routing_service_pb2.DESCRIPTOR.services_by_name["RoutingService"].full_name
TENANT_SERVICE = tenant_service_pb2.DESCRIPTOR.services_by_name["TenantService"].full_name
ACCOUNT_SERVICE = account_service_pb2.DESCRIPTOR.services_by_name["AccountService"].full_name
# Health service names: "", SCHEDULER_SERVICE and BILLING_SERVICE follow the database
# (readiness); "liveness" only says the process serves, so a database outage never gets pods
# restarted in a loop.
LIVENESS_SERVICE = "liveness"


@dataclass
class ControlPlaneServer:
    """A started server and what it takes to stop it."""

    server: grpc.aio.Server
    health: health.aio.HealthServicer
    port: int
    probe: Callable[[], Awaitable[bool]]
    cleanup: Sequence[Callable[[], Awaitable[None]]] = ()
    probe_interval: float = 5.0
    # Further API services whose health follows the same probe (BillingService, RoutingService,
    # TenantService, AccountService).
    services: Sequence[str] = ()
    # Per-adapter health service names -> reachable? (`scheduling.reachability`), probed with
    # the rest; they do not move the control plane's own readiness.
    adapter_probe: Callable[[], Awaitable[Mapping[str, bool]]] | None = None
    _stopping: bool = field(default=False, init=False)
    _healthy: bool = field(default=False, init=False)
    _probe_task: asyncio.Task[None] | None = field(default=None, init=False)

    async def refresh_health(self) -> bool:
        """Probe the dependencies once and publish the result."""
        try:
            healthy = await self.probe()
        except Exception:  # a failing probe means NOT_SERVING, never a crash
            log.warning("dependency probe failed", exc_info=True)
            healthy = False
        self._healthy = healthy
        status = (
            health_pb2.HealthCheckResponse.SERVING
            if healthy
            else health_pb2.HealthCheckResponse.NOT_SERVING
        )
        if not self._stopping:
            for name in (SCHEDULER_SERVICE, *self.services, ""):
                await self.health.set(name, status)
            await self._refresh_adapters()
        return healthy

    async def _refresh_adapters(self) -> None:
        if self.adapter_probe is None:
            return
        try:
            reachable = await self.adapter_probe()
        except Exception:  # a failing probe leaves the last statuses; logged, never a crash
            log.warning("adapter probe failed", exc_info=True)
            return
        for name, ok in reachable.items():
            if not self._stopping:
                serving = health_pb2.HealthCheckResponse.SERVING
                await self.health.set(
                    name, serving if ok else health_pb2.HealthCheckResponse.NOT_SERVING
                )

    async def _probe_loop(self) -> None:
        while not self._stopping:
            # A ratio, not a second duration: it scales with the configured interval.
            await asyncio.sleep(self.probe_interval / (1 if self._healthy else 5))
            await self.refresh_health()

    def start_probing(self) -> None:
        self._probe_task = asyncio.get_running_loop().create_task(self._probe_loop())

    async def stop(self, grace: float = 5.0) -> None:
        """Graceful, idempotent shutdown."""
        if self._stopping:
            return
        self._stopping = True
        if self._probe_task is not None:
            self._probe_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._probe_task
        await self.health.enter_graceful_shutdown()
        await self.server.stop(grace)
        for close in self.cleanup:
            try:
                await close()
            except Exception:
                log.warning("cleanup step failed", exc_info=True)


async def start_server(
    servicer: SchedulerServicer,
    *,
    listen: str,
    probe: Callable[[], Awaitable[bool]],
    cleanup: Sequence[Callable[[], Awaitable[None]]] = (),
    probe_interval: float = 5.0,
    auth: Authenticator | None = None,
    interceptors: Sequence[grpc.aio.ServerInterceptor] = (),
    billing: billing_service_pb2_grpc.BillingServiceServicer | None = None,
    routing: routing_service_pb2_grpc.RoutingServiceServicer | None = None,
    adapter_probe: Callable[[], Awaitable[Mapping[str, bool]]] | None = None,
    tenants: tenant_service_pb2_grpc.TenantServiceServicer | None = None,
    accounts: account_service_pb2_grpc.AccountServiceServicer | None = None,
) -> ControlPlaneServer:
    """Bind, register services and start serving; returns once the port is open.

    Without an `auth` holding tokens every caller is an admin: said loudly, once, at start."""
    auth = auth or Authenticator()
    if not auth.enabled:
        log.warning(
            "AUTHENTICATION IS OFF: no API tokens configured, every caller of %s is an admin "
            "of every tenant (set VIDROUTE_AUTH_TOKENS or VIDROUTE_AUTH_FILE)",
            listen,
        )
    # The first interceptor is the outermost: an unauthenticated call never reaches a handler.
    # `interceptors` (the metrics) wrap even that, so they count the code the caller sees.
    # Without SO_REUSEPORT: a port another server holds is an error (`PortInUse`), not shared.
    server = grpc.aio.server(
        interceptors=[*interceptors, AuthInterceptor(auth), DomainErrorInterceptor()],
        options=SERVER_OPTIONS,
    )
    scheduler_service_pb2_grpc.add_SchedulerServiceServicer_to_server(servicer, server)
    served = [SCHEDULER_SERVICE]
    if billing is not None:  # the money API (controlplane.api.billing_servicer)
        billing_service_pb2_grpc.add_BillingServiceServicer_to_server(billing, server)
        served.append(BILLING_SERVICE)
    if routing is not None:  # the decisions API (controlplane.api.routing_servicer)
        routing_service_pb2_grpc.add_RoutingServiceServicer_to_server(routing, server)
        served.append(ROUTING_SERVICE)
    if tenants is not None:  # tenants as configuration (controlplane.api.tenant_servicer)
        tenant_service_pb2_grpc.add_TenantServiceServicer_to_server(tenants, server)
        served.append(TENANT_SERVICE)
    if accounts is not None:  # accounts as configuration (controlplane.api.account_servicer)
        account_service_pb2_grpc.add_AccountServiceServicer_to_server(accounts, server)
        served.append(ACCOUNT_SERVICE)
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    reflection.enable_server_reflection(
        (*served, health.SERVICE_NAME, reflection.SERVICE_NAME), server
    )
    port = bind(server.add_insecure_port, listen, fix=LISTEN_FIX)
    await server.start()
    running = ControlPlaneServer(
        server=server,
        health=health_servicer,
        port=port,
        probe=probe,
        cleanup=cleanup,
        probe_interval=probe_interval,
        services=tuple(served[1:]),
        adapter_probe=adapter_probe,
    )
    await health_servicer.set(LIVENESS_SERVICE, health_pb2.HealthCheckResponse.SERVING)
    await running.refresh_health()
    running.start_probing()
    return running


async def serve_until_signalled(running: ControlPlaneServer, grace: float = 5.0) -> None:
    """Block until SIGTERM/SIGINT, then shut down gracefully; a second signal exits at once."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()

    def on_signal() -> None:
        if stop.is_set():
            log.warning("second signal: exiting immediately")
            os._exit(1)
        stop.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal)
    await stop.wait()
    log.info("shutting down")
    await running.stop(grace)
