"""`vidroute.scheduler.v1.AccountService`: a translator between protobuf and the accounts service.

No SQL here: each method decodes the request, calls `controlplane.service.accounts`, and encodes
the result. Domain errors become statuses in `vidroute_core.wire.status.DomainErrorInterceptor`;
the caller comes from `controlplane.api.auth`, as for the scheduler API.
"""

from __future__ import annotations

from typing import Any

from controlplane.api.document_views import DocumentCalls, kind_activation_view, version_view
from controlplane.domain.accounts import BUILTIN_VERSION
from controlplane.service.access import Caller
from controlplane.service.accounts import AccountConfigService
from vidroute.scheduler.v1 import account_pb2, account_service_pb2, account_service_pb2_grpc

_ACTIONS = {
    "PUBLISHED": account_pb2.ACCOUNT_CONFIG_ACTION_PUBLISHED,
    "ROLLED_BACK": account_pb2.ACCOUNT_CONFIG_ACTION_ROLLED_BACK,
    "SCHEDULED": account_pb2.ACCOUNT_CONFIG_ACTION_SCHEDULED,
    "ACTIVATED": account_pb2.ACCOUNT_CONFIG_ACTION_ACTIVATED,
}

config_view = version_view(account_pb2.AccountConfigVersion, BUILTIN_VERSION)
activation_view = kind_activation_view(
    account_pb2.AccountConfigActivation, _ACTIONS, account_pb2.ACCOUNT_CONFIG_ACTION_UNSPECIFIED
)


class AccountServicer(account_service_pb2_grpc.AccountServiceServicer):
    """The accounts configuration API (admin)."""

    def __init__(self, accounts: AccountConfigService, *, default_caller: Caller | None = None):
        self._accounts = accounts
        self._docs = DocumentCalls(
            accounts, config_view, field="config", default_caller=default_caller
        )

    async def GetAccountConfig(
        self, request: account_service_pb2.GetAccountConfigRequest, context: Any
    ) -> account_service_pb2.GetAccountConfigResponse:
        row = await self._accounts.get(request.version, self._docs.caller())
        return account_service_pb2.GetAccountConfigResponse(config=config_view(row))

    async def PublishAccountConfig(
        self, request: account_service_pb2.PublishAccountConfigRequest, context: Any
    ) -> account_service_pb2.PublishAccountConfigResponse:
        return account_service_pb2.PublishAccountConfigResponse(**await self._docs.publish(request))

    async def RollbackAccountConfig(
        self, request: account_service_pb2.RollbackAccountConfigRequest, context: Any
    ) -> account_service_pb2.RollbackAccountConfigResponse:
        config = await self._docs.rollback(request)
        return account_service_pb2.RollbackAccountConfigResponse(config=config)

    async def ActivateAccountConfig(
        self, request: account_service_pb2.ActivateAccountConfigRequest, context: Any
    ) -> account_service_pb2.ActivateAccountConfigResponse:
        config = await self._docs.activate(request)
        return account_service_pb2.ActivateAccountConfigResponse(config=config)

    async def ListAccountConfigHistory(
        self, request: account_service_pb2.ListAccountConfigHistoryRequest, context: Any
    ) -> account_service_pb2.ListAccountConfigHistoryResponse:
        return account_service_pb2.ListAccountConfigHistoryResponse(
            **await self._docs.history(activation_view)
        )

    async def GetAccountUsage(
        self, request: account_service_pb2.GetAccountUsageRequest, context: Any
    ) -> account_service_pb2.GetAccountUsageResponse:
        rows = await self._accounts.usage(self._docs.caller())
        return account_service_pb2.GetAccountUsageResponse(
            dimensions=[
                account_pb2.AccountDimensionUsage(
                    provider=r.provider,
                    account=r.account,
                    dimension=r.dimension,
                    limit=r.limit,
                    used=r.used,
                    configured=r.configured,
                )
                for r in rows
            ]
        )
