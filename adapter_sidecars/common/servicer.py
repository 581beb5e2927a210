"""The generic ``ProviderAdapterService`` servicer: protobuf in -> adapter call -> protobuf out.

It holds no provider logic. Provider failures travel in-band (``SubmitResponse.error`` and
friends); gRPC status codes only say the request to the adapter was wrong:

* invalid spec -> INVALID_ARGUMENT with ``google.rpc.BadRequest`` (via the domain interceptor),
* unknown account or model -> NOT_FOUND, unusable plan -> INVALID_ARGUMENT,
* FetchOutput of a URI that is not the provider's -> INVALID_ARGUMENT (nothing is fetched),
* anything unexpected -> INTERNAL, logged once (the interceptor).

A Submit whose RPC is cancelled mid-flight (client deadline) is shielded so the provider call
completes; its outcome goes to the submit journal (`common.journal`) like every other, and the
caller, which must treat a cancelled Submit as UNKNOWN, finds it there: RecoverSubmission asks
the journal before the adapter searches the provider (method ``submit_journal``). A Submit of a
key whose call is in flight, or whose journaled outcome may have created a job, sends nothing
and answers from the journal. Describe declares the adapter's submit budget and the journal's
retention, from which the control plane derives its Submit deadline. With
``submit_journal.sole_submitter`` the journal also proves absence (NOT_FOUND for a key it never
saw in a settled, fully covered window); a later Submit of such a key is refused unsent.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import replace
from datetime import UTC
from functools import wraps
from typing import Any, TypeVar

import grpc

from adapter_sidecars.common.config import SidecarConfig
from adapter_sidecars.common.journal import JOURNAL_METHOD, Gate, SubmitJournal, SubmitWindow
from adapter_sidecars.common.metrics import SidecarMetrics
from adapter_sidecars.common.recovery import settle_s
from adapter_sidecars.common.types import (
    AdapterRequestError,
    CompileInput,
    FetchOutputInput,
    InvalidRequest,
    MalformedPlan,
    ProviderAdapter,
    SubmitInput,
    UsageInput,
)
from vidroute.adapter.v1 import adapter_pb2
from vidroute.adapter.v1 import adapter_service_pb2 as svc
from vidroute.adapter.v1 import adapter_service_pb2_grpc as svc_grpc
from vidroute_core.adapter import (
    CompiledPlan,
    RecoverQuery,
    RecoverResult,
    SubmitKind,
    SubmitOutcome,
)
from vidroute_core.capabilities.loader import Capability, CapabilityLoadError
from vidroute_core.errors import ErrorClass, make_error
from vidroute_core.exceptions import InvalidSpec
from vidroute_core.logs import add_ids, bind_ids
from vidroute_core.wire import adapter as wire
from vidroute_core.wire.capability import capability_from_proto
from vidroute_core.wire.spec import spec_from_proto

log = logging.getLogger(__name__)
Ctx = grpc.aio.ServicerContext[Any, Any]
R = TypeVar("R")
Handler = Callable[[Any, Any, Ctx], Awaitable[R]]


def _adapter_errors(fn: Handler[R]) -> Handler[R]:
    """Turn `AdapterRequestError`s into NOT_FOUND / INVALID_ARGUMENT; the request's ids (the
    client request key, the job) are bound for every line the call logs."""

    @wraps(fn)
    async def wrapper(self: Any, request: Any, context: Ctx) -> R:
        with bind_ids(**_request_ids(request)):
            try:
                return await fn(self, request, context)
            except InvalidRequest as exc:
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
            except AdapterRequestError as exc:
                await context.abort(grpc.StatusCode.NOT_FOUND, str(exc))
        raise AssertionError("unreachable: abort raises")  # pragma: no cover

    return wrapper


def _request_ids(request: Any) -> dict[str, object]:
    """The id-chain fields a request carries (empty strings are unset)."""
    job = getattr(request, "job", None)
    ids = {
        "client_request_key": getattr(request, "client_request_key", ""),
        "provider_job_id": getattr(job, "provider_job_id", ""),
        "provider_request_id": getattr(job, "provider_request_id", ""),
    }
    return {k: v for k, v in ids.items() if v}


class AdapterServicer(svc_grpc.ProviderAdapterServiceServicer):
    """Delegates every RPC to one `ProviderAdapter`."""

    def __init__(
        self,
        adapter: ProviderAdapter,
        journal: SubmitJournal | None = None,
        metrics: SidecarMetrics | None = None,
    ) -> None:
        self.adapter = adapter
        self.metrics = metrics
        self.info = adapter.describe()
        if journal is None:
            config = getattr(adapter, "config", None)
            journal = (
                SubmitJournal.from_config(config)
                if isinstance(config, SidecarConfig)
                else SubmitJournal(retention_s=21600.0)
            )
        self.journal = journal

    async def Describe(self, request: svc.DescribeRequest, context: Ctx) -> svc.DescribeResponse:
        return wire.describe_to_proto(
            self.adapter.describe(),
            journal_retention_s=self.journal.retention_s,
            journal_durable=self.journal.durable,
        )

    @_adapter_errors
    async def Compile(self, request: svc.CompileRequest, context: Ctx) -> svc.CompileResponse:
        spec, violations = spec_from_proto(request.spec)
        if violations:
            raise InvalidSpec(violations)
        routed = None
        if request.HasField("capability"):
            routed = routed_capability(request.capability)
        plan = self.adapter.compile(
            CompileInput(spec, request.model, request.account, request.model_version, routed)
        )
        return svc.CompileResponse(plan=wire.plan_to_proto(plan))

    @_adapter_errors
    async def Submit(self, request: svc.SubmitRequest, context: Ctx) -> svc.SubmitResponse:
        if not request.client_request_key:
            raise InvalidRequest("client_request_key is required")
        submit = SubmitInput(
            with_native(wire.plan_from_proto(request.plan)),
            request.client_request_key,
            request.callback_url,
        )
        key = submit.client_request_key
        gate, journaled = self.journal.gate(key, honours_key=self.info.honours_idempotency_key)
        if gate is Gate.REFUSE and journaled is not None:
            self.journal.refused(key, journaled)  # declared absent: never sent from now on
            return wire.submit_to_proto(journaled)
        if gate is Gate.REPLAY and journaled is not None:
            log.info("submit %s answered from the journal: %s", key, journaled.kind.value)
            return wire.submit_to_proto(journaled)
        if gate is Gate.IN_FLIGHT:
            return wire.submit_to_proto(_in_flight(key))
        # Marked in flight before the first await, so a concurrent Submit of the key sees it.
        self.journal.begin(key)
        task = asyncio.ensure_future(self._journaled(submit))
        try:
            outcome: SubmitOutcome = await asyncio.shield(task)
        except asyncio.CancelledError:
            task.add_done_callback(lambda t: _log_orphan(t, submit))
            raise
        if outcome.job is not None:  # the provider's ids, on this call's span and log lines
            add_ids(
                provider_job_id=outcome.job.provider_job_id or None,
                provider_request_id=outcome.job.provider_request_id or None,
            )
        return wire.submit_to_proto(outcome)

    async def _journaled(self, submit: SubmitInput) -> SubmitOutcome:
        """The provider call, with its outcome journaled however it ends."""
        key = submit.client_request_key
        started = time.perf_counter()
        try:
            outcome = await self.adapter.submit(submit)
        except AdapterRequestError:
            self.journal.abort(key)  # refused before anything was sent
            raise
        except BaseException as exc:
            self.journal.crashed(key, exc)
            raise
        self.journal.finish(key, outcome)
        if self.metrics is not None:
            self.metrics.submitted(outcome, time.perf_counter() - started)
        return outcome

    @_adapter_errors
    async def GetJob(self, request: svc.GetJobRequest, context: Ctx) -> svc.GetJobResponse:
        return wire.poll_to_proto(await self.adapter.get_job(wire.job_ref_from_proto(request.job)))

    @_adapter_errors
    async def CancelJob(self, request: svc.CancelJobRequest, context: Ctx) -> svc.CancelJobResponse:
        return wire.cancel_to_proto(
            await self.adapter.cancel_job(wire.job_ref_from_proto(request.job))
        )

    @_adapter_errors
    async def RecoverSubmission(
        self, request: svc.RecoverSubmissionRequest, context: Ctx
    ) -> svc.RecoverSubmissionResponse:
        recover = wire.recover_query_from_proto(request)
        if recover.plan is not None:
            recover = replace(recover, plan=with_native(recover.plan))
        known = (
            self.journal.verdict(recover.client_request_key, self._window(recover))
            if recover.client_request_key
            else None
        )
        result = (
            RecoverResult(known[0], method=JOURNAL_METHOD, job=known[1])
            if known is not None
            else await self.adapter.recover_submission(recover)
        )
        return wire.recover_to_proto(result)

    def _window(self, recover: RecoverQuery) -> SubmitWindow:
        """When the key's Submit could have reached us: the journal's proof of absence needs it."""
        config = getattr(self.adapter, "config", None)
        settle = settle_s(config) if isinstance(config, SidecarConfig) else 0.0
        return SubmitWindow(
            started_at=recover.request_started_at,
            submitted_before=recover.submitted_before,
            arrival_s=self.info.submit_budget_s + settle,
        )

    async def GetLoad(self, request: svc.GetLoadRequest, context: Ctx) -> svc.GetLoadResponse:
        """The provider's per-model load; an adapter without it (or a failed read) answers an
        empty list: load is a routing hint, never a reason to fail the caller."""
        get_load = getattr(self.adapter, "get_load", None)
        if get_load is None:
            return svc.GetLoadResponse()
        return wire.load_to_proto(await get_load())

    @_adapter_errors
    async def ListUsage(self, request: svc.ListUsageRequest, context: Ctx) -> svc.ListUsageResponse:
        if not (request.HasField("start_time") and request.HasField("end_time")):
            raise InvalidRequest("start_time and end_time are required")
        start = request.start_time.ToDatetime(tzinfo=UTC)
        end = request.end_time.ToDatetime(tzinfo=UTC)
        if end <= start:
            raise InvalidRequest("end_time must be after start_time")
        return wire.usage_to_proto(
            await self.adapter.list_usage(UsageInput(request.account, start, end))
        )

    async def FetchOutput(
        self, request: svc.FetchOutputRequest, context: Ctx
    ) -> AsyncIterator[svc.FetchOutputResponse]:
        # A streaming handler: `_adapter_errors` wraps coroutines only, so map errors here.
        try:
            if not request.uri:
                raise InvalidRequest("uri is required")
            if request.max_bytes < 0:
                raise InvalidRequest("max_bytes must not be negative")
            parts = self.adapter.fetch_output(
                FetchOutputInput(
                    wire.job_ref_from_proto(request.job), request.uri, request.max_bytes
                )
            )
            async for part in parts:
                yield wire.chunk_to_proto(part)
        except InvalidRequest as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        except AdapterRequestError as exc:
            await context.abort(grpc.StatusCode.NOT_FOUND, str(exc))


def routed_capability(entry: adapter_pb2.CapabilityEntry) -> Capability:
    """CompileRequest.capability as an entry; one that does not parse is INVALID_ARGUMENT."""
    try:
        return capability_from_proto(entry, "CompileRequest.capability")
    except CapabilityLoadError as exc:
        raise InvalidRequest(str(exc)) from exc


def with_native(plan: CompiledPlan) -> CompiledPlan:
    """The plan with its native body parsed (what the adapter sends); raises `MalformedPlan`."""
    if not plan.native_request_json:
        return plan
    try:
        native = json.loads(plan.native_request_json)
    except ValueError as exc:
        raise MalformedPlan(f"native_request_json is not JSON: {exc}") from None
    if not isinstance(native, dict):
        raise MalformedPlan("native_request_json must be a JSON object")
    return replace(plan, native_request=native)


def _in_flight(key: str) -> SubmitOutcome:
    return SubmitOutcome(
        SubmitKind.UNKNOWN,
        error=make_error(
            ErrorClass.SUBMISSION_UNKNOWN,
            "SUBMIT_IN_FLIGHT",
            f"a submit with key {key} is still running in the sidecar; recover it",
        ),
    )


def _log_orphan(task: asyncio.Future[SubmitOutcome], submit: SubmitInput) -> None:
    """Log the fate of a submit whose caller went away (the journal holds the outcome)."""
    if task.cancelled() or task.exception() is not None:
        log.warning("orphaned submit %s ended without outcome", submit.client_request_key)
        return
    outcome = task.result()
    job = outcome.job.provider_job_id if outcome.job else "-"
    log.warning(
        "orphaned submit %s finished %s job=%s after the caller cancelled (journaled)",
        submit.client_request_key,
        outcome.kind.value,
        job,
    )
