"""`vidroute.scheduler.v1.SchedulerService`: a translator between protobuf and the services.

No SQL, Redis or provider call here: each method decodes the request, calls a transport-neutral
service, and encodes the result. Errors are domain exceptions, mapped to gRPC statuses by
`vidroute_core.wire.status.DomainErrorInterceptor`. The caller comes from `controlplane.api.auth`
(the server's interceptor authenticated it) and goes to every service call, which scopes by it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import grpc

from controlplane.api import capability_views, provider_views, views
from controlplane.api.auth import require_caller
from controlplane.domain.breaker import BreakerState
from controlplane.domain.states import TaskState
from controlplane.domain.webhooks import WebhookSubscription
from controlplane.service.access import Caller, ensure_admin
from controlplane.service.capability_checks import Force
from controlplane.service.capability_publish import CapabilityPublishService
from controlplane.service.outputs import OutputService
from controlplane.service.providers import ForceBreakerInput, ProviderAdminService
from controlplane.service.tasks import (
    CreateTaskInput,
    ListTasksInput,
    TaskService,
    parse_cursor,
    parse_task_id,
)
from vidroute.scheduler.v1 import scheduler_pb2, scheduler_service_pb2, scheduler_service_pb2_grpc
from vidroute_core.exceptions import InvalidSpec
from vidroute_core.logs import add_ids
from vidroute_core.validation import FieldViolation
from vidroute_core.wire.spec import spec_from_proto

_UNIMPLEMENTED = "implemented by the scheduler execution and decision issues"


def _task_state(value: int) -> TaskState | None:
    """ListTasks' state filter; an enum number this schema does not define is INVALID_ARGUMENT
    (proto3 keeps unknown enum numbers, so 99 or -1 arrive here as ints)."""
    if not value:
        return None
    known = scheduler_pb2.TaskState.DESCRIPTOR.values_by_number.get(value)
    if known is None:
        raise InvalidSpec([FieldViolation("state", f"unknown TaskState value {value}")])
    return TaskState(known.name.removeprefix("TASK_STATE_"))


def _breaker_state(value: int) -> BreakerState | None:
    if value not in scheduler_pb2.BreakerState.DESCRIPTOR.values_by_number:
        raise InvalidSpec([FieldViolation("state", f"unknown BreakerState value {value}")])
    return provider_views.breaker_state_from_proto(value)


def _webhook(request: scheduler_service_pb2.CreateTaskRequest) -> WebhookSubscription | None:
    """The webhook a CreateTask names (None: unset, so the tenant's default applies)."""
    if not request.HasField("webhook"):
        return None
    return WebhookSubscription(request.webhook.url, tuple(request.webhook.events))


class SchedulerServicer(scheduler_service_pb2_grpc.SchedulerServiceServicer):
    """The public scheduler API."""

    def __init__(
        self,
        tasks: TaskService,
        providers: ProviderAdminService | None = None,
        *,
        default_caller: Caller | None = None,
        capabilities: CapabilityPublishService | None = None,
        outputs: OutputService | None = None,
    ) -> None:
        self._tasks = tasks
        self._providers = providers
        self._capabilities = capabilities
        self._outputs = outputs
        # Only for a servicer driven without the server (grpcio-testing); the server always
        # authenticates, and without either every call is UNAUTHENTICATED.
        self._default_caller = default_caller

    def _caller(self) -> Caller:
        return require_caller(self._default_caller)

    async def _admin(self, context: Any, rpc: str) -> ProviderAdminService:
        ensure_admin(self._caller(), rpc)  # before anything else: the role, then the rest
        if self._providers is None:
            await context.abort(grpc.StatusCode.UNIMPLEMENTED, f"{rpc}: no scheduler configured")
            raise AssertionError("unreachable")
        return self._providers

    async def CreateTask(
        self, request: scheduler_service_pb2.CreateTaskRequest, context: Any
    ) -> scheduler_service_pb2.CreateTaskResponse:
        spec, violations = spec_from_proto(request.spec)
        record, created = await self._tasks.create_task(
            CreateTaskInput(
                spec=spec,
                idempotency_key=request.idempotency_key,
                violations=violations,
                webhook=_webhook(request),
            ),
            self._caller(),
        )
        add_ids(task_id=record.id)  # on the call's span and its remaining log lines
        return scheduler_service_pb2.CreateTaskResponse(task=views.task(record), created=created)

    async def GetTask(
        self, request: scheduler_service_pb2.GetTaskRequest, context: Any
    ) -> scheduler_service_pb2.GetTaskResponse:
        detail = await self._tasks.get_task(parse_task_id(request.task_id), self._caller())
        return scheduler_service_pb2.GetTaskResponse(task=views.task(detail.task, detail))

    async def ListTasks(
        self, request: scheduler_service_pb2.ListTasksRequest, context: Any
    ) -> scheduler_service_pb2.ListTasksResponse:
        state = _task_state(request.state)
        records, token = await self._tasks.list_tasks(
            ListTasksInput(
                tenant_id=request.tenant_id or None,
                state=state,
                page_size=request.page_size,
                page_token=request.page_token or None,
            ),
            self._caller(),
        )
        return scheduler_service_pb2.ListTasksResponse(
            tasks=[views.task(r) for r in records], next_page_token=token or ""
        )

    async def CancelTask(
        self, request: scheduler_service_pb2.CancelTaskRequest, context: Any
    ) -> scheduler_service_pb2.CancelTaskResponse:
        detail, result = await self._tasks.cancel_task(
            parse_task_id(request.task_id), request.reason, self._caller()
        )
        return scheduler_service_pb2.CancelTaskResponse(
            task=views.task(detail.task, detail), outcome=views.cancel_outcome(result)
        )

    async def ExplainRoute(
        self, request: scheduler_service_pb2.ExplainRouteRequest, context: Any
    ) -> scheduler_service_pb2.ExplainRouteResponse:
        detail = await self._tasks.get_task(parse_task_id(request.task_id), self._caller())
        return scheduler_service_pb2.ExplainRouteResponse(
            decisions=[views.route_decision(d) for d in detail.route_decisions]
        )

    async def WatchTask(
        self, request: scheduler_service_pb2.WatchTaskRequest, context: Any
    ) -> AsyncIterator[scheduler_service_pb2.WatchTaskResponse]:
        task_id = parse_task_id(request.task_id)
        after = parse_cursor(request.after_cursor)
        last_state = None
        async for event in self._tasks.watch(task_id, after, self._caller()):
            message = views.task_event(event, last_state)
            last_state = message.task_state or last_state
            yield scheduler_service_pb2.WatchTaskResponse(event=message)

    async def _output_service(self, context: Any, rpc: str) -> OutputService:
        if self._outputs is None:
            await context.abort(grpc.StatusCode.UNIMPLEMENTED, f"{rpc}: no object store configured")
            raise AssertionError("unreachable")
        return self._outputs

    async def GetOutput(
        self, request: scheduler_service_pb2.GetOutputRequest, context: Any
    ) -> AsyncIterator[scheduler_service_pb2.GetOutputResponse]:
        outputs = await self._output_service(context, "GetOutput")
        sample, chunks = await outputs.read(
            parse_task_id(request.task_id),
            request.sample_index,
            request.offset,
            request.limit,
            self._caller(),
        )
        first: scheduler_service_pb2.GetOutputResponse | None = (
            scheduler_service_pb2.GetOutputResponse(
                output=views.stored_output(sample), offset=request.offset
            )
        )
        async for chunk in chunks:
            if first is not None:  # the metadata rides on the first chunk
                first.offset, first.data = chunk.offset, chunk.data
                yield first
                first = None
            else:
                yield scheduler_service_pb2.GetOutputResponse(offset=chunk.offset, data=chunk.data)
        if first is not None:  # an empty range: the metadata alone
            yield first

    async def GetOutputUrl(
        self, request: scheduler_service_pb2.GetOutputUrlRequest, context: Any
    ) -> scheduler_service_pb2.GetOutputUrlResponse:
        outputs = await self._output_service(context, "GetOutputUrl")
        found = await outputs.presigned_url(
            parse_task_id(request.task_id),
            request.sample_index,
            request.expires_in_s,
            self._caller(),
        )
        return scheduler_service_pb2.GetOutputUrlResponse(
            url=found.url,
            expires_at=views.timestamp(found.expires_at),
            output=views.stored_output(found.sample),
        )

    async def ListWebhookDeliveries(
        self, request: scheduler_service_pb2.ListWebhookDeliveriesRequest, context: Any
    ) -> scheduler_service_pb2.ListWebhookDeliveriesResponse:
        found = await self._tasks.list_webhook_deliveries(
            parse_task_id(request.task_id), self._caller()
        )
        return scheduler_service_pb2.ListWebhookDeliveriesResponse(
            deliveries=[views.webhook_delivery(d) for d in found]
        )

    async def ListProviders(
        self, request: scheduler_service_pb2.ListProvidersRequest, context: Any
    ) -> scheduler_service_pb2.ListProvidersResponse:
        admin = await self._admin(context, "ListProviders")
        return scheduler_service_pb2.ListProvidersResponse(
            providers=[
                provider_views.provider(v) for v in await admin.list_providers(self._caller())
            ]
        )

    async def GetProviderHealth(
        self, request: scheduler_service_pb2.GetProviderHealthRequest, context: Any
    ) -> scheduler_service_pb2.GetProviderHealthResponse:
        admin = await self._admin(context, "GetProviderHealth")
        statuses = await admin.provider_health(request.provider, self._caller())
        return scheduler_service_pb2.GetProviderHealthResponse(
            breakers=[provider_views.breaker(s) for s in statuses]
        )

    async def ForceBreaker(
        self, request: scheduler_service_pb2.ForceBreakerRequest, context: Any
    ) -> scheduler_service_pb2.ForceBreakerResponse:
        admin = await self._admin(context, "ForceBreaker")
        status = await admin.force_breaker(
            ForceBreakerInput(
                provider=request.provider,
                account=request.account,
                region=request.region,
                model=request.model,
                operation=request.operation or "SUBMIT",
                state=_breaker_state(request.state),
                reason=request.reason,
            ),
            self._caller(),
        )
        return scheduler_service_pb2.ForceBreakerResponse(breaker=provider_views.breaker(status))

    async def _capability_service(self, context: Any, method: str) -> CapabilityPublishService:
        ensure_admin(self._caller(), method)
        if self._capabilities is None:
            await context.abort(grpc.StatusCode.UNIMPLEMENTED, f"{method}: no catalog")
            raise AssertionError("unreachable")
        return self._capabilities

    async def PublishCapabilities(
        self, request: scheduler_service_pb2.PublishCapabilitiesRequest, context: Any
    ) -> scheduler_service_pb2.PublishCapabilitiesResponse:
        service = await self._capability_service(context, "PublishCapabilities")
        result = await service.publish(capability_views.publish_input(request), self._caller())
        return capability_views.publish_response(result)

    async def ActivateCapabilities(
        self, request: scheduler_service_pb2.ActivateCapabilitiesRequest, context: Any
    ) -> scheduler_service_pb2.ActivateCapabilitiesResponse:
        service = await self._capability_service(context, "ActivateCapabilities")
        result = await service.activate(
            request.version,
            activate_at=capability_views.when(request, "activate_at"),
            force=Force(request.force, request.reason),
            caller=self._caller(),
        )
        history = await service.history(self._caller())
        row = next(r for r in history.releases if r.version == result.version)
        return scheduler_service_pb2.ActivateCapabilitiesResponse(
            release=capability_views.release(row),
            counts=dict(result.counts),
            samples_compiled=result.samples_compiled,
        )

    async def RollbackCapabilities(
        self, request: scheduler_service_pb2.RollbackCapabilitiesRequest, context: Any
    ) -> scheduler_service_pb2.RollbackCapabilitiesResponse:
        service = await self._capability_service(context, "RollbackCapabilities")
        result = await service.rollback(
            request.version, force=Force(request.force, request.reason), caller=self._caller()
        )
        return scheduler_service_pb2.RollbackCapabilitiesResponse(
            version=result.version,
            changes=capability_views.changes(result.changes),
            counts=dict(result.counts),
            forced_reason=result.forced_reason,
        )

    async def ListCapabilityHistory(
        self, request: scheduler_service_pb2.ListCapabilityHistoryRequest, context: Any
    ) -> scheduler_service_pb2.ListCapabilityHistoryResponse:
        service = await self._capability_service(context, "ListCapabilityHistory")
        return capability_views.history(await service.history(self._caller()))
