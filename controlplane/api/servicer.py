"""`vidroute.scheduler.v1.SchedulerService`: a translator between protobuf and the services.

No SQL, Redis or provider call here: each method decodes the request, calls a transport-neutral
service, and encodes the result. Errors are domain exceptions, mapped to gRPC statuses by
`controlplane.api.errors.DomainErrorInterceptor`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import grpc

from controlplane.api import views
from controlplane.api.convert import spec_from_proto
from controlplane.domain.states import TaskState
from controlplane.service.tasks import CreateTaskInput, ListTasksInput, TaskService, parse_task_id
from vidroute.scheduler.v1 import scheduler_pb2, scheduler_service_pb2, scheduler_service_pb2_grpc

_UNIMPLEMENTED = "implemented by the scheduler execution and decision issues"


class SchedulerServicer(scheduler_service_pb2_grpc.SchedulerServiceServicer):
    """The public scheduler API."""

    def __init__(self, tasks: TaskService) -> None:
        self._tasks = tasks

    async def CreateTask(
        self, request: scheduler_service_pb2.CreateTaskRequest, context: Any
    ) -> scheduler_service_pb2.CreateTaskResponse:
        spec, violations = spec_from_proto(request.spec)
        record, created = await self._tasks.create_task(
            CreateTaskInput(
                spec=spec, idempotency_key=request.idempotency_key, violations=violations
            )
        )
        return scheduler_service_pb2.CreateTaskResponse(task=views.task(record), created=created)

    async def GetTask(
        self, request: scheduler_service_pb2.GetTaskRequest, context: Any
    ) -> scheduler_service_pb2.GetTaskResponse:
        detail = await self._tasks.get_task(parse_task_id(request.task_id))
        return scheduler_service_pb2.GetTaskResponse(task=views.task(detail.task, detail))

    async def ListTasks(
        self, request: scheduler_service_pb2.ListTasksRequest, context: Any
    ) -> scheduler_service_pb2.ListTasksResponse:
        state = (
            TaskState(scheduler_pb2.TaskState.Name(request.state).removeprefix("TASK_STATE_"))
            if request.state
            else None
        )
        records, token = await self._tasks.list_tasks(
            ListTasksInput(
                tenant_id=request.tenant_id or None,
                state=state,
                page_size=request.page_size,
                page_token=request.page_token or None,
            )
        )
        return scheduler_service_pb2.ListTasksResponse(
            tasks=[views.task(r) for r in records], next_page_token=token or ""
        )

    async def CancelTask(
        self, request: scheduler_service_pb2.CancelTaskRequest, context: Any
    ) -> scheduler_service_pb2.CancelTaskResponse:
        detail = await self._tasks.cancel_task(parse_task_id(request.task_id), request.reason)
        return scheduler_service_pb2.CancelTaskResponse(task=views.task(detail.task, detail))

    async def ExplainRoute(
        self, request: scheduler_service_pb2.ExplainRouteRequest, context: Any
    ) -> scheduler_service_pb2.ExplainRouteResponse:
        detail = await self._tasks.get_task(parse_task_id(request.task_id))
        return scheduler_service_pb2.ExplainRouteResponse(
            decisions=[views.route_decision(d) for d in detail.route_decisions]
        )

    async def WatchTask(
        self, request: scheduler_service_pb2.WatchTaskRequest, context: Any
    ) -> AsyncIterator[scheduler_service_pb2.WatchTaskResponse]:
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, f"WatchTask is {_UNIMPLEMENTED}")
        yield scheduler_service_pb2.WatchTaskResponse()  # pragma: no cover - unreachable

    async def ListProviders(
        self, request: scheduler_service_pb2.ListProvidersRequest, context: Any
    ) -> scheduler_service_pb2.ListProvidersResponse:
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, f"ListProviders is {_UNIMPLEMENTED}")
        raise AssertionError("unreachable")

    async def GetProviderHealth(
        self, request: scheduler_service_pb2.GetProviderHealthRequest, context: Any
    ) -> scheduler_service_pb2.GetProviderHealthResponse:
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, f"GetProviderHealth is {_UNIMPLEMENTED}")
        raise AssertionError("unreachable")

    async def ForceBreaker(
        self, request: scheduler_service_pb2.ForceBreakerRequest, context: Any
    ) -> scheduler_service_pb2.ForceBreakerResponse:
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, f"ForceBreaker is {_UNIMPLEMENTED}")
        raise AssertionError("unreachable")
