"""The leader's canary gatekeeper on SQLite and PostgreSQL: live attempts since a stage began hold,
advance, promote or roll a published canary back, each step recorded once, and the dispatchers'
`PolicyBook` sees the stage it moved to."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import select, update

from controlplane.domain import scoring
from controlplane.domain.quality import Defect
from controlplane.domain.routing.canary import ROLLED_BACK_STAGE, CanaryStatus
from controlplane.domain.routing.selection import RouterConfig
from controlplane.domain.scoring import CanaryAction
from controlplane.persistence import canaries as canary_store
from controlplane.persistence import quality as quality_store
from controlplane.persistence.database import Database
from controlplane.persistence.models import task_attempts
from controlplane.persistence.quality import NewCheck, Subject
from controlplane.scheduling.canary_gates import CanaryGateConfig, CanaryGatekeeper
from controlplane.scheduling.policy_book import PolicyBook
from controlplane.service.routing_policies import RoutingPolicyService
from tests.support.quality_tasks import task_in
from vidroute_core.spec import GenerationSpec, Mode, OutputSpec

T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
WEIGHTS = {
    "quality": 0.28,
    "success": 0.22,
    "latency": 0.18,
    "cost": 0.14,
    "capacity": 0.10,
    "region": 0.04,
    "preference": 0.04,
}
CANARY, INCUMBENT = "runway/gen4.5/prod-us", "google/veo-3/prod-eu"


class Stack:
    def __init__(self, db: Database) -> None:
        self.db = db
        self.accounts: dict[str, int] = {}
        self.n = 0

    async def setup(self) -> None:
        async with self.db.unit(T0) as u:
            for cid in (CANARY, INCUMBENT):
                provider, _, account = cid.split("/")
                self.accounts[cid] = await u.create_provider_account(
                    provider=provider, account_name=account, region="us", credential_ref="kms://x"
                )

    async def attempts(
        self,
        cid: str,
        at: datetime,
        *,
        ok: int,
        failed: int = 0,
        cost: int = 1000,
        defective: int = 0,
        bucket: str = "",
    ) -> None:
        """`ok` SUCCEEDED and `failed` FAILED attempts of `cid` created at `at`, 30 s long;
        the output probe checked each success (in quality `bucket`), the first `defective`
        found frozen frames."""
        for i in range(ok + failed):
            self.n += 1
            spec = GenerationSpec(
                tenant_id="acme",
                prompt=f"p{self.n}",
                mode=Mode.TEXT_TO_VIDEO,
                output=OutputSpec(width=1280, height=720, duration_ms=4000),
            )
            task = await task_in(
                self.db, spec, f"k{self.n}", at, account=self.accounts[cid], model=cid.split("/")[1]
            )
            async with self.db.unit(at) as u:
                await u.conn.execute(
                    update(task_attempts)
                    .where(task_attempts.c.task_id == task.id)
                    .values(
                        status="SUCCEEDED" if i < ok else "FAILED",
                        updated_at=at + timedelta(seconds=30),
                        actual_cost_micros=cost,
                    )
                )
                if i < ok:
                    (attempt_id,) = (
                        await u.conn.execute(
                            select(task_attempts.c.id).where(task_attempts.c.task_id == task.id)
                        )
                    ).one()
                    provider, model, _ = cid.split("/")
                    subject = Subject(provider, model, "TEXT_TO_VIDEO", bucket)
                    defects = (Defect.FROZEN_FRAMES,) if i < defective else ()
                    check = NewCheck(task.id, attempt_id, 0, subject, defects)
                    await quality_store.record_checks(u.conn, [check], at)


def document(version: str, **gates: object) -> str:
    canary = {"stages": [1, 5], "gates": {"min_samples": 3, **gates}}
    return json.dumps(
        {"version": version, "weights": {"default": WEIGHTS}, "canaries": {CANARY: canary}}
    )


def keeper(db: Database, at: datetime) -> CanaryGatekeeper:
    return CanaryGatekeeper(db, is_leader=lambda: True, clock=lambda: at)


async def state(db: Database) -> canary_store.CanaryRow:
    async with db.reading() as conn:
        (row,) = await canary_store.canaries(conn)
    return row


async def history(db: Database) -> list[tuple[str, float, float]]:
    async with db.reading() as conn:
        return [
            (t.action, t.from_percent, t.to_percent) for t in await canary_store.transitions(conn)
        ]


async def test_a_healthy_canary_holds_then_advances_then_is_promoted(db: Database) -> None:
    """Below min_samples it holds (gates noted); with enough good attempts it advances a stage,
    counting only attempts since that stage began, then it is promoted after the last stage."""
    s = Stack(db)
    await s.setup()
    await RoutingPolicyService(db, clock=lambda: T0).publish(document("v1"))
    book = PolicyBook(db, RouterConfig(policy=scoring.example_policy("builtin")))
    await s.attempts(CANARY, T0 + timedelta(seconds=1), ok=2)
    ((_, verdict),) = await keeper(db, T0 + timedelta(seconds=5)).evaluate_once()
    assert verdict.action is CanaryAction.HOLD
    assert (await state(db)).gates["success_rate"] is True
    await s.attempts(CANARY, T0 + timedelta(seconds=6), ok=1)
    ((_, verdict),) = await keeper(db, T0 + timedelta(seconds=10)).evaluate_once()
    assert verdict.action is CanaryAction.ADVANCE
    row = await state(db)
    assert (row.stage, row.status, row.stage_started_at) == (
        1,
        CanaryStatus.ACTIVE,
        T0 + timedelta(seconds=10),
    )
    assert dict((await book.refresh())[1]) == {CANARY: 1}
    ((_, verdict),) = await keeper(db, T0 + timedelta(seconds=11)).evaluate_once()
    assert verdict.action is CanaryAction.HOLD  # the first stage's attempts no longer count
    await s.attempts(CANARY, T0 + timedelta(seconds=12), ok=3)
    ((_, verdict),) = await keeper(db, T0 + timedelta(seconds=20)).evaluate_once()
    assert verdict.action is CanaryAction.PROMOTE
    assert (await state(db)).status is CanaryStatus.PROMOTED
    assert await keeper(db, T0 + timedelta(seconds=21)).evaluate_once() == []
    assert dict((await book.refresh())[1]) == {}
    assert await history(db) == [
        ("STARTED", 0.0, 1.0),
        ("ADVANCE", 1.0, 5.0),
        ("PROMOTE", 5.0, 100.0),
    ]


async def test_a_canary_worse_than_the_incumbent_is_rolled_back(db: Database) -> None:
    """Every absolute gate passes, but its cost per success is 10x the incumbent's (limit
    1.5x): rolled back, the gate and both sides' figures recorded, -1 in the round view."""
    s = Stack(db)
    await s.setup()
    await RoutingPolicyService(db, clock=lambda: T0).publish(document("v1"))
    at = T0 + timedelta(seconds=1)
    await s.attempts(CANARY, at, ok=3, cost=1000)
    await s.attempts(INCUMBENT, at, ok=4, cost=100)
    await s.attempts(INCUMBENT, T0 - timedelta(seconds=1), ok=0, failed=5)  # before the stage
    ((_, verdict),) = await keeper(db, T0 + timedelta(seconds=5)).evaluate_once()
    assert verdict.action is CanaryAction.ROLLBACK
    assert verdict.reason == "gate failed: cost_per_success_vs_incumbent"
    assert verdict.observed["incumbent_samples"] == 4
    assert verdict.observed["incumbent_cost_per_success_micros"] == 100
    assert verdict.observed["cost_per_success_micros"] == 1000
    assert (await state(db)).status is CanaryStatus.ROLLED_BACK
    book = PolicyBook(db, RouterConfig(policy=scoring.example_policy("builtin")))
    assert dict((await book.refresh())[1]) == {CANARY: ROLLED_BACK_STAGE}
    assert await history(db) == [("STARTED", 0.0, 1.0), ("ROLLBACK", 1.0, 0.0)]


async def test_a_failing_canary_is_rolled_back_once(db: Database) -> None:
    """Success below its gate rolls it back; two evaluations of the same state (two replicas
    that both believed they led) record one rollback."""
    s = Stack(db)
    await s.setup()
    await RoutingPolicyService(db, clock=lambda: T0).publish(document("v1", min_success_rate=0.9))
    await s.attempts(CANARY, T0 + timedelta(seconds=1), ok=1, failed=2)
    first, second = keeper(db, T0 + timedelta(seconds=5)), keeper(db, T0 + timedelta(seconds=5))
    async with db.reading() as conn:
        row = (await canary_store.canaries(conn))[0]
    ((_, verdict),) = await first.evaluate_once()
    assert verdict.action is CanaryAction.ROLLBACK
    assert "success_rate" in verdict.reason
    async with db.unit(T0) as u:  # the second replica applies the same step on the stale row
        moved = await canary_store.move_canary(
            u.conn, row, stage=0, status=CanaryStatus.ROLLED_BACK, gates={}, now=T0
        )
    assert not moved
    assert await second.evaluate_once() == []
    assert [a for a, _, _ in await history(db)] == ["STARTED", "ROLLBACK"]


async def test_a_hold_judged_on_a_stale_row_leaves_the_moved_canarys_gates(db: Database) -> None:
    """A replica that judged HOLD on the row it read does not overwrite the gates another
    replica's rollback wrote meanwhile: the HOLD is kept only while the canary is still ACTIVE
    at the stage it judged."""
    s = Stack(db)
    await s.setup()
    await RoutingPolicyService(db, clock=lambda: T0).publish(document("v1", min_success_rate=0.9))
    await s.attempts(CANARY, T0 + timedelta(seconds=1), ok=1, failed=2)
    stale = await state(db)
    ((_, verdict),) = await keeper(db, T0 + timedelta(seconds=5)).evaluate_once()
    assert verdict.action is CanaryAction.ROLLBACK
    rolled_back = await state(db)
    async with db.unit(T0 + timedelta(seconds=6)) as u:
        kept = await u.note_canary_gates(stale, {"min_samples": False})
    assert not kept
    after = await state(db)
    assert after.status is CanaryStatus.ROLLED_BACK
    assert after.gates == rolled_back.gates


async def test_the_p95_gate_is_scaled_with_the_deployment(db: Database) -> None:
    """A 100 s p95 gate (production seconds) is 10 s at scale 0.1, where every duration is a
    tenth of production's: 30 s attempts fail it (at scale 1 they pass: the first test)."""
    s = Stack(db)
    await s.setup()
    await RoutingPolicyService(db, clock=lambda: T0).publish(document("v1", max_p95_latency_s=100))
    await s.attempts(CANARY, T0 + timedelta(seconds=1), ok=3)
    at = T0 + timedelta(seconds=5)
    scaled = CanaryGatekeeper(
        db, is_leader=lambda: True, config=CanaryGateConfig(time_scale=0.1), clock=lambda: at
    )
    ((_, verdict),) = await scaled.evaluate_once()
    assert verdict.action is CanaryAction.ROLLBACK
    assert verdict.reason == "gate failed: p95_latency"
    assert verdict.observed["p95_latency_s"] == 30.0


async def test_outputs_the_probe_finds_defective_fail_the_quality_gate(db: Database) -> None:
    """The canary succeeds, but 2 of its 3 outputs since the stage began have frozen frames:
    quality pass rate 1/3 under the 0.9 gate rolls it back; a clean run advances."""
    s = Stack(db)
    await s.setup()
    await RoutingPolicyService(db, clock=lambda: T0).publish(document("v1"))
    await s.attempts(CANARY, T0 - timedelta(seconds=5), ok=3, defective=3)  # before the stage
    await s.attempts(CANARY, T0 + timedelta(seconds=1), ok=3, defective=2)
    ((_, verdict),) = await keeper(db, T0 + timedelta(seconds=5)).evaluate_once()
    assert verdict.action is CanaryAction.ROLLBACK
    assert verdict.reason == "gate failed: quality_pass_rate"
    assert verdict.observed["quality_pass_rate"] == round(1 / 3, 6)
    restart = T0 + timedelta(seconds=5)
    await RoutingPolicyService(db, clock=lambda: restart).publish(document("v2", min_samples=4))
    await s.attempts(CANARY, T0 + timedelta(seconds=6), ok=4)
    ((_, verdict),) = await keeper(db, T0 + timedelta(seconds=10)).evaluate_once()
    assert verdict.action is CanaryAction.ADVANCE  # the restarted canary: 4 clean outputs
    assert verdict.gates["quality_pass_rate"] is True


async def test_the_quality_gate_reads_the_routing_buckets(db: Database) -> None:
    """27 of the canary's 30 outputs are clean (0.9, the gate), but its 10 anime outputs hold
    all 3 defects: the anime bucket's 0.7 rolls it back; with fewer anime checks than the
    bucket minimum the overall share alone decides and it advances."""
    plain = "audio=false,duration=short,refs=0,resolution=720p"
    anime = plain + ",style=anime"
    s = Stack(db)
    await s.setup()
    await RoutingPolicyService(db, clock=lambda: T0).publish(document("v1", min_samples=30))
    await s.attempts(CANARY, T0 + timedelta(seconds=1), ok=20, bucket=plain)
    await s.attempts(CANARY, T0 + timedelta(seconds=1), ok=10, defective=3, bucket=anime)
    at = T0 + timedelta(seconds=5)
    lenient = CanaryGatekeeper(
        db,
        is_leader=lambda: True,
        config=CanaryGateConfig(quality_bucket_min_checks=11),
        clock=lambda: at,
    )
    ((_, verdict),) = await lenient.evaluate_once()
    assert verdict.action is CanaryAction.ADVANCE, verdict
    assert verdict.observed["quality_pass_rate"] == 0.9
    await RoutingPolicyService(db, clock=lambda: at).publish(document("v2", min_samples=30))
    await s.attempts(CANARY, at + timedelta(seconds=1), ok=20, bucket=plain)
    await s.attempts(CANARY, at + timedelta(seconds=1), ok=10, defective=3, bucket=anime)
    ((_, verdict),) = await keeper(db, at + timedelta(seconds=5)).evaluate_once()
    assert verdict.action is CanaryAction.ROLLBACK
    assert verdict.reason == "gate failed: quality_pass_rate"
    assert verdict.observed["quality_pass_rate"] == 0.7


async def test_the_incumbents_traffic_never_crowds_the_canarys_attempts_out(
    db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With a read limit of four attempts and six newer ones of the incumbent, the canary's
    three earlier successes are still its window: it advances (a 0.5 % canary on a busy
    platform would otherwise hold for ever below ``min_samples``)."""
    monkeypatch.setattr(canary_store, "MAX_WINDOW_ATTEMPTS", 4)
    s = Stack(db)
    await s.setup()
    await RoutingPolicyService(db, clock=lambda: T0).publish(document("v1"))
    await s.attempts(CANARY, T0 + timedelta(seconds=1), ok=3)
    await s.attempts(INCUMBENT, T0 + timedelta(seconds=2), ok=6)
    ((_, verdict),) = await keeper(db, T0 + timedelta(seconds=5)).evaluate_once()
    assert verdict.action is CanaryAction.ADVANCE, verdict
    assert verdict.observed["samples"] == 3
    assert verdict.observed["incumbent_samples"] == 4
    assert verdict.observed["quality_pass_rate"] == 1.0
