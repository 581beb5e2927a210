"""BillingService over a real gRPC server with bearer tokens, on SQLite and PostgreSQL.

Two tenants and an admin: a tenant reads only its own balance and ledger (naming another tenant
is PERMISSION_DENIED, as ListTasks' tenant filter), crediting and unit costs need the admin role,
a credit is idempotent by key, ledger pages cover every entry once, bad input is
INVALID_ARGUMENT with field violations and writes nothing, and unit costs computed from a
scripted provider usage ledger equal the hand-computed figures. The CLI's money commands print
their table and JSON against the same server.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import grpc
import pytest
from google.protobuf import duration_pb2, timestamp_pb2
from google.rpc import error_details_pb2, status_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from sqlalchemy import update

from clients import cli
from controlplane.api.auth import Authenticator, hash_token, new_token, parse_entries
from controlplane.api.billing_servicer import BillingServicer
from controlplane.api.servicer import SchedulerServicer
from controlplane.domain.money import UsageKind
from controlplane.domain.reconciliation import DiscrepancyKind
from controlplane.persistence import ledger
from controlplane.persistence.database import Database
from controlplane.persistence.models import generation_tasks, task_attempts
from controlplane.reconciliation import run_day
from controlplane.server import BILLING_SERVICE, ControlPlaneServer, start_server
from controlplane.service.billing import BillingService
from controlplane.service.tasks import TaskService
from tests.integration.persistence.builders import Scenario
from vidroute.scheduler.v1 import billing_pb2 as bpb
from vidroute.scheduler.v1 import billing_service_pb2 as api
from vidroute.scheduler.v1 import billing_service_pb2_grpc
from vidroute_core.adapter import UsageRecord, UsageResult

pytestmark = pytest.mark.timeout(120)
CLOCK = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)


@dataclass
class Api:
    stub: billing_service_pb2_grpc.BillingServiceAsyncStub  # the .pyi's name, typing only
    channel: grpc.aio.Channel
    port: int
    tokens: dict[str, str]
    db: Database

    def md(self, who: str) -> tuple[tuple[str, str], ...]:
        return (("authorization", f"Bearer {self.tokens[who]}"),)

    async def credit(self, tenant: str, micros: int, key: str, reason: str = "") -> Any:
        return await self.stub.CreditTenant(
            api.CreditTenantRequest(
                tenant_id=tenant,
                amount_micros=micros,
                currency="USD",
                idempotency_key=key,
                reason=reason,
            ),
            metadata=self.md("admin"),
        )

    async def entries(self, who: str, tenant: str = "", size: int = 0) -> list[bpb.LedgerEntry]:
        seen: list[bpb.LedgerEntry] = []
        token = ""
        while True:
            page = await self.stub.ListLedgerEntries(
                api.ListLedgerEntriesRequest(tenant_id=tenant, page_size=size, page_token=token),
                metadata=self.md(who),
            )
            seen.extend(page.entries)
            token = page.next_page_token
            if not token:
                return seen


@pytest.fixture
async def billing(db: Database) -> AsyncIterator[Api]:
    tokens = {"alpha": new_token(), "beta": new_token(), "admin": new_token()}
    entries = parse_entries(
        [
            f"{hash_token(tokens['alpha'])}=tenant:alpha",
            f"{hash_token(tokens['beta'])}=tenant:beta",
            f"{hash_token(tokens['admin'])}=admin",
        ]
    )

    async def probe() -> bool:
        await db.ping()
        return True

    running: ControlPlaneServer = await start_server(
        SchedulerServicer(TaskService(db)),
        listen="127.0.0.1:0",
        probe=probe,
        auth=Authenticator(entries),
        billing=BillingServicer(BillingService(db, clock=lambda: CLOCK)),
    )
    async with grpc.aio.insecure_channel(f"127.0.0.1:{running.port}") as channel:
        yield Api(
            billing_service_pb2_grpc.BillingServiceStub(channel), channel, running.port, tokens, db
        )
    await running.stop(grace=1)


async def _error(call: Any) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await call
    return info.value


def _violations(exc: grpc.aio.AioRpcError) -> dict[str, str]:
    raw = dict(exc.trailing_metadata() or ())["grpc-status-details-bin"]
    status = status_pb2.Status.FromString(raw)
    bad = error_details_pb2.BadRequest()
    assert status.details[0].Unpack(bad)
    return {v.field: v.description for v in bad.field_violations}


async def test_a_tenant_reads_only_its_own_balance_and_entries(billing: Api) -> None:
    """alpha sees its 5 USD and its entry; naming beta is PERMISSION_DENIED for balance and
    ledger; an admin must name the tenant."""
    await billing.credit("alpha", 5_000_000, "a-1", "welcome")
    await billing.credit("beta", 3_000_000, "b-1")
    own = await billing.stub.GetBalance(api.GetBalanceRequest(), metadata=billing.md("alpha"))
    b = own.balance
    assert (b.tenant_id, b.currency, b.balance_micros, b.reserved_micros, b.available_micros) == (
        "alpha",
        "USD",
        5_000_000,
        0,
        5_000_000,
    )
    entries = await billing.entries("alpha")
    assert [(e.tenant_id, e.kind, e.amount_micros, e.idempotency_key) for e in entries] == [
        ("alpha", bpb.LEDGER_ENTRY_KIND_CREDIT, 5_000_000, "a-1")
    ]
    assert b.as_of_entry_id == entries[0].entry_id
    for call in (
        billing.stub.GetBalance(
            api.GetBalanceRequest(tenant_id="beta"), metadata=billing.md("alpha")
        ),
        billing.stub.ListLedgerEntries(
            api.ListLedgerEntriesRequest(tenant_id="beta"), metadata=billing.md("alpha")
        ),
    ):
        exc = await _error(call)
        assert exc.code() == grpc.StatusCode.PERMISSION_DENIED
        assert "3000000" not in (exc.details() or "")
    exc = await _error(
        billing.stub.GetBalance(api.GetBalanceRequest(), metadata=billing.md("admin"))
    )
    assert exc.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "tenant_id" in _violations(exc)
    theirs = await billing.stub.GetBalance(
        api.GetBalanceRequest(tenant_id="beta"), metadata=billing.md("admin")
    )
    assert theirs.balance.balance_micros == 3_000_000
    euro = await billing.stub.GetBalance(
        api.GetBalanceRequest(currency="EUR"), metadata=billing.md("alpha")
    )
    assert (euro.balance.balance_micros, euro.balance.as_of_entry_id) == (0, "0")


async def test_crediting_and_unit_costs_need_the_admin_role(billing: Api) -> None:
    """A tenant's CreditTenant (even to itself) and GetUnitCosts are PERMISSION_DENIED and write
    nothing."""
    exc = await _error(
        billing.stub.CreditTenant(
            api.CreditTenantRequest(
                tenant_id="alpha", amount_micros=1, currency="USD", idempotency_key="self"
            ),
            metadata=billing.md("alpha"),
        )
    )
    assert exc.code() == grpc.StatusCode.PERMISSION_DENIED
    # the role is checked before the input: a bad window from a tenant is still PERMISSION_DENIED
    exc = await _error(
        billing.stub.GetUnitCosts(
            api.GetUnitCostsRequest(window=duration_pb2.Duration(seconds=-5)),
            metadata=billing.md("beta"),
        )
    )
    assert exc.code() == grpc.StatusCode.PERMISSION_DENIED
    assert await billing.entries("admin", "alpha") == []


async def test_credit_is_idempotent_by_key(billing: Api) -> None:
    """The same key twice is one entry (created once); the key with another amount or reason is
    ALREADY_EXISTS and changes nothing."""
    first = await billing.credit("alpha", 2_500_000, "topup-7", "invoice 7")
    again = await billing.credit("alpha", 2_500_000, "topup-7", "invoice 7")
    assert (first.created, again.created) == (True, False)
    assert again.entry == first.entry
    for micros, reason in ((2_600_000, "invoice 7"), (2_500_000, "invoice 8")):
        exc = await _error(billing.credit("alpha", micros, "topup-7", reason))
        assert exc.code() == grpc.StatusCode.ALREADY_EXISTS
    # keys are per tenant: beta may use the same one
    assert (await billing.credit("beta", 1_000_000, "topup-7")).created
    assert len(await billing.entries("alpha")) == 1
    got = await billing.stub.GetBalance(api.GetBalanceRequest(), metadata=billing.md("alpha"))
    assert got.balance.balance_micros == 2_500_000


async def test_a_credit_key_cannot_collide_with_the_platform_keys(billing: Api) -> None:
    """An admin key that looks like the platform's own (reserve:<task>) is kept apart from it."""
    reply = await billing.credit("alpha", 1_000_000, "reserve:1")
    assert reply.created
    async with billing.db.reading() as conn:
        [stored] = await ledger.list_entries(conn, "alpha", 0, 10)
    assert stored.idempotency_key == "credit:reserve:1"
    assert reply.entry.idempotency_key == "reserve:1"


async def test_ledger_pages_cover_every_entry_once(billing: Api) -> None:
    """23 entries in pages of 5: increasing ids, none skipped or repeated; an entry appended
    after the last page appears behind the last token."""
    for n in range(23):
        await billing.credit("alpha", 1_000 + n, f"k-{n:02d}")
        await billing.credit("beta", 7, f"k-{n:02d}")  # interleaved ids of another tenant
    pages: list[list[str]] = []
    token = ""
    while True:
        page = await billing.stub.ListLedgerEntries(
            api.ListLedgerEntriesRequest(page_size=5, page_token=token),
            metadata=billing.md("alpha"),
        )
        pages.append([e.entry_id for e in page.entries])
        last_token, token = token, page.next_page_token
        if not token:
            break
    assert [len(p) for p in pages] == [5, 5, 5, 5, 3]
    ids = [int(i) for p in pages for i in p]
    assert ids == sorted(set(ids))
    everything = await billing.entries("admin", "alpha", size=500)
    assert [int(e.entry_id) for e in everything] == ids
    assert [e.amount_micros for e in everything] == [1_000 + n for n in range(23)]
    await billing.credit("alpha", 99, "late")
    tail = await billing.stub.ListLedgerEntries(
        api.ListLedgerEntriesRequest(page_size=5, page_token=last_token),
        metadata=billing.md("alpha"),
    )
    assert [e.amount_micros for e in tail.entries] == [1_020, 1_021, 1_022, 99]


async def test_bad_page_tokens_are_invalid_argument(billing: Api) -> None:
    """A forged token, a token of another tenant and a truncated one are INVALID_ARGUMENT."""
    for n in range(3):
        await billing.credit("alpha", 10, f"k{n}")
        await billing.credit("beta", 10, f"k{n}")
    beta_page = await billing.stub.ListLedgerEntries(
        api.ListLedgerEntriesRequest(page_size=1), metadata=billing.md("beta")
    )
    assert beta_page.next_page_token
    for token in ("garbage", beta_page.next_page_token, beta_page.next_page_token[:-3], "é" * 10):
        exc = await _error(
            billing.stub.ListLedgerEntries(
                api.ListLedgerEntriesRequest(page_token=token), metadata=billing.md("alpha")
            )
        )
        assert exc.code() == grpc.StatusCode.INVALID_ARGUMENT, token
        assert "page_token" in _violations(exc)


async def test_bad_credits_are_invalid_argument_and_write_nothing(billing: Api) -> None:
    """Zero, negative or huge amounts, a lower-case currency, a key with a space and a NUL in
    the reason each name their field; the ledger stays empty."""
    cases: dict[str, dict[str, Any]] = {
        "amount_micros": dict(amount_micros=0),
        "currency": dict(currency="usd"),
        "idempotency_key": dict(idempotency_key="has space"),
        "reason": dict(reason="a\x00b"),
        "tenant_id": dict(tenant_id="no/slash"),
    }
    for field, change in cases.items():
        request: dict[str, Any] = dict(
            tenant_id="alpha", amount_micros=5, currency="USD", idempotency_key="k", reason=""
        )
        request.update(change)
        exc = await _error(
            billing.stub.CreditTenant(
                api.CreditTenantRequest(**request), metadata=billing.md("admin")
            )
        )
        assert exc.code() == grpc.StatusCode.INVALID_ARGUMENT, field
        assert field in _violations(exc), field
    for micros in (-1, 10**15 + 1):
        exc = await _error(billing.credit("alpha", micros, "k"))
        assert "amount_micros" in _violations(exc)
    assert await billing.entries("admin", "alpha") == []


async def _script_usage(db: Database, now: datetime = CLOCK) -> None:
    """The ledger of the hand-computed table: runway/gen4_turbo 5 s clips (25 credits, 250000
    micros each) and one veo clip, written an hour before `now`; one entry 9 days before it
    must not count."""
    scenario = Scenario(db)
    account = await scenario.account()

    async def attempt(state: str, delivered: bool, **kinds: int) -> None:
        a = await scenario.attempt(account)
        async with db.unit(CLOCK) as u:
            await u.conn.execute(
                update(task_attempts)
                .where(task_attempts.c.id == a.id)
                .values(status=state, provider_model="gen4_turbo")
            )
            if delivered:
                await u.conn.execute(
                    update(generation_tasks)
                    .where(generation_tasks.c.id == a.task_id)
                    .values(status="SUCCEEDED", adopted_attempt_id=a.id)
                )
            for name, micros in kinds.items():
                provider, _, kind = name.partition("_")
                at = now - (timedelta(days=9) if provider == "old" else timedelta(hours=1))
                await ledger.record_usage(
                    u.conn,
                    ledger.NewUsage(
                        attempt_id=a.id,
                        task_id=a.task_id,
                        provider="veo" if provider == "veo" else "runway",
                        provider_account_id=account,
                        model="veo-3.1" if provider == "veo" else "gen4_turbo",
                        kind=UsageKind[kind.upper()],
                        amount_micros=micros,
                        currency="USD",
                        price_version="runway-2026-06",
                        idempotency_key=f"{kind}:{a.id}",
                        provider_units=micros // 10,
                        provider_unit_name="credits_milli",
                        conversion_rate_version="runway-credits-v1",
                    ),
                    at,
                )

    await attempt("SUCCEEDED", True, rw_expected=250_000, rw_actual=250_000)
    await attempt("SUCCEEDED", True, rw_expected=250_000)  # actual not reported yet
    await attempt("SUCCEEDED", True, rw_expected=250_000, rw_actual=250_000)
    await attempt("FAILED", False, rw_expected=250_000, rw_actual=100_000, rw_platform_loss=100_000)
    await attempt("FAILED", False, rw_expected=250_000, rw_actual=0, rw_platform_loss=0)
    await attempt(  # a duplicate job whose result was not adopted
        "SUCCEEDED", False, rw_expected=250_000, rw_actual=250_000, rw_platform_loss=250_000
    )
    await attempt("ABANDONED", False, rw_platform_loss=250_000)  # an unknown submit
    await attempt("RUNNING", False, rw_expected=250_000)  # in flight
    await attempt("SUCCEEDED", True, old_expected=250_000, old_actual=250_000)  # before window
    await attempt("SUCCEEDED", True, veo_actual=3_200_000)


async def test_unit_costs_from_a_scripted_ledger_equal_the_hand_figures(billing: Api) -> None:
    """(generation + retry + fetch + loss) / successes per provider/model over the 7-day window:
    runway 750000 + 100000 + 0 + 500000 over 3 = 450000; veo 3200000 over 1."""
    await _script_usage(billing.db)
    reply = await billing.stub.GetUnitCosts(api.GetUnitCostsRequest(), metadata=billing.md("admin"))
    rows = {
        (r.provider, r.model): (
            r.currency, r.successes, r.generation_micros, r.retry_micros, r.fetch_micros,
            r.platform_loss_micros, r.total_micros, r.cost_per_success_micros,
        )
        for r in reply.unit_costs
    }  # fmt: skip
    assert rows == {
        ("runway", "gen4_turbo"): ("USD", 3, 750_000, 100_000, 0, 500_000, 1_350_000, 450_000),
        ("veo", "veo-3.1"): ("USD", 1, 3_200_000, 0, 0, 0, 3_200_000, 3_200_000),
    }
    assert reply.window_end.ToDatetime(tzinfo=UTC) == CLOCK
    assert reply.window_start.ToDatetime(tzinfo=UTC) == CLOCK - timedelta(days=7)
    # a window reaching back to the old entry adds its delivery
    wide = await billing.stub.GetUnitCosts(
        api.GetUnitCostsRequest(
            provider="runway", window=duration_pb2.Duration(seconds=10 * 86400)
        ),
        metadata=billing.md("admin"),
    )
    [row] = wide.unit_costs
    assert (row.successes, row.total_micros, row.cost_per_success_micros) == (4, 1_600_000, 400_000)
    # a window that ended before the scripted hour sees nothing
    end = timestamp_pb2.Timestamp()
    end.FromDatetime(CLOCK - timedelta(hours=2))
    early = await billing.stub.GetUnitCosts(
        api.GetUnitCostsRequest(model="veo-3.1", end_time=end), metadata=billing.md("admin")
    )
    assert list(early.unit_costs) == []


async def test_unit_cost_windows_out_of_range_are_invalid_argument(billing: Api) -> None:
    """A negative or year-long-plus window and an end_time past Timestamp's range are refused."""
    for request in (
        api.GetUnitCostsRequest(window=duration_pb2.Duration(seconds=-1)),
        api.GetUnitCostsRequest(window=duration_pb2.Duration(seconds=400 * 86400)),
        api.GetUnitCostsRequest(end_time=timestamp_pb2.Timestamp(seconds=2**62)),
        api.GetUnitCostsRequest(provider="bad provider"),
    ):
        exc = await _error(billing.stub.GetUnitCosts(request, metadata=billing.md("admin")))
        assert exc.code() == grpc.StatusCode.INVALID_ARGUMENT


async def test_reflection_lists_the_billing_service(billing: Api) -> None:
    """grpcurl's `list` (server reflection) names vidroute.scheduler.v1.BillingService, and its
    health follows the database like the scheduler's."""
    stub = reflection_pb2_grpc.ServerReflectionStub(billing.channel)
    replies = stub.ServerReflectionInfo(
        iter([reflection_pb2.ServerReflectionRequest(list_services="")])
    )
    names = [s.name async for r in replies for s in r.list_services_response.service]
    assert BILLING_SERVICE in names
    health = health_pb2_grpc.HealthStub(billing.channel)
    status = await health.Check(health_pb2.HealthCheckRequest(service=BILLING_SERVICE))
    assert status.status == health_pb2.HealthCheckResponse.SERVING


async def _cli(
    billing: Api, who: str, capsys: pytest.CaptureFixture[str], mp: pytest.MonkeyPatch, *argv: str
) -> tuple[int, str, str]:
    """Run the `vidroute` CLI (its main, in a thread: the server shares this loop)."""
    mp.setenv("VIDROUTE_TOKEN", billing.tokens[who])
    code = await asyncio.to_thread(
        cli.main, [argv[0], "--target", f"127.0.0.1:{billing.port}", *argv[1:]]
    )
    captured = capsys.readouterr()
    return code, captured.out, captured.err


async def test_cli_money_commands_print_tables_and_json(
    billing: Api, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """credit, balance, ledger and costs print their table, and JSON with --json."""
    code, out, _ = await _cli(
        billing, "admin", capsys, monkeypatch,
        "credit", "--tenant", "alpha", "--amount-micros", "12340000", "--currency", "USD",
        "--key", "cli-1", "--reason", "from the cli",
    )  # fmt: skip
    assert code == 0
    assert "credited: entry" in out
    assert "12.340000 USD" in out
    code, out, _ = await _cli(
        billing, "admin", capsys, monkeypatch,
        "credit", "--tenant", "alpha", "--amount-micros", "12340000", "--currency", "USD",
        "--key", "cli-1", "--reason", "from the cli", "--json",
    )  # fmt: skip
    assert json.loads(out).get("created", False) is False  # proto3 JSON leaves out false
    assert json.loads(out)["entry"]["idempotency_key"] == "cli-1"
    code, out, _ = await _cli(billing, "alpha", capsys, monkeypatch, "balance")
    lines = out.splitlines()
    assert lines[0].split() == [
        "TENANT",
        "CURRENCY",
        "BALANCE",
        "RESERVED",
        "AVAILABLE",
        "AS",
        "OF",
        "ENTRY",
    ]
    assert lines[1].split()[:5] == ["alpha", "USD", "12.340000", "0.000000", "12.340000"]
    code, out, _ = await _cli(billing, "alpha", capsys, monkeypatch, "balance", "--json")
    assert json.loads(out)["balance"]["balance_micros"] == "12340000"  # int64 as JSON string
    code, out, _ = await _cli(billing, "alpha", capsys, monkeypatch, "ledger")
    assert out.splitlines()[1].split()[1:4] == ["CREDIT", "12.340000", "USD"]
    code, out, _ = await _cli(billing, "alpha", capsys, monkeypatch, "ledger", "--json")
    assert [e["kind"] for e in json.loads(out)["entries"]] == ["LEDGER_ENTRY_KIND_CREDIT"]
    await _script_usage(billing.db)
    code, out, _ = await _cli(billing, "admin", capsys, monkeypatch, "costs")
    row = next(line.split() for line in out.splitlines() if line.startswith("runway"))
    assert row == [
        "runway", "gen4_turbo", "USD", "3", "0.750000", "0.100000", "0.000000", "0.500000",
        "1.350000", "0.450000",
    ]  # fmt: skip
    code, out, _ = await _cli(billing, "admin", capsys, monkeypatch, "costs", "--json")
    by_model = {r["model"]: r for r in json.loads(out)["unit_costs"]}
    assert by_model["veo-3.1"]["cost_per_success_micros"] == "3200000"
    denied = ("credit", "--tenant", "alpha", "--amount-micros", "1", "--currency", "USD")
    code, _, err = await _cli(billing, "alpha", capsys, monkeypatch, *denied, "--key", "x")
    assert code == 1
    assert "PERMISSION_DENIED" in err


class _Bill:
    """The adapter seam's usage answer for one day (a stand-in sidecar, not a provider fake):
    one 250000-micro charge for a job the platform never created."""

    async def usage_result(self, account: str, start: datetime, end: datetime) -> UsageResult:
        return UsageResult(
            records=(
                UsageRecord(
                    provider_job_id="job-nobody-made",
                    model="gen4_turbo",
                    usage_time=start + timedelta(hours=3),
                    provider_milliunits=25_000,
                    provider_unit="credits",
                    cost_micros=250_000,
                    currency="USD",
                    raw_json='{"id": "job-nobody-made"}',
                ),
            )
        )


async def test_reconciliation_report_reads_the_stored_runs(billing: Api) -> None:
    """After a reconciliation of 2026-11-28 the admin reads its run and its row (a charge
    without a local job, with evidence and an action); a tenant is PERMISSION_DENIED; a day
    never reconciled is empty; an empty date means yesterday; a malformed date is refused."""
    await Scenario(billing.db).account()
    day = CLOCK.date() - timedelta(days=2)
    await run_day(billing.db, {"runway": _Bill()}, day, now=CLOCK)
    reply = await billing.stub.GetReconciliationReport(
        api.GetReconciliationReportRequest(date=day.isoformat()), metadata=billing.md("admin")
    )
    assert reply.date == "2026-11-28"
    [run] = [r for r in reply.runs if r.provider == "runway"]
    assert (run.billed_micros, run.expected_micros, run.delta_micros) == (250_000, 0, 250_000)
    [row] = run.discrepancies
    assert row.kind == bpb.DISCREPANCY_KIND_CHARGE_WITHOUT_LOCAL_JOB
    assert (row.billed_micros, row.provider_job_id, row.attempt_id) == (
        250_000,
        "job-nobody-made",
        "",
    )
    assert isinstance(json.loads(row.evidence_json), dict)
    assert row.suggested_action
    again = await billing.stub.GetReconciliationReport(
        api.GetReconciliationReportRequest(date=day.isoformat()), metadata=billing.md("admin")
    )
    assert again == reply
    exc = await _error(
        billing.stub.GetReconciliationReport(
            api.GetReconciliationReportRequest(date=day.isoformat()), metadata=billing.md("alpha")
        )
    )
    assert exc.code() == grpc.StatusCode.PERMISSION_DENIED
    yesterday = await billing.stub.GetReconciliationReport(
        api.GetReconciliationReportRequest(), metadata=billing.md("admin")
    )
    assert (yesterday.date, list(yesterday.runs)) == ("2026-11-29", [])
    for bad in ("2026-13-01", "2026-1-1", "yesterday", "２０２６-11-28"):
        exc = await _error(
            billing.stub.GetReconciliationReport(
                api.GetReconciliationReportRequest(date=bad), metadata=billing.md("admin")
            )
        )
        assert exc.code() == grpc.StatusCode.INVALID_ARGUMENT, bad
        assert "date" in _violations(exc)


def test_every_discrepancy_kind_has_a_wire_value() -> None:
    """The proto enum names every kind the matcher reports (a new kind fails here)."""
    wire = {n.removeprefix("DISCREPANCY_KIND_") for n in bpb.DiscrepancyKind.keys()}  # noqa: SIM118
    assert {k.value for k in DiscrepancyKind} <= wire


async def test_a_database_away_is_unavailable_not_internal() -> None:
    """With the database unreachable every money RPC is UNAVAILABLE (with a retry hint)."""
    gone = Database.from_url("postgresql+asyncpg://postgres@127.0.0.1:9/nowhere")

    async def probe() -> bool:
        return False

    running = await start_server(
        SchedulerServicer(TaskService(gone)),
        listen="127.0.0.1:0",
        probe=probe,
        cleanup=[gone.dispose],
        billing=BillingServicer(BillingService(gone)),
    )  # no tokens: the open mode, every caller an admin
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{running.port}") as channel:
            stub = billing_service_pb2_grpc.BillingServiceStub(channel)
            for call in (
                stub.GetBalance(api.GetBalanceRequest(tenant_id="alpha")),
                stub.ListLedgerEntries(api.ListLedgerEntriesRequest(tenant_id="alpha")),
                stub.CreditTenant(
                    api.CreditTenantRequest(
                        tenant_id="alpha", amount_micros=1, currency="USD", idempotency_key="k"
                    )
                ),
                stub.GetUnitCosts(api.GetUnitCostsRequest()),
                stub.GetReconciliationReport(api.GetReconciliationReportRequest()),
            ):
                exc = await _error(call)
                assert exc.code() == grpc.StatusCode.UNAVAILABLE
    finally:
        await running.stop(grace=1)
