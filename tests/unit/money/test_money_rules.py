"""The pure money rules (controlplane.domain.money): reservation, settlement, loss, policy."""

from __future__ import annotations

import math
from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st

from controlplane.domain.money import (
    AttemptBill,
    BillingMode,
    BillingPolicies,
    BillingPolicy,
    CreditKind,
    InsufficientCredit,
    LossCause,
    actual_cost,
    check_reserve,
    platform_losses,
    reservation_amount,
    settle,
    units_for,
    units_to_micros,
)
from controlplane.domain.states import AttemptState, TaskState

micros = st.integers(min_value=0, max_value=10**12)


def test_reservation_is_the_highest_estimate_capped_by_the_budget() -> None:
    """Any route the task may take is covered, but never more than the tenant's budget."""
    assert reservation_amount([480_000, 1_200_000, 600_000]) == 1_200_000
    assert reservation_amount([480_000, 1_200_000], cap_micros=1_000_000) == 1_000_000
    assert reservation_amount([], cap_micros=700_000) == 700_000
    assert reservation_amount([]) == 0


@given(reserved=micros, cost=micros)
def test_success_charges_the_cost_capped_by_the_reservation(reserved: int, cost: int) -> None:
    """SUCCEEDED charges min(cost, reservation) and names the delivered attempt."""
    s = settle(TaskState.SUCCEEDED, reserved, delivered_attempt_id=7, delivered_cost_micros=cost)
    assert s.kind is CreditKind.CHARGE
    assert s.amount_micros == min(cost, reserved)
    assert s.attempt_id == 7


@pytest.mark.parametrize("target", [TaskState.FAILED, TaskState.CANCELLED])
def test_failed_and_cancelled_release_the_whole_reservation(target: TaskState) -> None:
    """FAILED and CANCELLED charge nothing: the hold is released."""
    s = settle(target, 900_000)
    assert (s.kind, s.amount_micros, s.attempt_id) == (CreditKind.RELEASE, 900_000, None)


def test_settling_a_live_state_is_a_programming_error() -> None:
    """Only terminal states settle."""
    with pytest.raises(ValueError, match="not a terminal"):
        settle(TaskState.RUNNING, 1)


def test_prepaid_refuses_a_reservation_beyond_available_with_the_numbers() -> None:
    """The refusal carries balance, available, estimate, shortfall and the currency."""
    with pytest.raises(InsufficientCredit) as info:
        check_reserve(
            "acme",
            BillingPolicy(),
            balance_micros=500_000,
            available_micros=300_000,
            amount_micros=480_000,
            currency="USD",
        )
    err = info.value
    assert err.reason == "INSUFFICIENT_CREDIT"
    assert err.numbers == {
        "balance_micros": 500_000,
        "available_micros": 300_000,
        "estimated_cost_micros": 480_000,
        "shortfall_micros": 180_000,
    }
    assert err.labels["currency"] == "USD"
    check_reserve(  # exactly enough is enough
        "acme",
        BillingPolicy(),
        balance_micros=480_000,
        available_micros=480_000,
        amount_micros=480_000,
        currency="USD",
    )


def test_postpaid_overdraft_is_a_floor_and_unlimited_has_none() -> None:
    """postpaid:<m> allows available down to -m; plain postpaid has no floor."""
    limited = BillingPolicy.parse("postpaid:1000000")
    check_reserve(
        "t", limited, balance_micros=0, available_micros=0, amount_micros=1_000_000, currency="USD"
    )
    with pytest.raises(InsufficientCredit) as info:
        check_reserve(
            "t",
            limited,
            balance_micros=0,
            available_micros=0,
            amount_micros=1_000_001,
            currency="USD",
        )
    assert info.value.numbers["overdraft_limit_micros"] == 1_000_000
    unlimited = BillingPolicy.parse("postpaid")
    check_reserve(
        "t",
        unlimited,
        balance_micros=0,
        available_micros=-(10**12),
        amount_micros=10**9,
        currency="USD",
    )


def test_policies_parse_like_the_auth_tenants() -> None:
    """A default plus tenant=policy entries, comma- or line-separated, with # comments."""
    policies = BillingPolicies.parse(
        "prepaid", ["acme=postpaid:5000000, beta=postpaid", "# a comment", "gamma=prepaid # x"]
    )
    assert policies.for_tenant("acme") == BillingPolicy(BillingMode.POSTPAID, 5_000_000)
    assert policies.for_tenant("beta") == BillingPolicy(BillingMode.POSTPAID, None)
    assert policies.for_tenant("gamma") == BillingPolicy(BillingMode.PREPAID, 0)
    assert policies.for_tenant("other") == BillingPolicy(BillingMode.PREPAID, 0)
    for bad in ("free", "prepaid:5", "postpaid:-1", "postpaid:1.5"):
        with pytest.raises(ValueError, match=r"policy|overdraft"):
            BillingPolicy.parse(bad)


def test_platform_loss_counts_every_undelivered_billable_attempt_with_its_cause() -> None:
    """Duplicates and unknown submits are losses; a rejected submit (no job) and the delivered
    attempt are not; a reported actual cost replaces the estimate."""
    bills = [
        AttemptBill(1, AttemptState.FAILED, 400_000, None, None),  # rejected submit: no job
        AttemptBill(2, AttemptState.ABANDONED, 480_000, None, None),  # unknown, maybe billed
        AttemptBill(3, AttemptState.FAILED, 480_000, 0, "job-3"),  # failed job billed 0
        AttemptBill(4, AttemptState.SUCCEEDED, 480_000, 480_000, "job-4"),  # a second success
        AttemptBill(5, AttemptState.SUCCEEDED, 480_000, 470_000, "job-5"),  # delivered
        AttemptBill(6, AttemptState.RUNNING, 480_000, None, "job-6"),  # still live
    ]
    losses = platform_losses(bills, delivered_attempt_id=5)
    assert [(x.attempt_id, x.amount_micros, x.cause) for x in losses] == [
        (2, 480_000, LossCause.UNKNOWN_SUBMIT),
        (3, 0, LossCause.DUPLICATE),
        (4, 480_000, LossCause.DUPLICATE),
    ]
    undelivered = platform_losses(bills[:3], delivered_attempt_id=None)
    assert [x.cause for x in undelivered] == [LossCause.UNKNOWN_SUBMIT, LossCause.UNDELIVERED]


@given(units=st.integers(0, 10**9), rate=st.integers(0, 10**7), divisor=st.integers(1, 10**4))
def test_unit_conversion_rounds_half_up_in_integers(units: int, rate: int, divisor: int) -> None:
    """units * rate / divisor to the nearest micro, halves up (exact rational oracle)."""
    exact = Fraction(units * rate, divisor)
    assert units_to_micros(units, rate, divisor) == math.floor(exact + Fraction(1, 2))
    if divisor == 1 and rate > 0:
        assert units_for(units_to_micros(units, rate), rate) == units


def test_unit_conversion_examples() -> None:
    """Runway: 48 credits at 10,000 micros; GPU milliseconds at 350 micros per second."""
    assert units_to_micros(48, 10_000) == 480_000
    assert units_to_micros(1_500, 350, 1_000) == 525  # 1.5 s of GPU
    assert units_to_micros(1, 1, 2) == 1  # half a micro rounds up
    assert units_for(480_000, 10_000) == 48
    assert units_for(480_001, 10_000) is None


def test_actual_cost_reported_wins_and_veo_bills_per_delivered_second() -> None:
    """A reported cost is used as is; Veo (no cost in its API) costs its estimate on success and
    nothing on a blocked or failed generation; others stay unknown."""
    assert actual_cost("runway", reported_micros=480_000, succeeded=True, estimated_micros=1) == (
        480_000
    )
    assert actual_cost(
        "google", reported_micros=None, succeeded=True, estimated_micros=3_200_000
    ) == (3_200_000)
    assert actual_cost("google", reported_micros=None, succeeded=False, estimated_micros=9) == 0
    assert actual_cost("runway", reported_micros=None, succeeded=True, estimated_micros=9) is None


def test_runway_terminal_credits_become_micros_exactly() -> None:
    """Runway's terminal ``cost.credits`` (fractional ones too) times the integer rate, no float
    product: 114.5 credits at 10,000 micros is 1,145,000 micros; 0.1 credit is 1,000."""
    from adapter_sidecars.runway.mapping import with_cost
    from vidroute_core.adapter import JobSnapshot, JobState
    from vidroute_core.capabilities.loader import Commercial

    commercial = Commercial("USD", "runway-2026-06", 120_000, micros_per_provider_unit=10_000)
    done = JobSnapshot(JobState.SUCCEEDED, "SUCCEEDED")
    for credits, micros in ((48, 480_000), (114.5, 1_145_000), (0.1, 1_000)):
        got = with_cost(done, {"cost": {"credits": credits}}, commercial)
        assert got.actual_cost_micros == micros
    running = JobSnapshot(JobState.RUNNING, "RUNNING")
    assert with_cost(running, {"cost": {"credits": 48}}, commercial).actual_cost_micros is None
