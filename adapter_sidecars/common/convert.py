"""Protobuf <-> adapter-type translation for ``vidroute.adapter.v1`` (the servicer's only helper).

Enums cross by name (``JobState.RUNNING`` <-> ``JOB_STATE_RUNNING``), never by number. Specs are
decoded with `vidroute_core.wire.spec.spec_from_proto`, the same decoder the scheduler API uses.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime

from google.protobuf import duration_pb2, timestamp_pb2

from adapter_sidecars.common.types import (
    JobRef,
    JobStatus,
    MalformedPlan,
    Output,
    OutputPart,
    Plan,
    RecoverInput,
    SubmitOutcome,
    Transformation,
    TransformationKind,
    TransportStage,
    UsageRecord,
)
from vidroute.adapter.v1 import adapter_pb2 as pb
from vidroute.adapter.v1 import adapter_service_pb2 as svc
from vidroute.common.v1 import error_pb2, money_pb2
from vidroute_core.errors import ProviderError


def timestamp(when: datetime | None) -> timestamp_pb2.Timestamp | None:
    """An aware datetime as a Timestamp (None stays None)."""
    if when is None:
        return None
    ts = timestamp_pb2.Timestamp()
    ts.FromDatetime(when.astimezone(UTC))
    return ts


def from_timestamp(ts: timestamp_pb2.Timestamp, present: bool) -> datetime | None:
    """A Timestamp field as an aware UTC datetime, None when unset."""
    return ts.ToDatetime(tzinfo=UTC) if present else None


def recover_input(request: svc.RecoverSubmissionRequest) -> RecoverInput:
    """A RecoverSubmission request as the adapter's input (account/model default to the plan's)."""
    plan = plan_from_proto(request.plan) if request.HasField("plan") else None
    return RecoverInput(
        account=request.account or (plan.account if plan else ""),
        model=request.model or (plan.model if plan else ""),
        client_request_key=request.client_request_key,
        request_hash=request.request_hash,
        provider_request_id=request.provider_request_id,
        submitted_after=from_timestamp(
            request.submitted_after, request.HasField("submitted_after")
        ),
        submitted_before=from_timestamp(
            request.submitted_before, request.HasField("submitted_before")
        ),
        plan=plan,
        request_started_at=from_timestamp(
            request.request_started_at, request.HasField("request_started_at")
        ),
    )


def money(micros: int, currency: str) -> money_pb2.Money:
    """Integer micros of a currency."""
    return money_pb2.Money(
        amount_micros=micros, currency_code=currency if micros or currency else ""
    )


def error(err: ProviderError | None) -> error_pb2.Error | None:
    """A `ProviderError` as ``vidroute.common.v1.Error``."""
    if err is None:
        return None
    msg = error_pb2.Error(
        error_class=error_pb2.ErrorClass.Value(f"ERROR_CLASS_{err.error_class.value}"),
        code=err.code,
        message=err.message,
        retryable=err.retryable,
        failoverable=err.failoverable,
        provider_may_have_accepted=err.provider_may_have_accepted,
        raw_status_code=err.raw_status_code or 0,
    )
    if err.retry_after_ms is not None:
        msg.retry_after.CopyFrom(
            duration_pb2.Duration(
                seconds=err.retry_after_ms // 1000, nanos=(err.retry_after_ms % 1000) * 1_000_000
            )
        )
    return msg


def plan_to_proto(plan: Plan) -> pb.CompilePlan:
    """A compiled plan as ``CompilePlan``."""
    return pb.CompilePlan(
        provider=plan.provider,
        account=plan.account,
        model=plan.model,
        model_version=plan.model_version,
        capability_version=plan.capability_version,
        price_version=plan.price_version,
        endpoint=plan.endpoint,
        native_request_json=plan.native_request_json,
        request_hash=plan.request_hash,
        transformations=[
            pb.Transformation(
                field=t.field,
                kind=pb.TransformationKind.Value(f"TRANSFORMATION_KIND_{t.kind.value}"),
                detail=t.detail,
            )
            for t in plan.transformations
        ],
        estimated_cost=money(plan.estimated_cost_micros, plan.currency),
        submittable=plan.submittable,
    )


def plan_from_proto(msg: pb.CompilePlan) -> Plan:
    """Decode a plan handed back by the control plane; raises `MalformedPlan`."""
    native = None
    if msg.native_request_json:
        try:
            native = json.loads(msg.native_request_json)
        except ValueError as exc:
            raise MalformedPlan(f"native_request_json is not JSON: {exc}") from None
        if not isinstance(native, dict):
            raise MalformedPlan("native_request_json must be a JSON object")
    kinds = {v.number: v.name for v in pb.TransformationKind.DESCRIPTOR.values}
    transformations = tuple(
        Transformation(
            t.field,
            TransformationKind(kinds[t.kind].removeprefix("TRANSFORMATION_KIND_"))
            if t.kind
            else TransformationKind.EXACT,
            t.detail,
        )
        for t in msg.transformations
    )
    return Plan(
        provider=msg.provider,
        account=msg.account,
        model=msg.model,
        model_version=msg.model_version,
        capability_version=msg.capability_version,
        price_version=msg.price_version,
        endpoint=msg.endpoint,
        native_request=native,
        native_request_json=msg.native_request_json,
        request_hash=msg.request_hash,
        transformations=transformations,
        estimated_cost_micros=msg.estimated_cost.amount_micros,
        currency=msg.estimated_cost.currency_code,
        submittable=msg.submittable,
    )


def job_ref(ref: JobRef) -> pb.JobRef:
    """Adapter `JobRef` -> proto."""
    return pb.JobRef(
        provider_job_id=ref.provider_job_id,
        provider_request_id=ref.provider_request_id,
        account=ref.account,
        model=ref.model,
    )


def job_ref_from_proto(msg: pb.JobRef) -> JobRef:
    """Proto `JobRef` -> adapter."""
    return JobRef(msg.provider_job_id, msg.account, msg.model, msg.provider_request_id)


def output(out: Output) -> pb.Output:
    """An output locator."""
    return pb.Output(
        uri=out.uri,
        mime_type=out.mime_type,
        expires_at=timestamp(out.expires_at),
        size_bytes=out.size_bytes,
        checksum=out.checksum,
        fetch_through_adapter=out.fetch_through_adapter,
    )


def output_part(part: OutputPart) -> svc.FetchOutputResponse:
    """One message of a FetchOutput stream."""
    return svc.FetchOutputResponse(
        content_type=part.content_type,
        content_length=part.content_length,
        chunk=part.chunk,
        error=error(part.error),
    )


def job_status(status: JobStatus | None) -> pb.JobStatus | None:
    """A normalized status."""
    if status is None:
        return None
    msg = pb.JobStatus(
        state=pb.JobState.Value(f"JOB_STATE_{status.state.value}"),
        outputs=[output(o) for o in status.outputs],
        raw_status=status.raw_status,
        raw_payload_json=status.raw_payload_json,
        failure=error(status.failure),
        updated_at=timestamp(status.updated_at),
    )
    if status.progress is not None:
        msg.progress = status.progress
    if status.actual_cost_micros is not None:
        msg.actual_cost.CopyFrom(money(status.actual_cost_micros, status.currency))
    return msg


def submit_outcome(outcome: SubmitOutcome) -> dict[str, object]:
    """Fields of ``SubmitResponse`` (a dict so the servicer builds the message)."""
    stage = (
        pb.TRANSPORT_STAGE_UNSPECIFIED
        if outcome.transport_stage is TransportStage.NONE
        else pb.TransportStage.Value(f"TRANSPORT_STAGE_{outcome.transport_stage.value}")
    )
    return {
        "kind": pb.SubmitOutcomeKind.Value(f"SUBMIT_OUTCOME_KIND_{outcome.kind.value}"),
        "job": job_ref(outcome.job) if outcome.job else None,
        "raw_status": outcome.raw_status,
        "error": error(outcome.error),
        "transport_stage": stage,
        "request_started_at": timestamp(outcome.request_started_at),
    }


def usage_record(rec: UsageRecord) -> pb.UsageRecord:
    """A usage row."""
    return pb.UsageRecord(
        provider_job_id=rec.provider_job_id,
        model=rec.model,
        usage_time=timestamp(rec.usage_time),
        provider_milliunits=rec.provider_milliunits,
        provider_unit=rec.provider_unit,
        cost=money(rec.cost_micros, rec.currency),
        raw_json=rec.raw_json,
        provider_request_id=rec.provider_request_id,
        client_request_key=rec.client_request_key,
    )
