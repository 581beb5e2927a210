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
from controlplane.domain.quality import Verdict
from controlplane.service.access import Caller
from controlplane.service.quality import BucketView, FeedbackInput, QualityService
from vidroute.scheduler.v1 import routing_pb2, routing_service_pb2, routing_service_pb2_grpc

_VERDICTS = {
    routing_pb2.FEEDBACK_VERDICT_ACCEPTED: Verdict.ACCEPTED,
    routing_pb2.FEEDBACK_VERDICT_REJECTED: Verdict.REJECTED,
    routing_pb2.FEEDBACK_VERDICT_REGENERATED: Verdict.REGENERATED,
}


def bucket_view(row: BucketView) -> routing_pb2.QualityBucket:
    c, e = row.counts, row.estimate
    return routing_pb2.QualityBucket(
        provider=row.provider,
        model=row.model,
        mode=row.mode,
        bucket=row.bucket,
        accepted=c.accepted,
        rejected=c.rejected,
        regenerated=c.regenerated,
        technical_checks=c.technical_checks,
        technical_defects=c.technical_defects,
        score=e.score,
        score_low=e.low,
        score_high=e.high,
        user_acceptance_ratio=c.user_acceptance_ratio,
        regeneration_ratio=c.regeneration_ratio,
    )


async def _unimplemented(context: Any, method: str, what: str) -> NoReturn:
    await context.abort(
        grpc.StatusCode.UNIMPLEMENTED,
        f"RoutingService.{method} is not available on this control plane yet ({what})",
    )
    raise AssertionError("abort returned")  # pragma: no cover - abort always raises


class RoutingServicer(routing_service_pb2_grpc.RoutingServiceServicer):
    """The decisions API: quality feedback and aggregates, canaries, policies, replay."""

    def __init__(
        self, *, quality: QualityService | None = None, default_caller: Caller | None = None
    ) -> None:
        self._quality = quality
        self._default_caller = default_caller  # only for a servicer driven without the server

    def _caller(self) -> Caller:
        return require_caller(self._default_caller)

    async def SubmitFeedback(
        self, request: routing_service_pb2.SubmitFeedbackRequest, context: Any
    ) -> routing_service_pb2.SubmitFeedbackResponse:
        if self._quality is None:
            await _unimplemented(context, "SubmitFeedback", "quality signals")
        recorded = await self._quality.submit_feedback(
            FeedbackInput(
                task_id=request.task_id,
                verdict=_VERDICTS.get(request.verdict),
                tags=tuple(request.tags),
                comment=request.comment,
            ),
            self._caller(),
        )
        return routing_service_pb2.SubmitFeedbackResponse(recorded=recorded)

    async def GetQuality(
        self, request: routing_service_pb2.GetQualityRequest, context: Any
    ) -> routing_service_pb2.GetQualityResponse:
        if self._quality is None:
            await _unimplemented(context, "GetQuality", "quality signals")
        rows = await self._quality.get_quality(request.model, self._caller())
        return routing_service_pb2.GetQualityResponse(buckets=[bucket_view(r) for r in rows])

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
