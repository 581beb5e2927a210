"""gRPC server metrics shared by every process that serves gRPC (the control plane, each sidecar).

`GrpcServerMetrics` registers three families on the registry it is given (each process keeps its
own, see `vidroute_core.metrics_http`), named as the Prometheus gRPC ecosystem names them
(go-grpc-prometheus, grpc-ecosystem), so the usual dashboards and error-ratio rules apply:

* ``grpc_server_started_total{grpc_service, grpc_method}``: RPCs a handler started;
* ``grpc_server_handled_total{grpc_service, grpc_method, grpc_code}``: RPCs completed, by the
  status the client sees;
* ``grpc_server_handling_seconds{grpc_service, grpc_method}``: their handling time.

Labels come from the method path and the status code only, both bounded by the proto: never a
request field, so never a task, job or attempt id (design 9.24).

Its `interceptor()` goes first in the server's list (outermost), so it counts the code the
client receives after every other interceptor (authentication, error mapping) has acted. An RPC
the server has no handler for is not counted (its method name is the caller's choice).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

import grpc
from prometheus_client import CollectorRegistry, Counter, Histogram

__all__ = ["RPC_BUCKETS", "GrpcServerMetrics"]

RPC_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
_CODE_NAMES = {code.value[0]: code.name for code in grpc.StatusCode}


class GrpcServerMetrics:
    """The gRPC server families of one process, and the interceptor that feeds them."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.started = Counter(
            "grpc_server_started",
            "RPCs started on the server",
            ["grpc_service", "grpc_method"],
            registry=registry,
        )
        self.handled = Counter(
            "grpc_server_handled",
            "RPCs completed on the server, by status code",
            ["grpc_service", "grpc_method", "grpc_code"],
            registry=registry,
        )
        self.handling = Histogram(
            "grpc_server_handling_seconds",
            "RPC handling time on the server",
            ["grpc_service", "grpc_method"],
            buckets=RPC_BUCKETS,
            registry=registry,
        )

    def interceptor(self) -> grpc.aio.ServerInterceptor:
        """Counts and times every RPC; put it first (outermost) in the server's interceptors."""
        return _Interceptor(self)


def split_method(method: str) -> tuple[str, str]:
    """``/pkg.Service/Method`` -> (``pkg.Service``, ``Method``)."""
    service, _, name = method.lstrip("/").rpartition("/")
    return service or "unknown", name or "unknown"


def _code_name(context: Any, default: grpc.StatusCode) -> str:
    """The status the handler set (abort or set_code), else `default`."""
    code = context.code()
    if code is None:
        return default.name
    if isinstance(code, grpc.StatusCode):
        return code.name
    return _CODE_NAMES.get(int(code), default.name)


class _Interceptor(grpc.aio.ServerInterceptor):
    def __init__(self, metrics: GrpcServerMetrics) -> None:
        self._m = metrics

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[Any]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> Any:
        handler = await continuation(handler_call_details)
        if handler is None:
            return None
        service, name = split_method(handler_call_details.method)
        m = self._m

        def begin() -> float:
            m.started.labels(service, name).inc()
            return time.perf_counter()

        def done(started: float, context: Any, default: grpc.StatusCode) -> None:
            m.handled.labels(service, name, _code_name(context, default)).inc()
            m.handling.labels(service, name).observe(time.perf_counter() - started)

        if handler.unary_unary is not None:
            inner = handler.unary_unary

            async def unary(request: Any, context: Any) -> Any:
                started, default = begin(), grpc.StatusCode.UNKNOWN
                try:
                    response = await inner(request, context)
                    default = grpc.StatusCode.OK
                    return response
                except asyncio.CancelledError:
                    default = grpc.StatusCode.CANCELLED
                    raise
                finally:
                    done(started, context, default)

            return grpc.unary_unary_rpc_method_handler(
                unary,
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
        if handler.unary_stream is not None:
            inner_stream = handler.unary_stream

            async def stream(request: Any, context: Any) -> None:
                started, default = begin(), grpc.StatusCode.UNKNOWN
                try:
                    # Written here, not re-yielded: the wrapper is a plain coroutine, so a
                    # handler that calls context.write itself works unchanged.
                    produced = inner_stream(request, context)
                    if hasattr(produced, "__aiter__"):
                        async for item in produced:
                            await context.write(item)
                    else:
                        await produced
                    default = grpc.StatusCode.OK
                except asyncio.CancelledError:
                    default = grpc.StatusCode.CANCELLED
                    raise
                finally:
                    done(started, context, default)

            return grpc.unary_stream_rpc_method_handler(
                stream,
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
        return handler  # client-streaming RPCs: none in vidroute's services
