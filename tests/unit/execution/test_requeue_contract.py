"""The `RequeueRequest` contract between execution and the scheduler round-trips through JSON."""

from __future__ import annotations

import json
from datetime import UTC, datetime

from controlplane.execution.contracts import ExcludedCandidate, RequeueRequest


def test_requeue_request_round_trips_through_json() -> None:
    """A requeue payload survives JSON encoding (the outbox stores it as JSON) unchanged."""
    request = RequeueRequest(
        task_id=7,
        failed_attempt_id=9,
        reason="FAIL_OVER",
        error_class="PROVIDER_OVERLOADED",
        excluded_candidates=(ExcludedCandidate(3, "gen4.5"),),
        same_model_only=True,
        required_model="gen4.5",
        attempts_so_far=2,
        provider_switches_so_far=1,
        not_before=datetime(2026, 6, 24, tzinfo=UTC),
    )
    assert RequeueRequest.from_payload(json.loads(json.dumps(request.to_payload()))) == request
