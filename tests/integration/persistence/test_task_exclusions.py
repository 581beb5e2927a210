"""Failover history rows (revision 0004): written in the requeue's transaction, merged per
candidate (never doubled; hard beats soft; the latest retry instant), read for many tasks at
once as the dispatcher's `RequeueFacts`, and carried over from older payloads on upgrade."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest
from sqlalchemy import func, insert, select
from sqlalchemy.exc import IntegrityError

from controlplane.domain.outbox import Topic
from controlplane.domain.requeue import ExcludedCandidate, RequeueRequest
from controlplane.persistence import exclusions
from controlplane.persistence.database import Database
from controlplane.persistence.migrate import downgrade, upgrade
from controlplane.persistence.models import task_exclusions
from controlplane.persistence.records import AttemptRecord, NewOutboxMessage
from tests.integration.persistence.builders import NOW, Scenario

T1 = NOW + timedelta(seconds=10)
T2 = NOW + timedelta(seconds=20)


def _request(
    attempt: AttemptRecord, *excluded: ExcludedCandidate, model: str = ""
) -> RequeueRequest:
    return RequeueRequest(
        task_id=attempt.task_id,
        failed_attempt_id=attempt.id,
        reason="FAIL_OVER",
        error_class=excluded[-1].error_class if excluded else "",
        excluded_candidates=excluded,
        same_model_only=bool(model),
        required_model=model,
    )


async def _record(db: Database, request: RequeueRequest) -> None:
    async with db.unit(NOW) as u:
        await u.record_requeue(request)


async def _rows(db: Database, task_id: int) -> list[ExcludedCandidate]:
    async with db.reading() as conn:
        return await exclusions.exclusions_of(conn, task_id)


async def test_an_exclusion_written_twice_merges_into_one_row(
    db: Database, scenario: Scenario
) -> None:
    """Each candidate keeps one row: a soft exclusion waits for the later retry instant, a hard
    one replaces it for good (with its cause), and a later soft one leaves it hard."""
    attempt = await scenario.attempt()
    account, model = attempt.provider_account_id, attempt.provider_model

    def soft(at: datetime | None) -> ExcludedCandidate:
        return ExcludedCandidate(
            account, model, True, at, attempt_id=attempt.id, error_class="TRANSIENT_NETWORK"
        )

    await _record(db, _request(attempt, soft(T2)))
    await _record(db, _request(attempt, soft(T1)))
    await _record(db, _request(attempt, soft(None)))
    assert await _rows(db, attempt.task_id) == [soft(T2)]

    hard = ExcludedCandidate(
        account, model, attempt_id=attempt.id, error_class="INTERNAL_PERMANENT"
    )
    await _record(db, _request(attempt, hard))
    await _record(db, _request(attempt, soft(T2 + timedelta(hours=1))))
    assert await _rows(db, attempt.task_id) == [hard]
    async with db.reading() as conn:
        count = await conn.scalar(select(func.count()).select_from(task_exclusions))
        assert count == 1
        assert len(await exclusions.requeues_of(conn, attempt.task_id)) == 5


async def test_the_table_refuses_a_second_row_for_a_candidate(
    db: Database, scenario: Scenario
) -> None:
    """UNIQUE (task, account, model) backs the merge: a raw duplicate insert fails."""
    attempt = await scenario.attempt()
    row = {
        "task_id": attempt.task_id,
        "provider_account_id": attempt.provider_account_id,
        "provider_model": attempt.provider_model,
        "soft": False,
        "error_class": "INTERNAL_PERMANENT",
        "created_at": NOW,
        "updated_at": NOW,
    }
    with pytest.raises(IntegrityError):
        async with db.unit(NOW) as u:
            await u.conn.execute(insert(task_exclusions), [row, row])


async def test_a_rolled_back_requeue_leaves_no_history(db: Database, scenario: Scenario) -> None:
    """The rows belong to the requeue's transaction: if it rolls back, nothing is stored."""
    attempt = await scenario.attempt()
    excluded = ExcludedCandidate(attempt.provider_account_id, attempt.provider_model)

    async def requeue_then_fail() -> None:
        async with db.unit(NOW) as u:
            await u.record_requeue(_request(attempt, excluded))
            raise RuntimeError("the task CAS lost")

    with pytest.raises(RuntimeError):
        await requeue_then_fail()
    assert await _rows(db, attempt.task_id) == []
    async with db.reading() as conn:
        assert await exclusions.load_facts(conn, [attempt.task_id]) == {}


async def test_facts_of_many_tasks_are_read_at_once(db: Database, scenario: Scenario) -> None:
    """`load_facts` answers for every requeued task among those asked (a task never requeued
    has no entry): exclusions, the latest requeue's pin and class, counts from the attempts."""
    first = await scenario.attempt()
    second = await scenario.attempt()
    untouched = await scenario.attempt()
    hard = ExcludedCandidate(first.provider_account_id, "gen4.5", error_class="SAFETY_OUTPUT")
    soft = ExcludedCandidate(second.provider_account_id, "gen4.5", soft=True, retry_at=T1)
    await _record(db, _request(first, hard))
    await _record(db, _request(first, model="gen4.5"))
    await _record(db, _request(second, soft))
    async with db.reading() as conn:
        facts = await exclusions.load_facts(
            conn, [first.task_id, second.task_id, untouched.task_id, 10**9]
        )
    assert set(facts) == {first.task_id, second.task_id}
    one, two = facts[first.task_id], facts[second.task_id]
    assert one.excluded == frozenset({(first.provider_account_id, "gen4.5")})
    assert one.same_model_only == "gen4.5"
    assert one.error_class == ""  # the latest requeue's class
    assert (one.attempts_so_far, one.provider_switches_so_far) == (1, 0)
    assert two.excluded == frozenset()
    assert dict(two.soft_excluded) == {(second.provider_account_id, "gen4.5"): T1}
    assert two.same_model_only == ""


async def test_history_written_before_revision_0004_survives_the_upgrade(
    empty_database_url: str,
) -> None:
    """A task requeued by a 0003 control plane (its exclusions in ``task.requeue`` payloads)
    keeps them after the upgrade: the revision copies the payloads into rows, merged.

    Today's code writes the task and attempt at head (it reads columns later revisions add);
    the database then goes down to 0003, where the 0003 control plane's payloads are written."""
    await upgrade(empty_database_url)
    db = Database.from_url(empty_database_url)
    try:
        attempt = await Scenario(db).attempt()
        await downgrade(empty_database_url, "0003_attempt_evidence")
        account, task_id = attempt.provider_account_id, attempt.task_id

        def payload(*excluded: dict[str, object], pinned: bool) -> dict[str, object]:
            return {
                "task_id": task_id,
                "failed_attempt_id": attempt.id,
                "reason": "FAIL_OVER",
                "error_class": "TRANSIENT_NETWORK",
                "excluded_candidates": list(excluded),
                "same_model_only": pinned,
                "required_model": "gen4.5" if pinned else "",
                "attempts_so_far": 1,
                "provider_switches_so_far": 0,
                "not_before": None,
            }

        soft = {"provider_account_id": account, "provider_model": "gen4.5", "soft": True}
        async with db.unit(NOW) as u:
            for body in (
                payload({**soft, "retry_at": T2.isoformat()}, pinned=False),
                payload(
                    {**soft, "retry_at": T1.isoformat()},
                    {**soft, "provider_model": "x"},
                    pinned=False,
                ),
                payload({"provider_account_id": account, "provider_model": "x"}, pinned=True),
            ):
                await u.enqueue(NewOutboxMessage(Topic.REQUEUE, str(task_id), body))
        await upgrade(empty_database_url)
        async with db.reading() as conn:
            facts = (await exclusions.load_facts(conn, [task_id]))[task_id]
            assert [r.reason for r in await exclusions.requeues_of(conn, task_id)] == [
                "FAIL_OVER"
            ] * 3
    finally:
        await db.dispose()
    assert facts.excluded == frozenset({(account, "x")})
    assert dict(facts.soft_excluded) == {(account, "gen4.5"): T2}
    assert facts.same_model_only == "gen4.5"
    assert facts.error_class == "TRANSIENT_NETWORK"
