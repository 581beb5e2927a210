"""Lease facts from PostgreSQL for the lease rebuild and reconciliation (design 9.11.2).

Read-only: which attempts hold provider capacity (by state) or what became of given attempts
(by client request key), with the lease and fencing tokens they were admitted under; and what the
attempts of the last day and month took of their accounts' rate and budget windows. The
drift corrections are written through the unit of work (`record_lease_drifts`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from sqlalchemy import select

from controlplane.persistence.models import generation_tasks, task_attempts

if TYPE_CHECKING:
    from controlplane.persistence.database import Database

__all__ = ["LeaseHolder", "WindowFact", "attempts_in_states", "attempts_with_keys", "window_facts"]


@dataclass(frozen=True, slots=True)
class LeaseHolder:
    """An attempt as the lease store knows it: its key, where it runs, its state and tokens."""

    key: str
    account_id: int
    model: str
    status: str
    lease_token: str | None
    fencing_token: int | None
    mode: str = ""  # its task's generation mode: the modality it holds a slot of


_c = task_attempts.c
_COLUMNS = (
    _c.client_request_key,
    _c.provider_account_id,
    _c.provider_model,
    _c.status,
    _c.lease_token,
    _c.fencing_token,
    generation_tasks.c.spec["mode"].as_string(),
)


async def attempts_in_states(db: Database, states: Iterable[str]) -> list[LeaseHolder]:
    """The attempts whose status is one of `states`."""
    return await _holders(db, _c.status.in_(sorted(states)))


async def attempts_with_keys(db: Database, keys: Iterable[str]) -> list[LeaseHolder]:
    """The attempts with these client request keys, whatever their state."""
    return await _holders(db, _c.client_request_key.in_(sorted(keys)))


async def _holders(db: Database, where: object) -> list[LeaseHolder]:
    async with db.reading() as conn:
        query = select(*_COLUMNS).join(generation_tasks, generation_tasks.c.id == _c.task_id)
        rows = (await conn.execute(query.where(where))).all()  # type: ignore[arg-type]  # where is a SQL clause; object keeps callers sqlalchemy-free
    return [LeaseHolder(*row[:-1], mode=row[-1] or "") for row in rows]


@dataclass(frozen=True, slots=True)
class WindowFact:
    """An attempt admitted since a given instant, as the rate and budget windows count it
    (9.11): its key, account, when it went out (its send, else its admission), its generations
    (the task's sample_count) and its estimated cost."""

    key: str
    account_id: int
    at: datetime
    generations: int
    cost_micros: int


async def window_facts(db: Database, since: datetime) -> list[WindowFact]:
    """Every attempt created at or after `since`, whatever its state: a window counts what was
    admitted, and an ended attempt's submit happened (or may have)."""
    t = generation_tasks.c
    query = (
        select(
            _c.client_request_key,
            _c.provider_account_id,
            _c.created_at,
            _c.request_started_at,
            _c.estimated_cost_micros,
            t.spec,
        )
        .join(generation_tasks, t.id == _c.task_id)
        .where(_c.created_at >= since)
    )
    async with db.reading() as conn:
        rows = (await conn.execute(query)).all()
    return [
        WindowFact(key, account_id, sent or created, _samples(spec), int(cost or 0))
        for key, account_id, created, sent, cost, spec in rows
    ]


def _samples(spec: Any) -> int:
    output = spec.get("output") if isinstance(spec, dict) else None
    count = output.get("sample_count") if isinstance(output, dict) else None
    return max(1, int(count)) if isinstance(count, int) else 1
