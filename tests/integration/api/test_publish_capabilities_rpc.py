"""PublishCapabilities over gRPC (issue 13): an admin publishes a capabilities file's text to
the control plane `start_control_plane` builds, on SQLite and PostgreSQL.

The document is the shipped Runway file (each entry given an account and region, since an
API-only replica's catalog starts with no accounts): published, it lands in the catalog with the
counts in the response; a dry run reports the same counts and writes nothing; a document with bad
entries is INVALID_ARGUMENT with one field violation per bad entry and writes nothing; a tenant
caller is PERMISSION_DENIED.
"""

from __future__ import annotations

import copy
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml
from google.rpc import error_details_pb2, status_pb2
from sqlalchemy import func, select

from controlplane.api.auth import hash_token, new_token
from controlplane.bootstrap import Settings, start_control_plane
from controlplane.capabilities.publish import documents_from_file
from controlplane.persistence.database import Database
from controlplane.persistence.models import (
    provider_accounts,
    provider_model_capabilities,
    provider_price_versions,
    provider_unit_rates,
)
from controlplane.service.access import Caller
from vidroute.scheduler.v1 import scheduler_service_pb2 as api
from vidroute.scheduler.v1 import scheduler_service_pb2_grpc

ROOT = Path(__file__).resolve().parents[3]
RUNWAY_FILE = ROOT / "adapter_sidecars/runway/capabilities/runway-2026-06.yaml"
TABLES = {
    "accounts": provider_accounts,
    "capabilities": provider_model_capabilities,
    "prices": provider_price_versions,
    "unit_rates": provider_unit_rates,
}


@dataclass
class Admin:
    stub: scheduler_service_pb2_grpc.SchedulerServiceAsyncStub  # the .pyi's name, typing only
    db: Database
    tokens: dict[str, str]

    async def publish(
        self, document: str, *, dry_run: bool = False, who: str = "admin"
    ) -> api.PublishCapabilitiesResponse:
        return await self.stub.PublishCapabilities(
            api.PublishCapabilitiesRequest(
                document=document, source="runway-2026-06.yaml", dry_run=dry_run
            ),
            metadata=(("authorization", f"Bearer {self.tokens[who]}"),),
            timeout=30,
        )

    async def rows(self) -> dict[str, int]:
        async with self.db.reading() as conn:
            return {
                name: int(await conn.scalar(select(func.count()).select_from(table)) or 0)
                for name, table in TABLES.items()
            }


@pytest.fixture
async def admin(database_url: str) -> AsyncIterator[Admin]:
    """An API-only control plane (as `vidroute serve` builds it) with an admin and a tenant."""
    tokens = {"admin": new_token(), "tenant": new_token()}
    server = await start_control_plane(
        Settings(
            database_url=database_url,
            listen="127.0.0.1:0",
            api_only=True,
            auth_tokens={
                hash_token(tokens["admin"]): Caller.admin(),
                hash_token(tokens["tenant"]): Caller.tenant("acme"),
            },
        )
    )
    db = Database.from_url(database_url)
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            yield Admin(scheduler_service_pb2_grpc.SchedulerServiceStub(channel), db, tokens)
    finally:
        await db.dispose()
        await server.stop(grace=0.5)


def _entries() -> list[dict[str, Any]]:
    """The shipped Runway entries, each for account prod-us in region us."""
    return [
        {**doc, "account": "prod-us", "region": "us"} for doc in documents_from_file(RUNWAY_FILE)
    ]


def _yaml(entries: list[dict[str, Any]]) -> str:
    return yaml.safe_dump_all(entries, sort_keys=False)


def _violations(exc: grpc.aio.AioRpcError) -> dict[str, str]:
    raw = dict(exc.trailing_metadata() or ())["grpc-status-details-bin"]
    status = status_pb2.Status.FromString(raw)
    bad = error_details_pb2.BadRequest()
    assert status.details[0].Unpack(bad)
    return {v.field: v.description for v in bad.field_violations}


async def test_an_admin_publishes_a_document_and_gets_the_counts(admin: Admin) -> None:
    """The Runway file publishes its account, 3 capabilities and 3 prices (counts in the
    response, rows in the catalog); publishing it again writes no new version."""
    entries = _entries()
    first = await admin.publish(_yaml(entries))
    assert not first.dry_run
    assert dict(first.counts) == {
        "accounts": 1,
        "capabilities": len(entries),
        "capabilities_unchanged": 0,
        "prices": len(entries),
        "prices_unchanged": 0,
    }
    assert await admin.rows() == {
        "accounts": 1,
        "capabilities": len(entries),
        "prices": len(entries),
        "unit_rates": 1,
    }
    again = await admin.publish(json.dumps(entries))  # the same entries as a JSON array
    assert dict(again.counts)["capabilities"] == 0
    assert dict(again.counts)["capabilities_unchanged"] == len(entries)
    assert (await admin.rows())["capabilities"] == len(entries)


async def test_a_dry_run_counts_what_it_would_write_and_writes_nothing(admin: Admin) -> None:
    """dry_run answers the counts of a real run and leaves every catalog table empty."""
    entries = _entries()
    checked = await admin.publish(_yaml(entries), dry_run=True)
    assert checked.dry_run
    assert dict(checked.counts)["accounts"] == 1
    assert dict(checked.counts)["capabilities"] == len(entries)
    assert dict(checked.counts)["prices"] == len(entries)
    assert await admin.rows() == dict.fromkeys(TABLES, 0)


async def test_bad_entries_reject_the_whole_document_with_field_violations(admin: Admin) -> None:
    """An unknown mode in entry 1 and no price in entry 2: INVALID_ARGUMENT naming both entries
    (the good entry 0 is not written either); a document that is not YAML, or nested past the
    parser's recursion, names `document`."""
    entries = _entries()
    broken = copy.deepcopy(entries)
    broken[1]["modes"] = ["TELEPATHY"]
    del broken[2]["commercial"]
    with pytest.raises(grpc.aio.AioRpcError) as bad:
        await admin.publish(_yaml(broken))
    assert bad.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    violations = _violations(bad.value)
    assert set(violations) == {"document[1]", "document[2]"}, violations
    assert "TELEPATHY" in violations["document[1]"]
    assert "no price" in violations["document[2]"]
    assert await admin.rows() == dict.fromkeys(TABLES, 0)

    with pytest.raises(grpc.aio.AioRpcError) as unparsable:
        await admin.publish("provider: [runway\n")
    assert unparsable.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert set(_violations(unparsable.value)) == {"document"}
    with pytest.raises(grpc.aio.AioRpcError) as nested:  # too deep to parse: never INTERNAL
        await admin.publish("[" * 5000 + "]" * 5000)
    assert nested.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert set(_violations(nested.value)) == {"document"}
    assert await admin.rows() == dict.fromkeys(TABLES, 0)


async def test_a_tenant_may_not_publish(admin: Admin) -> None:
    """A tenant's token is PERMISSION_DENIED and nothing is written."""
    with pytest.raises(grpc.aio.AioRpcError) as denied:
        await admin.publish(_yaml(_entries()), who="tenant")
    assert denied.value.code() is grpc.StatusCode.PERMISSION_DENIED
    assert await admin.rows() == dict.fromkeys(TABLES, 0)
