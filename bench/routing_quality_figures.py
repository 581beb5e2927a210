"""The figures of the routing-quality benchmark (`bench.routing_quality`), from its task rows.

Pure: task rows in, figures out; no I/O. One `TaskRow` per task the run created, with every
attempt's provider, model, state and cost as the control plane stored them.

* **Billed cost** of an attempt: the provider's settled cost (``actual_cost_micros``) when the
  sidecar reported one, else the estimate for an attempt that SUCCEEDED and 0 for one that did
  not: so a failure costs what that provider bills for it (Runway bills 0 credits for a failed
  task, Veo bills no failed operation, the self-hosted cluster bills its GPU seconds).
* **Cost per success** of a policy: every billed micro of its tasks over its SUCCEEDED tasks.
* **p95 end to end**: CreateTask to the terminal state, over every task (failed ones too).
* **Switches**: a policy's tasks in creation order are cut into `buckets_per_phase` buckets per
  phase; a bucket's *choice* is the candidate most of its tasks' first attempts went to; a switch
  is a bucket whose choice differs from the previous bucket's. An **oscillation** is a switch
  back to the choice of two buckets before (A -> B -> A).
* **Oracle** (it knows the schedule, it does not route): per phase, every candidate's measured
  figures over all the policies' tasks whose first attempt went to it that phase (cost per
  success, failure rate, latency samples, and how many tasks it served per policy: a saturated
  candidate serves no more than that); the phase's p95 bound is a factor times the best p95
  measured that phase (the control plane's own queueing moves every latency from phase to
  phase, so a bound fixed for the run would say nothing); the oracle fills candidates cheapest
  first (by measured cost per success) among those whose measured p95 meets the bound, each
  up to the tasks it
  served per policy, and takes the rest from the cheapest candidate that meets the bound
  without a cap. Its p95 is the p95 of those candidates' latency samples weighted by the shares
  it gave them; its cost per success is the shares' billed cost over their successes.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import pairwise


@dataclass(frozen=True)
class AttemptRow:
    """One attempt as stored: its candidate, final state and costs (micros)."""

    candidate: str  # provider/model
    state: str
    estimated_micros: int
    actual_micros: int | None

    @property
    def billed_micros(self) -> int:
        if self.actual_micros is not None:
            return self.actual_micros
        return self.estimated_micros if self.state == "SUCCEEDED" else 0


@dataclass(frozen=True)
class TaskRow:
    """One task of the run: which policy and variant made it, in which phase, and its end."""

    policy: str
    variant: str
    phase: str
    seq: int  # creation order within (policy, variant)
    state: str  # the task's state when the run read it
    latency_s: float  # CreateTask to the terminal state (wall seconds)
    attempts: tuple[AttemptRow, ...] = ()

    @property
    def billed_micros(self) -> int:
        return sum(a.billed_micros for a in self.attempts)

    @property
    def first_candidate(self) -> str:
        return self.attempts[0].candidate if self.attempts else ""

    @property
    def succeeded(self) -> bool:
        return self.state == "SUCCEEDED"


@dataclass(frozen=True)
class PolicyFigures:
    """What the benchmark reports for one policy in one variant."""

    tasks: int
    successes: int
    failures: int
    cost_per_success_micros: float
    p95_s: float
    switches: int
    oscillations: int
    choices: tuple[str, ...] = ()  # the bucket choices, in order
    per_phase: Mapping[str, Mapping[str, int]] = field(default_factory=dict)  # first candidates


def p95(samples: Sequence[float]) -> float:
    """The nearest-rank 95th percentile (0 for no samples)."""
    if not samples:
        return 0.0
    ordered = sorted(samples)
    return ordered[max(0, math.ceil(0.95 * len(ordered)) - 1)]


def weighted_p95(samples: Iterable[tuple[float, float]]) -> float:
    """The 95th percentile of (value, weight) samples: the smallest value whose cumulative
    weight reaches 95% of the whole."""
    ordered = sorted((v, w) for v, w in samples if w > 0)
    whole = sum(w for _, w in ordered)
    if whole <= 0:
        return 0.0
    seen = 0.0
    for value, weight in ordered:
        seen += weight
        if seen >= 0.95 * whole - 1e-12:
            return value
    return ordered[-1][0]


def bucket_choices(tasks: Sequence[TaskRow], phases: Sequence[str], per_phase: int) -> list[str]:
    """The majority first candidate of each bucket, phases in order (empty buckets skipped)."""
    out: list[str] = []
    for phase in phases:
        rows = sorted((t for t in tasks if t.phase == phase), key=lambda t: t.seq)
        if not rows:
            continue
        size = max(1, math.ceil(len(rows) / per_phase))
        for start in range(0, len(rows), size):
            chosen = Counter(t.first_candidate for t in rows[start : start + size] if t.attempts)
            if chosen:
                # most_common breaks ties by first seen; sort for a stable answer instead
                out.append(min(chosen, key=lambda c: (-chosen[c], c)))
    return out


def switches_and_oscillations(choices: Sequence[str]) -> tuple[int, int]:
    switches = sum(1 for a, b in pairwise(choices) if a != b)
    oscillations = sum(
        1
        for i in range(2, len(choices))
        if choices[i] != choices[i - 1] and choices[i] == choices[i - 2]
    )
    return switches, oscillations


def policy_figures(
    tasks: Sequence[TaskRow], phases: Sequence[str], buckets_per_phase: int = 4
) -> PolicyFigures:
    successes = sum(1 for t in tasks if t.succeeded)
    billed = sum(t.billed_micros for t in tasks)
    choices = bucket_choices(tasks, phases, buckets_per_phase)
    switches, oscillations = switches_and_oscillations(choices)
    per_phase = {
        phase: dict(Counter(t.first_candidate for t in tasks if t.phase == phase and t.attempts))
        for phase in phases
    }
    return PolicyFigures(
        tasks=len(tasks),
        successes=successes,
        failures=len(tasks) - successes,
        cost_per_success_micros=billed / successes if successes else math.inf,
        p95_s=p95([t.latency_s for t in tasks]),
        switches=switches,
        oscillations=oscillations,
        choices=tuple(choices),
        per_phase=per_phase,
    )


@dataclass(frozen=True)
class CandidatePhase:
    """A candidate's measured figures in one phase, over every policy's tasks that went to it."""

    candidate: str
    tasks: int
    successes: int
    billed_micros: int
    latencies: tuple[float, ...]
    served_per_policy: float  # the most tasks any one policy got through it this phase

    @property
    def cost_per_success(self) -> float:
        return self.billed_micros / self.successes if self.successes else math.inf

    @property
    def p95_s(self) -> float:
        return p95(self.latencies)


def candidate_phases(tasks: Sequence[TaskRow], phase: str) -> list[CandidatePhase]:
    by: dict[str, list[TaskRow]] = {}
    for t in tasks:
        if t.phase == phase and t.attempts:
            by.setdefault(t.first_candidate, []).append(t)
    out = []
    for candidate, rows in sorted(by.items()):
        per_policy = Counter((t.policy, t.variant) for t in rows)
        out.append(
            CandidatePhase(
                candidate=candidate,
                tasks=len(rows),
                successes=sum(1 for t in rows if t.succeeded),
                billed_micros=sum(t.billed_micros for t in rows),
                latencies=tuple(t.latency_s for t in rows),
                served_per_policy=float(max(per_policy.values())),
            )
        )
    return out


@dataclass(frozen=True)
class OraclePhase:
    shares: Mapping[str, float]  # candidate -> tasks the oracle gives it
    cost_micros: float
    successes: float
    latencies: tuple[tuple[float, float], ...]  # (latency, weight)


def oracle_phase(
    measured: Sequence[CandidatePhase],
    demand: int,
    bound_s: float,
    allowed: frozenset[str] | None = None,
) -> OraclePhase:
    """The oracle's plan for one phase of `demand` tasks (see the module docstring)."""
    usable = [
        c
        for c in measured
        if c.successes and (allowed is None or c.candidate.split("/")[0] in allowed)
    ]
    meeting = sorted((c for c in usable if c.p95_s <= bound_s), key=lambda c: c.cost_per_success)
    if not meeting:  # nothing meets the bound: the fastest is the best the oracle can do
        meeting = sorted(usable, key=lambda c: c.p95_s)[:1]
    shares: dict[str, float] = {}
    left = float(demand)
    for c in meeting:
        if left <= 0:
            break
        take = min(left, c.served_per_policy)
        shares[c.candidate] = take
        left -= take
    if left > 0 and meeting:
        # the rest to the cheapest that can take more than it showed (not the saturated one):
        # the candidate that served the most per policy is the least saturated
        spare = max(meeting, key=lambda c: (c.served_per_policy, -c.cost_per_success))
        shares[spare.candidate] = shares.get(spare.candidate, 0.0) + left
    cost = successes = 0.0
    latencies: list[tuple[float, float]] = []
    for c in usable:
        n = shares.get(c.candidate, 0.0)
        if not n:
            continue
        cost += n * c.billed_micros / c.tasks
        successes += n * c.successes / c.tasks
        latencies.extend((lat, n / c.tasks) for lat in c.latencies)
    return OraclePhase(shares, cost, successes, tuple(latencies))


def phase_bound(measured: Sequence[CandidatePhase], factor: float) -> float:
    """A phase's latency bound: `factor` times the best measured p95 of the phase."""
    return factor * min((c.p95_s for c in measured if c.successes), default=0.0)


def oracle_figures(
    tasks: Sequence[TaskRow],
    phases: Sequence[str],
    demand_per_phase: Mapping[str, int],
    bound_factor: float,
    allowed: frozenset[str] | None = None,
) -> tuple[PolicyFigures, list[OraclePhase]]:
    plans = []
    for p in phases:
        measured = [
            c
            for c in candidate_phases(tasks, p)
            if allowed is None or c.candidate.split("/")[0] in allowed
        ]
        bound = phase_bound(measured, bound_factor)
        plans.append(oracle_phase(measured, demand_per_phase[p], bound, allowed))
    cost = sum(p.cost_micros for p in plans)
    successes = sum(p.successes for p in plans)
    demand = sum(demand_per_phase[p] for p in phases)
    choices = [max(p.shares, key=lambda c: p.shares[c]) for p in plans if p.shares]
    switches, oscillations = switches_and_oscillations(choices)
    figures = PolicyFigures(
        tasks=demand,
        successes=round(successes),
        failures=round(demand - successes),
        cost_per_success_micros=cost / successes if successes else math.inf,
        p95_s=weighted_p95(lat for p in plans for lat in p.latencies),
        switches=switches,
        oscillations=oscillations,
        choices=tuple(choices),
        per_phase={
            phase: {c: round(n) for c, n in plan.shares.items()}
            for phase, plan in zip(phases, plans, strict=True)
        },
    )
    return figures, plans
