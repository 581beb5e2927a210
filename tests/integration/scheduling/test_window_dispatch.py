"""The dispatcher under provider accounts' rate and budget windows (9.11), on a real database.

Limits come in through the dispatcher's `limits_for` lookup, as the accounts document's reader
will give them; spans are the scaled ones a test run uses (a "minute" of well under a second).
"""

from __future__ import annotations

import asyncio
import dataclasses
import time

from controlplane.domain.accounts import AccountLimits
from controlplane.leases.windows import MINUTE
from controlplane.persistence.database import Database
from controlplane.persistence.models import task_attempts
from controlplane.persistence.tasks import TaskQueries
from controlplane.scheduling.windows import LimitsFor
from tests.integration.scheduling.conftest import DispatcherFactory
from tests.integration.scheduling.support import CompilingAdapter, make_spec, strict
from tests.integration.scheduling.test_batch_dispatch import QUIET, WAIT_S, count, state_of
from tests.integration.scheduling.test_dispatcher import new_task

# The scaled minute of these tests: longer than a round and the checks after it take at load 20
# (at 600 ms the window could reopen before the test read the parked task), well inside WAIT_S.
MINUTE_MS = 3_000
WINDOWED = dataclasses.replace(QUIET, window_minute_ms=MINUTE_MS, window_send_allowance_ms=0)
GEN45 = "runway/gen4.5/prod-us"
VEO = "veo-3.1-generate-preview"


def runway_limit(per_minute: int) -> LimitsFor:
    """Runway's accounts limited to `per_minute` submits; no other account limited."""

    def limits_for(provider: str, account: str) -> AccountLimits:
        return AccountLimits(submits_per_minute=per_minute) if provider == "runway" else NONE

    return limits_for


NONE = AccountLimits()


async def verdict(db: Database, task_id: int, candidate: str) -> dict[str, str]:
    detail = await TaskQueries(db).get_task(task_id)
    assert detail is not None
    last = detail.route_decisions[-1]
    by_id = {c["id"]: c for c in last.candidate_snapshot["candidates"]}
    return {"outcome": last.reason_code, **by_id[candidate]}


async def settled(db: Database, task_ids: list[int]) -> dict[str, int]:
    states: dict[str, int] = {}
    for t in task_ids:
        s = await state_of(db, t)
        states[s] = states.get(s, 0) + 1
    return states


async def test_a_full_submit_window_parks_the_task_until_it_reopens(
    db: Database, adapter: CompilingAdapter, make_dispatcher: DispatcherFactory
) -> None:
    """With one submit a minute, the second task waits parked: its decision names the window,
    the limit and the reopening; rounds and releases in the account pass it over (no compile, no
    decision); the loop, polling once an hour, is woken at the reopening and dispatches it."""
    dispatcher = make_dispatcher(config=WINDOWED, limits_for=runway_limit(1))
    first = await new_task(db, make_spec(**strict("gen4.5")), "k1")
    second = await new_task(db, make_spec(**strict("gen4.5")), "k2")
    assert await dispatcher.tick() == 2
    assert await state_of(db, first.id) == "SUBMITTING"
    assert await state_of(db, second.id) == "QUEUED"
    waiting = await verdict(db, second.id, GEN45)
    assert (waiting["outcome"], waiting["reason"]) == ("NO_CAPACITY", "NO_CAPACITY")
    assert "submits_per_minute window full: 1 used + 1 requested > limit 1" in waiting["detail"]
    assert "reopens at " in waiting["detail"]
    refusals = dispatcher.metrics.registry.get_sample_value(
        "provider_window_refusals_total",
        {"provider": "runway", "account": "prod-us", "window": MINUTE},
    )
    assert refusals == 1
    parked_at = time.monotonic()
    calls = len(adapter.compile_calls)
    dispatcher.capacity_freed("runway:prod-us")  # a release does not reopen a window
    assert second.id in dispatcher.parking
    assert await dispatcher.tick() == 0
    assert len(adapter.compile_calls) == calls

    stop = asyncio.Event()
    runner = asyncio.create_task(dispatcher.run(stop))
    try:
        deadline = time.monotonic() + WAIT_S
        while await state_of(db, second.id) != "SUBMITTING":
            assert time.monotonic() < deadline, "the parked task was not dispatched"
            await asyncio.sleep(0.02)
    finally:
        stop.set()
        dispatcher.wake()
        await asyncio.wait_for(runner, WAIT_S)
    # Woken by the reopening, not by the hour-long poll nor before the window let it in.
    assert MINUTE_MS / 1000 * 0.5 < time.monotonic() - parked_at < WAIT_S
    assert await count(db, task_attempts) == 2


async def test_a_refused_window_falls_through_to_another_account(
    db: Database, make_dispatcher: DispatcherFactory
) -> None:
    """Two Veo accounts with one submit a minute each take one task each; the third task waits
    parked on both windows, and nothing fails."""

    def limits_for(provider: str, account: str) -> AccountLimits:
        return AccountLimits(submits_per_minute=1) if provider == "google" else NONE

    dispatcher = make_dispatcher(config=WINDOWED, limits_for=limits_for)
    tasks = [(await new_task(db, make_spec(**strict(VEO)), f"v{i}")).id for i in range(3)]
    assert await dispatcher.tick() == 3
    assert await settled(db, tasks) == {"SUBMITTING": 2, "QUEUED": 1}
    detail = {t: await TaskQueries(db).get_task(t) for t in tasks}
    accounts = {a.provider_account_id for d in detail.values() if d for a in d.attempts}
    assert len(accounts) == 2
    (queued,) = [t for t in tasks if await state_of(db, t) == "QUEUED"]
    assert queued in dispatcher.parking
