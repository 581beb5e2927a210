"""Finance views over gRPC and the CLI (issue 23): the margin view and its CSV export, and
booked losses with their disputes, from a scripted ledger on SQLite and PostgreSQL."""

from __future__ import annotations

import csv
import io
from datetime import UTC, timedelta

import grpc
import pytest

from controlplane.domain.disputes import DisputeState
from controlplane.domain.money import Reservation
from controlplane.persistence import ledger
from controlplane.reconciliation import read_report, run_day
from controlplane.reconciliation.disputes import book_loss, move_dispute
from tests.integration.api.test_billing_api import (
    CLOCK,
    Api,
    _Bill,
    _cli,
    _error,
    _script_usage,
    _violations,
    billing,
)
from tests.integration.persistence.builders import Scenario
from vidroute.scheduler.v1 import billing_pb2 as bpb
from vidroute.scheduler.v1 import billing_service_pb2 as api

__all__ = ["billing"]  # the fixture, shared with the billing API tests
DAY = (CLOCK - timedelta(hours=1)).date().isoformat()


async def test_margins_by_provider_from_a_scripted_ledger(billing: Api) -> None:
    """Provider cost per attempt is its ACTUAL, else EXPECTED, else (an abandoned unknown
    submit) its loss estimate: runway 1 600 000 with 600 000 of it platform loss, veo
    3 200 000; nothing charged, so the margin is minus the cost."""
    await _script_usage(billing.db)
    reply = await billing.stub.GetMargins(
        api.GetMarginsRequest(from_date=DAY, to_date=DAY, group_by=bpb.MARGIN_GROUPING_PROVIDER),
        metadata=billing.md("admin"),
    )
    rows = {
        r.key: (r.currency, r.revenue_micros, r.provider_cost_micros, r.platform_loss_micros,
                r.margin_micros)
        for r in reply.rows
    }  # fmt: skip
    assert rows == {
        "runway": ("USD", 0, 1_600_000, 600_000, -1_600_000),
        "veo": ("USD", 0, 3_200_000, 0, -3_200_000),
    }
    by_day = await billing.stub.GetMargins(
        api.GetMarginsRequest(from_date=DAY, to_date=DAY), metadata=billing.md("admin")
    )
    assert [(r.key, r.provider_cost_micros) for r in by_day.rows] == [(DAY, 4_800_000)]


async def test_margin_requests_are_checked_and_admin_only(billing: Api) -> None:
    """Bad days or a range past 366 days are INVALID_ARGUMENT; a tenant is PERMISSION_DENIED."""
    for first, last in (("", DAY), (DAY, "2026-13-01"), ("2026-12-01", "2026-11-01"),
                        ("2025-01-01", "2026-11-01")):  # fmt: skip
        exc = await _error(
            billing.stub.GetMargins(
                api.GetMarginsRequest(from_date=first, to_date=last), metadata=billing.md("admin")
            )
        )
        assert exc.code() == grpc.StatusCode.INVALID_ARGUMENT, (first, last)
    exc = await _error(
        billing.stub.GetMargins(
            api.GetMarginsRequest(from_date=DAY, to_date=DAY), metadata=billing.md("alpha")
        )
    )
    assert exc.code() == grpc.StatusCode.PERMISSION_DENIED


async def test_costs_csv_is_integer_micros_per_group(
    billing: Api, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`vidroute costs --from --to --by model --csv` prints a header and a row per model with
    exact integer micros that add up: margin = revenue - provider cost."""
    await _script_usage(billing.db)
    code, out, err = await _cli(
        billing, "admin", capsys, monkeypatch,
        "costs", "--from", DAY, "--to", DAY, "--by", "model", "--csv",
    )  # fmt: skip
    assert code == 0, err
    rows = list(csv.DictReader(io.StringIO(out)))
    assert list(rows[0]) == [
        "model", "currency", "revenue_micros", "provider_cost_micros", "platform_loss_micros",
        "margin_micros",
    ]  # fmt: skip
    assert {r["model"]: int(r["provider_cost_micros"]) for r in rows} == {
        "runway/gen4_turbo": 1_600_000,
        "veo/veo-3.1": 3_200_000,
    }
    for r in rows:
        assert int(r["margin_micros"]) == int(r["revenue_micros"]) - int(r["provider_cost_micros"])
    code, out, _ = await _cli(
        billing, "admin", capsys, monkeypatch, "costs", "--from", DAY, "--to", DAY
    )
    assert code == 0
    assert "MARGIN" in out
    assert "-1.600000" in out or "-4.800000" in out


async def test_a_booked_loss_is_listed_and_its_refund_lowers_cost(billing: Api) -> None:
    """A charge nobody made (no attempt), booked: ListDisputes shows it OPEN with its row id;
    no ledger entry (no attempt): the dispute carries the loss into the margin view, and its
    full refund takes it out again."""
    await Scenario(billing.db).account()
    day = CLOCK.date() - timedelta(days=2)
    await run_day(billing.db, {"runway": _Bill()}, day, now=CLOCK)
    report = await read_report(billing.db, day)
    [row] = [d for run in report.runs for d in run.discrepancies]
    assert row.row_id is not None
    booked = await book_loss(billing.db, row.row_id, actor="ops", reason="no such job", now=CLOCK)
    assert (booked.created, booked.ledger_entry) == (True, False)
    today = CLOCK.date().isoformat()
    open_day = await billing.stub.GetMargins(
        api.GetMarginsRequest(from_date=today, to_date=today, group_by=bpb.MARGIN_GROUPING_MODEL),
        metadata=billing.md("admin"),
    )
    assert [(r.key, r.provider_cost_micros, r.platform_loss_micros) for r in open_day.rows] == [
        ("runway/gen4_turbo", 250_000, 250_000)
    ]
    listed = await billing.stub.ListDisputes(
        api.ListDisputesRequest(state=bpb.DISPUTE_STATE_OPEN), metadata=billing.md("admin")
    )
    [d] = listed.disputes
    assert (d.row_id, d.state, d.confirmed_micros, d.new_loss_micros, d.attempt_id) == (
        str(row.row_id),
        bpb.DISPUTE_STATE_OPEN,
        250_000,
        250_000,
        "",
    )
    assert d.kind == bpb.DISCREPANCY_KIND_CHARGE_WITHOUT_LOCAL_JOB
    await move_dispute(billing.db, booked.dispute.id, DisputeState.DISPUTED, actor="ops",
                       reason="case 1", now=CLOCK)  # fmt: skip
    await move_dispute(billing.db, booked.dispute.id, DisputeState.REFUNDED, actor="ops",
                       reason="credited", refunded_micros=250_000, now=CLOCK)  # fmt: skip
    refunded = await billing.stub.ListDisputes(
        api.ListDisputesRequest(from_date=day.isoformat(), to_date=day.isoformat()),
        metadata=billing.md("admin"),
    )
    assert [(x.state, x.refunded_micros) for x in refunded.disputes] == [
        (bpb.DISPUTE_STATE_REFUNDED, 250_000)
    ]
    margins = await billing.stub.GetMargins(
        api.GetMarginsRequest(from_date=today, to_date=today), metadata=billing.md("admin")
    )
    assert [(r.provider_cost_micros, r.platform_loss_micros) for r in margins.rows] == [(0, 0)]
    exc = await _error(billing.stub.ListDisputes(api.ListDisputesRequest(),
                                                 metadata=billing.md("alpha")))  # fmt: skip
    assert exc.code() == grpc.StatusCode.PERMISSION_DENIED


async def test_ledger_listing_filters_by_task_and_days(billing: Api) -> None:
    """ListLedgerEntries by task and by UTC days: only those entries, paged under a token bound
    to the filters (another filter's token is INVALID_ARGUMENT); bad filters are field errors."""
    scenario = Scenario(billing.db)
    await billing.credit("alpha", 5_000_000, "f-1")
    tasks = [await scenario.task(tenant_id="alpha") for _ in range(2)]
    async with billing.db.unit(CLOCK) as u:
        for n, t in enumerate(tasks):
            await ledger.reserve(u.conn, t.id, "alpha", Reservation(100_000 + n, "USD"), CLOCK)
    everything = await billing.entries("admin", "alpha")
    assert len(everything) == 3
    mine = await billing.stub.ListLedgerEntries(
        api.ListLedgerEntriesRequest(tenant_id="alpha", task_id=str(tasks[1].id)),
        metadata=billing.md("admin"),
    )
    assert [(e.task_id, e.amount_micros) for e in mine.entries] == [(str(tasks[1].id), 100_001)]
    written = everything[0].created_at.ToDatetime(tzinfo=UTC).date()
    same_day = await billing.stub.ListLedgerEntries(
        api.ListLedgerEntriesRequest(
            tenant_id="alpha", from_date=written.isoformat(), to_date=written.isoformat(),
            page_size=1,
        ),
        metadata=billing.md("admin"),
    )  # fmt: skip
    assert len(same_day.entries) == 1
    assert same_day.next_page_token
    later = (written + timedelta(days=1)).isoformat()
    none = await billing.stub.ListLedgerEntries(
        api.ListLedgerEntriesRequest(tenant_id="alpha", from_date=later),
        metadata=billing.md("admin"),
    )
    assert list(none.entries) == []
    exc = await _error(
        billing.stub.ListLedgerEntries(
            api.ListLedgerEntriesRequest(
                tenant_id="alpha", page_token=same_day.next_page_token, task_id=str(tasks[0].id)
            ),
            metadata=billing.md("admin"),
        )
    )
    assert exc.code() == grpc.StatusCode.INVALID_ARGUMENT
    exc = await _error(
        billing.stub.ListLedgerEntries(
            api.ListLedgerEntriesRequest(tenant_id="alpha", task_id="x1", to_date="2026-02-30"),
            metadata=billing.md("admin"),
        )
    )
    assert set(_violations(exc)) == {"task_id", "to_date"}
