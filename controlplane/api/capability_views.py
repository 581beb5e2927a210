"""Capability releases as protobuf: the PublishCapabilities family's responses (translation
only; the semantics are `service.capability_publish`'s)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from typing import Any

from google.protobuf import timestamp_pb2

from controlplane.api.views import timestamp
from controlplane.capabilities.release import ModelChange
from controlplane.persistence.capability_releases import ActivationRow, ReleaseRow
from controlplane.service.capability_checks import Force
from controlplane.service.capability_publish import (
    CapabilityHistory,
    PublishInput,
    PublishResult,
)
from vidroute.scheduler.v1 import capability_release_pb2 as pb
from vidroute.scheduler.v1 import scheduler_service_pb2 as api


def when(message: Any, name: str) -> datetime | None:
    """A Timestamp field of `message`, None when unset."""
    if not message.HasField(name):
        return None
    value: timestamp_pb2.Timestamp = getattr(message, name)
    return value.ToDatetime(tzinfo=UTC)


def publish_input(request: api.PublishCapabilitiesRequest) -> PublishInput:
    return PublishInput(
        request.document,
        request.source,
        request.dry_run,
        version=request.version,
        activate_at=when(request, "activate_at"),
        staged=request.staged,
        force=Force(request.force, request.reason),
    )


def change(c: ModelChange | Mapping[str, Any]) -> pb.CapabilityChange:
    c = c if isinstance(c, ModelChange) else ModelChange.from_json(c)
    return pb.CapabilityChange(
        provider=c.provider,
        account=c.account,
        model=c.model,
        kind=c.kind,
        fields=list(c.fields),
        old_capability_version=c.old_capability_version,
        new_capability_version=c.new_capability_version,
        old_price_version=c.old_price_version,
        new_price_version=c.new_price_version,
        old_price_micros_per_unit=c.old_price_micros or 0,
        new_price_micros_per_unit=c.new_price_micros or 0,
        price_flags=list(c.price_flags),
    )


def changes(items: Iterable[ModelChange | Mapping[str, Any]]) -> list[pb.CapabilityChange]:
    return [change(c) for c in items]


def publish_response(result: PublishResult) -> api.PublishCapabilitiesResponse:
    return api.PublishCapabilitiesResponse(
        counts=dict(result.counts),
        dry_run=result.dry_run,
        version=result.version,
        state=result.state,
        effective_from=timestamp(result.effective_from),
        changes=changes(result.changes),
        samples_compiled=result.samples_compiled,
        forced_reason=result.forced_reason,
        unchanged=result.unchanged,
    )


def release(row: ReleaseRow) -> pb.CapabilityRelease:
    return pb.CapabilityRelease(
        version=row.version,
        state=row.state,
        source=row.source,
        actor=row.actor,
        published_at=timestamp(row.published_at),
        effective_from=timestamp(row.effective_from),
        forced_reason=row.forced_reason or "",
        changes=changes(row.changes),
    )


def activation(row: ActivationRow) -> pb.CapabilityActivation:
    return pb.CapabilityActivation(
        version=row.version,
        previous_version=row.previous_version or "",
        action=row.action,
        actor=row.actor,
        at=timestamp(row.at),
        effective_from=timestamp(row.effective_from),
        reason=row.reason or "",
        replaced=changes(row.replaced),
    )


def history(h: CapabilityHistory) -> api.ListCapabilityHistoryResponse:
    return api.ListCapabilityHistoryResponse(
        releases=[release(r) for r in h.releases],
        activations=[activation(a) for a in h.activations],
    )
