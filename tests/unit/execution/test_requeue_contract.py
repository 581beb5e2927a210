"""The `RequeueRequest` contract between execution and the scheduler: JSON round trips, merging."""

from __future__ import annotations

import json
from datetime import UTC, datetime

from controlplane.execution.contracts import ExcludedCandidate, RequeueRequest
from controlplane.scheduling.gather import requeue_facts


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


def test_soft_exclusions_round_trip_and_hard_ones_keep_their_shape() -> None:
    """A soft exclusion carries its flag and retry instant; a hard one keeps the old payload."""
    at = datetime(2026, 6, 24, 10, 0, 8, tzinfo=UTC)
    soft = ExcludedCandidate(3, "gen4.5", soft=True, retry_at=at)
    hard = ExcludedCandidate(4, "gen4.5")
    assert ExcludedCandidate.from_json(json.loads(json.dumps(soft.to_json()))) == soft
    assert hard.to_json() == {"provider_account_id": 4, "provider_model": "gen4.5"}


def test_requeue_facts_merge_hard_over_soft_and_keep_the_latest_retry() -> None:
    """Across a task's requeues a hard exclusion wins over a soft one for the same candidate,
    and a soft one waits for the latest retry instant any requeue gave it."""
    t1 = datetime(2026, 6, 24, 10, 0, tzinfo=UTC)
    t2 = datetime(2026, 6, 24, 10, 5, tzinfo=UTC)

    def payload(*excluded: ExcludedCandidate) -> dict[str, object]:
        request = RequeueRequest(1, 1, "FAIL_OVER", "TRANSIENT_NETWORK", excluded, False, "", 1, 0)
        return request.to_payload()

    facts = requeue_facts(
        [
            payload(ExcludedCandidate(1, "m", soft=True, retry_at=t2)),
            payload(
                ExcludedCandidate(1, "m", soft=True, retry_at=t1),
                ExcludedCandidate(2, "m", soft=True),
                ExcludedCandidate(3, "m", soft=True, retry_at=t1),
            ),
            payload(ExcludedCandidate(2, "m", soft=True), ExcludedCandidate(3, "m")),
        ]
    )
    assert facts.excluded == frozenset({(3, "m")})
    assert dict(facts.soft_excluded) == {(1, "m"): t2, (2, "m"): None}
    assert facts.error_class == "TRANSIENT_NETWORK"
