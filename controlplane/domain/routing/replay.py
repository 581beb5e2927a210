"""Route replay (design 9.25.4): what a candidate policy would have done with recorded traffic.

A recorded decision (``route_decisions.candidate_snapshot``) holds every candidate's verdict,
the unrounded score components of each scored one (``raw_components``) and the facts step 8
read (``facts``: scenario, near-tie key, routing mode, clock, incumbent, PREFERRED pins,
health). Replay re-weights the recorded components with the candidate policy through the very
code routing runs (`selection.weight_vector`, `selection.weighted_total`, `selection.choose`:
hysteresis/dwell against the incumbent, consistent-hash near-tie bucketing, canaries first),
then walks the ranked list past the candidates that refused a lease when the decision was made.
Nothing calls a provider; no I/O.

What a policy cannot change is taken from the record: the hard-filter verdicts (a policy holds
no hard constraint), canary admission (the stage and share the leader applied), the components
(health, capacity, cost and quality at that time). So only a candidate the recorded decision
scored can be replayed as the pick: one it rejected on a hard constraint is impossible by
construction (``hard_filter_differences`` counts any, and stays empty). A decision that scored
candidates but predates the facts record cannot be re-decided and is skipped (``skipped``).

Figures, per policy over the decisions replayed (the recorded ones use the recorded picks):

- ``estimated_cost_micros`` = sum of the picks' recorded ``estimated_cost_micros``;
- expected success of a pick = the success rate of its health window at decision time
  (``facts.health``), 0.5 without samples; ``expected_success`` is their mean;
- ``expected_latency_s`` = mean of the picks' window mean latency (picks without one left out);
- ``cost_per_success_micros`` = cost / sum of expected successes; its interval divides the cost
  by the sums of the picks' Wilson bounds (95 %, n = the window's effective samples; [0, 1] with
  none): low = cost / sum(upper), high = cost / sum(lower), 0 when that sum is 0 (unbounded).
  Summing bounds treats the picks of one candidate as fully correlated (they share a window),
  so the interval is conservative.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from math import fsum
from typing import Any

from controlplane.domain import scoring
from controlplane.domain.routing.decision import DecisionFacts
from controlplane.domain.routing.selection import choose, weight_vector, weighted_total

MAX_CHANGES = 1_000
NO_DATA_SUCCESS = 0.5


@dataclass(frozen=True, slots=True)
class Recorded:
    """One stored decision, as the replay reads it."""

    task_id: str
    decision_no: int
    snapshot: Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class Replayed:
    """One decision re-run: the recorded pick and the candidate policy's."""

    task_id: str
    decision_no: int
    recorded_selected: str | None
    selected: str | None
    ranked: tuple[str, ...]  # after the recorded lease refusals, as the dispatcher stores it
    selection_reason: str
    scores: Mapping[str, float] = field(default_factory=dict)  # unrounded, of the scored


@dataclass(frozen=True, slots=True)
class ReplayChange:
    task_id: str
    decision_no: int
    recorded_selected: str
    replayed_selected: str
    cost_delta_micros: int


@dataclass(frozen=True, slots=True)
class ReplayTotals:
    policy_version: str
    selected: int
    estimated_cost_micros: int
    expected_success: float
    expected_latency_s: float
    cost_per_success_micros: int
    cost_per_success_low_micros: int
    cost_per_success_high_micros: int


@dataclass(frozen=True, slots=True)
class ReplayReport:
    decisions: int
    changed: int
    recorded: ReplayTotals
    replayed: ReplayTotals
    changes: tuple[ReplayChange, ...]
    hard_filter_differences: Mapping[str, int]
    shadow_agreements: int
    shadow_recorded: int
    skipped: int


def replay_one(record: Recorded, policy: scoring.RoutingPolicy) -> Replayed | None:
    """Re-decide one recorded decision under `policy`; None when it cannot be (no facts)."""
    snap = record.snapshot
    recorded = snap.get("selected") or None
    scored = [c for c in snap.get("candidates", ()) if "raw_components" in c]
    if not scored:  # nothing was eligible: the hard filters decided, and no policy changes them
        return Replayed(
            record.task_id,
            record.decision_no,
            recorded,
            recorded,
            tuple(snap.get("ranked", ())),
            str(snap.get("selection_reason", "")),
        )
    if "facts" not in snap:
        return None
    facts = DecisionFacts.from_json(snap["facts"])
    vector, cap = weight_vector(policy, facts.scenario)
    scores = {
        c["id"]: weighted_total(
            tuple(c["raw_components"]), vector, cap, fsum(c.get("penalties", {}).values())
        )
        for c in scored
    }
    ranked, why, _ = choose(
        facts, [(c["id"], bool(c.get("canary"))) for c in scored], scores, policy
    )
    refused = set(snap.get("lease_refused", ()))
    leased = next((cid for cid in ranked if cid not in refused), None)
    if leased is None:
        return Replayed(
            record.task_id, record.decision_no, recorded, None, (), "all_leases_refused", scores
        )
    rest = tuple(c for c in ranked if c != leased and c not in refused)
    if refused:
        why = "lease_fallthrough"
    prefix = str(snap.get("selection_reason", "")).partition(":")
    if prefix[1] and prefix[0] == "soft_exclusion_lifted":
        why = f"{prefix[0]}:{why}"
    return Replayed(
        record.task_id, record.decision_no, recorded, leased, (leased, *rest), why, scores
    )


def wilson_interval(rate: float, samples: float) -> tuple[float, float]:
    """95 % Wilson score interval of a success rate over (effective) samples; [0, 1] with none."""
    if samples <= 0:
        return 0.0, 1.0
    ok = min(max(rate, 0.0), 1.0) * samples
    low = scoring.wilson_lower_bound(ok, samples)
    high = 1.0 - scoring.wilson_lower_bound(samples - ok, samples)
    return low, high


@dataclass
class _Side:
    """Running totals of one policy's picks: a few numbers, whatever the decisions replayed
    (a week of traffic is millions; a list per figure would hold them all)."""

    versions: set[str] = field(default_factory=set)
    selected: int = 0
    cost: int = 0
    success: float = 0.0
    low: float = 0.0
    high: float = 0.0
    latency: float = 0.0
    latencies: int = 0  # picks with a window mean latency

    def add(self, pick: str | None, snap: Mapping[str, Any]) -> int:
        """Count a pick; answers its estimated cost (0 for none)."""
        if pick is None:
            return 0
        cost = _cost(snap, pick)
        self.selected += 1
        self.cost += cost
        h = dict(snap.get("facts", {}).get("health", {})).get(pick)
        samples, latency, rate = (0.0, None, None) if h is None else (h[1], h[2], h[3])
        p = rate if rate is not None and samples > 0 else NO_DATA_SUCCESS
        lo, hi = wilson_interval(p, samples if rate is not None else 0.0)
        self.success += p
        self.low += lo
        self.high += hi
        if latency is not None:
            self.latency += float(latency)
            self.latencies += 1
        return cost

    def totals(self, version: str) -> ReplayTotals:
        expected, lows, highs = self.success, self.low, self.high
        n = self.selected
        return ReplayTotals(
            policy_version=version,
            selected=n,
            estimated_cost_micros=self.cost,
            expected_success=expected / n if n else 0.0,
            expected_latency_s=self.latency / self.latencies if self.latencies else 0.0,
            cost_per_success_micros=round(self.cost / expected) if expected > 0 else 0,
            cost_per_success_low_micros=round(self.cost / highs) if highs > 0 else 0,
            cost_per_success_high_micros=round(self.cost / lows) if lows > 0 else 0,
        )


def _cost(snap: Mapping[str, Any], cid: str) -> int:
    for c in snap.get("candidates", ()):
        if c["id"] == cid:
            return int(c.get("estimated_cost_micros") or 0)
    return 0


class ReplayTally:
    """Folds replayed decisions page by page into one `ReplayReport`."""

    def __init__(self, policy: scoring.RoutingPolicy) -> None:
        self.policy = policy
        self._recorded, self._replayed = _Side(), _Side()
        self._decisions = self._changed = self._skipped = 0
        self._shadow_recorded = self._shadow_agreements = 0
        self._changes: list[ReplayChange] = []
        self._hard: dict[str, int] = {}

    def add_page(self, records: Iterable[Recorded]) -> list[Replayed]:
        out = []
        for record in records:
            r = replay_one(record, self.policy)
            if r is None:
                self._skipped += 1
                continue
            self._fold(record.snapshot, r)
            out.append(r)
        return out

    def _fold(self, snap: Mapping[str, Any], r: Replayed) -> None:
        self._decisions += 1
        self._recorded.versions.add(str(snap.get("policy_version", "")))
        before = self._recorded.add(r.recorded_selected, snap)
        after = self._replayed.add(r.selected, snap)
        if r.selected is not None:
            verdict = next(c for c in snap["candidates"] if c["id"] == r.selected)
            if "raw_components" not in verdict:  # impossible by construction; counted if not
                key = f"{verdict.get('reason', '')}->SELECTED"
                self._hard[key] = self._hard.get(key, 0) + 1
        shadow = snap.get("shadow")
        if shadow:
            self._shadow_recorded += 1
            if (shadow.get("selected") or None) == r.selected:
                self._shadow_agreements += 1
        if r.selected != r.recorded_selected:
            self._changed += 1
            if len(self._changes) < MAX_CHANGES:
                self._changes.append(
                    ReplayChange(
                        r.task_id,
                        r.decision_no,
                        r.recorded_selected or "",
                        r.selected or "",
                        after - before,
                    )
                )

    def report(self) -> ReplayReport:
        return ReplayReport(
            decisions=self._decisions,
            changed=self._changed,
            recorded=self._recorded.totals(",".join(sorted(self._recorded.versions))),
            replayed=self._replayed.totals(self.policy.version),
            changes=tuple(self._changes),
            hard_filter_differences=dict(self._hard),
            shadow_agreements=self._shadow_agreements,
            shadow_recorded=self._shadow_recorded,
            skipped=self._skipped,
        )
