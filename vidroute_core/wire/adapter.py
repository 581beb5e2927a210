"""``vidroute.adapter.v1`` <-> `vidroute_core.adapter`: the one translation both ends of the
adapter seam use (the sidecar's servicer and the control plane's gRPC client).

Enums cross by name (``JobState.RUNNING`` <-> ``JOB_STATE_RUNNING``), never by number; an unset
(``*_UNSPECIFIED``) value reads as the cautious member: UNRECOGNIZED for a job state, UNKNOWN
for a submit, INCONCLUSIVE for a verdict, NONE for a transport stage. In-band errors are
rebuilt with the handling matrix (`make_error`), so retry/failover flags always come from one
table whoever sent them. Decoders are the encoders' inverses; what a side adds on top (the
sidecar parses a plan's native body, the control plane prices a currency-less record in USD)
stays on that side.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any, TypeVar

from google.protobuf import duration_pb2, json_format, timestamp_pb2
from google.protobuf.descriptor import EnumDescriptor

from vidroute.adapter.v1 import adapter_pb2 as pb
from vidroute.adapter.v1 import adapter_service_pb2 as svc
from vidroute.common.v1 import error_pb2, money_pb2
from vidroute_core.adapter import (
    AdapterDescription,
    AdapterInfo,
    CancelResult,
    CompiledPlan,
    JobOutput,
    JobRef,
    JobSnapshot,
    JobState,
    LoadReport,
    ModelLoad,
    OutputChunk,
    PollResult,
    RecoverQuery,
    RecoverResult,
    RecoveryVerdict,
    SubmitKind,
    SubmitOutcome,
    Transformation,
    TransformationKind,
    TransportStage,
    UsageRecord,
    UsageResult,
)
from vidroute_core.errors import ErrorClass, ProviderError, make_error
from vidroute_core.wire.capability import capability_document, capability_to_proto

E = TypeVar("E", bound=enum.Enum)

_ADAPTER = pb.DESCRIPTOR.enum_types_by_name
#: Python enum -> (proto enum, value prefix, the member an unset value reads as).
ENUMS: Mapping[type[enum.Enum], tuple[EnumDescriptor, str, enum.Enum | None]] = {
    JobState: (_ADAPTER["JobState"], "JOB_STATE_", JobState.UNRECOGNIZED),
    SubmitKind: (_ADAPTER["SubmitOutcomeKind"], "SUBMIT_OUTCOME_KIND_", SubmitKind.UNKNOWN),
    TransportStage: (_ADAPTER["TransportStage"], "TRANSPORT_STAGE_", TransportStage.NONE),
    TransformationKind: (_ADAPTER["TransformationKind"], "TRANSFORMATION_KIND_", None),
    RecoveryVerdict: (
        _ADAPTER["RecoveryVerdict"],
        "RECOVERY_VERDICT_",
        RecoveryVerdict.INCONCLUSIVE,
    ),
    ErrorClass: (error_pb2.DESCRIPTOR.enum_types_by_name["ErrorClass"], "ERROR_CLASS_", None),
}


def enum_to_proto(member: enum.Enum) -> int:
    """The proto number of a Python enum member; a member the proto spells as its unset value
    (TransportStage.NONE: "no transport failure") is 0."""
    descriptor, prefix, _ = ENUMS[type(member)]
    value = descriptor.values_by_name.get(f"{prefix}{member.value}")
    if value is None:
        if member is ENUMS[type(member)][2]:
            return 0
        raise ValueError(f"{member!r} has no value in {descriptor.full_name}")
    return int(value.number)


def enum_from_proto(enum_type: type[E], number: int) -> E | None:
    """The Python member of a proto number; the unset-reading member (or None) for 0."""
    descriptor, prefix, unset = ENUMS[enum_type]
    if number == 0:
        return unset  # type: ignore[return-value]  # ENUMS' unset member is enum_type's own
    return enum_type(descriptor.values_by_number[number].name.removeprefix(prefix))


def _required(enum_type: type[E], number: int) -> E:
    member = enum_from_proto(enum_type, number)
    if member is None:
        raise ValueError(f"{enum_type.__name__} unset")
    return member


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


def money(micros: int, currency: str) -> money_pb2.Money:
    """Integer micros of a currency (no currency on a zero amount that names none)."""
    return money_pb2.Money(
        amount_micros=micros, currency_code=currency if micros or currency else ""
    )


def error_to_proto(err: ProviderError | None) -> error_pb2.Error | None:
    """A `ProviderError` as ``vidroute.common.v1.Error``."""
    if err is None:
        return None
    msg = error_pb2.Error(
        error_class=enum_to_proto(err.error_class),  # type: ignore[arg-type]  # enum_to_proto gives int; the field wants the ValueType
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


def error_from_proto(msg: error_pb2.Error, present: bool = True) -> ProviderError | None:
    """An in-band error rebuilt with our handling matrix; None when unset."""
    if not present or msg.error_class == error_pb2.ERROR_CLASS_UNSPECIFIED:
        return None
    retry_ms = (
        msg.retry_after.seconds * 1000 + msg.retry_after.nanos // 1_000_000
        if msg.HasField("retry_after")
        else None
    )
    return make_error(
        _required(ErrorClass, msg.error_class),
        msg.code,
        msg.message,
        retry_after_ms=retry_ms,
        raw_status_code=msg.raw_status_code or None,
    )


def _error_field(msg: Any) -> ProviderError | None:
    return error_from_proto(msg.error, msg.HasField("error"))


def plan_to_proto(plan: CompiledPlan) -> pb.CompilePlan:
    """A plan as ``CompilePlan``: its stored JSON form verbatim when it has one."""
    if plan.plan_json:
        return json_format.ParseDict(dict(plan.plan_json), pb.CompilePlan())
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
            pb.Transformation(field=t.field, kind=enum_to_proto(t.kind), detail=t.detail)  # type: ignore[arg-type]  # enum_to_proto gives int; the field wants the ValueType
            for t in plan.transformations
        ],
        estimated_cost=money(plan.estimated_cost_micros, plan.currency),
        submittable=plan.submittable,
    )


def plan_from_proto(msg: pb.CompilePlan) -> CompiledPlan:
    """A ``CompilePlan`` with its JSON form kept; a transformation without a kind says nothing
    and is dropped. The native body stays unparsed (`CompiledPlan.native_request` is None)."""
    return CompiledPlan(
        provider=msg.provider,
        account=msg.account,
        model=msg.model,
        model_version=msg.model_version,
        capability_version=msg.capability_version,
        price_version=msg.price_version,
        request_hash=msg.request_hash,
        estimated_cost_micros=msg.estimated_cost.amount_micros,
        currency=msg.estimated_cost.currency_code,
        submittable=msg.submittable,
        transformations=tuple(
            Transformation(t.field, _required(TransformationKind, t.kind), t.detail)
            for t in msg.transformations
            if t.kind != pb.TRANSFORMATION_KIND_UNSPECIFIED
        ),
        endpoint=msg.endpoint,
        native_request_json=msg.native_request_json,
        plan_json=json_format.MessageToDict(msg, preserving_proto_field_name=True),
    )


def job_ref_to_proto(ref: JobRef) -> pb.JobRef:
    """A `JobRef` as the proto message."""
    return pb.JobRef(
        provider_job_id=ref.provider_job_id,
        provider_request_id=ref.provider_request_id,
        account=ref.account,
        model=ref.model,
    )


def job_ref_from_proto(msg: pb.JobRef) -> JobRef:
    """A proto `JobRef`."""
    return JobRef(msg.provider_job_id, msg.account, msg.model, msg.provider_request_id)


def _named_job(msg: Any) -> JobRef | None:
    """The reply's job, if it names one: a job without an id names nothing."""
    return job_ref_from_proto(msg.job) if msg.job.provider_job_id else None


def output_to_proto(out: JobOutput) -> pb.Output:
    """An output locator."""
    return pb.Output(
        uri=out.uri,
        mime_type=out.mime_type,
        expires_at=timestamp(out.expires_at),
        size_bytes=out.size_bytes,
        checksum=out.checksum,
        fetch_through_adapter=out.fetch_through_adapter,
    )


def output_from_proto(msg: pb.Output) -> JobOutput:
    """A proto output locator."""
    return JobOutput(
        uri=msg.uri,
        mime_type=msg.mime_type,
        expires_at=from_timestamp(msg.expires_at, msg.HasField("expires_at")),
        size_bytes=msg.size_bytes,
        checksum=msg.checksum,
        fetch_through_adapter=msg.fetch_through_adapter,
    )


def snapshot_to_proto(snapshot: JobSnapshot | None) -> pb.JobStatus | None:
    """A job snapshot as ``JobStatus`` (None stays None)."""
    if snapshot is None:
        return None
    msg = pb.JobStatus(
        state=enum_to_proto(snapshot.state),  # type: ignore[arg-type]  # enum_to_proto gives int; the field wants the ValueType
        outputs=[output_to_proto(o) for o in snapshot.outputs],
        raw_status=snapshot.raw_status,
        raw_payload_json=snapshot.raw_payload_json,
        failure=error_to_proto(snapshot.failure),
        updated_at=timestamp(snapshot.updated_at),
    )
    if snapshot.progress is not None:
        msg.progress = snapshot.progress
    if snapshot.queue_position is not None:
        msg.queue_position = snapshot.queue_position
    if snapshot.actual_cost_micros is not None:
        msg.actual_cost.CopyFrom(money(snapshot.actual_cost_micros, snapshot.currency))
    return msg


def snapshot_from_proto(msg: pb.JobStatus) -> JobSnapshot:
    """A ``JobStatus`` as a job snapshot."""
    cost = msg.HasField("actual_cost")
    return JobSnapshot(
        state=_required(JobState, msg.state),
        raw_status=msg.raw_status,
        raw_payload_json=msg.raw_payload_json,
        progress=msg.progress if msg.HasField("progress") else None,
        outputs=tuple(output_from_proto(o) for o in msg.outputs),
        failure=error_from_proto(msg.failure, msg.HasField("failure")),
        updated_at=from_timestamp(msg.updated_at, msg.HasField("updated_at")),
        actual_cost_micros=msg.actual_cost.amount_micros if cost else None,
        currency=msg.actual_cost.currency_code if cost else "",
        queue_position=msg.queue_position if msg.HasField("queue_position") else None,
    )


def submit_to_proto(outcome: SubmitOutcome) -> svc.SubmitResponse:
    """A submit outcome as ``SubmitResponse`` (a `CallFailure` never goes on the wire)."""
    return svc.SubmitResponse(
        kind=enum_to_proto(outcome.kind),  # type: ignore[arg-type]  # enum_to_proto gives int; the field wants the ValueType
        job=job_ref_to_proto(outcome.job) if outcome.job else None,
        raw_status=outcome.raw_status,
        error=error_to_proto(outcome.error),
        transport_stage=enum_to_proto(outcome.transport_stage),  # type: ignore[arg-type]  # enum_to_proto gives int; the field wants the ValueType
        request_started_at=timestamp(outcome.request_started_at),
    )


def submit_from_proto(msg: svc.SubmitResponse) -> SubmitOutcome:
    """A ``SubmitResponse``. ACCEPTED without a job id stays ACCEPTED with no job: the control
    plane treats it as UNKNOWN (9.17.3), never as a job to poll."""
    return SubmitOutcome(
        kind=_required(SubmitKind, msg.kind),
        job=_named_job(msg),
        raw_status=msg.raw_status,
        error=_error_field(msg),
        transport_stage=_required(TransportStage, msg.transport_stage),
        request_started_at=from_timestamp(
            msg.request_started_at, msg.HasField("request_started_at")
        ),
    )


def poll_to_proto(result: PollResult) -> svc.GetJobResponse:
    """A GetJob answer."""
    return svc.GetJobResponse(
        status=snapshot_to_proto(result.snapshot), error=error_to_proto(result.error)
    )


def poll_from_proto(msg: svc.GetJobResponse) -> PollResult:
    """A GetJob answer: an error without a status means the adapter could not read the job."""
    if msg.HasField("error") and not msg.HasField("status"):
        return PollResult(None, error_from_proto(msg.error))
    return PollResult(snapshot_from_proto(msg.status))


def cancel_to_proto(result: CancelResult) -> svc.CancelJobResponse:
    """A CancelJob answer."""
    return svc.CancelJobResponse(
        acknowledged=result.acknowledged,
        status=snapshot_to_proto(result.snapshot),
        error=error_to_proto(result.error),
    )


def cancel_from_proto(msg: svc.CancelJobResponse) -> CancelResult:
    """A CancelJob answer."""
    return CancelResult(
        acknowledged=msg.acknowledged,
        snapshot=snapshot_from_proto(msg.status) if msg.HasField("status") else None,
        error=_error_field(msg),
    )


def recover_query_to_proto(query: RecoverQuery) -> svc.RecoverSubmissionRequest:
    """A recovery query as ``RecoverSubmissionRequest``."""
    return svc.RecoverSubmissionRequest(
        account=query.account,
        model=query.model,
        client_request_key=query.client_request_key,
        request_hash=query.request_hash,
        provider_request_id=query.provider_request_id,
        submitted_after=timestamp(query.submitted_after),
        submitted_before=timestamp(query.submitted_before),
        plan=plan_to_proto(query.plan) if query.plan is not None else None,
        request_started_at=timestamp(query.request_started_at),
    )


def recover_query_from_proto(msg: svc.RecoverSubmissionRequest) -> RecoverQuery:
    """A ``RecoverSubmissionRequest``; account and model default to the plan's."""
    plan = plan_from_proto(msg.plan) if msg.HasField("plan") else None
    return RecoverQuery(
        account=msg.account or (plan.account if plan else ""),
        model=msg.model or (plan.model if plan else ""),
        client_request_key=msg.client_request_key,
        request_hash=msg.request_hash,
        provider_request_id=msg.provider_request_id,
        submitted_after=from_timestamp(msg.submitted_after, msg.HasField("submitted_after")),
        submitted_before=from_timestamp(msg.submitted_before, msg.HasField("submitted_before")),
        plan=plan,
        request_started_at=from_timestamp(
            msg.request_started_at, msg.HasField("request_started_at")
        ),
    )


def recover_to_proto(result: RecoverResult) -> svc.RecoverSubmissionResponse:
    """A recovery verdict."""
    return svc.RecoverSubmissionResponse(
        verdict=enum_to_proto(result.verdict),  # type: ignore[arg-type]  # enum_to_proto gives int; the field wants the ValueType
        job=job_ref_to_proto(result.job) if result.job else None,
        method=result.method,
        error=error_to_proto(result.error),
    )


def recover_from_proto(msg: svc.RecoverSubmissionResponse) -> RecoverResult:
    """A recovery verdict; FOUND must name the job, else it is INCONCLUSIVE."""
    verdict = _required(RecoveryVerdict, msg.verdict)
    job = _named_job(msg)
    if verdict is RecoveryVerdict.FOUND and job is None:
        verdict = RecoveryVerdict.INCONCLUSIVE
    return RecoverResult(verdict, method=msg.method, job=job, error=_error_field(msg))


def usage_record_to_proto(rec: UsageRecord) -> pb.UsageRecord:
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


def usage_record_from_proto(msg: pb.UsageRecord) -> UsageRecord:
    """A proto usage row."""
    return UsageRecord(
        provider_job_id=msg.provider_job_id,
        model=msg.model,
        usage_time=from_timestamp(msg.usage_time, msg.HasField("usage_time")),
        provider_milliunits=msg.provider_milliunits,
        provider_unit=msg.provider_unit,
        cost_micros=msg.cost.amount_micros,
        currency=msg.cost.currency_code,
        raw_json=msg.raw_json,
        provider_request_id=msg.provider_request_id,
        client_request_key=msg.client_request_key,
    )


def usage_to_proto(result: UsageResult) -> svc.ListUsageResponse:
    """A ListUsage answer."""
    return svc.ListUsageResponse(
        records=[usage_record_to_proto(r) for r in result.records],
        error=error_to_proto(result.error),
    )


def usage_from_proto(msg: svc.ListUsageResponse) -> UsageResult:
    """A ListUsage answer."""
    return UsageResult(tuple(usage_record_from_proto(r) for r in msg.records), _error_field(msg))


def chunk_to_proto(chunk: OutputChunk) -> svc.FetchOutputResponse:
    """One message of a FetchOutput stream."""
    return svc.FetchOutputResponse(
        content_type=chunk.content_type,
        content_length=chunk.content_length,
        chunk=chunk.data,
        error=error_to_proto(chunk.error),
    )


def chunk_from_proto(msg: svc.FetchOutputResponse) -> OutputChunk:
    """One message of a FetchOutput stream."""
    return OutputChunk(msg.chunk, msg.content_type, msg.content_length, _error_field(msg))


def describe_to_proto(
    info: AdapterInfo, *, journal_retention_s: float, journal_durable: bool
) -> svc.DescribeResponse:
    """An adapter's declaration with its sidecar's journal facts, as ``DescribeResponse``."""
    return svc.DescribeResponse(
        adapter=info.adapter,
        adapter_version=info.adapter_version,
        capabilities=[capability_to_proto(c) for c in info.capabilities],
        submit_budget_seconds=info.submit_budget_s,
        submit_journal_retention_seconds=journal_retention_s,
        submit_journal_durable=journal_durable,
    )


def describe_from_proto(msg: svc.DescribeResponse) -> AdapterDescription:
    """A ``DescribeResponse``, its entries as capability schema documents (not yet validated)."""
    return AdapterDescription(
        adapter=msg.adapter,
        adapter_version=msg.adapter_version,
        capability_documents=tuple(capability_document(e) for e in msg.capabilities),
        submit_budget_s=msg.submit_budget_seconds,
        submit_journal_retention_s=msg.submit_journal_retention_seconds,
        submit_journal_durable=msg.submit_journal_durable,
    )


def load_to_proto(report: LoadReport) -> svc.GetLoadResponse:
    """A `LoadReport` as ``GetLoadResponse``."""
    return svc.GetLoadResponse(
        models=[
            pb.ModelLoad(
                model=m.model,
                queue_length=max(0, m.queue_length),
                warm=m.warm,
                cold_start_seconds=m.cold_start_s,
                gpu_utilization=m.gpu_utilization,
                vram_free_mb=max(0, m.vram_free_mb),
                vram_total_mb=max(0, m.vram_total_mb),
                available_slots=max(0, m.available_slots),
                ready_replicas=max(0, m.ready_replicas),
            )
            for m in report.models
        ],
        observed_at=timestamp(report.observed_at),
    )


def load_from_proto(msg: svc.GetLoadResponse) -> LoadReport:
    """A ``GetLoadResponse`` as a `LoadReport`."""
    return LoadReport(
        models=tuple(
            ModelLoad(
                model=m.model,
                queue_length=m.queue_length,
                warm=m.warm,
                cold_start_s=m.cold_start_seconds,
                gpu_utilization=m.gpu_utilization,
                vram_free_mb=m.vram_free_mb,
                vram_total_mb=m.vram_total_mb,
                available_slots=m.available_slots,
                ready_replicas=m.ready_replicas,
            )
            for m in msg.models
        ),
        observed_at=from_timestamp(msg.observed_at, msg.HasField("observed_at")),
    )
