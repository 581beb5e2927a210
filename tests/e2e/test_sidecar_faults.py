"""A stalled, crashed or rolling-updated sidecar fails no task (issue 20, item 1): the shipped
configuration, three sidecars and a control plane as separate processes, on PostgreSQL and Redis.

While one sidecar does not answer (SIGSTOP longer than its Compile deadline, or SIGKILL until it
is started again), tasks pinned to it wait QUEUED and AUTO tasks go to the other providers; its
per-provider health service name reads NOT_SERVING; once it is back every task SUCCEEDS. A rolling
restart of all three sidecars under a steady flow of tasks fails none and creates no duplicate
provider job (the emulators' own record of the jobs they created).
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from clients import auth as client_auth
from controlplane.scheduling.reachability import service_name
from tests.conftest import PostgresServer
from tests.support.module_stack import module_database, started_platform
from tests.support.stack import (
    PROVIDERS,
    ControlPlane,
    ProviderFarm,
    describe,
    spec_for,
    wait_for,
)
from vidroute.common.v1 import generation_pb2 as gen
from vidroute.scheduler.v1 import scheduler_pb2 as sp
from vidroute.scheduler.v1 import scheduler_service_pb2 as api

pytestmark = [pytest.mark.e2e, pytest.mark.postgres, pytest.mark.redis, pytest.mark.timeout(300)]

# One factor for the whole module, larger than the default 0.02: the faults here stall or
# restart whole processes, whose own CPU time (start-up, a loaded 2-core machine) does not
# shrink with the factor; at 0.05 production's 10 s Compile deadline is 0.5 s.
TIME_SCALE = 0.05
STALLED = "self_hosted"
SKIPPED = frozenset({"COMPILE_UNAVAILABLE", "CIRCUIT_OPEN"})
# Any attempt state: a task routed to a provider has one.
ATTEMPT_STATES = frozenset(sp.AttemptState.values()) - {sp.ATTEMPT_STATE_UNSPECIFIED}


class Stack:
    """The module's platform and what its tests ask of it."""

    def __init__(self, farm: ProviderFarm, cp: ControlPlane) -> None:
        self.farm, self.cp = farm, cp

    def create(self, *, pinned: str | None) -> str:
        """A task with a prompt of its own (no compile verdict is shared between tasks): pinned
        STRICT to `pinned`'s model, or AUTO when None."""
        prompt = f"fault kite {uuid.uuid4().hex[:12]}"
        spec = spec_for(pinned or STALLED, prompt)
        if pinned is None:
            spec.routing.CopyFrom(gen.RoutingPolicy(mode=gen.ROUTING_MODE_AUTO))
        request = api.CreateTaskRequest(spec=spec, idempotency_key=uuid.uuid4().hex)
        assert self.cp.stub is not None
        return str(self.cp.stub.CreateTask(request, timeout=10).task.task_id)

    def adapter_health(self, provider: str) -> int:
        """The control plane's health status of `provider`'s sidecar."""
        assert self.cp.proc is not None
        channel = client_auth.channel(self.cp.proc.address, self.cp.token)
        try:
            stub = health_pb2_grpc.HealthStub(channel)
            reply = stub.Check(
                health_pb2.HealthCheckRequest(service=service_name(provider)), timeout=5
            )
            return int(reply.status)
        finally:
            channel.close()

    def control_plane_health(self) -> int:
        assert self.cp.proc is not None
        channel = client_auth.channel(self.cp.proc.address, self.cp.token)
        try:
            stub = health_pb2_grpc.HealthStub(channel)
            return int(stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=5).status)
        finally:
            channel.close()

    def wait_adapter(self, provider: str, status: int, timeout_s: float = 60.0) -> None:
        name = health_pb2.HealthCheckResponse.ServingStatus.Name(status)
        wait_for(
            lambda: self.adapter_health(provider) == status,
            timeout_s=timeout_s,
            what=f"{service_name(provider)} {name}",
        )

    def wait_all(self, task_ids: list[str], timeout_s: float = 120.0) -> list[sp.Task]:
        return [self.cp.wait_terminal(t, timeout_s=timeout_s) for t in task_ids]

    def assert_succeeded(self, tasks: list[sp.Task]) -> None:
        failed = [t for t in tasks if t.state != sp.TASK_STATE_SUCCEEDED]
        assert not failed, "\n".join(describe(t) for t in failed)

    def assert_one_job_per_task(self, tasks: list[sp.Task]) -> None:
        """Emulator truth: each task's prompt is in exactly one provider job, across providers."""
        jobs = [str(job) for p in self.farm.providers for job in self.farm.truth(p)]
        for t in tasks:
            assert sum(t.spec.prompt in job for job in jobs) == 1, describe(t)

    def while_away(self, pinned: list[str]) -> list[str]:
        """With the stalled sidecar away: once a decision explained skipping it (a transient
        reason, not a rejection), AUTO tasks are created and each gets its attempt meanwhile;
        the pinned tasks stay QUEUED without one. Returns the AUTO tasks."""
        wait_for(
            lambda: any(_skipped_stalled(self.cp.get_task(t)) for t in pinned),
            timeout_s=60,
            interval_s=0.2,
            what="a decision explaining the stalled sidecar's skip",
        )
        auto = [self.create(pinned=None) for _ in range(3)]
        for task_id in auto:
            self.cp.wait_attempt_state(task_id, ATTEMPT_STATES, timeout_s=60)
        for task_id in pinned:
            task = self.cp.get_task(task_id)
            assert task.state == sp.TASK_STATE_QUEUED, describe(task)
            assert not task.attempts, describe(task)
        return auto

    def settle(self, pinned: list[str], auto: list[str]) -> None:
        """Every task SUCCEEDS with one provider job; pinned ones on the stalled sidecar, the
        AUTO ones (routed while it was away) elsewhere."""
        done = self.wait_all(pinned + auto)
        self.assert_succeeded(done)
        self.assert_one_job_per_task(done)
        by_id = {t.task_id: t for t in done}
        assert all(_providers_of(by_id[t]) == {STALLED} for t in pinned)
        assert all(STALLED not in _providers_of(by_id[t]) for t in auto)

    def quiet(self, timeout_s: float = 120.0) -> None:
        """Until every task created so far is terminal (a fault then hits no running submit)."""

        def settled() -> bool:
            assert self.cp.stub is not None
            listed = self.cp.stub.ListTasks(api.ListTasksRequest(page_size=500), timeout=10)
            return all(
                t.state in (sp.TASK_STATE_SUCCEEDED, sp.TASK_STATE_FAILED, sp.TASK_STATE_CANCELLED)
                for t in listed.tasks
            )

        wait_for(settled, timeout_s=timeout_s, interval_s=0.2, what="no task in flight")


@pytest.fixture(scope="module")
def stack(
    postgres_server: PostgresServer, redis_server_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Stack]:
    workdir: Path = tmp_path_factory.mktemp("sidecar-faults")
    with (
        module_database(postgres_server, "postgresql", workdir) as url,
        started_platform(workdir, url, redis_server_url, time_scale=TIME_SCALE) as (farm, cp, _),
    ):
        yield Stack(farm, cp)


def _providers_of(task: sp.Task) -> set[str]:
    return {a.provider for a in task.attempts}


def _skipped_stalled(task: sp.Task) -> bool:
    """Whether one of the task's decisions skipped the stalled sidecar with a transient reason."""
    return any(
        c.reject_reason in SKIPPED
        for d in task.route_decisions
        for c in d.candidates
        if c.candidate_id.startswith(f"{STALLED}/")
    )


def test_a_stalled_sidecar_fails_no_task(stack: Stack) -> None:
    """SIGSTOP of the self-hosted sidecar, longer than its Compile deadline: pinned tasks wait
    (explained as a transient skip), AUTO tasks go elsewhere, its health is NOT_SERVING while
    the control plane's stays SERVING; after SIGCONT every task SUCCEEDS, one job each."""
    farm = stack.farm
    stack.quiet()
    farm.pause_sidecar(STALLED)
    paused_at = time.monotonic()
    try:
        pinned = [stack.create(pinned=STALLED) for _ in range(3)]
        stack.wait_adapter(STALLED, health_pb2.HealthCheckResponse.NOT_SERVING)
        assert stack.control_plane_health() == health_pb2.HealthCheckResponse.SERVING
        # Longer than the Compile deadline (10 s in production) whatever the probe took.
        wait_for(lambda: time.monotonic() - paused_at > farm.seconds(60), timeout_s=30)
        auto = stack.while_away(pinned)
    finally:
        farm.resume_sidecar(STALLED)
    stack.wait_adapter(STALLED, health_pb2.HealthCheckResponse.SERVING)
    stack.settle(pinned, auto)


def test_a_killed_sidecar_fails_no_task_once_restarted(stack: Stack) -> None:
    """SIGKILL of the self-hosted sidecar: tasks pinned to it wait, AUTO tasks go to the other
    providers, its health is NOT_SERVING; started again on its address, every task SUCCEEDS."""
    farm = stack.farm
    stack.quiet()
    farm.kill_sidecar(STALLED)
    pinned = [stack.create(pinned=STALLED) for _ in range(3)]
    stack.wait_adapter(STALLED, health_pb2.HealthCheckResponse.NOT_SERVING)
    auto = stack.while_away(pinned)
    farm.restart_sidecar(STALLED)
    stack.wait_adapter(STALLED, health_pb2.HealthCheckResponse.SERVING)
    stack.settle(pinned, auto)


def test_a_rolling_restart_fails_no_task(stack: Stack) -> None:
    """Each sidecar in turn stopped (SIGTERM) and started again while AUTO tasks and tasks
    pinned to each provider keep arriving: 0 failed tasks, 0 duplicate provider jobs."""
    farm = stack.farm
    stack.quiet()
    created: list[str] = []
    stop = threading.Event()
    errors: list[BaseException] = []

    def flow() -> None:
        kinds = [None, *PROVIDERS]
        i = 0
        try:
            while not stop.is_set():
                created.append(stack.create(pinned=kinds[i % len(kinds)]))
                i += 1
                stop.wait(farm.seconds(10))
        except BaseException as exc:  # reported by the test thread
            errors.append(exc)

    feeder = threading.Thread(target=flow, name="steady-flow", daemon=True)
    feeder.start()
    try:
        for provider in PROVIDERS:
            farm.stop_sidecar(provider)
            stack.wait_adapter(provider, health_pb2.HealthCheckResponse.NOT_SERVING)
            farm.restart_sidecar(provider)
            stack.wait_adapter(provider, health_pb2.HealthCheckResponse.SERVING)
    finally:
        stop.set()
        feeder.join(timeout=30)
    assert not errors, errors
    assert len(created) >= len(PROVIDERS) * 2
    done = stack.wait_all(created, timeout_s=180)
    stack.assert_succeeded(done)
    stack.assert_one_job_per_task(done)
