"""A seeded random soak: many pinned tasks across the providers, random faults from 9.25.3 armed
on the emulators, random cancels, then the invariant checker and the emulators' truth.

    pytest tests/e2e/test_soak.py                         # ~40 tasks (make test)
    pytest tests/e2e/test_soak.py --soak-size 500 -s      # by hand; prints the seed
    pytest tests/e2e/test_soak.py --soak-seed 1234        # replay a plan

The plan (provider, fault, cancel per task) is a function of the seed; the interleaving with the
control plane's clocks is not. Every task must end SUCCEEDED, CANCELLED (if it was cancelled),
FAILED because the provider failed its job (an injected fail_job, as the emulator's truth shows),
or FAILED with OUTPUT_EXPIRED when an expire_output fault put a Veo job's files past retention
(at most one such task per such fault armed).
"""

from __future__ import annotations

import pytest

from tests.support.stack import ControlPlane, ProviderFarm, RedisDb, audit
from tests.support.workload import Workload, assert_truth, unexplained_outcomes

pytestmark = [pytest.mark.e2e, pytest.mark.postgres, pytest.mark.redis]

PROVIDERS = ("runway", "self_hosted", "google")


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
    cp: ControlPlane = make_control_plane(farm, fresh_postgres_url, redis_db.url)  # type: ignore[operator]
    cp.start()
    workload.submit_all(farm, cp)
    tasks = workload.wait_all_terminal(cp, timeout_s=120 + 3 * size)
    print(f"seed {seed}, {size} tasks:\n{workload.summary(tasks)}")

    report = audit(fresh_postgres_url, redis_db.url)
    assert report.ok, f"seed {seed}\n{report.render()}"
    assert_truth(farm, tasks)
    unexplained = unexplained_outcomes(workload, tasks, farm, fresh_postgres_url)
    assert not unexplained, f"seed {seed}\n" + "\n".join(unexplained)
    assert cp.stop() == 0, cp.logs()
