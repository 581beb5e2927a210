"""OpenTelemetry traces for every vidroute process: one trace from CreateTask to the provider's
HTTP request, with the id chain of design 9.24 as span attributes.

Each composition root calls `configure_tracing(service_name, env)` once at start, before it
builds servers and clients. With none of the standard variables set nothing is installed: no
tracer provider, no exporter, no export thread, no interceptor, no httpx hook. They are:

* ``OTEL_TRACES_EXPORTER``: ``otlp`` and/or ``console`` (comma-separated), ``none``: off. Unset,
  ``otlp`` when an endpoint is set;
* ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` / ``OTEL_EXPORTER_OTLP_ENDPOINT``: the collector;
* ``OTEL_EXPORTER_OTLP_TRACES_PROTOCOL`` / ``OTEL_EXPORTER_OTLP_PROTOCOL``: ``http/protobuf``
  (default, as the specification says) or ``grpc``;
* ``OTEL_SDK_DISABLED=true``: off whatever else is set; ``OTEL_SERVICE_NAME`` renames the service.

The SDK itself reads the rest (headers, timeout, sampler, resource attributes). The provider is
this module's, not the OpenTelemetry global: tests install one of their own (`install`) and
remove it again (`uninstall`), which the once-only global would not allow.

How the hops join into one trace (the transport hooks are `vidroute_core.wire.tracing`'s):

* gRPC servers (the control plane's API, every sidecar): `server_interceptors` continues the
  caller's W3C context from the metadata with one SERVER span per call. Our own interceptor, not
  opentelemetry-instrumentation-grpc's aio server interceptor: that one iterates every
  server-streaming handler with ``async for``, and ours include coroutines that write with
  ``context.write`` (grpc_health's Watch, the error interceptor's stream wrapper).
* The control plane's gRPC client to the sidecars: opentelemetry-instrumentation-grpc's aio
  client interceptors (`client_interceptors`) inject ``traceparent`` into the metadata.
* httpx (a sidecar's provider client, the control plane's output downloads):
  opentelemetry-instrumentation-httpx on the one client (`instrument_httpx`), ``traceparent``
  header on the wire; the URL attribute loses its query (signed URLs carry credentials there).
* Across the database: CreateTask stores `current_traceparent()` with the task; the dispatcher
  continues it (`continue_trace`) and writes its own traceparent into the ``attempt.submit``
  message, which the submit worker continues. Parent, not link: the dispatch and the submit of a
  task are caused by that one task (one message, one unit of work, never a batch), so a trace
  backend shows the task whole, CreateTask to the provider call, under one trace id; links would
  start a new trace per hop for an operator to chase. A dispatch round is no span: it would
  merge the traces of unrelated tasks.

Ids: `vidroute_core.logs.bind_ids` / `add_ids` set the ids they bind as attributes of the current
span too (plain names, ``task_id``, the same keys as the JSON log lines), so every place that
binds ids for its log lines annotates its span. Never the prompt, credentials or signed URLs.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING

from opentelemetry import trace
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from vidroute_core.logs import span_attributes

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SpanExporter

__all__ = [
    "TracingConfigError",
    "carrier",
    "configure_tracing",
    "continue_trace",
    "current_trace_id",
    "current_traceparent",
    "enabled",
    "install",
    "provider",
    "tracer",
    "uninstall",
]

log = logging.getLogger(__name__)

_TRACEPARENT = "traceparent"
_W3C = TraceContextTextMapPropagator()
_provider: TracerProvider | None = None


class TracingConfigError(ValueError):
    """The OTEL_* variables ask for something this process cannot do."""


def _exporters(env: Mapping[str, str]) -> list[SpanExporter]:
    """The span exporters the standard variables ask for (module docstring); [] for none."""
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return []
    names = [n.strip().lower() for n in env.get("OTEL_TRACES_EXPORTER", "").split(",")]
    names = [n for n in names if n]
    signal_endpoint = env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "").strip()
    base_endpoint = env.get("OTEL_EXPORTER_OTLP_ENDPOINT", "").strip()
    if not names:
        names = ["otlp"] if signal_endpoint or base_endpoint else []
    if "none" in names:
        return []
    exporters: list[SpanExporter] = []
    for name in names:
        if name == "console":
            from opentelemetry.sdk.trace.export import ConsoleSpanExporter

            exporters.append(ConsoleSpanExporter())
        elif name == "otlp":
            exporters.append(_otlp(env, signal_endpoint, base_endpoint))
        else:
            raise TracingConfigError(f"OTEL_TRACES_EXPORTER: unsupported exporter {name!r}")
    return exporters


def _otlp(env: Mapping[str, str], signal_endpoint: str, base_endpoint: str) -> SpanExporter:
    protocol = (
        env.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
        or env.get("OTEL_EXPORTER_OTLP_PROTOCOL")
        or "http/protobuf"
    ).strip()
    if protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (
            OTLPSpanExporter as GrpcExporter,
        )

        return GrpcExporter(endpoint=signal_endpoint or base_endpoint or None)
    if protocol == "http/protobuf":
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
            OTLPSpanExporter as HttpExporter,
        )

        # The base endpoint gets the signal's path appended; the signal endpoint is used as is.
        endpoint = signal_endpoint or (
            f"{base_endpoint.rstrip('/')}/v1/traces" if base_endpoint else None
        )
        return HttpExporter(endpoint=endpoint)
    raise TracingConfigError(f"OTLP protocol {protocol!r}: use http/protobuf or grpc")


def configure_tracing(service_name: str, env: Mapping[str, str]) -> bool:
    """Install tracing as `env` asks (module docstring); True when spans are recorded.

    Idempotent: a provider already installed (an earlier call, or a test's) is kept."""
    if _provider is not None:
        return True
    exporters = _exporters(env)
    if not exporters:
        return False
    from opentelemetry.sdk.resources import SERVICE_NAME, Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    name = env.get("OTEL_SERVICE_NAME", "").strip() or service_name
    provider = TracerProvider(resource=Resource.create({SERVICE_NAME: name}))
    for exporter in exporters:
        provider.add_span_processor(BatchSpanProcessor(exporter))
    install(provider)
    log.info("tracing on: service %s, exporters %s", name, [type(e).__name__ for e in exporters])
    return True


def install(provider: TracerProvider) -> None:
    """Record spans with `provider` from now on (servers and clients built afterwards)."""
    global _provider  # noqa: PLW0603 - the process's one tracing switch
    _provider = provider


def uninstall() -> TracerProvider | None:
    """Stop recording (tests); returns the provider, which the caller shuts down."""
    global _provider
    old, _provider = _provider, None
    return old


def enabled() -> bool:
    """Whether spans are recorded in this process."""
    return _provider is not None


def provider() -> TracerProvider | None:
    """The installed provider (None when tracing is off)."""
    return _provider


def tracer() -> trace.Tracer:
    """The tracer of vidroute's own spans (a no-op one when tracing is off)."""
    if _provider is None:
        return trace.NoOpTracer()
    return _provider.get_tracer("vidroute")


# ---- context across the database ----------------------------------------------------------


def current_traceparent() -> str | None:
    """The W3C traceparent of the current span, to store with work that continues later."""
    if not trace.get_current_span().get_span_context().is_valid:
        return None
    headers: dict[str, str] = {}
    _W3C.inject(headers)
    return headers.get(_TRACEPARENT)


def carrier() -> dict[str, str]:
    """``{"traceparent": ...}`` for a message payload, or {} outside a span."""
    parent = current_traceparent()
    return {_TRACEPARENT: parent} if parent else {}


def current_trace_id() -> str | None:
    """The current trace id in hex (32 digits), or None outside a valid span."""
    context = trace.get_current_span().get_span_context()
    return trace.format_trace_id(context.trace_id) if context.is_valid else None


@contextlib.contextmanager
def continue_trace(name: str, traceparent: object = None) -> Iterator[None]:
    """A span `name` as the child of a stored `traceparent` (a new trace when there is none or
    it is malformed), current for the block; starts with the ids bound for the log lines.
    Nothing at all when tracing is off."""
    if _provider is None:
        yield
        return
    parent = _W3C.extract({_TRACEPARENT: traceparent} if isinstance(traceparent, str) else {})
    with tracer().start_as_current_span(
        name, context=parent, kind=trace.SpanKind.INTERNAL, attributes=span_attributes()
    ):
        yield


class OpenSpan:
    """A span started now and ended later, for work whose ids are known only after a batch's
    commit (the dispatcher's round); every method is a no-op when tracing is off."""

    __slots__ = ("_span",)

    def __init__(self, span: trace.Span | None) -> None:
        self._span = span

    @contextlib.contextmanager
    def current(self) -> Iterator[None]:
        """Make the span current for the block without ending it."""
        if self._span is None:
            yield
            return
        with trace.use_span(self._span, end_on_exit=False):
            yield

    def annotate(self, **ids: object) -> None:
        """Add id-chain attributes (None values skipped)."""
        given = {k: v for k, v in ids.items() if v is not None}
        if self._span is not None and given:
            self._span.set_attributes(span_attributes(given))

    def end(self) -> None:
        if self._span is not None:
            self._span.end()
            self._span = None


def open_span(name: str, traceparent: object = None) -> OpenSpan:
    """Like `continue_trace`, but the span stays open until `OpenSpan.end`."""
    if _provider is None:
        return OpenSpan(None)
    parent = _W3C.extract({_TRACEPARENT: traceparent} if isinstance(traceparent, str) else {})
    return OpenSpan(
        tracer().start_span(
            name, context=parent, kind=trace.SpanKind.INTERNAL, attributes=span_attributes()
        )
    )
