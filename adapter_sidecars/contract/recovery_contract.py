"""Contract of RecoverSubmission and idempotent resubmits (design 9.17.4).

What recovery may say depends on what the provider offers, so the flags decide which tests
run: with an idempotency key or a task search (``conclusive_recovery``) the verdict must be
right — FOUND the very job, or NOT_FOUND only when truth has no job. Without either, the only
honest verdict is INCONCLUSIVE. In every case recovery must never hand back another attempt's
job and never claim NOT_FOUND while a job exists: that is how duplicate paid jobs happen.
"""

from __future__ import annotations

import time

import pytest

from adapter_sidecars.contract.driver import (
    AdapterDriver,
    Submitted,
    describe_submit,
    new_request_key,
    now_timestamp,
    verdict_name,
)
from adapter_sidecars.contract.emulator_admin import EmulatorAdmin
from adapter_sidecars.contract.submit_contract import assert_unknown
from vidroute.adapter.v1 import adapter_pb2, adapter_service_pb2

requires = pytest.mark.contract_requires

FOUND = adapter_pb2.RECOVERY_VERDICT_FOUND
NOT_FOUND = adapter_pb2.RECOVERY_VERDICT_NOT_FOUND
INCONCLUSIVE = adapter_pb2.RECOVERY_VERDICT_INCONCLUSIVE


def _dropped(
    adapter: AdapterDriver, emulator: EmulatorAdmin, action: str, key: str | None = None
) -> Submitted:
    plan = adapter.text_to_video_plan()
    emulator.add_fault(action, adapter.profile.submit_route)
    submitted = adapter.submit(plan, key)
    assert_unknown(submitted)
    return submitted


class RecoveryContract:
    """An UNKNOWN submit is resolved to the right job, or honestly left undecided."""

    @requires("conclusive_recovery")
    def test_dropped_response_is_recovered_to_the_created_job(
        self, adapter: AdapterDriver, emulator: EmulatorAdmin
    ) -> None:
        """After drop_after_body, recovery says FOUND with the one job the provider created."""
        submitted = _dropped(adapter, emulator, "drop_after_body")
        [job] = emulator.jobs()
        result = adapter.recover(submitted)
        assert result.verdict == FOUND, (
            f"verdict {verdict_name(result.verdict)}, truth has {job['id']}"
        )
        assert result.job.provider_job_id == job["id"]
        assert result.method, "the method that found the job must be named"

    @requires("conclusive_recovery")
    def test_partial_body_is_recovered_as_not_found(
        self, adapter: AdapterDriver, emulator: EmulatorAdmin
    ) -> None:
        """After drop_after_partial_body no job exists, and a conclusive search says NOT_FOUND."""
        submitted = _dropped(adapter, emulator, "drop_after_partial_body")
        assert emulator.jobs() == []
        result = adapter.recover_until_conclusive(submitted)
        assert result.verdict == NOT_FOUND, verdict_name(result.verdict)
        assert not result.job.provider_job_id

    @requires("conclusive_recovery")
    def test_accepted_submit_can_be_recovered(
        self, adapter: AdapterDriver, emulator: EmulatorAdmin
    ) -> None:
        """A job whose id the control plane lost after ACCEPTED (e.g. its database write failed)
        is found again by recovery."""
        submitted = adapter.submit(adapter.text_to_video_plan())
        assert submitted.response.kind == adapter_pb2.SUBMIT_OUTCOME_KIND_ACCEPTED, describe_submit(
            submitted.response
        )
        result = adapter.recover(submitted)
        assert result.verdict == FOUND, verdict_name(result.verdict)
        assert result.job.provider_job_id == submitted.response.job.provider_job_id

    @requires("conclusive_recovery")
    def test_never_sent_key_is_not_found(
        self, adapter: AdapterDriver, emulator: EmulatorAdmin
    ) -> None:
        """Recovering a key that was never submitted is a conclusive NOT_FOUND."""
        plan = adapter.text_to_video_plan()
        never = Submitted(
            plan,
            new_request_key(),
            now_timestamp(-5),
            adapter_service_pb2.SubmitResponse(),
            now_timestamp(),
        )
        result = adapter.recover_until_conclusive(never)
        assert result.verdict == NOT_FOUND, verdict_name(result.verdict)

    def test_job_created_after_the_timeout_is_never_reported_not_found(
        self, adapter: AdapterDriver, emulator: EmulatorAdmin
    ) -> None:
        """While a provider that was slow to take the request may still create the job, recovery
        never says NOT_FOUND (proto: "safe to retry or fail over"); a conclusive search ends
        FOUND with the job created late (9.17.5 最长建单延迟)."""
        profile = adapter.profile
        delay_s = profile.submit_read_timeout_s + 1.0
        plan = adapter.text_to_video_plan()
        emulator.add_fault("delay_accept", profile.submit_route, ms=int(delay_s * 1000))
        submitted = adapter.submit(plan)
        assert_unknown(submitted)
        wait_s = delay_s + profile.submit_read_timeout_s + profile.recovery_settle_s + 2.0
        deadline = time.monotonic() + wait_s
        verdicts: list[str] = []
        while time.monotonic() < deadline:
            result = adapter.recover(submitted)
            verdicts.append(f"{verdict_name(result.verdict)}(jobs={len(emulator.jobs())})")
            assert result.verdict != NOT_FOUND, (
                f"NOT_FOUND while the provider could still create the job: {verdicts}"
            )
            if result.verdict == FOUND:
                break
            time.sleep(0.1)
        [job] = emulator.jobs()
        if profile.conclusive_recovery:
            assert result.verdict == FOUND, verdicts
            assert result.job.provider_job_id == job["id"]

    @requires(conclusive_recovery=False)
    def test_without_search_a_dropped_response_is_inconclusive(
        self, adapter: AdapterDriver, emulator: EmulatorAdmin
    ) -> None:
        """With no idempotency key and no task search, recovery after drop_after_body is
        INCONCLUSIVE: never NOT_FOUND while a job exists. FOUND is allowed only with the very
        job created (a provider that reported it by webhook, keyed by the request key)."""
        submitted = _dropped(adapter, emulator, "drop_after_body")
        [job] = emulator.jobs()
        result = adapter.recover_until_conclusive(submitted, slack_s=0.5)
        assert result.verdict in (INCONCLUSIVE, FOUND), verdict_name(result.verdict)
        if result.verdict == FOUND:
            assert result.job.provider_job_id == job["id"], result

    @requires(conclusive_recovery=False)
    def test_without_search_a_partial_body_is_inconclusive(
        self, adapter: AdapterDriver, emulator: EmulatorAdmin
    ) -> None:
        """With no way to search, recovery cannot prove absence either: INCONCLUSIVE."""
        submitted = _dropped(adapter, emulator, "drop_after_partial_body")
        result = adapter.recover_until_conclusive(submitted, slack_s=0.5)
        assert result.verdict == INCONCLUSIVE, verdict_name(result.verdict)

    def test_recovery_never_returns_another_attempts_job(
        self, adapter: AdapterDriver, emulator: EmulatorAdmin
    ) -> None:
        """With an identical earlier job of another attempt present, recovering a dropped submit
        yields its own job or INCONCLUSIVE, never the other attempt's job or NOT_FOUND."""
        earlier = adapter.accepted_job()
        submitted = _dropped(adapter, emulator, "drop_after_body")
        own = [j["id"] for j in emulator.jobs() if j["id"] != earlier.provider_job_id]
        assert len(own) == 1, emulator.jobs()
        result = adapter.recover(submitted)
        assert result.verdict in (FOUND, INCONCLUSIVE), verdict_name(result.verdict)
        if result.verdict == FOUND:
            assert result.job.provider_job_id == own[0], (
                f"recovery returned {result.job.provider_job_id}, the earlier attempt's job"
                if result.job.provider_job_id == earlier.provider_job_id
                else f"recovery returned {result.job.provider_job_id}, expected {own[0]}"
            )

    @requires("supports_idempotency_key")
    def test_resubmit_with_same_key_after_dropped_response_returns_the_same_job(
        self, adapter: AdapterDriver, emulator: EmulatorAdmin
    ) -> None:
        """With an idempotency key, resubmitting the same attempt after drop_after_body is
        ACCEPTED with the job already created, and the provider still has one job."""
        submitted = _dropped(adapter, emulator, "drop_after_body")
        [job] = emulator.jobs()
        again = adapter.submit(submitted.plan, submitted.client_request_key)
        assert again.response.kind == adapter_pb2.SUBMIT_OUTCOME_KIND_ACCEPTED, describe_submit(
            again.response
        )
        assert again.response.job.provider_job_id == job["id"]
        assert len(emulator.jobs()) == 1, emulator.jobs()

    @requires("supports_idempotency_key")
    def test_resubmit_with_same_key_after_accept_returns_the_same_job(
        self, adapter: AdapterDriver, emulator: EmulatorAdmin
    ) -> None:
        """With an idempotency key, submitting the same attempt twice yields one job, twice."""
        plan = adapter.text_to_video_plan()
        first = adapter.submit(plan)
        second = adapter.submit(plan, first.client_request_key)
        for s in (first, second):
            assert s.response.kind == adapter_pb2.SUBMIT_OUTCOME_KIND_ACCEPTED, describe_submit(
                s.response
            )
        assert first.response.job.provider_job_id == second.response.job.provider_job_id
        [job] = emulator.jobs()
        assert job["idempotency_key"] == first.client_request_key
