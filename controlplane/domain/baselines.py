"""Call-latency baselines and the slow-call rule (design 9.15.1-9.15.2). Pure: no I/O.

A provider that becomes slow must trip its breaker, not only one that fails: 9.15.1 counts
"超过基线的超时" (calls over the baseline) as breaker evidence and 9.15.2 opens on "P95 提交延迟
超过基线 4 倍". The baseline is learned, per (provider, model, operation), from that operation's
own call latencies over the 24-hour window (9.13.3 "稳定基线"): the `BreakerConfig
.baseline_quantile` (the median by default) of the successful calls, a streaming
`DecayedQuantiles` like the routing windows' predicted p95, so a burst of slow calls barely
moves it while a provider that stays slower for a day gets a new normal.

Rules, every one read from the key's `BreakerConfig`:

* no baseline before ``baseline_min_samples`` successful calls: a new model is never "slow";
* the baseline is never below ``baseline_floor_s`` (a provider answering in 3 ms is not slow
  at 13 ms), and the slow threshold ``slow_call_factor`` x baseline never below
  `HOST_NOISE_FLOOR_S`;
* a *successful* call slower than the threshold is recorded as
  ``FailureKind.TIMEOUT_OVER_BASELINE`` (`judge_call`); the breaker opens when more than
  ``slow_call_rate`` (5 %) of its window's calls are such: the window's p95 is over 4x the
  baseline. A call that failed keeps its own class (it counts already), a neutral one stays
  neutral;
* only calls to the provider are judged (`JUDGED_OPERATIONS`): COMPILE is our own sidecar.

Each replica learns its baselines from the calls it makes (`HealthMonitor` holds them), like
its local breakers (9.15.4 "Pod 本地 breaker"): a breaker that opens on slow calls reaches the
other replicas through the shared health state as any other opening does. Call latencies are
not put on the shared observation stream: every poll would be one entry, crowding out the
generation outcomes the routing windows are rebuilt from. A replica that starts has no
baseline for its first ``baseline_min_samples`` calls of a key and judges none of them slow.
"""

from __future__ import annotations

from dataclasses import dataclass

from controlplane.domain.breaker import BreakerConfig, CallOutcome, FailureKind, Operation
from controlplane.domain.scoring import DecayedQuantiles, Window

__all__ = [
    "HOST_NOISE_FLOOR_S",
    "JUDGED_OPERATIONS",
    "ONE_SHOT_MIN_DEADLINE_S",
    "BaselineKey",
    "CallBaselines",
    "baseline_of",
    "judge_call",
    "slow_threshold_s",
]

# Real seconds, deliberately outside the time factor: the longest a loaded host can hold a
# healthy call on its own (a scheduling stall, a GC pause, CI at load 20), and such a stall
# holds every call in flight at once, which the 5 % rule would read as a slow provider. Under
# ``VIDROUTE_TIME_SCALE`` 0.02 a scaled threshold would be 80 ms, which every hiccup of the
# machine exceeds; what is slow for a provider is never faster than what the host can add.
HOST_NOISE_FLOOR_S = 2.0
#: Five host stalls: no deadline of a one-shot operator action's RPC (a reconciliation run, a
#: release check's sample compiles) is shorter, whatever the time factor: scaled for a fast
#: test it would fall under what a loaded machine takes to compute the answer.
ONE_SHOT_MIN_DEADLINE_S = 5 * HOST_NOISE_FLOOR_S

JUDGED_OPERATIONS: frozenset[Operation] = frozenset(
    {
        Operation.SUBMIT,
        Operation.POLL,
        Operation.CANCEL,
        Operation.UPLOAD,
        Operation.DOWNLOAD_OUTPUT,
        Operation.USAGE_QUERY,
    }
)


@dataclass(frozen=True, slots=True)
class BaselineKey:
    """Whose baseline: every account of a model shares it (one provider-side behaviour)."""

    provider: str
    model: str
    operation: Operation


def baseline_of(quantile_s: float | None, samples: float, config: BreakerConfig) -> float | None:
    """The baseline from a window's quantile and its effective sample count, or None while
    there are fewer than ``baseline_min_samples`` (no call is judged slow then)."""
    if quantile_s is None or samples < config.baseline_min_samples:
        return None
    return max(quantile_s, config.baseline_floor_s)


def slow_threshold_s(baseline_s: float, config: BreakerConfig) -> float:
    """The latency above which a call is slow: ``slow_call_factor`` x the baseline, never
    below the host's own noise."""
    return max(config.slow_call_factor * baseline_s, HOST_NOISE_FLOOR_S)


def judge_call(
    outcome: CallOutcome, operation: Operation, baseline_s: float | None, config: BreakerConfig
) -> CallOutcome:
    """`outcome` as the breaker records it: a successful provider call slower than the
    threshold becomes ``TIMEOUT_OVER_BASELINE`` (same latency); anything else is unchanged."""
    if (
        baseline_s is None
        or not outcome.succeeded
        or outcome.latency_ms is None
        or operation not in JUDGED_OPERATIONS
    ):
        return outcome
    if outcome.latency_ms / 1000.0 > slow_threshold_s(baseline_s, config):
        return CallOutcome.failed(FailureKind.TIMEOUT_OVER_BASELINE, outcome.latency_ms)
    return outcome


class CallBaselines:
    """Latencies of successful provider calls per `BaselineKey`, over the 24-hour window.

    Fixed memory per key (`DecayedQuantiles` plus its decayed count); not thread-safe."""

    def __init__(self, window: Window = Window.ONE_DAY) -> None:
        self._window_s = window.seconds
        self._held: dict[BaselineKey, DecayedQuantiles] = {}

    def observe(self, key: BaselineKey, latency_s: float, at: float) -> None:
        """One successful call of `key` that took `latency_s` (judged or not: a provider that
        stays slower for most of a day gets a slower baseline, as it should)."""
        held = self._held.get(key)
        if held is None:
            held = self._held[key] = DecayedQuantiles(self._window_s)
        held.observe(latency_s, at)

    def baseline_s(self, key: BaselineKey, at: float, config: BreakerConfig) -> float | None:
        """`key`'s baseline now, or None before it has enough calls (`baseline_of`)."""
        held = self._held.get(key)
        if held is None:
            return None
        return baseline_of(held.quantile(config.baseline_quantile), held.weight(at), config)

    def keys(self) -> list[BaselineKey]:
        return list(self._held)
