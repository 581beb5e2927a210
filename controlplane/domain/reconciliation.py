"""Daily bill reconciliation, the pure rules (design 9.23.3, 9.23.4, and 9.17.5's background
reconciliation of ABANDONED / SUBMIT_UNKNOWN attempts).

Inputs are what the provider billed (`Billed`, one normalized usage record each) and what the
platform expects for the same account (`Expectation`, one attempt that reached, or may have
reached, the provider). `reconcile` matches them in the order of 9.23.3:

1. ``provider_job_id``, 2. ``provider_request_id``, 3. ``client_request_key``,
4. account + model + submission window + amount (only to an attempt whose job we do not know,
   and only when exactly one attempt fits),

and an aggregate record (Runway's daily credits per model: no identifier at all) is compared as
a sum: the billed total of a model-day against the expected costs of that model-day's attempts.

Every record ends ``matched`` / ``unmatched`` / ``duplicate`` / ``disputed``, and every
difference becomes a `Discrepancy` (kind, the attempt it is tied to, billed/expected micros, the
evidence and a suggested action). The kinds are 9.23.4's list, plus two this module needs to
stay honest: ``AMOUNT_MISMATCH`` (a metered quantity differs: billed seconds other than ours)
and ``AGGREGATE_MISMATCH`` / ``AMBIGUOUS_MATCH`` (a difference no single fact explains).

How a money difference on a matched record is named depends on the provider unit
(`UNIT_CLASSES`):

* a *priced* unit (Runway ``credits``): the unit count is what the price version sets (credits
  per output second), so a different count is ``WRONG_PRICE_VERSION``; the same count but other
  micros is ``WRONG_CONVERSION_RATE`` (credits -> money);
* a *metered* unit priced by the price version (Veo ``billed_seconds``): another count is
  ``AMOUNT_MISMATCH``; the same count at other micros is ``WRONG_PRICE_VERSION``;
* a *metered* unit converted by a rate (self-hosted ``gpu_seconds``): another count is
  ``AMOUNT_MISMATCH``; the same count at other micros is ``WRONG_CONVERSION_RATE``.

Integers only: micros and thousandths of provider units; nothing here divides money.
"""

from __future__ import annotations

import enum
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

__all__ = [
    "BILLABLE_STATES",
    "SUBMISSION_WINDOW",
    "UNIT_CLASSES",
    "UNKNOWN_STATES",
    "Billed",
    "Discrepancy",
    "DiscrepancyKind",
    "Expectation",
    "Outcome",
    "RecordStatus",
    "Settlement",
    "UnitClass",
    "reconcile",
    "settled_twice",
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
        "dispute the charge: the provider refunds failed generations; the tenant is not charged"
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

    @property
    def billable(self) -> bool:
        return self.state in BILLABLE_STATES

    @property
    def unknown(self) -> bool:
        return self.state in UNKNOWN_STATES


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


# -- matching ----------------------------------------------------------------------------------
def _by(items: Iterable[Expectation], attr: str) -> dict[str, list[Expectation]]:
    index: dict[str, list[Expectation]] = defaultdict(list)
    for exp in items:
        value = getattr(exp, attr)
        if value:
            index[value].append(exp)
    return index


def _identify(
    record: Billed, indexes: Sequence[tuple[str, dict[str, list[Expectation]]]]
) -> tuple[str, list[Expectation]]:
    """Rules 1-3: the first identifier of the record that names local attempts."""
    for attr, index in indexes:
        value = getattr(record, attr)
        if value and value in index:
            return attr, index[value]
    return "", []


def _in_window(record: Billed, exp: Expectation, window: timedelta) -> bool:
    if record.usage_time is None or exp.submitted_at is None:
        return False
    return exp.submitted_at <= record.usage_time <= exp.submitted_at + window


def _evidence(record: Billed, exp: Expectation | None, how: str) -> dict[str, Any]:
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
        out["attempt"] = _attempt_facts(exp)
    return out


def _attempt_facts(exp: Expectation) -> dict[str, Any]:
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
    }


def _money_kind(unit: str, units_differ: bool) -> DiscrepancyKind:
    """The kind of a money difference on a matched record of a billable attempt (module doc)."""
    cls = UNIT_CLASSES.get(unit, UnitClass.METERED_PRICED)
    if units_differ:
        return (
            DiscrepancyKind.WRONG_PRICE_VERSION
            if cls is UnitClass.PRICED
            else DiscrepancyKind.AMOUNT_MISMATCH
        )
    if cls is UnitClass.METERED_PRICED:
        return DiscrepancyKind.WRONG_PRICE_VERSION
    return DiscrepancyKind.WRONG_CONVERSION_RATE


def _row(
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


def _classify(
    record: Billed, exp: Expectation, how: str
) -> tuple[RecordStatus, Discrepancy | None]:
    """A record matched to one attempt: is the charge what the platform expects?"""
    evidence = _evidence(record, exp, how)
    if exp.unknown:
        # 9.17.5: the attempt's job existed after all. Never the tenant's cost.
        row = _row(
            DiscrepancyKind.COST_AFTER_UNKNOWN,
            record,
            exp,
            billed=record.cost_micros,
            expected=0,
            evidence=evidence,
        )
        return RecordStatus.MATCHED, row
    if not exp.billable:
        if record.cost_micros == 0 and record.milliunits == 0:
            return RecordStatus.MATCHED, None
        row = _row(
            DiscrepancyKind.FAILED_TASK_CHARGED,
            record,
            exp,
            billed=record.cost_micros,
            expected=0,
            evidence=evidence,
        )
        return RecordStatus.DISPUTED, row
    units_known = exp.expected_milliunits > 0 and record.unit == exp.unit
    units_differ = units_known and record.milliunits != exp.expected_milliunits
    if not units_differ and record.cost_micros == exp.expected_micros:
        return RecordStatus.MATCHED, None
    kind = _money_kind(record.unit, units_differ)
    return RecordStatus.DISPUTED, _row(
        kind,
        record,
        exp,
        billed=record.cost_micros,
        expected=exp.expected_micros,
        evidence=evidence,
    )


def reconcile(
    billed: Sequence[Billed],
    expected: Sequence[Expectation],
    *,
    window: timedelta = SUBMISSION_WINDOW,
) -> Outcome:
    """Match one day's records of one provider account against its attempts (module doc).

    Deterministic: records are taken in (usage_time, record_id) order, expectations in
    attempt order, so the same inputs give the same outcome row for row.
    """
    statuses: dict[int, RecordStatus] = {}
    matched_attempts: dict[int, int] = {}
    rows: list[Discrepancy] = []
    exps = sorted(expected, key=lambda e: e.attempt_id)
    indexes = [
        ("provider_job_id", _by(exps, "provider_job_id")),
        ("provider_request_id", _by(exps, "provider_request_id")),
        ("client_request_key", _by(exps, "client_request_key")),
    ]
    unnamed = _unnamed(exps)
    by_id = {e.attempt_id: e for e in exps}
    charged: dict[int, Billed] = {}  # attempt id -> the first record matched to it
    ordered = sorted(
        billed,
        key=lambda r: (r.usage_time.isoformat() if r.usage_time else "", r.record_id),
    )
    identified = [r for r in ordered if not r.aggregate]
    aggregates = [r for r in ordered if r.aggregate]
    seen_jobs: dict[str, Billed] = {}

    for record in identified:
        how, found = _identify(record, indexes)
        if len(found) > 1:
            statuses[record.record_id] = RecordStatus.DISPUTED
            rows.append(
                _row(
                    DiscrepancyKind.AMBIGUOUS_MATCH,
                    record,
                    None,
                    billed=record.cost_micros,
                    expected=0,
                    evidence={
                        **_evidence(record, None, how),
                        "candidates": [_attempt_facts(e) for e in found],
                    },
                )
            )
            continue
        if not found:
            # Rule 4: the same job id seen twice without any local attempt is still one job
            # charged twice.
            prior = seen_jobs.get(record.provider_job_id) if record.provider_job_id else None
            if prior is not None:
                statuses[record.record_id] = RecordStatus.DUPLICATE
                exp_of_prior = _attempt_of(prior.record_id, matched_attempts, by_id)
                rows.append(
                    _duplicate(record, prior, exp_of_prior, "provider_job_id (repeated line)")
                )
                continue
            how, found = "window_amount", _window_candidates(record, unnamed, charged, window)
            if len(found) > 1:
                statuses[record.record_id] = RecordStatus.DISPUTED
                rows.append(
                    _row(
                        DiscrepancyKind.AMBIGUOUS_MATCH,
                        record,
                        None,
                        billed=record.cost_micros,
                        expected=0,
                        evidence={
                            **_evidence(record, None, how),
                            "candidates": [_attempt_facts(e) for e in found],
                        },
                    )
                )
                continue
        if record.provider_job_id:
            seen_jobs.setdefault(record.provider_job_id, record)
        if not found:
            statuses[record.record_id] = RecordStatus.UNMATCHED
            rows.append(
                _row(
                    DiscrepancyKind.CHARGE_WITHOUT_LOCAL_JOB,
                    record,
                    None,
                    billed=record.cost_micros,
                    expected=0,
                    evidence=_evidence(record, None, "none"),
                )
            )
            continue
        exp = found[0]
        if exp.attempt_id in charged:
            statuses[record.record_id] = RecordStatus.DUPLICATE
            rows.append(_duplicate(record, charged[exp.attempt_id], exp, how))
            continue
        charged[exp.attempt_id] = record
        matched_attempts[record.record_id] = exp.attempt_id
        status, row = _classify(record, exp, how)
        statuses[record.record_id] = status
        if row is not None:
            rows.append(row)

    rows.extend(_aggregates(aggregates, exps, charged, statuses))
    billed_total = sum(r.cost_micros for r in billed)
    expected_total = sum(e.expected_micros for e in exps if e.in_day and e.billable)
    return Outcome(statuses, matched_attempts, tuple(rows), billed_total, expected_total)


def _attempt_of(
    record_id: int, matched: Mapping[int, int], exps: Mapping[int, Expectation]
) -> Expectation | None:
    attempt_id = matched.get(record_id)
    return None if attempt_id is None else exps.get(attempt_id)


def _duplicate(record: Billed, first: Billed, exp: Expectation | None, how: str) -> Discrepancy:
    evidence = {**_evidence(record, exp, how), "first_record_id": first.record_id}
    return _row(
        DiscrepancyKind.DUPLICATE_CHARGE,
        record,
        exp,
        billed=record.cost_micros,
        expected=0,
        evidence=evidence,
        records=(first.record_id, record.record_id),
    )


def _unnamed(exps: Sequence[Expectation]) -> dict[tuple[str, int], list[Expectation]]:
    """Rule 4's candidates indexed by (model, expected micros): attempts whose job we do not
    know. One pass, so a day of many unidentified lines costs a lookup per line, not a scan."""
    index: dict[tuple[str, int], list[Expectation]] = defaultdict(list)
    for e in exps:
        if not e.provider_job_id:
            index[(e.model, e.expected_micros)].append(e)
    return index


def _window_candidates(
    record: Billed,
    unnamed: Mapping[tuple[str, int], Sequence[Expectation]],
    charged: Mapping[int, Billed],
    window: timedelta,
) -> list[Expectation]:
    """Rule 4: attempts whose job we do not know, of the record's model, submitted within the
    window before the charge, expecting exactly the charged amount, not charged yet."""
    return [
        e
        for e in unnamed.get((record.model, record.cost_micros), ())
        if e.attempt_id not in charged and _in_window(record, e, window)
    ]


# -- aggregates --------------------------------------------------------------------------------
def _day(value: datetime | None) -> str:
    return value.date().isoformat() if value else ""


def _aggregates(
    aggregates: Sequence[Billed],
    exps: Sequence[Expectation],
    charged: Mapping[int, Billed],
    statuses: dict[int, RecordStatus],
) -> list[Discrepancy]:
    """Compare each model's aggregate records with the model's expected costs (in-day,
    not matched to an identified record). A difference is attributed to one attempt only when
    exactly one attempt explains it to the unit and the micro; otherwise it is reported as
    the aggregate's difference, never pinned on a guess."""
    rows: list[Discrepancy] = []
    by_model: dict[str, list[Billed]] = defaultdict(list)
    for record in aggregates:
        by_model[record.model].append(record)
    for model, records in sorted(by_model.items()):
        ids = tuple(r.record_id for r in records)
        first = records[0]
        local = [e for e in exps if e.model == model and e.in_day and e.attempt_id not in charged]
        billable = [e for e in local if e.billable]
        billed_m = sum(r.cost_micros for r in records)
        billed_u = sum(r.milliunits for r in records)
        exp_m = sum(e.expected_micros for e in billable)
        exp_u = sum(e.expected_milliunits for e in billable)
        units_known = all(e.expected_milliunits > 0 for e in billable)
        d_m, d_u = billed_m - exp_m, billed_u - exp_u
        evidence: dict[str, Any] = {
            "matched_by": "aggregate",
            "day": _day(first.usage_time),
            "billed_micros": billed_m,
            "billed_milliunits": billed_u,
            "expected_micros": exp_m,
            "expected_milliunits": exp_u if units_known else None,
            "unit": first.unit,
            "attempts": [e.attempt_id for e in billable],
        }
        if d_m == 0 and (not units_known or d_u == 0):
            for rid in ids:
                statuses[rid] = RecordStatus.MATCHED
            continue
        if not local and d_m > 0:
            for rid in ids:
                statuses[rid] = RecordStatus.UNMATCHED
            rows.append(
                _row(
                    DiscrepancyKind.CHARGE_WITHOUT_LOCAL_JOB,
                    first,
                    None,
                    billed=billed_m,
                    expected=0,
                    evidence=evidence,
                    records=ids,
                )
            )
            continue
        for rid in ids:
            statuses[rid] = RecordStatus.DISPUTED
        if units_known and d_u == 0:
            rows.append(
                _row(
                    DiscrepancyKind.WRONG_CONVERSION_RATE,
                    first,
                    None,
                    billed=billed_m,
                    expected=exp_m,
                    evidence=evidence,
                    records=ids,
                )
            )
            continue
        explained = _explain(d_m, d_u, local, units_known)
        if explained is not None:
            kind, exp = explained
            amount = exp.expected_micros
            rows.append(
                _row(
                    kind,
                    first,
                    exp,
                    billed=amount if d_m > 0 else 0,
                    expected=0 if d_m > 0 else amount,
                    evidence={**evidence, "attributed": _attempt_facts(exp)},
                    records=ids,
                )
            )
            continue
        rows.append(
            _row(
                DiscrepancyKind.AGGREGATE_MISMATCH,
                first,
                None,
                billed=billed_m,
                expected=exp_m,
                evidence=evidence,
                records=ids,
            )
        )
    for exp in exps:
        if (
            exp.in_day
            and exp.billable
            and exp.attempt_id not in charged
            and exp.model not in by_model
        ):
            rows.append(
                _row(
                    DiscrepancyKind.LOCAL_SUCCESS_WITHOUT_CHARGE,
                    None,
                    exp,
                    billed=0,
                    expected=exp.expected_micros,
                    evidence={"attempt": _attempt_facts(exp)},
                    records=(),
                )
            )
    return rows


def _explain(
    d_m: int, d_u: int, local: Sequence[Expectation], units_known: bool
) -> tuple[DiscrepancyKind, Expectation] | None:
    """The one attempt whose expected cost is exactly the aggregate's difference."""

    def fits(e: Expectation, sign: int) -> bool:
        if e.expected_micros != sign * d_m:
            return False
        return not units_known or not e.expected_milliunits or e.expected_milliunits == sign * d_u

    if d_m > 0:
        candidates = [
            (
                DiscrepancyKind.COST_AFTER_UNKNOWN
                if e.unknown
                else DiscrepancyKind.DUPLICATE_CHARGE
                if e.billable
                else DiscrepancyKind.FAILED_TASK_CHARGED,
                e,
            )
            for e in local
            if fits(e, 1)
        ]
    else:
        candidates = [
            (DiscrepancyKind.LOCAL_SUCCESS_WITHOUT_CHARGE, e)
            for e in local
            if e.billable and fits(e, -1)
        ]
    return candidates[0] if len(candidates) == 1 else None


# -- the tenant's side -------------------------------------------------------------------------
def settled_twice(entries: Iterable[Settlement]) -> list[Discrepancy]:
    """Tasks with more than one settlement (CHARGE or RELEASE) on the tenant's ledger."""
    by_task: dict[tuple[str, int], list[Settlement]] = defaultdict(list)
    for entry in entries:
        if entry.kind in ("CHARGE", "RELEASE"):
            by_task[(entry.tenant_id, entry.task_id)].append(entry)
    rows = []
    for (tenant, task_id), found in sorted(by_task.items()):
        if len(found) < 2:
            continue
        found.sort(key=lambda s: s.entry_id)
        rows.append(
            Discrepancy(
                kind=DiscrepancyKind.USER_SETTLED_TWICE,
                provider="",
                account=tenant,
                model="",
                billed_micros=sum(s.amount_micros for s in found[1:] if s.kind == "CHARGE"),
                expected_micros=0,
                currency=found[0].currency,
                task_id=task_id,
                evidence={
                    "tenant_id": tenant,
                    "entries": [
                        {"id": s.entry_id, "kind": s.kind, "amount_micros": s.amount_micros}
                        for s in found
                    ],
                },
            )
        )
    return rows
