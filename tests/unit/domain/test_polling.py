"""The polling schedule of design 9.18.2 as a pure function."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from controlplane.domain.polling import (
    DurationEvidence,
    JobDurations,
    PollingPolicy,
    PollPhase,
    learned_durations,
    next_poll_delay,
)

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


# ---- durations learned from the health windows (9.18.2) ---------------------------------------


def test_learned_p95_replaces_the_configured_one_with_enough_jobs() -> None:
    """With 20 finished jobs in the window their p95 is the expected p95 and 3x their p99 the
    max plausible; with 19 the configured figures hold."""
    policy = PollingPolicy()
    evidence = DurationEvidence(p95_s=700.0, p99_s=900.0, samples=20)
    learned = learned_durations(policy, evidence, configured_p95_s=None, configured_max_s=1800)
    assert learned == JobDurations(expected_p95_s=700.0, max_plausible_s=2700.0)
    few = DurationEvidence(p95_s=700.0, p99_s=900.0, samples=19)
    configured = learned_durations(policy, few, configured_p95_s=50.0, configured_max_s=1800)
    assert configured == JobDurations(expected_p95_s=50.0, max_plausible_s=1800)
    nothing = learned_durations(policy, None, configured_p95_s=None, configured_max_s=1800)
    assert nothing == JobDurations(None, 1800)


def test_a_fast_model_keeps_the_configured_max_plausible_as_floor() -> None:
    """A model whose jobs take 40 s is not declared stuck at 3 x 40 s: the configured maximum
    is the floor."""
    evidence = DurationEvidence(p95_s=40.0, p99_s=45.0, samples=100)
    learned = learned_durations(
        PollingPolicy(), evidence, configured_p95_s=None, configured_max_s=1800
    )
    assert learned == JobDurations(expected_p95_s=40.0, max_plausible_s=1800)


@given(
    p95=st.floats(min_value=0.01, max_value=1e6),
    p99=st.one_of(st.none(), st.floats(min_value=0.01, max_value=1e6)),
    samples=st.floats(min_value=0, max_value=1e4),
    floor=st.one_of(st.none(), st.floats(min_value=1, max_value=1e5)),
)
def test_learned_max_plausible_never_undercuts_floor_or_p95(
    p95: float, p99: float | None, samples: float, floor: float | None
) -> None:
    """Whatever the window says, the max plausible duration is at least the configured floor
    and, once learned, beyond the expected p95 (a job at its p95 is never stuck)."""
    learned = learned_durations(
        PollingPolicy(),
        DurationEvidence(p95, p99, samples),
        configured_p95_s=None,
        configured_max_s=floor,
    )
    if floor is not None:
        assert learned.max_plausible_s is not None
        assert learned.max_plausible_s >= floor
    if learned.expected_p95_s is not None:
        assert learned.max_plausible_s is not None
        assert learned.max_plausible_s >= learned.expected_p95_s


def test_the_learned_p95_drives_the_near_p95_phase() -> None:
    """A running job at 85 s of a model whose learned p95 is 100 s polls within 10 s, where
    the running steps alone would wait 30 s."""
    durations = learned_durations(
        NO_JITTER,
        DurationEvidence(p95_s=100.0, p99_s=120.0, samples=50),
        configured_p95_s=None,
        configured_max_s=1800,
    )
    plain = next_poll_delay(
        NO_JITTER, PollPhase.RUNNING, polls_in_phase=5, elapsed_since_submit_s=85, unit_random=0
    )
    near = next_poll_delay(
        NO_JITTER,
        PollPhase.RUNNING,
        polls_in_phase=5,
        elapsed_since_submit_s=85,
        unit_random=0,
        expected_p95_s=durations.expected_p95_s,
        max_plausible_s=durations.max_plausible_s,
    )
    assert plain.delay_s == 30
    assert near.delay_s == 10
