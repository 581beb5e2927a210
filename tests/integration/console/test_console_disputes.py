"""The console's reconciliation page names each row's id and the losses booked from the day's
rows with their dispute state, and an admin moves a dispute there (issue 23: disputes shown
and followed in the console)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from sqlalchemy import select

from controlplane.domain.disputes import DisputeState
from controlplane.persistence.database import Database
from controlplane.persistence.models import loss_dispute_events as dispute_events
from controlplane.reconciliation import read_report, run_day
from controlplane.reconciliation.disputes import book_loss, list_disputes, move_dispute
from tests.integration.api.test_billing_api import _Bill
from tests.integration.console.test_console_auth import Site, csrf_field, site
from tests.integration.persistence.builders import Scenario

__all__ = ["site"]  # the fixture, shared with the console auth tests
NOW = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)


async def test_the_day_page_shows_row_ids_and_booked_disputes(site: Site, db: Database) -> None:
    """A charge nobody made, booked and disputed: the page lists row N and dispute in
    DISPUTED with its confirmed loss; another day shows none booked."""
    await Scenario(db).account()
    day = NOW.date() - timedelta(days=2)
    await run_day(db, {"runway": _Bill()}, day, now=NOW)
    [row] = [d for r in (await read_report(db, day)).runs for d in r.discrepancies]
    assert row.row_id is not None
    booked = await book_loss(db, row.row_id, actor="ops", reason="no such job", now=NOW)
    await move_dispute(db, booked.dispute.id, DisputeState.DISPUTED, actor="ops", reason="case")
    async with site.client("admin") as admin:
        page = (await admin.get(f"/reconciliation?date={day.isoformat()}")).text
        other = (await admin.get("/reconciliation?date=2026-06-01")).text
    disputes = page[page.index('id="disputes"') :]
    assert f"<td>{booked.dispute.id}</td><td>{row.row_id}</td><td>DISPUTED</td>" in disputes
    assert "CHARGE_WITHOUT_LOCAL_JOB" in disputes
    assert "0.250000" in disputes
    assert f"<tr><td>{row.row_id}</td><td>CHARGE_WITHOUT_LOCAL_JOB</td>" in page
    assert "None booked" in other


async def _booked(db: Database) -> tuple[str, int, int]:
    """A day with one charge nobody made (0.25 USD), booked: (day, row id, dispute id)."""
    await Scenario(db).account()
    day = NOW.date() - timedelta(days=2)
    await run_day(db, {"runway": _Bill()}, day, now=NOW)
    [row] = [d for r in (await read_report(db, day)).runs for d in r.discrepancies]
    assert row.row_id is not None
    booked = await book_loss(db, row.row_id, actor="ops", reason="no such job", now=NOW)
    return day.isoformat(), row.row_id, booked.dispute.id


async def _state(db: Database, dispute_id: int) -> tuple[str, int]:
    [found] = [d for d in await list_disputes(db) if d.id == dispute_id]
    return found.state, found.refunded_micros


async def test_an_admin_moves_a_dispute_from_the_page_to_refunded(site: Site, db: Database) -> None:
    """OPEN -> DISPUTED -> REFUNDED (0.1 USD back) by the page's form: each POST lands back on
    the day, the state and refund are the ones `vidroute disputes move` would write, the move
    is recorded with the console admin as actor, and a terminal dispute offers no move."""
    day, _, dispute_id = await _booked(db)
    async with site.client("admin") as admin:
        page = (await admin.get(f"/reconciliation?date={day}")).text
        token = csrf_field(page)
        assert f'action="/disputes/{dispute_id}/move"' in page
        moved = await admin.post(
            f"/disputes/{dispute_id}/move",
            data={"csrf": token, "target": "DISPUTED", "reason": "claim 42 sent"},
        )
        assert moved.status_code == 303
        assert moved.headers["location"] == f"/reconciliation?date={day}#dispute-{dispute_id}"
        assert await _state(db, dispute_id) == ("DISPUTED", 0)
        refunded = await admin.post(
            f"/disputes/{dispute_id}/move",
            data={
                "csrf": token,
                "target": "REFUNDED",
                "reason": "credit note 7",
                "refunded_micros": "100000",
            },
        )
        assert refunded.status_code == 303
        page = (await admin.get(f"/reconciliation?date={day}")).text
    assert await _state(db, dispute_id) == ("REFUNDED", 100_000)
    row = page[page.index(f'id="dispute-{dispute_id}"') :].split("</tr>")[0]
    assert "<td>REFUNDED</td>" in row
    assert "0.100000" in row
    assert "<form" not in row  # terminal: nothing to move
    async with db.reading() as conn:
        events = (
            await conn.execute(
                select(dispute_events.c.to_state, dispute_events.c.actor, dispute_events.c.reason)
                .where(dispute_events.c.dispute_id == dispute_id)
                .order_by(dispute_events.c.id)
            )
        ).all()
    assert [(state, reason) for state, _, reason in events] == [
        ("OPEN", "no such job"),
        ("DISPUTED", "claim 42 sent"),
        ("REFUNDED", "credit note 7"),
    ]
    # the signed-in admin's name (its token's), marked as the console's
    assert events[0].actor == "ops"
    assert all(str(e.actor).startswith("console:admin") for e in events[1:])


async def test_a_move_without_the_token_by_a_tenant_or_illegal_changes_nothing(
    site: Site, db: Database
) -> None:
    """A POST without the page's CSRF token (403), by a tenant (403), an illegal move (OPEN
    straight to REFUNDED), a refund beyond the booked loss, no reason or an unknown state
    (400 each): the dispute stays OPEN with no refund."""
    day, _, dispute_id = await _booked(db)
    url = f"/disputes/{dispute_id}/move"
    async with site.client("admin") as admin, site.client("alpha") as tenant:
        token = csrf_field((await admin.get(f"/reconciliation?date={day}")).text)
        forged = await admin.post(url, data={"target": "DISPUTED", "reason": "x"})
        assert forged.status_code == 403
        tenant_token = csrf_field((await tenant.get("/tasks")).text)
        denied = await tenant.post(
            url, data={"csrf": tenant_token, "target": "WRITTEN_OFF", "reason": "x"}
        )
        assert denied.status_code == 403
        for bad in (
            {"target": "REFUNDED", "reason": "x", "refunded_micros": "1"},  # not from OPEN
            {"target": "DISPUTED", "reason": "   "},
            {"target": "OPEN", "reason": "x"},
            {"target": "DISPUTED", "reason": "x", "refunded_micros": "-5"},
        ):
            refused = await admin.post(url, data={"csrf": token, **bad})
            assert refused.status_code == 400, (bad, refused.text[:300])
        await admin.post(url, data={"csrf": token, "target": "DISPUTED", "reason": "claim"})
        too_much = await admin.post(
            url,
            data={"csrf": token, "target": "REFUNDED", "reason": "x", "refunded_micros": "250001"},
        )
        assert too_much.status_code == 400
        assert "250000" in too_much.text  # the booked loss, said
        missing = await admin.post(
            "/disputes/999999/move", data={"csrf": token, "target": "DISPUTED", "reason": "x"}
        )
        assert missing.status_code == 404
    assert await _state(db, dispute_id) == ("DISPUTED", 0)
