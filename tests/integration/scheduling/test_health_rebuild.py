"""The routing health windows survive a restart (issue 26): a new `HealthMonitor` rebuilds the
24-hour and 7-day windows from PostgreSQL's finished provider jobs before its first sync, and
does not count twice what the shared observation stream still holds."""

from __future__ import annotations

import math
import time
from datetime import datetime, timedelta

import pytest

from controlplane.domain.breaker import BreakerConfig, BreakerRegistry
from controlplane.domain.polling import PollingPolicy, learned_durations
from controlplane.domain.scoring import Window
from controlplane.domain.states import AttemptState
from controlplane.persistence.catalog import CatalogQueries
from controlplane.persistence.database import Database
from controlplane.persistence.records import AttemptChanges, NewProviderJob
from controlplane.scheduling.health import HealthMonitor
from controlplane.scheduling.shared_state import InProcessSharedState, Observation
from tests.integration.persistence.builders import NOW, Scenario

pytestmark = pytest.mark.timeout(60)

RESTART = NOW + timedelta(hours=2)


async def _ended_job(
    build: Scenario, account: int, state: AttemptState, took_s: float, ended: datetime
) -> None:
    """A provider job of a fresh attempt that ended in `state` at `ended`, `took_s` after its
    submit started, written through the unit of work."""
    attempt = await build.attempt(account)
    started = ended - timedelta(seconds=took_s)
    async with build.db.unit(started) as u:
        sending = AttemptChanges(request_started_at=started)
        assert await u.move_attempt(attempt, AttemptState.SUBMITTING, "sent", sending)
        job, _ = await u.insert_job(
            NewProviderJob(
                attempt_id=attempt.id,
                provider_account_id=account,
                provider_job_id=f"job-{attempt.id}",
                normalized_status=AttemptState.ACCEPTED,
                submitted_at=started,
            )
        )
    async with build.db.unit(ended) as u:
        await u.update_job(job.id, normalized_status=state.value, completed_at=ended)


async def test_a_restarted_monitor_routes_on_the_windows_it_rebuilt(db: Database) -> None:
    """Three jobs of the last day (two succeeded in 100 s, one failed after 400 s) and one of
    eight days ago: the new monitor's day window holds the three, its p95 is the slow one's,
    and its health view is not empty before it observed anything itself. A generation outcome
    already in the shared stream is not counted again; a refused submit there is."""
    build = Scenario(db)
    account = await build.account()
    for state, took, ago in (
        (AttemptState.SUCCEEDED, 100.0, timedelta(hours=5)),
        (AttemptState.SUCCEEDED, 100.0, timedelta(hours=4)),
        (AttemptState.FAILED, 400.0, timedelta(hours=3)),
        (AttemptState.SUCCEEDED, 100.0, timedelta(days=8)),
    ):
        await _ended_job(build, account, state, took, RESTART - ago)
    name = (await CatalogQueries(db).accounts())[0].account_name
    candidate = f"runway/gen4.5/{name}"
    shared = InProcessSharedState()
    at = (RESTART - timedelta(hours=3)).timestamp()
    await shared.add_observations(
        [
            Observation(candidate, False, 400.0, 0, at, "peer"),  # the failed job, again
            Observation(candidate, False, None, 0, at, "peer"),  # a refused submit
        ]
    )
    monitor = HealthMonitor(
        BreakerRegistry(BreakerConfig(), time.time),
        db=db,
        shared=shared,
        clock=RESTART.timestamp,
    )
    assert monitor.health_view(candidate) is None
    await monitor.sync_windows(force=True)
    day = monitor.window_stats()[candidate][Window.ONE_DAY]
    # Each sample decayed from its own time: 5, 4 and 3 hours ago, and the refusal 3 hours ago.
    w5, w4, w3 = (math.exp(-h * 3600 / Window.ONE_DAY.seconds) for h in (5, 4, 3))
    assert day.effective_samples == pytest.approx(w5 + w4 + 2 * w3, rel=1e-6)
    assert day.success_rate == pytest.approx((w5 + w4) / (w5 + w4 + 2 * w3), rel=1e-6)
    assert day.mean_latency_s == pytest.approx((100 * (w5 + w4) + 400 * w3) / (w5 + w4 + w3))
    assert day.p95_latency_s == pytest.approx(400.0, rel=0.08)
    assert monitor.health_view(candidate) is not None
    await monitor.sync_windows(force=True)  # rebuilt once: nothing is added again
    again = monitor.window_stats()[candidate][Window.ONE_DAY]
    assert again.effective_samples == pytest.approx(day.effective_samples)


async def test_finished_jobs_page_in_completion_order(db: Database) -> None:
    """Pages of two, each after the last one's (completed_at, id), give every ended job once,
    oldest first; a job still running and one that ended before `since` are left out."""
    build = Scenario(db)
    account = await build.account()
    ends = [RESTART - timedelta(minutes=m) for m in (50, 40, 40, 30, 20)]
    for end in ends:
        await _ended_job(build, account, AttemptState.SUCCEEDED, 10.0, end)
    await _ended_job(build, account, AttemptState.SUCCEEDED, 10.0, RESTART - timedelta(days=9))
    running = await build.attempt(account)
    async with db.unit(NOW) as u:
        await u.insert_job(
            NewProviderJob(running.id, account, "job-running", AttemptState.RUNNING, NOW)
        )
    queries, since = CatalogQueries(db), RESTART - timedelta(days=7)
    whole = await queries.finished_jobs(since)
    paged, after = [], None
    while page := await queries.finished_jobs(since, after, limit=2):
        paged += page
        after = (page[-1].completed_at, page[-1].job_id)
    assert [j.completed_at for j in whole] == ends
    assert paged == whole


async def test_a_restarted_monitor_gives_the_poller_the_rebuilt_p95(db: Database) -> None:
    """Twenty-four jobs of the last two hours that took 120 s each: a monitor started after
    them, rebuilt from PostgreSQL, gives the poller 120 s as the candidate's expected p95
    (9.18.2) before it observed anything itself; the max plausible stays the configured."""
    build = Scenario(db)
    account = await build.account()
    for n in range(24):
        ended = RESTART - timedelta(minutes=5 * (n + 1))
        await _ended_job(build, account, AttemptState.SUCCEEDED, 120.0, ended)
    name = (await CatalogQueries(db).accounts())[0].account_name
    monitor = HealthMonitor(
        BreakerRegistry(BreakerConfig(), time.time), db=db, clock=RESTART.timestamp
    )
    assert monitor.job_durations("runway", name, "gen4.5") is None
    await monitor.sync_windows(force=True)
    evidence = monitor.job_durations("runway", name, "gen4.5")
    assert evidence is not None
    assert evidence.samples >= PollingPolicy().learn_min_samples
    learned = learned_durations(
        PollingPolicy(), evidence, configured_p95_s=None, configured_max_s=1800.0
    )
    assert learned.expected_p95_s == pytest.approx(120.0, rel=0.08)  # half a bucket
    assert learned.max_plausible_s == 1800.0
