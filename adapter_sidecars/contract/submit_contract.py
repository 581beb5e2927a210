"""Contract of Submit at every transport boundary of design 9.17.3 / 9.25.3.

Each test injects one fault at the provider emulator, submits, and asserts two things: the
outcome the adapter reports (ACCEPTED / REJECTED / UNKNOWN, with stage and error class) and,
from the emulator's truth, how many provider jobs really exist. The rule being protected:
whenever the provider *may* have created a job, the outcome is UNKNOWN and the adapter never
retries on its own (one submit request reached the provider) — 任何"可能已受理"的场景都不会
自动生成新 Attempt. Scenarios that live above the adapter (database failure after a job id,
callbacks racing the submit response) are the control plane's tests, not this suite's.
"""

from __future__ import annotations

import json
import time
from collections.abc import Collection
from datetime import timedelta

import pytest

from adapter_sidecars.contract.driver import (
    MAY_HAVE_ACCEPTED_STAGES,
    AdapterDriver,
    Submitted,
    class_name,
    describe_submit,
    stage_name,
)
from adapter_sidecars.contract.emulator_admin import EmulatorAdmin
from vidroute.adapter.v1 import adapter_pb2, adapter_service_pb2_grpc
from vidroute.common.v1 import error_pb2

requires = pytest.mark.contract_requires


def assert_unknown(
    submitted: Submitted, stages: Collection[int] = MAY_HAVE_ACCEPTED_STAGES
) -> None:
    """UNKNOWN with the fields the control plane needs to start recovery (9.17.2)."""
    r = submitted.response
    assert r.kind == adapter_pb2.SUBMIT_OUTCOME_KIND_UNKNOWN, describe_submit(r)
    assert not r.job.provider_job_id, "an UNKNOWN outcome cannot carry a job id"
    assert r.error.error_class == error_pb2.ERROR_CLASS_SUBMISSION_UNKNOWN, describe_submit(r)
    assert r.error.provider_may_have_accepted, describe_submit(r)
    # 9.9.1: 请求发送结果未知 — neither retry on the same candidate nor fail over.
    assert not r.error.retryable, describe_submit(r)
    assert not r.error.failoverable, describe_submit(r)
    assert r.transport_stage in stages, (
        f"stage {stage_name(r.transport_stage)} not in {[stage_name(s) for s in stages]}"
    )
    assert r.HasField("request_started_at"), "request_started_at must be recorded"


def assert_rejected(
    submitted: Submitted,
    classes: Collection[int],
    *,
    stage: int = adapter_pb2.TRANSPORT_STAGE_UNSPECIFIED,
    raw_status_code: int = 0,
    retryable: bool | None = None,
) -> None:
    """REJECTED: certainly not created, classified, and never flagged as maybe-accepted."""
    r = submitted.response
    assert r.kind == adapter_pb2.SUBMIT_OUTCOME_KIND_REJECTED, describe_submit(r)
    assert not r.job.provider_job_id, "a REJECTED outcome cannot carry a job id"
    assert r.error.error_class in classes, (
        f"error class {class_name(r.error.error_class)} not in {[class_name(c) for c in classes]}"
    )
    assert not r.error.provider_may_have_accepted, describe_submit(r)
    assert r.transport_stage == stage, describe_submit(r)
    assert r.error.raw_status_code == raw_status_code, describe_submit(r)
    if retryable is not None:
        assert r.error.retryable is retryable, describe_submit(r)


class SubmitBoundaryContract:
    """Submit's outcome at each failure stage, checked against the provider's real job count."""

    def _submit_with_fault(
        self, adapter: AdapterDriver, emulator: EmulatorAdmin, action: str, **params: object
    ) -> Submitted:
        plan = adapter.text_to_video_plan()
        emulator.add_fault(action, adapter.profile.submit_route, **params)
        return adapter.submit(plan)

    def _assert_truth(
        self, adapter: AdapterDriver, emulator: EmulatorAdmin, jobs: int, requests: int
    ) -> None:
        truth = emulator.jobs()
        assert len(truth) == jobs, f"expected {jobs} provider job(s), emulator truth has {truth}"
        seen = emulator.count_requests(adapter.profile.submit_route)
        assert seen == requests, (
            f"the provider saw {seen} submit request(s), expected {requests}: the adapter must "
            "never retry a submit on its own"
        )

    def test_accepted_submit_creates_exactly_the_compiled_request(
        self, adapter: AdapterDriver, emulator: EmulatorAdmin
    ) -> None:
        """ACCEPTED carries the id of the one job created, whose body is the plan's request."""
        plan = adapter.text_to_video_plan()
        submitted = adapter.submit(plan)
        r = submitted.response
        assert r.kind == adapter_pb2.SUBMIT_OUTCOME_KIND_ACCEPTED, describe_submit(r)
        assert r.transport_stage == adapter_pb2.TRANSPORT_STAGE_UNSPECIFIED
        assert not r.HasField("error"), describe_submit(r)
        assert r.HasField("request_started_at")
        self._assert_truth(adapter, emulator, jobs=1, requests=1)
        job = emulator.jobs()[0]
        assert r.job.provider_job_id == job["id"]
        body = dict(job["body"])
        extra = adapter.profile.submit_labels
        if extra:
            labels = body.pop(extra, None)
            assert isinstance(labels, dict), f"the create body has no {extra} object"
            assert labels, f"the create body's {extra} are empty"
            wanted = submitted.client_request_key.lower()
            assert any(wanted[:40] in str(v) for v in labels.values()), (
                f"no {extra} value carries the attempt's key {submitted.client_request_key}: "
                f"{labels}"
            )
        assert body == json.loads(plan.native_request_json), "the adapter sent a different body"
        if adapter.profile.supports_idempotency_key:
            assert job["idempotency_key"] == submitted.client_request_key

    @requires("unresolvable_adapter")
    def test_dns_failure_is_rejected_without_a_job(
        self,
        adapter: AdapterDriver,
        emulator: EmulatorAdmin,
        unresolvable_adapter_stub: adapter_service_pb2_grpc.ProviderAdapterServiceStub,
    ) -> None:
        """A provider host that does not resolve gives REJECTED at stage DNS, retryable, no job."""
        unresolvable = AdapterDriver(unresolvable_adapter_stub, adapter.profile)
        submitted = unresolvable.submit(unresolvable.text_to_video_plan())
        assert_rejected(
            submitted,
            {error_pb2.ERROR_CLASS_TRANSIENT_NETWORK},
            stage=adapter_pb2.TRANSPORT_STAGE_DNS,
            retryable=True,
        )
        self._assert_truth(adapter, emulator, jobs=0, requests=0)

    def test_refused_connection_is_rejected_without_a_job(
        self, adapter: AdapterDriver, emulator: EmulatorAdmin
    ) -> None:
        """A refused TCP connect gives REJECTED at stage CONNECT, retryable, and no job."""
        plan = adapter.text_to_video_plan()
        emulator.add_fault("refuse_connection", duration_ms=1500)
        submitted = adapter.submit(plan)
        assert_rejected(
            submitted,
            {error_pb2.ERROR_CLASS_TRANSIENT_NETWORK},
            stage=adapter_pb2.TRANSPORT_STAGE_CONNECT,
            retryable=True,
        )
        emulator.wait_reachable()
        self._assert_truth(adapter, emulator, jobs=0, requests=0)

    def test_slow_accept_within_the_timeout_is_accepted(
        self, adapter: AdapterDriver, emulator: EmulatorAdmin
    ) -> None:
        """A provider slow to read the request, but within the timeout, still gives ACCEPTED."""
        delay_ms = int(adapter.profile.submit_read_timeout_s * 1000 / 4)
        submitted = self._submit_with_fault(adapter, emulator, "delay_accept", ms=delay_ms)
        assert submitted.response.kind == adapter_pb2.SUBMIT_OUTCOME_KIND_ACCEPTED, describe_submit(
            submitted.response
        )
        self._assert_truth(adapter, emulator, jobs=1, requests=1)

    def test_accept_slower_than_the_read_timeout_is_unknown(
        self, adapter: AdapterDriver, emulator: EmulatorAdmin
    ) -> None:
        """A provider that takes the request only after the read timeout gives UNKNOWN, and the
        job it creates afterwards really exists: the outcome could not have been REJECTED."""
        delay_s = adapter.profile.submit_read_timeout_s + 1.0
        submitted = self._submit_with_fault(
            adapter, emulator, "delay_accept", ms=int(delay_s * 1000)
        )
        assert_unknown(submitted)
        deadline = time.monotonic() + delay_s + 5.0
        while not emulator.jobs() and time.monotonic() < deadline:
            time.sleep(0.05)
        self._assert_truth(adapter, emulator, jobs=1, requests=1)

    def test_drop_after_partial_body_is_unknown(
        self, adapter: AdapterDriver, emulator: EmulatorAdmin
    ) -> None:
        """A connection dropped while the body is read is UNKNOWN (9.17.3), though no job exists."""
        submitted = self._submit_with_fault(adapter, emulator, "drop_after_partial_body")
        assert_unknown(submitted)
        self._assert_truth(adapter, emulator, jobs=0, requests=1)

    def test_drop_after_body_is_unknown_with_one_job(
        self, adapter: AdapterDriver, emulator: EmulatorAdmin
    ) -> None:
        """A connection dropped after the job was created is UNKNOWN; exactly one job exists."""
        submitted = self._submit_with_fault(adapter, emulator, "drop_after_body")
        assert_unknown(submitted)
        self._assert_truth(adapter, emulator, jobs=1, requests=1)

    def test_read_timeout_after_body_is_unknown_with_one_job(
        self, adapter: AdapterDriver, emulator: EmulatorAdmin
    ) -> None:
        """No response within the read timeout after the whole body was sent is UNKNOWN at
        AWAIT_RESPONSE, with one job at the provider."""
        stall = adapter.profile.submit_read_timeout_s + 1.5
        submitted = self._submit_with_fault(adapter, emulator, "stall_response", seconds=stall)
        assert_unknown(submitted, {adapter_pb2.TRANSPORT_STAGE_AWAIT_RESPONSE})
        self._assert_truth(adapter, emulator, jobs=1, requests=1)

    def test_corrupt_json_is_unknown_with_one_job(
        self, adapter: AdapterDriver, emulator: EmulatorAdmin
    ) -> None:
        """A 2xx whose body is not valid JSON is UNKNOWN at READ_RESPONSE, with one job."""
        submitted = self._submit_with_fault(adapter, emulator, "corrupt_json")
        assert_unknown(submitted, {adapter_pb2.TRANSPORT_STAGE_READ_RESPONSE})
        self._assert_truth(adapter, emulator, jobs=1, requests=1)

    def test_success_without_a_job_id_is_unknown_with_one_job(
        self, adapter: AdapterDriver, emulator: EmulatorAdmin
    ) -> None:
        """A 2xx that lacks the job id is UNKNOWN at READ_RESPONSE, never ACCEPTED without an id."""
        submitted = self._submit_with_fault(adapter, emulator, "missing_id")
        assert_unknown(submitted, {adapter_pb2.TRANSPORT_STAGE_READ_RESPONSE})
        self._assert_truth(adapter, emulator, jobs=1, requests=1)

    def test_rate_limit_is_rejected_with_retry_after(
        self, adapter: AdapterDriver, emulator: EmulatorAdmin
    ) -> None:
        """429 with Retry-After is REJECTED as rate limit/quota, keeps retry_after, makes no job."""
        submitted = self._submit_with_fault(adapter, emulator, "status", code=429, retry_after=7)
        classes = {
            error_pb2.ErrorClass.Value(f"ERROR_CLASS_{c}")
            for c in adapter.profile.rate_limit_classes
        }
        assert_rejected(submitted, classes, raw_status_code=429)
        retry_after = submitted.response.error.retry_after.ToTimedelta()
        assert retry_after == timedelta(seconds=7), f"retry_after {retry_after}, provider said 7 s"
        self._assert_truth(adapter, emulator, jobs=0, requests=1)

    def test_overloaded_503_is_rejected_and_retryable(
        self, adapter: AdapterDriver, emulator: EmulatorAdmin
    ) -> None:
        """503 is REJECTED as PROVIDER_OVERLOADED, retryable and failoverable, with no job."""
        submitted = self._submit_with_fault(adapter, emulator, "status", code=503)
        assert_rejected(
            submitted,
            {error_pb2.ERROR_CLASS_PROVIDER_OVERLOADED},
            raw_status_code=503,
            retryable=True,
        )
        assert submitted.response.error.failoverable
        self._assert_truth(adapter, emulator, jobs=0, requests=1)

    def test_bad_request_400_is_rejected_as_invalid_input(
        self, adapter: AdapterDriver, emulator: EmulatorAdmin
    ) -> None:
        """400 is REJECTED as INVALID_INPUT and not retryable, with no job."""
        submitted = self._submit_with_fault(adapter, emulator, "status", code=400)
        assert_rejected(
            submitted, {error_pb2.ERROR_CLASS_INVALID_INPUT}, raw_status_code=400, retryable=False
        )
        self._assert_truth(adapter, emulator, jobs=0, requests=1)

    def test_unauthorized_401_is_rejected_as_auth(
        self, adapter: AdapterDriver, emulator: EmulatorAdmin
    ) -> None:
        """401 is REJECTED as AUTH, not retryable on the same account, with no job."""
        submitted = self._submit_with_fault(adapter, emulator, "status", code=401)
        assert_rejected(
            submitted, {error_pb2.ERROR_CLASS_AUTH}, raw_status_code=401, retryable=False
        )
        self._assert_truth(adapter, emulator, jobs=0, requests=1)
