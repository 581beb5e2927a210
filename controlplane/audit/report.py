"""What the invariant checker returns: stable invariant ids, violations and a readable report.

The ids are part of the contract with the soak and crash tests and with operators' alerting:
they never change meaning, and a new rule gets a new id instead of widening an old one. Each id
names the design rule it guards (9.3.4 numbers its seven domain invariants; the rest come from
9.8, 9.11.2 and the quiescence a finished soak run must reach).
"""

from __future__ import annotations

import enum
from collections import Counter
from dataclasses import dataclass, field

__all__ = ["DESCRIPTIONS", "Invariant", "InvariantReport", "Violation"]


class Invariant(enum.StrEnum):
    """The stable id of every rule the checker evaluates."""

    I1_ATTEMPT_BINDING = "I1_attempt_binding"
    I2_ATTEMPT_NUMBERING = "I2_attempt_numbering"
    I2B_ONE_JOB_PER_ATTEMPT = "I2b_one_job_per_attempt"
    I3_JOB_NEVER_OVERWRITTEN = "I3_job_never_overwritten"
    I4_SINGLE_ADOPTED_OUTPUT = "I4_single_adopted_output"
    I5_ADOPTION_STABLE = "I5_adoption_stable"
    I6_COST_PER_ATTEMPT = "I6_cost_per_attempt"
    I7_ROUTE_DECISION_EXPLAINED = "I7_route_decision_explained"
    I8_STATE_SANITY = "I8_state_sanity"
    I9_LEASE_ACCOUNTING = "I9_lease_accounting"
    I10_QUIESCENT = "I10_quiescent"


DESCRIPTIONS: dict[Invariant, str] = {
    Invariant.I1_ATTEMPT_BINDING: (
        "9.3.4#1 an attempt is bound to one account, model and compile plan; its provider job "
        "and its own history name the same account (and model)"
    ),
    Invariant.I2_ATTEMPT_NUMBERING: (
        "9.3.4#2 failover creates new attempts: attempt_no runs 1..n without gaps per task"
    ),
    Invariant.I2B_ONE_JOB_PER_ATTEMPT: "9.3.4#2 an attempt has at most one provider job",
    Invariant.I3_JOB_NEVER_OVERWRITTEN: (
        "9.3.4#3 every provider_job.recorded event of an attempt names the same job, the one "
        "stored; (account, provider_job_id) is unique"
    ),
    Invariant.I4_SINGLE_ADOPTED_OUTPUT: (
        "9.3.4#4 the adopted attempt is a SUCCEEDED attempt of the same task; SUCCEEDED <=> "
        "adopted attempt and output_asset; only SUCCEEDED carries output_asset"
    ),
    Invariant.I5_ADOPTION_STABLE: (
        "9.3.4#5 once a result is adopted it never changes and the task never returns to "
        "scheduling or execution"
    ),
    Invariant.I6_COST_PER_ATTEMPT: (
        "9.3.4#6 / 9.23.2 costs are integer micros >= 0 per attempt with an ISO-4217 currency"
    ),
    Invariant.I7_ROUTE_DECISION_EXPLAINED: (
        "9.3.4#7 / 9.10.2 every attempt points at its own route decision of the same task; every "
        "decision keeps a snapshot and a reason; decision_no runs 1..n"
    ),
    Invariant.I8_STATE_SANITY: (
        "9.8 status values are valid; a terminal task has no live attempt; a task has at most "
        "one live attempt"
    ),
    Invariant.I9_LEASE_ACCOUNTING: (
        "9.11.2 lease counters equal the usage implied by PostgreSQL; no lease is held for a "
        "finished or unknown attempt"
    ),
    Invariant.I10_QUIESCENT: (
        "(require_all_terminal) every task is terminal and no outbox message is left undone "
        "for a live or unknown task"
    ),
}


@dataclass(frozen=True, slots=True)
class Violation:
    """One broken rule: `invariant` is an `Invariant` value, `subject` names the row(s)."""

    invariant: str
    subject: str
    detail: str

    def __str__(self) -> str:
        return f"{self.invariant}  {self.subject}: {self.detail}"


@dataclass(slots=True)
class InvariantReport:
    """Every violation found and what was looked at (`counts`: rows read, drifts, ...)."""

    violations: list[Violation] = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        """True when no invariant is violated."""
        return not self.violations

    @property
    def fired(self) -> frozenset[str]:
        """The ids of the invariants with at least one violation."""
        return frozenset(v.invariant for v in self.violations)

    def of(self, invariant: str) -> list[Violation]:
        """The violations of one invariant, in the order found."""
        return [v for v in self.violations if v.invariant == invariant]

    def render(self) -> str:
        """A multi-line report for terminals and test failure messages."""
        verdict = "OK" if self.ok else f"FAILED ({len(self.violations)} violations)"
        lines = [f"invariant check: {verdict}"]
        if self.counts:
            lines.append("  " + " ".join(f"{k}={v}" for k, v in sorted(self.counts.items())))
        per_id = Counter(v.invariant for v in self.violations)
        for invariant in Invariant:
            n = per_id.get(invariant.value, 0)
            if n:
                lines.append(f"{invariant.value}: {n} ({DESCRIPTIONS[invariant]})")
                lines.extend(
                    f"    {v.subject}: {v.detail}"
                    for v in self.violations
                    if v.invariant == invariant.value
                )
        # Ids a newer rule set produced that this module does not list (defensive).
        known = {i.value for i in Invariant}
        lines.extend(f"{v}" for v in self.violations if v.invariant not in known)
        return "\n".join(lines)
