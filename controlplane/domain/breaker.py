"""Circuit breakers per (provider, account, region, model, operation) — design 9.15.

This room decides, from call outcomes alone, whether one provider endpoint should keep receiving
traffic. It does no I/O: callers feed it outcomes, ask it for admission, and persist the
``BreakerTransition`` events it hands back (to ``provider_health_events``, 9.19.6). A shared,
Redis-backed health state (9.15.4) is layered on top through ``apply_remote``; admin overrides go
through ``force``.

State machine (9.15.2)::

    CLOSED --(failure rate after min samples | N consecutive failures | slow calls)--> OPEN
                  (slow calls: more than 5 % over 4x their baseline, `baselines`)
    OPEN --(cooldown elapsed)--> HALF_OPEN
    HALF_OPEN --(k probe successes)--> CLOSED     (cooldown ladder resets)
    HALF_OPEN --(any probe failure)--> OPEN       (next cooldown: 30s → 1m → 2m → 5m → 10m, capped)
    any --(AUTH / PERMISSION / account misconfigured)--> OPEN   (`trip`, on the account's key)

Account breakers (9.15.1, 9.9.1 "先熔断错误账号"): a static account fault is not health noise
for one model, it disables the whole account at once. `account_key` names the breaker that
holds that fact: model ``""`` and operation SUBMIT. It closes like any breaker, on its own
ladder (`account_config`): after ``account_cooldowns_s[0]`` (10 min by default: a revoked key
does not come back in seconds) it admits one probe, whose success closes it and whose same fault
reopens it for the next, longer cooldown. After rotating the key an operator closes it at once
with ForceBreaker (model empty, operation SUBMIT), or pins it OPEN.
"""

from __future__ import annotations

import re
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from enum import StrEnum

Clock = Callable[[], float]
"""Seconds on any monotonic scale; injected so tests drive time."""

MetricsSnapshot = dict[str, float | int | str | None]

SLOW_CALLS = "slow_calls"  # the transition reason of an opening on slow calls (9.15.2)


def opened_on_slow_calls(reason: str) -> bool:
    """Whether a breaker's `CircuitBreaker.opened_for` is the slow-call rule, here or on the
    replica that published it (``remote:slow_calls``)."""
    return reason.rpartition(":")[2] == SLOW_CALLS


_OPEN_DETAIL = re.compile(r"\bbreaker OPEN on (\S+) for ")


def open_detail(scope: str, opened_for: str, remaining_s: float) -> str:
    """What routing says of a candidate whose `scope` ("breaker", "account breaker") is OPEN
    and cooling down: why it opened (`CircuitBreaker.opened_for`) and for how long yet."""
    why = f" on {opened_for}" if opened_for else ""
    return f"{scope} OPEN{why} for {max(0.0, remaining_s):.0f} s more"


def opened_for_in(detail: str) -> str:
    """The `opened_for` an `open_detail` names (a refused candidate's verdict detail)."""
    found = _OPEN_DETAIL.search(detail)
    return found.group(1) if found else ""


class Operation(StrEnum):
    SUBMIT = "SUBMIT"
    POLL = "POLL"
    CANCEL = "CANCEL"
    UPLOAD = "UPLOAD"
    DOWNLOAD_OUTPUT = "DOWNLOAD_OUTPUT"
    USAGE_QUERY = "USAGE_QUERY"
    # The sidecar's Compile while routing: a sidecar that does not answer (stopped, restarting)
    # is skipped until it does, instead of its candidates being rejected (issue 20).
    COMPILE = "COMPILE"


class BreakerState(StrEnum):
    CLOSED = "CLOSED"
    OPEN = "OPEN"
    HALF_OPEN = "HALF_OPEN"


@dataclass(frozen=True, slots=True)
class BreakerKey:
    """Breaker granularity: one failing model submit in one region must not stop polls elsewhere."""

    provider: str
    account: str
    region: str
    model: str
    operation: Operation

    def __str__(self) -> str:
        return f"{self.provider}/{self.account}/{self.region}/{self.model}/{self.operation}"


class FailureKind(StrEnum):
    """Transport-level failure kinds, for failures that never reach the 9.9 error classifier."""

    CONNECT_ERROR = "CONNECT_ERROR"
    DNS_TLS_ERROR = "DNS_TLS_ERROR"
    GATEWAY_5XX = "GATEWAY_5XX"  # 502 / 503 / 504
    INTERNAL_RETRYABLE = "INTERNAL_RETRYABLE"
    TIMEOUT_OVER_BASELINE = "TIMEOUT_OVER_BASELINE"
    MALFORMED_RESPONSE = "MALFORMED_RESPONSE"
    INVALID_INPUT = "INVALID_INPUT"
    SAFETY_REJECTED = "SAFETY_REJECTED"
    USER_CANCELLED = "USER_CANCELLED"
    UNSUPPORTED_CAPABILITY = "UNSUPPORTED_CAPABILITY"
    ACCOUNT_MISCONFIGURED = "ACCOUNT_MISCONFIGURED"


_COUNTED: frozenset[str] = frozenset(
    {
        FailureKind.CONNECT_ERROR,
        FailureKind.DNS_TLS_ERROR,
        FailureKind.GATEWAY_5XX,
        FailureKind.INTERNAL_RETRYABLE,
        FailureKind.TIMEOUT_OVER_BASELINE,
        # One malformed body counts once; "repeated" is what the consecutive rule detects.
        FailureKind.MALFORMED_RESPONSE,
        # 9.9 classes that describe the endpoint's health.
        "TRANSIENT_NETWORK",
        "PROVIDER_OVERLOADED",
        # The request's fate is unknown because the endpoint stopped answering: a timeout.
        "SUBMISSION_UNKNOWN",
    }
)
_NOT_COUNTED: frozenset[str] = frozenset(
    {
        FailureKind.INVALID_INPUT,
        FailureKind.SAFETY_REJECTED,
        FailureKind.USER_CANCELLED,
        FailureKind.UNSUPPORTED_CAPABILITY,
        # A static account fault disables the account (9.15.1); it is not health noise.
        FailureKind.ACCOUNT_MISCONFIGURED,
        "SAFETY_INPUT",
        "SAFETY_OUTPUT",
        "AUTH",
        "PERMISSION",
        "QUOTA",
        # 429 is our own share running out; leases and backoff handle it, not the breaker.
        "RATE_LIMITED",
        "ASSET_UNAVAILABLE",
        "ASSET_INVALID",
        "INTERNAL_PERMANENT",
        "OUTPUT_EXPIRED",
    }
)


# 9.9.1 classes whose handling row says `disables_account` (mirrored here: the breaker module
# reads failure strings, not the error table).
DISABLES_ACCOUNT: frozenset[str] = frozenset(
    {"AUTH", "PERMISSION", FailureKind.ACCOUNT_MISCONFIGURED}
)


def account_key(key: BreakerKey) -> BreakerKey:
    """The breaker of `key`'s whole account: open while the account itself is unusable."""
    return BreakerKey(key.provider, key.account, key.region, "", Operation.SUBMIT)


def compile_config(config: BreakerConfig) -> BreakerConfig:
    """How a COMPILE breaker runs: Compile is a local call to our own sidecar, so two calls in a
    row that got no answer already say it is down (each costs a dispatch round its compile
    deadline); a sixth of the cooldowns (a restart takes seconds); one probe, one answer closes."""
    return replace(
        config,
        consecutive_failures=min(config.consecutive_failures, 2),
        cooldowns_s=tuple(c / 6 for c in config.cooldowns_s),
        half_open_max_probes=1,
        half_open_successes_to_close=1,
    )


def account_config(config: BreakerConfig) -> BreakerConfig:
    """How an account breaker runs: its own cooldown ladder, one probe, one success closes."""
    return replace(
        config,
        cooldowns_s=config.account_cooldowns_s,
        half_open_max_probes=1,
        half_open_successes_to_close=1,
    )


def counts_for_breaker(failure: str) -> bool:
    """Whether a failure (``FailureKind`` or 9.9 error-class string) is endpoint-health evidence.

    Unknown strings raise ``ValueError``: a typo must not silently stop a breaker from tripping.
    """
    if failure in _COUNTED:
        return True
    if failure in _NOT_COUNTED:
        return False
    raise ValueError(f"unknown failure kind or error class: {failure!r}")


@dataclass(frozen=True, slots=True)
class CallOutcome:
    """Result of one provider call; ``failure is None`` means success."""

    failure: str | None = None
    latency_ms: float | None = None

    def __post_init__(self) -> None:
        if self.failure is not None:
            counts_for_breaker(self.failure)  # validates

    @classmethod
    def ok(cls, latency_ms: float | None = None) -> CallOutcome:
        return cls(None, latency_ms)

    @classmethod
    def failed(cls, failure: str, latency_ms: float | None = None) -> CallOutcome:
        return cls(failure, latency_ms)

    @property
    def succeeded(self) -> bool:
        return self.failure is None

    @property
    def neutral(self) -> bool:
        """A failure that says nothing about the endpoint; the breaker ignores it entirely."""
        return self.failure is not None and not counts_for_breaker(self.failure)


@dataclass(frozen=True, slots=True)
class BreakerConfig:
    """Thresholds for one key; they must be tuned to call frequency, never copied everywhere."""

    window_seconds: float = 120.0
    min_samples: int = 20
    failure_rate_threshold: float = 0.5
    consecutive_failures: int = 8
    # Slow calls (9.15.1-9.15.2, `controlplane.domain.baselines`): a successful call slower
    # than `slow_call_factor` x its learned baseline is recorded as TIMEOUT_OVER_BASELINE.
    slow_call_factor: float = 4.0
    # Share of the window's calls over the baseline that trips; 0.05 reads as "P95 above
    # slow_call_factor x baseline" (9.15.2's "P95 提交延迟超过基线 4 倍").
    slow_call_rate: float = 0.05
    # The baseline: this quantile of the operation's successful calls over 24 h, once it has
    # this many, and never below the floor.
    baseline_quantile: float = 0.5
    baseline_min_samples: int = 20
    baseline_floor_s: float = 0.25
    cooldowns_s: tuple[float, ...] = (30.0, 60.0, 120.0, 300.0, 600.0)
    half_open_max_probes: int = 1
    half_open_successes_to_close: int = 3
    # How long a probe admission is held without its result (the attempt never submitted, the
    # replica died) before the slot frees for another probe. Longer than any submit can take.
    half_open_probe_ttl_s: float = 600.0
    # The cooldown ladder of an account breaker (AUTH / PERMISSION): each probe costs one task
    # a failed attempt, so a disabled account is retried rarely.
    account_cooldowns_s: tuple[float, ...] = (600.0, 1800.0, 3600.0)

    def __post_init__(self) -> None:
        if self.window_seconds <= 0 or self.min_samples < 1 or self.consecutive_failures < 1:
            raise ValueError("window, min_samples and consecutive_failures must be positive")
        if not 0 < self.failure_rate_threshold <= 1 or not 0 <= self.slow_call_rate < 1:
            raise ValueError("rates must lie in (0, 1]")
        if self.slow_call_factor <= 1 or not 0 < self.baseline_quantile < 1:
            raise ValueError("slow_call_factor must exceed 1 and baseline_quantile lie in (0, 1)")
        if self.baseline_min_samples < 1 or self.baseline_floor_s < 0:
            raise ValueError("baseline_min_samples must be positive, baseline_floor_s not negative")
        if not self.cooldowns_s or any(c <= 0 for c in self.cooldowns_s):
            raise ValueError("cooldowns_s must be a non-empty list of positive seconds")
        if self.half_open_max_probes < 1 or self.half_open_successes_to_close < 1:
            raise ValueError("half-open probe limits must be at least 1")
        if self.half_open_probe_ttl_s <= 0:
            raise ValueError("half_open_probe_ttl_s must be positive")
        if not self.account_cooldowns_s or any(c <= 0 for c in self.account_cooldowns_s):
            raise ValueError("account_cooldowns_s must be a non-empty list of positive seconds")


@dataclass(frozen=True, slots=True)
class BreakerTransition:
    """One state change, shaped like a ``provider_health_events`` row."""

    key: BreakerKey
    old: BreakerState
    new: BreakerState
    reason: str
    metrics: MetricsSnapshot
    at: float


@dataclass(frozen=True, slots=True)
class Permit:
    """Admission to make one call. ``epoch`` ties a probe to the half-open phase that issued it."""

    key: BreakerKey
    epoch: int
    probe: bool
    transition: BreakerTransition | None = None


@dataclass(frozen=True, slots=True)
class Rejection:
    key: BreakerKey
    state: BreakerState
    reason: str
    retry_after_s: float | None  # None while pinned open by an operator
    transition: BreakerTransition | None = None


@dataclass(slots=True)
class _Sample:
    at: float
    failed: bool
    slow: bool


class CircuitBreaker:
    """The state machine for one ``BreakerKey``. Not thread-safe; one owner per event loop."""

    def __init__(self, key: BreakerKey, config: BreakerConfig, clock: Clock) -> None:
        self.key, self.config, self._clock = key, config, clock
        self._state = BreakerState.CLOSED
        self._epoch = 0
        self._window: deque[_Sample] = deque()
        self._failures = self._slow = self._consecutive = 0
        self._level = -1  # index into cooldowns_s of the current/last open; -1 after a full close
        self._open_until: float | None = None
        self._probes = self._probe_successes = 0
        self._pinned = False
        self._opened_for = ""

    @property
    def state(self) -> BreakerState:
        return self._state

    @property
    def opened_for(self) -> str:
        """Why it left CLOSED (the reason of that transition, e.g. ``slow_calls``,
        ``failure_rate``, ``remote:slow_calls``), kept through its OPEN / HALF_OPEN cycle (a
        failed probe does not change why it opened); "" while CLOSED. The explain view."""
        return self._opened_for

    @property
    def open_until(self) -> float | None:
        return self._open_until

    @property
    def level(self) -> int:
        """Index into ``cooldowns_s`` of the current or last open; -1 after a full close."""
        return self._level

    def metrics(self) -> MetricsSnapshot:
        self._prune(self._clock())
        n = len(self._window)
        return {
            "samples": n,
            "failures": self._failures,
            "failure_rate": self._failures / n if n else 0.0,
            "slow_calls": self._slow,
            "slow_rate": self._slow / n if n else 0.0,
            "consecutive_failures": self._consecutive,
            "cooldown_s": self.config.cooldowns_s[self._level] if self._level >= 0 else None,
            "probe_successes": self._probe_successes,
            "probes_in_flight": self._probes,
        }

    def cooldown_elapsed(self) -> bool:
        """OPEN, not pinned, and past its cooldown: the next `tick` moves it to HALF_OPEN."""
        return (
            self._state is BreakerState.OPEN
            and not self._pinned
            and self._open_until is not None
            and self._clock() >= self._open_until
        )

    def tick(self) -> BreakerTransition | None:
        """Apply time-driven transitions (OPEN → HALF_OPEN once the cooldown has elapsed)."""
        if self.cooldown_elapsed():
            return self._move(BreakerState.HALF_OPEN, "cooldown_elapsed")
        return None

    def try_acquire(self) -> Permit | Rejection:
        transition = self.tick()
        if self._state is BreakerState.CLOSED:
            return Permit(self.key, self._epoch, probe=False, transition=transition)
        if self._state is BreakerState.OPEN:
            retry = None if self._open_until is None else self._open_until - self._clock()
            reason = "pinned_open" if self._pinned else "open"
            return Rejection(self.key, self._state, reason, retry, transition)
        if self._probes < self.config.half_open_max_probes:
            self._probes += 1
            return Permit(self.key, self._epoch, probe=True, transition=transition)
        return Rejection(self.key, self._state, "probe_limit", None, transition)

    def release(self, permit: Permit) -> None:
        """Return a permit whose call was never made (e.g. the task was cancelled first)."""
        if self._is_current_probe(permit):
            self._probes -= 1

    def record(
        self, outcome: CallOutcome, permit: Permit | None = None
    ) -> BreakerTransition | None:
        if permit is not None and permit.key != self.key:
            raise ValueError(f"permit for {permit.key} recorded on breaker {self.key}")
        if self._state is BreakerState.OPEN:
            return None  # late results of calls admitted before the trip
        if self._state is BreakerState.HALF_OPEN:
            if permit is None or not self._is_current_probe(permit):
                return None  # only the admitted probes speak for the half-open endpoint
            self._probes -= 1
            return self._probe_result(outcome, None)
        if outcome.neutral:
            return None
        return self._record_closed(outcome)

    def record_probe(
        self, outcome: CallOutcome, successes: int | None = None
    ) -> BreakerTransition | None:
        """The result of a probe admitted outside this breaker (the replicas' shared ledger).

        `successes` is the half-open phase's probe-success count including this one, when the
        ledger keeps it for every replica; None counts on this breaker.
        """
        if self._state is not BreakerState.HALF_OPEN:
            return None
        return self._probe_result(outcome, successes)

    def probe_succeeded(self, outcome: CallOutcome) -> bool:
        """Whether `outcome`, as a probe, counts toward closing: successful, which a call over
        its baseline is not (it arrives as TIMEOUT_OVER_BASELINE)."""
        return outcome.succeeded

    def trip(self, reason: str) -> BreakerTransition | None:
        """Open at once (an account fault, 9.15.1); from HALF_OPEN with the next cooldown."""
        if self._state is BreakerState.OPEN:
            return None
        level = self._level + 1 if self._state is BreakerState.HALF_OPEN else 0
        return self._move(BreakerState.OPEN, reason, level=level)

    def _probe_result(
        self, outcome: CallOutcome, successes: int | None
    ) -> BreakerTransition | None:
        if outcome.neutral:
            return None
        if self.probe_succeeded(outcome):
            self._probe_successes = self._probe_successes + 1 if successes is None else successes
            if self._probe_successes >= self.config.half_open_successes_to_close:
                return self._move(BreakerState.CLOSED, "probes_succeeded")
            return None
        return self._move(BreakerState.OPEN, "probe_failed", level=self._level + 1)

    def force(self, state: BreakerState, reason: str) -> BreakerTransition:
        """Operator override. OPEN pins the breaker open until forced again; others unpin."""
        if state is BreakerState.OPEN:
            transition = self._move(BreakerState.OPEN, f"forced:{reason}")
            self._open_until, self._pinned = None, True
            return transition
        self._pinned = False
        return self._move(state, f"forced:{reason}")

    def apply_remote(
        self,
        state: BreakerState,
        until: float | None,
        reason: str = "shared_state",
        level: int | None = None,
    ) -> BreakerTransition | None:
        """Adopt the shared health state; a local operator pin wins over it.

        `level` is the publisher's cooldown step, so a probe failing on this replica reopens
        with the cooldown after the one every replica just served.
        """
        if self._pinned:
            return None
        if level is not None:
            self._level = min(level, len(self.config.cooldowns_s) - 1)
        if state is self._state and state is not BreakerState.OPEN:
            return None
        if state is BreakerState.OPEN:
            if until is None:
                raise ValueError("a remote OPEN needs an until")
            if self._state is BreakerState.OPEN and (self._open_until or 0.0) >= until:
                return None
            transition = self._move(BreakerState.OPEN, f"remote:{reason}")
            self._open_until = until
            return transition
        return self._move(state, f"remote:{reason}")

    def _record_closed(self, outcome: CallOutcome) -> BreakerTransition | None:
        now = self._clock()
        failed = not outcome.succeeded
        sample = _Sample(now, failed, self._is_slow(outcome))
        self._window.append(sample)
        self._failures += sample.failed
        self._slow += sample.slow
        self._consecutive = self._consecutive + 1 if failed else 0
        self._prune(now)
        cfg, n = self.config, len(self._window)
        if self._consecutive >= cfg.consecutive_failures:
            return self._move(BreakerState.OPEN, "consecutive_failures", level=0)
        if n >= cfg.min_samples:
            if self._failures / n > cfg.failure_rate_threshold:
                return self._move(BreakerState.OPEN, "failure_rate", level=0)
            if self._slow / n > cfg.slow_call_rate:
                return self._move(BreakerState.OPEN, SLOW_CALLS, level=0)
        return None

    @staticmethod
    def _is_slow(outcome: CallOutcome) -> bool:
        """Judged against its baseline before it got here (`baselines.judge_call`)."""
        return outcome.failure == FailureKind.TIMEOUT_OVER_BASELINE

    def _is_current_probe(self, permit: Permit) -> bool:
        return (
            self._state is BreakerState.HALF_OPEN and permit.probe and permit.epoch == self._epoch
        )

    def _prune(self, now: float) -> None:
        horizon = now - self.config.window_seconds
        while self._window and self._window[0].at <= horizon:
            old = self._window.popleft()
            self._failures -= old.failed
            self._slow -= old.slow

    def _move(self, new: BreakerState, reason: str, level: int | None = None) -> BreakerTransition:
        now = self._clock()
        old = self._state
        if new is BreakerState.OPEN:
            last = len(self.config.cooldowns_s) - 1
            self._level = min(max(self._level, 0) if level is None else level, last)
        metrics = self.metrics()  # snapshot of the evidence, before it is cleared below
        if new is BreakerState.OPEN:
            metrics["cooldown_s"] = self.config.cooldowns_s[self._level]
            self._open_until = now + self.config.cooldowns_s[self._level]
        else:
            self._open_until = None
        if new is BreakerState.CLOSED:
            self._level = -1  # a full close resets the cooldown ladder
            self._opened_for = ""
        elif old is BreakerState.CLOSED or not self._opened_for:
            self._opened_for = reason
        self._state = new
        self._epoch += 1
        self._window.clear()
        self._failures = self._slow = self._consecutive = 0
        self._probes = self._probe_successes = 0
        return BreakerTransition(self.key, old, new, reason, metrics, now)


@dataclass(frozen=True, slots=True)
class KeyPattern:
    """Selects breaker keys for a config override; ``None`` fields match anything."""

    provider: str | None = None
    account: str | None = None
    region: str | None = None
    model: str | None = None
    operation: Operation | None = None

    @classmethod
    def exact(cls, key: BreakerKey) -> KeyPattern:
        return cls(key.provider, key.account, key.region, key.model, key.operation)

    def matches(self, key: BreakerKey) -> bool:
        pairs = (
            (self.provider, key.provider),
            (self.account, key.account),
            (self.region, key.region),
            (self.model, key.model),
            (self.operation, key.operation),
        )
        return all(want is None or want == got for want, got in pairs)

    @property
    def specificity(self) -> int:
        fields = (self.provider, self.account, self.region, self.model, self.operation)
        return sum(f is not None for f in fields)


@dataclass
class BreakerRegistry:
    """Breakers created lazily per key; config = most specific matching override, else default."""

    default: BreakerConfig
    clock: Clock
    overrides: Mapping[KeyPattern, BreakerConfig] = field(default_factory=dict)
    _breakers: dict[BreakerKey, CircuitBreaker] = field(default_factory=dict, init=False)

    def config_for(self, key: BreakerKey) -> BreakerConfig:
        best: tuple[int, BreakerConfig] | None = None
        for pattern, config in self.overrides.items():  # ties: first listed wins
            if pattern.matches(key) and (best is None or pattern.specificity > best[0]):
                best = (pattern.specificity, config)
        if best is not None:
            return best[1]
        # Without an override of its own a COMPILE breaker runs on `compile_config`.
        return compile_config(self.default) if key.operation is Operation.COMPILE else self.default

    def get(self, key: BreakerKey) -> CircuitBreaker:
        breaker = self._breakers.get(key)
        if breaker is None:
            config = self.config_for(key)
            if key == account_key(key):
                config = account_config(config)
            breaker = CircuitBreaker(key, config, self.clock)
            self._breakers[key] = breaker
        return breaker

    def try_acquire(self, key: BreakerKey) -> Permit | Rejection:
        return self.get(key).try_acquire()

    def record(self, outcome: CallOutcome, permit: Permit) -> BreakerTransition | None:
        return self.get(permit.key).record(outcome, permit)

    def force(self, key: BreakerKey, state: BreakerState, reason: str) -> BreakerTransition:
        return self.get(key).force(state, reason)

    def apply_remote(
        self, key: BreakerKey, state: BreakerState, until: float | None, reason: str = "shared"
    ) -> BreakerTransition | None:
        return self.get(key).apply_remote(state, until, reason)

    def tick(self) -> list[BreakerTransition]:
        """Advance every breaker's clock-driven transitions; returns the events to persist."""
        return [t for b in self._breakers.values() if (t := b.tick()) is not None]

    def states(self) -> dict[BreakerKey, BreakerState]:
        return {key: breaker.state for key, breaker in self._breakers.items()}

    def opened_for(self) -> dict[BreakerKey, str]:
        """Why each breaker not CLOSED left CLOSED (`CircuitBreaker.opened_for`)."""
        return {key: b.opened_for for key, b in self._breakers.items() if b.opened_for}
