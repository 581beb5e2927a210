"""Routing utility for candidates that already passed the hard filters — design 9.13.

This room turns health, latency, cost and capacity figures into an explainable score and keeps
routing stable. It never decides *eligibility*: unsupported modes, disallowed regions, strict
model pins, budgets, open breakers and policy mismatches are filtered before scoring (9.13.1),
so no weight here can resurrect an excluded candidate.

The routing hot loop (`routing.selection._score`) computes the same normalisers and weighted
sum inline, with plain floats, for every eligible candidate of a decision; these dataclasses are
the vocabulary of the explain view and the reference of that arithmetic
(``tests/unit/domain/test_fast_routing.py`` holds the two equal).

Pieces: normalisers to [0, 1] (9.13.2); a versioned ``RoutingPolicy`` holding weights per
scenario; ``score`` producing a ``ScoreBreakdown`` fit for ``routing_decisions``; time-decayed
EWMAs over four windows (9.13.3); hysteresis, dwell and stable bucketing against oscillation
(9.13.4); and a gated ``CanaryPlan`` for controlled exploration (9.13.5).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field, fields
from enum import StrEnum


def _clamp01(value: float) -> float:
    return min(1.0, max(0.0, value))


def wilson_lower_bound(successes: float, total: float, z: float = 1.96) -> float:
    """Lower bound of the Wilson score interval; 0 with no data, so two lucky calls stay modest.

    Accepts fractional counts so it can be fed decayed EWMA counts.
    """
    if total <= 0:
        return 0.0
    if not 0 <= successes <= total:
        raise ValueError("successes must lie in [0, total]")
    p = successes / total
    z2 = z * z
    # The textbook form multiplied through by n, so tiny decayed counts cannot overflow.
    margin = z * math.sqrt(p * (1 - p) * total + z2 / 4)
    return _clamp01((successes + z2 / 2 - margin) / (total + z2))


def latency_score(predicted_p95: float, good: float, bad: float) -> float:
    """1 at or below ``good``, 0 at or beyond ``bad``, linear between."""
    if bad <= good:
        raise ValueError("latency bad must exceed good")
    return _clamp01((bad - predicted_p95) / (bad - good))


def cost_score(predicted: float, min_candidate: float, max_acceptable: float) -> float:
    """1 for the cheapest candidate, 0 at or beyond the acceptable maximum, linear between."""
    if max_acceptable <= min_candidate:
        return 1.0 if predicted <= max_acceptable else 0.0
    return _clamp01((max_acceptable - predicted) / (max_acceptable - min_candidate))


def relative_cost_score(predicted: float, min_candidate: float) -> float:
    """Cost with no maximum acceptable cost (no budget): the cheapest candidate's price over
    this one's, so cost counts in proportion to price. A candidate 40x the cheapest scores
    1/40; on a line stretched to 1.5x the dearest it scored ~0.8 and its price barely
    mattered (issue 26). A free cheapest candidate leaves every priced one at 0."""
    if predicted <= min_candidate or predicted <= 0:
        return 1.0
    return _clamp01(min_candidate / predicted)


def capacity_score(available: float, maximum: float) -> float:
    """Squared free share: punishes nearly-full candidates so traffic does not pile onto them."""
    if maximum <= 0:
        return 0.0
    return _clamp01(available / maximum) ** 2


def region_score(region: str, preferred: Sequence[str]) -> float:
    """1 for the first preferred region, decreasing by rank, 0 if unlisted; 1 with no preference.

    Allowed/forbidden regions are a hard filter; this only ranks among allowed ones.
    """
    if not preferred:
        return 1.0
    if region not in preferred:
        return 0.0
    return 1.0 - preferred.index(region) / len(preferred)


def preference_score(
    candidate: str, preferred: Collection[str], avoided: Collection[str] = ()
) -> float:
    """Soft tenant/user preference: 1 preferred, 0 avoided, 0.5 neutral."""
    if candidate in avoided:
        return 0.0
    return 1.0 if candidate in preferred else 0.5


@dataclass(frozen=True, slots=True)
class ScoreComponents:
    quality: float
    success: float
    latency: float
    cost: float
    capacity: float
    region: float
    preference: float

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"component {f.name}={value} outside [0, 1]")


@dataclass(frozen=True, slots=True)
class ScoreWeights:
    """Defaults are the 9.13 example; they sum to 1."""

    quality: float = 0.28
    success: float = 0.22
    latency: float = 0.18
    cost: float = 0.14
    capacity: float = 0.10
    region: float = 0.04
    preference: float = 0.04

    def __post_init__(self) -> None:
        if any(getattr(self, f.name) < 0 for f in fields(self)):
            raise ValueError("weights must be non-negative")

    @property
    def total(self) -> float:
        return math.fsum(getattr(self, f.name) for f in fields(self))


@dataclass(frozen=True, slots=True)
class Penalty:
    code: str
    amount: float


@dataclass(frozen=True, slots=True)
class ScoreBreakdown:
    components: ScoreComponents
    weighted: Mapping[str, float]
    penalties: tuple[Penalty, ...]
    gross: float  # in [0, weights.total]
    total: float  # gross minus penalties; may go below 0 so heavy penalties still rank

    def as_dict(self) -> dict[str, object]:
        """Explainable form for ``routing_decisions.candidate_snapshot``."""
        return {
            "weighted": dict(self.weighted),
            "penalties": {p.code: p.amount for p in self.penalties},
            "gross": self.gross,
            "total": self.total,
        }


def score(
    components: ScoreComponents, weights: ScoreWeights, penalties: Sequence[Penalty] = ()
) -> ScoreBreakdown:
    if any(p.amount < 0 for p in penalties):
        raise ValueError("penalties are non-negative amounts")
    weighted = {
        f.name: getattr(components, f.name) * getattr(weights, f.name) for f in fields(components)
    }
    gross = min(math.fsum(weighted.values()), weights.total)  # fsum rounding must not exceed
    total = gross - math.fsum(p.amount for p in penalties)
    return ScoreBreakdown(components, weighted, tuple(penalties), gross, total)


@dataclass(frozen=True, slots=True)
class CanaryGates:
    """Every canary stage must meet all of these before advancing (9.13.5)."""

    min_samples: int = 50
    min_success_rate: float = 0.95
    max_p95_latency_s: float = 300.0
    max_safety_failure_rate: float = 0.02
    max_cost_per_success_micros: int = 2_000_000
    min_quality_pass_rate: float = 0.9


@dataclass(frozen=True, slots=True)
class CanaryConfig:
    shares: tuple[float, ...] = (0.005, 0.02, 0.05, 0.10)
    gates: CanaryGates = CanaryGates()
    value_threshold_micros: int = 5_000_000  # tasks worth more are never exploration samples
    buckets: int = 10_000


@dataclass(frozen=True)
class RoutingPolicy:
    """A versioned, reviewable routing configuration; decisions record ``version``."""

    version: str
    weights: Mapping[str, ScoreWeights] = field(default_factory=lambda: {"default": ScoreWeights()})
    hysteresis_delta: float = 0.03
    min_dwell_s: float = 60.0
    canary: CanaryConfig = CanaryConfig()
    # Candidates under a canary (9.13.5), each with its own stages and gates; the candidate's
    # current stage comes from the leader through ``RoutingContext.canary_stages``.
    canaries: Mapping[str, CanaryConfig] = field(default_factory=dict)

    def weights_for(self, scenario: str) -> ScoreWeights:
        """Weights for a service class or scenario, falling back to ``default``."""
        return self.weights.get(scenario) or self.weights["default"]


class Window(StrEnum):
    ONE_MINUTE = "1m"  # spots sudden degradation
    FIFTEEN_MINUTES = "15m"  # drives current routing
    ONE_DAY = "24h"  # stable baseline
    SEVEN_DAYS = "7d"  # quality and cost trends

    @property
    def seconds(self) -> float:
        return {"1m": 60.0, "15m": 900.0, "24h": 86_400.0, "7d": 604_800.0}[self.value]


class Ewma:
    """Time-decayed EWMA for irregular samples.

    Keeps a decayed sum and a decayed weight, both multiplied by ``exp(-elapsed / window)``
    between samples. That is EWMA_t = a·x + (1-a)·EWMA_(t-1) with ``a`` derived from elapsed time
    and the window, except that samples arriving at the same instant are averaged, not dropped.
    ``weight`` doubles as an effective sample count (e.g. for a Wilson bound).
    """

    def __init__(self, window_s: float) -> None:
        if window_s <= 0:
            raise ValueError("window must be positive")
        self.window_s = window_s
        self._sum = self._weight = 0.0
        self._at: float | None = None

    def _decay_to(self, at: float) -> None:
        if self._at is not None and at > self._at:
            factor = math.exp(-(at - self._at) / self.window_s)
            self._sum *= factor
            self._weight *= factor
        if self._at is None or at > self._at:
            self._at = at

    def observe(self, sample: float, at: float, weight: float = 1.0) -> None:
        self._decay_to(at)  # a late sample is folded in at the current time, not rewound
        self._sum += sample * weight
        self._weight += weight

    @property
    def value(self) -> float | None:
        return self._sum / self._weight if self._weight > 0 else None

    def weight(self, at: float) -> float:
        if self._at is None:
            return 0.0
        return self._weight * math.exp(-max(0.0, at - self._at) / self.window_s)

    def decayed_sum(self, at: float) -> float:
        if self._at is None:
            return 0.0
        return self._sum * math.exp(-max(0.0, at - self._at) / self.window_s)


_REBASE_EXPONENT = 300.0  # exp(300) ~ 1e130: far from overflow, rebased once per 300 windows


class DecayedQuantiles:
    """Quantiles of a time-decayed sample stream: a histogram over log-spaced buckets whose
    weights decay like `Ewma`'s (``exp(-elapsed / window)``), so a quantile of the 15-minute
    window reflects the last quarter hour as the mean does (9.13.2's predicted p95).

    Buckets grow by `RATIO` from `LOW` seconds and a quantile is its bucket's geometric
    middle (within half a bucket, about 7%, of the samples there); samples outside
    ``[LOW, HIGH]`` count in the end buckets. Fixed memory per window, no sample kept, and the
    same fold for this replica's observations and the ones another replica shared, so every
    replica computes the same figure."""

    LOW = 0.05
    HIGH = 7 * 86_400.0
    RATIO = 1.15
    _LOG_RATIO = math.log(RATIO)
    BUCKETS = math.ceil(math.log(HIGH / LOW) / _LOG_RATIO) + 1

    def __init__(self, window_s: float) -> None:
        if window_s <= 0:
            raise ValueError("window must be positive")
        self.window_s = window_s
        # Weights are kept scaled by exp((at - base) / window) (`_scale`): a new sample adds
        # the current scale instead of every bucket being decayed, so `observe` is O(1); the
        # quantile only reads ratios. Rebased before the scale could overflow.
        self._weights = [0.0] * self.BUCKETS
        self._at: float | None = None
        self._base = 0.0
        self._scale = 1.0

    @classmethod
    def _bucket(cls, sample: float) -> int:
        if sample <= cls.LOW:
            return 0
        return min(cls.BUCKETS - 1, int(math.log(sample / cls.LOW) / cls._LOG_RATIO) + 1)

    def observe(self, sample: float, at: float) -> None:
        if self._at is None:
            self._base = at
        if self._at is None or at > self._at:
            self._at = at  # a late sample is folded in at the current time, as in `Ewma`
            exponent = (at - self._base) / self.window_s
            if exponent > _REBASE_EXPONENT:
                factor = math.exp(-exponent)
                self._weights = [w * factor for w in self._weights]
                self._base, exponent = at, 0.0
            self._scale = math.exp(exponent)
        self._weights[self._bucket(sample)] += self._scale

    def weight(self, at: float) -> float:
        """The decayed number of samples at `at` (an effective sample count, as `Ewma.weight`)."""
        if self._at is None:
            return 0.0
        elapsed = max(0.0, at - self._at)
        return sum(self._weights) / self._scale * math.exp(-elapsed / self.window_s)

    def quantile(self, q: float) -> float | None:
        """The `q` quantile (0 < q < 1) of the decayed samples, None before any sample.
        Decay scales every bucket alike, so the quantile does not depend on the time read."""
        if not 0.0 < q < 1.0:
            raise ValueError("q must be in (0, 1)")
        total = sum(self._weights)
        if total <= 0:
            return None
        target, seen = q * total, 0.0
        last = 0
        for i, weight in enumerate(self._weights):
            if weight <= 0:
                continue
            last = i
            seen += weight
            if seen >= target:
                break
        return self._middle(last)

    @classmethod
    def _middle(cls, bucket: int) -> float:
        """Bucket `bucket`'s geometric middle: within half a bucket of any sample in it."""
        if bucket == 0:
            return cls.LOW
        return min(cls.HIGH, cls.LOW * math.pow(cls.RATIO, bucket - 0.5))


@dataclass(frozen=True, slots=True)
class WindowStats:
    success_rate: float | None
    success_lower_bound: float
    effective_samples: float
    mean_latency_s: float | None
    cost_per_success_micros: float | None
    p95_latency_s: float | None = None  # predicted p95 (`DecayedQuantiles`), 9.13.2


class HealthWindows:
    """Success, latency (mean and predicted p95) and cost-per-success over the four 9.13.3
    windows."""

    def __init__(self) -> None:
        self._success = {w: Ewma(w.seconds) for w in Window}
        self._latency = {w: Ewma(w.seconds) for w in Window}
        self._latency_q = {w: DecayedQuantiles(w.seconds) for w in Window}
        self._cost = {w: Ewma(w.seconds) for w in Window}  # decayed spend; value is unused

    def observe(self, success: bool, latency_s: float | None, cost_micros: int, at: float) -> None:
        """One outcome; `latency_s` None when the call says nothing about generation time."""
        for w in Window:
            self._success[w].observe(1.0 if success else 0.0, at)
            if latency_s is not None:
                self._latency[w].observe(latency_s, at)
                self._latency_q[w].observe(latency_s, at)
            self._cost[w].observe(float(cost_micros), at)

    def latency_quantile(self, window: Window, q: float) -> float | None:
        """The `q` quantile of `window`'s latencies (None before any)."""
        return self._latency_q[window].quantile(q)

    def latency_samples(self, window: Window, at: float) -> float:
        """How many (decayed) outcomes of `window` carried a latency: finished jobs."""
        return self._latency[window].weight(at)

    def stats(self, window: Window, at: float) -> WindowStats:
        total = self._success[window].weight(at)
        successes = min(self._success[window].decayed_sum(at), total)
        spend = self._cost[window].decayed_sum(at)
        return WindowStats(
            success_rate=self._success[window].value,
            success_lower_bound=wilson_lower_bound(successes, total),
            effective_samples=total,
            mean_latency_s=self._latency[window].value,
            # Failed calls may still bill, so spend over all calls is divided by successes only.
            cost_per_success_micros=spend / successes if successes > 0 else None,
            p95_latency_s=self._latency_q[window].quantile(0.95),
        )


def routing_success(current: WindowStats, minute: WindowStats) -> float:
    """The success component's figure (9.13.3): the routing window's Wilson lower bound,
    unless the 1-minute window shows a burst, worse beyond doubt (its Wilson upper bound below
    the routing window's lower bound): then the 1-minute lower bound, so a sudden error burst
    penalises at once instead of when the 15-minute EWMA has moved. A few failures among few
    calls are not beyond doubt, so one unlucky call does not move traffic."""
    total = minute.effective_samples
    if total <= 0 or minute.success_rate is None:
        return current.success_lower_bound
    failures = min(max(total * (1.0 - minute.success_rate), 0.0), total)
    upper = 1.0 - wilson_lower_bound(failures, total)
    if upper < current.success_lower_bound:
        return minute.success_lower_bound
    return current.success_lower_bound


@dataclass(frozen=True, slots=True)
class HysteresisDecision:
    chosen: str
    switched: bool
    reason: str


def choose_with_hysteresis(
    ranked: Sequence[tuple[str, float]],
    incumbent: str | None,
    *,
    delta: float,
    dwell_s: float,
    now: float,
    incumbent_since: float | None,
) -> HysteresisDecision:
    """Keep the incumbent unless a rival beats it by at least ``delta`` after the dwell time.

    ``ranked`` holds only hard-filtered candidates; an incumbent missing from it is gone.
    """
    if not ranked:
        raise ValueError("no candidates to choose from")
    best_id, best_score = max(ranked, key=lambda pair: pair[1])
    scores = dict(ranked)
    if incumbent is None or incumbent not in scores:
        return HysteresisDecision(best_id, incumbent is not None, "incumbent_unavailable")
    if best_id == incumbent:
        return HysteresisDecision(incumbent, False, "incumbent_best")
    if incumbent_since is not None and now - incumbent_since < dwell_s:
        return HysteresisDecision(incumbent, False, "min_dwell")
    if best_score >= scores[incumbent] + delta:
        return HysteresisDecision(best_id, True, "beats_incumbent_by_delta")
    return HysteresisDecision(incumbent, False, "within_hysteresis")


def bucket(key: str, buckets: int) -> int:
    """Stable bucket of a tenant/task id across processes and releases (sha256, never hash())."""
    if buckets <= 0:
        raise ValueError("buckets must be positive")
    digest = hashlib.sha256(key.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") % buckets


def _weight(key: str, member: str) -> int:
    digest = hashlib.sha256(f"{key}\x00{member}".encode()).digest()
    return int.from_bytes(digest[:8], "big")


def rendezvous(key: str, members: Sequence[str]) -> int:
    """Index of the member `key` goes to by highest-random-weight (rendezvous) hashing (9.13.4).

    Each (key, member) pair gets a stable pseudo-random weight and the heaviest member wins, so
    a member joining a set of N takes about 1/(N+1) of the keys and leaves the others where
    they were (a modulo over N would move about N/(N+1) of them), and the order of `members`
    does not matter. Stable across processes and releases (sha256, never hash())."""
    if not members:
        raise ValueError("members must not be empty")
    weights = [_weight(key, m) for m in members]
    return weights.index(max(weights))


def admit_to_canary(
    task_bucket: int,
    is_strict: bool,
    value_micros: int,
    threshold: int,
    *,
    share: float,
    buckets: int = 10_000,
) -> bool:
    """Exploration takes a bucketed share, never a STRICT task and never one above the threshold."""
    if is_strict or value_micros > threshold:
        return False
    return task_bucket < math.floor(share * buckets)


@dataclass(frozen=True, slots=True)
class CanaryMetrics:
    samples: int
    success_rate: float
    p95_latency_s: float
    safety_failure_rate: float
    cost_per_success_micros: float
    quality_pass_rate: float | None  # None until human spot checks exist


class CanaryAction(StrEnum):
    ADVANCE = "ADVANCE"
    HOLD = "HOLD"
    ROLLBACK = "ROLLBACK"
    PROMOTE = "PROMOTE"  # passed the last stage; graduates to normal scoring


@dataclass(frozen=True, slots=True)
class CanaryDecision:
    action: CanaryAction
    stage: int | None  # stage to run next; None after rollback or promotion
    failed_gates: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class CanaryPlan:
    config: CanaryConfig = CanaryConfig()

    def canary_share(self, stage: int) -> float:
        return self.config.shares[stage]

    def admits(self, task_id: str, stage: int, is_strict: bool, value_micros: int) -> bool:
        return admit_to_canary(
            bucket(task_id, self.config.buckets),
            is_strict,
            value_micros,
            self.config.value_threshold_micros,
            share=self.canary_share(stage),
            buckets=self.config.buckets,
        )

    def evaluate(self, stage: int, metrics: CanaryMetrics) -> CanaryDecision:
        """Roll back on any breached gate, hold until enough evidence, else advance/promote."""
        g = self.config.gates
        checks = {
            "success_rate": metrics.success_rate >= g.min_success_rate,
            "p95_latency": metrics.p95_latency_s <= g.max_p95_latency_s,
            "safety_failure_rate": metrics.safety_failure_rate <= g.max_safety_failure_rate,
            "cost_per_success": metrics.cost_per_success_micros <= g.max_cost_per_success_micros,
            "quality_pass_rate": metrics.quality_pass_rate is None
            or metrics.quality_pass_rate >= g.min_quality_pass_rate,
        }
        failed = tuple(name for name, ok in checks.items() if not ok)
        if metrics.samples < g.min_samples or metrics.quality_pass_rate is None:
            return CanaryDecision(CanaryAction.HOLD, stage, failed)
        if failed:
            return CanaryDecision(CanaryAction.ROLLBACK, None, failed)
        if stage + 1 >= len(self.config.shares):
            return CanaryDecision(CanaryAction.PROMOTE, None)
        return CanaryDecision(CanaryAction.ADVANCE, stage + 1)


def example_policy(version: str = "2024-01-example") -> RoutingPolicy:
    """The 9.13 scenario table as weights; every set sums to 1."""
    return RoutingPolicy(
        version=version,
        weights={
            "default": ScoreWeights(),
            "INTERACTIVE": ScoreWeights(0.18, 0.26, 0.28, 0.08, 0.14, 0.03, 0.03),
            "AD_PRODUCTION": ScoreWeights(0.40, 0.22, 0.08, 0.08, 0.08, 0.07, 0.07),
            "BATCH": ScoreWeights(0.20, 0.24, 0.04, 0.32, 0.16, 0.02, 0.02),
            "ENTERPRISE_PRIVATE": ScoreWeights(0.22, 0.20, 0.12, 0.08, 0.08, 0.15, 0.15),
            "FREE_TRIAL": ScoreWeights(0.16, 0.20, 0.10, 0.34, 0.16, 0.02, 0.02),
        },
    )
