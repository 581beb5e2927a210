"""The RoutingService half of the SDK: feedback, quality, canaries, routing policies, replay.

`RoutingCalls` is mixed into `Client`, `AsyncRoutingCalls` into `AsyncClient`; both use the
client's channel (same target, token, deadline and retry policy). One example per method::

    with Client() as client:
        client.feedback(task_id, "rejected", tags=["text_rendering"], comment="garbled sign")
        for b in client.quality(model="gen4.5"):          # QualityBucket messages (admin)
            print(b.model, b.mode, b.bucket, b.score, b.score_low, b.score_high)
        for canary in client.canaries():                  # CanaryState messages (admin)
            print(canary.candidate_id, canary.traffic_percent, canary.status)
        for version in client.routing_policies():         # newest first; .active marks one
            print(version.version, version.active)
        client.publish_routing_policy(Path("policy.yaml"), dry_run=True).version
        client.rollback_routing_policy()                  # back to the version before
        report = client.replay_routes(Path("candidate.yaml"),
                                      since=datetime(2026, 11, 1, tzinfo=UTC), tenant_id="acme")
        print(report.decisions, report.changed)

(`AsyncClient`: the same calls, awaited.) A verdict is a `FeedbackVerdict` value or its name
with or without the prefix (``"accepted"``, ``"FEEDBACK_VERDICT_ACCEPTED"``); an unknown name is
InvalidArgument on field ``verdict`` before anything is sent. SubmitFeedback is idempotent per
(task, verdict): a retried call whose first try landed answers ``recorded=False``.
"""

from __future__ import annotations

import builtins
from collections.abc import Callable, Iterable
from datetime import datetime
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

import grpc
from google.protobuf import timestamp_pb2

from clients.sdk import _common as c
from clients.sdk import errors
from vidroute.scheduler.v1 import routing_pb2 as rpb
from vidroute.scheduler.v1 import routing_service_pb2 as rapi
from vidroute.scheduler.v1 import routing_service_pb2_grpc as rapi_grpc

__all__ = ["AsyncRoutingCalls", "RoutingCalls"]

Document = str | bytes | Path


def verdict(value: int | str | None) -> rpb.FeedbackVerdict.ValueType:
    """A FeedbackVerdict from its number or name (``"accepted"``); None or "" is unset."""
    number = c._enum_value(rpb.FeedbackVerdict, "FEEDBACK_VERDICT_", value, "verdict")
    return rpb.FeedbackVerdict.ValueType(number)


def feedback_request(
    task_id: str, value: int | str, tags: Iterable[str], comment: str
) -> rapi.SubmitFeedbackRequest:
    return rapi.SubmitFeedbackRequest(
        task_id=task_id, verdict=verdict(value), tags=list(tags), comment=comment
    )


def _text(document: Document, source: str) -> tuple[str, str]:
    """A document's text and its source (a path's name when none is given)."""
    if isinstance(document, Path):
        return document.read_text(encoding="utf-8"), source or str(document)
    if isinstance(document, bytes):
        return document.decode("utf-8"), source
    return document, source


def publish_request(
    document: Document, source: str, dry_run: bool
) -> rapi.PublishRoutingPolicyRequest:
    text, source = _text(document, source)
    return rapi.PublishRoutingPolicyRequest(document=text, source=source, dry_run=dry_run)


def _timestamp(at: datetime, field: str) -> timestamp_pb2.Timestamp:
    if at.tzinfo is None:
        raise errors.InvalidArgument(
            grpc.StatusCode.INVALID_ARGUMENT,
            f"{field} has no time zone",
            field_violations=(errors.FieldViolation(field, "an aware datetime (tzinfo=UTC)"),),
        )
    ts = timestamp_pb2.Timestamp()
    ts.FromDatetime(at)
    return ts


def replay_request(
    policy_document: Document, since: datetime | None, until: datetime | None, tenant_id: str
) -> rapi.ReplayRoutesRequest:
    text, _ = _text(policy_document, "")
    request = rapi.ReplayRoutesRequest(policy_document=text, tenant_id=tenant_id)
    if since is not None:
        request.since.CopyFrom(_timestamp(since, "since"))
    if until is not None:
        request.until.CopyFrom(_timestamp(until, "until"))
    return request


class RoutingCalls:
    """RoutingService methods of the blocking `Client`."""

    if TYPE_CHECKING:
        _channel: grpc.Channel

        def _call(
            self, method: Callable[..., Any], request: Any, timeout: float | None = None
        ) -> Any: ...

    @cached_property
    def _routing(self) -> rapi_grpc.RoutingServiceStub:
        return rapi_grpc.RoutingServiceStub(self._channel)

    def feedback(
        self, task_id: str, verdict: int | str, *, tags: Iterable[str] = (), comment: str = ""
    ) -> bool:
        """Record your verdict on a SUCCEEDED task's output (ACCEPTED, REJECTED, REGENERATED);
        False when the task already had this verdict (nothing changes)."""
        reply: rapi.SubmitFeedbackResponse = self._call(
            self._routing.SubmitFeedback, feedback_request(task_id, verdict, tags, comment)
        )
        return reply.recorded

    def quality(self, model: str = "") -> builtins.list[rpb.QualityBucket]:
        """Admin: the quality aggregates per (model, mode, tag bucket), of one model or all."""
        reply: rapi.GetQualityResponse = self._call(
            self._routing.GetQuality, rapi.GetQualityRequest(model=model)
        )
        return list(reply.buckets)

    def canaries(self) -> builtins.list[rpb.CanaryState]:
        """Admin: every canary with its stages, last gate evaluation and transitions."""
        reply: rapi.ListCanariesResponse = self._call(
            self._routing.ListCanaries, rapi.ListCanariesRequest()
        )
        return list(reply.canaries)

    def routing_policies(self) -> builtins.list[rpb.RoutingPolicyVersion]:
        """Admin: the published routing policy versions, newest first."""
        reply: rapi.ListRoutingPoliciesResponse = self._call(
            self._routing.ListRoutingPolicies, rapi.ListRoutingPoliciesRequest()
        )
        return list(reply.policies)

    def publish_routing_policy(
        self, document: Document, *, source: str = "", dry_run: bool = False
    ) -> rpb.RoutingPolicyVersion:
        """Admin: validate a policy document (text, bytes or a path) and make it active;
        `dry_run` validates and writes nothing. Sent once (never retried)."""
        reply: rapi.PublishRoutingPolicyResponse = self._call(
            self._routing.PublishRoutingPolicy, publish_request(document, source, dry_run)
        )
        return reply.policy

    def rollback_routing_policy(self, version: str = "") -> rpb.RoutingPolicyVersion:
        """Admin: make `version` active again (default: the one before the active version)."""
        reply: rapi.RollbackRoutingPolicyResponse = self._call(
            self._routing.RollbackRoutingPolicy, rapi.RollbackRoutingPolicyRequest(version=version)
        )
        return reply.policy

    def replay_routes(
        self,
        policy_document: Document,
        *,
        since: datetime | None = None,
        until: datetime | None = None,
        tenant_id: str = "",
    ) -> rpb.ReplayReport:
        """Admin: re-run routing under a candidate policy over the recorded decisions in
        [since, until) (aware datetimes), of one tenant or all; calls no provider."""
        reply: rapi.ReplayRoutesResponse = self._call(
            self._routing.ReplayRoutes, replay_request(policy_document, since, until, tenant_id)
        )
        return reply.report


class AsyncRoutingCalls:
    """RoutingService methods of `AsyncClient` (see `RoutingCalls`)."""

    if TYPE_CHECKING:
        _channel: grpc.aio.Channel

        async def _call(self, method: Callable[..., Any], request: Any) -> Any: ...

    @cached_property
    def _routing(self) -> rapi_grpc.RoutingServiceAsyncStub:
        return rapi_grpc.RoutingServiceStub(self._channel)

    async def feedback(
        self, task_id: str, verdict: int | str, *, tags: Iterable[str] = (), comment: str = ""
    ) -> bool:
        """Record your verdict on a SUCCEEDED task's output; False when already recorded."""
        reply: rapi.SubmitFeedbackResponse = await self._call(
            self._routing.SubmitFeedback, feedback_request(task_id, verdict, tags, comment)
        )
        return reply.recorded

    async def quality(self, model: str = "") -> builtins.list[rpb.QualityBucket]:
        """Admin: the quality aggregates per (model, mode, tag bucket)."""
        reply: rapi.GetQualityResponse = await self._call(
            self._routing.GetQuality, rapi.GetQualityRequest(model=model)
        )
        return list(reply.buckets)

    async def canaries(self) -> builtins.list[rpb.CanaryState]:
        """Admin: every canary with its stages, gates and transitions."""
        reply: rapi.ListCanariesResponse = await self._call(
            self._routing.ListCanaries, rapi.ListCanariesRequest()
        )
        return list(reply.canaries)

    async def routing_policies(self) -> builtins.list[rpb.RoutingPolicyVersion]:
        """Admin: the published routing policy versions, newest first."""
        reply: rapi.ListRoutingPoliciesResponse = await self._call(
            self._routing.ListRoutingPolicies, rapi.ListRoutingPoliciesRequest()
        )
        return list(reply.policies)

    async def publish_routing_policy(
        self, document: Document, *, source: str = "", dry_run: bool = False
    ) -> rpb.RoutingPolicyVersion:
        """Admin: validate a policy document and make it active (`dry_run`: write nothing)."""
        reply: rapi.PublishRoutingPolicyResponse = await self._call(
            self._routing.PublishRoutingPolicy, publish_request(document, source, dry_run)
        )
        return reply.policy

    async def rollback_routing_policy(self, version: str = "") -> rpb.RoutingPolicyVersion:
        """Admin: make `version` active again (default: the one before the active version)."""
        reply: rapi.RollbackRoutingPolicyResponse = await self._call(
            self._routing.RollbackRoutingPolicy, rapi.RollbackRoutingPolicyRequest(version=version)
        )
        return reply.policy

    async def replay_routes(
        self,
        policy_document: Document,
        *,
        since: datetime | None = None,
        until: datetime | None = None,
        tenant_id: str = "",
    ) -> rpb.ReplayReport:
        """Admin: re-run routing under a candidate policy over recorded decisions."""
        reply: rapi.ReplayRoutesResponse = await self._call(
            self._routing.ReplayRoutes, replay_request(policy_document, since, until, tenant_id)
        )
        return reply.report
