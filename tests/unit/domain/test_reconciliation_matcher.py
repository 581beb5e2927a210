"""The pure reconciliation rules (design 9.23.3 order, 9.23.4 kinds, 9.17.5 link-back)."""

from __future__ import annotations

import ast
import dataclasses
import inspect
from datetime import UTC, datetime, timedelta
from types import ModuleType

import pytest
from hypothesis import given
from hypothesis import strategies as st

from controlplane.domain import reconciliation as rec
from controlplane.domain import reconciliation_aggregates, reconciliation_types
from controlplane.domain.billing_rules import BillingRules, FailureCharge, Granularity
from controlplane.domain.reconciliation import (
    Billed,
    DiscrepancyKind,
    Expectation,
    PricedAs,
    RecordStatus,
    Settlement,
    reconcile,
    settled_twice,
)

T0 = datetime(2026, 11, 30, 10, 0, tzinfo=UTC)
K = DiscrepancyKind


def exp(attempt: int, **kw: object) -> Expectation:
    base: dict[str, object] = {
        "attempt_id": attempt,
        "task_id": 100 + attempt,
        "provider": "google",
        "account": "main",
        "model": "veo",
        "state": "SUCCEEDED",
        "submitted_at": T0,
        "expected_micros": 1_600_000,
        "currency": "USD",
        "provider_job_id": f"op-{attempt}",
        "client_request_key": f"key-{attempt}",
        "expected_milliunits": 4000,
        "unit": "billed_seconds",
    }
    base.update(kw)
    return Expectation(**base)  # type: ignore[arg-type]  # keyword overrides from a plain dict; the constructor checks them


def bill(record: int, **kw: object) -> Billed:
    base: dict[str, object] = {
        "record_id": record,
        "provider": "google",
        "account": "main",
        "model": "veo",
        "usage_time": T0 + timedelta(minutes=2),
        "milliunits": 4000,
        "unit": "billed_seconds",
        "cost_micros": 1_600_000,
        "currency": "USD",
    }
    base.update(kw)
    return Billed(**base)  # type: ignore[arg-type]  # keyword overrides from a plain dict; the constructor checks them


def kinds(outcome: rec.Outcome) -> list[tuple[DiscrepancyKind, int | None]]:
    return [(d.kind, d.attempt_id) for d in outcome.discrepancies]


def test_job_id_match_is_clean() -> None:
    out = reconcile([bill(1, provider_job_id="op-1")], [exp(1)])
    assert out.statuses == {1: RecordStatus.MATCHED}
    assert out.matched_attempts == {1: 1}
    assert out.discrepancies == ()
    assert out.delta_micros == 0


def test_order_job_id_beats_request_id_and_key() -> None:
    """A record whose job id names attempt 1 but whose key names attempt 2 is attempt 1's."""
    out = reconcile([bill(1, provider_job_id="op-1", client_request_key="key-2")], [exp(1), exp(2)])
    assert out.matched_attempts == {1: 1}


def test_request_id_then_client_key() -> None:
    e1 = exp(1, provider_job_id="", provider_request_id="req-1")
    e2 = exp(2, provider_job_id="")
    out = reconcile(
        [
            bill(1, provider_job_id="x", provider_request_id="req-1", client_request_key="key-2"),
            bill(2, provider_job_id="y", client_request_key="key-2"),
        ],
        [e1, e2],
    )
    assert out.matched_attempts == {1: 1, 2: 2}


def test_window_and_amount_only_for_unknown_jobs() -> None:
    unknown = exp(1, state="ABANDONED", provider_job_id="", client_request_key="")
    out = reconcile([bill(1, provider_job_id="op-unseen")], [unknown])
    assert kinds(out) == [(K.COST_AFTER_UNKNOWN, 1)]
    row = out.discrepancies[0]
    assert row.evidence["matched_by"] == "window_amount"
    assert row.billed_micros == 1_600_000
    assert row.expected_micros == 0
    # Outside the window, or another amount: not this attempt.
    late = bill(1, provider_job_id="op-unseen", usage_time=T0 + timedelta(hours=7))
    assert kinds(reconcile([late], [unknown])) == [(K.CHARGE_WITHOUT_LOCAL_JOB, None)]
    other = bill(1, provider_job_id="op-unseen", cost_micros=1_599_999)
    assert kinds(reconcile([other], [unknown])) == [(K.CHARGE_WITHOUT_LOCAL_JOB, None)]
    # An attempt whose job we know is never matched by amount.
    known = exp(2)
    got = reconcile([bill(1, provider_job_id="op-unseen")], [known])
    assert kinds(got) == [(K.CHARGE_WITHOUT_LOCAL_JOB, None), (K.LOCAL_SUCCESS_WITHOUT_CHARGE, 2)]


def test_two_attempts_fit_is_ambiguous_not_a_guess() -> None:
    a = exp(1, state="ABANDONED", provider_job_id="", client_request_key="")
    b = exp(2, state="ABANDONED", provider_job_id="", client_request_key="")
    out = reconcile([bill(1, provider_job_id="op-x")], [a, b])
    assert kinds(out) == [(K.AMBIGUOUS_MATCH, None)]
    assert out.statuses[1] is RecordStatus.DISPUTED
    assert out.matched_attempts == {}


def test_duplicate_charge_of_one_job() -> None:
    out = reconcile([bill(1, provider_job_id="op-1"), bill(2, provider_job_id="op-1")], [exp(1)])
    assert out.statuses == {1: RecordStatus.MATCHED, 2: RecordStatus.DUPLICATE}
    assert kinds(out) == [(K.DUPLICATE_CHARGE, 1)]
    assert out.discrepancies[0].record_ids == (1, 2)
    assert out.delta_micros == 1_600_000


def test_charge_without_local_job() -> None:
    out = reconcile([bill(7, provider_job_id="op-ghost", cost_micros=5)], [])
    assert out.statuses == {7: RecordStatus.UNMATCHED}
    assert kinds(out) == [(K.CHARGE_WITHOUT_LOCAL_JOB, None)]


def test_local_success_without_charge_only_in_day() -> None:
    out = reconcile([], [exp(1), exp(2, in_day=False), exp(3, state="FAILED")])
    assert kinds(out) == [(K.LOCAL_SUCCESS_WITHOUT_CHARGE, 1)]
    assert out.discrepancies[0].expected_micros == 1_600_000


def test_failed_task_charged_and_refunded_zero_line() -> None:
    failed = exp(1, state="FAILED")
    out = reconcile([bill(1, provider_job_id="op-1")], [failed])
    assert kinds(out) == [(K.FAILED_TASK_CHARGED, 1)]
    zero = bill(1, provider_job_id="op-1", cost_micros=0, milliunits=0)
    assert reconcile([zero], [failed]).discrepancies == ()


def test_money_kind_by_unit_class() -> None:
    # Veo: same seconds at another price -> price version.
    out = reconcile([bill(1, provider_job_id="op-1", cost_micros=1_200_000)], [exp(1)])
    assert kinds(out) == [(K.WRONG_PRICE_VERSION, 1)]
    assert out.discrepancies[0].delta_micros == -400_000
    # Veo: other seconds -> amount mismatch.
    out = reconcile(
        [bill(1, provider_job_id="op-1", milliunits=6000, cost_micros=2_400_000)], [exp(1)]
    )
    assert kinds(out) == [(K.AMOUNT_MISMATCH, 1)]
    # GPU seconds: same count, other money -> conversion rate.
    gpu = exp(1, unit="gpu_seconds", expected_milliunits=42_000, expected_micros=14_700)
    line = bill(1, provider_job_id="op-1", unit="gpu_seconds", milliunits=42_000)
    out = reconcile([dataclasses.replace(line, cost_micros=21_000)], [gpu])
    assert kinds(out) == [(K.WRONG_CONVERSION_RATE, 1)]
    # Credits: other count -> price version when a published version gives that count, else an
    # amount mismatch; same count, other money -> conversion rate.
    cr = exp(1, unit="credits", expected_milliunits=48_000, expected_micros=480_000)
    line = bill(1, provider_job_id="op-1", unit="credits", milliunits=60_000, cost_micros=600_000)
    assert kinds(reconcile([line], [cr])) == [(K.AMOUNT_MISMATCH, 1)]
    old = dataclasses.replace(cr, alternatives=(PricedAs("runway-2026-01", 600_000, 60_000),))
    assert kinds(reconcile([line], [old])) == [(K.WRONG_PRICE_VERSION, 1)]
    line = bill(1, provider_job_id="op-1", unit="credits", milliunits=48_000, cost_micros=960_000)
    assert kinds(reconcile([line], [cr])) == [(K.WRONG_CONVERSION_RATE, 1)]


RUNWAY = {"provider": "runway", "model": "gen4.5", "unit": "credits"}


def rw_exp(attempt: int, credits: int, **kw: object) -> Expectation:
    return exp(
        attempt,
        **{
            **RUNWAY,
            "expected_milliunits": credits * 1000,
            "expected_micros": credits * 10_000,
            **kw,
        },
    )


def rw_day(record: int, credits: int, micros_per_credit: int = 10_000) -> Billed:
    return bill(
        record,
        **RUNWAY,
        usage_time=T0.replace(hour=0),
        milliunits=credits * 1000,
        cost_micros=credits * micros_per_credit,
    )


def test_aggregate_equal_sum_matches_all() -> None:
    out = reconcile([rw_day(1, 48 + 60)], [rw_exp(1, 48), rw_exp(2, 60)])
    assert out.statuses == {1: RecordStatus.MATCHED}
    assert out.discrepancies == ()


def test_aggregate_difference_attributed_only_when_one_attempt_explains_it() -> None:
    unknown = rw_exp(3, 60, state="ABANDONED", provider_job_id="")
    out = reconcile([rw_day(1, 48 + 60)], [rw_exp(1, 48), unknown])
    assert kinds(out) == [(K.COST_AFTER_UNKNOWN, 3)]
    assert out.discrepancies[0].billed_micros == 600_000
    failed = rw_exp(3, 60, state="FAILED")
    assert kinds(reconcile([rw_day(1, 108)], [rw_exp(1, 48), failed])) == [
        (K.FAILED_TASK_CHARGED, 3)
    ]
    # Billed one job twice.
    assert kinds(reconcile([rw_day(1, 48 * 2 + 60)], [rw_exp(1, 48), rw_exp(2, 60)])) == [
        (K.DUPLICATE_CHARGE, 1)
    ]
    # Missing one job's credits.
    assert kinds(reconcile([rw_day(1, 48)], [rw_exp(1, 48), rw_exp(2, 60)])) == [
        (K.LOCAL_SUCCESS_WITHOUT_CHARGE, 2)
    ]
    # Two attempts of the same cost: the difference is not pinned on either.
    assert kinds(reconcile([rw_day(1, 48 * 3)], [rw_exp(1, 48), rw_exp(2, 48)])) == [
        (K.AGGREGATE_MISMATCH, None)
    ]


def test_aggregate_same_credits_other_money_is_conversion() -> None:
    """The same credits at other money is the conversion rate's fault: pinned on the day's one
    attempt when there is one, else on the day."""
    out = reconcile([rw_day(1, 48, micros_per_credit=12_000)], [rw_exp(1, 48)])
    assert kinds(out) == [(K.WRONG_CONVERSION_RATE, 1)]
    assert out.discrepancies[0].delta_micros == 48 * 2_000
    out = reconcile([rw_day(1, 96, micros_per_credit=12_000)], [rw_exp(1, 48), rw_exp(2, 48)])
    assert kinds(out) == [(K.WRONG_CONVERSION_RATE, None)]


def test_aggregate_for_a_model_without_local_jobs() -> None:
    out = reconcile([rw_day(1, 10)], [])
    assert kinds(out) == [(K.CHARGE_WITHOUT_LOCAL_JOB, None)]
    assert out.statuses == {1: RecordStatus.UNMATCHED}


def test_settled_twice() -> None:
    entries = [
        Settlement(1, "acme", 5, "RESERVE", 100, "USD"),
        Settlement(2, "acme", 5, "CHARGE", 100, "USD"),
        Settlement(3, "acme", 5, "CHARGE", 100, "USD"),
        Settlement(4, "acme", 6, "CHARGE", 100, "USD"),
    ]
    rows = settled_twice(entries)
    assert [(r.kind, r.task_id, r.billed_micros) for r in rows] == [(K.USER_SETTLED_TWICE, 5, 100)]


@given(
    st.lists(st.tuples(st.integers(0, 5), st.integers(0, 3_000_000), st.booleans()), max_size=12),
    st.lists(
        st.tuples(st.sampled_from(["SUCCEEDED", "FAILED", "ABANDONED"]), st.integers(0, 3_000_000)),
        max_size=6,
    ),
)
def test_every_record_gets_a_status_and_the_run_is_deterministic(
    lines: list[tuple[int, int, bool]], attempts: list[tuple[str, int]]
) -> None:
    exps = [
        exp(i, state=s, expected_micros=m, provider_job_id="" if s == "ABANDONED" else f"op-{i}")
        for i, (s, m) in enumerate(attempts)
    ]
    records = [
        bill(n, provider_job_id=f"op-{j}" if named else "", cost_micros=m)
        for n, (j, m, named) in enumerate(lines)
    ]
    first = reconcile(records, exps)
    assert set(first.statuses) == {r.record_id for r in records}
    assert reconcile(list(reversed(records)), list(reversed(exps))) == first
    for row in first.discrepancies:
        assert isinstance(row.billed_micros, int)
        assert isinstance(row.expected_micros, int)


@pytest.mark.parametrize("module", [rec, reconciliation_aggregates, reconciliation_types])
def test_no_float_in_the_rules(module: ModuleType) -> None:
    """Money here is integers: no float literal, no true division, no float() call."""
    tree = ast.parse(inspect.getsource(module))
    for node in ast.walk(tree):
        assert not (isinstance(node, ast.Constant) and isinstance(node.value, float)), node.lineno
        assert not (isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div)), node.lineno
        assert not (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id == "float"
        ), node.lineno


# -- billing rules as data (issue 23 items 1 and 2) -----------------------------------------------
GPU_RULES = BillingRules(
    failed=FailureCharge.USAGE, cancelled=FailureCharge.USAGE, price_version="gpu-l40s-2026-06"
)


def gpu_failed(rules: BillingRules = GPU_RULES, **kw: object) -> Expectation:
    """A self-hosted job that failed after 21 GPU s (7,350 micros measured, ACTUAL entry)."""
    base: dict[str, object] = {
        "provider": "self_hosted",
        "model": "wan2.2-t2v",
        "unit": "gpu_seconds",
        "state": "FAILED",
        "expected_micros": 14_700,
        "expected_milliunits": 42_000,
        "measured_micros": 7_350,
        "measured_milliunits": 21_000,
        "rules": rules,
    }
    base.update(kw)
    return exp(1, **base)


def gpu_line(**kw: object) -> Billed:
    base: dict[str, object] = {
        "provider": "self_hosted",
        "model": "wan2.2-t2v",
        "unit": "gpu_seconds",
        "provider_job_id": "op-1",
        "milliunits": 21_000,
        "cost_micros": 7_350,
    }
    base.update(kw)
    return bill(1, **base)


def test_a_failed_gpu_job_billed_its_gpu_seconds_is_a_correct_bill() -> None:
    """Under a rule that bills failures their usage, the measured GPU seconds are no
    discrepancy, and the day's delta is zero."""
    out = reconcile([gpu_line()], [gpu_failed()])
    assert out.discrepancies == ()
    assert out.statuses == {1: RecordStatus.MATCHED}
    assert (out.billed_micros, out.expected_micros, out.delta_micros) == (7_350, 7_350, 0)


def test_the_same_charge_under_a_refunding_rule_is_failed_task_charged() -> None:
    """Runway's rule (failures billed nothing) makes the same line a disputed charge."""
    out = reconcile([gpu_line()], [gpu_failed(BillingRules())])
    assert kinds(out) == [(K.FAILED_TASK_CHARGED, 1)]
    assert out.discrepancies[0].evidence["billing_rules"]["failed"] == "nothing"


def test_a_usage_rule_still_checks_the_amount_and_the_rate() -> None:
    """Billed GPU seconds other than measured are AMOUNT_MISMATCH; the measured seconds at
    another rate are WRONG_CONVERSION_RATE; both against the measured cost."""
    out = reconcile([gpu_line(milliunits=30_000, cost_micros=10_500)], [gpu_failed()])
    assert kinds(out) == [(K.AMOUNT_MISMATCH, 1)]
    assert (out.discrepancies[0].billed_micros, out.discrepancies[0].expected_micros) == (
        10_500,
        7_350,
    )
    out = reconcile([gpu_line(cost_micros=10_500)], [gpu_failed()])
    assert kinds(out) == [(K.WRONG_CONVERSION_RATE, 1)]


def test_a_fixed_failure_fee_and_a_cancellation_billed_nothing() -> None:
    """A fixed part per failed generation is expected exactly; a cancelled job under a rule
    that bills cancellations nothing is still FAILED_TASK_CHARGED when billed."""
    rules = BillingRules(failed=FailureCharge.FIXED, failed_fixed_micros=5_000)
    assert (
        reconcile([gpu_line(cost_micros=5_000, milliunits=0)], [gpu_failed(rules)]).discrepancies
        == ()
    )
    cancelled = gpu_failed(BillingRules(failed=FailureCharge.USAGE), state="CANCELLED")
    assert kinds(reconcile([gpu_line()], [cancelled])) == [(K.FAILED_TASK_CHARGED, 1)]


def test_rules_read_from_a_commercial_block_and_default_to_refunds() -> None:
    """The capability entry's ``commercial.billing`` block is the rules; without one a failure
    is billed nothing, per job."""
    com = {
        "price_version": "gpu-l40s-2026-06",
        "billing": {"failed": "usage", "cancelled": "usage", "granularity": "job"},
    }
    assert BillingRules.from_commercial(com) == GPU_RULES
    assert BillingRules.from_commercial({"price_version": "v"}) == BillingRules(price_version="v")
    day = BillingRules.from_commercial({"billing": {"granularity": "model_day"}})
    assert day.granularity is Granularity.MODEL_DAY


VEO31 = {"provider": "runway", "model": "veo3.1", "unit": "credits"}
OLD_PRICE = "runway-2026-01"  # veo3.1 at 25 credits/s


def veo31(attempt: int, seconds: int, *, old: bool = True, **kw: object) -> Expectation:
    credits = 20 * seconds
    alternatives = (PricedAs(OLD_PRICE, 25 * seconds * 10_000, 25 * seconds * 1000),) if old else ()
    return exp(
        attempt,
        **{
            **VEO31,
            "expected_milliunits": credits * 1000,
            "expected_micros": credits * 10_000,
            "price_version": "runway-2026-06",
            "alternatives": alternatives,
            **kw,
        },
    )


def veo31_day(credits: int) -> Billed:
    return bill(
        1,
        **VEO31,
        usage_time=T0.replace(hour=0),
        milliunits=credits * 1000,
        cost_micros=credits * 10_000,
    )


def test_the_model_days_one_attempt_billed_off_price_is_named() -> None:
    """100 credits for the day's only veo3.1 job (4 s, 80 credits): AMOUNT_MISMATCH on that
    attempt when no published version gives 100, WRONG_PRICE_VERSION naming the version that
    does; the row's delta is the day's."""
    out = reconcile([veo31_day(100)], [veo31(7, 4, old=False)])
    assert kinds(out) == [(K.AMOUNT_MISMATCH, 7)]
    [row] = out.discrepancies
    assert (row.billed_micros, row.expected_micros) == (1_000_000, 800_000)
    out = reconcile([veo31_day(100)], [veo31(7, 4)])
    assert kinds(out) == [(K.WRONG_PRICE_VERSION, 7)]
    assert out.discrepancies[0].evidence["billed_price_version"] == OLD_PRICE
    assert out.discrepancies[0].delta_micros == out.delta_micros == 200_000


def test_one_re_pricing_explains_a_day_of_several_attempts() -> None:
    """Of a 4 s and a 3 s job, only the 4 s one at the old price gives 160 credits; both at
    the old price give 175: a row per re-priced attempt, deltas summing to the day's."""
    jobs = [veo31(1, 4), veo31(2, 3)]
    assert kinds(reconcile([veo31_day(100 + 60)], jobs)) == [(K.WRONG_PRICE_VERSION, 1)]
    out = reconcile([veo31_day(175)], jobs)
    assert kinds(out) == [(K.WRONG_PRICE_VERSION, 1), (K.WRONG_PRICE_VERSION, 2)]
    assert sum(d.delta_micros for d in out.discrepancies) == out.delta_micros


def test_a_truly_ambiguous_difference_lists_its_candidates() -> None:
    """Two identical jobs, one of them re-priced: either could be it, so the day is an
    AGGREGATE_MISMATCH naming no attempt but listing both as candidates."""
    out = reconcile([veo31_day(100 + 80)], [veo31(1, 4), veo31(2, 4)])
    assert kinds(out) == [(K.AGGREGATE_MISMATCH, None)]
    candidates = out.discrepancies[0].evidence["candidates"]
    assert [c["attempt_id"] for c in candidates] == [1, 2]


def test_a_failed_job_billed_by_usage_counts_in_the_model_day() -> None:
    """A day total that includes a failed job's usage, as its rules say, is clean."""
    failed = gpu_failed(provider_job_id="", attempt_id=2)
    ok = exp(
        3,
        provider="self_hosted",
        model="wan2.2-t2v",
        unit="gpu_seconds",
        expected_micros=14_700,
        expected_milliunits=42_000,
        rules=GPU_RULES,
    )
    total = gpu_line(provider_job_id="", milliunits=63_000, cost_micros=22_050)
    out = reconcile([total], [failed, ok])
    assert out.discrepancies == ()
    assert out.delta_micros == 0
