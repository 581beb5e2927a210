"""SQL of the margin view (`controlplane.domain.margins`): the money facts of the ledger
entries written in ``[start, end)`` and of the dispute refunds made in it.

An attempt's EXPECTED entry counts as its cost only while the attempt has no ACTUAL entry
(written in any window): the cost is then the ACTUAL one, on its own day. An attempt with
neither (an abandoned unknown submit) costs its PLATFORM_LOSS estimate. A loss booked on a
reconciliation row naming no attempt counts on its booking day; refunds on theirs.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import and_, exists, select
from sqlalchemy.ext.asyncio import AsyncConnection

from controlplane.domain.margins import MoneyFact
from controlplane.persistence.models import credit_ledger as C
from controlplane.persistence.models import generation_tasks as T
from controlplane.persistence.models import loss_disputes as D
from controlplane.persistence.models import provider_accounts as PA
from controlplane.persistence.models import provider_usage_ledger as U
from controlplane.persistence.models import task_attempts as A

__all__ = ["money_facts"]

CONFIRMED_LOSS_PREFIX = "confirmed-loss:"


async def money_facts(conn: AsyncConnection, start: datetime, end: datetime) -> list[MoneyFact]:
    facts: list[MoneyFact] = []
    charges = await conn.execute(
        select(C.c.created_at, C.c.tenant_id, C.c.kind, C.c.amount_micros, C.c.currency,
               PA.c.provider, A.c.provider_model)
        .select_from(
            C.outerjoin(A, A.c.id == C.c.attempt_id).outerjoin(
                PA, PA.c.id == A.c.provider_account_id
            )
        )
        .where(C.c.kind.in_(("CHARGE", "REFUND")), C.c.created_at >= start, C.c.created_at < end)
    )  # fmt: skip
    for at, tenant, kind, amount, currency, provider, model in charges.all():
        sign = 1 if kind == "CHARGE" else -1
        facts.append(
            MoneyFact(at.date(), tenant, provider or "", model or "", currency,
                      revenue_micros=sign * int(amount))
        )  # fmt: skip
    other = U.alias("other_entry")
    actual = (
        exists()
        .where(and_(other.c.attempt_id == U.c.attempt_id, other.c.kind == "ACTUAL"))
        .label("has_actual")
    )
    both = U.alias("priced_entry")
    priced = (
        exists()
        .where(and_(both.c.attempt_id == U.c.attempt_id, both.c.kind.in_(("ACTUAL", "EXPECTED"))))
        .label("priced")
    )
    usage = await conn.execute(
        select(U.c.created_at, T.c.tenant_id, U.c.provider, U.c.model, U.c.currency, U.c.kind,
               U.c.amount_micros, U.c.idempotency_key, actual, priced)
        .select_from(U.join(T, T.c.id == U.c.task_id))
        .where(U.c.created_at >= start, U.c.created_at < end)
    )  # fmt: skip
    for at, tenant, provider, model, currency, kind, amount, key, has_actual, has_price in usage:
        cost = loss = 0
        if kind == "ACTUAL" or (kind == "EXPECTED" and not has_actual):
            cost = int(amount)
        elif kind == "PLATFORM_LOSS":
            loss = int(amount)
            # A bill-confirmed extra is cost beyond the attempt's price; settlement's loss of an
            # attempt never priced (an abandoned unknown submit) is its only cost figure.
            if str(key).startswith(CONFIRMED_LOSS_PREFIX) or not has_price:
                cost = int(amount)
        if cost or loss:
            facts.append(
                MoneyFact(at.date(), tenant, provider, model, currency,
                          cost_micros=cost, loss_micros=loss)
            )  # fmt: skip
    # A loss booked on a row naming no attempt has no ledger entry: the dispute carries it.
    unattached = await conn.execute(
        select(D.c.created_at, D.c.provider, D.c.model, D.c.currency, D.c.new_loss_micros)
        .where(D.c.attempt_id.is_(None), D.c.created_at >= start, D.c.created_at < end)
    )  # fmt: skip
    for at, provider, model, currency, booked in unattached.all():
        facts.append(
            MoneyFact(at.date(), "", provider, model, currency,
                      cost_micros=int(booked), loss_micros=int(booked))
        )  # fmt: skip
    refunds = await conn.execute(
        select(D.c.updated_at, T.c.tenant_id, D.c.provider, D.c.model, D.c.currency,
               D.c.refunded_micros)
        .select_from(D.outerjoin(T, T.c.id == D.c.task_id))
        .where(D.c.state == "REFUNDED", D.c.updated_at >= start, D.c.updated_at < end)
    )  # fmt: skip
    for at, tenant, provider, model, currency, refunded in refunds.all():
        facts.append(
            MoneyFact(at.date(), tenant or "", provider, model, currency,
                      cost_micros=-int(refunded), loss_micros=-int(refunded))
        )  # fmt: skip
    return facts
