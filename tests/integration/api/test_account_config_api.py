"""AccountService (Get / Publish / Rollback / ListAccountConfigHistory / GetAccountUsage) over a
real gRPC server with bearer tokens, on SQLite and PostgreSQL: versions, audit, field
violations, refusals leaving nothing written, and every activation's settings mirrored into
``provider_accounts`` in its unit."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import grpc
import pytest
from sqlalchemy import select

from controlplane.api.account_servicer import AccountServicer
from controlplane.api.auth import hash_token, new_token
from controlplane.persistence.database import Database
from controlplane.persistence.models import provider_accounts
from controlplane.scheduling.account_usage import AccountUsage
from controlplane.service.accounts import AccountBook, AccountConfigService
from tests.integration.api.admin_api import api_channel, field_violations, rpc_error
from vidroute.scheduler.v1 import account_pb2 as apb
from vidroute.scheduler.v1 import account_service_pb2 as api
from vidroute.scheduler.v1 import account_service_pb2_grpc

pytestmark = pytest.mark.timeout(120)
CLOCK = datetime(2026, 12, 5, 12, 0, tzinfo=UTC)
USAGE = (AccountUsage("runway", "prod-us", "account", 3, 2, True),)


def document(version: str, *, enabled: bool = True, total: int = 3) -> str:
    return f"""\
version: {version}
accounts:
  runway:
    prod-us:
      credential_ref: env:RUNWAY_KEY_{version.upper().replace("-", "_")}
      enabled: {"true" if enabled else "false"}
      regions: [us]
      limits: {{max_concurrency: {total}, model_concurrency: {{gen4.5: 2}}}}
"""


@dataclass
class Api:
    accounts: Any
    tokens: dict[str, str]
    db: Database

    def md(self, who: str = "admin") -> tuple[tuple[str, str], ...]:
        return (("authorization", f"Bearer {self.tokens[who]}"),)

    async def publish(self, text: str, dry_run: bool = False, who: str = "admin") -> Any:
        request = api.PublishAccountConfigRequest(document=text, source="a.yaml", dry_run=dry_run)
        return (await self.accounts.PublishAccountConfig(request, metadata=self.md(who))).config

    async def rollback(self, version: str = "") -> Any:
        request = api.RollbackAccountConfigRequest(version=version)
        return (await self.accounts.RollbackAccountConfig(request, metadata=self.md())).config

    async def get(self, version: str = "") -> Any:
        request = api.GetAccountConfigRequest(version=version)
        return (await self.accounts.GetAccountConfig(request, metadata=self.md())).config

    async def history(self) -> Any:
        request = api.ListAccountConfigHistoryRequest()
        return await self.accounts.ListAccountConfigHistory(request, metadata=self.md())

    async def rows(self) -> dict[str, tuple[str, str, list[str] | None]]:
        """region -> (status, credential_ref, config regions) of runway/prod-us's rows."""
        async with self.db.reading() as conn:
            found = (await conn.execute(select(provider_accounts))).mappings().all()
        return {
            r["region"]: (r["status"], r["credential_ref"], r["config"].get("regions"))
            for r in found
        }


async def _usage() -> Sequence[AccountUsage]:
    return USAGE


@pytest.fixture
async def stack(db: Database) -> AsyncIterator[Api]:
    tokens = {"admin": new_token(), "acme": new_token()}
    entries = [f"{hash_token(tokens['admin'])}=admin", f"{hash_token(tokens['acme'])}=tenant:acme"]
    async with db.unit(CLOCK) as u:  # the catalog's rows: prod-us in two regions, another one
        for region in ("us", "eu"):
            await u.create_provider_account(
                provider="runway", account_name="prod-us", region=region, credential_ref="x:1"
            )
        await u.create_provider_account(
            provider="veo", account_name="other", region="asia", credential_ref="x:2"
        )

    service = AccountConfigService(db, AccountBook(db), clock=lambda: CLOCK, usage=_usage)
    async with api_channel(db, entries, accounts=AccountServicer(service)) as channel:
        yield Api(account_service_pb2_grpc.AccountServiceStub(channel), tokens, db)


async def test_publish_rollback_and_history_are_audited_and_mirrored(stack: Api) -> None:
    """Each publish is a new active version whose settings reach provider_accounts in its
    unit; a rollback is one call and restores the earlier settings; the history names who
    replaced what, when; an account no document lists keeps its row."""
    builtin = await stack.get()
    assert (builtin.version, builtin.active) == ("accounts-builtin", True)
    first = await stack.publish(document("a-1"))
    assert (first.version, first.active, first.source) == ("a-1", True, "a.yaml")
    rows = await stack.rows()
    assert rows["us"] == ("ACTIVE", "env:RUNWAY_KEY_A_1", ["us"])
    assert rows["eu"] == ("DISABLED", "env:RUNWAY_KEY_A_1", ["us"])  # a region it does not serve
    assert rows["asia"] == ("ACTIVE", "x:2", None)  # not listed: untouched
    await stack.publish(document("a-2", enabled=False))
    assert (await stack.rows())["us"] == ("DISABLED", "env:RUNWAY_KEY_A_2", ["us"])
    assert (await stack.rollback()).version == "a-1"
    assert (await stack.rows())["us"] == ("ACTIVE", "env:RUNWAY_KEY_A_1", ["us"])
    assert (await stack.get()).version == "a-1"
    assert (await stack.get("a-2")).document == document("a-2", enabled=False)
    history = await stack.history()
    assert [(v.version, v.active) for v in history.versions] == [("a-2", False), ("a-1", True)]
    assert [(a.version, a.previous_version, a.action) for a in history.activations] == [
        ("a-1", "", apb.ACCOUNT_CONFIG_ACTION_PUBLISHED),
        ("a-2", "a-1", apb.ACCOUNT_CONFIG_ACTION_PUBLISHED),
        ("a-1", "a-2", apb.ACCOUNT_CONFIG_ACTION_ROLLED_BACK),
    ]
    assert {a.actor.partition(":")[0] for a in history.activations} == {"admin"}
    assert history.activations[0].at.ToDatetime(UTC) == CLOCK
    assert (await rpc_error(stack.rollback("a-9"))).code() == grpc.StatusCode.NOT_FOUND


async def test_bad_documents_and_callers_are_refused_and_change_nothing(stack: Api) -> None:
    """Field violations by path, an immutable version, a tenant caller and an empty rollback
    are refused; a dry run and a retried publish write nothing."""
    exc = await rpc_error(stack.rollback())
    assert exc.code() == grpc.StatusCode.FAILED_PRECONDITION
    bad = await rpc_error(stack.publish(document("a-1", total=0).replace("env:", "sk_")))
    assert bad.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert set(field_violations(bad)) == {
        "accounts.runway.prod-us.credential_ref",
        "accounts.runway.prod-us.limits.max_concurrency",
    }
    dry = await stack.publish(document("a-1"), dry_run=True)
    assert (dry.version, dry.active) == ("a-1", False)
    assert not (await stack.history()).versions
    assert (await stack.rows())["us"] == ("ACTIVE", "x:1", None)
    denied = await rpc_error(stack.publish(document("a-1"), who="acme"))
    assert denied.code() == grpc.StatusCode.PERMISSION_DENIED
    await stack.publish(document("a-1"))
    again = await stack.publish(document("a-1"))  # a retry: the same text, nothing changes
    assert again.active
    changed = await rpc_error(stack.publish(document("a-1", total=5)))
    assert changed.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "immutable" in field_violations(changed)["version"]
    builtin = await rpc_error(stack.publish(document("accounts-builtin")))
    assert builtin.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert len((await stack.history()).activations) == 1


async def test_usage_is_admin_only_and_reports_limits_against_use(stack: Api) -> None:
    """GetAccountUsage answers each dimension's limit, use and whether the document sets it."""
    reply = await stack.accounts.GetAccountUsage(api.GetAccountUsageRequest(), metadata=stack.md())
    assert [(d.account, d.dimension, d.limit, d.used, d.configured) for d in reply.dimensions] == [
        ("prod-us", "account", 3, 2, True)
    ]
    denied = await rpc_error(
        stack.accounts.GetAccountUsage(api.GetAccountUsageRequest(), metadata=stack.md("acme"))
    )
    assert denied.code() == grpc.StatusCode.PERMISSION_DENIED
