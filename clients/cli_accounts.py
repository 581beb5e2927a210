"""``vidroute accounts``: the accounts document (design 9.11, 9.19.1): per provider account its
credential reference, whether it takes new work, its regions and its limits; and each account's
limits against its current use.

vidroute accounts get [VERSION] [--json]                   # the active document (or VERSION)
vidroute accounts publish FILE [--dry-run] [--source S]    # validate, show the diff, make active
        [--at TIME | --staged] [--reason R]                # ...at TIME, or later by `activate`
vidroute accounts activate VERSION [--at TIME] [--reason R]  # a staged version, now or at TIME
vidroute accounts rollback [VERSION] [--reason R]         # empty: the version before the active
vidroute accounts history [--json]                        # versions, then every activation
vidroute accounts usage [--json]                          # limit and use per lease dimension

Admin. A bad file is one ``error: <path>: ...`` line per problem (exit 2) and nothing changes.
A publication is used by the next dispatch round on every replica, without a restart.
"""

from __future__ import annotations

from typing import Any

import click

from clients.cli_client import channel
from clients.cli_common import connection, connection_options, json_option
from clients.cli_documents import (
    DocumentRpcs,
    add_read_commands,
    add_release_commands,
    print_message,
)
from clients.cli_render import console, table
from vidroute.scheduler.v1 import account_service_pb2 as api
from vidroute.scheduler.v1 import account_service_pb2_grpc

TIMEOUT_S = 60.0


def _stub(chan: Any) -> Any:
    return account_service_pb2_grpc.AccountServiceStub(chan)


@click.group("accounts")
def accounts() -> None:
    """Admin: the accounts document (get, publish, activate, rollback, history) and usage."""


add_read_commands(
    accounts,
    "accounts",
    get=lambda chan, version: (
        _stub(chan)
        .GetAccountConfig(api.GetAccountConfigRequest(version=version), timeout=TIMEOUT_S)
        .config
    ),
    history=lambda chan: _stub(chan).ListAccountConfigHistory(
        api.ListAccountConfigHistoryRequest(), timeout=TIMEOUT_S
    ),
)
add_release_commands(
    accounts,
    "accounts document",
    DocumentRpcs(
        publish_request=api.PublishAccountConfigRequest,
        publish=lambda chan, r: _stub(chan).PublishAccountConfig(r, timeout=TIMEOUT_S),
        activate_request=api.ActivateAccountConfigRequest,
        activate=lambda chan, r: _stub(chan).ActivateAccountConfig(r, timeout=TIMEOUT_S),
        rollback_request=api.RollbackAccountConfigRequest,
        rollback=lambda chan, r: _stub(chan).RollbackAccountConfig(r, timeout=TIMEOUT_S),
        version=lambda reply: reply.config,
    ),
)


@accounts.command("usage")
@json_option
@connection_options
def usage(*, as_json: bool, target: str | None, tls: bool | None, debug: bool) -> int:
    """Each account's concurrency limits against the slots held now, per lease dimension
    (LIMIT marked * when the accounts document sets it; USED - when the store is unreadable)."""
    with channel(connection(target, tls, debug)) as chan:
        reply = _stub(chan).GetAccountUsage(api.GetAccountUsageRequest(), timeout=TIMEOUT_S)
    if as_json:
        print_message(reply)
        return 0
    rows = table("PROVIDER", "ACCOUNT", "DIMENSION", "USED", "LIMIT", right=("USED", "LIMIT"))
    for d in reply.dimensions:
        used = "-" if d.used < 0 else str(d.used)
        limit = f"{d.limit}{'*' if d.configured else ''}"
        rows.add_row(d.provider, d.account, d.dimension, used, limit)
    console().print(rows)
    return 0


command = accounts
