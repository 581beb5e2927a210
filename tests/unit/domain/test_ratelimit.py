"""Token buckets (controlplane.domain.ratelimit): burst, refill, the retry delay, isolation of
keys and a changed rate."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from controlplane.domain.ratelimit import TokenBuckets

pytestmark = pytest.mark.timeout(30)


def test_a_full_bucket_allows_its_burst_then_refuses_with_the_wait() -> None:
    """`burst` takes at once, then a refusal saying when the next token is there."""
    buckets = TokenBuckets()
    assert all(buckets.take("t", 2.0, 3, 0.0).allowed for _ in range(3))
    refused = buckets.take("t", 2.0, 3, 0.0)
    assert not refused.allowed
    assert refused.retry_after_s == pytest.approx(0.5)
    assert not buckets.take("t", 2.0, 3, 0.4).allowed
    assert buckets.take("t", 2.0, 3, 0.5).allowed


def test_keys_do_not_share_tokens() -> None:
    """One key's flood leaves another key's bucket full."""
    buckets = TokenBuckets()
    while buckets.take("greedy", 1.0, 5, 0.0).allowed:
        pass
    assert all(buckets.take("honest", 1.0, 5, 0.0).allowed for _ in range(5))


def test_a_new_rate_keeps_the_tokens_capped_at_the_new_burst() -> None:
    """A republished rate neither refills nor drains a bucket beyond its new burst."""
    buckets = TokenBuckets()
    assert buckets.take("t", 1.0, 10, 0.0).allowed  # 9 left
    assert sum(buckets.take("t", 1.0, 2, 0.0).allowed for _ in range(5)) == 2


def test_the_least_recently_used_key_is_dropped_past_the_bound() -> None:
    """At most `max_keys` buckets are kept; a dropped key comes back full."""
    buckets = TokenBuckets(max_keys=2)
    assert buckets.take("a", 1.0, 1, 0.0).allowed
    assert buckets.take("b", 1.0, 1, 0.0).allowed
    assert buckets.take("c", 1.0, 1, 0.0).allowed
    assert buckets.take("a", 1.0, 1, 0.0).allowed  # dropped, so full again


@given(
    rate=st.floats(0.1, 100),
    burst=st.integers(1, 50),
    gaps=st.lists(st.floats(0, 2), min_size=1, max_size=200),
)
def test_never_more_than_burst_plus_rate_times_elapsed(
    rate: float, burst: int, gaps: list[float]
) -> None:
    """Over any sequence of requests, allowed <= burst + rate x elapsed."""
    buckets = TokenBuckets()
    now, allowed = 0.0, 0
    for gap in gaps:
        now += gap
        allowed += buckets.take("k", rate, burst, now).allowed
    assert allowed <= burst + rate * now + 1e-6
