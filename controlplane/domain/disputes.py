"""Losses the bill confirmed, and the disputes that follow them (design 9.16.4, 9.23.4: "the
extra provider cost goes to platform loss or the provider dispute account, never the tenant").

A reconciliation row whose provider billed more than a correct bill charges (`LOSS_KINDS`: a
duplicate at the provider, a cost after an unknown submit, a failed job billed, a charge
nobody made, a price or amount off) is a confirmed loss once an admin books it: `book` says how
much is new platform loss (the row's billed minus expected, less what settlement already booked
for the attempt: an abandoned unknown submit was booked at its estimate when its task ended).

Its dispute then moves through `DISPUTE_MACHINE`::

    OPEN --> DISPUTED --> REFUNDED
      |          |
      +----------+-----> WRITTEN_OFF

OPEN: booked, nothing asked of the provider yet; DISPUTED: the claim is with the provider;
REFUNDED (terminal): the provider credited it back (``refunded_micros``, at most the booked
amount): the loss is reduced by it; WRITTEN_OFF (terminal): the platform keeps the loss (a
loss the platform caused, like an unknown submit's job, is written off, not disputed).
Pure: the service applies a verdict in the unit of work.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass

from controlplane.domain.reconciliation_types import DiscrepancyKind
from vidroute_core.exceptions import PreconditionFailed

__all__ = [
    "DISPUTE_MACHINE",
    "LOSS_KINDS",
    "Booking",
    "DisputeState",
    "IllegalDisputeMove",
    "NotALoss",
    "book",
    "move",
]


class DisputeState(enum.Enum):
    OPEN = "OPEN"
    DISPUTED = "DISPUTED"
    REFUNDED = "REFUNDED"
    WRITTEN_OFF = "WRITTEN_OFF"


_D = DisputeState
DISPUTE_MACHINE: Mapping[DisputeState, frozenset[DisputeState]] = {
    _D.OPEN: frozenset({_D.DISPUTED, _D.WRITTEN_OFF}),
    _D.DISPUTED: frozenset({_D.REFUNDED, _D.WRITTEN_OFF}),
    _D.REFUNDED: frozenset(),
    _D.WRITTEN_OFF: frozenset(),
}

#: Row kinds in which the provider billed money a correct bill does not charge.
LOSS_KINDS = frozenset(
    {
        DiscrepancyKind.DUPLICATE_CHARGE,
        DiscrepancyKind.COST_AFTER_UNKNOWN,
        DiscrepancyKind.FAILED_TASK_CHARGED,
        DiscrepancyKind.CHARGE_WITHOUT_LOCAL_JOB,
        DiscrepancyKind.WRONG_PRICE_VERSION,
        DiscrepancyKind.WRONG_CONVERSION_RATE,
        DiscrepancyKind.AMOUNT_MISMATCH,
        DiscrepancyKind.AGGREGATE_MISMATCH,
    }
)


class NotALoss(PreconditionFailed):
    """The row is no loss to book (its kind, or the provider billed no more than due)."""


class IllegalDisputeMove(PreconditionFailed):
    """The dispute cannot move so from its state (or refunds more than was booked)."""


@dataclass(frozen=True, slots=True)
class Booking:
    """What booking a row writes: the confirmed loss, and the part of it new to the ledger."""

    confirmed_micros: int
    new_loss_micros: int
    already_booked_micros: int


def book(
    kind: DiscrepancyKind, billed_micros: int, expected_micros: int, already_booked_micros: int
) -> Booking:
    """The booking of a reconciliation row (module doc); raises `NotALoss` with the numbers."""
    delta = billed_micros - expected_micros
    if kind not in LOSS_KINDS or delta <= 0:
        raise NotALoss(
            f"a {kind.value} row billed {billed_micros} micros against {expected_micros} "
            "expected is no loss to book",
            {"billed_micros": billed_micros, "expected_micros": expected_micros},
            reason="NOT_A_LOSS",
            labels={"kind": kind.value},
        )
    booked = max(0, already_booked_micros)
    return Booking(delta, max(0, delta - booked), min(booked, delta))


def move(
    current: DisputeState, target: DisputeState, *, booked_micros: int, refunded_micros: int = 0
) -> int:
    """Check `current -> target`; returns the refund recorded (0 unless REFUNDED, where it must
    be 1..booked_micros)."""
    if target not in DISPUTE_MACHINE[current]:
        raise IllegalDisputeMove(
            f"a dispute in {current.value} cannot become {target.value}",
            reason="ILLEGAL_DISPUTE_MOVE",
            labels={"from": current.value, "to": target.value},
        )
    if target is not DisputeState.REFUNDED:
        if refunded_micros:
            raise IllegalDisputeMove(
                "only a refund records refunded micros",
                {"refunded_micros": refunded_micros},
                reason="ILLEGAL_DISPUTE_MOVE",
                labels={"to": target.value},
            )
        return 0
    if not 0 < refunded_micros <= booked_micros:
        raise IllegalDisputeMove(
            f"a refund of {refunded_micros} micros is outside 1..{booked_micros} (the loss booked)",
            {"refunded_micros": refunded_micros, "booked_micros": booked_micros},
            reason="REFUND_OUT_OF_RANGE",
        )
    return refunded_micros
