"""The polling schedule of design 9.18.2 as a pure function."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from controlplane.domain.polling import PollingPolicy, PollPhase, next_poll_delay

NO_JITTER = PollingPolicy(jitter_min=0.0, jitter_max=0.0)


@pytest.mark.parametrize(
    ("phase", "expected"),
    [
        (PollPhase.SUBMITTED, [2, 4, 8, 8]),
        (PollPhase.QUEUED, [15, 30, 60, 60]),
        (PollPhase.RUNNING, [10, 15, 30, 30]),
    ],
)
def test_steps_grow_per_phase_then_hold(phase: PollPhase, expected: list[float]) -> None:
    """Each phase walks its steps (2/4/8, 15/30/60, 10/15/30) and then repeats the last one."""
    delays = [
        next_poll_delay(
            NO_JITTER, phase, polls_in_phase=i, elapsed_since_submit_s=0, unit_random=0
        ).delay_s
        for i in range(4)
    ]
    assert delays == expected


def test_near_p95_caps_running_delay() -> None:
    """Close to the provider's p95 a running job is polled at most every 10 s."""
    plan = next_poll_delay(
        NO_JITTER,
        PollPhase.RUNNING,
        polls_in_phase=5,
        elapsed_since_submit_s=85,
        unit_random=0,
        expected_p95_s=100,
    )
    assert plan.delay_s == 10
    assert not plan.stuck


def test_past_max_plausible_is_stuck_and_slow() -> None:
    """Past the max plausible duration the job is flagged stuck and polled at the slow interval."""
    plan = next_poll_delay(
        NO_JITTER,
        PollPhase.RUNNING,
        polls_in_phase=1,
        elapsed_since_submit_s=2000,
        unit_random=0.5,
        max_plausible_s=1800,
    )
    assert plan.stuck
    assert plan.delay_s == 120


def test_scale_shrinks_everything() -> None:
    """The scale factor multiplies every delay (tests and make up run in milliseconds)."""
    policy = PollingPolicy(jitter_min=0.0, jitter_max=0.0, scale=0.001)
    plan = next_poll_delay(
        policy, PollPhase.QUEUED, polls_in_phase=2, elapsed_since_submit_s=0, unit_random=0
    )
    assert plan.delay_s == pytest.approx(0.06)


def test_invalid_policies_are_refused() -> None:
    """Empty steps, inverted jitter bounds and a non-positive scale are configuration errors."""
    with pytest.raises(ValueError, match="positive delay"):
        PollingPolicy(queued=())
    with pytest.raises(ValueError, match="jitter"):
        PollingPolicy(jitter_min=0.5, jitter_max=0.1)
    with pytest.raises(ValueError, match="scale"):
        PollingPolicy(scale=0)


@given(
    phase=st.sampled_from(list(PollPhase)),
    polls=st.integers(0, 50),
    elapsed=st.floats(0, 10_000),
    u=st.floats(0, 1),
)
def test_jitter_stays_between_10_and_30_percent(
    phase: PollPhase, polls: int, elapsed: float, u: float
) -> None:
    """For all inputs the delay is the base step plus 10-30 % jitter, never less, never more."""
    policy = PollingPolicy()
    base = next_poll_delay(
        PollingPolicy(jitter_min=0, jitter_max=0),
        phase,
        polls_in_phase=polls,
        elapsed_since_submit_s=elapsed,
        unit_random=u,
        max_plausible_s=1800,
    ).delay_s
    got = next_poll_delay(
        policy,
        phase,
        polls_in_phase=polls,
        elapsed_since_submit_s=elapsed,
        unit_random=u,
        max_plausible_s=1800,
    ).delay_s
    assert base * 1.1 - 1e-9 <= got <= base * 1.3 + 1e-9
