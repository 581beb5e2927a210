"""`Client`: the blocking SDK over a grpc channel (`AsyncClient` in `clients.sdk.aio` is the
asyncio twin, method for method). Every method, with one example each::

    from clients.sdk import Client

    with Client("localhost:8051") as client:       # or VIDROUTE_TARGET; token: VIDROUTE_TOKEN
        spec = {"tenant_id": "acme", "prompt": "a red kite", "mode": "MODE_TEXT_TO_VIDEO",
                "output": {"width": 1280, "height": 720, "duration_ms": 4000}}
        made = client.create(spec)                  # made.task, made.created, made.idempotency_key
        task = client.get(made.task.task_id)        # a scheduler_pb2.Task with attempts
        for t in client.list(tenant_id="acme", state="RUNNING"):   # every page, newest first
            print(t.task_id)
        for event in client.watch(task.task_id):     # resumes after a dropped stream
            print(event.kind, event.task_state)
        done = client.wait(task.task_id, timeout=600,
                           on_progress=lambda p: print(f"{p.fraction:.0%}"))
        for decision in client.explain(task.task_id):               # RouteDecision messages
            print(decision.selected_candidate)
        size = client.download_output(task.task_id, "out.mp4")      # checked against sha256
        url = client.output_url(task.task_id, expires_in_s=600).url  # presigned on S3
        deliveries = client.webhook_deliveries(task.task_id)        # WebhookDelivery messages
        outcome = client.cancel(task.task_id, reason="not needed")  # .requested, .already_finished
        # admin
        client.providers()                                          # ProviderInfo messages
        client.health("runway")                                     # BreakerStatus messages
        client.force_breaker("runway", "default", "us", "gen4.5", state="OPEN", reason="drill")
        client.publish_capabilities(Path("capabilities.yaml"), dry_run=True).counts
        # RoutingService (clients.sdk.routing): feedback, quality, canaries, routing policies
        client.feedback(task.task_id, "accepted", tags=["motion"])  # True: recorded now
        client.quality(model="gen4.5")                              # QualityBucket messages

Unary calls carry a deadline (`timeout`, 30 s by default). Read-only calls, and CreateTask with
its idempotency key, are retried on UNAVAILABLE by the channel's service config
(`clients.sdk._common.SERVICE_CONFIG`); `create(spec, generate_key=False)` without a key goes
over a second channel with retries off, so it is sent at most once. Errors are
`clients.sdk.errors` exceptions.
"""

from __future__ import annotations

import builtins
import os
import time
from collections.abc import Callable, Iterator, Mapping
from datetime import UTC, datetime
from pathlib import Path
from types import TracebackType
from typing import IO, Any, Self

import grpc

from clients.sdk import _common as c
from clients.sdk import _outputs, errors
from clients.sdk._common import Cancelled, Created
from clients.sdk.routing import RoutingCalls
from vidroute.common.v1 import generation_pb2
from vidroute.scheduler.v1 import scheduler_pb2 as pb
from vidroute.scheduler.v1 import scheduler_service_pb2 as api
from vidroute.scheduler.v1 import scheduler_service_pb2_grpc as api_grpc

__all__ = ["Client"]


class Client(RoutingCalls):
    """A blocking client of the vidroute SchedulerService."""

    def __init__(
        self,
        target: str | None = None,
        *,
        token: str | None = None,
        timeout: float = c.DEFAULT_TIMEOUT_S,
        credentials: grpc.ChannelCredentials | None = None,
        channel: grpc.Channel | None = None,
    ) -> None:
        """`target` falls back to ``VIDROUTE_TARGET`` then ``localhost:8051``; `token` to
        ``VIDROUTE_TOKEN`` then the dev admin token in ./var; `credentials` makes the channel TLS.
        A ready-made `channel` (tests, custom options) is used for every call and not closed,
        including ``create(..., generate_key=False)`` without a key: give such a channel
        ``grpc.enable_retries=0`` (`clients.sdk._common.ONCE_OPTIONS`) if it may create."""
        self.target = c.resolve_target(target)
        self.timeout = timeout
        self._metadata = c.metadata(c.resolve_token(token))
        self._credentials = credentials
        self._own = channel is None
        self._channel = channel or self._open(c.RETRYING_OPTIONS)
        self._stub = api_grpc.SchedulerServiceStub(self._channel)
        self._once: api_grpc.SchedulerServiceStub | None = None if self._own else self._stub
        self._once_channel: grpc.Channel | None = None

    def _open(self, options: tuple[tuple[str, Any], ...]) -> grpc.Channel:
        if self._credentials is not None:
            return grpc.secure_channel(self.target, self._credentials, options=options)
        return grpc.insecure_channel(self.target, options=options)

    def close(self) -> None:
        """Close the channels this client opened."""
        if self._own:
            self._channel.close()
        if self._once_channel is not None:
            self._once_channel.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def _call(self, method: Callable[..., Any], request: Any, timeout: float | None = None) -> Any:
        try:
            return method(request, timeout=timeout or self.timeout, metadata=self._metadata)
        except grpc.RpcError as err:
            raise errors.from_rpc_error(err, self.target) from None

    def _once_stub(self) -> api_grpc.SchedulerServiceStub:
        if self._once is None:
            self._once_channel = self._open(c.ONCE_OPTIONS)
            self._once = api_grpc.SchedulerServiceStub(self._once_channel)
        return self._once

    def create(
        self,
        spec: generation_pb2.GenerationSpec | Mapping[str, Any],
        *,
        idempotency_key: str | None = None,
        webhook: pb.WebhookSubscription | Mapping[str, Any] | str | None = None,
        generate_key: bool = True,
    ) -> Created:
        """Create a task (spec: a GenerationSpec or its proto-JSON dict). Without a key a uuid4
        is generated and returned, so a retried create is the same task."""
        request = c.create_request(spec, idempotency_key, webhook, generate_key)
        stub = self._stub if request.idempotency_key else self._once_stub()
        reply: api.CreateTaskResponse = self._call(stub.CreateTask, request)
        return Created(reply.task, reply.created, request.idempotency_key)

    def get(self, task_id: str) -> pb.Task:
        """The task with its attempts, provider jobs and route decisions."""
        reply: api.GetTaskResponse = self._call(
            self._stub.GetTask, api.GetTaskRequest(task_id=task_id)
        )
        return reply.task

    def list(
        self, *, tenant_id: str = "", state: int | str | None = None, page_size: int = 50
    ) -> Iterator[pb.Task]:
        """Every task matching the filters, newest first, fetched a page at a time."""
        request = api.ListTasksRequest(
            tenant_id=tenant_id, state=c.task_state(state), page_size=page_size
        )
        while True:
            reply: api.ListTasksResponse = self._call(self._stub.ListTasks, request)
            yield from reply.tasks
            if not reply.next_page_token:
                return
            request.page_token = reply.next_page_token

    def cancel(self, task_id: str, reason: str = "") -> Cancelled:
        """Cancel a task: CANCELLED at once, REQUESTED at the provider, or ALREADY_FINISHED."""
        reply: api.CancelTaskResponse = self._call(
            self._stub.CancelTask, api.CancelTaskRequest(task_id=task_id, reason=reason)
        )
        return Cancelled(reply.task, reply.outcome)

    def watch(
        self, task_id: str, *, after_cursor: str = "", timeout: float | None = None
    ) -> Iterator[pb.TaskEvent]:
        """The task's events (history, then live), ending after its terminal state change.

        A dropped stream (UNAVAILABLE, a reset, a server restart) is reopened after the last
        cursor seen, with backoff, up to `RESUME_ATTEMPTS` times in a row; `timeout` bounds the
        whole watch (DeadlineExceeded)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        cursor, failures = after_cursor, 0
        while True:
            remaining = None if deadline is None else max(deadline - time.monotonic(), 0.001)
            call = self._stub.WatchTask(
                api.WatchTaskRequest(task_id=task_id, after_cursor=cursor),
                timeout=remaining,
                metadata=self._metadata,
            )
            try:
                for reply in call:
                    failures = 0
                    cursor = reply.event.cursor or cursor
                    yield reply.event
                    if c.is_terminal_event(reply.event):
                        return
                return
            except grpc.RpcError as err:
                failures += 1
                if not c.resumable(err) or failures > c.RESUME_ATTEMPTS:
                    raise errors.from_rpc_error(err, self.target) from None
            finally:
                call.cancel()
            time.sleep(c.backoff_s(failures))

    def wait(
        self,
        task_id: str,
        *,
        timeout: float | None = None,
        on_progress: Callable[[pb.Progress], object] | None = None,
        on_event: Callable[[pb.TaskEvent], object] | None = None,
    ) -> pb.Task:
        """Watch until the task is terminal and return it (GetTask). `on_event` sees every
        event, `on_progress` each provider progress report (fraction, queue position)."""
        for event in self.watch(task_id, timeout=timeout):
            if on_event is not None:
                on_event(event)
            if on_progress is not None and event.HasField("progress"):
                on_progress(event.progress)
        return self.get(task_id)

    def explain(self, task_id: str) -> builtins.list[pb.RouteDecision]:
        """Every route decision of the task, in order."""
        reply: api.ExplainRouteResponse = self._call(
            self._stub.ExplainRoute, api.ExplainRouteRequest(task_id=task_id)
        )
        return list(reply.decisions)

    def download_output(
        self, task_id: str, dest: str | os.PathLike[str] | IO[bytes], *, sample_index: int = 0
    ) -> int:
        """Write a succeeded task's output to `dest` (a path, or a binary file) and return its
        size. A dropped stream resumes at the offset reached; size and SHA-256 are checked
        against the stored output (DataLoss). A path is only written once verified."""
        if not isinstance(dest, (str, os.PathLike)):
            return self._download(task_id, sample_index, dest)
        with _outputs.verified_file(dest) as fh:
            return self._download(task_id, sample_index, fh)

    def _download(self, task_id: str, sample_index: int, out: IO[bytes]) -> int:
        check, failures = _outputs.OutputCheck(task_id), 0
        while True:
            call = self._stub.GetOutput(
                _outputs.output_request(task_id, sample_index, check.offset),
                metadata=self._metadata,
            )
            try:
                for reply in call:
                    out.write(check.chunk(reply))
                    failures = 0
                return check.finish()
            except grpc.RpcError as err:
                failures += 1
                if not c.resumable(err) or failures > c.RESUME_ATTEMPTS:
                    raise errors.from_rpc_error(err, self.target) from None
            finally:
                call.cancel()
            time.sleep(c.backoff_s(failures))

    def output_url(
        self, task_id: str, *, sample_index: int = 0, expires_in_s: int = 0
    ) -> api.GetOutputUrlResponse:
        """A time-limited URL of a stored output (url, expires_at, output)."""
        return self._call(  # type: ignore[no-any-return]  # _call returns the stub's Any; the RPC's response type
            self._stub.GetOutputUrl,
            api.GetOutputUrlRequest(
                task_id=task_id, sample_index=sample_index, expires_in_s=expires_in_s
            ),
        )

    def webhook_deliveries(self, task_id: str) -> builtins.list[pb.WebhookDelivery]:
        """The task's caller webhook messages and every delivery attempt, oldest first."""
        reply: api.ListWebhookDeliveriesResponse = self._call(
            self._stub.ListWebhookDeliveries, api.ListWebhookDeliveriesRequest(task_id=task_id)
        )
        return list(reply.deliveries)

    def providers(self) -> builtins.list[pb.ProviderInfo]:
        """Admin: provider accounts, their models and capabilities."""
        reply: api.ListProvidersResponse = self._call(
            self._stub.ListProviders, api.ListProvidersRequest()
        )
        return list(reply.providers)

    def health(self, provider: str = "") -> builtins.list[pb.BreakerStatus]:
        """Admin: circuit breaker states (of one provider, or all)."""
        reply: api.GetProviderHealthResponse = self._call(
            self._stub.GetProviderHealth, api.GetProviderHealthRequest(provider=provider)
        )
        return list(reply.breakers)

    def force_breaker(
        self,
        provider: str,
        account: str,
        region: str,
        model: str,
        *,
        state: int | str | None,
        reason: str,
        operation: str = "SUBMIT",
    ) -> pb.BreakerStatus:
        """Admin: force a breaker OPEN or CLOSED, or release the override (state None)."""
        reply: api.ForceBreakerResponse = self._call(
            self._stub.ForceBreaker,
            c.force_request(
                provider, account, region, model, state=state, reason=reason, operation=operation
            ),
        )
        return reply.breaker

    def publish_capabilities(
        self,
        document: str | bytes | Path,
        *,
        source: str = "",
        dry_run: bool = False,
        version: str = "",
        activate_at: datetime | None = None,
        staged: bool = False,
        force_reason: str = "",
    ) -> api.PublishCapabilitiesResponse:
        """Admin: publish a capability release (text, bytes or a file path): now, at
        `activate_at`, or `staged`; `dry_run` checks everything and writes nothing;
        `force_reason` forces it past the serving check (recorded)."""
        request = c.capabilities_request(
            document,
            source,
            dry_run,
            version=version,
            activate_at=activate_at,
            staged=staged,
            force_reason=force_reason,
        )
        return self._call(self._stub.PublishCapabilities, request)  # type: ignore[no-any-return]  # _call returns the stub's Any; the RPC's response type

    def activate_capabilities(
        self, version: str, *, activate_at: datetime | None = None, force_reason: str = ""
    ) -> api.ActivateCapabilitiesResponse:
        """Admin: activate a staged capability release (now, or at `activate_at`)."""
        request = api.ActivateCapabilitiesRequest(
            version=version, force=bool(force_reason), reason=force_reason
        )
        if activate_at is not None:
            request.activate_at.FromDatetime(activate_at.astimezone(UTC))
        return self._call(self._stub.ActivateCapabilities, request)  # type: ignore[no-any-return]  # _call returns the stub's Any; the RPC's response type

    def rollback_capabilities(
        self, version: str = "", *, force_reason: str = ""
    ) -> api.RollbackCapabilitiesResponse:
        """Admin: return the catalog to an earlier release (empty: the one before)."""
        request = api.RollbackCapabilitiesRequest(
            version=version, force=bool(force_reason), reason=force_reason
        )
        return self._call(self._stub.RollbackCapabilities, request)  # type: ignore[no-any-return]  # _call returns the stub's Any; the RPC's response type

    def capability_history(self) -> api.ListCapabilityHistoryResponse:
        """Admin: every capability release and activation (who, when, what it replaced)."""
        request = api.ListCapabilityHistoryRequest()
        return self._call(self._stub.ListCapabilityHistory, request)  # type: ignore[no-any-return]  # _call returns the stub's Any; the RPC's response type
