"""SQL of booked losses and their disputes (revision 0021; `controlplane.domain.disputes`).

* `discrepancy` reads one reconciliation row with its run's day (to book it).
* `booked_loss_of` sums the PLATFORM_LOSS usage entries of an attempt (what settlement booked).
* `attempt_facts` reads what a usage entry of an attempt needs (account, model, price version).
* `insert_dispute` / `dispute` / `set_state` / `add_event` / `list_disputes` write and read the
  ``loss_disputes`` rows and their ``loss_dispute_events``; `set_state` is a compare-and-set on
  the state read, so two admins moving one dispute cannot both win.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import date, datetime
from typing import Any

from sqlalchemy import func, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import RowMapping
from sqlalchemy.ext.asyncio import AsyncConnection

from controlplane.persistence.ledger import NewUsage, record_usage
from controlplane.persistence.models import loss_dispute_events as E
from controlplane.persistence.models import loss_disputes as D
from controlplane.persistence.models import provider_usage_ledger as U
from controlplane.persistence.models import reconciliation_discrepancies as RD
from controlplane.persistence.models import reconciliation_runs as RR
from controlplane.persistence.models import task_attempts as A

__all__ = [
    "DisputeRow",
    "add_event",
    "attempt_facts",
    "booked_loss_of",
    "discrepancy",
    "dispute",
    "dispute_of_row",
    "insert_dispute",
    "list_disputes",
    "set_state",
]


@dataclass(frozen=True, slots=True)
class DisputeRow:
    id: int
    discrepancy_id: int
    day: str
    kind: str
    provider: str
    account: str
    model: str
    attempt_id: int | None
    task_id: int | None
    billed_micros: int
    expected_micros: int
    confirmed_micros: int
    new_loss_micros: int
    refunded_micros: int
    currency: str
    state: str
    evidence: Mapping[str, Any]
    created_at: datetime
    updated_at: datetime


def _row(m: RowMapping) -> DisputeRow:
    return DisputeRow(**{k: m[k] for k in DisputeRow.__slots__})


async def discrepancy(conn: AsyncConnection, discrepancy_id: int) -> dict[str, Any] | None:
    """The reconciliation row and its run's day, or None."""
    found = (
        (
            await conn.execute(
                select(RD, RR.c.day, RR.c.superseded_by)
                .join(RR, RR.c.id == RD.c.run_id)
                .where(RD.c.id == discrepancy_id)
            )
        )
        .mappings()
        .first()
    )
    return None if found is None else dict(found)


async def booked_loss_of(conn: AsyncConnection, attempt_id: int) -> int:
    """What was booked as the attempt's own billed cost: settlement's ``loss:`` entry and earlier
    bill-confirmed ones (an ``underpriced:`` entry is the charge's shortfall, another matter)."""
    total = await conn.scalar(
        select(func.coalesce(func.sum(U.c.amount_micros), 0)).where(
            U.c.attempt_id == attempt_id,
            U.c.kind == "PLATFORM_LOSS",
            (U.c.idempotency_key == f"loss:{attempt_id}")
            | U.c.idempotency_key.like("confirmed-loss:%"),
        )
    )
    return int(total or 0)


async def attempt_facts(conn: AsyncConnection, attempt_id: int) -> dict[str, Any] | None:
    found = (
        (
            await conn.execute(
                select(
                    A.c.id,
                    A.c.task_id,
                    A.c.provider_account_id,
                    A.c.provider_model,
                    A.c.price_version,
                    A.c.currency,
                ).where(A.c.id == attempt_id)
            )
        )
        .mappings()
        .first()
    )
    return None if found is None else dict(found)


async def insert_dispute(conn: AsyncConnection, **values: Any) -> int | None:
    """A new dispute row; None when the row was booked already (its unique discrepancy)."""
    dialect: Any = postgresql if conn.dialect.name == "postgresql" else sqlite
    new_id = await conn.scalar(
        dialect.insert(D)
        .values(**values)
        .on_conflict_do_nothing(index_elements=["discrepancy_id"])
        .returning(D.c.id)
    )
    return None if new_id is None else int(new_id)


async def dispute_of_row(conn: AsyncConnection, discrepancy_id: int) -> DisputeRow | None:
    found = (
        (await conn.execute(select(D).where(D.c.discrepancy_id == discrepancy_id)))
        .mappings()
        .first()
    )
    return None if found is None else _row(found)


async def dispute(conn: AsyncConnection, dispute_id: int) -> DisputeRow | None:
    found = (await conn.execute(select(D).where(D.c.id == dispute_id))).mappings().first()
    return None if found is None else _row(found)


async def set_state(
    conn: AsyncConnection,
    dispute_id: int,
    *,
    expected: str,
    state: str,
    refunded_micros: int,
    now: datetime,
) -> bool:
    """Move the dispute if it is still in `expected`; False when another move won."""
    result = await conn.execute(
        update(D)
        .where(D.c.id == dispute_id, D.c.state == expected)
        .values(state=state, refunded_micros=refunded_micros, updated_at=now)
    )
    return bool(result.rowcount)


async def add_event(
    conn: AsyncConnection,
    *,
    dispute_id: int,
    from_state: str | None,
    to_state: str,
    refunded_micros: int,
    actor: str,
    reason: str,
    now: datetime,
) -> None:
    await conn.execute(
        E.insert().values(
            dispute_id=dispute_id,
            from_state=from_state,
            to_state=to_state,
            refunded_micros=refunded_micros,
            actor=actor,
            reason=reason,
            at=now,
        )
    )


async def list_disputes(
    conn: AsyncConnection,
    *,
    state: str = "",
    start: date | None = None,
    end: date | None = None,
    limit: int = 500,
) -> list[DisputeRow]:
    """Disputes (of `state`, of bill days in [start, end]), oldest first."""
    query = select(D).order_by(D.c.id).limit(limit)
    if state:
        query = query.where(D.c.state == state)
    if start is not None:
        query = query.where(D.c.day >= start.isoformat())
    if end is not None:
        query = query.where(D.c.day <= end.isoformat())
    return [_row(m) for m in (await conn.execute(query)).mappings()]


class OpenDisputes:
    """The disputes tables and the loss ledger on one unit's transaction, at the unit's clock
    (`SqlUnitOfWork.disputes`): the reconciliation service books and moves disputes through
    these methods, never through a connection of its own (issue 22)."""

    def __init__(self, conn: AsyncConnection, now: datetime) -> None:
        self._conn, self._now = conn, now

    async def discrepancy(self, discrepancy_id: int) -> dict[str, Any] | None:
        return await discrepancy(self._conn, discrepancy_id)

    async def booked_loss_of(self, attempt_id: int) -> int:
        return await booked_loss_of(self._conn, attempt_id)

    async def attempt_facts(self, attempt_id: int) -> dict[str, Any] | None:
        return await attempt_facts(self._conn, attempt_id)

    async def insert_dispute(self, **values: Any) -> int | None:
        return await insert_dispute(
            self._conn, created_at=self._now, updated_at=self._now, **values
        )

    async def dispute_of_row(self, discrepancy_id: int) -> DisputeRow | None:
        return await dispute_of_row(self._conn, discrepancy_id)

    async def dispute(self, dispute_id: int) -> DisputeRow | None:
        return await dispute(self._conn, dispute_id)

    async def set_state(
        self, dispute_id: int, *, expected: str, state: str, refunded_micros: int
    ) -> bool:
        return await set_state(
            self._conn,
            dispute_id,
            expected=expected,
            state=state,
            refunded_micros=refunded_micros,
            now=self._now,
        )

    async def add_event(
        self,
        *,
        dispute_id: int,
        from_state: str | None,
        to_state: str,
        refunded_micros: int,
        actor: str,
        reason: str,
    ) -> None:
        await add_event(
            self._conn,
            dispute_id=dispute_id,
            from_state=from_state,
            to_state=to_state,
            refunded_micros=refunded_micros,
            actor=actor,
            reason=reason,
            now=self._now,
        )

    async def record_loss(self, usage: NewUsage) -> bool:
        """Write the booked loss's ledger entry once per idempotency key (`ledger`)."""
        return await record_usage(self._conn, usage, self._now)
