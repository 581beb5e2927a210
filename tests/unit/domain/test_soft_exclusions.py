"""Soft and hard failover exclusions: which failures exclude softly, and how routing uses them."""

from __future__ import annotations

from datetime import timedelta

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from controlplane.domain.failover import (
    FailoverLimits,
    exclusion_is_soft,
    requeue_backoff_s,
)
from controlplane.domain.routing.candidates import RoutingContext
from controlplane.domain.routing.decision import Outcome
from controlplane.domain.routing.filters import Reason
from tests.unit.domain.test_routing import NOW, decide, make_spec
from vidroute_core.errors import HANDLING, ErrorClass, RetryRule
from vidroute_core.spec import RoutingMode

ELIGIBLE = tuple(sorted(v.candidate.id for v in decide(make_spec()).verdicts if v.eligible))
BY_ID = {v.candidate.id: v.candidate for v in decide(make_spec()).verdicts}


def test_soft_classes_are_the_endpoint_health_rows_of_the_matrix() -> None:
    """A class excludes softly exactly when the matrix lets the same provider be tried again
    (retry or delayed retry, outcome known) or the account breaker handles it (AUTH/PERMISSION)."""
    for error_class, handling in HANDLING.items():
        retry_later = not handling.unknown and handling.retry_same in (
            RetryRule.YES,
            RetryRule.DELAYED,
        )
        expected = retry_later or handling.disables_account
        assert exclusion_is_soft(error_class) is expected, error_class
        assert exclusion_is_soft(error_class.value) is expected, error_class


def test_capability_and_input_failures_exclude_hard() -> None:
    """UNSUPPORTED_CAPABILITY, INVALID_INPUT, ASSET_* and permanent failures stay hard."""
    for error_class in (
        ErrorClass.UNSUPPORTED_CAPABILITY,
        ErrorClass.INVALID_INPUT,
        ErrorClass.ASSET_INVALID,
        ErrorClass.ASSET_UNAVAILABLE,
        ErrorClass.INTERNAL_PERMANENT,
    ):
        assert not exclusion_is_soft(error_class)


@given(st.text(max_size=20))
def test_unclassified_failures_exclude_hard(raw: str) -> None:
    """A class string nobody recognises (or none at all) never earns a soft exclusion."""
    if raw not in {c.value for c in ErrorClass}:
        assert not exclusion_is_soft(raw)
    assert not exclusion_is_soft(None)


@given(st.integers(1, 30), st.floats(0, 1))
def test_requeue_backoff_grows_with_attempts_and_is_capped(attempts: int, u: float) -> None:
    """The wait before reusing a softly excluded candidate never shrinks, never passes the cap."""
    limits = FailoverLimits()
    now = requeue_backoff_s(attempts, limits, unit_random=u)
    later = requeue_backoff_s(attempts + 1, limits, unit_random=u)
    assert limits.requeue_backoff_base_s / 2 <= now <= later <= limits.requeue_backoff_cap_s


def _fates(kinds: list[str]) -> st.SearchStrategy[dict[str, str]]:
    return st.fixed_dictionaries({cid: st.sampled_from(kinds) for cid in ELIGIBLE})


# Every eligible candidate gets a fate; "free" ones stay eligible. Half the examples leave
# none free, so the second (soft-lifted) pass is exercised as often as the first.
EXCLUDED = ["hard", "soft_due", "soft_waiting"]
FATES = st.one_of(_fates(["free", *EXCLUDED]), _fates(EXCLUDED))


@settings(max_examples=60, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(FATES)
def test_soft_exclusions_yield_only_when_nothing_else_is_eligible(fates: dict[str, str]) -> None:
    """Routing never picks a hard-excluded candidate, picks a soft one only when no other is
    eligible (and its backoff passed), and never fails a task whose soft candidate exists."""
    kinds = {cid: kind for cid, kind in fates.items() if kind != "free"}
    key = {cid: (BY_ID[cid].account_id, BY_ID[cid].model) for cid in kinds}
    hard = frozenset(key[c] for c, k in kinds.items() if k == "hard")
    soft = {
        key[c]: NOW - timedelta(seconds=1) if k == "soft_due" else NOW + timedelta(seconds=30)
        for c, k in kinds.items()
        if k != "hard"
    }
    spec = make_spec()
    decision = decide(spec, RoutingContext(now=NOW, excluded=hard, soft_excluded=soft))
    all_hard = decide(spec, RoutingContext(now=NOW, excluded=hard | frozenset(soft)))
    due = [c for c, k in kinds.items() if k == "soft_due"]
    if all_hard.outcome is Outcome.SELECTED:
        assert decision.selected == all_hard.selected
    elif due:
        assert decision.selected in due
        assert decision.selection_reason.startswith("soft_exclusion_lifted")
    elif soft:
        assert decision.outcome is Outcome.NO_CAPACITY
        waiting = [decision.verdict(c) for c, k in kinds.items() if k == "soft_waiting"]
        assert {v.reason for v in waiting} == {Reason.RETRY_BACKOFF.value}
    else:
        assert decision.outcome is Outcome.NO_ELIGIBLE_CANDIDATE
    assert decision.selected not in {c for c, k in kinds.items() if k == "hard"}


def test_a_pinned_task_keeps_its_only_candidate_after_a_network_failure() -> None:
    """STRICT to a one-account model: the softly excluded candidate is chosen again once its
    backoff passed, and before that the task waits (NO_CAPACITY), never NO_ELIGIBLE."""
    spec = make_spec(mode=RoutingMode.STRICT_MODEL, required_model="gen4.5")
    [only] = [v.candidate for v in decide(spec).verdicts if v.eligible]
    mine = (only.account_id, only.model)
    waiting = decide(
        spec, RoutingContext(now=NOW, soft_excluded={mine: NOW + timedelta(seconds=5)})
    )
    assert waiting.outcome is Outcome.NO_CAPACITY
    assert decide(spec, RoutingContext(now=NOW, soft_excluded={mine: NOW})).selected == only.id
    assert (
        decide(spec, RoutingContext(now=NOW, excluded=frozenset({mine}))).outcome
        is Outcome.NO_ELIGIBLE_CANDIDATE
    )
