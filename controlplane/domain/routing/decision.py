"""The explainable routing decision (design 9.10.2): every candidate's fate and the choice made.

A `RouteDecisionSnapshot` is what ``route_decisions.candidate_snapshot`` stores: one `Verdict` per
candidate (eligible or the `filters.Reason` it was refused for, its score and components, its
compile plan), the `Outcome`, and the ranked lease fall-through order whose head is the selection.
The dispatcher records the lease outcome with `after_leasing`.

Outcomes: SELECTED; NO_CAPACITY when nothing is eligible but some candidate was refused only for a
transient reason (capacity, an open breaker, a retry backoff): the task stays QUEUED; otherwise
NO_ELIGIBLE_CANDIDATE and the task fails with every candidate's reason (`failure_message`).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from enum import StrEnum
from typing import Any

from controlplane.domain.breaker import opened_for_in, opened_on_slow_calls
from controlplane.domain.quality import QualityEvidence
from controlplane.domain.routing.candidates import (
    Candidate,
    CapacityView,
    CompileResult,
    HealthView,
    Incumbent,
)
from controlplane.domain.routing.filters import Reason
from controlplane.domain.routing.load import LoadView

#: The score components of a verdict, in the order `scoring.ScoreComponents` declares them.
COMPONENT_NAMES = ("quality", "success", "latency", "cost", "capacity", "region", "preference")

#: ``round(x, 6)`` per float value already rounded: CPython rounds through a decimal conversion
#: (~0.5 us), and a decision's components repeat across tasks (quality, region, preference,
#: the same health and price). Dropped whole past the bound.
_ROUNDED: dict[float, float] = {}
ROUNDED_CACHE_SIZE = 65536


def round6(x: float) -> float:
    """Exactly ``round(x, 6)``, remembered per value. Only non-zero floats are remembered: an int
    and its float (1 and 1.0) or 0.0 and -0.0 are equal keys that round to different values."""
    if type(x) is not float or not x:
        return round(x, 6)
    r = _ROUNDED.get(x)
    if r is None:
        if len(_ROUNDED) >= ROUNDED_CACHE_SIZE:
            _ROUNDED.clear()
        r = _ROUNDED[x] = round(x, 6)
    return r


class Components(Mapping[str, float]):
    """A verdict's score components, rounded to 6 places when first read (the explain view).

    The decision loop keeps the raw floats; the dict is built only when something reads it,
    e.g. `Verdict.to_json` when the decision is stored."""

    __slots__ = ("_raw", "_rounded")

    def __init__(self, raw: tuple[float, ...]) -> None:
        self._raw = raw
        self._rounded: dict[str, float] | None = None

    def _view(self) -> dict[str, float]:
        if self._rounded is None:
            self._rounded = {n: round6(x) for n, x in zip(COMPONENT_NAMES, self._raw, strict=True)}
        return self._rounded

    def __getitem__(self, name: str) -> float:
        return self._view()[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._view())

    def __len__(self) -> int:
        return len(self._raw)

    def as_dict(self) -> dict[str, float]:
        """A plain copy of the rounded view: one dict copy, not a lookup per key through the
        Mapping protocol (that was ~9% of dispatch CPU when every decision is stored)."""
        return dict(self._view())

    def __repr__(self) -> str:
        return f"Components({self._view()!r})"

    @property
    def raw(self) -> tuple[float, ...]:
        """The unrounded components, in `COMPONENT_NAMES` order (what replay re-weights)."""
        return self._raw


class Outcome(StrEnum):
    SELECTED = "SELECTED"
    NO_CAPACITY = "NO_CAPACITY"
    NO_ELIGIBLE_CANDIDATE = "NO_ELIGIBLE_CANDIDATE"


@dataclass(slots=True)
class Verdict:
    """One candidate's fate in a decision; a value: never changed once made (`after_leasing`
    makes new ones). Not ``frozen``: a frozen dataclass's ``__init__`` sets each field through
    ``object.__setattr__``, 4x the cost of building one per candidate per decision."""

    candidate: Candidate
    eligible: bool
    reason: str = ""
    detail: str = ""
    score: float | None = None
    components: Mapping[str, float] = field(default_factory=dict)
    penalties: Mapping[str, float] = field(default_factory=dict)
    estimated_cost_micros: int | None = None
    compile: CompileResult | None = None
    canary: bool = False

    def to_json(self) -> dict[str, Any]:
        data = self.candidate.explain_keys.copy()  # the static keys, in their stored order
        data["eligible"] = self.eligible
        data["estimated_cost_micros"] = self.estimated_cost_micros
        data.update(self.explain_rest())
        return data

    def explain_rest(self) -> dict[str, Any]:
        """The keys of `to_json` after the candidate's static ones and the estimate: what this
        verdict adds (reason, score and components, penalties, transformations, ...), in their
        stored order (``persistence.explain`` appends them to the candidate's static text)."""
        data: dict[str, Any] = {}
        if not self.eligible:
            data["reason"] = self.reason
            data["detail"] = self.detail
        if self.score is not None:
            comps = self.components
            plain = comps.as_dict() if type(comps) is Components else dict(comps)
            data["score"] = round6(self.score)
            data["components"] = plain
        if self.penalties:
            data["penalties"] = dict(self.penalties)
        if self.compile is not None:
            data["transformations"] = [[f, k.value, d] for f, k, d in self.compile.transformations]
        if self.canary:
            data["canary"] = True
        if isinstance(self.components, Components):
            data["raw_components"] = list(self.components.raw)  # floats round-trip JSON exactly
        return data


@dataclass(frozen=True, slots=True)
class DecisionFacts:
    """The decision-time facts step 8 read beyond the verdicts, kept so that route replay
    (9.25.4, `replay`) re-runs scoring and selection exactly: held by reference when the
    decision is made, rendered once when it is stored (``facts`` in the snapshot)."""

    scenario: str  # which weights of the policy applied (`selection.scenario_for`)
    group_key: str  # the near-tie bucketing key: the tenant, else the task
    mode: str  # the spec's routing mode
    now: datetime
    incumbent: Incumbent | None = None
    pinned: frozenset[str] = frozenset()  # PREFERRED: the eligible candidates the pin names
    health: Mapping[str, HealthView] = field(default_factory=dict)
    #: Model-server load the scores read (9.21), explain only: its effect is in the components
    #: and the GPU_UTILIZATION penalty, which replay re-weights as recorded.
    load: Mapping[str, LoadView] = field(default_factory=dict)
    # Explain only, what the components read beyond the health figures: the quality bucket
    # and each candidate's prior against its evidence there (9.14); the cost line's ends (the
    # cheapest eligible estimate and the budget, 0 for none); the latency line's ends; each
    # candidate's lease pre-check (free slots of its tightest dimension, of how many).
    quality_bucket: str = ""
    quality: Mapping[str, QualityEvidence] = field(default_factory=dict)
    cheapest_cost_micros: int | None = None
    budget_micros: int = 0
    latency_good_s: float | None = None
    latency_bad_s: float | None = None
    capacity: Mapping[str, CapacityView] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        inc = self.incumbent
        data: dict[str, Any] = {
            "scenario": self.scenario,
            "group_key": self.group_key,
            "mode": self.mode,
            "now": self.now.isoformat(),
            "incumbent": None if inc is None else [inc.candidate_id, inc.since_s],
            "pinned": sorted(self.pinned),
            "health": {
                cid: [
                    h.success_lower_bound,
                    h.samples,
                    h.mean_latency_s,
                    h.success_rate,
                    h.p95_latency_s,
                ]
                for cid, h in self.health.items()
            },
        }
        if self.load:
            data["load"] = {cid: view.to_json() for cid, view in self.load.items()}
        signals = {cid: extra for cid, h in self.health.items() if (extra := _signals_json(h))}
        if signals:
            data["signals"] = signals
        if self.quality:
            data["quality"] = {
                "bucket": self.quality_bucket,
                "candidates": {
                    cid: [e.prior, e.from_document, e.checks, e.verdicts, e.score]
                    for cid, e in self.quality.items()
                },
            }
        if self.cheapest_cost_micros is not None:
            data["cost"] = {
                "cheapest_micros": self.cheapest_cost_micros,
                "budget_micros": self.budget_micros,
            }
        if self.latency_good_s is not None and self.latency_bad_s is not None:
            data["latency"] = {"good_s": self.latency_good_s, "bad_s": self.latency_bad_s}
        if self.capacity:
            data["capacity"] = {cid: [v.available, v.maximum] for cid, v in self.capacity.items()}
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> DecisionFacts:
        inc = data.get("incumbent")
        return cls(
            scenario=str(data["scenario"]),
            group_key=str(data["group_key"]),
            mode=str(data["mode"]),
            now=datetime.fromisoformat(data["now"]),
            incumbent=None if inc is None else Incumbent(str(inc[0]), float(inc[1])),
            pinned=frozenset(data.get("pinned", ())),
            health={
                # A record from before the p95 (four fields) scored on the mean.
                cid: HealthView(float(h[0]), float(h[1]), h[2], h[3], h[4] if len(h) > 4 else None)
                for cid, h in dict(data.get("health", {})).items()
            },
        )


def _signals_json(h: HealthView) -> dict[str, Any]:
    """A health view's explain-only figures (`HealthView`), as the facts' ``signals`` keep
    them; empty when it has none."""
    out: dict[str, Any] = {}
    if h.window:
        out["window"] = h.window
    burst = h.burst
    if burst is not None:
        out["burst"] = [
            burst.samples,
            burst.success_rate,
            burst.success_lower_bound,
            burst.applied,
        ]
    if h.baselines_s:
        out["baselines_s"] = dict(h.baselines_s)
    if h.breaker_opened_for:
        out["breaker_opened_for"] = h.breaker_opened_for
    return out


@dataclass(frozen=True)
class RouteDecisionSnapshot:
    """The explainable decision (9.10.2), stored in ``route_decisions.candidate_snapshot``."""

    task_id: str
    outcome: Outcome
    policy_version: str
    catalog_version: str
    verdicts: tuple[Verdict, ...]
    ranked: tuple[str, ...]  # lease fall-through order; first is the selection
    selection_reason: str = ""
    bucket: int | None = None
    shadow_policy_version: str = ""
    shadow_selected: str = ""
    shadow_scores: Mapping[str, float] = field(default_factory=dict)
    lease_refused: tuple[str, ...] = ()
    facts: DecisionFacts | None = None  # None when nothing was scored

    @property
    def selected(self) -> str | None:
        return self.ranked[0] if self.outcome is Outcome.SELECTED and self.ranked else None

    def verdict(self, candidate_id: str) -> Verdict:
        return next(v for v in self.verdicts if v.candidate.id == candidate_id)

    @property
    def capability_version(self) -> str:
        """The selected candidate's capability version, else the catalog's version."""
        chosen = self.selected
        return self.verdict(chosen).candidate.capability_version if chosen else self.catalog_version

    def after_leasing(
        self,
        leased: str | None,
        refused: Sequence[str],
        why: Mapping[str, str] | None = None,
    ) -> RouteDecisionSnapshot:
        """Record the lease outcome: refused candidates become NO_CAPACITY (with `why`'s detail
        when the store said why, e.g. a full window); `leased` is selected. The head of the
        ranking leased at once changes nothing: the snapshot itself (a value)."""
        if not refused and not self.lease_refused and self.ranked[:1] == (leased,):
            return self
        gone = set(refused)
        verdicts = tuple(
            replace(
                v,
                eligible=False,
                reason=Reason.NO_CAPACITY.value,
                detail=(why or {}).get(v.candidate.id, "lease refused at acquire"),
            )
            if v.candidate.id in gone
            else v
            for v in self.verdicts
        )
        if leased is None:
            return replace(
                self,
                outcome=Outcome.NO_CAPACITY,
                verdicts=verdicts,
                ranked=(),
                lease_refused=tuple(refused),
                selection_reason="all_leases_refused",
            )
        rest = tuple(c for c in self.ranked if c != leased and c not in gone)
        reason = self.selection_reason if not gone else "lease_fallthrough"
        return replace(
            self,
            verdicts=verdicts,
            ranked=(leased, *rest),
            lease_refused=tuple(refused),
            selection_reason=reason,
        )

    def failure_message(self) -> str:
        """One line per rejected candidate: why nothing could run."""
        return (
            "; ".join(
                f"{v.candidate.id}: {v.reason} ({v.detail})"
                for v in self.verdicts
                if not v.eligible
            )
            or "no candidates in the capability catalog"
        )

    def to_json(self, candidates: object = None) -> dict[str, Any]:
        """The stored explain record as JSON values; `candidates` stands in for the verdicts'
        rendering when the caller has its own (``persistence.explain``: their JSON text,
        built once), else each verdict's `Verdict.to_json`."""
        data: dict[str, Any] = {
            "task_id": self.task_id,
            "outcome": self.outcome.value,
            "policy_version": self.policy_version,
            "catalog_version": self.catalog_version,
            "capability_version": self.capability_version,
            "selected": self.selected,
            "ranked": list(self.ranked),
            "selection_reason": self.selection_reason,
            "candidates": (
                [v.to_json() for v in self.verdicts] if candidates is None else candidates
            ),
        }
        if self.bucket is not None:
            data["bucket"] = self.bucket
        if self.lease_refused:
            data["lease_refused"] = list(self.lease_refused)
        if self.shadow_policy_version:
            data["shadow"] = {
                "policy_version": self.shadow_policy_version,
                "selected": self.shadow_selected,
                "scores": dict(self.shadow_scores),
                "executed": False,
            }
            data["shadow_selected"] = self.shadow_selected
        if self.facts is not None:
            data["facts"] = self.facts.to_json()
        return data


# The health window's figures of a stored decision (``facts.health``), in their stored order.
_HEALTH_INPUTS = (
    "success_lower_bound",
    "window_samples",
    "mean_latency_s",
    "success_rate",
    "p95_latency_s",
)


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _candidate(snapshot: Mapping[str, Any], candidate_id: str) -> Mapping[str, Any]:
    for c in snapshot.get("candidates") or ():
        if isinstance(c, Mapping) and c.get("id") == candidate_id:
            return c
    return {}


def candidate_inputs(snapshot: Mapping[str, Any], candidate_id: str) -> dict[str, float]:
    """What `candidate_id`'s score components read, from a stored decision's snapshot, by
    component (each name says which):

    - success and latency: the routing window's success lower bound and rate, its effective
      samples (``window_samples``: the evidence; `candidate_explain` names the window), mean
      and predicted p95 latency; the burst (1-minute) window's ``burst_samples``,
      ``burst_success_rate``, ``burst_success_lower_bound`` and ``burst_applied`` (1 when the
      burst's lower bound was the success component); the latency line's ``latency_good_s``
      and ``latency_bad_s``;
    - quality: ``quality_prior`` against the evidence of the task's bucket
      (``quality_checks`` technical checks + ``quality_verdicts`` caller verdicts =
      ``quality_evidence``) and ``quality_shrunk``, the score they shrank to;
    - cost: ``cost_estimate_micros`` (this candidate's) against ``cost_cheapest_micros`` (the
      cheapest eligible one's) and, under a budget, ``cost_budget_micros``;
    - capacity: ``capacity_available`` of ``capacity_maximum`` slots; a self-hosted model
      server's load as ``load_*``.

    Only what the record holds: empty for a candidate without evidence that was not scored,
    and for records from before facts were kept."""
    facts = snapshot.get("facts") or {}
    out: dict[str, float] = {}
    health = (facts.get("health") or {}).get(candidate_id)
    for name, value in zip(_HEALTH_INPUTS, health or (), strict=False):
        if _number(value):
            out[name] = float(value)
    burst = ((facts.get("signals") or {}).get(candidate_id) or {}).get("burst") or ()
    for name, value in zip(_BURST_INPUTS, burst, strict=False):
        if isinstance(value, bool):
            out[name] = 1.0 if value else 0.0
        elif _number(value):
            out[name] = float(value)
    load = (facts.get("load") or {}).get(candidate_id) or {}
    for name, value in load.items():
        if _number(value):
            out[f"load_{name}"] = float(value)
    quality = ((facts.get("quality") or {}).get("candidates") or {}).get(candidate_id)
    if quality:
        prior, _, checks, verdicts, shrunk = quality
        out.update(
            quality_prior=float(prior),
            quality_checks=float(checks),
            quality_verdicts=float(verdicts),
            quality_evidence=float(checks + verdicts),
            quality_shrunk=float(shrunk),
        )
    verdict = _candidate(snapshot, candidate_id)
    if "score" not in verdict:
        return out  # the decision-wide lines below are the ends of a scored candidate's only
    cost = facts.get("cost") or {}
    estimate = verdict.get("estimated_cost_micros")
    if cost and isinstance(estimate, int | float):
        out["cost_estimate_micros"] = float(estimate)
        out["cost_cheapest_micros"] = float(cost["cheapest_micros"])
        if cost.get("budget_micros"):
            out["cost_budget_micros"] = float(cost["budget_micros"])
    latency = facts.get("latency") or {}
    if latency:
        out.update(latency_good_s=float(latency["good_s"]), latency_bad_s=float(latency["bad_s"]))
    capacity = (facts.get("capacity") or {}).get(candidate_id)
    if capacity:
        out.update(capacity_available=float(capacity[0]), capacity_maximum=float(capacity[1]))
    return out


_BURST_INPUTS = (
    "burst_samples",
    "burst_success_rate",
    "burst_success_lower_bound",
    "burst_applied",
)


@dataclass(frozen=True, slots=True)
class CandidateExplain:
    """The non-numeric half of what a candidate's components read (`candidate_inputs` has the
    figures): the routing window its success and latency figures are from (``15m``, ``24h``
    while that was empty; "" without evidence), the learned call-latency baselines per
    operation (9.15.1), why its breaker left CLOSED ("" when it had not; a candidate refused
    as CIRCUIT_OPEN has it from its detail, `breaker.open_detail`) and whether that was on
    slow calls (9.15.2), and where its quality prior came from (``capability_document``,
    ``default``; "" when not recorded)."""

    window: str = ""
    baselines_s: Mapping[str, float] = field(default_factory=dict)
    breaker_opened_for: str = ""
    opened_on_slow_calls: bool = False
    quality_prior_source: str = ""


def candidate_explain(snapshot: Mapping[str, Any], candidate_id: str) -> CandidateExplain:
    """`CandidateExplain` of `candidate_id` from a stored decision's snapshot."""
    facts = snapshot.get("facts") or {}
    signals = (facts.get("signals") or {}).get(candidate_id) or {}
    quality = ((facts.get("quality") or {}).get("candidates") or {}).get(candidate_id)
    opened = str(signals.get("breaker_opened_for", ""))
    verdict = _candidate(snapshot, candidate_id)
    if not opened and verdict.get("reason") == Reason.CIRCUIT_OPEN.value:
        opened = opened_for_in(str(verdict.get("detail", "")))  # refused: no health view read
    source = ""
    if quality:
        source = "capability_document" if quality[1] else "default"
    return CandidateExplain(
        str(signals.get("window", "")),
        {str(k): float(v) for k, v in (signals.get("baselines_s") or {}).items()},
        opened,
        opened_on_slow_calls(opened),
        source,
    )


def quality_bucket(snapshot: Mapping[str, Any]) -> str:
    """The tag bucket (9.14) whose quality evidence a stored decision read; "" when none."""
    return str(((snapshot.get("facts") or {}).get("quality") or {}).get("bucket", ""))
