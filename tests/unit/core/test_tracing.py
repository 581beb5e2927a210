"""Tracing in the kernel (`vidroute_core.tracing`): nothing installed without the OTEL_*
variables, the W3C context carried across a stored traceparent, the id chain on spans, trace
ids in the JSON log lines, and an INTERNAL logged once with the id the client is given."""

from __future__ import annotations

import asyncio
import io
import json
import logging
import threading
from collections.abc import Iterator
from typing import Any

import grpc
import pytest
from google.rpc import error_details_pb2, status_pb2
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from vidroute_core import tracing
from vidroute_core.exceptions import InvalidSpec
from vidroute_core.logs import add_ids, bind_ids, configure_logging
from vidroute_core.validation import FieldViolation
from vidroute_core.wire import tracing as tracing_edge
from vidroute_core.wire.status import DomainErrorInterceptor

TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    """An SDK provider exporting synchronously to memory, installed for the test."""
    assert not tracing.enabled(), "another test left tracing installed"
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.install(provider)
    try:
        yield exporter
    finally:
        tracing.uninstall()
        provider.shutdown()


@pytest.fixture
def captured() -> Iterator[io.StringIO]:
    """The root logger configured in JSON on a buffer; restored afterwards."""
    root = logging.getLogger()
    level, before = root.level, list(root.handlers)
    out = io.StringIO()
    configure_logging("DEBUG", "json", out)
    try:
        yield out
    finally:
        for handler in list(root.handlers):
            if handler not in before:
                root.removeHandler(handler)
        root.setLevel(level)


def _lines(out: io.StringIO) -> list[dict[str, Any]]:
    """Our own lines: a library thread left by an earlier test in this process (aiosqlite's
    worker logs at DEBUG) may write to the root handler at any moment."""
    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    return [line for line in lines if not str(line.get("logger", "")).startswith("aiosqlite")]


@pytest.mark.parametrize(
    "env",
    [
        {},
        {"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"},
        {"OTEL_SDK_DISABLED": "true", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"},
        {"OTEL_SERVICE_NAME": "x", "OTEL_RESOURCE_ATTRIBUTES": "a=b"},  # no exporter named
    ],
)
def test_without_an_exporter_nothing_is_installed(env: dict[str, str]) -> None:
    """Unset (or switched off) OTEL_* variables install no provider, start no thread and give
    servers, channels and httpx clients no hook; spans asked for are no-ops."""
    threads = {t.ident for t in threading.enumerate()}
    assert tracing.configure_tracing("vidroute-test", env) is False
    assert not tracing.enabled()
    assert tracing.provider() is None
    assert tracing_edge.server_interceptors() == []
    assert tracing_edge.client_interceptors() == []
    assert {t.ident for t in threading.enumerate()} == threads
    with tracing.continue_trace("dispatch", TRACEPARENT):
        assert not trace.get_current_span().get_span_context().is_valid
        assert tracing.current_traceparent() is None
        assert tracing.carrier() == {}


def test_an_unknown_exporter_is_a_configuration_error() -> None:
    """An exporter this process does not have fails the start instead of tracing nothing."""
    with pytest.raises(tracing.TracingConfigError, match="zipkin"):
        tracing.configure_tracing("vidroute-test", {"OTEL_TRACES_EXPORTER": "zipkin"})
    with pytest.raises(tracing.TracingConfigError, match="protocol"):
        tracing.configure_tracing(
            "vidroute-test",
            {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://x", "OTEL_EXPORTER_OTLP_PROTOCOL": "thrift"},
        )
    assert not tracing.enabled()


def test_a_stored_traceparent_is_continued_as_the_parent(spans: InMemorySpanExporter) -> None:
    """`continue_trace` makes its span the child of the stored traceparent (same trace id) and
    hands its own traceparent on for the next hop."""
    with tracing.continue_trace("dispatch", TRACEPARENT):
        handed_on = tracing.carrier()
        current = trace.get_current_span().get_span_context()
    [span] = spans.get_finished_spans()
    assert span.name == "dispatch"
    assert span.parent is not None
    assert span.parent.span_id == int("00f067aa0ba902b7", 16)
    assert span.context.trace_id == int("4bf92f3577b34da6a3ce929d0e0e4736", 16)
    assert handed_on == {
        "traceparent": f"00-{trace.format_trace_id(current.trace_id)}-"
        f"{trace.format_span_id(current.span_id)}-01"
    }


@pytest.mark.parametrize("stored", [None, "", "not-a-traceparent", 42])
def test_a_missing_or_malformed_traceparent_starts_a_new_trace(
    spans: InMemorySpanExporter, stored: object
) -> None:
    """A task created without tracing (or a damaged column) gets a root span, never an error."""
    with tracing.continue_trace("submit", stored):
        pass
    [span] = spans.get_finished_spans()
    assert span.parent is None
    assert span.context.is_valid


def test_bound_ids_become_span_attributes(spans: InMemorySpanExporter) -> None:
    """Ids bound before the span starts, bound inside it and added later all land on it; the
    ids keep their log names and types."""
    with (
        bind_ids(task_id=7),
        tracing.continue_trace("submit", None),
        bind_ids(attempt_id=11, client_request_key="7-1-abc"),
    ):
        add_ids(provider_job_id="job-1", provider_request_id=None)
    [span] = spans.get_finished_spans()
    assert dict(span.attributes or {}) == {
        "task_id": 7,
        "attempt_id": 11,
        "client_request_key": "7-1-abc",
        "provider_job_id": "job-1",
    }


def test_json_lines_carry_the_trace_and_span_id(
    spans: InMemorySpanExporter, captured: io.StringIO
) -> None:
    """A line logged inside a span names its trace and span; one outside names neither."""
    log = logging.getLogger("vidroute.test")
    with tracing.continue_trace("dispatch", TRACEPARENT):
        log.info("inside")
        context = trace.get_current_span().get_span_context()
    log.info("outside")
    inside, outside = _lines(captured)
    assert inside["trace_id"] == "4bf92f3577b34da6a3ce929d0e0e4736"
    assert inside["span_id"] == trace.format_span_id(context.span_id)
    assert "trace_id" not in outside
    assert "span_id" not in outside


class _Aborted(Exception):
    """What the fake context raises from abort_with_status (grpc raises AbortError)."""


class _Context:
    def __init__(self) -> None:
        self.status: grpc.Status | None = None

    async def abort_with_status(self, status: grpc.Status) -> None:
        self.status = status
        raise _Aborted


async def _call(handler_fn: Any, context: _Context) -> None:
    async def continuation(_details: Any) -> grpc.RpcMethodHandler[Any, Any]:
        return grpc.unary_unary_rpc_method_handler(handler_fn)

    class Details(grpc.HandlerCallDetails):
        method = "/vidroute.test.v1.Test/Boom"
        invocation_metadata = ()

    wrapped = await DomainErrorInterceptor().intercept_service(continuation, Details())
    with pytest.raises(_Aborted):
        await wrapped.unary_unary(object(), context)


def _request_info(status: grpc.Status) -> error_details_pb2.RequestInfo:
    """The RequestInfo detail, read from the trailer as a client reads it."""
    raw = dict(status.trailing_metadata)["grpc-status-details-bin"]
    details = status_pb2.Status.FromString(raw)
    info = error_details_pb2.RequestInfo()
    [packed] = details.details
    assert packed.Unpack(info)
    return info


def test_an_internal_error_is_logged_once_with_the_trace_id_the_client_gets(
    spans: InMemorySpanExporter, captured: io.StringIO
) -> None:
    """A real bug inside a traced call: one ERROR line with the traceback and the trace id, and
    the client's INTERNAL names the same trace id (message and RequestInfo), never the bug."""

    async def boom(_request: Any, _context: Any) -> None:
        raise KeyError("secret detail of the bug")

    context = _Context()
    with tracing.continue_trace("call", TRACEPARENT):
        asyncio.run(_call(boom, context))
    trace_id = "4bf92f3577b34da6a3ce929d0e0e4736"
    errors = [line for line in _lines(captured) if line["level"] == "ERROR"]
    assert len(errors) == 1
    assert errors[0]["trace_id"] == trace_id
    assert "KeyError" in errors[0]["exc"]
    assert context.status is not None
    assert context.status.code is grpc.StatusCode.INTERNAL
    assert trace_id in context.status.details
    assert "secret detail" not in context.status.details
    assert _request_info(context.status).request_id == trace_id


def test_an_internal_error_without_tracing_gets_an_error_id(captured: io.StringIO) -> None:
    """Tracing off: the line and the client's status share a fresh error id instead."""

    async def boom(_request: Any, _context: Any) -> None:
        raise RuntimeError("bug")

    context = _Context()
    asyncio.run(_call(boom, context))
    [error] = [line for line in _lines(captured) if line["level"] == "ERROR"]
    assert "trace_id" not in error
    assert context.status is not None
    ref = _request_info(context.status).request_id
    assert len(ref) == 32
    assert error["error_id"] == ref
    assert ref in context.status.details


def test_a_domain_error_is_not_logged_as_internal(captured: io.StringIO) -> None:
    """Bad input is INVALID_ARGUMENT and no ERROR line: only real bugs are logged."""

    async def bad(_request: Any, _context: Any) -> None:
        raise InvalidSpec([FieldViolation("spec.prompt", "is required")])

    context = _Context()
    asyncio.run(_call(bad, context))
    assert context.status is not None
    assert context.status.code is grpc.StatusCode.INVALID_ARGUMENT
    assert not [line for line in _lines(captured) if line["level"] == "ERROR"]
