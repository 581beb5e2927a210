"""A clean execution history built through the unit of work, optionally with leases.

`build_history` writes one task per interesting life story (failover then success, running,
unknown submission, cancelled while queued, failed, abandoned) and returns the ids the
violation-injecting tests aim at. With a `MemoryLeaseStore` every attempt takes its lease the way
the dispatcher does (under its client request key, token stored on the row) and gives it back
the way `LeaseKeeper` does: released when the attempt ends, kept when it is ABANDONED.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from controlplane.audit import Invariant, InvariantReport
from controlplane.domain.states import AttemptState, TaskState
from controlplane.leases import Dimension, Lease, LeaseRequest, MemoryLeaseStore
from controlplane.persistence.database import Database
from controlplane.persistence.records import (
    AttemptChanges,
    AttemptRecord,
    Failure,
    NewAttempt,
    NewProviderJob,
    NewRouteDecision,
    TaskRecord,
)
from controlplane.persistence.tasks import TaskQueries
from vidroute_core.spec import GenerationSpec, Mode, OutputSpec

NOW = datetime(2026, 6, 24, 10, 0, 0, tzinfo=UTC)
A = AttemptState
T = TaskState


@dataclass(frozen=True)
class Account:
    id: int
    provider: str
    name: str

    @property
    def lease_account(self) -> str:
        return f"{self.provider}:{self.name}"


@dataclass
class History:
    """Ids of what `build_history` wrote: tasks by story, attempts by (story, attempt_no)."""

    runway: Account
    veo: Account
    tasks: dict[str, int] = field(default_factory=dict)
    attempts: dict[tuple[str, int], int] = field(default_factory=dict)
    leases: dict[int, Lease] = field(default_factory=dict)


class _Writer:
    """Moves tasks and attempts along with the versions the database expects."""

    def __init__(self, db: Database, leases: MemoryLeaseStore | None) -> None:
        self.db = db
        self.tasks = TaskQueries(db)
        self.leases = leases
        self.clock = NOW
        self.counter = 0
        self.leased: dict[int, Lease] = {}

    def now(self) -> datetime:
        self.clock += timedelta(seconds=1)
        return self.clock

    async def task(self, story: str) -> TaskRecord:
        spec = GenerationSpec(
            tenant_id="tenant-a",
            prompt=f"a red fox in snow ({story})",
            mode=Mode.TEXT_TO_VIDEO,
            output=OutputSpec(width=1280, height=720, duration_ms=4000),
            user_id="user-1",
            project_id="project-1",
        )
        async with self.db.unit(self.now()) as u:
            record, _ = await u.create_task(spec, idempotency_key=story, spec_hash=f"hash-{story}")
        return record

    async def move_task(self, task_id: int, target: TaskState, **extra: Any) -> None:
        detail = await self.tasks.get_task(task_id)
        assert detail is not None
        version = detail.task.status_version
        async with self.db.unit(self.now()) as u:
            assert await u.move_task_at(task_id, version, target, **extra)

    async def attempt(self, task_id: int, account: Account, model: str) -> AttemptRecord:
        """SCHEDULING -> SUBMITTING with a new READY_TO_SUBMIT attempt (leased first)."""
        await self.move_task(task_id, T.SCHEDULING)
        detail = await self.tasks.get_task(task_id)
        assert detail is not None
        self.counter += 1
        key = f"{task_id}-{len(detail.attempts) + 1}-{self.counter}"
        lease = None
        if self.leases is not None:
            lease = await self.leases.acquire(
                LeaseRequest(
                    attempt_id=key,
                    account=account.lease_account,
                    dimensions=(Dimension("account", 10), Dimension(f"model:{model}", 5)),
                )
            )
            assert lease is not None
        async with self.db.unit(self.now()) as u:
            record, _ = await u.create_attempt(
                task_id,
                detail.task.status_version,
                NewAttempt(
                    provider_account_id=account.id,
                    provider_model=model,
                    provider_model_version="2026-06-01",
                    capability_version="cap-2026-06-24",
                    price_version="price-2026-06",
                    routing_policy_version="router-v17",
                    client_request_key=key,
                    normalized_spec_hash=f"hash-{task_id}",
                    compile_plan={"model": model, "duration": 4},
                    estimated_cost_micros=250_000,
                    currency="USD",
                    lease_token=lease.token if lease else None,
                    fencing_token=lease.fencing_token if lease else None,
                ),
                NewRouteDecision(
                    policy_version="router-v17",
                    reason_code="BEST_SCORE",
                    candidate_snapshot={
                        "selected": f"{account.provider}/{model}",
                        "candidates": [],
                    },
                    selected_candidate=f"{account.provider}/{model}/{account.name}",
                ),
            )
        if lease is not None:
            self.leased[record.id] = lease
        return record

    async def move_attempt(
        self, attempt_id: int, *targets: AttemptState, cost: int | None = None
    ) -> None:
        for target in targets:
            current = await self.tasks.get_attempt(attempt_id)
            assert current is not None
            changes = AttemptChanges(actual_cost_micros=cost if target is A.SUCCEEDED else None)
            failure = Failure("INTERNAL_PERMANENT", "X") if target is A.FAILED else None
            if failure is not None:
                changes = AttemptChanges(failure=failure)
            async with self.db.unit(self.now()) as u:
                assert await u.move_attempt(current, target, "", changes)
            lease = self.leased.get(attempt_id)
            if self.leases is None or lease is None:
                continue
            if target is A.SUBMIT_UNKNOWN:
                assert await self.leases.mark_unknown(lease, 2)
            elif target in (A.SUCCEEDED, A.FAILED, A.CANCELLED):
                assert await self.leases.release(lease)

    async def cancel_queued(self, task_id: int) -> None:
        async with self.db.unit(self.now()) as u:
            await u.cancel_queued_task(task_id)

    async def job(self, attempt: AttemptRecord, job_id: str) -> None:
        async with self.db.unit(self.now()) as u:
            await u.insert_job(
                NewProviderJob(
                    attempt_id=attempt.id,
                    provider_account_id=attempt.provider_account_id,
                    provider_job_id=job_id,
                    normalized_status=A.ACCEPTED,
                    submitted_at=self.clock,
                )
            )


async def _account(db: Database, provider: str, name: str) -> Account:
    async with db.unit(NOW) as u:
        account_id = await u.create_provider_account(
            provider=provider, account_name=name, region="us", credential_ref=f"kms://{name}"
        )
    return Account(account_id, provider, name)


async def build_history(
    db: Database, leases: MemoryLeaseStore | None = None, *, live: bool = True
) -> History:
    """Write the clean history; `live=False` leaves out the stories that are still running."""
    w = _Writer(db, leases)
    h = History(
        runway=await _account(db, "runway", "prod-us"),
        veo=await _account(db, "veo", "prod-apac"),
    )

    # Failover then success: attempt 1 fails at the provider, attempt 2 succeeds and is adopted.
    t = (await w.task("failover")).id
    first = await w.attempt(t, h.runway, "gen4.5")
    await w.move_attempt(first.id, A.SUBMITTING, A.ACCEPTED)
    await w.job(first, "rw-job-1")
    await w.move_task(t, T.RUNNING)
    await w.move_attempt(first.id, A.RUNNING, A.FAILED)
    second = await w.attempt(t, h.veo, "veo-3.1")
    await w.move_attempt(second.id, A.SUBMITTING, A.ACCEPTED)
    await w.job(second, "veo-op-1")
    await w.move_task(t, T.RUNNING)
    await w.move_attempt(second.id, A.RUNNING, A.SUCCEEDED, cost=240_000)
    await w.move_task(t, T.OUTPUT_FETCHING, adopted_attempt_id=second.id)
    await w.move_task(t, T.SUCCEEDED, output_asset={"uri": "s3://out/failover.mp4"})
    h.tasks["failover"], h.attempts[("failover", 1)], h.attempts[("failover", 2)] = (
        t,
        first.id,
        second.id,
    )

    # Failed before the provider ever saw it: the only attempt has no job.
    t = (await w.task("failed")).id
    attempt = await w.attempt(t, h.runway, "gen4.5")
    await w.move_attempt(attempt.id, A.SUBMITTING, A.FAILED)
    await w.move_task(t, T.FAILED, failure=Failure("INTERNAL_PERMANENT", "X"))
    h.tasks["failed"], h.attempts[("failed", 1)] = t, attempt.id

    # Recovery gave up on an unknown submission: ABANDONED keeps its (unknown) lease.
    t = (await w.task("abandoned")).id
    attempt = await w.attempt(t, h.runway, "gen4.5")
    await w.move_attempt(attempt.id, A.SUBMITTING, A.SUBMIT_UNKNOWN, A.ABANDONED)
    await w.move_task(t, T.FAILED, failure=Failure("SUBMIT_UNKNOWN", "ABANDONED"))
    h.tasks["abandoned"], h.attempts[("abandoned", 1)] = t, attempt.id

    # Cancelled at the provider: CANCEL_REQUESTED, then the provider's CANCELLED.
    t = (await w.task("cancelled")).id
    attempt = await w.attempt(t, h.veo, "veo-3.1")
    await w.move_attempt(attempt.id, A.SUBMITTING, A.ACCEPTED)
    await w.job(attempt, "veo-op-2")
    await w.move_attempt(attempt.id, A.CANCEL_REQUESTED, A.CANCELLED)
    await w.move_task(t, T.CANCELLED)
    h.tasks["cancelled"], h.attempts[("cancelled", 1)] = t, attempt.id

    # Cancelled while still queued: no attempt at all.
    h.tasks["queued-cancel"] = (await w.task("queued-cancel")).id
    await w.cancel_queued(h.tasks["queued-cancel"])

    if live:
        t = (await w.task("running")).id
        attempt = await w.attempt(t, h.runway, "gen4.5")
        await w.move_attempt(attempt.id, A.SUBMITTING, A.ACCEPTED)
        await w.job(attempt, "rw-job-2")
        await w.move_task(t, T.RUNNING)
        await w.move_attempt(attempt.id, A.RUNNING)
        h.tasks["running"], h.attempts[("running", 1)] = t, attempt.id

        t = (await w.task("unknown")).id
        attempt = await w.attempt(t, h.veo, "veo-3.1")
        await w.move_attempt(attempt.id, A.SUBMITTING, A.SUBMIT_UNKNOWN)
        h.tasks["unknown"], h.attempts[("unknown", 1)] = t, attempt.id

        h.tasks["queued"] = (await w.task("queued")).id
    h.leases = dict(w.leased)
    return h


def assert_only(report: InvariantReport, invariant: Invariant) -> None:
    """The report names `invariant` and no other."""
    assert report.fired == {invariant.value}, report.render()
