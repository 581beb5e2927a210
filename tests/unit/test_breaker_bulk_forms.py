"""The health monitor's bulk forms, `admit_many` and `record_outcomes` (a dispatch round's Compile
calls: one call per candidate's breaker), answer and move the breakers exactly as the single
forms called once per holder and outcome, in order: for every sequence of successes, silences,
unreadable answers and disabling errors, across cooldowns, HALF_OPEN probes and closings."""

from __future__ import annotations

import asyncio

from hypothesis import given, settings
from hypothesis import strategies as st

from controlplane.domain.breaker import BreakerConfig, BreakerKey, BreakerRegistry, Operation
from controlplane.scheduling.health import HealthMonitor

KEYS = (
    BreakerKey("runway", "prod", "us", "gen4", Operation.COMPILE),
    BreakerKey("google", "prod", "eu", "veo3", Operation.COMPILE),
)
CONFIG = BreakerConfig(
    min_samples=3,
    consecutive_failures=2,
    cooldowns_s=(5.0, 10.0),
    account_cooldowns_s=(20.0,),
    half_open_max_probes=2,
    half_open_successes_to_close=2,
)
OUTCOMES = st.sampled_from([None, None, "TRANSIENT_NETWORK", "MALFORMED_RESPONSE", "AUTH"])
BATCH = st.tuples(
    st.sampled_from(KEYS),
    st.lists(st.tuples(OUTCOMES, st.floats(0.001, 2.0)), min_size=1, max_size=6),
    st.sampled_from([0.0, 1.0, 6.0, 30.0]),  # seconds before the batch: cooldowns elapse
)


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


def monitor(clock: Clock) -> HealthMonitor:
    return HealthMonitor(BreakerRegistry(CONFIG, clock), clock=clock)


@settings(max_examples=150, deadline=None)
@given(st.lists(BATCH, min_size=1, max_size=12))
def test_bulk_forms_equal_the_single_forms_called_in_order(
    batches: list[tuple[BreakerKey, list[tuple[str | None, float]], float]],
) -> None:
    """Same admissions, same transitions, same breaker states, batch after batch."""

    async def run() -> None:
        clock = Clock()
        single, bulk = monitor(clock), monitor(clock)
        for n, (key, outcomes, wait) in enumerate(batches):
            clock.now += wait
            holders = [f"COMPILE:{n}:{i}" for i in range(len(outcomes))]
            one_by_one = [await single.admit(key, h) for h in holders]
            assert await bulk.admit_many(key, holders) == one_by_one
            made = [
                (f, s, h) for (f, s), h, ok in zip(outcomes, holders, one_by_one, strict=True) if ok
            ]
            expected = [await single.record_outcome(key, f, s, holder=h) for f, s, h in made]
            assert await bulk.record_outcomes(key, made) == expected
            assert bulk.registry.states() == single.registry.states()

    asyncio.run(run())
