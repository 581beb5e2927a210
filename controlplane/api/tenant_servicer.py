"""`vidroute.scheduler.v1.TenantService`: a translator between protobuf and the tenants service.

No SQL here: each method decodes the request, calls `controlplane.service.tenants`, and encodes
the result. Domain errors become statuses in `vidroute_core.wire.status.DomainErrorInterceptor`;
the caller comes from `controlplane.api.auth`, as for the scheduler API.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from google.protobuf import timestamp_pb2

from controlplane.api.auth import require_caller
from controlplane.domain.tenants import BUILTIN_VERSION
from controlplane.persistence.documents import ActivationRow, DocumentRow
from controlplane.service.access import Caller
from controlplane.service.tenants import TenantConfigService
from vidroute.scheduler.v1 import tenant_pb2, tenant_service_pb2, tenant_service_pb2_grpc

_ACTIONS = {
    "PUBLISHED": tenant_pb2.TENANT_CONFIG_ACTION_PUBLISHED,
    "ROLLED_BACK": tenant_pb2.TENANT_CONFIG_ACTION_ROLLED_BACK,
}


def _ts(at: datetime | None) -> timestamp_pb2.Timestamp | None:
    if at is None:
        return None
    out = timestamp_pb2.Timestamp()
    out.FromDatetime(at.astimezone(UTC))
    return out


def config_view(row: DocumentRow) -> tenant_pb2.TenantConfigVersion:
    builtin = row.version == BUILTIN_VERSION
    return tenant_pb2.TenantConfigVersion(
        version=row.version,
        document=row.document,
        active=row.active,
        published_at=None if builtin else _ts(row.published_at),
        source=row.source,
        activated_at=_ts(row.activated_at),
    )


def activation_view(row: ActivationRow) -> tenant_pb2.TenantConfigActivation:
    return tenant_pb2.TenantConfigActivation(
        version=row.version,
        previous_version=row.previous_version or "",
        action=_ACTIONS.get(row.action, tenant_pb2.TENANT_CONFIG_ACTION_UNSPECIFIED),
        actor=row.actor,
        at=_ts(row.at),
    )


class TenantServicer(tenant_service_pb2_grpc.TenantServiceServicer):
    """The tenants configuration API (admin)."""

    def __init__(self, tenants: TenantConfigService, *, default_caller: Caller | None = None):
        self._tenants = tenants
        self._default_caller = default_caller  # only for a servicer driven without the server

    def _caller(self) -> Caller:
        return require_caller(self._default_caller)

    async def GetTenantConfig(
        self, request: tenant_service_pb2.GetTenantConfigRequest, context: Any
    ) -> tenant_service_pb2.GetTenantConfigResponse:
        row = await self._tenants.get(request.version, self._caller())
        return tenant_service_pb2.GetTenantConfigResponse(config=config_view(row))

    async def PublishTenantConfig(
        self, request: tenant_service_pb2.PublishTenantConfigRequest, context: Any
    ) -> tenant_service_pb2.PublishTenantConfigResponse:
        row = await self._tenants.publish(
            request.document, request.source, request.dry_run, self._caller()
        )
        return tenant_service_pb2.PublishTenantConfigResponse(config=config_view(row))

    async def RollbackTenantConfig(
        self, request: tenant_service_pb2.RollbackTenantConfigRequest, context: Any
    ) -> tenant_service_pb2.RollbackTenantConfigResponse:
        row = await self._tenants.rollback(request.version, self._caller())
        return tenant_service_pb2.RollbackTenantConfigResponse(config=config_view(row))

    async def ListTenantConfigHistory(
        self, request: tenant_service_pb2.ListTenantConfigHistoryRequest, context: Any
    ) -> tenant_service_pb2.ListTenantConfigHistoryResponse:
        history = await self._tenants.history(self._caller())
        return tenant_service_pb2.ListTenantConfigHistoryResponse(
            versions=[config_view(r) for r in history.versions],
            activations=[activation_view(a) for a in history.activations],
        )
