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

What a correct bill charges an attempt is its billing rules' answer (`Expectation.due_micros`,
`controlplane.domain.billing_rules`): a self-hosted job that failed after using GPU seconds is
billed them and that is no discrepancy; a Runway job that failed is billed nothing. Another
count of a *priced* unit is WRONG_PRICE_VERSION only when one of the model's published price
versions gives exactly the billed count (`Expectation.alternatives`), else AMOUNT_MISMATCH.
Model-day totals are compared in `controlplane.domain.reconciliation_aggregates`; the shapes
live in `controlplane.domain.reconciliation_types` (re-exported here).

Integers only: micros and thousandths of provider units; nothing here divides money.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from datetime import timedelta

from controlplane.domain.reconciliation_aggregates import aggregates
from controlplane.domain.reconciliation_types import (
    BILLABLE_STATES,
    SUBMISSION_WINDOW,
    UNIT_CLASSES,
    UNKNOWN_STATES,
    Billed,
    Discrepancy,
    DiscrepancyKind,
    Expectation,
    Outcome,
    PricedAs,
    RecordStatus,
    Settlement,
    UnitClass,
    attempt_facts,
    evidence_of,
    money_kind,
    row,
)

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
    "PricedAs",
    "RecordStatus",
    "Settlement",
    "UnitClass",
    "reconcile",
    "settled_twice",
]


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


def _classify(
    record: Billed, exp: Expectation, how: str
) -> tuple[RecordStatus, Discrepancy | None]:
    """A record matched to one attempt: is the charge what the attempt's billing rules say a
    correct bill charges (`Expectation.due_micros`)?"""

    def found(kind: DiscrepancyKind, expected: int) -> Discrepancy:
        # Evidence only for a row: a clean day of many records builds none.
        evidence = {**evidence_of(record, exp, how), "billing_rules": exp.rules.facts()}
        return row(
            kind, record, exp, billed=record.cost_micros, expected=expected, evidence=evidence
        )

    if exp.unknown:
        # 9.17.5: the attempt's job existed after all. Never the tenant's cost.
        return RecordStatus.MATCHED, found(DiscrepancyKind.COST_AFTER_UNKNOWN, 0)
    due = exp.due_micros
    if not exp.billable and due == 0:
        if record.cost_micros == 0 and record.milliunits == 0:
            return RecordStatus.MATCHED, None
        return RecordStatus.DISPUTED, found(DiscrepancyKind.FAILED_TASK_CHARGED, 0)
    units = exp.due_milliunits
    units_known = units > 0 and record.unit == exp.unit
    units_differ = units_known and record.milliunits != units
    if not units_differ and record.cost_micros == due:
        return RecordStatus.MATCHED, None
    explains = any(alt.milliunits == record.milliunits for alt in exp.alternatives)
    return RecordStatus.DISPUTED, found(
        money_kind(record.unit, units_differ, version_explains=explains), due
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
    aggregate_records = [r for r in ordered if r.aggregate]
    seen_jobs: dict[str, Billed] = {}

    for record in identified:
        how, found = _identify(record, indexes)
        if len(found) > 1:
            statuses[record.record_id] = RecordStatus.DISPUTED
            rows.append(
                row(
                    DiscrepancyKind.AMBIGUOUS_MATCH,
                    record,
                    None,
                    billed=record.cost_micros,
                    expected=0,
                    evidence={
                        **evidence_of(record, None, how),
                        "candidates": [attempt_facts(e) for e in found],
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
                    row(
                        DiscrepancyKind.AMBIGUOUS_MATCH,
                        record,
                        None,
                        billed=record.cost_micros,
                        expected=0,
                        evidence={
                            **evidence_of(record, None, how),
                            "candidates": [attempt_facts(e) for e in found],
                        },
                    )
                )
                continue
        if record.provider_job_id:
            seen_jobs.setdefault(record.provider_job_id, record)
        if not found:
            statuses[record.record_id] = RecordStatus.UNMATCHED
            rows.append(
                row(
                    DiscrepancyKind.CHARGE_WITHOUT_LOCAL_JOB,
                    record,
                    None,
                    billed=record.cost_micros,
                    expected=0,
                    evidence=evidence_of(record, None, "none"),
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
        status, found_row = _classify(record, exp, how)
        statuses[record.record_id] = status
        if found_row is not None:
            rows.append(found_row)

    rows.extend(aggregates(aggregate_records, exps, charged, statuses))
    billed_total = sum(r.cost_micros for r in billed)
    expected_total = sum(e.due_micros for e in exps if e.in_day)
    return Outcome(statuses, matched_attempts, tuple(rows), billed_total, expected_total)


def _attempt_of(
    record_id: int, matched: Mapping[int, int], exps: Mapping[int, Expectation]
) -> Expectation | None:
    attempt_id = matched.get(record_id)
    return None if attempt_id is None else exps.get(attempt_id)


def _duplicate(record: Billed, first: Billed, exp: Expectation | None, how: str) -> Discrepancy:
    evidence = {**evidence_of(record, exp, how), "first_record_id": first.record_id}
    return row(
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
