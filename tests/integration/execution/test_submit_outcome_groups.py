"""Submit outcomes answered side by side are written in groups (issue 22), and that changes no
row.

The same attempts, answered the same by the provider (accepted, rejected for good, uncertain),
are submitted once side by side (their outcomes written in shared units: the attempts held in
one read, the moves, runtime rows, usage entries and acks sent set-based) and once one at a
time: every row they touch (tasks, attempts, task events, outbox, ledger, runtime rows, usage
entries, provider jobs) comes out the same, on PostgreSQL and on SQLite. Each attempt is sent
exactly once either way.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

import pytest
from sqlalchemy import select

from controlplane.domain.states import TaskState
from controlplane.execution.submit_worker import Outcome, SubmitWorker
from controlplane.persistence.models import provider_jobs
from tests.integration.execution.exec_harness import START, Harness
from tests.integration.execution.test_observation_batches import _by_content, _same_rows
from tests.integration.execution.test_output_batches import PlannedFetch, Run, _Names
from vidroute_core.adapter import CompiledPlan, JobRef, SubmitKind, SubmitOutcome, TransportStage
from vidroute_core.errors import ErrorClass, make_error

ANSWERS = ["accepted", "accepted", "rejected", "unknown", "accepted", "accepted"]


class _Midpoint(random.Random):
    """Every jitter draw the same: outcomes written in another order draw alike."""

    def random(self) -> float:
        return 0.5


def _answer(run: Run, account: str) -> Any:
    """The provider's answer to each attempt, by the attempt's position in `run`."""
    position = {a.client_request_key: i for i, a in enumerate(run.attempts)}

    def answer(plan: CompiledPlan, key: str, callback_url: str) -> SubmitOutcome:
        i = position[key]
        kind = ANSWERS[i]
        if kind == "accepted":
            return SubmitOutcome(SubmitKind.ACCEPTED, JobRef(f"job-{run.tenant}-{i}", account))
        if kind == "rejected":
            error = make_error(ErrorClass.INVALID_INPUT, "BAD_PROMPT", "refused")
            return SubmitOutcome(SubmitKind.REJECTED, error=error)
        error = make_error(ErrorClass.SUBMISSION_UNKNOWN, "TIMEOUT", "no answer")
        return SubmitOutcome(
            SubmitKind.UNKNOWN, error=error, transport_stage=TransportStage.AWAIT_RESPONSE
        )

    return answer


async def _ready(harness: Harness, tenant: str) -> Run:
    """Reserved tasks of `tenant`, one per answer, each with an attempt ready to submit."""
    harness.clock.now = START
    attempts = await harness.reserved_attempts(tenant, len(ANSWERS))
    account_id = attempts[0].provider_account_id
    return Run(tenant, account_id, attempts, PlannedFetch())


async def _jobs(harness: Harness, run: Run) -> list[Any]:
    names = _Names(run)
    query = select(provider_jobs).where(
        provider_jobs.c.attempt_id.in_([a.id for a in run.attempts])
    )
    async with harness.db.reading() as conn:
        rows = [names.value("", dict(r)) for r in (await conn.execute(query)).mappings()]
    return sorted(rows, key=repr)


async def test_outcomes_written_in_groups_leave_the_rows_written_one_by_one(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Accepted, rejected and uncertain submits written in shared units leave the same tasks,
    attempts, events, outbox, ledger, runtime rows, usage entries and jobs as written alone."""
    sizes: list[int] = []
    apply_each = SubmitWorker.apply_each

    async def spied(self: SubmitWorker, outcomes: Sequence[Outcome]) -> Any:
        sizes.append(len(outcomes))
        return await apply_each(self, outcomes)

    monkeypatch.setattr(SubmitWorker, "apply_each", spied)
    runs = {}
    for tenant, concurrency in (("tenant-group", 16), ("tenant-alone", 1)):
        run = runs[tenant] = await _ready(harness, tenant)
        harness.fake.script_submit(*[_answer(run, harness.fake.account)] * len(ANSWERS))
        sizes.clear()
        calls = len(harness.fake.submit_calls)
        engine = harness.engine(concurrency=concurrency)
        engine.deps.rng = _Midpoint()
        assert await engine.submitter.run_once() == len(ANSWERS)
        assert len(harness.fake.submit_calls) - calls == len(ANSWERS)  # each sent once
        assert sum(sizes) == len(ANSWERS)
        if concurrency == 1:
            assert sizes == [1] * len(ANSWERS)
        else:
            assert len(sizes) < len(ANSWERS), sizes  # some outcomes shared a unit
    grouped, alone = runs["tenant-group"], runs["tenant-alone"]
    states = [(await harness.detail(t)).task.state for t in alone.task_ids]
    assert states[:2] == [TaskState.RUNNING, TaskState.RUNNING]
    assert states[4:] == [TaskState.RUNNING, TaskState.RUNNING]
    _same_rows(await _by_content(harness, grouped), await _by_content(harness, alone))
    assert await _jobs(harness, grouped) == await _jobs(harness, alone)
