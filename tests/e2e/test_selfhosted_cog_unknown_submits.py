"""Unknown submits on a real Cog server (issue 24): the answer to the PUT is lost, and recovery
may use only what Cog offers, the webhooks the sidecar journaled, never a probing PUT (which
would start a second GPU run once the prediction had ended).

The Cog server runs behind the contract suite's fault front (``emulators/cog_front.py``: the
real coglet with models/cog_video, faults on ``PUT /predictions/*``, truth from its own log);
the self-hosted sidecar runs its shipped config on the Cog backend; the control plane its
defaults, on PostgreSQL and Redis, every duration times `TIME_SCALE`.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from adapter_sidecars.emulators.cog_front import CogFront, CogFrontConfig
from adapter_sidecars.emulators.runner import EmulatorThread
from tests.conftest import PostgresServer
from tests.support.module_stack import module_database
from tests.support.stack import ControlPlane, ProviderFarm, RedisDb, describe, spec_for
from vidroute.scheduler.v1 import scheduler_pb2 as sp
from vidroute.scheduler.v1 import scheduler_service_pb2 as api

pytestmark = [pytest.mark.e2e, pytest.mark.postgres, pytest.mark.redis, pytest.mark.timeout(180)]

# 0.01: the 1800 s unknown-recovery deadline is 18 s.
TIME_SCALE = 0.01
PROVIDER = "self_hosted"
PUT = "PUT /predictions/*"


class Stack:
    def __init__(self, front: EmulatorThread, farm: ProviderFarm, cp: ControlPlane) -> None:
        self.front, self.farm, self.cp = front, farm, cp

    def run(self, fault: dict[str, Any]) -> tuple[sp.Task, list[dict[str, Any]]]:
        """One task whose create meets `fault`; its end and the jobs the server ran for it."""
        prompt = f"cog unknown {uuid.uuid4().hex[:10]}"
        self.front.add_faults([{"route": PUT, **fault}])
        request = api.CreateTaskRequest(
            spec=spec_for(PROVIDER, prompt, duration_s=4), idempotency_key=uuid.uuid4().hex
        )
        assert self.cp.stub is not None
        task_id = str(self.cp.stub.CreateTask(request, timeout=10).task.task_id)
        task = self.cp.wait_terminal(task_id, timeout_s=90)
        jobs = [j for j in self.front.truth() if prompt in str(j.get("body"))]
        return task, jobs


@pytest.fixture(scope="module")
def stack(
    tmp_path_factory: pytest.TempPathFactory,
    postgres_server: PostgresServer,
    redis_server_url: str,
) -> Iterator[Stack]:
    workdir = tmp_path_factory.mktemp("cog-unknown")
    front = EmulatorThread(CogFront(CogFrontConfig(webhook_token="key_e2e_self_hosted")))
    front.start()
    try:
        with (
            module_database(postgres_server, "postgresql", workdir) as database_url,
            ProviderFarm(
                workdir / "farm",
                time_scale=TIME_SCALE,
                providers=[PROVIDER],
                base_urls={PROVIDER: front.url},
                sidecar_options={PROVIDER: {"backend": "cog", "slots": 4}},
            ) as farm,
            RedisDb(redis_server_url) as redis,
        ):
            (workdir / "cp").mkdir()
            cp = ControlPlane(workdir / "cp", farm, database_url=database_url, redis_url=redis.url)
            cp.start()
            try:
                yield Stack(front, farm, cp)
            finally:
                cp.kill()
    finally:
        front.stop()


def test_lost_answer_is_recovered_from_the_webhook_journal_with_one_run(stack: Stack) -> None:
    """The server ran the prediction but the PUT's answer was dropped (UNKNOWN): its webhooks,
    journaled under the request key, let recovery adopt it; the task SUCCEEDS on one attempt
    and the server's log shows one run."""
    task, jobs = stack.run({"action": "drop_after_body"})
    assert task.state == sp.TASK_STATE_SUCCEEDED, describe(task)
    assert len(task.attempts) == 1, describe(task)
    key = task.attempts[0].client_request_key
    assert [j["id"] for j in jobs] == [key], jobs
    sidecar_log = stack.farm.sidecars[PROVIDER].log()
    assert f"journal: submit {key} UNKNOWN" in sidecar_log, "the PUT's answer was not lost"


def test_body_that_never_arrived_is_abandoned_without_a_run(stack: Stack) -> None:
    """The connection dropped while the body was sent: nothing ran, but nothing on Cog can
    prove that (no listing, no GET, no webhook), so the attempt is ABANDONED at the recovery
    deadline and nothing is sent again: no run at all."""
    task, jobs = stack.run({"action": "drop_after_partial_body"})
    assert task.state == sp.TASK_STATE_FAILED, describe(task)
    assert [a.state for a in task.attempts] == [sp.ATTEMPT_STATE_ABANDONED], describe(task)
    assert jobs == []
