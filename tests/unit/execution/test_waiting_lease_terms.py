"""The shipped terms of a waiting attempt's lease: renewed often enough to outlive any backlog."""

from __future__ import annotations

import pytest

from controlplane.execution.config import ExecutionConfig
from controlplane.scheduling.dispatcher import DispatcherConfig
from vidroute_core.timescale import scale_durations


@pytest.mark.parametrize("factor", [1.0, 0.1, 0.02])
def test_a_waiting_lease_is_renewed_at_least_three_times_per_ttl(factor: float) -> None:
    """On every time factor the renewal period of READY_TO_SUBMIT leases is at most a third of
    the dispatcher's lease TTL, so two missed renewals still leave the lease alive."""
    execution = scale_durations(ExecutionConfig(), factor)
    dispatcher = scale_durations(DispatcherConfig(), factor)
    assert execution.waiting_lease_renew_s * 3 <= dispatcher.lease_ttl_ms / 1000


def test_a_parked_submit_asks_again_well_within_a_lease_ttl() -> None:
    """A submit parked by its breaker or for a lease asks again long before a lease expires."""
    execution, dispatcher = ExecutionConfig(), DispatcherConfig()
    ttl_s = dispatcher.lease_ttl_ms / 1000
    assert execution.breaker_retry_s < ttl_s
    assert execution.lease_wait_retry_s < ttl_s
