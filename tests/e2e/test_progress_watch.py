"""Provider progress reaches a caller through WatchTask (issue 13, "Progress"), on production
terms: the Runway and self-hosted emulators in time mode, their sidecars from the shipped
configs, `vidroute serve` on PostgreSQL and Redis, every duration on one factor.

A Runway task's RUNNING ``progress`` rises with the emulator's clock; its WatchTask stream
carries a few ``provider.progress`` events with rising fractions, bounded by the throttle, all
before the task ends. A self-hosted task submitted while other clients of the GPU cluster hold
every worker (and one more job waits) sits second in the model server's queue: its stream
carries the queue position, 0 = next, and the position never grows.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from controlplane.domain.progress import ProgressThrottle
from tests.conftest import PostgresServer
from tests.support.module_stack import module_database, started_platform
from tests.support.stack import ControlPlane, ProviderFarm, wait_for
from vidroute.scheduler.v1 import scheduler_pb2 as sp
from vidroute.scheduler.v1 import scheduler_service_pb2 as api

pytestmark = [pytest.mark.e2e, pytest.mark.redis, pytest.mark.postgres, pytest.mark.timeout(120)]

# Runway's 60 s job runs 6 s: several RUNNING polls (10 s, 15 s, 30 s scaled: 1, 1.5, 3 s) fit in
# it even when a loaded machine delays a poll by a second or two (at 0.05 one late poll left a
# single mark in CI).
TIME_SCALE = 0.1
# Other clients' jobs on the 4 GPU workers, in output seconds (the first ends 5.8 s after it
# starts, at this factor): they end one after another, and one more waits ahead of ours.
GPU_WORKERS = 4
FOREIGN_DURATIONS_S = (6, 8, 10, 10, 6)
MAX_MARKS = round(1 / ProgressThrottle().min_step) + 1


@pytest.fixture(scope="module")
def platform(
    postgres_server: PostgresServer,
    redis_server_url: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[ProviderFarm, ControlPlane]]:
    workdir = tmp_path_factory.mktemp("progress-watch")
    with (
        module_database(postgres_server, "postgresql", workdir) as url,
        started_platform(
            workdir,
            url,
            redis_server_url,
            time_scale=TIME_SCALE,
            providers=("runway", "self_hosted"),
        ) as (farm, cp, _),
    ):
        yield farm, cp


def _watch(cp: ControlPlane, task_id: str) -> list[sp.TaskEvent]:
    """The task's whole stream, read live until the server ends it at the terminal state."""
    assert cp.stub is not None
    call = cp.stub.WatchTask(api.WatchTaskRequest(task_id=task_id), timeout=60)
    return [reply.event for reply in call]


def _progress(events: list[sp.TaskEvent]) -> list[sp.TaskEvent]:
    return [e for e in events if _detail(e)["kind"] == "provider.progress"]


def _detail(event: sp.TaskEvent) -> dict[str, Any]:
    return dict(json.loads(event.detail_json))


def test_runway_progress_streams_as_a_few_rising_marks(
    platform: tuple[ProviderFarm, ControlPlane],
) -> None:
    """A Runway task's stream holds 2..21 progress marks with fractions rising by >= 5 points,
    all before its terminal event, each naming the attempt that succeeded."""
    _, cp = platform
    task_id = cp.create_task("runway")
    events = _watch(cp, task_id)
    task = cp.get_task(task_id)
    assert task.state == sp.TASK_STATE_SUCCEEDED, events
    marks = _progress(events)
    fractions = [m.progress.fraction for m in marks]
    assert 2 <= len(marks) <= MAX_MARKS, fractions
    assert all(m.progress.HasField("fraction") for m in marks)
    assert all(0.0 <= f <= 1.0 for f in fractions)
    assert all(b - a >= 0.05 - 1e-9 for a, b in itertools.pairwise(fractions))
    assert {m.attempt_id for m in marks} == {task.adopted_attempt_id}
    assert {m.attempt_state for m in marks} == {sp.ATTEMPT_STATE_RUNNING}
    assert all(m.kind == sp.TASK_EVENT_KIND_PROVIDER_PROGRESS for m in marks)
    ended = next(i for i, e in enumerate(events) if e.task_state == sp.TASK_STATE_SUCCEEDED)
    assert events.index(marks[-1]) < ended


def test_selfhosted_queue_position_travels_to_the_stream(
    platform: tuple[ProviderFarm, ControlPlane],
) -> None:
    """Behind a full GPU cluster and one waiting job, the task's first mark says queue position
    1 (one job ahead), later positions never grow, and the task still succeeds."""
    farm, cp = platform
    gpu = farm.emulator("self_hosted")
    with httpx.Client(base_url=gpu.url, headers={"authorization": "Bearer other-team"}) as http:
        foreign = []
        for n, seconds in enumerate(FOREIGN_DURATIONS_S):
            body = {"model": "wan2.2-t2v", "prompt": f"other team {n}", "duration_s": seconds}
            reply = http.post("/v1/jobs", json=body)
            assert reply.status_code == 202
            foreign.append(reply.json()["id"])

        def cluster_full() -> bool:
            states = [http.get(f"/v1/jobs/{job}").json()["status"] for job in foreign]
            return states.count("running") == GPU_WORKERS

        wait_for(cluster_full, timeout_s=10, what="every GPU worker busy with another client")
    task_id = cp.create_task("self_hosted")
    events = _watch(cp, task_id)
    assert cp.get_task(task_id).state == sp.TASK_STATE_SUCCEEDED, events
    queued = [m for m in _progress(events) if m.progress.HasField("queue_position")]
    positions = [m.progress.queue_position for m in queued]
    assert positions, [_detail(e) for e in events]
    assert positions[0] == 1
    assert positions == sorted(positions, reverse=True)
    assert {m.attempt_state for m in queued} <= {
        sp.ATTEMPT_STATE_ACCEPTED,
        sp.ATTEMPT_STATE_PROVIDER_QUEUED,
    }
