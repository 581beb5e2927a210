"""Learned call-latency baselines and the slow-call rule (design 9.15.1-9.15.2)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from controlplane.domain.baselines import (
    HOST_NOISE_FLOOR_S,
    JUDGED_OPERATIONS,
    BaselineKey,
    CallBaselines,
    baseline_of,
    judge_call,
    slow_threshold_s,
)
from controlplane.domain.breaker import (
    BreakerConfig,
    BreakerKey,
    BreakerTransition,
    CallOutcome,
    CircuitBreaker,
    FailureKind,
    Operation,
)
from controlplane.domain.scoring import Window
from vidroute_core.timescale import scale_durations

CONFIG = BreakerConfig()
KEY = BaselineKey("runway", "gen4.5", Operation.SUBMIT)


def learned(latencies_s: list[float], config: BreakerConfig = CONFIG) -> float | None:
    """The baseline of calls that all ended at one instant (counted whole, undecayed)."""
    baselines = CallBaselines()
    for latency in latencies_s:
        baselines.observe(KEY, latency, 1_000.0)
    return baselines.baseline_s(KEY, 1_000.0, config)


def test_no_baseline_before_min_samples() -> None:
    """Nineteen calls are no baseline (a new model is never slow); the twentieth makes one."""
    assert learned([2.0] * 19) is None
    baseline = learned([2.0] * 20)
    assert baseline == pytest.approx(2.0, rel=0.08)  # half a quantile bucket


def test_baseline_is_the_median_not_the_tail() -> None:
    """A tenth of calls ten times slower does not move the median baseline."""
    baseline = learned([2.0] * 90 + [20.0] * 10)
    assert baseline == pytest.approx(2.0, rel=0.08)


def test_baseline_has_a_floor() -> None:
    """A provider answering in 3 ms gets the floor as its baseline, not 3 ms."""
    assert learned([0.003] * 50) == CONFIG.baseline_floor_s


def test_baseline_forgets_over_a_day() -> None:
    """Samples decay with the 24-hour window: a day and more later they no longer count."""
    baselines = CallBaselines()
    for n in range(30):
        baselines.observe(KEY, 1.0, float(n))
    assert baselines.baseline_s(KEY, 30.0, CONFIG) is not None
    assert baselines.baseline_s(KEY, 30.0 + 2 * Window.ONE_DAY.seconds, CONFIG) is None


def test_slow_success_becomes_timeout_over_baseline() -> None:
    """A successful submit over 4x its baseline is recorded as TIMEOUT_OVER_BASELINE with its
    latency; one under it, a failure and a neutral failure are unchanged."""
    slow = CallOutcome.ok(latency_ms=8_100)
    judged = judge_call(slow, Operation.SUBMIT, 2.0, CONFIG)
    assert judged.failure == FailureKind.TIMEOUT_OVER_BASELINE
    assert judged.latency_ms == 8_100
    fast = CallOutcome.ok(latency_ms=7_900)
    assert judge_call(fast, Operation.SUBMIT, 2.0, CONFIG) is fast
    failed = CallOutcome.failed("PROVIDER_OVERLOADED", 60_000)
    assert judge_call(failed, Operation.SUBMIT, 2.0, CONFIG) is failed
    neutral = CallOutcome.failed("INVALID_INPUT", 60_000)
    assert judge_call(neutral, Operation.SUBMIT, 2.0, CONFIG) is neutral


def test_no_baseline_and_compile_are_never_slow() -> None:
    """Without a baseline nothing is slow; COMPILE (our own sidecar) is never judged."""
    slow = CallOutcome.ok(latency_ms=600_000)
    assert judge_call(slow, Operation.POLL, None, CONFIG) is slow
    assert judge_call(slow, Operation.COMPILE, 0.5, CONFIG) is slow
    assert Operation.COMPILE not in JUDGED_OPERATIONS


def test_threshold_never_below_the_host_noise_even_when_scaled() -> None:
    """Under a time factor of 0.02 the floor shrinks with every duration, but the threshold
    stays above what a loaded host adds by itself."""
    scaled = scale_durations(BreakerConfig(), 0.02)
    assert scaled.baseline_floor_s == pytest.approx(0.005)
    assert slow_threshold_s(0.005, scaled) == HOST_NOISE_FLOOR_S
    assert slow_threshold_s(10.0, scaled) == 40.0


@settings(max_examples=300, deadline=None)
@given(
    latency_ms=st.floats(min_value=0, max_value=1e7, allow_nan=False),
    baseline_s=st.one_of(st.none(), st.floats(min_value=0.001, max_value=1e4)),
    failure=st.sampled_from([None, "PROVIDER_OVERLOADED", "INVALID_INPUT", "GATEWAY_5XX"]),
    operation=st.sampled_from(list(Operation)),
)
def test_judge_marks_exactly_the_slow_successes(
    latency_ms: float, baseline_s: float | None, failure: str | None, operation: Operation
) -> None:
    """For any call, the judged outcome is TIMEOUT_OVER_BASELINE exactly when the call
    succeeded, is a provider operation with a baseline, and took longer than
    max(4x baseline, host noise); otherwise it is the call itself."""
    outcome = CallOutcome(failure, latency_ms)
    judged = judge_call(outcome, operation, baseline_s, CONFIG)
    slow = (
        failure is None
        and baseline_s is not None
        and operation in JUDGED_OPERATIONS
        and latency_ms / 1000 > max(4 * baseline_s, HOST_NOISE_FLOOR_S)
    )
    if slow:
        assert judged.failure == FailureKind.TIMEOUT_OVER_BASELINE
        assert judged.latency_ms == latency_ms
    else:
        assert judged is outcome


@settings(max_examples=100, deadline=None)
@given(
    quantile=st.one_of(st.none(), st.floats(min_value=0, max_value=1e5)),
    samples=st.floats(min_value=0, max_value=1e6),
)
def test_baseline_exists_only_with_enough_samples_and_respects_the_floor(
    quantile: float | None, samples: float
) -> None:
    """`baseline_of` is None below min samples or without a quantile, else >= the floor."""
    baseline = baseline_of(quantile, samples, CONFIG)
    if quantile is None or samples < CONFIG.baseline_min_samples:
        assert baseline is None
    else:
        assert baseline is not None
        assert baseline >= CONFIG.baseline_floor_s
        assert baseline >= quantile


def test_a_slow_provider_opens_its_breaker_on_the_p95_rule() -> None:
    """Thirty calls at 1 s set the baseline; then calls at 5 s (over 4x) arrive, judged
    against it: the second one opens the breaker as slow_calls, its metrics saying so."""
    now = [0.0]
    breaker = CircuitBreaker(
        BreakerKey("runway", "prod", "us", "gen4.5", Operation.SUBMIT), CONFIG, lambda: now[0]
    )
    baselines = CallBaselines()

    def call(latency_s: float) -> BreakerTransition | None:
        baseline = baselines.baseline_s(KEY, now[0], CONFIG)
        judged = judge_call(CallOutcome.ok(latency_s * 1000), Operation.SUBMIT, baseline, CONFIG)
        baselines.observe(KEY, latency_s, now[0])
        now[0] += 1.0
        return breaker.record(judged)

    for _ in range(30):
        assert call(1.0) is None
    assert call(5.0) is None  # 1 of 31
    transition = call(5.0)  # 2 of 32 > 5 %
    assert transition is not None
    assert transition.reason == "slow_calls"
    assert transition.metrics["slow_calls"] == 2
