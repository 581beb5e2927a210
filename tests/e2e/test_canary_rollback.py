"""A live canary on a running stack (design 9.13.5, 9.25.4, issue 14's Done-when): a routing policy
published over RoutingService names one provider's candidate as a canary and a shadow policy;
decisions record the shadow pick; that provider's emulator then fails every job, and the
leader's gates see the canary's success fall below its gate and roll it back by themselves:
ListCanaries shows ROLLED_BACK with the reason and the observed figures, and no later task is
routed to the canary.

Two providers (Runway as the incumbent, the self-hosted server as the canary), PostgreSQL and
Redis, every duration scaled by the farm's one factor; every wait polls with a deadline.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from tests.support.stack import ControlPlane, ProviderFarm, RedisDb, wait_for
from tests.support.workload import SUBMIT_ROUTE
from vidroute.common.v1 import generation_pb2 as gen
from vidroute.scheduler.v1 import routing_pb2 as rpb
from vidroute.scheduler.v1 import routing_service_pb2 as rapi
from vidroute.scheduler.v1 import routing_service_pb2_grpc, scheduler_pb2
from vidroute.scheduler.v1 import scheduler_service_pb2 as api

pytestmark = [pytest.mark.timeout(240), pytest.mark.postgres]
TIME_SCALE = 0.02
CANARY_PROVIDER, INCUMBENT_PROVIDER = "self_hosted", "runway"
WEIGHTS = {
    "quality": 0.28,
    "success": 0.22,
    "latency": 0.18,
    "cost": 0.14,
    "capacity": 0.10,
    "region": 0.04,
    "preference": 0.04,
}
SHADOW_WEIGHTS = {**WEIGHTS, "quality": 0.08, "cost": 0.34}
MIN_SAMPLES = 3


def auto_spec(prompt: str) -> gen.GenerationSpec:
    """Text to video that either provider can serve; the router chooses (AUTO)."""
    return gen.GenerationSpec(
        tenant_id="acme",
        prompt=prompt,
        mode=gen.MODE_TEXT_TO_VIDEO,
        output=gen.OutputSpec(width=1280, height=720, duration_ms=4000),
        routing=gen.RoutingPolicy(mode=gen.ROUTING_MODE_AUTO),
    )


@pytest.fixture
def stack(tmp_path: Path, fresh_postgres_url: str, redis_db: RedisDb) -> Iterator[ControlPlane]:
    with ProviderFarm(
        tmp_path / "farm",
        time_scale=TIME_SCALE,
        providers=(INCUMBENT_PROVIDER, CANARY_PROVIDER),
    ) as farm:
        (tmp_path / "cp").mkdir()
        cp = ControlPlane(
            tmp_path / "cp", farm, database_url=fresh_postgres_url, redis_url=redis_db.url
        )
        try:
            cp.start()
            yield cp
        finally:
            cp.kill()


def create(cp: ControlPlane) -> str:
    request = api.CreateTaskRequest(
        spec=auto_spec(f"canary e2e {uuid.uuid4().hex[:8]}"), idempotency_key=uuid.uuid4().hex
    )
    return cp._call(lambda s: s.CreateTask(request, timeout=10)).task.task_id


def decisions(cp: ControlPlane, task_id: str) -> list[Any]:
    request = api.ExplainRouteRequest(task_id=task_id)
    return list(cp._call(lambda s: s.ExplainRoute(request, timeout=10)).decisions)


def attempt_providers(task: scheduler_pb2.Task) -> list[str]:
    return [a.provider for a in task.attempts]


def refuses_a_failing_compile_check(routing: Any, document: dict[str, Any]) -> None:
    """A sample no candidate serves and a canary the catalog lacks are refused; nothing kept."""
    impossible = {
        **document["samples"][0],
        "output": {"width": 1280, "height": 720, "duration_ms": 590_000},
    }
    refused = {**document, "samples": [impossible], "canaries": {"nope/x/y": {}}}
    with pytest.raises(grpc.RpcError) as info:
        routing.PublishRoutingPolicy(
            rapi.PublishRoutingPolicyRequest(document=json.dumps(refused)), timeout=30
        )
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "samples[0]" in str(info.value.details())
    assert 'canaries["nope/x/y"]' in str(info.value.details())
    assert not routing.ListRoutingPolicies(rapi.ListRoutingPoliciesRequest(), timeout=10).policies


def publish(routing: Any, document: dict[str, Any], deadline_s: float = 90.0) -> Any:
    """Publish as a client does: UNAVAILABLE (an adapter's Compile of a sample timed out on a
    loaded machine) is retried with the same document, which is idempotent."""
    request = rapi.PublishRoutingPolicyRequest(document=json.dumps(document), source="e2e")
    until = time.monotonic() + deadline_s
    while True:
        try:
            return routing.PublishRoutingPolicy(request, timeout=30).policy
        except grpc.RpcError as exc:
            if exc.code() != grpc.StatusCode.UNAVAILABLE or time.monotonic() > until:
                raise
            time.sleep(1.0)


def test_failing_canary_is_rolled_back_by_the_leader(stack: ControlPlane) -> None:
    """Published canary and shadow: decisions carry the shadow pick; once the canary's jobs
    fail, the leader rolls it back (ListCanaries: ROLLED_BACK, the failed gate, the figures),
    and later tasks never go to it."""
    cp = stack
    assert cp._channel is not None
    routing = routing_service_pb2_grpc.RoutingServiceStub(cp._channel)

    first = create(cp)
    assert cp.wait_terminal(first).state == scheduler_pb2.TASK_STATE_SUCCEEDED
    scored = [c for d in decisions(cp, first) for c in d.candidates]
    ids = {c.candidate_id for c in scored}
    (canary,) = {c.candidate_id for c in scored if c.eligible} & {
        cid for cid in ids if cid.startswith(f"{CANARY_PROVIDER}/")
    }

    document = {
        "version": "e2e-canary",
        "weights": {"default": WEIGHTS},
        "shadow": {"version": "e2e-cost-heavy", "weights": {"default": SHADOW_WEIGHTS}},
        "canaries": {
            canary: {
                "stages": [50, 100],
                "gates": {"min_samples": MIN_SAMPLES, "min_success_rate": 0.9},
            }
        },
        "samples": [
            {
                "tenant_id": "acme",
                "prompt": "a sample",
                "mode": "TEXT_TO_VIDEO",
                "output": {"width": 1280, "height": 720, "duration_ms": 4000},
            }
        ],
    }
    refuses_a_failing_compile_check(routing, document)

    published = publish(routing, document)
    assert (published.version, published.active) == ("e2e-canary", True)
    state = routing.ListCanaries(rapi.ListCanariesRequest(), timeout=10).canaries[0]
    assert (state.candidate_id, state.status) == (canary, rpb.CANARY_STATUS_ACTIVE)
    assert state.traffic_percent == 50.0

    cp.farm.emulator(CANARY_PROVIDER).add_faults(
        {
            "route": SUBMIT_ROUTE[CANARY_PROVIDER],
            "action": "fail_job",
            "code": "INTERNAL",
            "times": 1000,
        }
    )

    def rolled_back() -> Any:
        create(cp)  # traffic: about half of it is admitted to the canary
        for c in routing.ListCanaries(rapi.ListCanariesRequest(), timeout=10).canaries:
            if c.candidate_id == canary and c.status == rpb.CANARY_STATUS_ROLLED_BACK:
                return c
        return None

    try:
        state = wait_for(rolled_back, timeout_s=120, interval_s=0.5, what="canary rolled back")
    except TimeoutError as exc:
        now = routing.ListCanaries(rapi.ListCanariesRequest(), timeout=10)
        raise AssertionError(f"{exc}\n{now}\n{cp.logs(400)}") from exc
    assert state.traffic_percent == 0.0
    assert state.gates["success_rate"] is False
    last = state.history[-1]
    assert (last.action, last.from_percent, last.to_percent) == ("ROLLBACK", 50.0, 0.0)
    assert "success_rate" in last.reason
    assert last.observed["samples"] >= MIN_SAMPLES
    assert last.observed["success_rate"] < 0.9
    assert [t.action for t in state.history] == ["STARTED", "ROLLBACK"]

    # Decisions after the publish are the new policy's, with its shadow pick recorded.
    shadowed = create(cp)
    cp.wait_terminal(shadowed, timeout_s=60)
    after = decisions(cp, shadowed)
    selected = [d for d in after if d.selected_candidate]
    assert selected[-1].policy_version == "e2e-canary"
    assert selected[-1].shadow_selected_candidate in ids

    # No canary traffic after the rollback: every later task runs on the incumbent only.
    later = [create(cp) for _ in range(6)]
    for task_id in later:
        task = cp.wait_terminal(task_id, timeout_s=60)
        assert task.state == scheduler_pb2.TASK_STATE_SUCCEEDED, task
        assert attempt_providers(task) == [INCUMBENT_PROVIDER]
        for decision in decisions(cp, task_id):
            verdict = next(c for c in decision.candidates if c.candidate_id == canary)
            assert (verdict.eligible, verdict.reject_detail) == (False, "canary rolled back")
