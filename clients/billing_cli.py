"""The money commands of the `vidroute` CLI (BillingService; design 9.23).

vidroute balance [--tenant T] [--currency USD]             balance, reserved and available
vidroute ledger [--tenant T] [--limit N] [--task ID] [--from D --to D]   entries, oldest first
vidroute credit --tenant T --amount-micros N --currency C --key K [--reason R]   admin: add credit
vidroute costs [--provider P] [--model M] [--days N]       admin: unit cost per successful delivery
vidroute costs --from D --to D [--by day|tenant|provider|model] [--csv]
                                                           admin: revenue, cost, loss, margin

Each prints a table, or JSON with ``--json`` (the response messages, proto field names). The
tenant defaults to the caller's own (a tenant token); an admin token names one. Amounts are
printed from integer micros without floats (``12.340000 USD``).
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Callable, Iterable, Sequence
from types import SimpleNamespace
from typing import Any

import click
from google.protobuf import duration_pb2, json_format
from google.protobuf.message import Message

from clients.cli_client import channel
from clients.cli_common import connection, connection_options, json_option
from vidroute.scheduler.v1 import billing_pb2, billing_service_pb2, billing_service_pb2_grpc

COMMANDS = ("balance", "ledger", "credit", "costs")
MAX_PAGE = 500
_KIND_NAMES = {
    n: name.removeprefix("LEDGER_ENTRY_KIND_") for name, n in billing_pb2.LedgerEntryKind.items()
}


def money(micros: int, currency: str = "") -> str:
    """Integer micros as a decimal string with six places (no float on the way)."""
    sign = "-" if micros < 0 else ""
    whole, frac = divmod(abs(micros), 1_000_000)
    text = f"{sign}{whole}.{frac:06d}"
    return f"{text} {currency}".rstrip()


def _table(
    header: Sequence[str], rows: Iterable[Sequence[object]], right: frozenset[int] = frozenset()
) -> str:
    """A fixed-width table; columns whose index is in `right` (amounts, counts) right-aligned."""
    cells = [list(header), *([str(c) for c in row] for row in rows)]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    return "\n".join(
        "  ".join(
            c.rjust(w) if i in right else c.ljust(w)
            for i, (c, w) in enumerate(zip(r, widths, strict=True))
        ).rstrip()
        for r in cells
    )


def _dump(message: Message | Sequence[Message], key: str = "") -> str:
    if isinstance(message, Message):
        data: Any = json_format.MessageToDict(message, preserving_proto_field_name=True)
    else:
        data = {
            key: [json_format.MessageToDict(m, preserving_proto_field_name=True) for m in message]
        }
    return json.dumps(data, indent=2, sort_keys=True)


def _balance(args: Any, stub: billing_service_pb2_grpc.BillingServiceStub) -> str:
    reply = stub.GetBalance(
        billing_service_pb2.GetBalanceRequest(tenant_id=args.tenant, currency=args.currency),
        timeout=args.timeout,
    )
    if args.json:
        return _dump(reply)
    b = reply.balance
    return _table(
        ["TENANT", "CURRENCY", "BALANCE", "RESERVED", "AVAILABLE", "AS OF ENTRY"],
        [
            [
                b.tenant_id,
                b.currency,
                money(b.balance_micros),
                money(b.reserved_micros),
                money(b.available_micros),
                b.as_of_entry_id,
            ]
        ],
        right=frozenset({2, 3, 4, 5}),
    )


def _ledger(args: Any, stub: billing_service_pb2_grpc.BillingServiceStub) -> str:
    entries: list[billing_pb2.LedgerEntry] = []
    token, more = "", False
    while len(entries) < args.limit:
        reply = stub.ListLedgerEntries(
            billing_service_pb2.ListLedgerEntriesRequest(
                tenant_id=args.tenant,
                page_size=min(MAX_PAGE, args.limit - len(entries)),
                page_token=token,
                task_id=args.task,
                from_date=args.first,
                to_date=args.last,
            ),
            timeout=args.timeout,
        )
        entries.extend(reply.entries)
        token = reply.next_page_token
        more = bool(token)
        if not token:
            break
    if args.json:
        return _dump(entries, "entries")
    text = _table(
        ["ID", "KIND", "AMOUNT", "CURRENCY", "TASK", "CREATED", "KEY", "REASON"],
        [
            [
                e.entry_id,
                _KIND_NAMES.get(e.kind, str(e.kind)),
                money(e.amount_micros),
                e.currency,
                e.task_id or "-",
                e.created_at.ToDatetime().strftime("%Y-%m-%d %H:%M:%S"),
                e.idempotency_key,
                e.reason,
            ]
            for e in entries
        ],
        right=frozenset({0, 2, 4}),
    )
    if more:
        text += f"\n(more entries after {entries[-1].entry_id}: raise --limit)"
    return text


def _credit(args: Any, stub: billing_service_pb2_grpc.BillingServiceStub) -> str:
    reply = stub.CreditTenant(
        billing_service_pb2.CreditTenantRequest(
            tenant_id=args.tenant,
            amount_micros=args.amount_micros,
            currency=args.currency,
            idempotency_key=args.key,
            reason=args.reason,
        ),
        timeout=args.timeout,
    )
    if args.json:
        return _dump(reply)
    e = reply.entry
    what = "credited" if reply.created else "already credited (same key)"
    return f"{what}: entry {e.entry_id}  {e.tenant_id}  {money(e.amount_micros, e.currency)}"


_GROUPS = {
    "day": billing_pb2.MARGIN_GROUPING_DAY,
    "tenant": billing_pb2.MARGIN_GROUPING_TENANT,
    "provider": billing_pb2.MARGIN_GROUPING_PROVIDER,
    "model": billing_pb2.MARGIN_GROUPING_MODEL,
}
MARGIN_COLUMNS = (
    "key", "currency", "revenue_micros", "provider_cost_micros", "platform_loss_micros",
    "margin_micros",
)  # fmt: skip


def margins_csv(rows: Sequence[billing_pb2.MarginRow], by: str) -> str:
    """The margin rows as CSV: integer micros (exact, for a spreadsheet to divide), the
    group's column named after --by."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow([by, *MARGIN_COLUMNS[1:]])
    for r in rows:
        writer.writerow([getattr(r, c) for c in MARGIN_COLUMNS])
    return out.getvalue().rstrip("\n")


def _margins(args: Any, stub: billing_service_pb2_grpc.BillingServiceStub) -> str:
    reply = stub.GetMargins(
        billing_service_pb2.GetMarginsRequest(
            from_date=args.first, to_date=args.last, group_by=_GROUPS[args.by]
        ),
        timeout=args.timeout,
    )
    if args.json:
        return _dump(reply)
    if args.csv:
        return margins_csv(reply.rows, args.by)
    table = _table(
        [args.by.upper(), "CUR", "REVENUE", "PROVIDER COST", "PLATFORM LOSS", "MARGIN"],
        [
            [r.key, r.currency, money(r.revenue_micros), money(r.provider_cost_micros),
             money(r.platform_loss_micros), money(r.margin_micros)]
            for r in reply.rows
        ],
        right=frozenset(range(2, 6)),
    )  # fmt: skip
    return f"margin {args.first} .. {args.last} (UTC days) by {args.by}\n{table}"


def _costs(args: Any, stub: billing_service_pb2_grpc.BillingServiceStub) -> str:
    if args.first or args.last:
        if not (args.first and args.last):
            raise click.UsageError("give both --from and --to")
        return _margins(args, stub)
    if args.csv:
        raise click.UsageError("--csv is for the margin view: give --from and --to")
    reply = stub.GetUnitCosts(
        billing_service_pb2.GetUnitCostsRequest(
            provider=args.provider,
            model=args.model,
            window=duration_pb2.Duration(seconds=args.days * 86400),
        ),
        timeout=args.timeout,
    )
    if args.json:
        return _dump(reply)
    start = reply.window_start.ToDatetime().strftime("%Y-%m-%d %H:%M")
    end = reply.window_end.ToDatetime().strftime("%Y-%m-%d %H:%M")
    table = _table(
        ["PROVIDER", "MODEL", "CUR", "SUCCESSES", "GENERATION", "RETRY", "FETCH", "LOSS",
         "TOTAL", "PER SUCCESS"],
        [
            [
                r.provider,
                r.model,
                r.currency,
                r.successes,
                money(r.generation_micros),
                money(r.retry_micros),
                money(r.fetch_micros),
                money(r.platform_loss_micros),
                money(r.total_micros),
                money(r.cost_per_success_micros) if r.successes else "-",
            ]
            for r in reply.unit_costs
        ],
        right=frozenset(range(3, 10)),
    )  # fmt: skip
    return f"unit cost of successful delivery, {start} .. {end} UTC\n{table}"


_RUN: dict[str, Callable[[Any, billing_service_pb2_grpc.BillingServiceStub], str]] = {
    "balance": _balance,
    "ledger": _ledger,
    "credit": _credit,
    "costs": _costs,
}


_RPC_TIMEOUT_S = 10  # an int: this module handles money, and its float scan stays meaningful
_HELP = {
    "balance": "A tenant's balance, reservations and available credit.",
    "ledger": "A tenant's credit ledger entries, oldest first.",
    "credit": "Admin: add credit to a tenant (idempotent by --key).",
    "costs": "Admin: unit cost per successful delivery, or (--from/--to) the margin view.",
}


def _command(name: str) -> Callable[..., int]:
    """The click callback of one money command: resolve the connection, call, print."""

    def run(target: str | None, tls: bool | None, debug: bool, **options: Any) -> int:
        args = SimpleNamespace(
            command=name, timeout=_RPC_TIMEOUT_S, json=options.pop("as_json"), **options
        )
        conn = connection(target, tls, debug)
        with channel(conn) as chan:
            print(_RUN[name](args, billing_service_pb2_grpc.BillingServiceStub(chan)))
        return 0

    run.__doc__ = _HELP[name]
    return run


def commands() -> list[click.Command]:
    """The money commands, for the `vidroute` group."""
    tenant_help = "Tenant (default: the caller's own tenant)."
    options: dict[str, list[Callable[[Any], Any]]] = {
        "balance": [
            click.option("--tenant", default="", help=tenant_help),
            click.option("--currency", default="", help="ISO 4217 code (default USD)."),
        ],
        "ledger": [
            click.option("--tenant", default="", help=tenant_help),
            click.option("--limit", type=click.IntRange(1), default=50, show_default=True,
                         help="Entries to print."),
            click.option("--task", default="", help="Only this task's entries."),
            click.option("--from", "first", default="", metavar="YYYY-MM-DD",
                         help="Only entries written on or after this UTC day."),
            click.option("--to", "last", default="", metavar="YYYY-MM-DD",
                         help="Only entries written on or before this UTC day."),
        ],
        "credit": [
            click.option("--tenant", required=True, help="Tenant to credit."),
            click.option("--amount-micros", type=int, required=True, help="1 USD = 1000000."),
            click.option("--currency", required=True, help="ISO 4217 code, e.g. USD."),
            click.option("--key", required=True,
                         help="Idempotency key: retry with the same one."),
            click.option("--reason", default="", help="Why, for the ledger."),
        ],
        "costs": [
            click.option("--provider", default="", help="Only this provider."),
            click.option("--model", default="", help="Only this model."),
            click.option("--days", type=click.IntRange(0, 366), default=7, show_default=True,
                         help="Window ending now, in days."),
            click.option("--from", "first", default="", metavar="YYYY-MM-DD",
                         help="Margin view: first UTC day (with --to)."),
            click.option("--to", "last", default="", metavar="YYYY-MM-DD",
                         help="Margin view: last UTC day, inclusive."),
            click.option("--by", type=click.Choice(list(_GROUPS)), default="day",
                         show_default=True, help="Margin view: group rows by."),
            click.option("--csv", is_flag=True, help="Margin view: print CSV (integer micros)."),
        ],
    }  # fmt: skip
    built = []
    for name in COMMANDS:
        func: Any = _command(name)
        for decorate in reversed([*options[name], json_option, connection_options]):
            func = decorate(func)
        built.append(click.command(name, help=_HELP[name])(func))
    return built
