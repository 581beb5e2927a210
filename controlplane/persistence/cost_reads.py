"""Unit-cost aggregates of the provider usage ledger (design 9.23), read-only.

One statement folds every `provider_usage_ledger` entry written in a window into the terms of
`controlplane.domain.unit_cost` (its docstring states the rules; `job_terms` is the reference
this SQL must agree with, and a test checks it on random ledgers):

1. per attempt: EXPECTED, ACTUAL, settlement's PLATFORM_LOSS and bill-confirmed
   (``confirmed-loss:``) PLATFORM_LOSS sums and whether each occurs;
2. joined to the attempt's state and its task (delivered: the task SUCCEEDED with this attempt
   adopted), folded per provider/model/currency into successes, generation, retry and loss.

The work is one grouped scan of the window (``ix_provider_usage_ledger_created_at``), whatever
the number of attempts: the metrics refresher runs it once per period, never per scrape.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import BigInteger, and_, case, cast, func, literal, or_, select
from sqlalchemy.ext.asyncio import AsyncConnection
from sqlalchemy.sql.elements import ColumnElement

from controlplane.domain.unit_cost import RETRY_STATES, UnitCost, add_up
from controlplane.persistence.finance_reads import CONFIRMED_LOSS_PREFIX
from controlplane.persistence.models import generation_tasks as T
from controlplane.persistence.models import provider_usage_ledger as U
from controlplane.persistence.models import task_attempts as A

__all__ = ["unit_costs"]


def _is(kind: str) -> ColumnElement[bool]:
    """An entry of `kind`; PLATFORM_LOSS is settlement's, CONFIRMED the bill-confirmed one."""
    confirmed = U.c.idempotency_key.startswith(CONFIRMED_LOSS_PREFIX)
    if kind == "CONFIRMED":
        return and_(U.c.kind == "PLATFORM_LOSS", confirmed)
    if kind == "PLATFORM_LOSS":
        return and_(U.c.kind == kind, ~confirmed)
    return U.c.kind == kind


def _sum_of(kind: str) -> ColumnElement[Any]:
    return func.sum(case((_is(kind), U.c.amount_micros), else_=literal(0)))


def _count_of(kind: str) -> ColumnElement[Any]:
    return func.sum(case((_is(kind), 1), else_=0))


def _total(expr: ColumnElement[Any]) -> ColumnElement[Any]:
    # PostgreSQL's SUM(bigint) is NUMERIC (Decimal in Python): cast back, money stays int.
    return cast(func.coalesce(func.sum(expr), 0), BigInteger)


async def unit_costs(
    conn: AsyncConnection,
    start: datetime,
    end: datetime,
    *,
    provider: str | None = None,
    model: str | None = None,
) -> list[UnitCost]:
    """The unit-cost rows of usage entries written in ``[start, end)``, sorted by key."""
    where = [U.c.created_at >= start, U.c.created_at < end]
    if provider is not None:
        where.append(U.c.provider == provider)
    if model is not None:
        where.append(U.c.model == model)
    jobs = (
        select(
            U.c.provider,
            U.c.model,
            U.c.currency,
            U.c.attempt_id,
            U.c.task_id,
            _sum_of("EXPECTED").label("expected"),
            _count_of("EXPECTED").label("n_expected"),
            _sum_of("ACTUAL").label("actual"),
            _count_of("ACTUAL").label("n_actual"),
            _sum_of("PLATFORM_LOSS").label("loss"),
            _count_of("PLATFORM_LOSS").label("n_loss"),
            _sum_of("CONFIRMED").label("confirmed"),
            _count_of("CONFIRMED").label("n_confirmed"),
        )
        .where(*where)
        .group_by(U.c.provider, U.c.model, U.c.currency, U.c.attempt_id, U.c.task_id)
        .subquery("jobs")
    )
    j = jobs.c
    delivered = and_(T.c.status == "SUCCEEDED", T.c.adopted_attempt_id == j.attempt_id)
    retry = A.c.status.in_(sorted(RETRY_STATES))
    cost = case((j.n_actual > 0, j.actual), (j.n_expected > 0, j.expected), else_=j.loss)
    query = (
        select(
            j.provider,
            j.model,
            j.currency,
            func.count(func.distinct(case((delivered, j.attempt_id)))),
            _total(case((delivered, cost), else_=literal(0))),
            _total(case((delivered, literal(0)), (retry, cost), else_=literal(0))),
            _total(
                case(
                    (delivered, j.confirmed),
                    (retry, j.confirmed),
                    (or_(j.n_loss > 0, j.n_confirmed > 0), cost + j.confirmed),
                    else_=literal(0),
                )
            ),
        )
        .select_from(jobs.join(T, T.c.id == j.task_id).join(A, A.c.id == j.attempt_id))
        .group_by(j.provider, j.model, j.currency)
    )
    rows = (await conn.execute(query)).all()
    return add_up(
        (str(p), str(m), str(c), int(n), int(gen), int(rt), 0, int(loss))
        for p, m, c, n, gen, rt, loss in rows
    )
