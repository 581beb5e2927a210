"""Unit cost of successful delivery (design 9.23): the per-attempt rules and the rounding."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from controlplane.domain.unit_cost import (
    JobUsage,
    UnitCost,
    gauge_figures,
    job_terms,
    observed_cost,
    per_success,
    unit_costs,
)


def _job(**kw: object) -> JobUsage:
    base: dict[str, object] = {
        "provider": "runway",
        "model": "gen4_turbo",
        "currency": "USD",
        "delivered": False,
        "attempt_state": "FAILED",
    }
    base.update(kw)
    return JobUsage(**base)  # type: ignore[arg-type]  # keyword overrides from a plain dict; the constructor checks them


def test_hand_computed_table() -> None:
    """Deliveries, charged and free failures, a duplicate, an unknown submit: the hand figures."""
    ok = {"delivered": True, "attempt_state": "SUCCEEDED"}
    jobs = [
        # delivered: 250000 each (5 s of gen4_turbo = 25 credits at 10000 micros), ACTUAL known
        _job(**ok, expected_micros=250_000, actual_micros=250_000),
        _job(**ok, expected_micros=250_000, actual_micros=250_000),
        # delivered, the provider has not reported yet: the expected cost counts
        _job(**ok, expected_micros=250_000),
        # failed and billed 100000 (booked as loss too: here it is retry, counted once)
        _job(expected_micros=250_000, actual_micros=100_000, platform_loss_micros=100_000),
        # failed, billed 0 by the provider (Runway bills failures 0)
        _job(expected_micros=250_000, actual_micros=0, platform_loss_micros=0),
        # a second job of a delivered task (duplicate): platform loss at its actual cost
        _job(attempt_state="SUCCEEDED", expected_micros=250_000, actual_micros=250_000,
             platform_loss_micros=250_000),
        # an abandoned unknown submit the provider may have billed: loss at the estimate
        _job(attempt_state="ABANDONED", platform_loss_micros=250_000),
        # still running: nothing counted yet
        _job(attempt_state="RUNNING", expected_micros=250_000),
    ]  # fmt: skip
    [row] = unit_costs(jobs)
    assert row == UnitCost("runway", "gen4_turbo", "USD", 3, 750_000, 100_000, 0, 500_000)
    assert row.total_micros == 1_350_000
    assert row.cost_per_success_micros == 450_000


def test_losses_the_bill_confirmed_raise_the_cost_per_success() -> None:
    """A delivery billed twice and a refunded failure billed anyway, both booked from the
    bill: their extra is platform loss on top of the attempts' own costs, so the cost per
    success grows by it; settlement's losses still count once."""
    ok = {"delivered": True, "attempt_state": "SUCCEEDED"}
    before = [
        _job(**ok, expected_micros=480_000, actual_micros=480_000),
        _job(**ok, expected_micros=480_000, actual_micros=480_000),
        _job(expected_micros=600_000, actual_micros=0, platform_loss_micros=0),
        _job(attempt_state="ABANDONED", platform_loss_micros=360_000),
    ]
    after = [
        # the first delivery's job billed a second time, confirmed and booked
        _job(**ok, expected_micros=480_000, actual_micros=480_000, confirmed_loss_micros=480_000),
        before[1],
        # the failure the provider should have refunded, billed in full
        _job(expected_micros=600_000, actual_micros=0, platform_loss_micros=0,
             confirmed_loss_micros=600_000),
        # the unknown submit's job billed 40 000 above its estimate: only the extra is new
        _job(attempt_state="ABANDONED", platform_loss_micros=360_000,
             confirmed_loss_micros=40_000),
    ]  # fmt: skip
    [was] = unit_costs(before)
    [now] = unit_costs(after)
    assert (was.generation_micros, was.retry_micros, was.platform_loss_micros) == (
        960_000,
        0,
        360_000,
    )
    assert (now.generation_micros, now.retry_micros) == (960_000, 0)
    assert now.platform_loss_micros == 360_000 + 480_000 + 600_000 + 40_000
    assert now.cost_per_success_micros - was.cost_per_success_micros == 1_120_000 // 2
    only_confirmed = _job(attempt_state="ABANDONED", confirmed_loss_micros=40_000)
    assert job_terms(only_confirmed) is not None


def test_rows_per_provider_model_currency_sorted() -> None:
    """One row per provider/model/currency in key order; only in-flight work shows zeros."""
    rows = unit_costs(
        [
            _job(provider="veo", model="veo-3.1", delivered=True, attempt_state="SUCCEEDED",
                 actual_micros=3_200_000),
            _job(model="gen4.5", attempt_state="RUNNING", expected_micros=600_000),
            _job(model="gen4.5", currency="EUR", delivered=True, attempt_state="SUCCEEDED",
                 actual_micros=550_000),
        ]
    )  # fmt: skip
    assert [(r.provider, r.model, r.currency) for r in rows] == [
        ("runway", "gen4.5", "EUR"),
        ("runway", "gen4.5", "USD"),
        ("veo", "veo-3.1", "USD"),
    ]
    assert rows[1].total_micros == 0
    assert rows[1].successes == 0
    assert rows[1].cost_per_success_micros == 0
    assert rows[2].cost_per_success_micros == 3_200_000


def test_cancelled_is_retry_and_actual_zero_wins_over_expected() -> None:
    """A cancelled job is retry; an ACTUAL of 0 is the provider's word, not a missing figure."""
    terms = job_terms(_job(attempt_state="CANCELLED", expected_micros=500_000, actual_micros=0))
    assert terms is not None
    assert terms.retry_micros == 0
    terms = job_terms(_job(attempt_state="CANCELLED", expected_micros=500_000))
    assert terms is not None
    assert terms.retry_micros == 500_000
    assert job_terms(_job(attempt_state="SUBMIT_UNKNOWN")) is None


def test_per_success_rounds_half_up() -> None:
    """Integer division rounded half up: 5/2 -> 3, 4/3 -> 1, 5/3 -> 2, 0 successes -> 0."""
    assert per_success(5, 2) == 3
    assert per_success(4, 3) == 1
    assert per_success(5, 3) == 2
    assert per_success(1_000_000, 0) == 0


@given(st.integers(0, 10**15), st.integers(1, 10**6))
def test_per_success_is_the_nearest_integer(total: int, successes: int) -> None:
    """|total - q * successes| <= successes / 2 for the rounded quotient q, exactly."""
    q = per_success(total, successes)
    assert 2 * abs(total - q * successes) <= successes
    assert isinstance(q, int)


def test_gauge_figures_pick_one_currency_per_model() -> None:
    """The gauges carry no currency label: the row with the most successes of a model wins."""
    rows = [
        UnitCost("runway", "gen4_turbo", "EUR", 1, 240_000, 0, 0, 0),
        UnitCost("runway", "gen4_turbo", "USD", 4, 1_000_000, 120_000, 0, 80_000),
        UnitCost("veo", "veo-3.1", "USD", 0, 0, 400_000, 0, 0),
    ]
    assert gauge_figures(rows) == {
        ("runway", "gen4_turbo"): (300_000, 120_000),
        ("veo", "veo-3.1"): (0, 400_000),
    }


def test_a_job_without_a_provider_figure_costs_its_estimate() -> None:
    """The health windows count the provider's cost when given (0 included), else the estimate:
    Veo, which reports none, is not a free provider per success."""
    assert observed_cost(None, 600_000) == 600_000
    assert observed_cost(0, 600_000) == 0
    assert observed_cost(450_000, 600_000) == 450_000
