"""The requeue hand-off between execution and the scheduler: a wake-up message, merged facts."""

from __future__ import annotations

import json
import random
from datetime import UTC, datetime

from hypothesis import given
from hypothesis import strategies as st

from controlplane.domain.requeue import (
    ExcludedCandidate,
    RequeueRequest,
    merge_exclusion,
    requeue_facts,
)

T1 = datetime(2026, 6, 24, 10, 0, tzinfo=UTC)
T2 = datetime(2026, 6, 24, 10, 5, tzinfo=UTC)


def test_the_requeue_message_is_only_a_wake_up() -> None:
    """The ``task.requeue`` payload names the task and the failed attempt, nothing more (the
    exclusions are rows), and survives JSON encoding (the outbox stores it as JSON)."""
    request = RequeueRequest(
        task_id=7,
        failed_attempt_id=9,
        reason="FAIL_OVER",
        error_class="PROVIDER_OVERLOADED",
        excluded_candidates=(ExcludedCandidate(3, "gen4.5"),),
        same_model_only=True,
        required_model="gen4.5",
        not_before=T1,
    )
    payload = request.wake_up()
    assert payload == {"task_id": 7, "failed_attempt_id": 9}
    assert json.loads(json.dumps(payload)) == payload


def test_merge_hard_beats_soft_and_a_soft_one_keeps_the_latest_retry() -> None:
    """Excluded again, a candidate's exclusion turns hard for good, and a soft one waits for the
    later of two retry instants (None: no wait), keeping the cause that decided it."""
    soft1 = ExcludedCandidate(1, "m", soft=True, retry_at=T1, attempt_id=1, error_class="A")
    soft2 = ExcludedCandidate(1, "m", soft=True, retry_at=T2, attempt_id=2, error_class="B")
    waitless = ExcludedCandidate(1, "m", soft=True, attempt_id=3)
    hard = ExcludedCandidate(1, "m", attempt_id=4, error_class="INTERNAL_PERMANENT")
    assert merge_exclusion(None, soft1) == soft1
    assert merge_exclusion(soft1, soft2) == soft2
    assert merge_exclusion(soft2, soft1) == soft2
    assert merge_exclusion(soft1, waitless) == soft1
    assert merge_exclusion(waitless, soft1) == soft1
    assert merge_exclusion(soft2, hard) == hard
    assert merge_exclusion(hard, soft2) == hard


def test_requeue_facts_merge_hard_over_soft_and_keep_the_latest_retry() -> None:
    """Across a task's requeues a hard exclusion wins over a soft one for the same candidate,
    and a soft one waits for the latest retry instant any requeue gave it."""
    facts = requeue_facts(
        [
            ExcludedCandidate(1, "m", soft=True, retry_at=T2),
            ExcludedCandidate(1, "m", soft=True, retry_at=T1),
            ExcludedCandidate(2, "m", soft=True),
            ExcludedCandidate(3, "m", soft=True, retry_at=T1),
            ExcludedCandidate(2, "m", soft=True),
            ExcludedCandidate(3, "m"),
        ],
        [(1, "m"), (2, "m"), (3, "m")],
        required_model="",
        not_before=None,
        error_class="TRANSIENT_NETWORK",
    )
    assert facts.excluded == frozenset({(3, "m")})
    assert dict(facts.soft_excluded) == {(1, "m"): T2, (2, "m"): None}
    assert facts.error_class == "TRANSIENT_NETWORK"


def test_requeue_facts_take_the_pin_and_count_the_attempts() -> None:
    """The latest requeue's model pin and `not_before` carry over; the counts are those of the
    task's attempts (four, two switches of candidate)."""
    facts = requeue_facts(
        [],
        [(1, "m"), (1, "m"), (2, "m"), (1, "m")],
        required_model="m",
        not_before=T1,
        error_class="PROVIDER_OVERLOADED",
    )
    assert facts.same_model_only == "m"
    assert facts.not_before == T1
    assert (facts.attempts_so_far, facts.provider_switches_so_far) == (4, 2)
    assert facts.excluded == frozenset()
    assert dict(facts.soft_excluded) == {}


_exclusions = st.lists(
    st.builds(
        ExcludedCandidate,
        st.integers(1, 3),
        st.sampled_from(["m", "n"]),
        soft=st.booleans(),
        retry_at=st.none() | st.sampled_from([T1, T2]),
    ),
    max_size=8,
)


@given(_exclusions, st.randoms(use_true_random=False))
def test_requeue_facts_do_not_depend_on_the_order_of_the_rows(
    excluded: list[ExcludedCandidate], rng: random.Random
) -> None:
    """However the stored exclusions are ordered, the facts are the same: hard wins for good, a
    soft one waits for its latest instant (merging is commutative in what routing sees)."""
    shuffled = list(excluded)
    rng.shuffle(shuffled)

    def facts(rows: list[ExcludedCandidate]) -> tuple[object, object]:
        f = requeue_facts(rows, [], required_model="", not_before=None, error_class="")
        return f.excluded, dict(f.soft_excluded)

    assert facts(excluded) == facts(shuffled)
    hard = {c.key for c in excluded if not c.soft}
    latest: dict[tuple[int, str], datetime | None] = {}
    for c in excluded:
        if c.soft and c.key not in hard:
            known = latest.get(c.key)
            latest[c.key] = max((t for t in (known, c.retry_at) if t), default=None)
    assert facts(excluded) == (frozenset(hard), latest)
