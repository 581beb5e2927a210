"""What the admin API tests share (`test_account_config_api`, `test_tenant_config_api`,
`test_routing_policy_api`): a control plane on a free port whose readiness is the database's,
a channel to it, and the reading of a refused call's status and field violations."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Sequence
from contextlib import asynccontextmanager
from typing import Any

import grpc
import pytest
from google.rpc import error_details_pb2, status_pb2

from controlplane.api.auth import Authenticator, parse_entries
from controlplane.api.servicer import SchedulerServicer
from controlplane.persistence.database import Database
from controlplane.server import ControlPlaneServer, start_server
from controlplane.service.tasks import TaskService


@asynccontextmanager
async def api_channel(
    db: Database,
    entries: Sequence[str],
    *,
    scheduler: SchedulerServicer | None = None,
    **servicers: Any,
) -> AsyncIterator[grpc.aio.Channel]:
    """A channel to a server with `servicers` (``accounts=``, ``routing=``...) beside the
    scheduler API (a plain one unless given), `entries` its auth lines; stopped on exit."""

    async def probe() -> bool:
        await db.ping()
        return True

    running: ControlPlaneServer = await start_server(
        scheduler or SchedulerServicer(TaskService(db)),
        listen="127.0.0.1:0",
        probe=probe,
        auth=Authenticator(parse_entries(list(entries))),
        **servicers,
    )
    async with grpc.aio.insecure_channel(f"127.0.0.1:{running.port}") as channel:
        yield channel
    await running.stop(grace=1)


async def rpc_error(call: Awaitable[Any]) -> grpc.aio.AioRpcError:
    """The error `call` must fail with."""
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await call
    return info.value


def field_violations(exc: grpc.aio.AioRpcError) -> dict[str, str]:
    """field -> description of the BadRequest in `exc`'s status details (one must be there)."""
    raw = dict(exc.trailing_metadata() or ())["grpc-status-details-bin"]
    for detail in status_pb2.Status.FromString(raw).details:
        bad = error_details_pb2.BadRequest()
        if detail.Unpack(bad):
            return {v.field: v.description for v in bad.field_violations}
    raise AssertionError(f"no BadRequest in {exc}")
