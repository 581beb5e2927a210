"""Traces on production terms: `vidroute serve` and a Runway sidecar process, configured only by
the standard OTEL_* variables, export OTLP/HTTP to a collector (a small receiver this test runs)
and one task's spans form one trace across both processes: the control plane's CreateTask,
dispatch, submit and Submit client spans, the sidecar's Submit server span and its HTTP request
to the emulator, under the services ``vidroute-controlplane`` and ``vidroute-adapter-runway``.
"""

from __future__ import annotations

import http.server
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import pytest
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2
from opentelemetry.proto.trace.v1 import trace_pb2

from tests.support.stack import ControlPlane, ProviderFarm

pytestmark = [pytest.mark.e2e, pytest.mark.postgres, pytest.mark.timeout(120)]

TIME_SCALE = 0.05
SERVER = trace_pb2.Span.SpanKind.SPAN_KIND_SERVER
CLIENT = trace_pb2.Span.SpanKind.SPAN_KIND_CLIENT
SUBMIT = "/vidroute.adapter.v1.ProviderAdapterService/Submit"
CREATE = ("vidroute-controlplane", "/vidroute.scheduler.v1.SchedulerService/CreateTask")


@dataclass(frozen=True)
class Exported:
    service: str
    span: trace_pb2.Span


class _Receiver(http.server.BaseHTTPRequestHandler):
    spans: ClassVar[list[Exported]] = []
    lock: ClassVar[threading.Lock] = threading.Lock()

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("content-length", "0")))
        request = trace_service_pb2.ExportTraceServiceRequest.FromString(body)
        with self.lock:
            for resource in request.resource_spans:
                attributes = {a.key: a.value.string_value for a in resource.resource.attributes}
                for scope in resource.scope_spans:
                    for span in scope.spans:
                        self.spans.append(Exported(attributes.get("service.name", ""), span))
        self.send_response(200)
        self.send_header("content-type", "application/x-protobuf")
        self.end_headers()
        self.wfile.write(trace_service_pb2.ExportTraceServiceResponse().SerializeToString())

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def collector() -> Iterator[tuple[str, type[_Receiver]]]:
    """An OTLP/HTTP collector on a free port; yields its endpoint and the received spans."""

    class Receiver(_Receiver):
        spans: ClassVar[list[Exported]] = []

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Receiver)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}", Receiver
    finally:
        server.shutdown()
        server.server_close()


def _trace_of_the_provider_call(
    receiver: type[_Receiver],
) -> tuple[Exported | None, list[tuple[str, str]]]:
    """CreateTask's server span, and the (service, name) chain from the sidecar's provider
    call up through its parents as far as they have been exported."""
    with receiver.lock:
        spans = list(receiver.spans)
    creates = [e for e in spans if (e.service, e.span.name) == CREATE and e.span.kind == SERVER]
    if len(creates) != 1:
        return None, []
    trace = [e for e in spans if e.span.trace_id == creates[0].span.trace_id]
    by_id = {e.span.span_id: e for e in trace}
    calls = [
        e
        for e in trace
        if e.service == "vidroute-adapter-runway"
        and e.span.kind == CLIENT
        and e.span.name == "POST"
    ]
    chain: list[tuple[str, str]] = []
    node: Exported | None = calls[0] if len(calls) == 1 else None
    while node is not None:
        chain.append((node.service, node.span.name))
        node = by_id.get(node.span.parent_span_id) if node.span.parent_span_id else None
    return creates[0], chain


def test_one_trace_spans_the_control_plane_and_sidecar_processes(
    collector: tuple[str, type[_Receiver]], fresh_postgres_url: str, tmp_path: Path
) -> None:
    """CreateTask's trace id reaches the sidecar's provider HTTP call; every hop is the child
    of the one before it, across the process boundary; each process names its service."""
    endpoint, receiver = collector
    otel = {"OTEL_EXPORTER_OTLP_ENDPOINT": endpoint, "OTEL_BSP_SCHEDULE_DELAY": "50"}
    with ProviderFarm(
        tmp_path / "farm", time_scale=TIME_SCALE, providers=["runway"], sidecar_env=otel
    ) as farm:
        cp = ControlPlane(
            tmp_path / "cp", farm, database_url=fresh_postgres_url, redis_url=None, env=otel
        )
        (tmp_path / "cp").mkdir()
        cp.start()
        try:
            task_id = cp.create_task("runway")
            deadline = time.monotonic() + 60
            while True:
                create, chain = _trace_of_the_provider_call(receiver)
                if chain and chain[-1] == CREATE:
                    break
                assert time.monotonic() < deadline, (
                    f"the provider call's trace never reached CreateTask: {chain}"
                    f"\n{cp.logs()}\n{farm.logs()}"
                )
                time.sleep(0.1)
        finally:
            cp.kill()

    assert create is not None
    assert {a.key: a.value.int_value for a in create.span.attributes}["task_id"] == int(task_id)
    assert chain == [
        ("vidroute-adapter-runway", "POST"),
        ("vidroute-adapter-runway", SUBMIT),
        ("vidroute-controlplane", SUBMIT),
        ("vidroute-controlplane", "submit"),
        ("vidroute-controlplane", "dispatch"),
        CREATE,
    ]
