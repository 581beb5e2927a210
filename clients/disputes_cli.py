"""``vidroute disputes``: book a reconciliation row as a confirmed loss and follow its dispute
(`controlplane.reconciliation.disputes`; design 9.23.4).

    vidroute disputes list [--state OPEN] [--from D --to D] [--json]
    vidroute disputes open ROW_ID --reason "..."          book row ROW_ID of a reconcile report
    vidroute disputes move DISPUTE_ID disputed|refunded|written_off --reason "..."
                           [--refunded-micros N]           (refunded: what the provider gave back)

Like ``reconcile`` it runs against the configured database (``VIDROUTE_DATABASE_URL``), as the
admin at the console (``--actor``, default ``$USER``). Exit status: 0 done, 2 refused (one line
with the reason and the numbers: not a loss, an illegal move, a refund out of range, an unknown
id, the database away).
"""

from __future__ import annotations

import asyncio
import getpass
import json
import sys
from collections.abc import Awaitable, Callable
from datetime import date
from typing import Any

import click

from clients.reconcile_cli import money

DONE, REFUSED = 0, 2
TARGETS = ("disputed", "refunded", "written_off")


def _day(ctx: click.Context, param: click.Parameter, text: str | None) -> date | None:
    if text is None:
        return None
    try:
        return date.fromisoformat(text)
    except ValueError:
        raise click.BadParameter(f"not a date YYYY-MM-DD: {text!r}") from None


def dispute_json(d: Any) -> dict[str, Any]:
    return {
        "dispute_id": d.id,
        "discrepancy_id": d.discrepancy_id,
        "day": d.day,
        "kind": d.kind,
        "provider": d.provider,
        "account": d.account,
        "model": d.model,
        "attempt_id": d.attempt_id,
        "task_id": d.task_id,
        "billed_micros": d.billed_micros,
        "expected_micros": d.expected_micros,
        "confirmed_micros": d.confirmed_micros,
        "new_loss_micros": d.new_loss_micros,
        "refunded_micros": d.refunded_micros,
        "currency": d.currency,
        "state": d.state,
    }


def dispute_line(d: Any) -> str:
    who = f"attempt {d.attempt_id} task {d.task_id}" if d.attempt_id is not None else "no attempt"
    return (
        f"{d.id:>6}  {d.state:<11} {d.day}  {d.kind:<26} {d.provider}/{d.account} {who}  "
        f"loss {money(d.confirmed_micros, d.currency)} (new {money(d.new_loss_micros)}) "
        f"refunded {money(d.refunded_micros)}"
    )


def _run(work: Callable[[Any], Awaitable[Any]], as_json: bool) -> int:
    async def go() -> int:
        from controlplane.bootstrap import Settings
        from controlplane.persistence.database import Database
        from controlplane.persistence.errors import StoreUnavailable
        from vidroute_core.exceptions import NotFound, PreconditionFailed

        db = Database.from_url(Settings.from_env().database_url)
        try:
            result = await work(db)
        except PreconditionFailed as exc:
            numbers = " ".join(f"{k}={v}" for k, v in sorted(exc.numbers.items()))
            print(f"error: FAILED_PRECONDITION: {exc.message} {numbers}".rstrip(), file=sys.stderr)
            return REFUSED
        except NotFound as exc:
            print(f"error: NOT_FOUND: {exc}", file=sys.stderr)
            return REFUSED
        except StoreUnavailable as exc:
            print(f"error: UNAVAILABLE: database: {exc}", file=sys.stderr)
            return REFUSED
        finally:
            await db.dispose()
        items = result if isinstance(result, list) else [result]
        if as_json:
            print(json.dumps([dispute_json(d) for d in items], indent=2, sort_keys=True))
        else:
            print("\n".join(dispute_line(d) for d in items) or "no disputes")
        return DONE

    return asyncio.run(go())


@click.group("disputes")
def command() -> None:
    """Admin: book confirmed losses and follow their disputes with the provider."""


@command.command("list")
@click.option(
    "--state",
    type=click.Choice(["OPEN", "DISPUTED", "REFUNDED", "WRITTEN_OFF"]),
    default=None,
    help="Only disputes in this state.",
)
@click.option(
    "--from",
    "first",
    callback=_day,
    default=None,
    metavar="YYYY-MM-DD",
    help="Bill days from (inclusive).",
)
@click.option(
    "--to",
    "last",
    callback=_day,
    default=None,
    metavar="YYYY-MM-DD",
    help="Bill days to (inclusive).",
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def list_(state: str | None, first: date | None, last: date | None, as_json: bool) -> int:
    """Booked losses and their dispute state, oldest first."""
    from controlplane.reconciliation.disputes import list_disputes

    return _run(lambda db: list_disputes(db, state=state or "", start=first, end=last), as_json)


@command.command("open")
@click.argument("row_id", type=click.IntRange(1))
@click.option("--reason", required=True, help="Why (kept with the booking).")
@click.option("--actor", default=None, help="Who (default: the login name).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def open_(row_id: int, reason: str, actor: str | None, as_json: bool) -> int:
    """Book reconciliation row ROW_ID as a confirmed loss (its dispute starts OPEN)."""
    from controlplane.reconciliation.disputes import book_loss

    async def work(db: Any) -> Any:
        booked = await book_loss(db, row_id, actor=actor or getpass.getuser(), reason=reason)
        return booked.dispute

    return _run(work, as_json)


@command.command("move")
@click.argument("dispute_id", type=click.IntRange(1))
@click.argument("target", type=click.Choice(TARGETS))
@click.option("--reason", required=True, help="Why (kept in the dispute's events).")
@click.option(
    "--refunded-micros",
    type=click.IntRange(0),
    default=0,
    help="refunded: what the provider credited back, 1..the booked loss.",
)
@click.option("--actor", default=None, help="Who (default: the login name).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def move_(  # noqa: PLR0917 - click passes one argument per option
    dispute_id: int,
    target: str,
    reason: str,
    refunded_micros: int,
    actor: str | None,
    as_json: bool,
) -> int:
    """Move a dispute: disputed (claim sent), refunded, written_off."""
    from controlplane.domain.disputes import DisputeState
    from controlplane.reconciliation.disputes import move_dispute

    return _run(
        lambda db: move_dispute(
            db,
            dispute_id,
            DisputeState(target.upper()),
            actor=actor or getpass.getuser(),
            reason=reason,
            refunded_micros=refunded_micros,
        ),
        as_json,
    )
