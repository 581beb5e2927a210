"""Booked losses and the dispute state machine (issue 23: losses booked, disputes followed)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from controlplane.domain.disputes import (
    DISPUTE_MACHINE,
    LOSS_KINDS,
    DisputeState,
    IllegalDisputeMove,
    NotALoss,
    book,
    move,
)
from controlplane.domain.reconciliation_types import DiscrepancyKind

S = DisputeState


@given(
    kind=st.sampled_from(sorted(LOSS_KINDS, key=lambda k: k.value)),
    billed=st.integers(1, 10**9),
    expected=st.integers(0, 10**9),
    already=st.integers(0, 10**9),
)
def test_a_booking_adds_only_what_settlement_had_not_booked(
    kind: DiscrepancyKind, billed: int, expected: int, already: int
) -> None:
    """New loss plus the part already booked is the confirmed loss, never negative."""
    if billed <= expected:
        with pytest.raises(NotALoss):
            book(kind, billed, expected, already)
        return
    b = book(kind, billed, expected, already)
    assert b.confirmed_micros == billed - expected
    assert b.new_loss_micros >= 0
    assert b.new_loss_micros + b.already_booked_micros == b.confirmed_micros
    assert already + b.new_loss_micros == max(already, b.confirmed_micros)


def test_rows_that_are_no_loss_are_refused_with_numbers() -> None:
    """A missing charge or a double settlement is no provider loss to book."""
    for kind in (DiscrepancyKind.LOCAL_SUCCESS_WITHOUT_CHARGE, DiscrepancyKind.USER_SETTLED_TWICE):
        with pytest.raises(NotALoss) as caught:
            book(kind, 5, 0, 0)
        assert caught.value.numbers == {"billed_micros": 5, "expected_micros": 0}


@given(path=st.lists(st.sampled_from(list(S)), max_size=5), refund=st.integers(0, 200))
def test_only_the_machine_moves_and_refunds_stay_within_the_loss(
    path: list[DisputeState], refund: int
) -> None:
    """open -> disputed -> refunded | written off; a refund is 1..the booked loss."""
    state = S.OPEN
    for target in path:
        amount = refund if target is S.REFUNDED else 0
        legal = target in DISPUTE_MACHINE[state] and (target is not S.REFUNDED or 0 < refund <= 100)
        if legal:
            assert move(state, target, booked_micros=100, refunded_micros=amount) == amount
            state = target
        else:
            with pytest.raises(IllegalDisputeMove):
                move(state, target, booked_micros=100, refunded_micros=amount)
    assert not DISPUTE_MACHINE[S.REFUNDED]
    assert not DISPUTE_MACHINE[S.WRITTEN_OFF]
