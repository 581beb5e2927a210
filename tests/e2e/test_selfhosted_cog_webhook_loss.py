"""A self-hosted task on a real Cog server whose completion webhook is missed while the sidecar
restarts (issue 24): never a second GPU run, recovered when coglet's retry lands, ABANDONED as
a lost job (design 9.17.5, lost_jobs) when the retry died with the model server.

Processes: the Cog server (coglet running models/cog_video with this venv's Python), the
self-hosted sidecar on its Cog backend (webhook receiver on a fixed port, journal in a file),
the control plane on PostgreSQL and Redis. The Cog server's own log is the truth of GPU runs.
"""

from __future__ import annotations

import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from adapter_sidecars.selfhosted.cog_server import prediction_runs, start_cog_server
from tests.conftest import PostgresServer
from tests.support.module_stack import module_database
from tests.support.stack import (
    ControlPlane,
    ProviderFarm,
    RedisDb,
    describe,
    free_port,
    spec_for,
    wait_for,
)
from vidroute.scheduler.v1 import scheduler_pb2 as sp
from vidroute.scheduler.v1 import scheduler_service_pb2 as api

pytestmark = [pytest.mark.e2e, pytest.mark.postgres, pytest.mark.redis, pytest.mark.timeout(180)]

# 0.01: production's one hour of JOB_NOT_FOUND before a lost job is ABANDONED becomes 36 s.
TIME_SCALE = 0.01
PROVIDER = "self_hosted"
TOKEN = "key_e2e_self_hosted"  # the shipped config's credential, as the farm substitutes it
# GPU-like wall time of a run: long enough to stop the sidecar while it runs.
SECONDS_PER_OUTPUT_SECOND = 0.75
LIVE = (
    sp.ATTEMPT_STATE_ACCEPTED,
    sp.ATTEMPT_STATE_PROVIDER_QUEUED,
    sp.ATTEMPT_STATE_RUNNING,
)


class CogServer:
    """coglet on a fixed port; `restart` drops everything it held in memory (queued webhook
    retries included), like a model server pod that was rescheduled."""

    def __init__(self, workdir: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = workdir / "cog.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.proc = start_cog_server(self.port, self.log, webhook_token=TOKEN)
        wait_for(lambda: self.health() == "READY", timeout_s=30, what="cog server READY")

    def health(self) -> str:
        try:
            return str(httpx.get(f"{self.url}/health-check", timeout=1).json()["status"])
        except (httpx.HTTPError, ValueError, KeyError):
            return ""

    def stop(self) -> None:
        if self.proc is None:
            return
        self.proc.kill()  # no goodbye: pending webhook retries die with it
        self.proc.wait(timeout=10)
        self.proc = None

    def runs(self) -> dict[str, int]:
        return prediction_runs(self.log.read_text(encoding="utf-8", errors="replace"))

    def completed(self, prediction_id: str) -> bool:
        return any(
            "Prediction worker completed" in line and prediction_id in line
            for line in self.log.read_text(encoding="utf-8", errors="replace").splitlines()
        )


class Stack:
    def __init__(self, cog: CogServer, farm: ProviderFarm, cp: ControlPlane) -> None:
        self.cog, self.farm, self.cp = cog, farm, cp

    def create(self, prompt: str) -> str:
        request = api.CreateTaskRequest(
            spec=spec_for(PROVIDER, prompt, duration_s=4), idempotency_key=uuid.uuid4().hex
        )
        assert self.cp.stub is not None
        return str(self.cp.stub.CreateTask(request, timeout=10).task.task_id)

    def key_of_live_attempt(self, task_id: str) -> str:
        task = self.cp.wait_attempt_state(task_id, LIVE, timeout_s=60)
        return next(a.client_request_key for a in task.attempts if a.state in LIVE)

    def miss_the_webhook(self, key: str, *, lose_retries: bool) -> None:
        """Stop the sidecar while `key` runs; let it finish (coglet's completion webhook fails);
        with `lose_retries` restart the Cog server too; then start the sidecar again."""
        assert not self.cog.completed(key), "the run ended before the sidecar stopped"
        self.farm.stop_sidecar(PROVIDER)
        wait_for(lambda: self.cog.completed(key), timeout_s=30, what=f"run {key} completed")
        if lose_retries:
            self.cog.stop()
            self.cog.start()
        self.farm.restart_sidecar(PROVIDER)

    def assert_one_run_per_attempt(self, task: sp.Task) -> None:
        runs = self.cog.runs()
        keys = [a.client_request_key for a in task.attempts if a.client_request_key]
        assert keys, describe(task)
        assert all(runs.get(k, 0) <= 1 for k in keys), f"{runs} for {keys}: a second GPU run"
        assert runs.get(keys[0]) == 1, f"{runs}: the first attempt never ran"


@pytest.fixture(scope="module")
def stack(
    tmp_path_factory: pytest.TempPathFactory,
    postgres_server: PostgresServer,
    redis_server_url: str,
) -> Iterator[Stack]:
    workdir = tmp_path_factory.mktemp("cog-e2e")
    cog = CogServer(workdir)
    cog.start()
    options = {
        "backend": "cog",
        "webhook_listen": f"127.0.0.1:{free_port()}",
        "prediction_journal": str(workdir / "cog-webhooks.jsonl"),
        "extra_input": {"seconds_per_output_second": SECONDS_PER_OUTPUT_SECOND},
    }
    try:
        with (
            module_database(postgres_server, "postgresql", workdir) as database_url,
            ProviderFarm(
                workdir / "farm",
                time_scale=TIME_SCALE,
                providers=[PROVIDER],
                base_urls={PROVIDER: cog.url},
                sidecar_options={PROVIDER: options},
            ) as farm,
            RedisDb(redis_server_url) as redis,
        ):
            (workdir / "cp").mkdir()
            cp = ControlPlane(workdir / "cp", farm, database_url=database_url, redis_url=redis.url)
            cp.start()
            try:
                yield Stack(cog, farm, cp)
            finally:
                cp.kill()
    finally:
        cog.stop()


def test_webhook_retried_after_the_restart_recovers_the_task(stack: Stack) -> None:
    """The sidecar is down when the run ends; coglet retries the completion webhook until the
    restarted sidecar journals it: the task SUCCEEDS with its MP4 and the server ran it once."""
    task_id = stack.create(f"cog recovered {time.time_ns()}")
    key = stack.key_of_live_attempt(task_id)
    stack.miss_the_webhook(key, lose_retries=False)
    task = stack.cp.wait_terminal(task_id, timeout_s=60)
    assert task.state == sp.TASK_STATE_SUCCEEDED, describe(task)
    assert task.output.size_bytes > 0, describe(task)
    stack.assert_one_run_per_attempt(task)
    assert stack.cog.runs()[key] == 1


def test_webhook_lost_with_the_model_server_abandons_without_a_second_run(stack: Stack) -> None:
    """The completion webhook dies with a restarted Cog server: the idle server cannot be
    running the prediction, so the sidecar reports the job not found, and once that lasted the
    (scaled) abandon window the attempt is ABANDONED; no PUT repeats the run to find out."""
    task_id = stack.create(f"cog lost {time.time_ns()}")
    key = stack.key_of_live_attempt(task_id)
    stack.miss_the_webhook(key, lose_retries=True)
    task = stack.cp.wait_attempt_state(task_id, [sp.ATTEMPT_STATE_ABANDONED], timeout_s=90)
    abandoned = [a for a in task.attempts if a.state == sp.ATTEMPT_STATE_ABANDONED]
    assert [a.client_request_key for a in abandoned] == [key], describe(task)
    stack.assert_one_run_per_attempt(stack.cp.get_task(task_id))
    assert stack.cog.runs()[key] == 1
