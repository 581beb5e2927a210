"""Row builders for the persistence suite, going through the unit of work and queries only."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from controlplane.domain.states import TaskState
from controlplane.persistence.database import Database
from controlplane.persistence.records import (
    AttemptRecord,
    NewAttempt,
    NewRouteDecision,
    TaskRecord,
)
from controlplane.persistence.tasks import TaskQueries
from vidroute_core.spec import GenerationSpec, Mode, OutputSpec

NOW = datetime(2026, 6, 24, 10, 0, 0, tzinfo=UTC)


def make_spec(tenant_id: str = "tenant-a", prompt: str = "a red fox in snow") -> GenerationSpec:
    """A small valid spec."""
    return GenerationSpec(
        tenant_id=tenant_id,
        prompt=prompt,
        mode=Mode.TEXT_TO_VIDEO,
        output=OutputSpec(width=1280, height=720, duration_ms=4000),
        user_id="user-1",
        project_id="project-1",
    )


@dataclass
class Scenario:
    """Builds the rows most tests need through the unit of work."""

    db: Database
    _counter: int = 0

    def _next(self) -> int:
        self._counter += 1
        return self._counter

    async def account(self, name: str = "prod") -> int:
        async with self.db.unit(NOW) as u:
            return await u.create_provider_account(
                provider="runway",
                account_name=f"{name}-{self._next()}",
                region="us",
                credential_ref="kms://vidroute/runway/prod",
            )

    async def task(self, tenant_id: str = "tenant-a", key: str | None = None) -> TaskRecord:
        key = key or f"key-{self._next()}"
        async with self.db.unit(NOW) as u:
            record, _ = await u.create_task(
                make_spec(tenant_id), idempotency_key=key, spec_hash=f"hash-{key}"
            )
        return record

    async def scheduling_task(self) -> TaskRecord:
        task = await self.task()
        async with self.db.unit(NOW) as u:
            assert await u.move_task_at(task.id, 0, TaskState.SCHEDULING)
        detail = await TaskQueries(self.db).get_task(task.id)
        assert detail is not None
        return detail.task

    def new_attempt(self, account_id: int, client_request_key: str | None = None) -> NewAttempt:
        return NewAttempt(
            provider_account_id=account_id,
            provider_model="gen4.5",
            provider_model_version="2026-06-01",
            capability_version="cap-2026-06-24",
            price_version="runway-2026-06",
            routing_policy_version="router-v17",
            client_request_key=client_request_key or f"crk-{self._next()}",
            normalized_spec_hash="spec-hash",
            compile_plan={"ratio": "1280:720", "duration": 4},
            estimated_cost_micros=250_000,
            currency="USD",
            lease_token="lease-1",
            fencing_token=7,
        )

    @staticmethod
    def new_decision() -> NewRouteDecision:
        return NewRouteDecision(
            policy_version="router-v17",
            reason_code="BEST_SCORE",
            candidate_snapshot={"selected": "runway/gen4.5/prod-us", "candidates": []},
            selected_candidate="runway/gen4.5/prod-us",
        )

    async def attempt(self, account_id: int | None = None) -> AttemptRecord:
        """A task moved to SUBMITTING with one READY_TO_SUBMIT attempt."""
        account_id = account_id or await self.account()
        task = await self.scheduling_task()
        async with self.db.unit(NOW + timedelta(seconds=1)) as u:
            attempt, _ = await u.create_attempt(
                task.id, task.status_version, self.new_attempt(account_id), self.new_decision()
            )
        return attempt
