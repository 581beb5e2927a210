"""`vidroute.scheduler.v1.RoutingService`: a translator between protobuf and the routing services.

No SQL here: each method decodes the request, calls a service (`controlplane.service.quality`
for feedback and quality aggregates), and encodes the result. Domain errors become statuses in
`vidroute_core.wire.status.DomainErrorInterceptor`; the caller comes from
`controlplane.api.auth`, as for the scheduler API.

Methods whose service is not wired (canaries, routing policies, replay until their issue parts
land) answer UNIMPLEMENTED with the reason, never a generic error.
"""

from __future__ import annotations

from typing import Any, NoReturn

import grpc

from controlplane.api.auth import require_caller
from controlplane.service.access import Caller
from vidroute.scheduler.v1 import routing_service_pb2, routing_service_pb2_grpc


async def _unimplemented(context: Any, method: str, what: str) -> NoReturn:
    await context.abort(
        grpc.StatusCode.UNIMPLEMENTED,
        f"RoutingService.{method} is not available on this control plane yet ({what})",
    )
    raise AssertionError("abort returned")  # pragma: no cover - abort always raises


class RoutingServicer(routing_service_pb2_grpc.RoutingServiceServicer):
    """The decisions API: quality feedback and aggregates, canaries, policies, replay."""

    def __init__(self, *, default_caller: Caller | None = None) -> None:
        self._default_caller = default_caller  # only for a servicer driven without the server

    def _caller(self) -> Caller:
        return require_caller(self._default_caller)

    async def SubmitFeedback(
        self, request: routing_service_pb2.SubmitFeedbackRequest, context: Any
    ) -> routing_service_pb2.SubmitFeedbackResponse:
        await _unimplemented(context, "SubmitFeedback", "quality signals")

    async def GetQuality(
        self, request: routing_service_pb2.GetQualityRequest, context: Any
    ) -> routing_service_pb2.GetQualityResponse:
        await _unimplemented(context, "GetQuality", "quality signals")

    async def ListCanaries(
        self, request: routing_service_pb2.ListCanariesRequest, context: Any
    ) -> routing_service_pb2.ListCanariesResponse:
        await _unimplemented(context, "ListCanaries", "canary gates")

    async def PublishRoutingPolicy(
        self, request: routing_service_pb2.PublishRoutingPolicyRequest, context: Any
    ) -> routing_service_pb2.PublishRoutingPolicyResponse:
        await _unimplemented(context, "PublishRoutingPolicy", "routing policy publication")

    async def RollbackRoutingPolicy(
        self, request: routing_service_pb2.RollbackRoutingPolicyRequest, context: Any
    ) -> routing_service_pb2.RollbackRoutingPolicyResponse:
        await _unimplemented(context, "RollbackRoutingPolicy", "routing policy publication")

    async def ListRoutingPolicies(
        self, request: routing_service_pb2.ListRoutingPoliciesRequest, context: Any
    ) -> routing_service_pb2.ListRoutingPoliciesResponse:
        await _unimplemented(context, "ListRoutingPolicies", "routing policy publication")

    async def ReplayRoutes(
        self, request: routing_service_pb2.ReplayRoutesRequest, context: Any
    ) -> routing_service_pb2.ReplayRoutesResponse:
        await _unimplemented(context, "ReplayRoutes", "route replay")
