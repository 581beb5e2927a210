"""`one_shot_timing`: an operator's one-shot action (a reconciliation run, a release check's
sample compiles) never waits on a sidecar deadline the time factor shrank under the floor."""

from __future__ import annotations

from controlplane.adapters.connect import one_shot_timing
from controlplane.adapters.grpc_client import GrpcAdapterClient
from controlplane.domain.baselines import ONE_SHOT_MIN_DEADLINE_S
from vidroute_core.timescale import scaled_defaults


def test_scaled_deadlines_are_raised_to_the_floor_and_nothing_else_moves() -> None:
    """At factor 0.02 the 30 s call deadline (0.6 s: what a loaded sidecar missed for a release
    check's samples) becomes the floor; a deadline above the floor and every other timing stay
    as scaled."""
    scaled = scaled_defaults(GrpcAdapterClient, 0.02)
    floored = one_shot_timing(scaled)
    assert scaled["timeout_s"] < ONE_SHOT_MIN_DEADLINE_S
    assert floored["timeout_s"] == ONE_SHOT_MIN_DEADLINE_S
    assert floored["fetch_timeout_s"] == scaled["fetch_timeout_s"] > ONE_SHOT_MIN_DEADLINE_S
    assert {k: v for k, v in floored.items() if k != "timeout_s"} == {
        k: v for k, v in scaled.items() if k != "timeout_s"
    }
    assert one_shot_timing(scaled_defaults(GrpcAdapterClient, 1.0)) == scaled_defaults(
        GrpcAdapterClient, 1.0
    )
