"""`vidroute.scheduler.v1.TenantService`: a translator between protobuf and the tenants service.

No SQL here: each method decodes the request, calls `controlplane.service.tenants`, and encodes
the result. Domain errors become statuses in `vidroute_core.wire.status.DomainErrorInterceptor`;
the caller comes from `controlplane.api.auth`, as for the scheduler API.
"""

from __future__ import annotations

from typing import Any

from controlplane.api.document_views import DocumentCalls, kind_activation_view, version_view
from controlplane.domain.tenants import BUILTIN_VERSION
from controlplane.service.access import Caller
from controlplane.service.tenants import TenantConfigService
from vidroute.scheduler.v1 import tenant_pb2, tenant_service_pb2, tenant_service_pb2_grpc

_ACTIONS = {
    "PUBLISHED": tenant_pb2.TENANT_CONFIG_ACTION_PUBLISHED,
    "ROLLED_BACK": tenant_pb2.TENANT_CONFIG_ACTION_ROLLED_BACK,
    "SCHEDULED": tenant_pb2.TENANT_CONFIG_ACTION_SCHEDULED,
    "ACTIVATED": tenant_pb2.TENANT_CONFIG_ACTION_ACTIVATED,
}

config_view = version_view(tenant_pb2.TenantConfigVersion, BUILTIN_VERSION)
activation_view = kind_activation_view(
    tenant_pb2.TenantConfigActivation, _ACTIONS, tenant_pb2.TENANT_CONFIG_ACTION_UNSPECIFIED
)


class TenantServicer(tenant_service_pb2_grpc.TenantServiceServicer):
    """The tenants configuration API (admin)."""

    def __init__(self, tenants: TenantConfigService, *, default_caller: Caller | None = None):
        self._tenants = tenants
        self._docs = DocumentCalls(
            tenants, config_view, field="config", default_caller=default_caller
        )

    async def GetTenantConfig(
        self, request: tenant_service_pb2.GetTenantConfigRequest, context: Any
    ) -> tenant_service_pb2.GetTenantConfigResponse:
        row = await self._tenants.get(request.version, self._docs.caller())
        return tenant_service_pb2.GetTenantConfigResponse(config=config_view(row))

    async def PublishTenantConfig(
        self, request: tenant_service_pb2.PublishTenantConfigRequest, context: Any
    ) -> tenant_service_pb2.PublishTenantConfigResponse:
        return tenant_service_pb2.PublishTenantConfigResponse(**await self._docs.publish(request))

    async def RollbackTenantConfig(
        self, request: tenant_service_pb2.RollbackTenantConfigRequest, context: Any
    ) -> tenant_service_pb2.RollbackTenantConfigResponse:
        config = await self._docs.rollback(request)
        return tenant_service_pb2.RollbackTenantConfigResponse(config=config)

    async def ActivateTenantConfig(
        self, request: tenant_service_pb2.ActivateTenantConfigRequest, context: Any
    ) -> tenant_service_pb2.ActivateTenantConfigResponse:
        config = await self._docs.activate(request)
        return tenant_service_pb2.ActivateTenantConfigResponse(config=config)

    async def ListTenantConfigHistory(
        self, request: tenant_service_pb2.ListTenantConfigHistoryRequest, context: Any
    ) -> tenant_service_pb2.ListTenantConfigHistoryResponse:
        return tenant_service_pb2.ListTenantConfigHistoryResponse(
            **await self._docs.history(activation_view)
        )
