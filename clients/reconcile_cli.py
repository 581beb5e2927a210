"""``vidroute reconcile [--date YYYY-MM-DD] [--json]``: the daily bill reconciliation (9.23.3).

Runs against the configured database (``VIDROUTE_DATABASE_URL``) and adapter sidecars
(``VIDROUTE_ADAPTERS``; an account's day with an imported bill file is read from the file), the
same environment as the control plane (the Kubernetes CronJob
runs it with the Deployment's). The day defaults to yesterday (UTC). Prints one summary line
per provider account (billed, expected, delta, records by status) and one line per
discrepancy, or the report as JSON. Running a day again writes nothing new and prints the same.

Exit status (`exit_code`), so a CronJob or a script can tell a clean day from one to read:

* 0: every configured provider account was read and the day has no discrepancy;
* 1: every account was read and the day has discrepancies (the rows to read);
* 2: the day is NOT RECONCILED: an account's bill could not be read (its adapter away, no
  adapter serves it, or its provider has no usage export at all and no bill file was imported
  for the day with ``vidroute usage import``, like Veo's;
  the others are still reconciled and stored), no provider adapter or account is configured
  (nothing is stored: an empty run is not a clean day), the database is away, or the
  arguments are bad. Never 0 with an account unread.
"""

from __future__ import annotations

import asyncio
import json
import sys
from datetime import UTC, date, datetime, timedelta
from typing import Any

import click


def _day(ctx: click.Context, param: click.Parameter, text: str | None) -> date | None:
    if text is None:
        return None
    try:
        return date.fromisoformat(text)
    except ValueError:
        raise click.BadParameter(f"not a date YYYY-MM-DD: {text!r}") from None


@click.command("reconcile")
@click.option(
    "--date",
    "day",
    default=None,
    callback=_day,
    metavar="YYYY-MM-DD",
    help="UTC day to reconcile (default: yesterday, UTC).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
def command(day: date | None, as_json: bool) -> int:
    """Reconcile a day's provider bills against our usage (default yesterday)."""
    return run(day, as_json)


def money(micros: int, currency: str = "") -> str:
    """Integer micros as a decimal string with six places (no float on the way)."""
    sign = "-" if micros < 0 else ""
    whole, frac = divmod(abs(micros), 1_000_000)
    return f"{sign}{whole}.{frac:06d} {currency}".rstrip()


def report_json(report: Any) -> dict[str, Any]:
    return {
        "day": report.day.isoformat(),
        "runs": [
            {
                "run_id": r.run_id,
                "provider": r.provider,
                "account": r.account,
                "billed_micros": r.billed_micros,
                "expected_micros": r.expected_micros,
                "delta_micros": r.delta_micros,
                "currency": r.currency,
                "record_count": r.record_count,
                "status_counts": dict(r.status_counts),
                "discrepancies": [
                    {
                        "row_id": d.row_id,
                        "kind": d.kind.value,
                        "provider": d.provider,
                        "account": d.account,
                        "model": d.model,
                        "attempt_id": d.attempt_id,
                        "task_id": d.task_id,
                        "provider_job_id": d.provider_job_id,
                        "record_ids": list(d.record_ids),
                        "billed_micros": d.billed_micros,
                        "expected_micros": d.expected_micros,
                        "delta_micros": d.delta_micros,
                        "currency": d.currency,
                        "suggested_action": d.suggested_action,
                        "evidence": dict(d.evidence),
                    }
                    for d in r.discrepancies
                ],
            }
            for r in report.runs
        ],
        "errors": [
            {
                "provider": e.provider,
                "account": e.account,
                "error_class": e.error_class,
                "message": e.message,
            }
            for e in report.errors
        ],
        "written_runs": list(report.written),
        "result": VERDICTS[exit_code(report)],
        "exit_code": exit_code(report),
    }


CLEAN, DISCREPANCIES, NOT_RECONCILED = 0, 1, 2
VERDICTS = {
    CLEAN: "clean",
    DISCREPANCIES: "discrepancies found",
    NOT_RECONCILED: "NOT RECONCILED (an account's bill was not read)",
}


def exit_code(report: Any) -> int:
    """The module doc's exit status of a finished run: an unread account outranks rows."""
    if report.errors:
        return NOT_RECONCILED
    return DISCREPANCIES if report.discrepancies else CLEAN


def report_lines(report: Any) -> list[str]:
    lines = [
        f"reconciliation {report.day.isoformat()}",
        f"{'provider':<14} {'account':<14} {'billed':>18} {'expected':>18} {'delta':>18}  records",
    ]
    for r in report.runs:
        counts = " ".join(f"{k}={v}" for k, v in r.status_counts.items()) or "-"
        lines.append(
            f"{r.provider:<14} {r.account or '-':<14} {money(r.billed_micros):>18} "
            f"{money(r.expected_micros):>18} {money(r.delta_micros):>18}  {counts}"
        )
    for e in report.errors:
        lines.append(
            f"{e.provider:<14} {e.account:<14} NOT RECONCILED: {e.error_class}: {e.message}"
        )
    rows = report.discrepancies
    lines.append(f"discrepancies: {len(rows)}")
    lines.append(f"result: {VERDICTS[exit_code(report)]}")
    for d in rows:
        who = f"attempt {d.attempt_id}" if d.attempt_id is not None else "no attempt"
        if d.task_id is not None:
            who += f" task {d.task_id}"
        job = f" job {d.provider_job_id}" if d.provider_job_id else ""
        row = f"row {d.row_id} " if d.row_id is not None else ""
        where = f"{d.provider}/{d.account or '-'} {d.model or '-'}"
        lines.append(
            f"  {row}{d.kind.value:<28} {where} {who}{job} "
            f"billed {money(d.billed_micros, d.currency)} expected "
            f"{money(d.expected_micros, d.currency)} -> {d.suggested_action}"
        )
    return lines


async def _reconcile(day: date, as_json: bool) -> int:
    from controlplane.bootstrap import Settings
    from controlplane.persistence.database import Database
    from controlplane.persistence.errors import StoreUnavailable
    from controlplane.persistence.reconciliation_store import schema_ready
    from controlplane.reconciliation import NothingToReconcile, run_day
    from controlplane.reconciliation.clients import adapter_clients

    settings = Settings.from_env()
    try:
        ready = await schema_ready(settings.database_url)
    except Exception as exc:  # the driver's own error: the database is away or refuses us
        print(f"error: UNAVAILABLE: database: {exc}", file=sys.stderr)
        return NOT_RECONCILED
    if not ready:
        print(
            "error: FAILED_PRECONDITION: the database has no reconciliation tables yet "
            "(run `vidroute migrate`, or start the control plane once)",
            file=sys.stderr,
        )
        return NOT_RECONCILED
    db = Database.from_url(settings.database_url)
    clients = adapter_clients(settings)
    try:
        report = await run_day(db, clients, day)
    except StoreUnavailable as exc:
        print(f"error: UNAVAILABLE: database: {exc}", file=sys.stderr)
        return NOT_RECONCILED
    except NothingToReconcile as exc:
        print(f"error: FAILED_PRECONDITION: NOT RECONCILED: {exc}", file=sys.stderr)
        return NOT_RECONCILED
    finally:
        for client in clients.values():
            await client.close()
        await db.dispose()
    if as_json:
        print(json.dumps(report_json(report), indent=2, sort_keys=True))
    else:
        print("\n".join(report_lines(report)))
    return exit_code(report)


def run(day: date | None, as_json: bool) -> int:
    today = datetime.now(UTC).date()
    day = day or (today - timedelta(days=1))
    if day > today:
        # Nothing can have been billed yet; a run would only store empty imports.
        print(
            f"error: --date {day.isoformat()} is after today ({today.isoformat()}, UTC)",
            file=sys.stderr,
        )
        return NOT_RECONCILED
    return asyncio.run(_reconcile(day, as_json))
