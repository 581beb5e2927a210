"""Cost per success in the health windows (9.13.3, issue 26) counts each finished job at the
attempt's settled cost, its estimate only where nothing settled one: the live feed
(`bootstrap.health_feed`) agrees with the rebuild from PostgreSQL, which reads the attempt."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from controlplane.bootstrap import health_feed
from controlplane.domain.breaker import BreakerConfig, BreakerRegistry
from controlplane.domain.scoring import Window
from controlplane.domain.states import AttemptState
from controlplane.persistence.records import AccountInfo, AttemptRecord
from controlplane.scheduling.health import HealthMonitor
from vidroute_core.adapter import JobSnapshot, JobState

AT = 1_000.0
T0 = datetime(2026, 6, 24, 12, 0, tzinfo=UTC)
VEO = AccountInfo(1, "google", "veo-prod-us", "us")


def _attempt(no: int, state: AttemptState, settled: int | None) -> AttemptRecord:
    return AttemptRecord(
        id=no, task_id=no, attempt_no=1, provider_account_id=1, provider_model="veo-3.1",
        provider_model_version="1", capability_version="c", price_version="p",
        routing_policy_version="r", client_request_key=f"k{no}", normalized_spec_hash="h",
        request_hash=None, compile_plan={}, route_decision_id=None, state=state, status_version=3,
        estimated_cost_micros=600_000, actual_cost_micros=settled, currency="USD",
        lease_token=None, fencing_token=None, request_started_at=T0, request_body_sent_at=None,
        transport_error_stage=None, failure=None, created_at=T0,
        updated_at=T0 + timedelta(seconds=40),
    )  # fmt: skip


async def test_a_failed_veo_job_costs_what_its_billing_rule_settled() -> None:
    """Veo reports no cost: its billing rule settles a success at the estimate and a failure
    at 0. One of each is 600,000 micros per success, not 1,200,000 (the failure at its
    estimate) nor 0 (the provider's missing figure as 0); a job nothing settled counts at its
    estimate."""
    monitor = HealthMonitor(BreakerRegistry(BreakerConfig(), lambda: AT), clock=lambda: AT)
    observe = health_feed(monitor)
    unreported = JobSnapshot(JobState.FAILED, "FAILED")  # no actual_cost_micros
    await observe(VEO, _attempt(1, AttemptState.FAILED, 0), unreported)
    await observe(
        VEO, _attempt(2, AttemptState.SUCCEEDED, 600_000), JobSnapshot(JobState.SUCCEEDED, "DONE")
    )
    stats = monitor.window_stats()["google/veo-3.1/veo-prod-us"][Window.ONE_DAY]
    assert stats.cost_per_success_micros == pytest.approx(600_000)
    await observe(
        VEO, _attempt(3, AttemptState.SUCCEEDED, None), JobSnapshot(JobState.SUCCEEDED, "DONE")
    )
    stats = monitor.window_stats()["google/veo-3.1/veo-prod-us"][Window.ONE_DAY]
    assert stats.cost_per_success_micros == pytest.approx(600_000)
