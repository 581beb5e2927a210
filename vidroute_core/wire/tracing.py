"""Tracing at the transport edge: gRPC server and client interceptors, the httpx hook.

All three are empty (no interceptor, no hook) while `vidroute_core.tracing` has no provider
installed, so a process without the OTEL_* variables runs exactly as before. Build servers and
clients after `configure_tracing`. Which hop continues which is `vidroute_core.tracing`'s
docstring.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import grpc
from opentelemetry import propagate, trace

from vidroute_core import tracing

if TYPE_CHECKING:
    import httpx

__all__ = ["UNTRACED_SERVICES", "client_interceptors", "instrument_httpx", "server_interceptors"]

# Probes and reflection every few seconds are noise, not work: no span for them.
UNTRACED_SERVICES = frozenset({"grpc.health.v1.Health", "grpc.reflection.v1alpha.ServerReflection"})

_SERVER_ERRORS = frozenset(
    {
        grpc.StatusCode.UNKNOWN,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.UNIMPLEMENTED,
        grpc.StatusCode.INTERNAL,
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.DATA_LOSS,
    }
)


def _finish(span: trace.Span, context: Any, failed: bool) -> None:
    """The call's status code on its span; ERROR for the codes that mean the server failed."""
    code = context.code() if hasattr(context, "code") else None
    if not isinstance(code, grpc.StatusCode):
        code = grpc.StatusCode.UNKNOWN if failed else grpc.StatusCode.OK
    span.set_attribute("rpc.grpc.status_code", code.value[0])
    if code in _SERVER_ERRORS:
        span.set_status(trace.Status(trace.StatusCode.ERROR, code.name))


class _ServerSpans(grpc.aio.ServerInterceptor):
    """One SERVER span per unary or server-streaming call, continuing the caller's context.

    Our own, not opentelemetry-instrumentation-grpc's aio server interceptor: that one iterates
    every server-streaming handler with ``async for``, and ours include coroutines that write
    with ``context.write`` (grpc_health's Watch, `DomainErrorInterceptor`'s stream wrapper)."""

    def __init__(self, tracer: trace.Tracer) -> None:
        self._tracer = tracer

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[Any]],
        details: grpc.HandlerCallDetails,
    ) -> Any:
        handler = await continuation(details)
        method = str(details.method or "")
        service, _, rpc = method.lstrip("/").partition("/")
        if handler is None or service in UNTRACED_SERVICES:
            return handler
        attributes = {"rpc.system": "grpc", "rpc.service": service, "rpc.method": rpc}
        spans = self._tracer

        def start(context: Any) -> Any:
            parent = propagate.extract(dict(context.invocation_metadata() or ()))
            return spans.start_as_current_span(
                method,
                context=parent,
                kind=trace.SpanKind.SERVER,
                attributes=attributes,
                record_exception=False,
                set_status_on_exception=False,
            )

        if handler.unary_unary is not None:
            inner_unary = handler.unary_unary

            async def unary(request: Any, context: Any) -> Any:
                with start(context) as span:
                    failed = True
                    try:
                        reply = await inner_unary(request, context)
                        failed = False
                        return reply
                    finally:
                        _finish(span, context, failed)

            return grpc.unary_unary_rpc_method_handler(
                unary,
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
        if handler.unary_stream is not None:
            inner_stream = handler.unary_stream

            async def stream(request: Any, context: Any) -> None:
                with start(context) as span:
                    failed = True
                    try:
                        produced = inner_stream(request, context)
                        if inspect.isawaitable(produced):
                            await produced
                        else:
                            async for item in produced:
                                await context.write(item)
                        failed = False
                    finally:
                        _finish(span, context, failed)

            return grpc.unary_stream_rpc_method_handler(
                stream,
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
        return handler  # client- and bidi-streaming: none of ours


def server_interceptors() -> list[grpc.aio.ServerInterceptor]:
    """The tracing interceptor, to put first (outermost) on a server; [] when tracing is off."""
    provider = tracing.provider()
    if provider is None:
        return []
    return [_ServerSpans(provider.get_tracer("vidroute.grpc.server"))]


def client_interceptors() -> list[grpc.aio.ClientInterceptor]:
    """CLIENT spans and traceparent injection for a channel; [] when tracing is off."""
    provider = tracing.provider()
    if provider is None:
        return []
    from opentelemetry.instrumentation.grpc import aio_client_interceptors

    interceptors: list[grpc.aio.ClientInterceptor] = aio_client_interceptors(  # type: ignore[no-untyped-call]  # the factory ships without annotations
        tracer_provider=provider
    )
    return interceptors


_URL_ATTRIBUTES = ("url.full", "http.url")


async def _redact_url(span: trace.Span, request: Any) -> None:
    """The URL attribute without query or credentials (signed URLs carry them in the query)."""
    url = request[1] if isinstance(request, tuple) else getattr(request, "url", None)
    if url is None or not span.is_recording():
        return
    import httpx

    bare = httpx.URL(str(url)).copy_with(query=None, fragment=None, username=None, password=None)
    recorded = getattr(span, "attributes", None) or {}
    for key in _URL_ATTRIBUTES:
        if key in recorded:
            span.set_attribute(key, str(bare))


def instrument_httpx(client: httpx.AsyncClient) -> None:
    """CLIENT spans and a traceparent header on every request of `client`; nothing when off."""
    provider = tracing.provider()
    if provider is None:
        return
    from opentelemetry.instrumentation.httpx import HTTPXClientInstrumentor

    HTTPXClientInstrumentor.instrument_client(
        client, tracer_provider=provider, request_hook=_redact_url
    )
