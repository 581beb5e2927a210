"""SIGKILL the control plane at random moments of a faulty workload, restart it each time, and
prove nothing was lost or done twice.

    pytest tests/e2e/test_crash.py                            # 3 crashes (make test)
    pytest tests/e2e/test_crash.py --crash-rounds 10 -s       # by hand (or VIDROUTE_CRASH_ROUNDS)
    pytest tests/e2e/test_crash.py --crash-seed 7             # replay a plan

A kill moment is a condition drawn from the seed (the next provider job appears, an attempt is
submitting / unknown / running, an output is being fetched, or right after CreateTask), so the
crash lands inside the step it names rather than after an arbitrary sleep. After the last restart
every task must end terminal; then, as production would after the lease TTL of the killed
holders ran out, expired leases are reclaimed and counters reconciled, and the invariant checker
must report nothing. The emulators' truth must show no job created twice for one task's attempt
and no job that no attempt recorded, except the one job of an attempt ABANDONED because nothing
could name it (Runway, Veo). Production terms as in test_soak; the run prints
``FIGURES crash: ...`` with tasks, faults, kills and duplicates found (must be 0).
"""

from __future__ import annotations

import random
from collections.abc import Callable

import pytest

from tests.support.evidence import audit
from tests.support.stack import ControlPlane, ProviderFarm, RedisDb, wait_for
from tests.support.workload import (
    Planned,
    Workload,
    assert_truth,
    check_truth,
    faults_fired,
    unexplained_outcomes,
)
from vidroute.scheduler.v1 import scheduler_pb2 as sp

pytestmark = [pytest.mark.e2e, pytest.mark.postgres, pytest.mark.redis]

PROVIDERS = ("runway", "self_hosted", "google")
TASKS_PER_ROUND = 5
# The dispatcher's lease TTL (DispatcherConfig.lease_ttl_ms) plus a margin, in production ms: a
# SIGKILLed holder never releases, its leases end when this much time passed without a renewal.
LEASE_TTL_AHEAD_MS = 600_000 + 60_000


def _attempt_in(cp: ControlPlane, tasks: list[Planned], states: set[int]) -> bool:
    for planned in tasks:
        if any(a.state in states for a in cp.get_task(planned.task_id).attempts):
            return True
    return False


def _task_in(cp: ControlPlane, tasks: list[Planned], states: set[int]) -> bool:
    return any(cp.get_task(p.task_id).state in states for p in tasks)


def _trigger(
    rng: random.Random, farm: ProviderFarm, cp: ControlPlane, tasks: list[Planned]
) -> tuple[str, Callable[[], bool]]:
    """A named condition that marks the kill moment."""
    jobs_now = sum(len(farm.truth(p)) for p in farm.providers)
    choices: list[tuple[str, Callable[[], bool]]] = [
        ("right after CreateTask", lambda: True),
        (
            "next provider job created",
            lambda: sum(len(farm.truth(p)) for p in farm.providers) > jobs_now,
        ),
        ("attempt submitting", lambda: _attempt_in(cp, tasks, {sp.ATTEMPT_STATE_SUBMITTING})),
        (
            "attempt submit unknown",
            lambda: _attempt_in(cp, tasks, {sp.ATTEMPT_STATE_SUBMIT_UNKNOWN}),
        ),
        (
            "attempt running",
            lambda: _attempt_in(cp, tasks, {sp.ATTEMPT_STATE_ACCEPTED, sp.ATTEMPT_STATE_RUNNING}),
        ),
        ("output fetching", lambda: _task_in(cp, tasks, {sp.TASK_STATE_OUTPUT_FETCHING})),
    ]
    return rng.choice(choices)


@pytest.mark.timeout(900)
def test_sigkill_at_random_moments_loses_nothing(
    *,
    request: pytest.FixtureRequest,
    seed: int,
    farm: ProviderFarm,
    fresh_postgres_url: str,
    redis_db: RedisDb,
    make_control_plane: object,
) -> None:
    """After SIGKILLs at random moments and restarts, every task ends terminal, every invariant
    holds and no provider job was submitted twice for one attempt.
    """
    rounds = int(request.config.getoption("crash_rounds"))
    rng = random.Random(seed)
    workload = Workload(seed, TASKS_PER_ROUND * (rounds + 1), PROVIDERS, cancel_share=0.0)
    cp: ControlPlane = make_control_plane(farm, fresh_postgres_url, redis_db.url)  # type: ignore[operator]  # the fixture is a factory typed object
    cp.start()
    moments = []
    kills = 0
    batches = [
        workload.tasks[i : i + TASKS_PER_ROUND]
        for i in range(0, len(workload.tasks), TASKS_PER_ROUND)
    ]
    for number, batch in enumerate(batches):
        for planned in batch:
            workload.arm(farm, planned)
            planned.task_id = cp.create_task(planned.provider, prompt=planned.prompt)
        if number == rounds:
            break  # the last batch runs to the end undisturbed
        name, condition = _trigger(rng, farm, cp, batch)
        try:
            wait_for(condition, timeout_s=20, interval_s=0.02, what=name)
            moments.append(name)
        except TimeoutError:
            moments.append(f"{name} (not reached in 20 s; killed anyway)")
        kills += 1
        cp.kill()
        cp.start()
    print(f"seed {seed}: killed at {moments}")

    tasks = workload.wait_all_terminal(cp, timeout_s=240)
    print(workload.summary(tasks))
    truth = check_truth(farm, tasks, workload.prompts)
    print(
        f"FIGURES crash: seed={seed} time_scale={farm.time_scale} tasks={len(tasks)} "
        f"faults_armed={sum(workload.armed.values())} faults_fired={faults_fired(farm)} "
        f"kills={kills} provider_jobs={truth.jobs} abandoned_jobs={truth.abandoned_jobs} "
        f"duplicates={truth.duplicates}"
    )
    ahead_ms = round(farm.seconds(LEASE_TTL_AHEAD_MS))
    report = audit(fresh_postgres_url, redis_db.url, reclaim_ahead_ms=ahead_ms)
    assert report.ok, f"seed {seed}, kills at {moments}\n{report.render()}"
    assert_truth(farm, tasks, workload.prompts)
    unexplained = unexplained_outcomes(workload, tasks, farm, fresh_postgres_url)
    assert not unexplained, f"seed {seed}\n" + "\n".join(unexplained)
    assert cp.stop() == 0, cp.logs()
