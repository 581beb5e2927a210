"""``vidroute tenants``: the tenants document (design 9.12.1): which service classes each tenant
may use, its weights, caps, project priorities, regions and CreateTask rate.

vidroute tenants get [VERSION] [--json]                   # the active document (or VERSION)
vidroute tenants publish FILE [--dry-run] [--source S]    # validate, then make it active
vidroute tenants rollback [VERSION]                      # empty: the version before the active
vidroute tenants history [--json]                        # versions, then every activation

Admin. A bad file is one ``error: <path>: ...`` line per problem (exit 2) and nothing changes.
A publish or rollback is used by CreateTask within a second and by the next dispatch round on
every replica, without a restart.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from clients.cli_client import channel
from clients.cli_common import connection, connection_options, json_option
from clients.cli_documents import print_message, print_published, publish_options, version_line
from clients.cli_render import when
from vidroute.scheduler.v1 import tenant_pb2, tenant_service_pb2, tenant_service_pb2_grpc

TIMEOUT_S = 60.0
_ACTIONS = {
    tenant_pb2.TENANT_CONFIG_ACTION_PUBLISHED: "published",
    tenant_pb2.TENANT_CONFIG_ACTION_ROLLED_BACK: "rolled back",
}


def _stub(chan: Any) -> Any:
    return tenant_service_pb2_grpc.TenantServiceStub(chan)


@click.group("tenants")
def tenants() -> None:
    """Admin: the tenants document (get, publish, rollback, history)."""


@tenants.command("get")
@click.argument("version", required=False, default="")
@json_option
@connection_options
def get(*, version: str, as_json: bool, target: str | None, tls: bool | None, debug: bool) -> int:
    """Print the active tenants document (or VERSION's), as published."""
    request = tenant_service_pb2.GetTenantConfigRequest(version=version)
    with channel(connection(target, tls, debug)) as chan:
        config = _stub(chan).GetTenantConfig(request, timeout=TIMEOUT_S).config
    if as_json:
        print_message(config)
        return 0
    state = "active" if config.active else "not active"
    print(f"# {config.version} ({state}; {config.source or 'no source'})")
    print(config.document, end="" if config.document.endswith("\n") else "\n")
    return 0


@tenants.command("publish")
@publish_options
@json_option
@connection_options
def publish(
    *,
    file: Path,
    dry_run: bool,
    source: str | None,
    as_json: bool,
    target: str | None,
    tls: bool | None,
    debug: bool,
) -> int:
    """Validate a tenants document and make it the active version."""
    request = tenant_service_pb2.PublishTenantConfigRequest(
        document=file.read_text(encoding="utf-8"), source=source or file.name, dry_run=dry_run
    )
    with channel(connection(target, tls, debug)) as chan:
        config = _stub(chan).PublishTenantConfig(request, timeout=TIMEOUT_S).config
    if as_json:
        print_message(config)
        return 0
    print_published(config, dry_run=dry_run, rollback="vidroute tenants rollback")
    return 0


@tenants.command("rollback")
@click.argument("version", required=False, default="")
@json_option
@connection_options
def rollback(
    *, version: str, as_json: bool, target: str | None, tls: bool | None, debug: bool
) -> int:
    """Make VERSION active again (default: the version published before the active one)."""
    request = tenant_service_pb2.RollbackTenantConfigRequest(version=version)
    with channel(connection(target, tls, debug)) as chan:
        config = _stub(chan).RollbackTenantConfig(request, timeout=TIMEOUT_S).config
    if as_json:
        print_message(config)
        return 0
    print(f"{config.version}: active")
    return 0


@tenants.command("history")
@json_option
@connection_options
def history(*, as_json: bool, target: str | None, tls: bool | None, debug: bool) -> int:
    """Every published version (newest first; * marks the active one), then every activation:
    when, who, which version, and the one it replaced."""
    with channel(connection(target, tls, debug)) as chan:
        reply = _stub(chan).ListTenantConfigHistory(
            tenant_service_pb2.ListTenantConfigHistoryRequest(), timeout=TIMEOUT_S
        )
    if as_json:
        print_message(reply)
        return 0
    if not reply.versions:
        print("no tenants document published (the built-in one is in use)")
        return 0
    for v in reply.versions:
        print(version_line(v))
    print()
    for a in reply.activations:
        replaced = f" (replacing {a.previous_version})" if a.previous_version else ""
        action = _ACTIONS.get(a.action, "?")
        print(f"{when(a.at)}  {a.actor}  {action} {a.version}{replaced}")
    return 0


command = tenants
