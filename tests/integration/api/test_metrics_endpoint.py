"""The /metrics endpoint and the gRPC server metrics over real sockets (localhost only).

Lease state is read from the store when Prometheus scrapes, on the HTTP server's thread, so a
scrape always shows the store as it is; the gRPC interceptor counts the code the client sees
(OK, an abort's code, CANCELLED for a stream the client dropped).
"""

from __future__ import annotations

import asyncio

import grpc
import httpx
import pytest
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from prometheus_client.parser import text_string_to_metric_families

from controlplane.leases.base import Dimension, LeaseRequest
from controlplane.leases.memory_store import MemoryLeaseStore
from controlplane.metrics import ControlPlaneMetrics, StateSources, lease_gauges
from vidroute_core.metrics_http import serve_metrics


@pytest.mark.asyncio
async def test_lease_state_is_read_at_scrape_time_over_http() -> None:

    store = MemoryLeaseStore()
    dims = (Dimension("account", 4), Dimension("model:gen4", 2))
    lease = await store.acquire(LeaseRequest("1-1-ab", "runway:acct", dims))
    assert lease is not None
    sources = StateSources(loop=asyncio.get_running_loop(), leases=lambda: lease_gauges(store))
    m = ControlPlaneMetrics(state=sources)
    server = serve_metrics(m.registry, "127.0.0.1:0")
    try:

        async def scrape() -> dict[str, float]:
            async with httpx.AsyncClient() as client:
                text = (await client.get(f"http://127.0.0.1:{server.port}/metrics")).text
            return {
                s.name: s.value
                for f in text_string_to_metric_families(text)
                for s in f.samples
                if s.labels.get("provider") == "runway"
            }

        first = await scrape()
        assert first["provider_capacity_slots"] == 2
        assert first["provider_active_leases"] == 1
        assert first["provider_unknown_submission_slots"] == 0
        assert await store.mark_unknown(lease, 2)
        second = await scrape()
        assert second["provider_unknown_submission_slots"] == 1
        await store.release(lease)
        assert (await scrape())["provider_active_leases"] == 0
    finally:
        await server.stop()


@pytest.mark.asyncio
async def test_rpcs_are_counted_by_method_and_final_code() -> None:
    metrics = ControlPlaneMetrics()
    server = grpc.aio.server(interceptors=[metrics.interceptor()])
    servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    await servicer.set("known", health_pb2.HealthCheckResponse.SERVING)
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            await stub.Check(health_pb2.HealthCheckRequest(service="known"))
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await stub.Check(health_pb2.HealthCheckRequest(service="unknown"))
            assert refused.value.code() is grpc.StatusCode.NOT_FOUND
            watch = stub.Watch(health_pb2.HealthCheckRequest(service="known"))
            await watch.read()
            watch.cancel()
            await asyncio.sleep(0.2)  # the server side notices the cancellation
    finally:
        await server.stop(0)
    handled = metrics.rpc_handled
    svc = "grpc.health.v1.Health"
    assert handled.labels(svc, "Check", "OK")._value.get() == 1
    assert handled.labels(svc, "Check", "NOT_FOUND")._value.get() == 1
    assert handled.labels(svc, "Watch", "CANCELLED")._value.get() == 1
    [latency] = metrics.rpc_latency.collect()
    counts = {
        s.labels["grpc_method"]: s.value for s in latency.samples if s.name.endswith("_count")
    }
    assert counts == {"Check": 2, "Watch": 1}
