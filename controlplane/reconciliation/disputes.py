"""Book a reconciliation row as a confirmed loss and follow its dispute (`vidroute disputes`;
rules in `controlplane.domain.disputes`, SQL in `controlplane.persistence.disputes`).

`book_loss` reads the row, asks the domain how much is new platform loss, and in one unit of
work writes the dispute (OPEN), its first event and, when the row names an attempt and the loss
is new, a PLATFORM_LOSS usage entry (key ``confirmed-loss:<row id>``) carrying the row as
evidence; booking a row twice returns the first booking. A row of a superseded run is refused
(its day was reconciled again: book the current row). `move_dispute` applies one move of the
state machine with its event, compare-and-set on the state read.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, date, datetime

from controlplane.domain.disputes import DisputeState, book, move
from controlplane.domain.money import UsageKind
from controlplane.domain.reconciliation_types import DiscrepancyKind
from controlplane.persistence import disputes as store
from controlplane.persistence.database import Database
from controlplane.persistence.ledger import NewUsage
from vidroute_core.exceptions import NotFound, PreconditionFailed

__all__ = ["Booked", "book_loss", "list_disputes", "move_dispute"]


@dataclass(frozen=True, slots=True)
class Booked:
    dispute: store.DisputeRow
    created: bool
    ledger_entry: bool


async def book_loss(
    db: Database, discrepancy_id: int, *, actor: str, reason: str, now: datetime | None = None
) -> Booked:
    """Book reconciliation row `discrepancy_id` (module doc)."""
    now = now or datetime.now(UTC)
    async with db.unit(now) as unit:
        d = unit.disputes()
        row = await d.discrepancy(discrepancy_id)
        if row is None:
            raise NotFound("reconciliation row", str(discrepancy_id))
        if row["superseded_by"] is not None:
            raise PreconditionFailed(
                f"row {discrepancy_id} belongs to run {row['run_id']}, superseded by run "
                f"{row['superseded_by']}: book the current run's row",
                {"run_id": int(row["run_id"]), "superseded_by": int(row["superseded_by"])},
                reason="SUPERSEDED_RUN",
            )
        attempt_id = row["attempt_id"]
        already = 0 if attempt_id is None else await d.booked_loss_of(attempt_id)
        booking = book(
            DiscrepancyKind(row["kind"]), row["billed_micros"], row["expected_micros"], already
        )
        evidence = {
            "discrepancy_id": discrepancy_id,
            "run_id": row["run_id"],
            "record_ids": row["record_ids"],
            "provider_job_id": row["provider_job_id"],
            "already_booked_micros": booking.already_booked_micros,
            "row_evidence": row["evidence"],
        }
        dispute_id = await d.insert_dispute(
            discrepancy_id=discrepancy_id,
            day=row["day"],
            kind=row["kind"],
            provider=row["provider"],
            account=row["account"],
            model=row["model"],
            attempt_id=attempt_id,
            task_id=row["task_id"],
            billed_micros=row["billed_micros"],
            expected_micros=row["expected_micros"],
            confirmed_micros=booking.confirmed_micros,
            new_loss_micros=booking.new_loss_micros,
            refunded_micros=0,
            currency=row["currency"],
            state=DisputeState.OPEN.value,
            evidence=evidence,
        )
        if dispute_id is None:  # booked before: the first booking stands
            first = await d.dispute_of_row(discrepancy_id)
            assert first is not None
            return Booked(first, created=False, ledger_entry=False)
        await d.add_event(
            dispute_id=dispute_id,
            from_state=None,
            to_state=DisputeState.OPEN.value,
            refunded_micros=0,
            actor=actor,
            reason=reason,
        )
        wrote = False
        facts = None if attempt_id is None else await d.attempt_facts(attempt_id)
        if facts is not None and booking.new_loss_micros > 0:
            wrote = await d.record_loss(
                NewUsage(
                    attempt_id=facts["id"],
                    task_id=facts["task_id"],
                    provider=row["provider"],
                    provider_account_id=facts["provider_account_id"],
                    model=facts["provider_model"],
                    kind=UsageKind.PLATFORM_LOSS,
                    amount_micros=booking.new_loss_micros,
                    currency=facts["currency"],
                    price_version=facts["price_version"],
                    idempotency_key=f"confirmed-loss:{discrepancy_id}",
                    provider_job_id=row["provider_job_id"] or None,
                    evidence={"cause": f"CONFIRMED_{row['kind']}", "dispute_id": dispute_id,
                              **evidence},
                ),
            )  # fmt: skip
        stored = await d.dispute(dispute_id)
        assert stored is not None
    return Booked(stored, created=True, ledger_entry=wrote)


async def move_dispute(
    db: Database,
    dispute_id: int,
    target: DisputeState,
    *,
    actor: str,
    reason: str,
    refunded_micros: int = 0,
    now: datetime | None = None,
) -> store.DisputeRow:
    """One move of the dispute (`controlplane.domain.disputes.move`), with its event."""
    now = now or datetime.now(UTC)
    async with db.unit(now) as unit:
        d = unit.disputes()
        found = await d.dispute(dispute_id)
        if found is None:
            raise NotFound("dispute", str(dispute_id))
        current = DisputeState(found.state)
        refund = move(current, target, booked_micros=found.confirmed_micros,
                      refunded_micros=refunded_micros)  # fmt: skip
        if not await d.set_state(
            dispute_id, expected=current.value, state=target.value, refunded_micros=refund
        ):
            raise PreconditionFailed(
                f"dispute {dispute_id} moved meanwhile; read it again",
                reason="CONCURRENT_MOVE",
            )
        await d.add_event(
            dispute_id=dispute_id,
            from_state=current.value,
            to_state=target.value,
            refunded_micros=refund,
            actor=actor,
            reason=reason,
        )
        moved = await d.dispute(dispute_id)
        assert moved is not None
    return moved


async def list_disputes(
    db: Database, *, state: str = "", start: date | None = None, end: date | None = None
) -> list[store.DisputeRow]:
    async with db.reads() as reads:
        return await reads.disputes(state=state, start=start, end=end)
