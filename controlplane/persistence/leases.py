"""Lease facts from PostgreSQL for the lease rebuild and reconciliation (design 9.11.2).

Read-only: which attempts hold provider capacity (by state) or what became of given attempts
(by client request key), with the lease and fencing tokens they were admitted under. The
drift corrections are written through the unit of work (`record_lease_drifts`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from sqlalchemy import select

from controlplane.persistence.models import task_attempts

if TYPE_CHECKING:
    from controlplane.persistence.database import Database

__all__ = ["LeaseHolder", "attempts_in_states", "attempts_with_keys"]


@dataclass(frozen=True, slots=True)
class LeaseHolder:
    """An attempt as the lease store knows it: its key, where it runs, its state and tokens."""

    key: str
    account_id: int
    model: str
    status: str
    lease_token: str | None
    fencing_token: int | None


_c = task_attempts.c
_COLUMNS = (
    _c.client_request_key,
    _c.provider_account_id,
    _c.provider_model,
    _c.status,
    _c.lease_token,
    _c.fencing_token,
)


async def attempts_in_states(db: Database, states: Iterable[str]) -> list[LeaseHolder]:
    """The attempts whose status is one of `states`."""
    return await _holders(db, _c.status.in_(sorted(states)))


async def attempts_with_keys(db: Database, keys: Iterable[str]) -> list[LeaseHolder]:
    """The attempts with these client request keys, whatever their state."""
    return await _holders(db, _c.client_request_key.in_(sorted(keys)))


async def _holders(db: Database, where: object) -> list[LeaseHolder]:
    async with db.reading() as conn:
        rows = (await conn.execute(select(*_COLUMNS).where(where))).all()  # type: ignore[arg-type]  # where is a SQL clause; object keeps callers sqlalchemy-free
    return [LeaseHolder(*row) for row in rows]
