"""SUCCEEDED tasks for quality tests, built through the unit of work (no provider involved).

A task is created, moved to SCHEDULING, given one attempt on `account_id` running `model`, then
moved OUTPUT_FETCHING (adopting that attempt) and SUCCEEDED, each step a legal transition.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import select

from controlplane.domain.states import TaskState
from controlplane.persistence.database import Database
from controlplane.persistence.models import provider_accounts
from controlplane.persistence.records import NewAttempt, NewRouteDecision, TaskRecord
from vidroute_core.hashing import normalized_spec_hash
from vidroute_core.spec import GenerationSpec


async def account_id(db: Database, provider: str, account: str) -> int:
    async with db.reading() as conn:
        query = select(provider_accounts.c.id).where(
            provider_accounts.c.provider == provider,
            provider_accounts.c.account_name == account,
        )
        return int((await conn.execute(query)).scalar_one())


async def task_in(
    db: Database,
    spec: GenerationSpec,
    key: str,
    now: datetime,
    *,
    account: int,
    model: str,
    state: TaskState = TaskState.SUCCEEDED,
) -> TaskRecord:
    """A task of `spec` whose adopted attempt ran `model` on `account`, left in `state`
    (SUCCEEDED, or SUBMITTING / QUEUED to prove the precondition)."""
    async with db.unit(now) as u:
        task, _ = await u.create_task(
            spec, idempotency_key=key, spec_hash=normalized_spec_hash(spec)
        )
        if state is TaskState.QUEUED:
            return task
        moved = await u.move_task(task, TaskState.SCHEDULING)
        assert moved is not None
        attempt, _ = await u.create_attempt(
            task.id,
            moved.status_version,
            NewAttempt(
                provider_account_id=account,
                provider_model=model,
                provider_model_version="1",
                capability_version="cap-test",
                price_version="price-test",
                routing_policy_version="router-test",
                client_request_key=f"crk-{key}",
                normalized_spec_hash=normalized_spec_hash(spec),
                compile_plan={"model": model},
                estimated_cost_micros=1000,
                currency="USD",
            ),
            NewRouteDecision(
                policy_version="router-test",
                reason_code="SELECTED",
                candidate_snapshot={"selected": model, "candidates": []},
                selected_candidate=model,
            ),
        )
        if state is TaskState.SUBMITTING:
            found = await u.task(task.id)
            assert found is not None
            return found
        current = await u.task(task.id)
        assert current is not None
        fetching = await u.move_task(
            current, TaskState.OUTPUT_FETCHING, adopted_attempt_id=attempt.id
        )
        assert fetching is not None
        done = await u.move_task(
            fetching, TaskState.SUCCEEDED, "output stored", output_asset={"key": "output.mp4"}
        )
        assert done is not None
        return done
