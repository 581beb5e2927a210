"""When to ask a provider about a job again (design 9.18.2): a pure schedule, no I/O.

Polling every job every second wastes provider quota and hides real problems, so the delay grows
with the phase the job is in::

    just submitted (ACCEPTED)       2 s, 4 s, 8 s, then 8 s
    provider queue (QUEUED/THROTTLED) 15 s, 30 s, 60 s, then 60 s
    running                         10 s, 15 s, 30 s, then 30 s
    near the provider's p95         at most 10 s (the result is probably about to appear)
    past the max plausible time     "stuck": flagged, and polled slowly (120 s) but never dropped
    cancel requested                2 s, 4 s, 8 s, 15 s (waiting for the confirmation)

Every delay gets 10-30 % of positive jitter so thousands of jobs submitted together do not poll
together, and every number is multiplied by `PollingPolicy.scale` so tests and ``make up`` can
run the same schedule in milliseconds.

The provider's p95 and the max plausible duration are learned per model (per candidate: the
model on one account) from the 24-hour health window of finished jobs (`learned_durations`):
the window's p95 once it holds `PollingPolicy.learn_min_samples` jobs, and `plausible_factor`
times its p99, never below the configured maximum. Until then the configured figures hold.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from vidroute_core.timescale import SECONDS

__all__ = [
    "DurationEvidence",
    "JobDurations",
    "PollPhase",
    "PollPlan",
    "PollingPolicy",
    "learned_durations",
    "next_poll_delay",
]


class PollPhase(enum.Enum):
    """The part of a job's life that decides the polling cadence."""

    SUBMITTED = "SUBMITTED"
    QUEUED = "QUEUED"
    RUNNING = "RUNNING"
    CANCELLING = "CANCELLING"


@dataclass(frozen=True, slots=True)
class PollingPolicy:
    """The schedule's numbers, in seconds before `scale` is applied."""

    submitted: tuple[float, ...] = field(default=(2.0, 4.0, 8.0), metadata=SECONDS)
    queued: tuple[float, ...] = field(default=(15.0, 30.0, 60.0), metadata=SECONDS)
    running: tuple[float, ...] = field(default=(10.0, 15.0, 30.0), metadata=SECONDS)
    cancelling: tuple[float, ...] = field(default=(2.0, 4.0, 8.0, 15.0), metadata=SECONDS)
    near_p95_cap_s: float = 10.0
    # The "near p95" window opens at this fraction of the provider's p95 duration.
    near_p95_fraction: float = 0.8
    stuck_interval_s: float = 120.0
    # Finished jobs in the 24-hour window before its p95 replaces the configured one, and the
    # multiple of its p99 past which a job is implausibly long (never below the configured).
    learn_min_samples: int = 20
    plausible_factor: float = 3.0
    jitter_min: float = 0.10
    jitter_max: float = 0.30
    scale: float = 1.0

    def __post_init__(self) -> None:
        for name in ("submitted", "queued", "running", "cancelling"):
            steps = getattr(self, name)
            if not steps or any(s <= 0 for s in steps):
                raise ValueError(f"{name} needs at least one positive delay")
        if not 0 <= self.jitter_min <= self.jitter_max:
            raise ValueError("need 0 <= jitter_min <= jitter_max")
        if self.scale <= 0:
            raise ValueError("scale must be positive")
        if self.learn_min_samples < 1 or self.plausible_factor < 1:
            raise ValueError("learn_min_samples must be positive and plausible_factor >= 1")

    def steps(self, phase: PollPhase) -> tuple[float, ...]:
        return {
            PollPhase.SUBMITTED: self.submitted,
            PollPhase.QUEUED: self.queued,
            PollPhase.RUNNING: self.running,
            PollPhase.CANCELLING: self.cancelling,
        }[phase]


@dataclass(frozen=True, slots=True)
class PollPlan:
    """The next poll: after `delay_s` seconds; `stuck` when the job outlived plausibility."""

    delay_s: float
    stuck: bool = False


@dataclass(frozen=True, slots=True)
class DurationEvidence:
    """A model's finished jobs over a window: their p95 and p99 duration and how many (decayed)."""

    p95_s: float | None
    p99_s: float | None
    samples: float


@dataclass(frozen=True, slots=True)
class JobDurations:
    """The two durations the schedule reads for one job's model."""

    expected_p95_s: float | None
    max_plausible_s: float | None


def learned_durations(
    policy: PollingPolicy,
    evidence: DurationEvidence | None,
    *,
    configured_p95_s: float | None,
    configured_max_s: float | None,
) -> JobDurations:
    """The provider's p95 and the max plausible duration for one model (9.18.2).

    With at least ``learn_min_samples`` finished jobs the window's p95 is the expected p95 and
    ``plausible_factor`` x its p99 (its p95 when higher) the max plausible duration, never below
    `configured_max_s` (the floor: learning may give a slow model more time, never a fast
    one less than the operators allowed). With less, the configured figures."""
    if evidence is None or evidence.p95_s is None or evidence.samples < policy.learn_min_samples:
        return JobDurations(configured_p95_s, configured_max_s)
    tail = max(evidence.p95_s, evidence.p99_s or 0.0)
    plausible = policy.plausible_factor * tail
    if configured_max_s is not None:
        plausible = max(plausible, configured_max_s)
    return JobDurations(evidence.p95_s, plausible)


def next_poll_delay(
    policy: PollingPolicy,
    phase: PollPhase,
    *,
    polls_in_phase: int,
    elapsed_since_submit_s: float,
    unit_random: float,
    expected_p95_s: float | None = None,
    max_plausible_s: float | None = None,
) -> PollPlan:
    """The delay before the next poll of a job.

    `polls_in_phase` counts polls already made since the job entered `phase` (0 for the first).
    `elapsed_since_submit_s` is the job's age; it decides "near p95" and "stuck". `unit_random`
    is a number in [0, 1) supplied by the caller, which keeps this function pure.
    """
    if polls_in_phase < 0:
        raise ValueError("polls_in_phase must be >= 0")
    if not 0.0 <= unit_random <= 1.0:
        raise ValueError("unit_random must be in [0, 1]")
    stuck = max_plausible_s is not None and elapsed_since_submit_s > max_plausible_s
    if stuck and phase is not PollPhase.CANCELLING:
        base = policy.stuck_interval_s
    else:
        steps = policy.steps(phase)
        base = steps[min(polls_in_phase, len(steps) - 1)]
        near = (
            expected_p95_s is not None
            and phase is PollPhase.RUNNING
            and elapsed_since_submit_s >= expected_p95_s * policy.near_p95_fraction
        )
        if near:
            base = min(base, policy.near_p95_cap_s)
    jitter = policy.jitter_min + (policy.jitter_max - policy.jitter_min) * unit_random
    return PollPlan(delay_s=base * (1.0 + jitter) * policy.scale, stuck=stuck)
