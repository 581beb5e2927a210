"""An account's configured total concurrency holds at the provider (issue 21, design 9.11):
the accounts document, shipped to the control plane as ``VIDROUTE_ACCOUNTS_FILE``, gives
Runway's ``prod-us`` account a total of 3 running jobs across its two text-to-video models
(gen4.5 and veo3.1, each capped at 2 by its capability, so 4 without the document). Twelve tasks,
six per model, all succeed, and the emulator's own record of every job it created (created to
terminal) never has more than 3 at once; it does reach 3, so the limit is what held it.

The real stack: PostgreSQL, Redis leases, the shipped Runway sidecar over HTTP to its emulator,
the control plane as a process. `GetAccountUsage` shows the configured limit while it runs.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import datetime
from typing import Any

import pytest

from clients import auth as client_auth
from tests.conftest import PostgresServer
from tests.support.module_stack import module_database
from tests.support.stack import ControlPlane, ProviderFarm, RedisDb, spec_for, wait_for
from vidroute.scheduler.v1 import account_service_pb2 as account_api
from vidroute.scheduler.v1 import account_service_pb2_grpc
from vidroute.scheduler.v1 import scheduler_pb2 as sp
from vidroute.scheduler.v1 import scheduler_service_pb2 as api

pytestmark = [pytest.mark.e2e, pytest.mark.postgres, pytest.mark.redis, pytest.mark.timeout(400)]

PROVIDER = "runway"
MODELS = ("gen4.5", "veo3.1")  # both text-to-video on Runway's prod-us, capability cap 2 each
TOTAL = 3
TASKS_PER_MODEL = 6
DOCUMENT = f"""\
version: e2e-accounts-1
accounts:
  runway:
    prod-us:
      credential_ref: env:VIDROUTE_E2E_KEY
      limits:
        max_concurrency: {TOTAL}
"""


@pytest.fixture(scope="module")
def platform(
    postgres_server: PostgresServer, redis_server_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[ProviderFarm, ControlPlane]]:
    """The Runway emulator and shipped sidecar; a control plane given the accounts file."""
    workdir = tmp_path_factory.mktemp("account-limits")
    accounts_file = workdir / "accounts.yaml"
    accounts_file.write_text(DOCUMENT, encoding="utf-8")
    with (
        module_database(postgres_server, "postgresql", workdir) as url,
        ProviderFarm(workdir / "farm", providers=(PROVIDER,)) as farm,
        RedisDb(redis_server_url) as redis,
    ):
        (workdir / "cp").mkdir()
        cp = ControlPlane(
            workdir / "cp",
            farm,
            database_url=url,
            redis_url=redis.url,
            env={"VIDROUTE_ACCOUNTS_FILE": str(accounts_file)},
        )
        cp.start()
        try:
            yield farm, cp
        finally:
            cp.kill()


def peak_in_flight(truth: list[dict[str, Any]]) -> int:
    """The most jobs the emulator had between creation and a terminal phase at one instant (a
    job ending at the instant another is created does not overlap it)."""
    events: list[tuple[datetime, int]] = []
    for job in truth:
        events.append((datetime.fromisoformat(job["created_at"]), 1))
        if job["finished_at"] is not None:
            events.append((datetime.fromisoformat(job["finished_at"]), -1))
    peak = running = 0
    for _, step in sorted(events):  # at a tie the end (-1) sorts first
        running += step
        peak = max(peak, running)
    return peak


def _create(cp: ControlPlane, model: str, n: int) -> str:
    spec = spec_for(PROVIDER, prompt=f"a kite over a hill, take {n}")
    spec.routing.required_model = model
    request = api.CreateTaskRequest(spec=spec, idempotency_key=uuid.uuid4().hex)
    return cp._call(lambda s: s.CreateTask(request, timeout=60)).task.task_id


def _account_dimension(cp: ControlPlane) -> account_api.GetAccountUsageResponse:
    assert cp.proc is not None
    with client_auth.channel(cp.proc.address, cp.token) as channel:
        stub = account_service_pb2_grpc.AccountServiceStub(channel)
        return stub.GetAccountUsage(account_api.GetAccountUsageRequest(), timeout=60)


def test_an_account_total_of_three_holds_across_two_models_at_the_provider(
    platform: tuple[ProviderFarm, ControlPlane],
) -> None:
    """Twelve tasks on two models of one account with a configured total of 3 all succeed,
    and the emulator never has more than 3 of the account's jobs in flight at once."""
    farm, cp = platform
    tasks = [
        _create(cp, model, n) for n in range(TASKS_PER_MODEL) for model in MODELS
    ]  # interleaved: both models always have work waiting
    usage = _account_dimension(cp)
    total = next(d for d in usage.dimensions if d.account == "prod-us" and d.dimension == "account")
    assert (total.limit, total.configured) == (TOTAL, True)
    assert total.used <= TOTAL
    for task_id in tasks:
        done = cp.wait_terminal(task_id, timeout_s=240)
        assert done.state == sp.TASK_STATE_SUCCEEDED, (task_id, done.state)
    truth = farm.truth(PROVIDER)
    models = {job["body"]["model"] for job in truth}
    assert models == set(MODELS), models
    assert len(truth) == len(tasks), "a task was submitted more than once"
    wait_for(lambda: all(j["finished_at"] for j in farm.truth(PROVIDER)), timeout_s=30)
    peak = peak_in_flight(farm.truth(PROVIDER))
    assert peak <= TOTAL, f"the emulator ran {peak} jobs of prod-us at once; the total is {TOTAL}"
    assert peak == TOTAL, f"at most {peak} ran at once: the limit of {TOTAL} was never reached"


def test_peak_in_flight_counts_overlaps_only() -> None:
    """The emulator-truth reading counts jobs that overlap, not jobs that touch end to start."""
    jobs = [
        {"created_at": "2026-12-05T00:00:00.000Z", "finished_at": "2026-12-05T00:00:02.000Z"},
        {"created_at": "2026-12-05T00:00:01.000Z", "finished_at": "2026-12-05T00:00:03.000Z"},
        {"created_at": "2026-12-05T00:00:02.000Z", "finished_at": "2026-12-05T00:00:04.000Z"},
    ]
    assert peak_in_flight(jobs) == 2
    unfinished = {"created_at": "2026-12-05T00:00:01.500Z", "finished_at": None}
    assert peak_in_flight([*jobs, unfinished]) == 3
