"""What the admin CLI tests share (`test_routing_policy_cli`, `test_tenants_cli`): a control
plane on a free port whose one token is an admin's, and `vidroute` run in-process against it."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest

from clients import cli
from controlplane.api.auth import Authenticator, hash_token, new_token, parse_entries
from controlplane.api.servicer import SchedulerServicer
from controlplane.persistence.database import Database
from controlplane.server import start_server
from controlplane.service.tasks import TaskService
from vidroute.scheduler.v1 import (
    account_service_pb2_grpc,
    routing_service_pb2_grpc,
    tenant_service_pb2_grpc,
)


@asynccontextmanager
async def admin_server(
    db: Database,
    monkeypatch: pytest.MonkeyPatch,
    *,
    routing: routing_service_pb2_grpc.RoutingServiceServicer | None = None,
    tenants: tenant_service_pb2_grpc.TenantServiceServicer | None = None,
    accounts: account_service_pb2_grpc.AccountServiceServicer | None = None,
) -> AsyncIterator[str]:
    """The server's ``host:port``, with ``VIDROUTE_TOKEN`` set to its admin token."""
    token = new_token()
    monkeypatch.setenv("VIDROUTE_TOKEN", token)
    # No config file (a missing default is no error, a named one is): never the user's own.
    monkeypatch.delenv("VIDROUTE_CONFIG", raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", "/nonexistent")

    async def probe() -> bool:
        return True

    running = await start_server(
        SchedulerServicer(TaskService(db)),
        listen="127.0.0.1:0",
        probe=probe,
        auth=Authenticator(parse_entries([f"{hash_token(token)}=admin"])),
        routing=routing,
        tenants=tenants,
        accounts=accounts,
    )
    yield f"127.0.0.1:{running.port}"
    await running.stop(grace=1)


async def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """``vidroute ARGS``: the exit code, stdout and stderr."""
    code = await asyncio.to_thread(cli.main, list(args))
    out, err = capsys.readouterr()
    return code, out, err
