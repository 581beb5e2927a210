"""``vidroute tenants``: the tenants document (design 9.12.1): which service classes each tenant
may use, its weights, caps, project priorities, regions and CreateTask rate.

vidroute tenants get [VERSION] [--json]                   # the active document (or VERSION)
vidroute tenants publish FILE [--dry-run] [--source S]    # validate, show the diff, make active
        [--at TIME | --staged] [--reason R]               # ...at TIME, or later by `activate`
vidroute tenants activate VERSION [--at TIME] [--reason R]  # a staged version, now or at TIME
vidroute tenants rollback [VERSION] [--reason R]         # empty: the version before the active
vidroute tenants history [--json]                        # versions, then every activation

Admin. A bad file is one ``error: <path>: ...`` line per problem (exit 2) and nothing changes.
A publish or rollback is used by CreateTask within a second and by the next dispatch round on
every replica, without a restart.
"""

from __future__ import annotations

from typing import Any

import click

from clients.cli_documents import DocumentRpcs, add_read_commands, add_release_commands
from vidroute.scheduler.v1 import tenant_service_pb2, tenant_service_pb2_grpc

TIMEOUT_S = 60.0


def _stub(chan: Any) -> Any:
    return tenant_service_pb2_grpc.TenantServiceStub(chan)


@click.group("tenants")
def tenants() -> None:
    """Admin: the tenants document (get, publish, activate, rollback, history)."""


add_read_commands(
    tenants,
    "tenants",
    get=lambda chan, version: (
        _stub(chan)
        .GetTenantConfig(
            tenant_service_pb2.GetTenantConfigRequest(version=version), timeout=TIMEOUT_S
        )
        .config
    ),
    history=lambda chan: _stub(chan).ListTenantConfigHistory(
        tenant_service_pb2.ListTenantConfigHistoryRequest(), timeout=TIMEOUT_S
    ),
)
add_release_commands(
    tenants,
    "tenants document",
    DocumentRpcs(
        publish_request=tenant_service_pb2.PublishTenantConfigRequest,
        publish=lambda chan, r: _stub(chan).PublishTenantConfig(r, timeout=TIMEOUT_S),
        activate_request=tenant_service_pb2.ActivateTenantConfigRequest,
        activate=lambda chan, r: _stub(chan).ActivateTenantConfig(r, timeout=TIMEOUT_S),
        rollback_request=tenant_service_pb2.RollbackTenantConfigRequest,
        rollback=lambda chan, r: _stub(chan).RollbackTenantConfig(r, timeout=TIMEOUT_S),
        version=lambda reply: reply.config,
    ),
)
command = tenants
