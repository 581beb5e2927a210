"""Route replay over a recorded workload (issue 14's third Done-when): a control plane on
PostgreSQL and Redis runs AUTO-routed tasks while the self-hosted emulator fails some submits
and jobs (failover decisions, health windows with failures); then ReplayRoutes with the policy
that made the decisions reproduces every one of them (0 changes, equal totals), and with a
policy that prefers Google reports exactly the changes and cost deltas a hand calculation over
the stored snapshots gives. The CLI prints the same report and refuses a bad policy file."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf import json_format
from sqlalchemy import select
from sqlalchemy.ext.asyncio import create_async_engine

from controlplane.domain.routing.policy_document import parse_policy_document
from controlplane.domain.routing.replay import Recorded, replay_one
from controlplane.domain.scoring import example_policy
from controlplane.persistence.models import route_decisions as D
from tests.support.stack import ControlPlane, ProviderFarm, RedisDb, describe
from vidroute.common.v1 import generation_pb2 as gen
from vidroute.scheduler.v1 import routing_service_pb2 as rs
from vidroute.scheduler.v1 import routing_service_pb2_grpc
from vidroute.scheduler.v1 import scheduler_pb2 as sp
from vidroute.scheduler.v1 import scheduler_service_pb2 as api

# A hang guard, not a speed target: the run took over 110 s beside a loaded suite, past the
# suite's 120 s default.
pytestmark = [pytest.mark.e2e, pytest.mark.postgres, pytest.mark.redis, pytest.mark.timeout(300)]

TASKS = 6
SUBMIT = "POST /v1/jobs"
REPO = Path(__file__).resolve().parents[2]
PREFERS_GOOGLE = """\
version: replay-prefers-google
weights:
  default: {quality: 0, success: 0, latency: 0, cost: 0.1, capacity: 0, region: 0,
            preference: 0.9}
hysteresis_delta: 0
min_dwell_s: 0
"""


def _recorded_policy_document(time_scale: float) -> str:
    """The policy the control plane runs (bootstrap: example_policy("router-v1"), its dwell on
    the run's time scale), written as a policy file."""
    policy = example_policy("router-v1")
    return json.dumps(
        {
            "version": policy.version,
            "weights": {
                name: {
                    "quality": w.quality,
                    "success": w.success,
                    "latency": w.latency,
                    "cost": w.cost,
                    "capacity": w.capacity,
                    "region": w.region,
                    "preference": w.preference,
                }
                for name, w in policy.weights.items()
            },
            "hysteresis_delta": policy.hysteresis_delta,
            "min_dwell_s": policy.min_dwell_s * time_scale,
        }
    )


def _create(cp: ControlPlane, i: int) -> str:
    spec = gen.GenerationSpec(
        tenant_id="acme",
        prompt=f"replay kite #{i}",
        mode=gen.MODE_TEXT_TO_VIDEO,
        output=gen.OutputSpec(width=1280, height=720, duration_ms=4000),
        routing=gen.RoutingPolicy(mode=gen.ROUTING_MODE_AUTO, preferred_providers=["google"]),
    )
    request = api.CreateTaskRequest(spec=spec, idempotency_key=uuid.uuid4().hex)
    assert cp.stub is not None
    return str(cp.stub.CreateTask(request, timeout=10).task.task_id)


async def _snapshots(url: str) -> list[tuple[int, int, dict[str, Any]]]:
    engine = create_async_engine(url)
    try:
        async with engine.connect() as conn:
            rows = await conn.execute(
                select(D.c.task_id, D.c.decision_no, D.c.candidate_snapshot).order_by(D.c.id)
            )
            return [(r.task_id, r.decision_no, dict(r.candidate_snapshot)) for r in rows]
    finally:
        await engine.dispose()


def _by_hand(snap: dict[str, Any]) -> str | None:
    """The pick of PREFERS_GOOGLE: preference outweighs any cost difference (0.9 vs at most
    0.1), and cost alone orders candidates of equal preference; so the cheapest Google
    candidate the decision scored and that did not refuse a lease, else the cheapest other."""
    refused = set(snap.get("lease_refused", ()))
    pool = [c for c in snap["candidates"] if "raw_components" in c and c["id"] not in refused]
    if not pool:
        selected: str | None = snap["selected"]
        return selected
    google = [c for c in pool if c["provider"] == "google"]
    return str(min(google or pool, key=lambda c: c["estimated_cost_micros"])["id"])


def _cost(snap: dict[str, Any], cid: str | None) -> int:
    if cid is None:
        return 0
    return int(next(c for c in snap["candidates"] if c["id"] == cid)["estimated_cost_micros"])


def _check_cli(cp: ControlPlane, tmp_path: Path, report: Any) -> None:
    """`vidroute replay --json` prints `report`; a bad policy file is one line per violation,
    exit 2."""
    env = {**os.environ, "VIDROUTE_TOKEN": cp.token}
    env.pop("VIDROUTE_CONFIG", None)
    assert cp.proc is not None
    policy_file = tmp_path / "prefers-google.yaml"
    policy_file.write_text(PREFERS_GOOGLE)
    cli = [sys.executable, "-m", "clients.cli", "replay", "--target", cp.proc.address]
    done = subprocess.run(
        [*cli, "--policy", str(policy_file), "--json"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    printed = json.loads(done.stdout)
    assert printed == json_format.MessageToDict(report, preserving_proto_field_name=True)

    policy_file.write_text(PREFERS_GOOGLE.replace("cost: 0.1", "cost: 1.5"))
    bad = subprocess.run(
        [*cli, "--policy", str(policy_file)],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert bad.returncode == 2, bad.stderr
    lines = bad.stderr.strip().splitlines()
    assert lines
    assert all(line.startswith("error: policy_document.weights.default") for line in lines)


def test_replay_reproduces_a_faulty_run_and_prices_a_changed_policy(
    tmp_path: Path,
    farm: ProviderFarm,
    redis_db: RedisDb,
    fresh_postgres_url: str,
    make_control_plane: Any,
) -> None:
    """The recorded policy replays the recorded decisions with 0 differences; a policy that
    prefers Google changes exactly the decisions, and by exactly the cost deltas, that a hand
    calculation over the stored snapshots names; the CLI reports the same."""
    cp: ControlPlane = make_control_plane(farm, fresh_postgres_url, redis_db.url)
    cp.start()
    selfhosted = farm.emulator("self_hosted")
    selfhosted.add_faults(
        [
            # More 503s than the same-candidate retries allow: those tasks fail over.
            {"action": "status", "route": SUBMIT, "code": 503, "retry_after": 1, "times": 8},
        ]
    )
    ids = [_create(cp, i) for i in range(TASKS)]
    finals = [cp.wait_terminal(t, timeout_s=120) for t in ids]
    assert all(t.state == sp.TASK_STATE_SUCCEEDED for t in finals), [describe(t) for t in finals]
    rows = asyncio.run(_snapshots(fresh_postgres_url))
    assert len(rows) > TASKS, "the faults made failover decisions"
    assert {s["policy_version"] for _, _, s in rows} == {"router-v1"}

    assert cp._channel is not None
    stub = routing_service_pb2_grpc.RoutingServiceStub(cp._channel)
    same = stub.ReplayRoutes(
        rs.ReplayRoutesRequest(policy_document=_recorded_policy_document(farm.time_scale)),
        timeout=60,
    ).report
    assert (same.decisions, same.changed, list(same.changes)) == (len(rows), 0, [])
    assert same.replayed.estimated_cost_micros == same.recorded.estimated_cost_micros
    assert same.replayed.expected_success == same.recorded.expected_success
    assert dict(same.hard_filter_differences) == {}
    # Exactly: the fall-through order and the selection reason too, decision by decision.
    recorded = parse_policy_document(_recorded_policy_document(farm.time_scale)).policy
    for task, no, snap in rows:
        again = replay_one(Recorded(str(task), no, snap), recorded)
        assert again is not None
        assert (again.selected, list(again.ranked), again.selection_reason) == (
            snap["selected"],
            snap["ranked"],
            snap["selection_reason"],
        ), snap

    other = stub.ReplayRoutes(rs.ReplayRoutesRequest(policy_document=PREFERS_GOOGLE), timeout=60)
    report = other.report
    expected = {
        (
            str(task),
            no,
            s["selected"] or "",
            _by_hand(s) or "",
            _cost(s, _by_hand(s)) - _cost(s, s["selected"]),
        )
        for task, no, s in rows
        if _by_hand(s) != s["selected"]
    }
    assert expected, "the Google-preferring policy changes some decisions of this workload"
    got = {
        (c.task_id, c.decision_no, c.recorded_selected, c.replayed_selected, c.cost_delta_micros)
        for c in report.changes
    }
    assert (report.decisions, report.changed, got) == (len(rows), len(expected), expected)
    assert report.replayed.policy_version == "replay-prefers-google"
    assert report.recorded.estimated_cost_micros == sum(_cost(s, s["selected"]) for *_, s in rows)
    assert report.replayed.estimated_cost_micros == sum(_cost(s, _by_hand(s)) for *_, s in rows)
    assert dict(report.hard_filter_differences) == {}

    _check_cli(cp, tmp_path, report)
    with pytest.raises(grpc.RpcError) as refused:
        stub.ReplayRoutes(rs.ReplayRoutesRequest(policy_document="version: [x"), timeout=10)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
