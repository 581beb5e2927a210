"""`AdapterClient` over gRPC to a provider adapter sidecar.

The channel has gRPC's transparent retries disabled: a Submit must never be re-sent by the
transport (design 9.20.1). Read RPCs may be retried by the callers that own the policy. Errors
an adapter reports in-band are rebuilt with the control plane's own handling matrix
(`make_error`), so retry/failover flags always come from one table.

The Submit deadline is derived from what the sidecar declares in Describe (its submit budget:
the create call's timeouts) plus `submit_margin_s`, so the control plane never gives up on a
Submit the sidecar is still allowed to finish: an acceptance that lands after the caller left
would otherwise be known only to the sidecar's journal. A configured `submit_timeout_s` shorter
than the declared budget is refused (`SubmitDeadlineTooShort`, logged): Describe fails, so the
adapter's capabilities are never published and the control plane is not ready for it.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any, Protocol

import grpc
from google.protobuf import json_format, timestamp_pb2

from controlplane.adapters.types import (
    CancelResult,
    CompiledPlan,
    JobOutput,
    JobRef,
    JobSnapshot,
    JobState,
    OutputChunk,
    PollResult,
    RecoverQuery,
    RecoverResult,
    RecoveryVerdict,
    SubmitKind,
    SubmitResult,
    Transformation,
    TransformationKind,
    UsageRecord,
)
from vidroute.adapter.v1 import adapter_pb2, adapter_service_pb2, adapter_service_pb2_grpc
from vidroute.common.v1 import error_pb2
from vidroute_core.errors import ErrorClass, ProviderError, make_error
from vidroute_core.spec import GenerationSpec
from vidroute_core.wire.spec import spec_to_proto

NO_RETRIES = [("grpc.enable_retries", 0)]
#: Seconds added to the sidecar's declared submit budget for the Submit deadline.
DEFAULT_SUBMIT_MARGIN_S = 5.0

log = logging.getLogger(__name__)


class SubmitDeadlineTooShort(Exception):
    """A configured Submit deadline is shorter than the sidecar's own submit budget."""


def submit_deadline_s(
    budget_s: float, *, margin_s: float, configured_s: float | None = None
) -> float:
    """The Submit deadline for a sidecar declaring `budget_s` (0: not declared).

    `configured_s` (an operator's explicit deadline) wins when it is at least the budget and
    raises `SubmitDeadlineTooShort` when it is shorter; otherwise budget + margin."""
    if configured_s is not None and configured_s > 0:
        if configured_s < budget_s:
            raise SubmitDeadlineTooShort(
                f"configured Submit deadline {configured_s:g} s is shorter than the sidecar's "
                f"submit budget {budget_s:g} s: an acceptance could arrive after we gave up"
            )
        return configured_s
    return budget_s + margin_s


class AdapterClient(Protocol):
    """What the scheduler needs from an adapter sidecar."""

    async def describe(self) -> list[adapter_pb2.CapabilityEntry]: ...
    async def compile(
        self, spec: GenerationSpec, *, account: str, model: str, model_version: str = ""
    ) -> CompiledPlan: ...
    async def submit(
        self, plan: CompiledPlan, client_request_key: str, callback_url: str = ""
    ) -> SubmitResult: ...
    async def get_job(self, job: JobRef) -> PollResult: ...
    async def cancel_job(self, job: JobRef) -> CancelResult: ...
    async def recover(self, query: RecoverQuery) -> RecoverResult: ...
    async def list_usage(
        self, account: str, start: datetime, end: datetime
    ) -> list[UsageRecord]: ...
    def fetch_output(self, job: JobRef, uri: str, max_bytes: int) -> AsyncIterator[OutputChunk]:
        """Download an output flagged `fetch_through_adapter` through the sidecar (which holds
        the credentials). Never raises for a failed download: the last chunk carries the error."""
        ...


def _ts(value: datetime) -> timestamp_pb2.Timestamp:
    ts = timestamp_pb2.Timestamp()
    ts.FromDatetime(value.astimezone(UTC))
    return ts


def _dt(ts: timestamp_pb2.Timestamp, present: bool) -> datetime | None:
    return ts.ToDatetime(tzinfo=UTC) if present else None


def error_from_proto(msg: error_pb2.Error, present: bool = True) -> ProviderError | None:
    """Rebuild an in-band adapter error with our handling matrix."""
    if not present or msg.error_class == error_pb2.ERROR_CLASS_UNSPECIFIED:
        return None
    name = error_pb2.ErrorClass.Name(msg.error_class).removeprefix("ERROR_CLASS_")
    retry_ms = (
        msg.retry_after.seconds * 1000 + msg.retry_after.nanos // 1_000_000
        if msg.HasField("retry_after")
        else None
    )
    return make_error(
        ErrorClass(name),
        msg.code,
        msg.message,
        retry_after_ms=retry_ms,
        raw_status_code=msg.raw_status_code or None,
    )


def plan_from_proto(plan: adapter_pb2.CompilePlan) -> CompiledPlan:
    return CompiledPlan(
        provider=plan.provider,
        account=plan.account,
        model=plan.model,
        model_version=plan.model_version,
        capability_version=plan.capability_version,
        price_version=plan.price_version,
        request_hash=plan.request_hash,
        estimated_cost_micros=plan.estimated_cost.amount_micros,
        currency=plan.estimated_cost.currency_code or "USD",
        submittable=plan.submittable,
        transformations=tuple(
            Transformation(
                field=t.field,
                kind=TransformationKind(
                    adapter_pb2.TransformationKind.Name(t.kind).removeprefix("TRANSFORMATION_KIND_")
                ),
                detail=t.detail,
            )
            for t in plan.transformations
            if t.kind != adapter_pb2.TRANSFORMATION_KIND_UNSPECIFIED
        ),
        plan_json=json_format.MessageToDict(plan, preserving_proto_field_name=True),
    )


def plan_to_proto(plan_json: dict[str, Any]) -> adapter_pb2.CompilePlan:
    return json_format.ParseDict(plan_json, adapter_pb2.CompilePlan())


def _job_ref(msg: adapter_pb2.JobRef) -> JobRef:
    return JobRef(
        provider_job_id=msg.provider_job_id,
        account=msg.account,
        model=msg.model,
        provider_request_id=msg.provider_request_id,
    )


def _job_ref_proto(job: JobRef) -> adapter_pb2.JobRef:
    return adapter_pb2.JobRef(
        provider_job_id=job.provider_job_id,
        account=job.account,
        model=job.model,
        provider_request_id=job.provider_request_id,
    )


def snapshot_from_proto(status: adapter_pb2.JobStatus) -> JobSnapshot:
    state_name = adapter_pb2.JobState.Name(status.state).removeprefix("JOB_STATE_")
    state = JobState.UNRECOGNIZED if state_name == "UNSPECIFIED" else JobState(state_name)
    return JobSnapshot(
        state=state,
        raw_status=status.raw_status,
        raw_payload_json=status.raw_payload_json,
        progress=status.progress if status.HasField("progress") else None,
        outputs=tuple(
            JobOutput(
                uri=o.uri,
                mime_type=o.mime_type,
                expires_at=_dt(o.expires_at, o.HasField("expires_at")),
                size_bytes=o.size_bytes,
                checksum=o.checksum,
                fetch_through_adapter=o.fetch_through_adapter,
            )
            for o in status.outputs
        ),
        failure=error_from_proto(status.failure, status.HasField("failure")),
        actual_cost_micros=(
            status.actual_cost.amount_micros if status.HasField("actual_cost") else None
        ),
    )


class GrpcAdapterClient:
    """An `AdapterClient` for one sidecar address."""

    def __init__(
        self,
        address: str,
        *,
        timeout_s: float = 30.0,
        fetch_timeout_s: float = 900.0,
        submit_margin_s: float = DEFAULT_SUBMIT_MARGIN_S,
        submit_timeout_s: float | None = None,
        recovery_window_s: float = 0.0,
    ) -> None:
        self._address = address
        self._channel = grpc.aio.insecure_channel(address, options=NO_RETRIES)
        self._stub = adapter_service_pb2_grpc.ProviderAdapterServiceStub(self._channel)
        self._timeout = timeout_s
        self._fetch_timeout = fetch_timeout_s
        self._submit_margin = submit_margin_s
        self._submit_configured = submit_timeout_s
        self._recovery_window = recovery_window_s
        #: The Submit deadline in seconds, known once Describe answered (None before).
        self.submit_deadline_s: float | None = None

    async def close(self) -> None:
        await self._channel.close()

    async def describe(self) -> list[adapter_pb2.CapabilityEntry]:
        """The capability entries; also derives the Submit deadline from the declared budget.

        Raises `SubmitDeadlineTooShort` (logged) when a configured deadline is too short."""
        reply = await self._stub.Describe(
            adapter_service_pb2.DescribeRequest(), timeout=self._timeout
        )
        self._learn_submit_budget(reply)
        return list(reply.capabilities)

    def _learn_submit_budget(self, reply: adapter_service_pb2.DescribeResponse) -> None:
        budget = reply.submit_budget_seconds
        try:
            deadline = submit_deadline_s(
                budget, margin_s=self._submit_margin, configured_s=self._submit_configured
            )
        except SubmitDeadlineTooShort as exc:
            log.error("adapter %s at %s not usable: %s", reply.adapter, self._address, exc)
            self.submit_deadline_s = None
            raise
        if budget <= 0:
            # An older sidecar that declares nothing: keep the fixed deadline, say so.
            deadline = self._submit_configured or self._timeout
            log.warning(
                "adapter %s declares no submit budget; Submit deadline stays %g s",
                reply.adapter,
                deadline,
            )
        retention = reply.submit_journal_retention_seconds
        if self._recovery_window and retention < self._recovery_window:
            log.warning(
                "adapter %s keeps submit outcomes %g s, less than the recovery window %g s",
                reply.adapter,
                retention,
                self._recovery_window,
            )
        if deadline != self.submit_deadline_s:
            log.info(
                "adapter %s: submit budget %g s, Submit deadline %g s, journal %s",
                reply.adapter,
                budget,
                deadline,
                "file" if reply.submit_journal_durable else "memory only",
            )
        self.submit_deadline_s = deadline

    async def compile(
        self, spec: GenerationSpec, *, account: str, model: str, model_version: str = ""
    ) -> CompiledPlan:
        reply = await self._stub.Compile(
            adapter_service_pb2.CompileRequest(
                spec=spec_to_proto(spec),
                account=account,
                model=model,
                model_version=model_version,
            ),
            timeout=self._timeout,
        )
        return plan_from_proto(reply.plan)

    async def submit(
        self, plan: CompiledPlan, client_request_key: str, callback_url: str = ""
    ) -> SubmitResult:
        if self.submit_deadline_s is None:
            try:
                await self.describe()
            except Exception as exc:  # nothing was sent: the submit can be tried again
                return SubmitResult(
                    kind=SubmitKind.REJECTED,
                    error=make_error(
                        ErrorClass.TRANSIENT_NETWORK,
                        "ADAPTER_SUBMIT_DEADLINE_UNKNOWN",
                        f"the sidecar's submit budget is not known ({type(exc).__name__})",
                    ),
                )
        assert self.submit_deadline_s is not None
        try:
            reply = await self._stub.Submit(
                adapter_service_pb2.SubmitRequest(
                    plan=plan_to_proto(plan.plan_json),
                    client_request_key=client_request_key,
                    callback_url=callback_url,
                ),
                timeout=self.submit_deadline_s,
            )
        except grpc.aio.AioRpcError as exc:
            return _submit_transport_failure(exc)
        kind = SubmitKind(
            adapter_pb2.SubmitOutcomeKind.Name(reply.kind).removeprefix("SUBMIT_OUTCOME_KIND_")
        )
        return SubmitResult(
            kind=kind,
            # A job without an id names nothing: the worker treats ACCEPTED without a job as
            # UNKNOWN (9.17.3), never as a job to poll.
            job=_job_ref(reply.job) if reply.job.provider_job_id else None,
            raw_status=reply.raw_status,
            error=error_from_proto(reply.error, reply.HasField("error")),
            transport_stage=adapter_pb2.TransportStage.Name(reply.transport_stage).removeprefix(
                "TRANSPORT_STAGE_"
            ),
            request_started_at=_dt(reply.request_started_at, reply.HasField("request_started_at")),
        )

    async def get_job(self, job: JobRef) -> PollResult:
        reply = await self._stub.GetJob(
            adapter_service_pb2.GetJobRequest(job=_job_ref_proto(job)), timeout=self._timeout
        )
        if reply.HasField("error") and not reply.HasField("status"):
            return PollResult(None, error_from_proto(reply.error))
        return PollResult(snapshot_from_proto(reply.status))

    async def cancel_job(self, job: JobRef) -> CancelResult:
        reply = await self._stub.CancelJob(
            adapter_service_pb2.CancelJobRequest(job=_job_ref_proto(job)), timeout=self._timeout
        )
        return CancelResult(
            acknowledged=reply.acknowledged,
            snapshot=snapshot_from_proto(reply.status) if reply.HasField("status") else None,
            error=error_from_proto(reply.error, reply.HasField("error")),
        )

    async def recover(self, query: RecoverQuery) -> RecoverResult:
        reply = await self._stub.RecoverSubmission(
            adapter_service_pb2.RecoverSubmissionRequest(
                account=query.account,
                model=query.model,
                client_request_key=query.client_request_key,
                request_hash=query.request_hash,
                provider_request_id=query.provider_request_id,
                submitted_after=_ts(query.submitted_after),
                submitted_before=_ts(query.submitted_before),
                plan=plan_to_proto(query.plan_json),
                request_started_at=_ts(query.request_started_at)
                if query.request_started_at is not None
                else None,
            ),
            timeout=self._timeout,
        )
        verdict_name = adapter_pb2.RecoveryVerdict.Name(reply.verdict).removeprefix(
            "RECOVERY_VERDICT_"
        )
        verdict = (
            RecoveryVerdict.INCONCLUSIVE
            if verdict_name == "UNSPECIFIED"
            else RecoveryVerdict(verdict_name)
        )
        if verdict is RecoveryVerdict.FOUND and not reply.job.provider_job_id:
            verdict = RecoveryVerdict.INCONCLUSIVE  # FOUND must name the job
        return RecoverResult(
            verdict=verdict,
            job=_job_ref(reply.job) if reply.job.provider_job_id else None,
            method=reply.method,
            error=error_from_proto(reply.error, reply.HasField("error")),
        )

    async def list_usage(self, account: str, start: datetime, end: datetime) -> list[UsageRecord]:
        reply = await self._stub.ListUsage(
            adapter_service_pb2.ListUsageRequest(
                account=account, start_time=_ts(start), end_time=_ts(end)
            ),
            timeout=self._timeout,
        )
        return [
            UsageRecord(
                provider_job_id=r.provider_job_id,
                model=r.model,
                usage_time=_dt(r.usage_time, r.HasField("usage_time")),
                provider_milliunits=r.provider_milliunits,
                provider_unit=r.provider_unit,
                cost_micros=r.cost.amount_micros,
                currency=r.cost.currency_code or "USD",
                raw_json=r.raw_json or json.dumps({}),
                provider_request_id=r.provider_request_id,
                client_request_key=r.client_request_key,
            )
            for r in reply.records
        ]

    async def fetch_output(
        self, job: JobRef, uri: str, max_bytes: int
    ) -> AsyncIterator[OutputChunk]:
        call = self._stub.FetchOutput(
            adapter_service_pb2.FetchOutputRequest(
                job=_job_ref_proto(job), uri=uri, max_bytes=max_bytes
            ),
            timeout=self._fetch_timeout,
        )
        try:
            async for reply in call:
                yield OutputChunk(
                    data=reply.chunk,
                    content_type=reply.content_type,
                    content_length=reply.content_length,
                    error=error_from_proto(reply.error, reply.HasField("error")),
                )
        except grpc.aio.AioRpcError as exc:
            yield OutputChunk(error=_fetch_rpc_failure(exc))
        finally:
            call.cancel()


def _fetch_rpc_failure(exc: grpc.aio.AioRpcError) -> ProviderError:
    """The FetchOutput RPC itself failed: a refusal (a URI the adapter will not fetch) is not
    worth repeating, anything else (deadline, sidecar down) is."""
    error_class = (
        ErrorClass.INVALID_INPUT
        if exc.code() in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND)
        else ErrorClass.TRANSIENT_NETWORK
    )
    return make_error(error_class, f"ADAPTER_{exc.code().name}", exc.details() or "")


_REFUSED_BEFORE_PROVIDER = frozenset(
    {
        grpc.StatusCode.INVALID_ARGUMENT,
        grpc.StatusCode.FAILED_PRECONDITION,
        grpc.StatusCode.UNIMPLEMENTED,
        grpc.StatusCode.UNAUTHENTICATED,
    }
)


def _submit_transport_failure(exc: grpc.aio.AioRpcError) -> SubmitResult:
    """The Submit RPC itself failed.

    The adapter validates a plan before it calls the provider, so INVALID_ARGUMENT and its kin
    mean nothing was sent: REJECTED. Any other failure (deadline, connection lost, UNAVAILABLE)
    cannot prove the sidecar had not reached the provider yet: UNKNOWN, and recovery decides.
    """
    if exc.code() in _REFUSED_BEFORE_PROVIDER:
        return SubmitResult(
            kind=SubmitKind.REJECTED,
            error=make_error(
                ErrorClass.INVALID_INPUT, f"ADAPTER_{exc.code().name}", exc.details() or ""
            ),
        )
    return SubmitResult(
        kind=SubmitKind.UNKNOWN,
        error=make_error(
            ErrorClass.SUBMISSION_UNKNOWN, f"ADAPTER_{exc.code().name}", exc.details() or ""
        ),
        transport_stage="ADAPTER_RPC",
    )
