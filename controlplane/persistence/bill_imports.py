"""SQL of imported provider bills (revision 0021): Google's Cloud Billing export files, raw.

* `store_bill` writes a file once per (provider, account, sha256); the same file again returns
  the stored import (``created`` False).
* `bill_for_day` is the latest import of an account covering a UTC day (a later export of the
  same days replaces an earlier one: Google's export fills in late usage), or None.
* `provider_accounts` lists (provider, account) pairs, to name the account of an import.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date, datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import RowMapping
from sqlalchemy.ext.asyncio import AsyncConnection

from controlplane.persistence.models import cloud_billing_imports as CBI

__all__ = ["BillImport", "StoredBill", "bill_for_day", "store_bill"]


@dataclass(frozen=True, slots=True)
class BillImport:
    """A file to store (its text and what reading it found)."""

    provider: str
    account: str
    file_name: str
    format: str
    payload: str
    payload_sha256: str
    sku_map: list[list[str]]
    covers_from: date
    covers_to: date
    row_count: int
    ours_count: int
    cost_micros: int
    currency: str


@dataclass(frozen=True, slots=True)
class StoredBill:
    id: int
    created: bool
    provider: str
    account: str
    file_name: str
    format: str
    payload: str
    payload_sha256: str
    sku_map: list[list[str]]
    covers_from: date
    covers_to: date
    row_count: int
    ours_count: int
    cost_micros: int
    currency: str
    imported_at: datetime


def _stored(m: RowMapping, created: bool) -> StoredBill:
    return StoredBill(
        id=int(m["id"]),
        created=created,
        provider=m["provider"],
        account=m["account"],
        file_name=m["file_name"],
        format=m["format"],
        payload=m["payload"],
        payload_sha256=m["payload_sha256"],
        sku_map=[list(e) for e in m["sku_map"]],
        covers_from=date.fromisoformat(m["covers_from"]),
        covers_to=date.fromisoformat(m["covers_to"]),
        row_count=m["row_count"],
        ours_count=m["ours_count"],
        cost_micros=m["cost_micros"],
        currency=m["currency"],
        imported_at=m["imported_at"],
    )


async def store_bill(conn: AsyncConnection, bill: BillImport, now: datetime) -> StoredBill:
    """The import of this file for this account: stored now, or the one stored before."""
    dialect: Any = postgresql if conn.dialect.name == "postgresql" else sqlite
    values = {
        "provider": bill.provider,
        "account": bill.account,
        "file_name": bill.file_name,
        "format": bill.format,
        "payload": bill.payload,
        "payload_sha256": bill.payload_sha256,
        "sku_map": bill.sku_map,
        "covers_from": bill.covers_from.isoformat(),
        "covers_to": bill.covers_to.isoformat(),
        "row_count": bill.row_count,
        "ours_count": bill.ours_count,
        "cost_micros": bill.cost_micros,
        "currency": bill.currency,
        "imported_at": now,
    }
    inserted = await conn.execute(
        dialect.insert(CBI)
        .values(**values)
        .on_conflict_do_nothing(index_elements=["provider", "account", "payload_sha256"])
        .returning(CBI.c.id)
    )
    created = inserted.scalar_one_or_none() is not None
    row = (
        (
            await conn.execute(
                select(CBI).where(
                    CBI.c.provider == bill.provider,
                    CBI.c.account == bill.account,
                    CBI.c.payload_sha256 == bill.payload_sha256,
                )
            )
        )
        .mappings()
        .one()
    )
    return _stored(row, created)


async def bill_for_day(
    conn: AsyncConnection, provider: str, account: str, day: date
) -> StoredBill | None:
    """The latest import of (provider, account) whose days include `day`, or None."""
    text = day.isoformat()
    row = (
        (
            await conn.execute(
                select(CBI)
                .where(
                    CBI.c.provider == provider,
                    CBI.c.account == account,
                    CBI.c.covers_from <= text,
                    CBI.c.covers_to >= text,
                )
                .order_by(CBI.c.id.desc())
                .limit(1)
            )
        )
        .mappings()
        .first()
    )
    return None if row is None else _stored(row, False)
