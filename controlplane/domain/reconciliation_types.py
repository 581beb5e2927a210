"""The shapes of the daily bill reconciliation and the helpers every rule shares (design 9.23.3,
9.23.4): what was billed (`Billed`), what the platform expects of one attempt (`Expectation`,
with the billing rules of its price version, `controlplane.domain.billing_rules`), the report's
rows (`Discrepancy`) and how a money difference on one attempt is named (`money_kind`).

The rules live in `controlplane.domain.reconciliation` (records named by an identifier) and
`controlplane.domain.reconciliation_aggregates` (a model-day's totals); both build rows here.
Integers only: micros and thousandths of provider units.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from controlplane.domain.billing_rules import BillingRules, FailureCharge, charge_due

__all__ = [
    "BILLABLE_STATES",
    "SUBMISSION_WINDOW",
    "SUGGESTED_ACTION",
    "UNIT_CLASSES",
    "UNKNOWN_STATES",
    "Billed",
    "Discrepancy",
    "DiscrepancyKind",
    "Expectation",
    "Outcome",
    "PricedAs",
    "RecordStatus",
    "Settlement",
    "UnitClass",
    "attempt_facts",
    "evidence_of",
    "money_kind",
    "row",
]

#: How long after its submit an attempt's job may be billed (rule 4's window): a job is
#: billed when it ends, and providers run a job for at most hours.
SUBMISSION_WINDOW = timedelta(hours=6)
#: Attempt states in which the platform could not name the provider job (9.17.5).
UNKNOWN_STATES = frozenset({"SUBMIT_UNKNOWN", "ABANDONED"})
#: Attempt states a charge is expected for.
BILLABLE_STATES = frozenset({"SUCCEEDED"})


class RecordStatus(enum.Enum):
    """What a billed record turned out to be (9.23.3 step 6)."""

    MATCHED = "matched"
    UNMATCHED = "unmatched"
    DUPLICATE = "duplicate"
    DISPUTED = "disputed"


class DiscrepancyKind(enum.Enum):
    """9.23.4's differences (and the two this module adds, see the module doc)."""

    CHARGE_WITHOUT_LOCAL_JOB = "CHARGE_WITHOUT_LOCAL_JOB"
    LOCAL_SUCCESS_WITHOUT_CHARGE = "LOCAL_SUCCESS_WITHOUT_CHARGE"
    DUPLICATE_CHARGE = "DUPLICATE_CHARGE"
    COST_AFTER_UNKNOWN = "COST_AFTER_UNKNOWN"
    FAILED_TASK_CHARGED = "FAILED_TASK_CHARGED"
    WRONG_PRICE_VERSION = "WRONG_PRICE_VERSION"
    WRONG_CONVERSION_RATE = "WRONG_CONVERSION_RATE"
    USER_SETTLED_TWICE = "USER_SETTLED_TWICE"
    AMOUNT_MISMATCH = "AMOUNT_MISMATCH"
    AGGREGATE_MISMATCH = "AGGREGATE_MISMATCH"
    AMBIGUOUS_MATCH = "AMBIGUOUS_MATCH"


SUGGESTED_ACTION: Mapping[DiscrepancyKind, str] = {
    DiscrepancyKind.CHARGE_WITHOUT_LOCAL_JOB: (
        "dispute the charge with the provider (no local job or attempt explains it)"
    ),
    DiscrepancyKind.LOCAL_SUCCESS_WITHOUT_CHARGE: (
        "wait for the next import; if still missing, ask the provider (under-billing is a "
        "future correction)"
    ),
    DiscrepancyKind.DUPLICATE_CHARGE: "dispute the second charge with the provider; refund nothing",
    DiscrepancyKind.COST_AFTER_UNKNOWN: (
        "book as platform loss (never charge the tenant); the attempt's job existed: keep the "
        "evidence for recovery and tune unknown-submit handling"
    ),
    DiscrepancyKind.FAILED_TASK_CHARGED: (
        "dispute the charge: under the account's billing rules (those of the attempt's price "
        "version) the provider does not bill this failed or cancelled generation; the tenant is "
        "not charged"
    ),
    DiscrepancyKind.WRONG_PRICE_VERSION: (
        "check the provider's current price and publish a new price version; dispute if the "
        "provider billed off its price list"
    ),
    DiscrepancyKind.WRONG_CONVERSION_RATE: (
        "check the unit conversion rate version (credits / GPU seconds to money) and correct it"
    ),
    DiscrepancyKind.USER_SETTLED_TWICE: "refund the second settlement to the tenant",
    DiscrepancyKind.AMOUNT_MISMATCH: "compare the billed quantity with the job's output; dispute",
    DiscrepancyKind.AGGREGATE_MISMATCH: (
        "investigate the model-day: the billed total differs from the local expected costs"
    ),
    DiscrepancyKind.AMBIGUOUS_MATCH: (
        "resolve by hand: several local attempts fit the charge (none adopted)"
    ),
}


class UnitClass(enum.Enum):
    """How a provider unit relates to money (module doc)."""

    PRICED = "priced"  # credits: count set by the price version, money by a conversion rate
    METERED_PRICED = "metered_priced"  # billed seconds: money = count x price version
    METERED_CONVERTED = "metered_converted"  # GPU seconds: money = count x conversion rate


UNIT_CLASSES: Mapping[str, UnitClass] = {
    "credits": UnitClass.PRICED,
    "billed_seconds": UnitClass.METERED_PRICED,
    "gpu_seconds": UnitClass.METERED_CONVERTED,
}


@dataclass(frozen=True, slots=True)
class Billed:
    """One normalized usage record. ``aggregate``: it names no job nor request (a daily total)."""

    record_id: int
    provider: str
    account: str
    model: str
    usage_time: datetime | None
    milliunits: int
    unit: str
    cost_micros: int
    currency: str
    provider_job_id: str = ""
    provider_request_id: str = ""
    client_request_key: str = ""

    @property
    def aggregate(self) -> bool:
        return not (self.provider_job_id or self.provider_request_id or self.client_request_key)


@dataclass(frozen=True, slots=True)
class Expectation:
    """One attempt of the account, with what the platform expects it to cost.

    ``in_day``: the attempt belongs to the reconciled day (its job ended in it, or, for an
    unknown submit, it was submitted in it); neighbours (``in_day=False``) are matched but
    never reported as missing. ``expected_milliunits`` 0 means unknown (compare money only).
    """

    attempt_id: int
    task_id: int
    provider: str
    account: str
    model: str
    state: str
    submitted_at: datetime | None
    expected_micros: int
    currency: str
    in_day: bool = True
    provider_job_id: str = ""
    provider_request_id: str = ""
    client_request_key: str = ""
    expected_milliunits: int = 0
    unit: str = ""
    price_version: str = ""
    conversion_rate_version: str = ""
    #: The billing rules of the attempt's price version (the default: failures billed nothing).
    rules: BillingRules = field(default_factory=BillingRules)
    #: The attempt's measured cost (its ACTUAL ledger entry), None when none was recorded; what
    #: a ``usage`` rule expects for a failed or cancelled job.
    measured_micros: int | None = None
    measured_milliunits: int = 0
    #: What the attempt would cost under the model's other published price versions.
    alternatives: tuple[PricedAs, ...] = ()

    @property
    def billable(self) -> bool:
        return self.state in BILLABLE_STATES

    @property
    def unknown(self) -> bool:
        return self.state in UNKNOWN_STATES

    @property
    def due_micros(self) -> int:
        """What a correct bill charges this attempt under its rules (`charge_due`)."""
        if self.state in BILLABLE_STATES:  # the common case, without the rules' lookup
            return self.expected_micros
        return charge_due(
            self.rules,
            self.state,
            succeeded_micros=self.expected_micros,
            measured_micros=self.measured_micros,
        )

    @property
    def due_milliunits(self) -> int:
        """The provider units a correct bill charges, in thousandths; 0 when unknown."""
        if self.billable:
            return self.expected_milliunits
        rule = {"FAILED": self.rules.failed, "CANCELLED": self.rules.cancelled}.get(self.state)
        return self.measured_milliunits if rule is FailureCharge.USAGE else 0

    @property
    def charged(self) -> bool:
        """Whether a correct bill charges this attempt at all."""
        return self.billable or self.due_micros > 0


@dataclass(frozen=True, slots=True)
class PricedAs:
    """An attempt's cost under another price version of its model (integers, exact)."""

    price_version: str
    micros: int
    milliunits: int


@dataclass(frozen=True, slots=True)
class Settlement:
    """One tenant-side settlement entry (credit_ledger CHARGE / RELEASE) of a task."""

    entry_id: int
    tenant_id: str
    task_id: int
    kind: str
    amount_micros: int
    currency: str


@dataclass(frozen=True, slots=True)
class Discrepancy:
    """One row of the report."""

    kind: DiscrepancyKind
    provider: str
    account: str
    model: str
    billed_micros: int
    expected_micros: int
    currency: str
    attempt_id: int | None = None
    task_id: int | None = None
    provider_job_id: str = ""
    record_ids: tuple[int, ...] = ()
    evidence: Mapping[str, Any] = field(default_factory=dict)
    #: The stored row's id (``reconciliation_discrepancies.id``; what `vidroute disputes open`
    #: books), None until stored. Not part of the row's identity.
    row_id: int | None = field(default=None, compare=False)

    @property
    def delta_micros(self) -> int:
        return self.billed_micros - self.expected_micros

    @property
    def suggested_action(self) -> str:
        return SUGGESTED_ACTION[self.kind]


@dataclass(frozen=True, slots=True)
class Outcome:
    """Statuses of every record, the attempt each matched (if any), and the discrepancies."""

    statuses: Mapping[int, RecordStatus]
    matched_attempts: Mapping[int, int]
    discrepancies: tuple[Discrepancy, ...]
    billed_micros: int
    expected_micros: int

    @property
    def delta_micros(self) -> int:
        return self.billed_micros - self.expected_micros


def evidence_of(record: Billed, exp: Expectation | None, how: str) -> dict[str, Any]:
    out: dict[str, Any] = {
        "matched_by": how,
        "record": {
            "id": record.record_id,
            "provider_job_id": record.provider_job_id,
            "provider_request_id": record.provider_request_id,
            "client_request_key": record.client_request_key,
            "usage_time": record.usage_time.isoformat() if record.usage_time else None,
            "milliunits": record.milliunits,
            "unit": record.unit,
            "cost_micros": record.cost_micros,
        },
    }
    if exp is not None:
        out["attempt"] = attempt_facts(exp)
    return out


def attempt_facts(exp: Expectation) -> dict[str, Any]:
    return {
        "attempt_id": exp.attempt_id,
        "task_id": exp.task_id,
        "state": exp.state,
        "provider_job_id": exp.provider_job_id,
        "client_request_key": exp.client_request_key,
        "submitted_at": exp.submitted_at.isoformat() if exp.submitted_at else None,
        "expected_micros": exp.expected_micros,
        "expected_milliunits": exp.expected_milliunits,
        "price_version": exp.price_version,
        "conversion_rate_version": exp.conversion_rate_version,
        "due_micros": exp.due_micros,
        "billing_rules": exp.rules.facts(),
    }


def money_kind(unit: str, units_differ: bool, *, version_explains: bool = True) -> DiscrepancyKind:
    """The kind of a money difference on one attempt's charge (module doc of
    `controlplane.domain.reconciliation`). Another count of a *priced* unit is a price version
    only when a published version explains it (`version_explains`), else an amount mismatch."""
    cls = UNIT_CLASSES.get(unit, UnitClass.METERED_PRICED)
    if units_differ:
        if cls is UnitClass.PRICED and version_explains:
            return DiscrepancyKind.WRONG_PRICE_VERSION
        return DiscrepancyKind.AMOUNT_MISMATCH
    if cls is UnitClass.METERED_PRICED:
        return DiscrepancyKind.WRONG_PRICE_VERSION
    return DiscrepancyKind.WRONG_CONVERSION_RATE


def row(
    kind: DiscrepancyKind,
    record: Billed | None,
    exp: Expectation | None,
    *,
    billed: int,
    expected: int,
    evidence: Mapping[str, Any],
    records: tuple[int, ...] | None = None,
) -> Discrepancy:
    anchor = record if record is not None else exp
    assert anchor is not None
    return Discrepancy(
        kind=kind,
        provider=anchor.provider,
        account=anchor.account,
        model=anchor.model,
        billed_micros=billed,
        expected_micros=expected,
        currency=(record.currency if record is not None else exp.currency if exp else ""),
        attempt_id=exp.attempt_id if exp else None,
        task_id=exp.task_id if exp else None,
        provider_job_id=(record.provider_job_id if record and record.provider_job_id else "")
        or (exp.provider_job_id if exp else ""),
        record_ids=records if records is not None else ((record.record_id,) if record else ()),
        evidence=dict(evidence),
    )
