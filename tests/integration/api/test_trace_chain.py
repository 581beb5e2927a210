"""One trace from CreateTask to the provider's HTTP request, through the real stack: the control
plane built by its composition root (PostgreSQL), a Runway sidecar on a real gRPC channel and
the Runway emulator over HTTP, all in this process so one in-memory exporter sees every hop.

The trace: CreateTask's SERVER span -> ``dispatch`` (continued from the traceparent stored with
the task) -> ``submit`` (continued from the attempt.submit message) -> the control plane's
Submit CLIENT span -> the sidecar's Submit SERVER span -> the sidecar's httpx CLIENT span to
the emulator, whose request carries the W3C traceparent of that span. The id chain (design
9.24) is on the spans; the prompt and signed URLs are on none. And OTLP export, when the
standard variables ask for it, reaches a collector (here a small HTTP receiver of the test).
"""

from __future__ import annotations

import asyncio
import http.server
import threading
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from adapter_sidecars.common.config import parse_config
from adapter_sidecars.common.server import SidecarServer
from adapter_sidecars.emulators import RunwayConfig, RunwayEmulator
from adapter_sidecars.emulators.http import Request
from adapter_sidecars.emulators.jobs import Job
from adapter_sidecars.runway.adapter import RunwayAdapter
from controlplane.bootstrap import Settings, start_control_plane
from controlplane.persistence.database import Database
from controlplane.persistence.records import TaskDetail
from controlplane.persistence.tasks import TaskQueries
from controlplane.server import SCHEDULER_SERVICE
from tests.support.stack import free_port, spec_for
from vidroute.scheduler.v1 import scheduler_service_pb2 as api
from vidroute.scheduler.v1 import scheduler_service_pb2_grpc as api_grpc
from vidroute_core import tracing
from vidroute_core.wire import tracing as tracing_edge

pytestmark = [pytest.mark.timeout(120), pytest.mark.postgres]

KEY = "key-trace"
PROMPT = "a lighthouse at dusk, traced"
CREATE = "/vidroute.scheduler.v1.SchedulerService/CreateTask"
SUBMIT = "/vidroute.adapter.v1.ProviderAdapterService/Submit"


async def eventually(check: Callable[[], Awaitable[Any]], deadline_s: float, what: str) -> Any:
    """Poll `check` until it returns something truthy; fail after `deadline_s`."""
    deadline = time.monotonic() + deadline_s
    while True:
        result = await check()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {deadline_s} s: {what}")
        await asyncio.sleep(0.05)


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    """Tracing on for the test, every span kept in memory as it ends; off again afterwards."""
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


@dataclass
class Stack:
    emulator: RunwayEmulator
    stub: api_grpc.SchedulerServiceAsyncStub
    db: Database
    traceparents: list[str | None]  # the traceparent header of each create the emulator got

    async def detail(self, task_id: int) -> TaskDetail:
        detail = await TaskQueries(self.db).get_task(task_id)
        assert detail is not None
        return detail


@pytest.fixture
async def stack(
    spans: InMemorySpanExporter, fresh_postgres_url: str, tmp_path: Path
) -> AsyncIterator[Stack]:
    """Emulator, sidecar and control plane, built after tracing was installed (as at start)."""
    async with RunwayEmulator(RunwayConfig(api_key=KEY)) as emulator:
        traceparents: list[str | None] = []
        store_job = emulator.new_job

        def record_create(request: Request, job: Job) -> Job:  # a spy on the server side only
            traceparents.append(request.header("traceparent"))
            return store_job(request, job)

        emulator.new_job = record_create  # type: ignore[method-assign]  # the test swaps in a recording or failing double
        port = free_port()
        config = parse_config(
            {
                "provider": {"base_url": emulator.url, "options": {}},
                "health": {"probe_interval_seconds": 0.5},
                "shutdown_grace_seconds": 1,
                "accounts": [{"name": "prod-us", "region": "us", "credential_ref": "env:KEY"}],
            },
            {"KEY": KEY},
        )
        sidecar = SidecarServer(
            RunwayAdapter.from_config(config),
            f"127.0.0.1:{port}",
            probe_interval_seconds=0.5,
            shutdown_grace_seconds=1,
        )
        await sidecar.start()
        server = await start_control_plane(
            Settings(
                database_url=fresh_postgres_url,
                listen="127.0.0.1:0",
                adapters={"runway": f"127.0.0.1:{port}"},
                object_store_url=(tmp_path / "objects").as_uri(),
                worker_id="trace-test",
                time_scale=0.1,
            )
        )
        db = Database.from_url(fresh_postgres_url)
        channel = grpc.aio.insecure_channel(f"127.0.0.1:{server.port}")
        try:
            health = health_pb2_grpc.HealthStub(channel)

            async def serving() -> bool:
                reply = await health.Check(
                    health_pb2.HealthCheckRequest(service=SCHEDULER_SERVICE), timeout=5
                )
                return bool(reply.status == health_pb2.HealthCheckResponse.SERVING)

            await eventually(serving, 60, "the control plane turns SERVING")
            yield Stack(emulator, api_grpc.SchedulerServiceStub(channel), db, traceparents)
        finally:
            await channel.close()
            await server.stop(grace=1.0)
            await sidecar.stop()
            await db.dispose()


def _one(found: list[ReadableSpan], what: str) -> ReadableSpan:
    assert len(found) == 1, f"{what}: {[(s.name, s.kind) for s in found]}"
    return found[0]


def _parent_is(child: ReadableSpan, parent: ReadableSpan) -> bool:
    return child.parent is not None and child.parent.span_id == parent.context.span_id


async def test_one_trace_runs_from_create_task_to_the_provider_request(
    stack: Stack, spans: InMemorySpanExporter
) -> None:
    """Every hop continues the one before it under CreateTask's trace id, the id chain is on
    the spans, the emulator received the httpx span's traceparent, and no attribute holds the
    prompt or a URL query."""
    reply = await stack.stub.CreateTask(
        api.CreateTaskRequest(
            spec=spec_for("runway", prompt=PROMPT), idempotency_key=uuid.uuid4().hex
        ),
        timeout=10,
    )
    task_id = int(reply.task.task_id)
    [create] = [s for s in spans.get_finished_spans() if s.name == CREATE]
    assert create.kind is SpanKind.SERVER
    trace_id = create.context.trace_id

    def of_trace() -> list[ReadableSpan]:
        return [s for s in spans.get_finished_spans() if s.context.trace_id == trace_id]

    async def submitted() -> bool:
        done = {(s.name, s.kind) for s in of_trace()}
        return ("submit", SpanKind.INTERNAL) in done and (SUBMIT, SpanKind.CLIENT) in done

    await eventually(submitted, 60, "the task's submit span ended")
    detail = await stack.detail(task_id)
    [attempt] = detail.attempts
    [job] = detail.provider_jobs
    [decision] = detail.route_decisions
    assert detail.task.trace_context is not None
    assert f"{trace_id:032x}" in detail.task.trace_context

    trace = of_trace()
    dispatch = _one([s for s in trace if s.name == "dispatch"], "dispatch spans")
    submit = _one([s for s in trace if s.name == "submit"], "submit spans")
    cp_client = _one(
        [s for s in trace if s.name == SUBMIT and s.kind is SpanKind.CLIENT], "CP Submit client"
    )
    sidecar = _one(
        [s for s in trace if s.name == SUBMIT and s.kind is SpanKind.SERVER], "sidecar Submit"
    )
    provider_calls = [s for s in trace if s.kind is SpanKind.CLIENT and _parent_is(s, sidecar)]
    http_call = _one(provider_calls, "provider HTTP calls under the sidecar's Submit")

    assert _parent_is(dispatch, create)
    assert _parent_is(submit, dispatch)
    assert _parent_is(cp_client, submit)
    assert _parent_is(sidecar, cp_client)
    assert http_call.name == "POST"

    # The emulator got exactly the httpx span's context in its traceparent header.
    [header] = stack.traceparents
    assert header is not None
    version, header_trace, header_span, flags = header.split("-")
    assert (version, header_trace, header_span) == (
        "00",
        f"{trace_id:032x}",
        f"{http_call.context.span_id:016x}",
    )
    assert int(flags, 16) & 1  # sampled

    chain = {
        "task_id": task_id,
        "attempt_id": attempt.id,
        "client_request_key": attempt.client_request_key,
        "route_decision_id": decision.id,
        "provider_job_id": job.provider_job_id,
    }
    if job.provider_request_id:
        chain["provider_request_id"] = job.provider_request_id
    assert dict(create.attributes or {})["task_id"] == task_id
    for span, names in (
        (dispatch, ("task_id", "attempt_id", "client_request_key", "route_decision_id")),
        (submit, tuple(chain)),
        (sidecar, ("client_request_key", "provider_job_id")),
    ):
        attributes = dict(span.attributes or {})
        assert {n: attributes.get(n) for n in names} == {n: chain[n] for n in names}, span.name

    for span in trace:
        for key, value in (span.attributes or {}).items():
            text = str(value)
            assert PROMPT not in text, (span.name, key)
            assert "?" not in text or not text.startswith("http"), (span.name, key, text)
            assert KEY not in text, (span.name, key)


class _Collector(http.server.BaseHTTPRequestHandler):
    """An OTLP/HTTP receiver: keeps each decoded ExportTraceServiceRequest."""

    received: list[trace_service_pb2.ExportTraceServiceRequest]

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("content-length", "0")))
        request = trace_service_pb2.ExportTraceServiceRequest.FromString(body)
        type(self).received.append(request)
        self.send_response(200)
        self.send_header("content-type", "application/x-protobuf")
        self.end_headers()
        self.wfile.write(trace_service_pb2.ExportTraceServiceResponse().SerializeToString())

    def log_message(self, *args: Any) -> None:
        pass


def test_otlp_export_reaches_the_configured_collector() -> None:
    """With OTEL_EXPORTER_OTLP_ENDPOINT set, `configure_tracing` installs a batch OTLP/HTTP
    exporter: a span ends up at the collector under the configured service name, and shutting
    the provider down stops its export thread."""
    assert not tracing.enabled(), "another test left tracing installed"

    class Collector(_Collector):
        received: list[trace_service_pb2.ExportTraceServiceRequest] = []  # noqa: RUF012

    receiver = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Collector)
    served = threading.Thread(target=receiver.serve_forever, daemon=True)
    served.start()
    before = set(threading.enumerate())
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{receiver.server_port}"}
    try:
        assert tracing.configure_tracing("vidroute-trace-test", env) is True
        # Taken before any span is exported, so the collector's own per-request handler
        # threads (which may still be closing after they answered) are not counted.
        exporter_threads = set(threading.enumerate()) - before
        assert exporter_threads, "a batch exporter runs a thread"
        with tracing.continue_trace("exported", None):
            pass
        provider = tracing.uninstall()
        assert provider is not None
        provider.shutdown()  # flushes the batch
        assert [thread for thread in exporter_threads if thread.is_alive()] == []
    finally:
        tracing.uninstall()
        receiver.shutdown()
        receiver.server_close()
    exported = [
        (resource.resource, span.name)
        for request in Collector.received
        for resource in request.resource_spans
        for scope in resource.scope_spans
        for span in scope.spans
    ]
    assert [name for _, name in exported] == ["exported"]
    [(resource, _)] = exported
    names = {a.key: a.value.string_value for a in resource.attributes}
    assert names["service.name"] == "vidroute-trace-test"


async def test_a_traced_http_call_records_its_url_without_the_query(
    spans: InMemorySpanExporter,
) -> None:
    """A signed URL's query (where its credentials live) never reaches a span attribute; the
    traceparent header still goes out with the request."""
    async with RunwayEmulator(RunwayConfig(api_key=KEY)) as emulator:
        seen: list[str | None] = []
        dispatch = emulator._dispatch

        async def record(request: Request) -> Any:  # a spy on the server side only
            seen.append(request.header("traceparent"))
            return await dispatch(request)

        emulator._dispatch = record  # type: ignore[method-assign]  # the test swaps in a recording or failing double
        client = httpx.AsyncClient(base_url=emulator.url)
        tracing_edge.instrument_httpx(client)
        try:
            await client.get("/__emulator/jobs", params={"_jwt": "s3cr3t-signature", "x": "1"})
        finally:
            await client.aclose()
    [span] = spans.get_finished_spans()
    assert span.kind is SpanKind.CLIENT
    urls = [str(v) for k, v in (span.attributes or {}).items() if k in ("http.url", "url.full")]
    assert urls == [f"{emulator.url}/__emulator/jobs"]
    assert "s3cr3t" not in repr(dict(span.attributes or {}))
    [header] = seen
    assert header is not None
    assert header.startswith(f"00-{span.context.trace_id:032x}-{span.context.span_id:016x}-")
