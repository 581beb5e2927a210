"""Circuit breaker state machine and error accounting (design 9.15)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from controlplane.domain.breaker import (
    DISABLES_ACCOUNT,
    BreakerConfig,
    BreakerKey,
    BreakerRegistry,
    BreakerState,
    CallOutcome,
    CircuitBreaker,
    FailureKind,
    KeyPattern,
    Operation,
    Permit,
    Rejection,
    account_key,
    counts_for_breaker,
)

KEY = BreakerKey("google", "acct-1", "us-central1", "veo-3", Operation.SUBMIT)
FAIL = CallOutcome.failed(FailureKind.GATEWAY_5XX)
OK = CallOutcome.ok()
EXCLUDED = [
    "INVALID_INPUT",
    "SAFETY_INPUT",
    "SAFETY_OUTPUT",
    "UNSUPPORTED_CAPABILITY",
    FailureKind.USER_CANCELLED,
    FailureKind.SAFETY_REJECTED,
    FailureKind.INVALID_INPUT,
]


class FakeClock:
    def __init__(self, now: float = 1_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def make(config: BreakerConfig | None = None) -> tuple[CircuitBreaker, FakeClock]:
    clock = FakeClock()
    return CircuitBreaker(KEY, config or BreakerConfig(), clock), clock


def permit(breaker: CircuitBreaker) -> Permit:
    admission = breaker.try_acquire()
    assert isinstance(admission, Permit), admission
    return admission


def trip(breaker: CircuitBreaker) -> None:
    for _ in range(breaker.config.consecutive_failures):
        breaker.record(FAIL, permit(breaker))
    assert breaker.state is BreakerState.OPEN


def close_via_probes(breaker: CircuitBreaker, clock: FakeClock) -> None:
    assert breaker.open_until is not None
    clock.now = breaker.open_until
    for _ in range(breaker.config.half_open_successes_to_close):
        breaker.record(OK, permit(breaker))
    assert breaker.state is BreakerState.CLOSED


def test_opens_on_failure_rate_only_after_min_samples() -> None:
    """A 60% failure rate trips the breaker only once the window holds min_samples calls."""
    breaker, clock = make(BreakerConfig(min_samples=20, consecutive_failures=100))
    transition = None
    for i in range(19):
        transition = breaker.record(FAIL if i % 5 < 3 else OK)
        clock.advance(1)
        assert transition is None, f"tripped after {i + 1} samples"
    transition = breaker.record(OK)  # 20th sample: 12 failures / 20 = 60% > 50%
    assert transition is not None
    assert (transition.old, transition.new, transition.reason) == (
        BreakerState.CLOSED,
        BreakerState.OPEN,
        "failure_rate",
    )
    assert transition.metrics["samples"] == 20
    assert transition.metrics["failure_rate"] == pytest.approx(0.6)
    assert transition.metrics["cooldown_s"] == 30.0
    assert transition.key == KEY
    assert transition.at == clock.now


def test_failure_rate_counts_only_the_sliding_window() -> None:
    """Failures older than window_seconds no longer count toward the rate."""
    breaker, clock = make(BreakerConfig(window_seconds=120, consecutive_failures=100))
    for _ in range(15):
        breaker.record(FAIL)
    clock.advance(121)
    for _ in range(20):
        assert breaker.record(OK) is None
    assert breaker.state is BreakerState.CLOSED
    assert breaker.metrics()["failures"] == 0


def test_opens_on_consecutive_failures_before_min_samples() -> None:
    """Eight consecutive counted failures open the breaker even with fewer than min_samples."""
    breaker, _ = make()
    for _ in range(7):
        assert breaker.record(FAIL) is None
    transition = breaker.record(FAIL)
    assert transition is not None
    assert transition.reason == "consecutive_failures"
    assert transition.metrics["consecutive_failures"] == 8


def test_success_resets_consecutive_failures() -> None:
    """A success in between breaks the consecutive-failure streak."""
    breaker, _ = make(BreakerConfig(min_samples=1_000))
    for _ in range(3):
        for _ in range(7):
            breaker.record(FAIL)
        breaker.record(OK)
    assert breaker.state is BreakerState.CLOSED


SLOW = CallOutcome.failed(FailureKind.TIMEOUT_OVER_BASELINE, latency_ms=9_000)


def test_opens_on_slow_calls() -> None:
    """More than slow_call_rate of calls over their baseline (TIMEOUT_OVER_BASELINE, 9.15.1)
    opens the breaker as slow_calls: the window's p95 is over the slow threshold (9.15.2)."""
    breaker, _ = make(BreakerConfig(slow_call_rate=0.05))
    for _ in range(19):
        assert breaker.record(CallOutcome.ok(latency_ms=1_000)) is None
    transition = breaker.record(SLOW)  # 1/20 = 5%: not above
    assert transition is None
    transition = breaker.record(SLOW)  # 2/21 > 5%
    assert transition is not None
    assert transition.reason == "slow_calls"
    assert transition.metrics["slow_calls"] == 2


def test_a_slow_probe_reopens_the_breaker() -> None:
    """In HALF_OPEN a probe that answered but over its baseline is no success: it reopens."""
    breaker, clock = make()
    trip(breaker)
    clock.advance(30)
    probe = breaker.try_acquire()
    assert isinstance(probe, Permit)
    assert not breaker.probe_succeeded(SLOW)
    transition = breaker.record(SLOW, probe)
    assert transition is not None
    assert (transition.new, transition.reason) == (BreakerState.OPEN, "probe_failed")


def test_open_rejects_until_cooldown_then_half_opens() -> None:
    """OPEN rejects with a retry-after; after the cooldown the next acquire moves to HALF_OPEN."""
    breaker, clock = make()
    trip(breaker)
    rejection = breaker.try_acquire()
    assert isinstance(rejection, Rejection)
    assert rejection.retry_after_s == pytest.approx(30)
    clock.advance(29.9)
    assert isinstance(breaker.try_acquire(), Rejection)
    clock.advance(0.1)
    admission = breaker.try_acquire()
    assert isinstance(admission, Permit)
    assert admission.probe
    assert admission.transition is not None
    assert (admission.transition.old, admission.transition.new) == (
        BreakerState.OPEN,
        BreakerState.HALF_OPEN,
    )
    assert admission.transition.reason == "cooldown_elapsed"


def test_tick_reports_cooldown_transition() -> None:
    """The registry's tick surfaces time-driven transitions without any call being made."""
    clock = FakeClock()
    registry = BreakerRegistry(BreakerConfig(), clock)
    trip(registry.get(KEY))
    assert registry.tick() == []
    clock.advance(30)
    [transition] = registry.tick()
    assert transition.new is BreakerState.HALF_OPEN
    assert registry.states() == {KEY: BreakerState.HALF_OPEN}


def test_half_open_closes_after_k_probe_successes() -> None:
    """HALF_OPEN closes only after half_open_successes_to_close successful probes."""
    breaker, clock = make(BreakerConfig(half_open_max_probes=1, half_open_successes_to_close=3))
    trip(breaker)
    clock.advance(30)
    for _ in range(2):
        assert breaker.record(OK, permit(breaker)) is None
        assert breaker.state is BreakerState.HALF_OPEN
    transition = breaker.record(OK, permit(breaker))
    assert transition is not None
    assert transition.new is BreakerState.CLOSED
    assert transition.reason == "probes_succeeded"


def test_probe_failure_reopens_with_growing_capped_cooldown() -> None:
    """Each failed probe re-opens with the next cooldown: 30s, 60s, 120s, 300s, 600s, 600s."""
    breaker, clock = make()
    trip(breaker)
    seen = [breaker.open_until - clock.now if breaker.open_until else None]
    for _ in range(5):
        assert breaker.open_until is not None
        clock.now = breaker.open_until
        transition = breaker.record(FAIL, permit(breaker))
        assert transition is not None
        assert (transition.old, transition.new, transition.reason) == (
            BreakerState.HALF_OPEN,
            BreakerState.OPEN,
            "probe_failed",
        )
        assert transition.metrics["cooldown_s"] == breaker.open_until - clock.now
        seen.append(breaker.open_until - clock.now)
    assert seen == [30, 60, 120, 300, 600, 600]


def test_full_close_resets_cooldown_ladder() -> None:
    """After a full close, the next trip starts again at the first cooldown."""
    breaker, clock = make()
    trip(breaker)
    clock.now = breaker.open_until or 0
    breaker.record(FAIL, permit(breaker))  # now at 60 s
    close_via_probes(breaker, clock)
    trip(breaker)
    assert breaker.open_until == pytest.approx(clock.now + 30)


def test_half_open_limits_concurrent_probes() -> None:
    """HALF_OPEN admits at most max_probes concurrent probes; finishing one frees a slot."""
    breaker, clock = make(BreakerConfig(half_open_max_probes=2, half_open_successes_to_close=5))
    trip(breaker)
    clock.advance(30)
    first, second = permit(breaker), permit(breaker)
    third = breaker.try_acquire()
    assert isinstance(third, Rejection)
    assert third.reason == "probe_limit"
    breaker.record(OK, first)
    again = permit(breaker)
    assert again.probe
    breaker.release(second)
    assert permit(breaker).probe
    assert isinstance(breaker.try_acquire(), Rejection)


def test_half_open_ignores_results_without_current_probe_permit() -> None:
    """Late results of calls admitted before the trip cannot move a half-open breaker."""
    breaker, clock = make()
    stale = permit(breaker)
    trip(breaker)
    clock.advance(30)
    breaker.tick()
    for _ in range(10):
        assert breaker.record(OK, stale) is None
        assert breaker.record(FAIL) is None
    assert breaker.state is BreakerState.HALF_OPEN


def test_forced_open_is_pinned_and_forced_close_recorded() -> None:
    """A forced OPEN survives cooldowns; a forced CLOSED reopens traffic; both emit events."""
    breaker, clock = make()
    forced = breaker.force(BreakerState.OPEN, "incident-42")
    assert (forced.old, forced.new, forced.reason) == (
        BreakerState.CLOSED,
        BreakerState.OPEN,
        "forced:incident-42",
    )
    clock.advance(10_000)
    rejection = breaker.try_acquire()
    assert isinstance(rejection, Rejection)
    assert rejection.reason == "pinned_open"
    assert rejection.retry_after_s is None
    assert breaker.apply_remote(BreakerState.CLOSED, None) is None  # the pin wins
    released = breaker.force(BreakerState.CLOSED, "resolved")
    assert (released.old, released.new) == (BreakerState.OPEN, BreakerState.CLOSED)
    assert isinstance(breaker.try_acquire(), Permit)


def test_remote_open_is_adopted_until_deadline() -> None:
    """A shared OPEN state is applied locally and half-opens at the shared deadline."""
    breaker, clock = make()
    transition = breaker.apply_remote(BreakerState.OPEN, clock.now + 45, "pod-7")
    assert transition is not None
    assert transition.reason == "remote:pod-7"
    assert breaker.apply_remote(BreakerState.OPEN, clock.now + 10) is None  # earlier: no change
    clock.advance(44)
    assert isinstance(breaker.try_acquire(), Rejection)
    clock.advance(1)
    assert isinstance(breaker.try_acquire(), Permit)
    assert breaker.state is BreakerState.HALF_OPEN


@pytest.mark.parametrize("failure", EXCLUDED)
def test_excluded_errors_never_trip_in_long_runs(failure: str) -> None:
    """Thousands of user-side failures (input, safety, cancel, unsupported) never trip it."""
    breaker, clock = make(BreakerConfig(slow_call_rate=0.0))
    for _ in range(5_000):
        outcome = CallOutcome.failed(failure, latency_ms=60_000)
        assert breaker.record(outcome, permit(breaker)) is None
        clock.advance(0.05)
    assert breaker.state is BreakerState.CLOSED
    assert breaker.metrics()["samples"] == 0


@settings(max_examples=50, deadline=None)
@given(st.lists(st.sampled_from([*EXCLUDED, None]), min_size=1, max_size=400))
def test_excluded_errors_mixed_with_successes_never_trip(failures: list[str | None]) -> None:
    """Any mix of excluded failures and successes keeps the breaker closed."""
    breaker, clock = make()
    for failure in failures:
        breaker.record(CallOutcome(failure), permit(breaker))
        clock.advance(0.1)
    assert breaker.state is BreakerState.CLOSED


def test_excluded_errors_do_not_consume_half_open_progress() -> None:
    """A neutral probe result frees its slot but neither closes nor re-opens the breaker."""
    breaker, clock = make()
    trip(breaker)
    clock.advance(30)
    for _ in range(10):
        assert breaker.record(CallOutcome.failed("SAFETY_INPUT"), permit(breaker)) is None
    assert breaker.state is BreakerState.HALF_OPEN
    assert breaker.metrics()["probe_successes"] == 0


def test_counts_for_breaker_classification() -> None:
    """Network, gateway, retryable-internal and timeout failures count; user-side ones do not."""
    counted = [
        "TRANSIENT_NETWORK",
        "PROVIDER_OVERLOADED",
        "INTERNAL_RETRYABLE",
        "SUBMISSION_UNKNOWN",
        *[k.value for k in list(FailureKind)[:6]],
    ]
    not_counted = [
        "INVALID_INPUT",
        "UNSUPPORTED_CAPABILITY",
        "SAFETY_INPUT",
        "SAFETY_OUTPUT",
        "AUTH",
        "PERMISSION",
        "QUOTA",
        "RATE_LIMITED",
        "ASSET_UNAVAILABLE",
        "ASSET_INVALID",
        "INTERNAL_PERMANENT",
        "OUTPUT_EXPIRED",
        "USER_CANCELLED",
    ]
    assert all(counts_for_breaker(c) for c in counted)
    assert not any(counts_for_breaker(c) for c in not_counted)
    with pytest.raises(ValueError, match="unknown failure"):
        counts_for_breaker("TYPO")


def test_registry_picks_most_specific_override() -> None:
    """Per-key configs override per-model ones, which override the default."""
    default = BreakerConfig()
    per_model = BreakerConfig(min_samples=50)
    exact = BreakerConfig(min_samples=5)
    registry = BreakerRegistry(
        default,
        FakeClock(),
        {
            KeyPattern(model="veo-3"): per_model,
            KeyPattern.exact(KEY): exact,
        },
    )
    poll = BreakerKey("google", "acct-1", "us-central1", "veo-3", Operation.POLL)
    other = BreakerKey("runway", "acct-2", "us", "gen-4", Operation.SUBMIT)
    assert registry.get(KEY).config is exact
    assert registry.get(poll).config is per_model
    assert registry.get(other).config is default


def test_registry_keys_are_independent() -> None:
    """A tripped SUBMIT breaker leaves POLL on the same model untouched."""
    registry = BreakerRegistry(BreakerConfig(), FakeClock())
    poll = BreakerKey("google", "acct-1", "us-central1", "veo-3", Operation.POLL)
    for _ in range(8):
        admission = registry.try_acquire(KEY)
        assert isinstance(admission, Permit)
        registry.record(FAIL, admission)
    assert registry.states()[KEY] is BreakerState.OPEN
    assert isinstance(registry.try_acquire(poll), Permit)
    forced = registry.force(poll, BreakerState.OPEN, "maintenance")
    assert forced.key == poll


# ---- externally admitted probes, account breakers, shared cooldown level -------------------


def test_trip_opens_at_once_and_from_half_open_with_the_next_cooldown() -> None:
    """`trip` opens a CLOSED breaker on the first cooldown and a HALF_OPEN one on the next."""
    breaker, clock = make(BreakerConfig(cooldowns_s=(10.0, 20.0, 40.0)))
    transition = breaker.trip("account_disabled:AUTH")
    assert transition is not None
    assert transition.new is BreakerState.OPEN
    assert breaker.open_until == clock.now + 10.0
    assert breaker.trip("again") is None  # already open
    clock.advance(10.0)
    breaker.tick()
    assert breaker.state is BreakerState.HALF_OPEN
    breaker.trip("account_disabled:AUTH")
    assert breaker.open_until == clock.now + 20.0


def test_record_probe_closes_on_the_shared_success_count() -> None:
    """A probe result counts only in HALF_OPEN; the ledger's success count decides closing."""
    breaker, clock = make(BreakerConfig(cooldowns_s=(10.0,), half_open_successes_to_close=3))
    assert breaker.record_probe(OK, successes=3) is None  # CLOSED: not a probe phase
    trip(breaker)
    clock.advance(10.0)
    breaker.tick()
    assert breaker.record_probe(OK, successes=2) is None
    assert breaker.state is BreakerState.HALF_OPEN
    assert breaker.record_probe(CallOutcome.failed("AUTH")) is None  # neutral
    transition = breaker.record_probe(OK, successes=3)
    assert transition is not None
    assert transition.new is BreakerState.CLOSED


def test_a_failed_external_probe_reopens_on_the_next_cooldown() -> None:
    """A counted failure reported as a probe reopens with the ladder's next step."""
    breaker, clock = make(BreakerConfig(cooldowns_s=(10.0, 30.0)))
    trip(breaker)
    clock.advance(10.0)
    breaker.tick()
    transition = breaker.record_probe(FAIL)
    assert transition is not None
    assert transition.reason == "probe_failed"
    assert breaker.open_until == clock.now + 30.0


def test_remote_level_carries_the_cooldown_ladder_across_replicas() -> None:
    """A replica adopting OPEN at level 1 reopens a failed probe at level 2, like the origin."""
    breaker, clock = make(BreakerConfig(cooldowns_s=(10.0, 20.0, 40.0)))
    breaker.apply_remote(BreakerState.OPEN, clock.now + 20.0, level=1)
    assert breaker.level == 1
    clock.advance(20.0)
    breaker.tick()
    breaker.record_probe(FAIL)
    assert breaker.open_until == clock.now + 40.0


def test_account_breakers_run_on_the_account_ladder() -> None:
    """The account key (model "") gets account_cooldowns_s, one probe, one success to close."""
    config = BreakerConfig(account_cooldowns_s=(600.0, 1800.0), half_open_successes_to_close=3)
    registry = BreakerRegistry(config, FakeClock())
    account = account_key(KEY)
    assert account == BreakerKey("google", "acct-1", "us-central1", "", Operation.SUBMIT)
    assert registry.get(account).config.cooldowns_s == (600.0, 1800.0)
    assert registry.get(account).config.half_open_successes_to_close == 1
    assert registry.get(KEY).config is config
    assert {"AUTH", "PERMISSION"} <= DISABLES_ACCOUNT
