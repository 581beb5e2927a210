"""The SDK's RoutingService calls (`clients.sdk.routing`) against the whole control plane (see
conftest): feedback on a task that really succeeded at the Runway emulator shows in quality, a
bad verdict is InvalidArgument naming the field, the admin reads answer, on both clients.
"""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime, timedelta

import pytest

from clients.sdk import SERVICE_CONFIG, AsyncClient, Client, errors
from tests.integration.sdk_client.conftest import Stack
from tests.support.stack import ROOT, spec_for
from vidroute.scheduler.v1 import routing_pb2 as rpb
from vidroute.scheduler.v1 import scheduler_pb2 as pb

pytestmark = [pytest.mark.timeout(180)]
EXAMPLE_POLICY = ROOT / "controlplane" / "routing_policy.example.yaml"


def _accepted(buckets: list[rpb.QualityBucket], model: str) -> tuple[int, int]:
    """Accepted and rejected verdicts in the model's whole-mode buckets (a verdict is counted
    there and in its task's tag bucket)."""
    mine = [b for b in buckets if b.model == model and b.bucket == ""]
    return sum(b.accepted for b in mine), sum(b.rejected for b in mine)


def test_feedback_on_a_succeeded_task_shows_in_quality(stack: Stack) -> None:
    """An ACCEPTED verdict on a SUCCEEDED task is recorded once (the same verdict again is
    recorded=False) and counted in its model's quality buckets, with a score interval."""
    with Client(stack.target, token=stack.token) as client:
        made = client.create(spec_for("runway", prompt=f"a feedback kite {uuid.uuid4().hex[:6]}"))
        task = client.wait(made.task.task_id, timeout=120)
        assert task.state == pb.TASK_STATE_SUCCEEDED, task
        model = task.attempts[-1].model
        before = _accepted(client.quality(model=model), model)

        assert client.feedback(task.task_id, "accepted", tags=["motion"], comment="fine") is True
        assert client.feedback(task.task_id, "FEEDBACK_VERDICT_ACCEPTED") is False

        buckets = client.quality(model=model)
        assert _accepted(buckets, model) == (before[0] + 1, before[1])
        assert {b.model for b in buckets} == {model}  # the model filter is applied
        assert len({b.bucket for b in buckets}) >= 2  # the whole mode and the task's tag bucket
        for b in buckets:
            assert b.provider == "runway"
            assert 0 <= b.score_low <= b.score <= b.score_high <= 1, b
        assert _accepted(client.quality(), model)[0] == before[0] + 1


def test_a_bad_verdict_is_invalid_argument_naming_the_field(stack: Stack) -> None:
    """An unknown verdict name fails before it is sent; an unset verdict and an over-long tag
    come back from the server as InvalidArgument with one field violation each."""
    with Client(stack.target, token=stack.token) as client:
        with pytest.raises(errors.InvalidArgument) as local:
            client.feedback("1", "loved")
        assert [v.field for v in local.value.field_violations] == ["verdict"]
        with pytest.raises(errors.InvalidArgument) as remote:
            client.feedback("1", 0, tags=["x" * 65])
        assert [v.field for v in remote.value.field_violations] == ["verdict", "tags[0]"]
        with pytest.raises(errors.NotFound):
            client.feedback("987654321", "rejected")


def test_admin_reads_and_a_refused_publication(stack: Stack) -> None:
    """canaries and routing_policies answer lists (none configured on this plane); a dry run
    of a document that is not a policy is InvalidArgument and publishes nothing."""
    with Client(stack.target, token=stack.token) as client:
        assert client.canaries() == []
        policies = client.routing_policies()
        with pytest.raises(errors.InvalidArgument) as refused:
            client.publish_routing_policy("just: [a, list", dry_run=True)
        assert refused.value.field_violations
        assert client.routing_policies() == policies


def test_routing_reads_and_feedback_are_retried_publication_is_not() -> None:
    """The channel's service config retries RoutingService's reads and SubmitFeedback on
    UNAVAILABLE, and leaves PublishRoutingPolicy and RollbackRoutingPolicy to be sent once."""
    config = json.loads(json.dumps(SERVICE_CONFIG))
    retried = {
        n["method"]
        for m in config["methodConfig"]
        for n in m["name"]
        if n["service"] == "vidroute.scheduler.v1.RoutingService"
    }
    assert retried == {
        "GetQuality",
        "ListCanaries",
        "ListRoutingPolicies",
        "ReplayRoutes",
        "SubmitFeedback",
    }


async def test_async_client_feedback_quality_and_reads(stack: Stack) -> None:
    """AsyncClient: a REJECTED verdict on a succeeded task counts in quality; a bad verdict is
    InvalidArgument on verdict; canaries answer, a policy given as bytes passes a dry run."""
    async with AsyncClient(stack.target, token=stack.token) as client:
        made = await client.create(
            spec_for("runway", prompt=f"an async feedback kite {uuid.uuid4().hex[:6]}")
        )
        task = await client.wait(made.task.task_id, timeout=120)
        assert task.state == pb.TASK_STATE_SUCCEEDED, task
        model = task.attempts[-1].model
        before = _accepted(await client.quality(model=model), model)

        assert await client.feedback(task.task_id, rpb.FEEDBACK_VERDICT_REJECTED) is True
        assert await client.feedback(task.task_id, "rejected") is False
        assert _accepted(await client.quality(model=model), model) == (before[0], before[1] + 1)

        with pytest.raises(errors.InvalidArgument) as bad:
            await client.feedback(task.task_id, 0)
        assert [v.field for v in bad.value.field_violations] == ["verdict"]
        assert await client.canaries() == []
        published = await client.routing_policies()
        checked = await client.publish_routing_policy(EXAMPLE_POLICY.read_bytes(), dry_run=True)
        assert checked.version == "router-v1-file"
        assert await client.routing_policies() == published


def test_a_policy_dry_run_and_a_replay_of_the_tenants_decisions(stack: Stack) -> None:
    """The example policy file passes a dry run (its version answered, nothing published);
    replay_routes under it, limited to one tenant, replays exactly that tenant's decisions; a
    naive datetime is InvalidArgument on its field before anything is sent."""
    tenant = f"replay{uuid.uuid4().hex[:6]}"
    with Client(stack.target, token=stack.token) as client:
        before = client.routing_policies()
        checked = client.publish_routing_policy(EXAMPLE_POLICY, dry_run=True)
        assert (checked.version, checked.active) == ("router-v1-file", False)
        assert client.routing_policies() == before

        spec = spec_for("runway", prompt="a replayed kite")
        spec.tenant_id = tenant
        task = client.wait(client.create(spec).task.task_id, timeout=120)
        assert task.state == pb.TASK_STATE_SUCCEEDED, task
        report = client.replay_routes(
            EXAMPLE_POLICY, since=datetime.now(UTC) - timedelta(hours=1), tenant_id=tenant
        )
        assert report.decisions == len(client.explain(task.task_id)) >= 1
        assert report.replayed.policy_version == "router-v1-file"
        with pytest.raises(errors.InvalidArgument) as naive:
            client.replay_routes(EXAMPLE_POLICY, until=datetime(2026, 1, 1))
        assert [v.field for v in naive.value.field_violations] == ["until"]
