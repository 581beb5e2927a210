"""`AdapterClient` over gRPC to a provider adapter sidecar.

The channel has gRPC's transparent retries disabled: a Submit must never be re-sent by the
transport (design 9.20.1). Read RPCs may be retried by the callers that own the policy.
Messages become the kernel's adapter types with `vidroute_core.wire.adapter`, the sidecars' own
translation: errors an adapter reports in-band are rebuilt there with the handling matrix
(`make_error`), so retry/failover flags always come from one table. What is the control plane's
alone stays here: a failed RPC as a `CallFailure`, USD for a plan or usage row naming no
currency.

The Submit deadline is derived from what the sidecar declares in Describe (its submit budget:
the create call's timeouts) plus `submit_margin_s`, so the control plane never gives up on a
Submit the sidecar is still allowed to finish: an acceptance that lands after the caller left
would otherwise be known only to the sidecar's journal. A configured `submit_timeout_s` shorter
than the declared budget is refused (`SubmitDeadlineTooShort`, logged): Describe fails, so the
adapter's capabilities are never published and the control plane is not ready for it.

A sidecar that is away (stopped, restarting) costs no task (issue 20): a Compile that got no
answer raises `CompileUnavailable`, only its refusal of the request `CompileRefused`; a Submit on
a channel that provably cannot connect is not started and comes back as a retryable refusal
(TRANSIENT_NETWORK, nothing sent) instead of UNKNOWN; and the reconnect backoff is capped, so a
sidecar back after a restart is used again within seconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Sequence
from dataclasses import replace
from datetime import datetime
from typing import Protocol

import grpc

from vidroute.adapter.v1 import adapter_service_pb2, adapter_service_pb2_grpc
from vidroute_core.adapter import (
    AdapterDescription,
    CallFailure,
    CancelResult,
    CompiledPlan,
    JobRef,
    LoadReport,
    OutputChunk,
    PollResult,
    RecoverQuery,
    RecoverResult,
    SubmitKind,
    SubmitOutcome,
    UsageRecord,
    UsageResult,
)
from vidroute_core.capabilities.loader import Capability
from vidroute_core.errors import ErrorClass, ProviderError, make_error
from vidroute_core.spec import GenerationSpec
from vidroute_core.wire import adapter as wire
from vidroute_core.wire import tracing as tracing_edge
from vidroute_core.wire.capability import capability_to_proto
from vidroute_core.wire.spec import spec_to_proto

NO_RETRIES: list[tuple[str, str | int]] = [("grpc.enable_retries", 0)]
#: Seconds added to the sidecar's declared submit budget for the Submit deadline.
DEFAULT_SUBMIT_MARGIN_S = 5.0

log = logging.getLogger(__name__)


class SubmitDeadlineTooShort(Exception):
    """A configured Submit deadline is shorter than the sidecar's own submit budget."""


class CompileRefused(Exception):
    """The sidecar answered Compile with a refusal of the request itself (INVALID_ARGUMENT,
    NOT_FOUND, ...): a verdict on this spec and candidate, like a plan marked REJECT."""


class CompileUnavailable(Exception):
    """Compile got no verdict: the sidecar did not answer in time, is UNAVAILABLE (stopped,
    restarting) or the connection broke. A condition of the adapter, never of the task."""


def reconnect_options(max_s: float) -> list[tuple[str, str | int]]:
    """Channel options bounding the reconnect backoff to `max_s` (at least 10 ms)."""
    ms = max(10, int(max_s * 1000))
    return [
        ("grpc.initial_reconnect_backoff_ms", min(1000, ms)),
        ("grpc.min_reconnect_backoff_ms", min(1000, ms)),
        ("grpc.max_reconnect_backoff_ms", ms),
    ]


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

    async def describe(self) -> AdapterDescription: ...
    async def compile(
        self,
        spec: GenerationSpec,
        *,
        account: str,
        model: str,
        model_version: str = "",
        capability: Capability | None = None,
    ) -> CompiledPlan: ...
    async def submit(
        self, plan: CompiledPlan, client_request_key: str, callback_url: str = ""
    ) -> SubmitOutcome: ...
    async def get_job(self, job: JobRef) -> PollResult: ...
    async def cancel_job(self, job: JobRef) -> CancelResult: ...
    async def recover(self, query: RecoverQuery) -> RecoverResult: ...
    async def list_usage(
        self, account: str, start: datetime, end: datetime
    ) -> list[UsageRecord]: ...
    async def get_load(self) -> LoadReport:
        """The provider's live per-model load (design 9.21); empty when it reports none."""
        ...

    def fetch_output(self, job: JobRef, uri: str, max_bytes: int) -> AsyncIterator[OutputChunk]:
        """Download an output flagged `fetch_through_adapter` through the sidecar (which holds
        the credentials). Never raises for a failed download: the last chunk carries the error."""
        ...


#: An adapter that names no currency prices in USD (the ledger needs one).
DEFAULT_CURRENCY = "USD"


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
        reconnect_max_s: float = 5.0,
        connect_wait_s: float = 1.0,
        credentials: grpc.ChannelCredentials | None = None,
        channel_options: Sequence[tuple[str, str | int]] = (),
    ) -> None:
        self._address = address
        # With `credentials` (vidroute_core.wire.tls: our client certificate, the sidecars' CA)
        # the channel is mTLS; the composition root decides when plaintext is allowed.
        # A restarted sidecar is reconnected to within `reconnect_max_s` (gRPC's own backoff
        # grows to 120 s: a sidecar back after a rolling update would stay unused that long).
        options = [*NO_RETRIES, *reconnect_options(reconnect_max_s), *channel_options]
        traced = tracing_edge.client_interceptors()  # traceparent in the metadata; [] when off
        self._channel = (
            grpc.aio.secure_channel(address, credentials, options=options, interceptors=traced)
            if credentials is not None
            else grpc.aio.insecure_channel(address, options=options, interceptors=traced)
        )
        self._stub = adapter_service_pb2_grpc.ProviderAdapterServiceStub(self._channel)
        self._timeout = timeout_s
        self._fetch_timeout = fetch_timeout_s
        self._submit_margin = submit_margin_s
        self._submit_configured = submit_timeout_s
        self._recovery_window = recovery_window_s
        self._connect_wait = connect_wait_s
        #: The Submit deadline in seconds, known once Describe answered (None before).
        self.submit_deadline_s: float | None = None

    async def close(self) -> None:
        await self._channel.close()

    async def describe(self) -> AdapterDescription:
        """What the sidecar declares; also derives the Submit deadline from its budget.

        Raises `SubmitDeadlineTooShort` (logged) when a configured deadline is too short."""
        reply = await self._stub.Describe(
            adapter_service_pb2.DescribeRequest(), timeout=self._timeout
        )
        described = wire.describe_from_proto(reply)
        self._learn_submit_budget(described)
        return described

    def _learn_submit_budget(self, reply: AdapterDescription) -> None:
        budget = reply.submit_budget_s
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
        retention = reply.submit_journal_retention_s
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
        self,
        spec: GenerationSpec,
        *,
        account: str,
        model: str,
        model_version: str = "",
        capability: Capability | None = None,
    ) -> CompiledPlan:
        """The sidecar's plan; raises `CompileRefused` for its refusal of the request and
        `CompileUnavailable` when it gave no answer."""
        try:
            reply = await self._stub.Compile(
                adapter_service_pb2.CompileRequest(
                    spec=spec_to_proto(spec),
                    account=account,
                    model=model,
                    model_version=model_version,
                    capability=None if capability is None else capability_to_proto(capability),
                ),
                timeout=self._timeout,
            )
        except grpc.aio.AioRpcError as exc:
            text = f"{exc.code().name}: {exc.details() or ''}"
            if exc.code() in _COMPILE_VERDICTS:
                raise CompileRefused(text) from None
            raise CompileUnavailable(text) from None
        plan = wire.plan_from_proto(reply.plan)
        return replace(plan, currency=plan.currency or DEFAULT_CURRENCY)

    async def submit(
        self, plan: CompiledPlan, client_request_key: str, callback_url: str = ""
    ) -> SubmitOutcome:
        if self.submit_deadline_s is None:
            try:
                await self.describe()
            except Exception as exc:  # nothing was sent: the submit can be tried again
                return SubmitOutcome(
                    kind=SubmitKind.REJECTED,
                    error=make_error(
                        ErrorClass.TRANSIENT_NETWORK,
                        "ADAPTER_SUBMIT_DEADLINE_UNKNOWN",
                        f"the sidecar's submit budget is not known ({type(exc).__name__})",
                    ),
                )
        assert self.submit_deadline_s is not None
        if not await self._connected():
            # The RPC would not even be started: a Submit that provably sent nothing is a
            # retryable refusal, never UNKNOWN (a restarting sidecar must not cost the task).
            return SubmitOutcome(
                kind=SubmitKind.REJECTED,
                error=make_error(
                    ErrorClass.TRANSIENT_NETWORK,
                    "ADAPTER_NOT_CONNECTED",
                    f"no connection to the sidecar at {self._address}: nothing was sent",
                ),
            )
        try:
            reply = await self._stub.Submit(
                adapter_service_pb2.SubmitRequest(
                    plan=wire.plan_to_proto(plan),
                    client_request_key=client_request_key,
                    callback_url=callback_url,
                ),
                timeout=self.submit_deadline_s,
            )
        except grpc.aio.AioRpcError as exc:
            return _submit_transport_failure(exc)
        return wire.submit_from_proto(reply)

    async def _connected(self) -> bool:
        """False only when the channel provably cannot reach the sidecar: not READY within
        `connect_wait_s` and in TRANSIENT_FAILURE (its last connection attempt failed), where
        gRPC fails an RPC before sending anything. A channel still connecting is given the
        RPC (a failure then counts as UNKNOWN, as before)."""
        channel = self._channel
        if channel.get_state(try_to_connect=True) is grpc.ChannelConnectivity.READY:
            return True
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(channel.channel_ready(), self._connect_wait)
        return channel.get_state() not in _UNREACHABLE

    async def get_job(self, job: JobRef) -> PollResult:
        reply = await self._stub.GetJob(
            adapter_service_pb2.GetJobRequest(job=wire.job_ref_to_proto(job)),
            timeout=self._timeout,
        )
        return wire.poll_from_proto(reply)

    async def cancel_job(self, job: JobRef) -> CancelResult:
        reply = await self._stub.CancelJob(
            adapter_service_pb2.CancelJobRequest(job=wire.job_ref_to_proto(job)),
            timeout=self._timeout,
        )
        return wire.cancel_from_proto(reply)

    async def recover(self, query: RecoverQuery) -> RecoverResult:
        reply = await self._stub.RecoverSubmission(
            wire.recover_query_to_proto(query), timeout=self._timeout
        )
        return wire.recover_from_proto(reply)

    async def list_usage(self, account: str, start: datetime, end: datetime) -> list[UsageRecord]:
        reply = await self._stub.ListUsage(
            adapter_service_pb2.ListUsageRequest(
                account=account, start_time=wire.timestamp(start), end_time=wire.timestamp(end)
            ),
            timeout=self._timeout,
        )
        # The answer's error is not the caller's concern: an empty list is no evidence.
        return [
            replace(r, currency=r.currency or DEFAULT_CURRENCY, raw_json=r.raw_json or "{}")
            for r in wire.usage_from_proto(reply).records
        ]

    async def usage_result(self, account: str, start: datetime, end: datetime) -> UsageResult:
        """ListUsage with its error kept: reconciliation must tell "billed nothing" from "could
        not ask" (an error is never an empty bill)."""
        reply = await self._stub.ListUsage(
            adapter_service_pb2.ListUsageRequest(
                account=account, start_time=wire.timestamp(start), end_time=wire.timestamp(end)
            ),
            timeout=self._timeout,
        )
        result = wire.usage_from_proto(reply)
        records = tuple(
            replace(r, currency=r.currency or DEFAULT_CURRENCY, raw_json=r.raw_json or "{}")
            for r in result.records
        )
        return UsageResult(records, result.error)

    async def get_load(self) -> LoadReport:
        """GetLoad; raises the RPC's error (the caller keeps its last report)."""
        reply = await self._stub.GetLoad(
            adapter_service_pb2.GetLoadRequest(), timeout=self._timeout
        )
        return wire.load_from_proto(reply)

    async def fetch_output(
        self, job: JobRef, uri: str, max_bytes: int
    ) -> AsyncIterator[OutputChunk]:
        call = self._stub.FetchOutput(
            adapter_service_pb2.FetchOutputRequest(
                job=wire.job_ref_to_proto(job), uri=uri, max_bytes=max_bytes
            ),
            timeout=self._fetch_timeout,
        )
        try:
            async for reply in call:
                yield wire.chunk_from_proto(reply)
        except grpc.aio.AioRpcError as exc:
            yield OutputChunk(error=_fetch_rpc_failure(exc))
        finally:
            call.cancel()


_UNREACHABLE = frozenset(
    {grpc.ChannelConnectivity.TRANSIENT_FAILURE, grpc.ChannelConnectivity.SHUTDOWN}
)

# The status codes by which a sidecar that answered Compile refuses the request itself (its
# servicer's documented refusals); every other code (DEADLINE_EXCEEDED, UNAVAILABLE, CANCELLED,
# INTERNAL, ...) means no verdict was given.
_COMPILE_VERDICTS = frozenset(
    {
        grpc.StatusCode.INVALID_ARGUMENT,
        grpc.StatusCode.NOT_FOUND,
        grpc.StatusCode.FAILED_PRECONDITION,
        grpc.StatusCode.OUT_OF_RANGE,
        grpc.StatusCode.UNIMPLEMENTED,
    }
)


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


def _submit_transport_failure(exc: grpc.aio.AioRpcError) -> SubmitOutcome:
    """The Submit RPC itself failed.

    The adapter validates a plan before it calls the provider, so INVALID_ARGUMENT and its kin
    mean nothing was sent: REJECTED. Any other failure (deadline, connection lost, UNAVAILABLE)
    cannot prove the sidecar had not reached the provider yet: UNKNOWN, and recovery decides.
    """
    if exc.code() in _REFUSED_BEFORE_PROVIDER:
        return SubmitOutcome(
            kind=SubmitKind.REJECTED,
            error=make_error(
                ErrorClass.INVALID_INPUT, f"ADAPTER_{exc.code().name}", exc.details() or ""
            ),
        )
    return SubmitOutcome(
        kind=SubmitKind.UNKNOWN,
        error=make_error(
            ErrorClass.SUBMISSION_UNKNOWN, f"ADAPTER_{exc.code().name}", exc.details() or ""
        ),
        call_failure=CallFailure.ADAPTER_RPC,
    )
