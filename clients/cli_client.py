"""The CLI's one seam to the control plane: the calls its commands make, returning messages.

Every command goes through `Api`, so swapping the transport (the SDK in ``clients.sdk``, once it
covers these calls) touches this module only. Deadlines on every unary call; a dropped
WatchTask / GetOutput stream resumes from the last cursor / byte offset it delivered.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import grpc

from clients import auth as client_auth
from clients.cli_config import Connection
from vidroute.scheduler.v1 import scheduler_pb2, scheduler_service_pb2, scheduler_service_pb2_grpc

UNARY_TIMEOUT_S = 10.0
_RESUMABLE = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.INTERNAL})
_RESUMES = 5  # consecutive drops without progress before the error is the caller's


def channel(conn: Connection) -> grpc.Channel:
    """A channel to the connection's target with its bearer token (TLS when it says so)."""
    if not conn.tls:
        return client_auth.channel(conn.target, conn.token)
    roots = conn.ca_file.read_bytes() if conn.ca_file else None
    plain = grpc.secure_channel(conn.target, grpc.ssl_channel_credentials(root_certificates=roots))
    if not conn.token:
        return plain
    return grpc.intercept_channel(plain, client_auth.BearerAuth(conn.token))


@dataclass
class Created:
    """What CreateTask answered, and the idempotency key sent (generated when none was given)."""

    task: scheduler_pb2.Task
    created: bool
    idempotency_key: str


class Api:
    """The SchedulerService calls of the CLI over one channel."""

    def __init__(self, chan: grpc.Channel, timeout_s: float = UNARY_TIMEOUT_S) -> None:
        self._stub = scheduler_service_pb2_grpc.SchedulerServiceStub(chan)
        self._timeout = timeout_s

    def create(self, request: scheduler_service_pb2.CreateTaskRequest) -> Created:
        sent = scheduler_service_pb2.CreateTaskRequest()
        sent.CopyFrom(request)
        if not sent.idempotency_key:
            sent.idempotency_key = uuid.uuid4().hex
        reply = self._stub.CreateTask(sent, timeout=self._timeout)
        return Created(reply.task, reply.created, sent.idempotency_key)

    def get(self, task_id: str) -> scheduler_pb2.Task:
        request = scheduler_service_pb2.GetTaskRequest(task_id=task_id)
        return self._stub.GetTask(request, timeout=self._timeout).task

    def list_page(
        self, tenant: str, state: int, page_size: int, page_token: str
    ) -> scheduler_service_pb2.ListTasksResponse:
        request = scheduler_service_pb2.ListTasksRequest(
            tenant_id=tenant,
            state=state,  # type: ignore[arg-type]
            page_size=page_size,
            page_token=page_token,
        )
        return self._stub.ListTasks(request, timeout=self._timeout)

    def cancel(self, task_id: str, reason: str) -> scheduler_service_pb2.CancelTaskResponse:
        request = scheduler_service_pb2.CancelTaskRequest(task_id=task_id, reason=reason)
        return self._stub.CancelTask(request, timeout=self._timeout)

    def watch(self, task_id: str, after_cursor: str = "") -> Iterator[scheduler_pb2.TaskEvent]:
        """The task's events until the server ends the stream (the task is terminal)."""
        cursor, drops = after_cursor, 0
        while True:
            request = scheduler_service_pb2.WatchTaskRequest(task_id=task_id, after_cursor=cursor)
            try:
                for reply in self._stub.WatchTask(request):
                    cursor, drops = reply.event.cursor, 0
                    yield reply.event
                return
            except grpc.RpcError as exc:
                drops += 1
                if exc.code() not in _RESUMABLE or drops > _RESUMES:
                    raise

    def explain(self, task_id: str) -> scheduler_service_pb2.ExplainRouteResponse:
        request = scheduler_service_pb2.ExplainRouteRequest(task_id=task_id)
        return self._stub.ExplainRoute(request, timeout=self._timeout)

    def download(
        self, task_id: str, sample_index: int
    ) -> Iterator[tuple[scheduler_pb2.StoredOutput | None, bytes]]:
        """(the output's metadata on the first chunk else None, bytes) until the end."""
        offset, drops, first = 0, 0, True
        while True:
            request = scheduler_service_pb2.GetOutputRequest(
                task_id=task_id, sample_index=sample_index, offset=offset
            )
            try:
                for reply in self._stub.GetOutput(request):
                    meta = reply.output if first and reply.HasField("output") else None
                    first, drops = False, 0
                    offset = reply.offset + len(reply.data)
                    yield meta, reply.data
                return
            except grpc.RpcError as exc:
                drops += 1
                if exc.code() not in _RESUMABLE or drops > _RESUMES:
                    raise

    def output_url(
        self, task_id: str, sample_index: int, expires_in_s: int
    ) -> scheduler_service_pb2.GetOutputUrlResponse:
        request = scheduler_service_pb2.GetOutputUrlRequest(
            task_id=task_id, sample_index=sample_index, expires_in_s=expires_in_s
        )
        return self._stub.GetOutputUrl(request, timeout=self._timeout)

    def providers(self) -> scheduler_service_pb2.ListProvidersResponse:
        request = scheduler_service_pb2.ListProvidersRequest()
        return self._stub.ListProviders(request, timeout=self._timeout)

    def health(self, provider: str) -> scheduler_service_pb2.GetProviderHealthResponse:
        request = scheduler_service_pb2.GetProviderHealthRequest(provider=provider)
        return self._stub.GetProviderHealth(request, timeout=self._timeout)

    def force_breaker(
        self, request: scheduler_service_pb2.ForceBreakerRequest
    ) -> scheduler_service_pb2.ForceBreakerResponse:
        return self._stub.ForceBreaker(request, timeout=self._timeout)

    def publish(
        self, document: str, source: str, dry_run: bool
    ) -> scheduler_service_pb2.PublishCapabilitiesResponse:
        request = scheduler_service_pb2.PublishCapabilitiesRequest(
            document=document, source=source, dry_run=dry_run
        )
        return self._stub.PublishCapabilities(request, timeout=self._timeout)


@contextmanager
def connect(conn: Connection) -> Iterator[Api]:
    """An `Api` on a fresh channel, closed on exit."""
    with channel(conn) as chan:
        yield Api(chan)
