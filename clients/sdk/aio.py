"""`AsyncClient`: the asyncio SDK over a grpc.aio channel, method for method `Client`'s twin
(same arguments, same results, same errors, same retry policy). One example per method::

    from clients.sdk import AsyncClient

    async with AsyncClient() as client:              # VIDROUTE_TARGET, VIDROUTE_TOKEN
        made = await client.create(spec)             # Created(task, created, idempotency_key)
        task = await client.get(made.task.task_id)
        async for t in client.list(tenant_id="acme", state="SUCCEEDED"):
            print(t.task_id)
        async for event in client.watch(task.task_id):   # resumes after a dropped stream
            print(event.kind, event.task_state)
        done = await client.wait(task.task_id, on_progress=lambda p: print(p.fraction))
        decisions = await client.explain(task.task_id)
        size = await client.download_output(task.task_id, "out.mp4")
        url = (await client.output_url(task.task_id, expires_in_s=600)).url
        deliveries = await client.webhook_deliveries(task.task_id)
        outcome = await client.cancel(task.task_id)       # .requested, .already_finished
        await client.providers(); await client.health("runway")
        await client.force_breaker("runway", "default", "us", "gen4.5", state=None, reason="ok")
        await client.publish_capabilities(Path("capabilities.yaml"), dry_run=True)
        await client.feedback(task.task_id, "rejected", comment="warped hands")  # routing
        await client.quality(); await client.canaries()   # clients.sdk.routing: every method

`wait`'s callbacks may be plain functions or coroutine functions.
"""

from __future__ import annotations

import asyncio
import builtins
import inspect
import os
from collections.abc import AsyncIterator, Callable, Mapping
from pathlib import Path
from types import TracebackType
from typing import IO, Any, Self

import grpc

from clients.sdk import _common as c
from clients.sdk import _outputs, errors
from clients.sdk._common import Cancelled, Created
from clients.sdk.routing import AsyncRoutingCalls
from vidroute.common.v1 import generation_pb2
from vidroute.scheduler.v1 import scheduler_pb2 as pb
from vidroute.scheduler.v1 import scheduler_service_pb2 as api
from vidroute.scheduler.v1 import scheduler_service_pb2_grpc as api_grpc

__all__ = ["AsyncClient"]


class AsyncClient(AsyncRoutingCalls):
    """An asyncio client of the vidroute SchedulerService (see `Client` for the arguments)."""

    def __init__(
        self,
        target: str | None = None,
        *,
        token: str | None = None,
        timeout: float = c.DEFAULT_TIMEOUT_S,
        credentials: grpc.ChannelCredentials | None = None,
        channel: grpc.aio.Channel | None = None,
    ) -> None:
        """As `clients.sdk.Client`: a ready-made `channel` serves every call, a keyless
        ``create(..., generate_key=False)`` too, so it should not retry if it may create."""
        self.target = c.resolve_target(target)
        self.timeout = timeout
        self._metadata = c.metadata(c.resolve_token(token))
        self._credentials = credentials
        self._own = channel is None
        self._channel = channel or self._open(c.RETRYING_OPTIONS)
        self._stub = api_grpc.SchedulerServiceStub(self._channel)
        self._once: api_grpc.SchedulerServiceAsyncStub | None = None if self._own else self._stub
        self._once_channel: grpc.aio.Channel | None = None

    def _open(self, options: tuple[tuple[str, Any], ...]) -> grpc.aio.Channel:
        if self._credentials is not None:
            return grpc.aio.secure_channel(self.target, self._credentials, options=options)
        return grpc.aio.insecure_channel(self.target, options=options)

    async def close(self) -> None:
        """Close the channels this client opened."""
        if self._own:
            await self._channel.close()
        if self._once_channel is not None:
            await self._once_channel.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    async def _call(self, method: Callable[..., Any], request: Any) -> Any:
        try:
            return await method(request, timeout=self.timeout, metadata=self._metadata)
        except grpc.RpcError as err:
            raise errors.from_rpc_error(err, self.target) from None

    def _once_stub(self) -> api_grpc.SchedulerServiceAsyncStub:
        if self._once is None:
            self._once_channel = self._open(c.ONCE_OPTIONS)
            self._once = api_grpc.SchedulerServiceStub(self._once_channel)
        return self._once

    async def create(
        self,
        spec: generation_pb2.GenerationSpec | Mapping[str, Any],
        *,
        idempotency_key: str | None = None,
        webhook: pb.WebhookSubscription | Mapping[str, Any] | str | None = None,
        generate_key: bool = True,
    ) -> Created:
        """Create a task; a uuid4 idempotency key is generated when none is given."""
        request = c.create_request(spec, idempotency_key, webhook, generate_key)
        stub = self._stub if request.idempotency_key else self._once_stub()
        reply: api.CreateTaskResponse = await self._call(stub.CreateTask, request)
        return Created(reply.task, reply.created, request.idempotency_key)

    async def get(self, task_id: str) -> pb.Task:
        """The task with its attempts, provider jobs and route decisions."""
        reply: api.GetTaskResponse = await self._call(
            self._stub.GetTask, api.GetTaskRequest(task_id=task_id)
        )
        return reply.task

    async def list(
        self, *, tenant_id: str = "", state: int | str | None = None, page_size: int = 50
    ) -> AsyncIterator[pb.Task]:
        """Every task matching the filters, newest first, fetched a page at a time."""
        request = api.ListTasksRequest(
            tenant_id=tenant_id, state=c.task_state(state), page_size=page_size
        )
        while True:
            reply: api.ListTasksResponse = await self._call(self._stub.ListTasks, request)
            for task in reply.tasks:
                yield task
            if not reply.next_page_token:
                return
            request.page_token = reply.next_page_token

    async def cancel(self, task_id: str, reason: str = "") -> Cancelled:
        """Cancel a task: CANCELLED at once, REQUESTED at the provider, or ALREADY_FINISHED."""
        reply: api.CancelTaskResponse = await self._call(
            self._stub.CancelTask, api.CancelTaskRequest(task_id=task_id, reason=reason)
        )
        return Cancelled(reply.task, reply.outcome)

    async def watch(
        self,
        task_id: str,
        *,
        after_cursor: str = "",
        timeout: float | None = None,  # noqa: ASYNC109 - the stream's gRPC deadline, as Client's
    ) -> AsyncIterator[pb.TaskEvent]:
        """The task's events, ending after its terminal state change; resumes from the last
        cursor after a dropped stream (see `Client.watch`)."""
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        cursor, failures = after_cursor, 0
        while True:
            remaining = None if deadline is None else max(deadline - loop.time(), 0.001)
            call = self._stub.WatchTask(
                api.WatchTaskRequest(task_id=task_id, after_cursor=cursor),
                timeout=remaining,
                metadata=self._metadata,
            )
            try:
                async for reply in call:
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
            await asyncio.sleep(c.backoff_s(failures))

    async def wait(
        self,
        task_id: str,
        *,
        timeout: float | None = None,  # noqa: ASYNC109 - the stream's gRPC deadline, as Client's
        on_progress: Callable[[pb.Progress], object] | None = None,
        on_event: Callable[[pb.TaskEvent], object] | None = None,
    ) -> pb.Task:
        """Watch until the task is terminal and return it (GetTask), calling back per event
        and per provider progress report."""
        async for event in self.watch(task_id, timeout=timeout):
            if on_event is not None:
                await _maybe_await(on_event(event))
            if on_progress is not None and event.HasField("progress"):
                await _maybe_await(on_progress(event.progress))
        return await self.get(task_id)

    async def explain(self, task_id: str) -> builtins.list[pb.RouteDecision]:
        """Every route decision of the task, in order."""
        reply: api.ExplainRouteResponse = await self._call(
            self._stub.ExplainRoute, api.ExplainRouteRequest(task_id=task_id)
        )
        return list(reply.decisions)

    async def download_output(
        self, task_id: str, dest: str | os.PathLike[str] | IO[bytes], *, sample_index: int = 0
    ) -> int:
        """Write a succeeded task's output to `dest` (path or binary file), resuming a dropped
        stream at its offset, checked against the stored size and SHA-256; returns the size."""
        if not isinstance(dest, (str, os.PathLike)):
            return await self._download(task_id, sample_index, dest)
        with _outputs.verified_file(dest) as fh:
            return await self._download(task_id, sample_index, fh)

    async def _download(self, task_id: str, sample_index: int, out: IO[bytes]) -> int:
        check, failures = _outputs.OutputCheck(task_id), 0
        while True:
            call = self._stub.GetOutput(
                _outputs.output_request(task_id, sample_index, check.offset),
                metadata=self._metadata,
            )
            try:
                async for reply in call:
                    out.write(check.chunk(reply))
                    failures = 0
                return check.finish()
            except grpc.RpcError as err:
                failures += 1
                if not c.resumable(err) or failures > c.RESUME_ATTEMPTS:
                    raise errors.from_rpc_error(err, self.target) from None
            finally:
                call.cancel()
            await asyncio.sleep(c.backoff_s(failures))

    async def output_url(
        self, task_id: str, *, sample_index: int = 0, expires_in_s: int = 0
    ) -> api.GetOutputUrlResponse:
        """A time-limited URL of a stored output (url, expires_at, output)."""
        return await self._call(  # type: ignore[no-any-return]  # _call returns the stub's Any; the RPC's response type
            self._stub.GetOutputUrl,
            api.GetOutputUrlRequest(
                task_id=task_id, sample_index=sample_index, expires_in_s=expires_in_s
            ),
        )

    async def webhook_deliveries(self, task_id: str) -> builtins.list[pb.WebhookDelivery]:
        """The task's caller webhook messages and every delivery attempt, oldest first."""
        reply: api.ListWebhookDeliveriesResponse = await self._call(
            self._stub.ListWebhookDeliveries, api.ListWebhookDeliveriesRequest(task_id=task_id)
        )
        return list(reply.deliveries)

    async def providers(self) -> builtins.list[pb.ProviderInfo]:
        """Admin: provider accounts, their models and capabilities."""
        reply: api.ListProvidersResponse = await self._call(
            self._stub.ListProviders, api.ListProvidersRequest()
        )
        return list(reply.providers)

    async def health(self, provider: str = "") -> builtins.list[pb.BreakerStatus]:
        """Admin: circuit breaker states (of one provider, or all)."""
        reply: api.GetProviderHealthResponse = await self._call(
            self._stub.GetProviderHealth, api.GetProviderHealthRequest(provider=provider)
        )
        return list(reply.breakers)

    async def force_breaker(
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
        reply: api.ForceBreakerResponse = await self._call(
            self._stub.ForceBreaker,
            c.force_request(
                provider, account, region, model, state=state, reason=reason, operation=operation
            ),
        )
        return reply.breaker

    async def publish_capabilities(
        self, document: str | bytes | Path, *, source: str = "", dry_run: bool = False
    ) -> api.PublishCapabilitiesResponse:
        """Admin: publish a capability document; `dry_run` writes nothing."""
        return await self._call(  # type: ignore[no-any-return]  # _call returns the stub's Any; the RPC's response type
            self._stub.PublishCapabilities, c.capabilities_request(document, source, dry_run)
        )


async def _maybe_await(result: object) -> None:
    if inspect.isawaitable(result):
        await result
