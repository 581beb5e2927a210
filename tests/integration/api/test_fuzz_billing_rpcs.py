"""Fuzzing every BillingService RPC over a real gRPC channel: bad input is a clear error.

The production `start_server` (its interceptors, bearer tokens for a tenant and an admin) on
SQLite takes seeded random requests for every money RPC, and raw bytes that are not the request
message at all. Every answer is OK or a deliberate code: never INTERNAL, UNKNOWN or
RESOURCE_EXHAUSTED. A rejected CreditTenant writes nothing: the ledger holds exactly the credits
that were answered OK and created. ``VIDROUTE_FUZZ_EXAMPLES`` (total calls, shared with the
scheduler fuzz suite) scales the run; the default is 2,000 calls in batches of 25.
"""

from __future__ import annotations

import asyncio
import os
import random
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf import duration_pb2, timestamp_pb2

from controlplane.api.auth import Authenticator, hash_token, new_token, parse_entries
from controlplane.api.billing_servicer import BillingServicer
from controlplane.api.servicer import SchedulerServicer
from controlplane.persistence import ledger
from controlplane.persistence.database import Database
from controlplane.persistence.migrate import upgrade
from controlplane.server import start_server
from controlplane.service.billing import BillingService
from controlplane.service.tasks import TaskService
from vidroute.scheduler.v1 import billing_pb2 as bpb
from vidroute.scheduler.v1 import billing_service_pb2 as api
from vidroute.scheduler.v1 import billing_service_pb2_grpc

pytestmark = pytest.mark.timeout(300)
TOTAL_CALLS = min(int(os.environ.get("VIDROUTE_FUZZ_EXAMPLES", "2000")), 100_000)
BATCH = 25
FORBIDDEN = {grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN, grpc.StatusCode.RESOURCE_EXHAUSTED}
SERVICE = "vidroute.scheduler.v1.BillingService"
METHODS = [m.name for m in api.DESCRIPTOR.services_by_name["BillingService"].methods]
NASTY = [
    "", "acme", "alpha", "beta", "a" * 64, "a" * 65, "x\x00y", "é", "USD", "usd", "EUR", "US",
    "ＵＳＤ", "2026-11-28", "2026-02-30", "٢٠٢٦-01-01", "9" * 30, " ", "reserve:1", "settle:1",
    "credit:x", "k" * 129, "has space", "\u202e", "ﷺ" * 50, "eyJ2IjoxLCJhZnRlciI6MSwidCI6IiJ9",
    "====", "x" * 600,
]  # fmt: skip
INT64 = [0, 1, -1, 5, 10**15, 10**15 + 1, 2**63 - 1, -(2**63), 2**31]


def _text(rng: random.Random) -> str:
    if rng.random() < 0.7:
        return rng.choice(NASTY)
    return "".join(chr(rng.randrange(0, 0x2FFF)) for _ in range(rng.randrange(0, 30)))


def _request(rng: random.Random, method: str) -> Any:
    if method == "GetBalance":
        return api.GetBalanceRequest(tenant_id=_text(rng), currency=_text(rng))
    if method == "ListLedgerEntries":
        return api.ListLedgerEntriesRequest(
            tenant_id=_text(rng), page_size=rng.choice([0, 1, 500, 501, 2**32 - 1]),
            page_token=_text(rng),
        )  # fmt: skip
    if method == "CreditTenant":
        return api.CreditTenantRequest(
            tenant_id=rng.choice(["alpha", "beta", _text(rng)]),
            amount_micros=rng.choice(INT64),
            currency=rng.choice(["USD", _text(rng)]),
            idempotency_key=rng.choice([f"k{rng.randrange(50)}", _text(rng)]),
            reason=rng.choice(["", _text(rng)]),
        )
    if method == "GetUnitCosts":
        req = api.GetUnitCostsRequest(provider=_text(rng), model=_text(rng))
        if rng.random() < 0.5:
            req.window.CopyFrom(
                duration_pb2.Duration(seconds=rng.choice(INT64), nanos=rng.choice([0, -1, 10**9]))
            )
        if rng.random() < 0.5:
            req.end_time.CopyFrom(
                timestamp_pb2.Timestamp(seconds=rng.choice(INT64), nanos=rng.choice([0, -5]))
            )
        return req
    if method == "ListDisputes":
        return api.ListDisputesRequest(
            # out-of-range enum numbers too: an open enum carries them on the wire
            state=bpb.DisputeState.ValueType(rng.choice([0, 1, 4, 5, -1, 2**31 - 1])),
            from_date=rng.choice(["", "2026-11-28", _text(rng)]),
            to_date=rng.choice(["", _text(rng)]),
        )
    if method == "GetMargins":
        return api.GetMarginsRequest(
            from_date=rng.choice(["2026-11-01", _text(rng)]),
            to_date=rng.choice(["2026-11-30", "2028-01-01", _text(rng)]),
            group_by=bpb.MarginGrouping.ValueType(rng.choice([0, 2, 4, 7, -3])),
        )
    return api.GetReconciliationReportRequest(date=_text(rng))


@pytest.fixture
async def harness(
    tmp_path: Path,
) -> AsyncIterator[tuple[grpc.aio.Channel, dict[str, str], Database]]:
    url = f"sqlite+aiosqlite:///{tmp_path / 'vidroute.db'}"
    await upgrade(url)
    db = Database.from_url(url)
    tokens = {"alpha": new_token(), "admin": new_token()}
    auth = Authenticator(
        parse_entries(
            [f"{hash_token(tokens['alpha'])}=tenant:alpha", f"{hash_token(tokens['admin'])}=admin"]
        )
    )

    async def probe() -> bool:
        return True

    running = await start_server(
        SchedulerServicer(TaskService(db)),
        listen="127.0.0.1:0",
        probe=probe,
        cleanup=[db.dispose],
        auth=auth,
        billing=BillingServicer(BillingService(db)),
    )
    async with grpc.aio.insecure_channel(f"127.0.0.1:{running.port}") as channel:
        yield channel, tokens, db
    await running.stop(grace=1)


async def test_random_money_requests_never_fail_internally(
    harness: tuple[grpc.aio.Channel, dict[str, str], Database],
) -> None:
    """Seeded random requests (and raw garbage bytes) to every BillingService method from a
    tenant and an admin: no INTERNAL / UNKNOWN / RESOURCE_EXHAUSTED, and the ledger holds
    exactly the credits answered as created."""
    channel, tokens, db = harness
    stub = billing_service_pb2_grpc.BillingServiceStub(channel)
    rng = random.Random(20261201)
    codes: Counter[str] = Counter()
    created: set[tuple[str, str]] = set()
    forbidden: list[str] = []

    async def one(method: str) -> None:
        who = rng.choice(["alpha", "admin", "admin"])
        md = (("authorization", f"Bearer {tokens[who]}"),)
        try:
            if rng.random() < 0.1:  # not the request message at all
                raw: Any = channel.unary_unary(f"/{SERVICE}/{method}")
                await raw(rng.randbytes(rng.randrange(1, 64)), metadata=md, timeout=30)
                codes[f"{method}:OK"] += 1
                return
            request = _request(rng, method)
            reply = await getattr(stub, method)(request, metadata=md, timeout=30)
            if method == "CreditTenant" and reply.created:
                created.add((request.tenant_id, reply.entry.entry_id))
            codes[f"{method}:OK"] += 1
        except grpc.aio.AioRpcError as exc:
            if exc.code() in FORBIDDEN:
                forbidden.append(f"{method}: {exc.code()} {exc.details()!r}")
            codes[f"{method}:{exc.code().name}"] += 1

    for _ in range(max(1, TOTAL_CALLS // BATCH)):
        await asyncio.gather(*(one(rng.choice(METHODS)) for _ in range(BATCH)))
    assert forbidden == []
    stored: set[tuple[str, str]] = set()
    async with db.reading() as conn:
        for tenant in {t for t, _ in created} | {"alpha", "beta"}:
            stored |= {
                (tenant, str(e.id)) for e in await ledger.list_entries(conn, tenant, 0, 10**6)
            }
    assert stored == created
    # the run exercised both outcomes of every method (not a suite of refusals only)
    for method in METHODS:
        assert any(k.startswith(f"{method}:") and not k.endswith(":OK") for k in codes), method
    assert codes["CreditTenant:OK"] > 0, codes
