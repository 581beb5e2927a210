"""The execution engine suite's harness: a migrated database (SQLite or PostgreSQL), a fake
adapter, a movable clock, a memory lease store, and `Harness` helpers that play the scheduler.
"""

from __future__ import annotations

import asyncio
import random
import shutil
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest_asyncio

from controlplane.adapters.fake import FakeAdapterClient
from controlplane.adapters.grpc_client import AdapterClient
from controlplane.domain.money import BillingMode, BillingPolicy, Reservation
from controlplane.domain.requeue import ExcludedCandidate
from controlplane.domain.states import TaskState
from controlplane.execution.config import ExecutionConfig
from controlplane.execution.engine import ExecutionEngine
from controlplane.execution.outcomes import UsageDeclared
from controlplane.execution.output_fetch import FetchRequest, FetchResult
from controlplane.leases.base import Dimension, LeaseRequest, LeaseStore
from controlplane.leases.memory_store import MemoryLeaseStore
from controlplane.persistence import exclusions
from controlplane.persistence.database import Database
from controlplane.persistence.exclusions import RequeueRow
from controlplane.persistence.execution import ExecutionQueries
from controlplane.persistence.migrate import upgrade
from controlplane.persistence.records import (
    AttemptRecord,
    NewAttempt,
    NewRouteDecision,
    OutboxRecord,
    TaskDetail,
)
from controlplane.persistence.tasks import TaskQueries
from tests.support.outputs import stored_mp4
from vidroute_core.spec import GenerationSpec, Mode, OutputSpec, RoutingMode, RoutingPolicy

START = datetime(2026, 6, 24, 10, 0, 0, tzinfo=UTC)
ACCOUNT = "prod"
CAPACITY = 10


class FakeClock:
    """A clock tests move by hand."""

    def __init__(self, now: datetime = START) -> None:
        self.now = now

    def __call__(self) -> datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)

    def ms(self) -> int:
        return int(self.now.timestamp() * 1000)


@dataclass
class FakeFetch:
    """A scriptable `FetchFn`: scripted answers in order, then "stored"."""

    results: list[FetchResult] = field(default_factory=list)
    calls: list[FetchRequest] = field(default_factory=list)

    async def __call__(self, request: FetchRequest) -> FetchResult:
        self.calls.append(request)
        if self.results:
            return self.results.pop(0)
        return stored_mp4(request.storage_key)


@dataclass
class Harness:
    """Plays the scheduler and builds engines over one database."""

    db: Database
    fake: FakeAdapterClient
    clock: FakeClock
    leases: LeaseStore
    fetch: FakeFetch
    config: ExecutionConfig
    engines: list[ExecutionEngine] = field(default_factory=list)
    _n: int = 0

    @property
    def reads(self) -> ExecutionQueries:
        return ExecutionQueries(self.db)

    @property
    def tasks(self) -> TaskQueries:
        return TaskQueries(self.db)

    def engine(
        self,
        adapters: Mapping[str, AdapterClient] | None = None,
        *,
        usage_declared: UsageDeclared | None = None,
        **overrides: Any,
    ) -> ExecutionEngine:
        """An engine over the fake adapter (or real `adapters`), with config `overrides`."""
        config = ExecutionConfig(**{**_config_fields(self.config), **overrides})
        engine = ExecutionEngine(
            self.db,
            adapters or {"runway": self.fake, "self_hosted": self.fake},
            config=config,
            leases=self.leases,
            fetch=self.fetch,
            clock=self.clock,
            sleep=_yield,
            rng=random.Random(7),
            usage_declared=usage_declared,
        )
        self.engines.append(engine)
        return engine

    async def account(self, provider: str = "runway") -> int:
        self._n += 1
        async with self.db.unit(self.clock()) as u:
            return await u.create_provider_account(
                provider=provider,
                account_name=f"{ACCOUNT}-{self._n}",
                region="us",
                credential_ref="kms://x",
            )

    async def task_with_attempt(
        self,
        *,
        mode: RoutingMode = RoutingMode.AUTO,
        provider: str = "runway",
        account_id: int | None = None,
        deadline_at: datetime | None = None,
        compile_plan: dict[str, Any] | None = None,
    ) -> AttemptRecord:
        """A task the 'scheduler' turned into a READY_TO_SUBMIT attempt holding a lease
        (`compile_plan`: a real adapter's plan instead of the fake one)."""
        self._n += 1
        account_id = account_id or await self.account(provider)
        spec = GenerationSpec(
            tenant_id="tenant-a",
            prompt="a red fox",
            mode=Mode.TEXT_TO_VIDEO,
            output=OutputSpec(width=1280, height=720, duration_ms=4000),
            routing=RoutingPolicy(
                mode=mode, required_model="gen4.5" if mode is RoutingMode.STRICT_MODEL else ""
            ),
        )
        async with self.db.unit(self.clock()) as u:
            task, _ = await u.create_task(
                spec,
                idempotency_key=f"k-{self._n}",
                spec_hash=f"h-{self._n}",
                deadline_at=deadline_at,
            )
            assert await u.move_task_at(task.id, 0, TaskState.SCHEDULING)
        return await self.new_attempt(
            task.id, account_id, provider=provider, compile_plan=compile_plan
        )

    async def reserved_attempts(self, tenant: str, count: int) -> list[AttemptRecord]:
        """`count` tasks of `tenant`, each reserving 300,000 micros (postpaid), moved to
        SCHEDULING and given an attempt on one new account (`account_id` of the attempts)."""
        account_id = await self.account()
        attempts = []
        for i in range(count):
            spec = GenerationSpec(
                tenant_id=tenant,
                prompt="a red fox",
                mode=Mode.TEXT_TO_VIDEO,
                output=OutputSpec(width=1280, height=720, duration_ms=4000),
            )
            async with self.db.unit(self.clock()) as u:
                task, _ = await u.create_task(
                    spec,
                    idempotency_key=f"{tenant}-{i}",
                    spec_hash=f"spec-{i}",
                    reservation=Reservation(
                        300_000, "USD", BillingPolicy(BillingMode.POSTPAID, None)
                    ),
                )
                assert await u.move_task_at(task.id, 0, TaskState.SCHEDULING)
            attempts.append(await self.new_attempt(task.id, account_id))
        return attempts

    async def new_attempt(
        self,
        task_id: int,
        account_id: int,
        *,
        provider: str = "runway",
        model: str = "gen4.5",
        compile_plan: dict[str, Any] | None = None,
    ) -> AttemptRecord:
        """Create the next attempt of a SCHEDULING task, as the scheduler would."""
        self._n += 1
        key = f"crk-{task_id}-{self._n}"
        lease = await self.leases.acquire(
            LeaseRequest(
                key,
                f"{provider}-{account_id}",
                (Dimension("all", CAPACITY),),
                ttl_ms=3_600_000,
                max_term_ms=7_200_000,
            )
        )
        assert lease is not None
        detail = await self.detail(task_id)
        async with self.db.unit(self.clock()) as u:
            attempt, _ = await u.create_attempt(
                task_id,
                detail.task.status_version,
                NewAttempt(
                    provider_account_id=account_id,
                    provider_model=model,
                    provider_model_version="v1",
                    capability_version="cap-1",
                    price_version="p-1",
                    routing_policy_version="r-1",
                    client_request_key=key,
                    normalized_spec_hash="spec",
                    compile_plan=compile_plan
                    or {
                        "provider": provider,
                        "account": ACCOUNT,
                        "model": model,
                        "request_hash": "sha256:abc",
                        "estimated_cost": {"amount_micros": "250000", "currency_code": "USD"},
                        "submittable": True,
                    },
                    estimated_cost_micros=250_000,
                    currency="USD",
                    request_hash="sha256:abc",
                    lease_token=lease.token,
                    fencing_token=lease.fencing_token,
                ),
                NewRouteDecision(policy_version="r-1", reason_code="BEST", candidate_snapshot={}),
            )
        return attempt

    async def detail(self, task_id: int) -> TaskDetail:
        detail = await self.tasks.get_task(task_id)
        assert detail is not None
        return detail

    async def attempt(self, attempt_id: int) -> AttemptRecord:
        attempt = await self.tasks.get_attempt(attempt_id)
        assert attempt is not None
        return attempt

    async def messages(self, topic: str) -> list[OutboxRecord]:
        """Claim every message of `topic` far in the future (inspection only; leaves them
        claimed).
        """
        async with self.db.unit(self.clock() + timedelta(days=30)) as u:
            return await u.claim_messages(topic, "inspector", limit=100, lease_seconds=1)

    async def requeues(self, task_id: int) -> list[RequeueRow]:
        """The task's stored requeues, oldest first."""
        async with self.db.reading() as conn:
            return await exclusions.requeues_of(conn, task_id)

    async def excluded(self, task_id: int) -> list[ExcludedCandidate]:
        """The task's excluded candidates (its merged failover history)."""
        async with self.db.reading() as conn:
            return await exclusions.exclusions_of(conn, task_id)

    async def used(self, account_id: int, provider: str = "runway") -> tuple[int, int]:
        account = f"{provider}-{account_id}"
        return await self.leases.used(account, "all"), await self.leases.unknown_used(account)


def _config_fields(config: ExecutionConfig) -> dict[str, Any]:
    return {name: getattr(config, name) for name in ExecutionConfig.__dataclass_fields__}


async def _yield(_seconds: float) -> None:
    await asyncio.sleep(0.01)


async def wait_for(
    condition: Callable[[], Awaitable[bool]], *, timeout_s: float = 20.0, what: str = "condition"
) -> None:
    """Poll `condition` until true, failing after `timeout_s` (no fixed sleeps)."""
    deadline = time.monotonic() + timeout_s
    while not await condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


@asynccontextmanager
async def _harness(db_url: str) -> AsyncIterator[Harness]:
    await upgrade(db_url)
    db = Database.from_url(db_url)
    clock = FakeClock()
    harness = Harness(
        db=db,
        fake=FakeAdapterClient(account=ACCOUNT),
        clock=clock,
        leases=MemoryLeaseStore(clock=clock.ms),
        fetch=FakeFetch(),
        config=ExecutionConfig(worker_id="w1", submitting_grace_s=60.0),
    )
    try:
        yield harness
    finally:
        for exec_engine in harness.engines:
            await exec_engine.stop()
        await db.dispose()


@pytest_asyncio.fixture
async def harness(database_url: str) -> AsyncIterator[Harness]:
    """A migrated database (SQLite and PostgreSQL: `database_url` of
    tests/integration/conftest.py) with a fake adapter on a fake clock."""
    async with _harness(database_url) as h:
        yield h


@pytest_asyncio.fixture
async def lite(tmp_path: Path, migrated_sqlite_template: Path) -> AsyncIterator[Harness]:
    """The same harness on SQLite only (scenarios whose SQL is already covered on both), on a
    copy of the session's migrated SQLite file rather than every migration per test."""
    target = tmp_path / "exec.db"
    shutil.copyfile(migrated_sqlite_template, target)
    async with _harness(f"sqlite+aiosqlite:///{target}") as h:
        yield h
