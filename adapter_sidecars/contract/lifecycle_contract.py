"""Contract of GetJob, CancelJob and ListUsage (design 9.25.1: 状态映射完整, 终态不会回退,
错误分类正确, 输出地址和过期时间被保留, 取消是幂等的, 重复回调不会重复推进状态).

The adapter is stateless: it translates what the provider says *now*. So at this level
"terminal states never go back" and "duplicate callbacks don't advance state twice" mean that
reading a finished job again gives the same answer. Deduplicating callbacks and refusing
out-of-order transitions across polls and callbacks is the control plane's job (9.8.1, 9.18.1),
tested there with a version-conditioned state machine, not here.
"""

from __future__ import annotations

import json
import time
from datetime import timedelta

import grpc
import pytest

from adapter_sidecars.contract.driver import (
    PHASE,
    AdapterDriver,
    Submitted,
    call_or_code,
    class_name,
    describe_submit,
    now_timestamp,
    state_name,
)
from adapter_sidecars.contract.emulator_admin import EmulatorAdmin
from vidroute.adapter.v1 import adapter_pb2, adapter_service_pb2
from vidroute.common.v1 import error_pb2

requires = pytest.mark.contract_requires

SUCCEEDED = adapter_pb2.JOB_STATE_SUCCEEDED
FAILED = adapter_pb2.JOB_STATE_FAILED
CANCELLED = adapter_pb2.JOB_STATE_CANCELLED
UNKNOWN_RAW_STATUS = "CONTRACT_WARMING_UP"
# Nothing listens here: the emulator logs each delivery attempt, which is all the suite needs.
CALLBACK_URL = "http://127.0.0.1:9/contract-callback"
_CANCEL_REFUSALS = (grpc.StatusCode.UNIMPLEMENTED, grpc.StatusCode.FAILED_PRECONDITION)


def _names(statuses: list[adapter_pb2.JobStatus]) -> list[str]:
    names: list[str] = []
    for status in statuses:
        name = state_name(status.state)
        if not names or names[-1] != name:
            names.append(name)
    return names


def _is_subsequence(wanted: tuple[str, ...], seen: list[str]) -> bool:
    it = iter(seen)
    return all(any(s == w for s in it) for w in wanted)


def _assert_monotonic(statuses: list[adapter_pb2.JobStatus]) -> None:
    phases = [PHASE[s.state] for s in statuses if s.state in PHASE]
    assert phases == sorted(phases), f"states went backwards: {_names(statuses)}"


def _expires_in_s(output: adapter_pb2.Output) -> float:
    return output.expires_at.ToNanoseconds() / 1e9 - time.time()


class JobLifecycleContract:
    """Every provider state maps to a normalized state, with the raw view kept beside it."""

    def test_plain_job_progresses_through_the_profile_states(self, adapter: AdapterDriver) -> None:
        """A plain job shows the profile's progression in order, then SUCCEEDED with outputs."""
        statuses = adapter.poll_to_end(adapter.accepted_job())
        seen = _names(statuses)
        assert _is_subsequence(adapter.profile.progression, seen), (
            f"expected {list(adapter.profile.progression)} in order, saw {seen}"
        )
        _assert_monotonic(statuses)
        assert statuses[-1].state == SUCCEEDED, seen
        assert statuses[-1].outputs, "SUCCEEDED without outputs"

    def test_every_status_keeps_the_raw_provider_view(self, adapter: AdapterDriver) -> None:
        """Every status carries the provider's raw status string and its raw JSON payload (9.8)."""
        for status in adapter.poll_to_end(adapter.accepted_job()):
            assert status.raw_status, f"{state_name(status.state)} without raw_status"
            assert isinstance(json.loads(status.raw_payload_json), dict), status.raw_payload_json

    @requires("reports_progress")
    def test_progress_is_a_rising_fraction_and_queue_position_only_while_waiting(
        self, adapter: AdapterDriver
    ) -> None:
        """A plain job's live fractions lie in 0..1 and never fall, a RUNNING status carries
        one, and a queue position comes only with QUEUED or THROTTLED."""
        statuses = adapter.poll_to_end(adapter.accepted_job())
        live = [s for s in statuses if s.state not in (SUCCEEDED, FAILED, CANCELLED)]
        fractions = [s.progress for s in live if s.HasField("progress")]
        running = [s for s in live if s.state == adapter_pb2.JOB_STATE_RUNNING]
        assert any(s.HasField("progress") for s in running), _names(statuses)
        assert all(0.0 <= f <= 1.0 for f in fractions), fractions
        assert fractions == sorted(fractions), f"progress went backwards: {fractions}"
        waiting = (adapter_pb2.JOB_STATE_QUEUED, adapter_pb2.JOB_STATE_THROTTLED)
        positioned = [s for s in statuses if s.HasField("queue_position")]
        assert all(s.state in waiting for s in positioned), _names(positioned)

    @requires(reports_progress=False)
    def test_no_progress_is_invented(self, adapter: AdapterDriver) -> None:
        """Where the provider reports no progress, no live status carries a fraction or a
        queue position: the adapter makes none up."""
        statuses = adapter.poll_to_end(adapter.accepted_job())
        live = [s for s in statuses if s.state not in (SUCCEEDED, FAILED, CANCELLED)]
        invented = [s for s in live if s.HasField("progress") or s.HasField("queue_position")]
        assert not invented, _names(invented)

    @requires("reports_throttling")
    def test_throttled_job_is_reported_throttled(
        self, adapter: AdapterDriver, emulator: EmulatorAdmin
    ) -> None:
        """A job held by the provider's concurrency limit is THROTTLED, then runs to SUCCEEDED."""
        job = adapter.accepted_job()
        emulator.add_fault("throttle_polls", adapter.profile.poll_route, n=2)
        statuses = adapter.poll_to_end(job)
        throttled = [s for s in statuses if s.state == adapter_pb2.JOB_STATE_THROTTLED]
        assert len(throttled) == 2, _names(statuses)
        assert all(s.raw_status for s in throttled)
        assert statuses[-1].state == SUCCEEDED, _names(statuses)

    @requires(reports_throttling=False)
    def test_throttling_without_a_throttle_status_stays_non_terminal(
        self, adapter: AdapterDriver, emulator: EmulatorAdmin
    ) -> None:
        """Where the provider has no throttle status, a held job reads as waiting, then succeeds."""
        job = adapter.accepted_job()
        emulator.add_fault("throttle_polls", adapter.profile.poll_route, n=2)
        statuses = adapter.poll_to_end(job)
        assert all(s.state not in (FAILED, CANCELLED) for s in statuses), _names(statuses)
        assert statuses[-1].state == SUCCEEDED, _names(statuses)

    @requires(outcomes_from_webhooks=False)
    def test_unknown_raw_status_is_unrecognized_and_kept(
        self, adapter: AdapterDriver, emulator: EmulatorAdmin
    ) -> None:
        """A raw status the adapter has never seen is UNRECOGNIZED (not a crash, not terminal),
        keeps the raw string, and the job still completes."""
        job = adapter.accepted_job()
        emulator.add_fault("unknown_status", adapter.profile.poll_route, value=UNKNOWN_RAW_STATUS)
        first = adapter.get_job(job)
        assert first.state == adapter_pb2.JOB_STATE_UNRECOGNIZED, state_name(first.state)
        assert UNKNOWN_RAW_STATUS in first.raw_status, first.raw_status
        assert adapter.poll_to_end(job)[-1].state == SUCCEEDED

    def test_each_declared_failure_code_maps_to_its_class(
        self, adapter: AdapterDriver, emulator: EmulatorAdmin
    ) -> None:
        """Every provider failure code the profile declares ends FAILED with its error class."""
        wrong: list[str] = []
        for code, expected in adapter.profile.failure_codes.items():
            emulator.add_fault("fail_job", adapter.profile.submit_route, code=code)
            final = adapter.poll_to_end(adapter.accepted_job())[-1]
            got = class_name(final.failure.error_class)
            if final.state != FAILED or got != expected:
                wrong.append(f"{code}: {state_name(final.state)}/{got}, expected FAILED/{expected}")
            elif not final.failure.message or final.outputs:
                wrong.append(f"{code}: failure without message or with outputs")
        assert not wrong, "failure codes mis-mapped:\n" + "\n".join(wrong)

    def test_success_never_goes_back(self, adapter: AdapterDriver) -> None:
        """Reading a SUCCEEDED job again keeps SUCCEEDED and its outputs: GetJob is idempotent,
        so a duplicate callback that triggers a re-read cannot advance the job twice."""
        job = adapter.accepted_job()
        final = adapter.poll_to_end(job)[-1]
        for _ in range(3):
            again = adapter.get_job(job)
            assert again.state == SUCCEEDED, state_name(again.state)
            assert again.raw_status == final.raw_status
            assert len(again.outputs) == len(final.outputs)

    def test_failure_never_goes_back(self, adapter: AdapterDriver, emulator: EmulatorAdmin) -> None:
        """Reading a FAILED job again keeps FAILED with the same error class."""
        code = next(iter(adapter.profile.failure_codes))
        emulator.add_fault("fail_job", adapter.profile.submit_route, code=code)
        job = adapter.accepted_job()
        final = adapter.poll_to_end(job)[-1]
        assert final.state == FAILED, state_name(final.state)
        for _ in range(3):
            again = adapter.get_job(job)
            assert again.state == FAILED, state_name(again.state)
            assert again.failure.error_class == final.failure.error_class

    def test_output_url_is_kept_as_the_provider_gave_it(self, adapter: AdapterDriver) -> None:
        """A SUCCEEDED job's output URI is the provider's own, present in the raw payload."""
        final = adapter.poll_to_end(adapter.accepted_job())[-1]
        assert final.outputs, "SUCCEEDED without outputs"
        for output in final.outputs:
            assert output.uri, output
            assert (
                output.uri in final.raw_payload_json
                or json.dumps(output.uri) in final.raw_payload_json
            ), f"{output.uri} is not in the provider payload: the adapter rewrote the URL"

    @requires("output_expiry_known")
    def test_output_expiry_is_kept(self, adapter: AdapterDriver) -> None:
        """A fresh output carries expires_at in the future (the provider's expiry, not unset)."""
        final = adapter.poll_to_end(adapter.accepted_job())[-1]
        for output in final.outputs:
            assert output.HasField("expires_at"), "expires_at unset though the provider says it"
            assert _expires_in_s(output) > 0, f"fresh output already expired: {output}"

    @requires("output_expiry_known")
    def test_expired_output_is_refreshed_by_reading_the_job_again(
        self, adapter: AdapterDriver, emulator: EmulatorAdmin
    ) -> None:
        """An output link observed already expired is reported expired; the next read gives a fresh
        link to the same job, and no second job is created (查询刷新, 不重新生成)."""
        emulator.add_fault("expire_output", adapter.profile.submit_route)
        job = adapter.accepted_job()
        stale = adapter.poll_to_end(job)[-1]
        assert stale.state == SUCCEEDED, state_name(stale.state)
        assert stale.outputs, "SUCCEEDED without outputs"
        assert all(_expires_in_s(o) <= 0 for o in stale.outputs), [
            str(o.expires_at) for o in stale.outputs
        ]
        fresh = adapter.get_job(job)
        assert fresh.state == SUCCEEDED, state_name(fresh.state)
        assert fresh.outputs, "SUCCEEDED without outputs"
        assert all(_expires_in_s(o) > 0 for o in fresh.outputs)
        assert {o.uri for o in fresh.outputs}.isdisjoint({o.uri for o in stale.outputs})
        assert len(emulator.jobs()) == 1


class CallbackContract:
    """The adapter hands the callback URL to the provider; what arrives there is the control
    plane's to verify, deduplicate and order (9.18.1), so those checks live with it."""

    def _submit_with_callback(self, adapter: AdapterDriver) -> Submitted:
        submitted = adapter.submit(adapter.text_to_video_plan(), callback_url=CALLBACK_URL)
        r = submitted.response
        assert r.kind == adapter_pb2.SUBMIT_OUTCOME_KIND_ACCEPTED, describe_submit(r)
        return submitted

    @requires("supports_callbacks")
    def test_callback_url_reaches_the_provider(
        self, adapter: AdapterDriver, emulator: EmulatorAdmin
    ) -> None:
        """A Submit with a callback URL creates one job and the provider calls that URL back."""
        job = self._submit_with_callback(adapter).response.job
        assert adapter.poll_to_end(job)[-1].state == SUCCEEDED
        assert len(emulator.jobs()) == 1
        urls = {d["url"] for d in emulator.callbacks() if d["job_id"] == job.provider_job_id}
        assert urls == {CALLBACK_URL}, f"the provider called back {urls or 'nothing'}"

    @requires("supports_callbacks")
    def test_callback_before_the_submit_response_still_accepts(
        self, adapter: AdapterDriver, emulator: EmulatorAdmin
    ) -> None:
        """A callback that beats the submit response leaves the outcome ACCEPTED, with one job."""
        emulator.add_fault("callback_before_response", adapter.profile.submit_route)
        job = self._submit_with_callback(adapter).response.job
        assert [j["id"] for j in emulator.jobs()] == [job.provider_job_id]
        assert adapter.poll_to_end(job)[-1].state == SUCCEEDED


class CancelContract:
    """Cancel is a request, idempotent, and never rewrites a real terminal outcome (9.18.3)."""

    def _assert_acknowledged(self, response: adapter_service_pb2.CancelJobResponse) -> None:
        assert response.acknowledged, f"cancel not acknowledged: {response}"
        assert not response.HasField("error"), f"cancel reported an error: {response.error}"

    @requires("supports_cancel")
    def test_cancel_is_acknowledged_and_stops_the_job(
        self, adapter: AdapterDriver, emulator: EmulatorAdmin
    ) -> None:
        """Cancelling a queued job is acknowledged, cancels it at the provider, reads CANCELLED."""
        job = adapter.accepted_job()
        adapter.get_job(job)
        self._assert_acknowledged(adapter.cancel(job))
        truth = emulator.job(job.provider_job_id)
        assert truth["phase"] == "cancelled", truth
        assert truth["deleted"] is adapter.profile.cancel_deletes_job, truth
        if adapter.profile.cancel_deletes_job:
            # A job the provider no longer knows is JOB_NOT_FOUND, never a CANCELLED status
            # (a 404 is also what a lost job reads); the control plane confirms its own cancel.
            gone = adapter.stub.GetJob(
                adapter_service_pb2.GetJobRequest(job=job), timeout=adapter.rpc_timeout_s
            )
            assert not gone.HasField("status"), gone
            assert gone.error.code == "JOB_NOT_FOUND", gone
            return
        after = adapter.get_job(job)
        assert after.state == CANCELLED, state_name(after.state)

    @requires("supports_cancel")
    def test_cancel_twice_is_acknowledged_twice_with_one_effect(
        self, adapter: AdapterDriver, emulator: EmulatorAdmin
    ) -> None:
        """A second cancel is acknowledged again, error-free; the provider has one cancelled job."""
        job = adapter.accepted_job()
        self._assert_acknowledged(adapter.cancel(job))
        self._assert_acknowledged(adapter.cancel(job))
        [truth] = emulator.jobs()
        assert truth["phase"] == "cancelled", truth
        if not adapter.profile.cancel_deletes_job:
            assert adapter.get_job(job).state == CANCELLED

    @requires("supports_cancel")
    def test_cancel_after_success_keeps_the_real_outcome(
        self, adapter: AdapterDriver, emulator: EmulatorAdmin
    ) -> None:
        """Cancelling a job that already SUCCEEDED is acknowledged but the job stays SUCCEEDED,
        outputs included, at the adapter and at the provider (保留供应商真实终态)."""
        job = adapter.accepted_job()
        assert adapter.poll_to_end(job)[-1].state == SUCCEEDED
        self._assert_acknowledged(adapter.cancel(job))
        truth = emulator.job(job.provider_job_id)
        assert truth["phase"] == "succeeded", truth
        assert not truth["deleted"], f"the cancel deleted a finished job and its outputs: {truth}"
        after = adapter.get_job(job)
        assert after.state == SUCCEEDED, state_name(after.state)
        assert after.outputs, "SUCCEEDED without outputs after the cancel"

    @requires(supports_cancel=False)
    def test_unsupported_cancel_is_refused_and_leaves_the_job_alone(
        self, adapter: AdapterDriver, emulator: EmulatorAdmin
    ) -> None:
        """Without provider cancel, CancelJob says so (not acknowledged) and the job goes on."""
        job = adapter.accepted_job()
        response, code = call_or_code(lambda: adapter.cancel(job))
        if code is not None:
            assert code in _CANCEL_REFUSALS, code
        else:
            assert response is not None
            assert not response.acknowledged, response
            assert response.error.error_class == error_pb2.ERROR_CLASS_UNSUPPORTED_CAPABILITY, (
                response
            )
        assert emulator.job(job.provider_job_id)["phase"] != "cancelled"
        assert adapter.poll_to_end(job)[-1].state == SUCCEEDED


@requires("supports_usage")
class UsageContract:
    """ListUsage reports what the provider billed, for reconciliation (9.23)."""

    def _usage(
        self, adapter: AdapterDriver, start_s: float, end_s: float
    ) -> adapter_service_pb2.ListUsageResponse:
        request = adapter_service_pb2.ListUsageRequest(
            account=adapter.profile.account,
            start_time=now_timestamp(start_s),
            end_time=now_timestamp(end_s),
        )
        response: adapter_service_pb2.ListUsageResponse = adapter.stub.ListUsage(
            request, timeout=adapter.rpc_timeout_s
        )
        assert not response.HasField("error"), f"ListUsage failed: {response.error}"
        return response

    def test_finished_job_appears_in_usage(self, adapter: AdapterDriver) -> None:
        """After a job succeeds, usage in a window around now has a positive record of its model."""
        job = adapter.accepted_job()
        assert adapter.poll_to_end(job)[-1].state == SUCCEEDED
        day = timedelta(days=1).total_seconds()
        records = self._usage(adapter, -day, day).records
        model = adapter.profile.model_for("TEXT_TO_VIDEO")
        mine = [r for r in records if r.model == model]
        assert mine, f"no usage record for {model}: {list(records)}"
        assert sum(r.provider_milliunits for r in mine) > 0
        assert all(r.provider_unit and json.loads(r.raw_json) is not None for r in mine)

    def test_records_are_billable_facts(self, adapter: AdapterDriver) -> None:
        """Reconciliation reads every record as a bill line: units and money non-negative, an
        ISO currency on the money, and a record that names a request also names its job (an
        identity without a job id could tie a charge to no job, or to the wrong one)."""
        job = adapter.accepted_job()
        assert adapter.poll_to_end(job)[-1].state == SUCCEEDED
        day = timedelta(days=1).total_seconds()
        records = list(self._usage(adapter, -day, day).records)
        assert records, "no usage record after a finished job"
        for r in records:
            assert r.provider_milliunits >= 0, r
            assert r.cost.amount_micros >= 0, r
            assert len(r.cost.currency_code) == 3, r
            if r.client_request_key or r.provider_request_id:
                assert r.provider_job_id, f"a request identity without its job: {r}"

    def test_window_without_jobs_is_empty(self, adapter: AdapterDriver) -> None:
        """A window in which nothing ran has no usage records and no error."""
        day = timedelta(days=1).total_seconds()
        assert list(self._usage(adapter, 2 * day, 3 * day).records) == []
