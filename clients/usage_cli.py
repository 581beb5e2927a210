"""``vidroute usage import FILE``: a provider's bill file for reconciliation (design 9.23.3).

Google has no usage API for Veo: its bill is the Cloud Billing export a finance team takes from
BigQuery (standard usage cost table; newline-delimited JSON, a JSON array or a flattened CSV,
`controlplane.domain.reconciliation_cloud_billing`). This stores the file, raw and once, for a
provider account (``--account``, else the provider's only account); ``vidroute reconcile``
then reads the account's days from the latest import covering them instead of asking the
adapter. Like ``reconcile`` it runs against the configured database
(``VIDROUTE_DATABASE_URL``).

Prints what the file holds (rows, Veo rows by model and labelled with our attempt, other SKUs
left aside, the days covered, our cost) or JSON with ``--json``. Exit status: 0 stored (or
already stored: the same file again changes nothing), 2 nothing stored (a row that cannot be
read, with its line and column; an unknown account; the database away).
"""

from __future__ import annotations

import asyncio
import json
import sys
from datetime import date
from pathlib import Path
from typing import Any

import click

from clients.reconcile_cli import money

STORED, REJECTED = 0, 2


def _day(ctx: click.Context, param: click.Parameter, text: str | None) -> date | None:
    if text is None:
        return None
    try:
        return date.fromisoformat(text)
    except ValueError:
        raise click.BadParameter(f"not a date YYYY-MM-DD: {text!r}") from None


@click.group("usage")
def command() -> None:
    """Provider usage bills imported from files (Google Cloud Billing export for Veo)."""


@command.command("import")
@click.argument("file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--provider", default="google", show_default=True, help="Provider of the bill.")
@click.option("--account", default="", help="Provider account (default: the provider's only).")
@click.option(
    "--from",
    "first",
    callback=_day,
    default=None,
    metavar="YYYY-MM-DD",
    help="First UTC day the file covers (default: its first row's day).",
)
@click.option(
    "--to",
    "last",
    callback=_day,
    default=None,
    metavar="YYYY-MM-DD",
    help="Last UTC day the file covers (default: its last row's day).",
)
@click.option(
    "--sku",
    "skus",
    multiple=True,
    metavar="PATTERN=MODEL",
    help="SKU description regex -> model, ahead of the shipped map (repeatable).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
def import_(  # noqa: PLR0917 - click passes one argument per option
    file: Path,
    provider: str,
    account: str,
    first: date | None,
    last: date | None,
    skus: tuple[str, ...],
    as_json: bool,
) -> int:
    """Import a Cloud Billing export file as a provider account's bill."""
    if (first is None) != (last is None):
        print("error: give both --from and --to, or neither", file=sys.stderr)
        return REJECTED
    covers = (first, last) if first is not None and last is not None else None
    try:
        text = file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        print(f"error: {file}: {exc}", file=sys.stderr)
        return REJECTED
    return asyncio.run(_import(file.name, text, provider, account, skus, covers, as_json))


def result_json(imported: Any) -> dict[str, Any]:
    s, b = imported.summary, imported.stored
    return {
        "import_id": b.id,
        "created": b.created,
        "provider": b.provider,
        "account": b.account,
        "file_name": b.file_name,
        "format": b.format,
        "sha256": b.payload_sha256,
        "covers_from": b.covers_from.isoformat(),
        "covers_to": b.covers_to.isoformat(),
        "rows": s.rows,
        "ours": s.ours,
        "labelled": s.labelled,
        "by_model": dict(s.by_model),
        "other_skus": dict(s.others),
        "not_regular": s.not_regular,
        "cost_micros": s.cost_micros,
        "currency": s.currency,
    }


def result_lines(imported: Any) -> list[str]:
    s, b = imported.summary, imported.stored
    what = "imported" if b.created else "already imported (same file)"
    lines = [
        f"{what}: import {b.id}  {b.provider}/{b.account}  {b.file_name} ({b.format})",
        f"covers {b.covers_from.isoformat()} .. {b.covers_to.isoformat()} (UTC days)",
        f"rows {s.rows}: ours {s.ours} ({s.labelled} labelled with our attempt), "
        f"cost {money(s.cost_micros, s.currency)}",
    ]
    lines += [f"  {model:<36} {n} rows" for model, n in s.by_model.items()]
    if s.not_regular:
        lines.append(f"  {s.not_regular} rows of ours not cost_type regular (left aside)")
    if s.others:
        lines.append("other SKUs (not Veo generation, left aside):")
        lines += [f"  {sku:<36} {n} rows" for sku, n in s.others.items()]
    return lines


async def _import(  # noqa: PLR0917 - the command's options, one call site
    file_name: str,
    text: str,
    provider: str,
    account: str,
    skus: tuple[str, ...],
    covers: tuple[date, date] | None,
    as_json: bool,
) -> int:
    from controlplane.bootstrap import Settings
    from controlplane.persistence.database import Database
    from controlplane.persistence.errors import StoreUnavailable
    from controlplane.reconciliation.bills import BillRejected, import_bill

    settings = Settings.from_env()
    db = Database.from_url(settings.database_url)
    try:
        imported = await import_bill(
            db,
            file_name=file_name,
            text=text,
            provider=provider,
            account=account,
            sku_overrides=skus,
            covers=covers,
        )
    except BillRejected as exc:
        print(f"error: INVALID_ARGUMENT: {file_name}: {exc}", file=sys.stderr)
        return REJECTED
    except StoreUnavailable as exc:
        print(f"error: UNAVAILABLE: database: {exc}", file=sys.stderr)
        return REJECTED
    finally:
        await db.dispose()
    if as_json:
        print(json.dumps(result_json(imported), indent=2, sort_keys=True))
    else:
        print("\n".join(result_lines(imported)))
    return STORED
