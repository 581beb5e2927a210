"""The inputs of a routing decision (design 9.10 steps 1-2): who could run a task, and the facts
about each candidate at decision time.

A `Candidate` is one provider + account + region + model version with its capability and its
effective `Price`. The dispatcher gathers, keyed by candidate id, what is known now: the adapter's
`CompileResult`, and in a `RoutingContext` the open breakers, lease pre-checks (`CapacityView`),
health windows (`HealthView`), failover exclusions and the routing group's `Incumbent`.
`catalog_version` names the capability and price versions a decision was made against.

Pure data: `filters` decides which candidates are eligible, `selection` which one runs.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import TYPE_CHECKING, Any

from vidroute_core.spec import GenerationSpec

if TYPE_CHECKING:  # the loader pulls in YAML/JSON Schema; the domain only reads the fields
    from controlplane.domain.accounts import Accounts
    from controlplane.domain.quality import QualityEvidence
    from controlplane.domain.routing.load import LoadView
    from vidroute_core.capabilities.loader import Capability


class TransformKind(StrEnum):
    EXACT = "EXACT"
    LOSSLESS = "LOSSLESS"
    DEGRADE = "DEGRADE"
    REJECT = "REJECT"


@dataclass(frozen=True, slots=True)
class Price:
    """The effective price version of a candidate; integer micros per output second."""

    price_version: str
    currency: str
    micros_per_second: int
    micros_per_second_with_audio: int | None = None

    def estimate(self, spec: GenerationSpec) -> int:
        """Pre-compile estimate: whole seconds (rounded up) x samples x the audio-aware price."""
        per_s = self.micros_per_second
        if spec.output.with_audio and self.micros_per_second_with_audio is not None:
            per_s = self.micros_per_second_with_audio
        seconds = -(-spec.output.duration_ms // 1000)
        return per_s * seconds * max(1, spec.output.sample_count)


@dataclass(frozen=True, slots=True)
class Candidate:
    """provider + account + region + model + model_version with its capability and price."""

    provider: str
    account: str
    account_id: int
    region: str
    model: str
    model_version: str
    capability_version: str
    lifecycle: str  # preview | stable | deprecated | sunset
    sunset_at: datetime | None
    capability: Capability
    price: Price
    #: The stable candidate id of decisions: ``provider/model/account``. Derived, built once
    #: (a decision reads it ~100 times per task: a property built the string every time).
    id: str = field(init=False, repr=False, compare=False)
    #: The keys of a verdict's explain JSON that only the candidate decides, in their stored
    #: order (``eligible`` and ``estimated_cost_micros`` hold their places: None here, set per
    #: verdict). Derived once; `decision.Verdict.to_json` copies it. Never mutate it.
    explain_keys: dict[str, Any] = field(init=False, repr=False, compare=False)
    #: The same static keys as JSON text, split around the two per-verdict values: the text
    #: before ``eligible``'s value and the text between it and ``estimated_cost_micros``'s
    #: (``persistence.explain`` renders a stored decision from them). Derived once.
    explain_text: tuple[bytes, bytes] = field(init=False, repr=False, compare=False)

    @classmethod
    def from_capability(cls, cap: Capability, account_id: int) -> Candidate:
        """The candidate of a capability entry expanded for its account, at the entry's own
        commercial price (no catalog row: a release check before it is written, tests)."""
        com = cap.commercial
        return cls(
            provider=cap.provider,
            account=cap.account,
            account_id=account_id,
            region=cap.region,
            model=cap.model,
            model_version=cap.model_version,
            capability_version=cap.capability_version,
            lifecycle=cap.lifecycle,
            sunset_at=cap.sunset_at,
            capability=cap,
            price=Price(
                com.price_version,
                com.currency,
                com.price_micros_per_output_second,
                com.price_micros_per_output_second_with_audio,
            ),
        )

    def __post_init__(self) -> None:
        object.__setattr__(self, "id", f"{self.provider}/{self.model}/{self.account}")
        keys = {
            "id": self.id,
            "eligible": None,
            "provider": self.provider,
            "account": self.account,
            "account_id": self.account_id,
            "region": self.region,
            "model": self.model,
            "model_version": self.model_version,
            "capability_version": self.capability_version,
            "price_version": self.price.price_version,
            "lifecycle": self.lifecycle,
            "currency": self.price.currency,
            "estimated_cost_micros": None,
        }
        object.__setattr__(self, "explain_keys", keys)
        rest = {k: v for k, v in keys.items() if k not in ("id", "eligible")}
        del rest["estimated_cost_micros"]  # the last key: its value follows per verdict
        head = '{"id":' + json.dumps(self.id, ensure_ascii=False) + ',"eligible":'
        mid = "," + json.dumps(rest, ensure_ascii=False, separators=(",", ":"))[1:-1]
        text = (head.encode(), (mid + ',"estimated_cost_micros":').encode())
        object.__setattr__(self, "explain_text", text)

    @property
    def lease_account(self) -> str:
        """The lease store's account scope (hash tag) for this candidate."""
        return f"{self.provider}:{self.account}"


@dataclass(frozen=True, slots=True)
class CompileResult:
    """The adapter's verdict for one candidate; `error` is set when compile itself failed.

    `transient` marks an `error` that is no verdict at all: the sidecar did not answer (a
    timeout, UNAVAILABLE, a broken connection, its COMPILE breaker open). Routing skips the
    candidate for now (COMPILE_UNAVAILABLE) instead of rejecting it."""

    submittable: bool
    transformations: tuple[tuple[str, TransformKind, str], ...] = ()
    estimated_cost_micros: int = 0
    currency: str = "USD"
    request_hash: str = ""
    error: str = ""
    transient: bool = False


@dataclass(frozen=True, slots=True)
class CapacityView:
    """Lease pre-check: free slots of the tightest dimension, and whether new work is accepted.

    `closed` names a rate or budget window of the account that is full (its limit and reopening,
    9.11): no slot is free however many the dimensions have, until it reopens."""

    available: int
    maximum: int
    accepting_new: bool = True
    closed: str = ""


@dataclass(frozen=True, slots=True)
class BurstView:
    """The 1-minute window's figures beside the routing window's (9.13.3 "发现突发退化"):
    `applied` when its burst was beyond doubt and its lower bound is the success component."""

    samples: float
    success_rate: float | None
    success_lower_bound: float
    applied: bool = False


@dataclass(frozen=True, slots=True)
class HealthView:
    """Health figures of a candidate from the EWMA windows (9.13.3).

    The first five are what scoring reads (and replay re-reads); the rest are explain only,
    what a decision shows with them: which window `samples` and the latencies came from
    (``15m``, or ``24h`` while the 15-minute window is empty), the burst window, the learned
    call-latency baselines per operation (9.15.1) and why its breaker left CLOSED, if it did.
    """

    success_lower_bound: float
    samples: float
    mean_latency_s: float | None = None
    success_rate: float | None = None  # the point estimate; replay's expected success
    p95_latency_s: float | None = None  # predicted p95 (9.13.2): the latency score reads it
    window: str = ""  # the routing window the figures above are from: "15m" or "24h"
    burst: BurstView | None = None
    baselines_s: tuple[tuple[str, float], ...] = ()  # (operation, seconds), learned ones only
    breaker_opened_for: str = ""  # `CircuitBreaker.opened_for` of its SUBMIT or account breaker

    @property
    def latency_s(self) -> float | None:
        """The latency the score reads: the predicted p95, else the mean (older records)."""
        return self.p95_latency_s if self.p95_latency_s is not None else self.mean_latency_s


@dataclass(frozen=True, slots=True)
class Incumbent:
    """The candidate this routing group used last, and since when (seconds, any clock)."""

    candidate_id: str
    since_s: float


@dataclass(frozen=True)
class RoutingContext:
    """Dynamic facts at decision time; every mapping is keyed by candidate id."""

    now: datetime
    circuit_open: Mapping[str, str] = field(default_factory=dict)
    capacity: Mapping[str, CapacityView] = field(default_factory=dict)
    health: Mapping[str, HealthView] = field(default_factory=dict)
    quality: Mapping[str, float] = field(default_factory=dict)
    # What each `quality` figure was made of, and the task's tag bucket they are from (9.14):
    # explain only, recorded in the decision's facts.
    quality_evidence: Mapping[str, QualityEvidence] = field(default_factory=dict)
    quality_bucket: str = ""
    excluded: frozenset[tuple[int, str]] = frozenset()  # (account_id, model) from failover
    # Softly excluded (account_id, model) -> not before this instant (None: no wait).
    soft_excluded: Mapping[tuple[int, str], datetime | None] = field(default_factory=dict)
    soft_lifted: bool = False  # the second pass: soft exclusions no longer apply
    same_model_only: str = ""  # a STRICT task's requeue: only this model
    allowed_regions: frozenset[str] | None = None  # tenant/compliance policy; None = any
    preferred_regions: tuple[str, ...] = ()
    incumbent: Incumbent | None = None
    canary_stages: Mapping[str, int] = field(default_factory=dict)
    load: Mapping[str, LoadView] = field(default_factory=dict)  # model-server load (9.21)
    # The tenant's routing scenario (9.13's table, e.g. AD_PRODUCTION): the policy's weight set
    # of that name scores the task when it has one; "" or unknown: the service class's.
    scenario: str = ""
    # The active accounts document: a disabled account's candidates are ACCOUNT_DISABLED, an
    # account's regions bound where its candidates run; None: every account enabled everywhere.
    accounts: Accounts | None = None

    @property
    def accounts_version(self) -> str:
        return "" if self.accounts is None else self.accounts.version


def catalog_version(candidates: Sequence[Candidate]) -> str:
    """A short digest of the capability and price versions a decision was made against."""
    parts = sorted(f"{c.id}@{c.capability_version}#{c.price.price_version}" for c in candidates)
    return "cat-" + hashlib.sha256("\n".join(parts).encode()).hexdigest()[:12]
