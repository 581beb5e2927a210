"""A seeded random soak: many pinned tasks across the providers, random faults from 9.25.3 armed
on the emulators, random cancels, then the invariant checker and the emulators' truth.

    pytest tests/e2e/test_soak.py                         # ~40 tasks (make test)
    pytest tests/e2e/test_soak.py --soak-size 500 -s      # by hand (or VIDROUTE_SOAK_SIZE=500)
    pytest tests/e2e/test_soak.py --soak-seed 1234        # replay a plan

Production terms: shipped sidecar configs, control-plane defaults, emulators that answer like
the real providers, every duration times one factor. The plan (provider, fault, cancel per task)
is a function of the seed; the interleaving with the control plane's clocks is not. Every task
must end SUCCEEDED, CANCELLED (if it was cancelled), FAILED because the provider failed its job
(an injected fail_job, as the emulator's truth shows), FAILED with OUTPUT_EXPIRED when an
expire_output fault put a Veo job's files past retention, or FAILED(SUBMISSION_UNKNOWN) with its
attempt ABANDONED after a may-have-been-accepted fault on Runway or Veo, where nothing can name
the job (at most one such task per such fault armed). Either way never more than one job per
task's attempt: the run prints ``FIGURES soak: ...`` with the duplicates found (must be 0).
"""

from __future__ import annotations

import pytest

from tests.support.evidence import audit
from tests.support.stack import ControlPlane, ProviderFarm, RedisDb
from tests.support.workload import (
    Workload,
    assert_truth,
    check_truth,
    faults_fired,
    unexplained_outcomes,
)

pytestmark = [pytest.mark.e2e, pytest.mark.postgres, pytest.mark.redis]

PROVIDERS = ("runway", "self_hosted", "google")
# Every duration of the run times 0.01: the 1800 s unknown-recovery window is 18 s, so the two
# unknown Runway/Veo submits an account may hold at once (9.11.3) settle quickly enough for a
# modest soak to finish in about a minute.
TIME_SCALE = 0.01


@pytest.mark.timeout(900)
def test_soak_random_faults_keep_every_invariant(
    *,
    request: pytest.FixtureRequest,
    seed: int,
    farm: ProviderFarm,
    fresh_postgres_url: str,
    redis_db: RedisDb,
    make_control_plane: object,
) -> None:
    """Every task of a random faulty workload ends terminal, with no invariant violated and no
    provider job created twice for one attempt or left unrecorded.
    """
    size = int(request.config.getoption("soak_size"))
    workload = Workload(seed, size, PROVIDERS)
    cp: ControlPlane = make_control_plane(farm, fresh_postgres_url, redis_db.url)  # type: ignore[operator]  # the fixture is a factory typed object
    cp.start()
    workload.submit_all(farm, cp)
    tasks = workload.wait_all_terminal(cp, timeout_s=120 + 3 * size)
    print(f"seed {seed}, {size} tasks:\n{workload.summary(tasks)}")
    truth = check_truth(farm, tasks, workload.prompts)
    print(
        f"FIGURES soak: seed={seed} time_scale={farm.time_scale} tasks={size} "
        f"faults_armed={sum(workload.armed.values())} faults_fired={faults_fired(farm)} "
        f"kills=0 provider_jobs={truth.jobs} abandoned_jobs={truth.abandoned_jobs} "
        f"duplicates={truth.duplicates}"
    )

    report = audit(fresh_postgres_url, redis_db.url)
    assert report.ok, f"seed {seed}\n{report.render()}"
    assert_truth(farm, tasks, workload.prompts)
    unexplained = unexplained_outcomes(workload, tasks, farm, fresh_postgres_url)
    assert not unexplained, f"seed {seed}\n" + "\n".join(unexplained)
    assert cp.stop() == 0, cp.logs()
