"""`vidroute.scheduler.v1.RoutingService`: a translator between protobuf and the routing services.

No SQL here: each method decodes the request, calls a service (`controlplane.service.quality`
for feedback and quality aggregates, `controlplane.service.routing_policies` for policies and
canaries), and encodes the result. Domain errors become statuses in
`vidroute_core.wire.status.DomainErrorInterceptor`; the caller comes from
`controlplane.api.auth`, as for the scheduler API.

Methods whose service is not wired (canaries, routing policies, replay until their issue parts
land) answer UNIMPLEMENTED with the reason, never a generic error.
"""

from __future__ import annotations

from typing import Any, NoReturn

import grpc

from controlplane.api.auth import require_caller
from controlplane.api.document_views import DocumentCalls, activation_view, ts
from controlplane.api.replay_views import replay_input, replay_report
from controlplane.domain.quality import Verdict
from controlplane.domain.routing.canary import CanaryStatus
from controlplane.persistence.routing_policies import PolicyRow
from controlplane.service.access import Caller
from controlplane.service.quality import BucketView, FeedbackInput, QualityService
from controlplane.service.replay import ReplayService
from controlplane.service.routing_policies import CanaryView, RoutingPolicyService
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


_CANARY_STATUS = {
    CanaryStatus.ACTIVE: routing_pb2.CANARY_STATUS_ACTIVE,
    CanaryStatus.PROMOTED: routing_pb2.CANARY_STATUS_PROMOTED,
    CanaryStatus.ROLLED_BACK: routing_pb2.CANARY_STATUS_ROLLED_BACK,
}


def policy_view(row: PolicyRow) -> routing_pb2.RoutingPolicyVersion:
    return routing_pb2.RoutingPolicyVersion(
        version=row.version,
        document=row.document,
        active=row.active,
        published_at=ts(row.published_at),
        source=row.source,
    )


def canary_view(view: CanaryView) -> routing_pb2.CanaryState:
    s = view.state
    return routing_pb2.CanaryState(
        candidate_id=s.candidate_id,
        stages=list(s.stages),
        traffic_percent=view.traffic_percent,
        status=_CANARY_STATUS[s.status],
        gates=s.gates,
        history=[
            routing_pb2.CanaryTransition(
                from_percent=t.from_percent,
                to_percent=t.to_percent,
                action=t.action,
                reason=t.reason,
                observed=t.observed,
                at=ts(t.at),
            )
            for t in view.history
        ],
        updated_at=ts(s.updated_at),
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
        self,
        *,
        quality: QualityService | None = None,
        policies: RoutingPolicyService | None = None,
        replay: ReplayService | None = None,
        default_caller: Caller | None = None,
    ) -> None:
        self._quality = quality
        self._policies = policies
        self._policy_docs = (
            None
            if policies is None
            else DocumentCalls(policies, policy_view, field="policy", default_caller=default_caller)
        )
        self._replay = replay
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
        if self._policies is None:
            await _unimplemented(context, "ListCanaries", "canary gates")
        views = await self._policies.list_canaries(self._caller())
        return routing_service_pb2.ListCanariesResponse(canaries=[canary_view(v) for v in views])

    async def PublishRoutingPolicy(
        self, request: routing_service_pb2.PublishRoutingPolicyRequest, context: Any
    ) -> routing_service_pb2.PublishRoutingPolicyResponse:
        if self._policy_docs is None:
            await _unimplemented(context, "PublishRoutingPolicy", "routing policy publication")
        return routing_service_pb2.PublishRoutingPolicyResponse(
            **await self._policy_docs.publish(request)
        )

    async def RollbackRoutingPolicy(
        self, request: routing_service_pb2.RollbackRoutingPolicyRequest, context: Any
    ) -> routing_service_pb2.RollbackRoutingPolicyResponse:
        if self._policy_docs is None:
            await _unimplemented(context, "RollbackRoutingPolicy", "routing policy publication")
        policy = await self._policy_docs.rollback(request)
        return routing_service_pb2.RollbackRoutingPolicyResponse(policy=policy)

    async def ActivateRoutingPolicy(
        self, request: routing_service_pb2.ActivateRoutingPolicyRequest, context: Any
    ) -> routing_service_pb2.ActivateRoutingPolicyResponse:
        if self._policy_docs is None:
            await _unimplemented(context, "ActivateRoutingPolicy", "routing policy publication")
        policy = await self._policy_docs.activate(request)
        return routing_service_pb2.ActivateRoutingPolicyResponse(policy=policy)

    async def ListRoutingPolicyActivations(
        self, request: routing_service_pb2.ListRoutingPolicyActivationsRequest, context: Any
    ) -> routing_service_pb2.ListRoutingPolicyActivationsResponse:
        if self._policies is None:
            await _unimplemented(
                context, "ListRoutingPolicyActivations", "routing policy publication"
            )
        rows = await self._policies.activations(self._caller())
        return routing_service_pb2.ListRoutingPolicyActivationsResponse(
            activations=[activation_view(r) for r in rows]
        )

    async def ListRoutingPolicies(
        self, request: routing_service_pb2.ListRoutingPoliciesRequest, context: Any
    ) -> routing_service_pb2.ListRoutingPoliciesResponse:
        if self._policies is None:
            await _unimplemented(context, "ListRoutingPolicies", "routing policy publication")
        rows = await self._policies.list_policies(self._caller())
        return routing_service_pb2.ListRoutingPoliciesResponse(
            policies=[policy_view(r) for r in rows]
        )

    async def ReplayRoutes(
        self, request: routing_service_pb2.ReplayRoutesRequest, context: Any
    ) -> routing_service_pb2.ReplayRoutesResponse:
        if self._replay is None:
            await _unimplemented(context, "ReplayRoutes", "route replay")
        report = await self._replay.replay(replay_input(request), self._caller())
        return routing_service_pb2.ReplayRoutesResponse(report=replay_report(report))
