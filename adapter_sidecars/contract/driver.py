"""Typed helpers the contract tests use to talk to an adapter over gRPC.

`AdapterDriver` wraps the generated stub with the few sequences every test repeats (compile a
profile spec, submit with a fresh client_request_key, poll a job to its end with a deadline)
so the test bodies read as the behaviour they check. Enum values are shown by name in every
assertion message: ``SUBMIT_OUTCOME_KIND_UNKNOWN`` says more than ``3``.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import grpc
from google.protobuf import json_format
from google.protobuf.timestamp_pb2 import Timestamp

from adapter_sidecars.contract.profile import AdapterProfile
from vidroute.adapter.v1 import adapter_pb2, adapter_service_pb2, adapter_service_pb2_grpc
from vidroute.common.v1 import error_pb2, generation_pb2

T = TypeVar("T")

TERMINAL_STATES = frozenset(
    {
        adapter_pb2.JOB_STATE_SUCCEEDED,
        adapter_pb2.JOB_STATE_FAILED,
        adapter_pb2.JOB_STATE_CANCELLED,
    }
)
#: Phase order of design 9.8.1; UNRECOGNIZED is non-terminal and does not move the phase.
PHASE = {
    adapter_pb2.JOB_STATE_QUEUED: 40,
    adapter_pb2.JOB_STATE_THROTTLED: 40,
    adapter_pb2.JOB_STATE_RUNNING: 50,
    adapter_pb2.JOB_STATE_SUCCEEDED: 100,
    adapter_pb2.JOB_STATE_FAILED: 100,
    adapter_pb2.JOB_STATE_CANCELLED: 100,
}
#: Transport stages after which the provider may have created the job (design 9.17.3).
MAY_HAVE_ACCEPTED_STAGES = frozenset(
    {
        adapter_pb2.TRANSPORT_STAGE_SEND_REQUEST,
        adapter_pb2.TRANSPORT_STAGE_AWAIT_RESPONSE,
        adapter_pb2.TRANSPORT_STAGE_READ_RESPONSE,
    }
)


def state_name(value: int) -> str:
    return adapter_pb2.JobState.Name(adapter_pb2.JobState.ValueType(value)).removeprefix(
        "JOB_STATE_"
    )


def outcome_name(value: int) -> str:
    return adapter_pb2.SubmitOutcomeKind.Name(
        adapter_pb2.SubmitOutcomeKind.ValueType(value)
    ).removeprefix("SUBMIT_OUTCOME_KIND_")


def stage_name(value: int) -> str:
    return adapter_pb2.TransportStage.Name(
        adapter_pb2.TransportStage.ValueType(value)
    ).removeprefix("TRANSPORT_STAGE_")


def class_name(value: int) -> str:
    return error_pb2.ErrorClass.Name(error_pb2.ErrorClass.ValueType(value)).removeprefix(
        "ERROR_CLASS_"
    )


def verdict_name(value: int) -> str:
    return adapter_pb2.RecoveryVerdict.Name(
        adapter_pb2.RecoveryVerdict.ValueType(value)
    ).removeprefix("RECOVERY_VERDICT_")


def describe_submit(response: adapter_service_pb2.SubmitResponse) -> str:
    """One line for assertion messages: kind, stage, error class and message."""
    err = response.error
    return (
        f"kind={outcome_name(response.kind)} stage={stage_name(response.transport_stage)} "
        f"error_class={class_name(err.error_class)} code={err.code!r} "
        f"may_have_accepted={err.provider_may_have_accepted} message={err.message!r}"
    )


def spec_from_json(data: Mapping[str, Any]) -> generation_pb2.GenerationSpec:
    """Parse a proto3-JSON spec (as written in profiles) into a `GenerationSpec`."""
    return json_format.ParseDict(dict(data), generation_pb2.GenerationSpec())


def plan_to_json(plan: adapter_pb2.CompilePlan) -> dict[str, Any]:
    return json_format.MessageToDict(plan, preserving_proto_field_name=True)


def new_request_key() -> str:
    """A fresh client_request_key, as the control plane makes one per attempt."""
    return f"contract-{uuid.uuid4()}"


def now_timestamp(offset_s: float = 0.0) -> Timestamp:
    ts = Timestamp()
    ts.FromNanoseconds(int((time.time() + offset_s) * 1e9))
    return ts


@dataclass
class Submitted:
    """A submit as the control plane would record it before knowing the outcome."""

    plan: adapter_pb2.CompilePlan
    client_request_key: str
    started_after: Timestamp
    response: adapter_service_pb2.SubmitResponse
    finished_before: Timestamp


class AdapterDriver:
    """The adapter under test, driven the way the control plane drives it."""

    def __init__(
        self,
        stub: adapter_service_pb2_grpc.ProviderAdapterServiceStub,
        profile: AdapterProfile,
        rpc_timeout_s: float = 10.0,
    ) -> None:
        self.stub = stub
        self.profile = profile
        self.rpc_timeout_s = rpc_timeout_s

    # -- compile ---------------------------------------------------------------------------
    def compile_json(
        self, spec: Mapping[str, Any], mode: str = "TEXT_TO_VIDEO"
    ) -> adapter_pb2.CompilePlan:
        return self.compile(spec_from_json(spec), self.profile.model_for(mode))

    def compile(self, spec: generation_pb2.GenerationSpec, model: str) -> adapter_pb2.CompilePlan:
        request = adapter_service_pb2.CompileRequest(
            spec=spec, account=self.profile.account, model=model
        )
        response: adapter_service_pb2.CompileResponse = self.stub.Compile(
            request, timeout=self.rpc_timeout_s
        )
        return response.plan

    def text_to_video_plan(
        self, overrides: Mapping[str, Any] | None = None
    ) -> adapter_pb2.CompilePlan:
        """A submittable plan of the profile's base text-to-video spec."""
        plan = self.compile_json(self.profile.spec_json(overrides))
        assert plan.submittable, f"the base text-to-video spec must compile: {plan_to_json(plan)}"
        return plan

    # -- submit ----------------------------------------------------------------------------
    def submit(
        self,
        plan: adapter_pb2.CompilePlan,
        client_request_key: str | None = None,
        stub: adapter_service_pb2_grpc.ProviderAdapterServiceStub | None = None,
        callback_url: str = "",
    ) -> Submitted:
        key = client_request_key or new_request_key()
        started = now_timestamp()
        # A submit may legitimately wait for its read timeout before answering UNKNOWN.
        timeout = self.rpc_timeout_s + 2 * self.profile.submit_read_timeout_s
        request = adapter_service_pb2.SubmitRequest(
            plan=plan, client_request_key=key, callback_url=callback_url
        )
        response: adapter_service_pb2.SubmitResponse = (stub or self.stub).Submit(
            request, timeout=timeout
        )
        return Submitted(plan, key, started, response, now_timestamp())

    def accepted_job(self, overrides: Mapping[str, Any] | None = None) -> adapter_pb2.JobRef:
        """Compile and submit the base spec; the submit must be ACCEPTED."""
        submitted = self.submit(self.text_to_video_plan(overrides))
        assert submitted.response.kind == adapter_pb2.SUBMIT_OUTCOME_KIND_ACCEPTED, describe_submit(
            submitted.response
        )
        return submitted.response.job

    def recover(self, submitted: Submitted) -> adapter_service_pb2.RecoverSubmissionResponse:
        """RecoverSubmission with everything the control plane recorded for the attempt."""
        request = adapter_service_pb2.RecoverSubmissionRequest(
            account=submitted.plan.account or self.profile.account,
            model=submitted.plan.model,
            client_request_key=submitted.client_request_key,
            request_hash=submitted.plan.request_hash,
            submitted_after=submitted.started_after,
            submitted_before=submitted.finished_before,
            plan=submitted.plan,
        )
        response: adapter_service_pb2.RecoverSubmissionResponse = self.stub.RecoverSubmission(
            request, timeout=self.rpc_timeout_s
        )
        return response

    def recover_until_conclusive(
        self, submitted: Submitted, slack_s: float = 5.0
    ) -> adapter_service_pb2.RecoverSubmissionResponse:
        """Repeat recovery, as the control plane does, until the verdict is not INCONCLUSIVE
        or the adapter's settle window (plus `slack_s`) has passed; the last answer is returned."""
        wait = self.profile.submit_read_timeout_s + self.profile.recovery_settle_s + slack_s
        deadline = time.monotonic() + wait
        while True:
            result = self.recover(submitted)
            if (
                result.verdict != adapter_pb2.RECOVERY_VERDICT_INCONCLUSIVE
                or time.monotonic() >= deadline
            ):
                return result
            time.sleep(0.1)

    # -- jobs ------------------------------------------------------------------------------
    def get_job(self, job: adapter_pb2.JobRef) -> adapter_pb2.JobStatus:
        response: adapter_service_pb2.GetJobResponse = self.stub.GetJob(
            adapter_service_pb2.GetJobRequest(job=job), timeout=self.rpc_timeout_s
        )
        assert not response.HasField("error"), (
            f"GetJob({job.provider_job_id}) failed: {class_name(response.error.error_class)} "
            f"{response.error.message!r}"
        )
        return response.status

    def poll_to_end(
        self, job: adapter_pb2.JobRef, max_polls: int = 40, deadline_s: float = 30.0
    ) -> list[adapter_pb2.JobStatus]:
        """Poll until a terminal state; every observed status is returned, in order."""
        seen: list[adapter_pb2.JobStatus] = []
        deadline = time.monotonic() + deadline_s
        while len(seen) < max_polls and time.monotonic() < deadline:
            status = self.get_job(job)
            seen.append(status)
            if status.state in TERMINAL_STATES:
                return seen
            time.sleep(0.02)
        states = [state_name(s.state) for s in seen]
        raise AssertionError(f"job {job.provider_job_id} never reached a terminal state: {states}")

    def cancel(self, job: adapter_pb2.JobRef) -> adapter_service_pb2.CancelJobResponse:
        response: adapter_service_pb2.CancelJobResponse = self.stub.CancelJob(
            adapter_service_pb2.CancelJobRequest(job=job), timeout=self.rpc_timeout_s
        )
        return response


def call_or_code(call: Callable[[], T]) -> tuple[T | None, grpc.StatusCode | None]:
    """Run `call`; return (result, None) or (None, the gRPC status code it failed with)."""
    try:
        return call(), None
    except grpc.RpcError as exc:
        return None, exc.code()


def grpc_code(call: Any) -> grpc.StatusCode:
    """Run `call` expecting a gRPC error and return its status code."""
    try:
        call()
    except grpc.RpcError as exc:
        code: grpc.StatusCode = exc.code()
        return code
    raise AssertionError("the call succeeded but a gRPC error was expected")
