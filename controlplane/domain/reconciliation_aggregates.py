"""A model-day's aggregate bill against its attempts (design 9.23.3; Runway's daily credits per
model name no job at all).

The billed total of a model-day is compared with what a correct bill charges the day's attempts
of that model that no identified record already matched (`Expectation.due_micros`, under each
attempt's billing rules). A difference is named as exactly as the facts allow, never pinned on a
guess; the first explanation that is *unique* wins:

1. one whole attempt: the difference is one attempt's would-be charge (billed twice, a failed
   job billed, an unknown submit's job billed) or one missing charge;
2. one price version: exactly one way of re-pricing the attempts under the model's other
   published price versions (`Expectation.alternatives`) makes both totals match:
   WRONG_PRICE_VERSION, a row per re-priced attempt;
3. one attempt charged: the day had a single attempt to charge, so the difference is its own:
   named by `money_kind` (another count with no version explaining it: AMOUNT_MISMATCH; a count
   the platform does not know is compared as money only, as a matched record is);
4. the same units at other money: WRONG_CONVERSION_RATE (the credits-to-money rate);
5. otherwise AGGREGATE_MISMATCH, listing every candidate attempt.

Each row's billed minus expected is its share of the difference, so a run's delta is the sum
of its rows' deltas.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from itertools import product
from typing import Any

from controlplane.domain.reconciliation_types import (
    Billed,
    Discrepancy,
    DiscrepancyKind,
    Expectation,
    PricedAs,
    RecordStatus,
    attempt_facts,
    money_kind,
    row,
)

__all__ = ["aggregates"]

#: Attempts x versions tried when re-pricing a model-day (rule 2): past it the difference is
#: reported, not searched for (a day of hundreds of attempts has no unique re-pricing anyway).
MAX_REPRICINGS = 4096


def _day(records: Sequence[Billed]) -> str:
    first = records[0].usage_time
    return first.date().isoformat() if first else ""


def aggregates(
    records: Sequence[Billed],
    exps: Sequence[Expectation],
    charged: Mapping[int, Billed],
    statuses: dict[int, RecordStatus],
) -> list[Discrepancy]:
    """The rows of every model-day of `records` (module doc), and LOCAL_SUCCESS_WITHOUT_CHARGE
    for a due attempt of a model the bill does not mention at all."""
    rows: list[Discrepancy] = []
    by_model: dict[str, list[Billed]] = defaultdict(list)
    for record in records:
        by_model[record.model].append(record)
    for model, billed in sorted(by_model.items()):
        local = [e for e in exps if e.model == model and e.in_day and e.attempt_id not in charged]
        rows.extend(_model_day(billed, local, statuses))
    for exp in exps:
        # Cheap tests first: `charged` applies the billing rules.
        missing = exp.in_day and exp.attempt_id not in charged and exp.model not in by_model
        if missing and exp.charged:
            rows.append(
                row(
                    DiscrepancyKind.LOCAL_SUCCESS_WITHOUT_CHARGE,
                    None,
                    exp,
                    billed=0,
                    expected=exp.due_micros,
                    evidence={"attempt": attempt_facts(exp)},
                    records=(),
                )
            )
    return rows


def _model_day(
    billed: Sequence[Billed], local: Sequence[Expectation], statuses: dict[int, RecordStatus]
) -> list[Discrepancy]:
    ids = tuple(r.record_id for r in billed)
    first = billed[0]
    due = [e for e in local if e.charged]
    billed_m = sum(r.cost_micros for r in billed)
    billed_u = sum(r.milliunits for r in billed)
    exp_m = sum(e.due_micros for e in due)
    exp_u = sum(e.due_milliunits for e in due)
    units_known = all(e.due_milliunits > 0 for e in due)
    d_m, d_u = billed_m - exp_m, billed_u - exp_u
    evidence: dict[str, Any] = {
        "matched_by": "aggregate",
        "day": _day(billed),
        "billed_micros": billed_m,
        "billed_milliunits": billed_u,
        "expected_micros": exp_m,
        "expected_milliunits": exp_u if units_known else None,
        "unit": first.unit,
        "attempts": [e.attempt_id for e in due],
    }

    def rows_of(kind: DiscrepancyKind, status: RecordStatus, **kw: Any) -> list[Discrepancy]:
        for rid in ids:
            statuses[rid] = status
        return [row(kind, first, None, evidence=evidence, records=ids, **kw)]

    if d_m == 0 and (not units_known or d_u == 0):
        for rid in ids:
            statuses[rid] = RecordStatus.MATCHED
        return []
    if not local and d_m > 0:
        return rows_of(
            DiscrepancyKind.CHARGE_WITHOUT_LOCAL_JOB,
            RecordStatus.UNMATCHED,
            billed=billed_m,
            expected=0,
        )
    for rid in ids:
        statuses[rid] = RecordStatus.DISPUTED
    explained = _whole_attempt(d_m, d_u, local, units_known)
    if explained is not None:
        kind, exp, amount = explained
        return [
            row(
                kind,
                first,
                exp,
                billed=amount if d_m > 0 else 0,
                expected=0 if d_m > 0 else amount,
                evidence={**evidence, "attributed": attempt_facts(exp)},
                records=ids,
            )
        ]
    repriced = _repricing(billed_m, billed_u, due, units_known)
    if repriced:
        return [
            row(
                DiscrepancyKind.WRONG_PRICE_VERSION,
                first,
                exp,
                billed=alt.micros,
                expected=exp.due_micros,
                evidence={
                    **evidence,
                    "attributed": attempt_facts(exp),
                    "billed_price_version": alt.price_version,
                },
                records=ids,
            )
            for exp, alt in repriced
        ]
    if len(due) == 1:
        [exp] = due
        # As for a matched record (`reconciliation._classify`): units the platform does not
        # know (no unit rate for the price version) cannot differ; the money difference is then
        # named by the unit's class alone.
        units_differ = units_known and d_u != 0
        kind = money_kind(first.unit, units_differ, version_explains=False)
        return [
            row(
                kind,
                first,
                exp,
                billed=exp.due_micros + d_m,
                expected=exp.due_micros,
                evidence={**evidence, "attributed": attempt_facts(exp)},
                records=ids,
            )
        ]
    if units_known and d_u == 0:
        return rows_of(
            DiscrepancyKind.WRONG_CONVERSION_RATE,
            RecordStatus.DISPUTED,
            billed=billed_m,
            expected=exp_m,
        )
    evidence["candidates"] = [attempt_facts(e) for e in local]
    return rows_of(
        DiscrepancyKind.AGGREGATE_MISMATCH, RecordStatus.DISPUTED, billed=billed_m, expected=exp_m
    )


def _extra(e: Expectation) -> tuple[int, int]:
    """(micros, milliunits) of one more charge of `e`: a charged attempt's due amount (billed
    twice), any other's would-be cost (a failed job billed, an unknown submit's job)."""
    if e.charged and not e.unknown:
        return e.due_micros, e.due_milliunits
    return e.expected_micros, e.expected_milliunits


def _whole_attempt(
    d_m: int, d_u: int, local: Sequence[Expectation], units_known: bool
) -> tuple[DiscrepancyKind, Expectation, int] | None:
    """The one attempt whose whole charge is exactly the aggregate's difference, with that
    charge."""

    def fits(amount: tuple[int, int], sign: int) -> bool:
        micros, units = amount
        if micros != sign * d_m:
            return False
        return not units_known or not units or units == sign * d_u

    if d_m > 0:
        candidates = [
            (
                DiscrepancyKind.COST_AFTER_UNKNOWN
                if e.unknown
                else DiscrepancyKind.DUPLICATE_CHARGE
                if e.charged
                else DiscrepancyKind.FAILED_TASK_CHARGED,
                e,
                _extra(e)[0],
            )
            for e in local
            if fits(_extra(e), 1)
        ]
    else:
        candidates = [
            (DiscrepancyKind.LOCAL_SUCCESS_WITHOUT_CHARGE, e, e.due_micros)
            for e in local
            if e.charged and fits((e.due_micros, e.due_milliunits), -1)
        ]
    return candidates[0] if len(candidates) == 1 else None


def _repricing(
    billed_m: int, billed_u: int, due: Sequence[Expectation], units_known: bool
) -> list[tuple[Expectation, PricedAs]]:
    """The unique assignment of other price versions to some of `due` that makes the totals
    equal the bill; empty when there is none or more than one (rule 2)."""
    options: list[list[PricedAs | None]] = [[None, *e.alternatives] for e in due]
    count = 1
    for o in options:
        count *= len(o)
    if count <= 1 or count > MAX_REPRICINGS:
        return []
    found: list[list[tuple[Expectation, PricedAs]]] = []
    for choice in product(*options):
        if all(c is None for c in choice):
            continue
        pairs = list(zip(due, choice, strict=True))
        micros = sum(e.due_micros if c is None else c.micros for e, c in pairs)
        units = sum(e.due_milliunits if c is None else c.milliunits for e, c in pairs)
        if micros == billed_m and (not units_known or units == billed_u):
            found.append([(e, c) for e, c in pairs if c is not None])
            if len(found) > 1:
                return []
    return found[0] if found else []
