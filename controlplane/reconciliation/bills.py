"""Provider bills imported from files (`vidroute usage import`): Google's Cloud Billing export
for Veo (`controlplane.domain.reconciliation_cloud_billing`).

`import_bill` reads a file whole (a row it cannot read stores nothing), names the account it
bills (the one given, or the provider's only account) and stores it raw with the UTC days it
covers: the days its rows' usage starts on, or ``covers`` when given (a day of the range with
no row of ours is then a zero bill, not an unread one). `imported_records` is what
reconciliation reads for an account's day: the usage records of the latest import covering it,
or None when no import covers it (then the account's adapter is asked, and a provider without
a usage API is NOT RECONCILED as before).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime

from controlplane.domain.reconciliation_cloud_billing import (
    SkuMap,
    Summary,
    parse_export,
    summarize,
    usage_records,
)
from controlplane.persistence import bill_imports
from controlplane.persistence.database import Database
from vidroute_core.adapter import UsageRecord

__all__ = ["BillRejected", "ImportedBill", "import_bill", "imported_records"]

DEFAULT_PROVIDER = "google"


class BillRejected(ValueError):
    """The file or the arguments cannot be imported; nothing was stored."""


@dataclass(frozen=True, slots=True)
class ImportedBill:
    stored: bill_imports.StoredBill
    summary: Summary


async def import_bill(
    db: Database,
    *,
    file_name: str,
    text: str,
    provider: str = DEFAULT_PROVIDER,
    account: str = "",
    sku_overrides: Sequence[str] = (),
    covers: tuple[date, date] | None = None,
    now: datetime | None = None,
) -> ImportedBill:
    """Store a Cloud Billing export file for (provider, account) (module doc)."""
    now = now or datetime.now(UTC)
    try:
        skus = SkuMap.with_overrides(sku_overrides)
        fmt, rows = parse_export(text)
    except ValueError as exc:
        raise BillRejected(str(exc)) from None
    summary = summarize(rows, skus)
    if covers is not None:
        first, last = covers
        if first > last:
            raise BillRejected(f"--from {first} is after --to {last}")
    elif summary.days:
        first, last = summary.days[0], summary.days[-1]
    else:
        raise BillRejected("the file has no row: give --from and --to for the days it covers")
    async with db.reads() as reads:
        accounts = [a for p, a in await reads.billed_accounts() if p == provider]
    if account and account not in accounts:
        known = ", ".join(accounts) or "none"
        raise BillRejected(f"no {provider} account {account!r} (configured: {known})")
    if not account:
        if len(accounts) != 1:
            known = ", ".join(accounts) or "none"
            raise BillRejected(f"name the {provider} account with --account (configured: {known})")
        [account] = accounts
    bill = bill_imports.BillImport(
        provider=provider,
        account=account,
        file_name=file_name,
        format=fmt,
        payload=text,
        payload_sha256=hashlib.sha256(text.encode("utf-8")).hexdigest(),
        sku_map=skus.to_json(),
        covers_from=first,
        covers_to=last,
        row_count=summary.rows,
        ours_count=summary.ours,
        cost_micros=summary.cost_micros,
        currency=summary.currency,
    )
    async with db.unit(now) as unit:
        stored = await unit.store_bill(bill)
    return ImportedBill(stored, summary)


async def imported_records(
    db: Database, provider: str, account: str, day: date
) -> tuple[int, list[UsageRecord]] | None:
    """(import id, the day's usage records) of the latest import covering `day`, or None."""
    async with db.reads() as reads:
        bill = await reads.bill_for_day(provider, account, day)
    if bill is None:
        return None
    _, rows = parse_export(bill.payload)
    return bill.id, usage_records(rows, day, SkuMap.from_json(bill.sku_map))
