"""The invariant checker accepts a clean history and names exactly the rule each defect breaks."""

from __future__ import annotations

from typing import Any

from sqlalchemy import select, update
from sqlalchemy.ext.asyncio import AsyncEngine

from controlplane.audit import Invariant, check_invariants
from controlplane.domain.outbox import Topic
from controlplane.persistence.database import Database
from controlplane.persistence.db import create_engine
from controlplane.persistence.migrate import downgrade, upgrade
from controlplane.persistence.models import (
    generation_tasks,
    outbox,
    provider_jobs,
    route_decisions,
    task_attempts,
)
from tests.integration.audit.history import NOW, History, assert_only, build_history
from tests.integration.audit.tamper import Tamper

I = Invariant  # noqa: E741 - reads like the design's numbering


async def _one_id(engine: AsyncEngine, column: Any, *where: Any) -> int:
    async with engine.connect() as conn:
        value = await conn.scalar(select(column).where(*where))
    assert value is not None
    return int(value)


async def _attempt_decision(engine: AsyncEngine, attempt_id: int) -> int:
    A = task_attempts
    return await _one_id(engine, A.c.route_decision_id, A.c.id == attempt_id)


# ---- the clean history -------------------------------------------------------------------------


async def test_clean_history_satisfies_every_invariant(
    engine: AsyncEngine, history: History
) -> None:
    """A history written only through the unit of work breaks no invariant; all is counted."""
    report = await check_invariants(Database(engine))
    assert report.ok, report.render()
    assert report.counts["tasks"] == len(history.tasks)
    assert report.counts["attempts"] == len(history.attempts)
    assert report.counts["provider_jobs"] == 4
    assert report.counts["tasks_succeeded"] == 1
    assert "invariant check: OK" in report.render()


async def test_finished_history_is_quiescent(engine: AsyncEngine, db: Database) -> None:
    """With every task terminal, require_all_terminal accepts the undone messages they left."""
    await build_history(db, live=False)
    report = await check_invariants(Database(engine), require_all_terminal=True)
    assert report.ok, report.render()
    assert report.counts["outbox_undone"] > 0


async def test_live_tasks_break_quiescence(engine: AsyncEngine, history: History) -> None:
    """require_all_terminal reports each live task and each undone message of a live task."""
    report = await check_invariants(Database(engine), require_all_terminal=True)
    assert_only(report, I.I10_QUIESCENT)
    subjects = {v.subject for v in report.violations}
    assert {f"task {history.tasks[s]}" for s in ("running", "unknown", "queued")} <= subjects
    assert any(s.startswith("outbox ") for s in subjects)


async def test_undone_message_of_no_task_breaks_quiescence(
    engine: AsyncEngine, db: Database, tamper: Tamper
) -> None:
    """An undone outbox message that belongs to no known task is reported under I10."""
    await build_history(db, live=False)
    await tamper.insert(
        outbox,
        {
            "topic": Topic.REQUEUE,
            "aggregate_id": "999999",
            "payload": {"task_id": 999999},
            "created_at": NOW,
            "available_at": NOW,
            "attempts": 0,
        },
    )
    assert_only(
        await check_invariants(Database(engine), require_all_terminal=True), I.I10_QUIESCENT
    )


async def test_checker_reads_a_database_at_the_first_revision(empty_url: str) -> None:
    """The checker relies only on the tables and columns of revision 0001: the history is
    written by today's code at head, then the database goes down to 0001 (dropping every later
    table and column) before the checker reads it."""
    await upgrade(empty_url)
    engine = create_engine(empty_url)
    try:
        await build_history(Database(engine))
        await downgrade(empty_url, "0001_initial")
        report = await check_invariants(Database(engine))
        assert report.ok, report.render()
    finally:
        await engine.dispose()


# ---- I1 .. I3: attempts and provider jobs ------------------------------------------------------


async def test_attempt_without_model_breaks_binding(
    engine: AsyncEngine, history: History, tamper: Tamper
) -> None:
    """An attempt whose provider_model is blank is reported under I1."""
    attempt = history.attempts[("running", 1)]
    await tamper.sql("UPDATE task_attempts SET provider_model = '' WHERE id = :a", a=attempt)
    assert_only(await check_invariants(Database(engine)), I.I1_ATTEMPT_BINDING)


async def test_attempt_without_compile_plan_breaks_binding(
    engine: AsyncEngine, history: History, tamper: Tamper
) -> None:
    """An attempt with an empty compile plan is reported under I1."""
    attempt = history.attempts[("failed", 1)]
    stmt = update(task_attempts).where(task_attempts.c.id == attempt).values(compile_plan={})
    await tamper.sql(stmt)
    assert_only(await check_invariants(Database(engine)), I.I1_ATTEMPT_BINDING)


async def test_job_on_another_account_breaks_binding(
    engine: AsyncEngine, history: History, tamper: Tamper
) -> None:
    """A provider job on a different account than its attempt is reported under I1."""
    attempt = history.attempts[("running", 1)]
    await tamper.sql(
        "UPDATE provider_jobs SET provider_account_id = :v WHERE attempt_id = :a",
        v=history.veo.id,
        a=attempt,
    )
    assert_only(await check_invariants(Database(engine)), I.I1_ATTEMPT_BINDING)


async def test_attempt_moved_to_another_account_breaks_binding(
    engine: AsyncEngine, history: History, tamper: Tamper
) -> None:
    """An attempt re-pointed in place, disagreeing with its own events, is reported under I1."""
    attempt = history.attempts[("failed", 1)]
    await tamper.sql(
        "UPDATE task_attempts SET provider_account_id = :v WHERE id = :a",
        v=history.veo.id,
        a=attempt,
    )
    assert_only(await check_invariants(Database(engine)), I.I1_ATTEMPT_BINDING)


async def test_gap_in_attempt_numbers_breaks_numbering(
    engine: AsyncEngine, history: History, tamper: Tamper
) -> None:
    """A task whose attempts are numbered 1, 3 is reported under I2."""
    attempt = history.attempts[("failover", 2)]
    await tamper.sql("UPDATE task_attempts SET attempt_no = 3 WHERE id = :a", a=attempt)
    assert_only(await check_invariants(Database(engine)), I.I2_ATTEMPT_NUMBERING)


async def test_second_job_for_an_attempt_breaks_one_job_per_attempt(
    engine: AsyncEngine, history: History, tamper: Tamper
) -> None:
    """A second provider job row for one attempt is reported under I2b."""
    await tamper.drop_constraint("provider_jobs", "uq_provider_jobs_attempt_id")
    J = provider_jobs
    job_id = await _one_id(engine, J.c.id, J.c.attempt_id == history.attempts[("failover", 2)])
    await tamper.copy_row(J, job_id, provider_job_id="veo-op-9")
    assert_only(await check_invariants(Database(engine)), I.I2B_ONE_JOB_PER_ATTEMPT)


async def test_event_naming_another_job_breaks_job_never_overwritten(
    engine: AsyncEngine, history: History, tamper: Tamper
) -> None:
    """A provider_job.recorded event naming a different job for the attempt is reported under I3."""
    await tamper.append_event(
        history.tasks["failover"],
        "provider_job.recorded",
        {
            "attempt_id": history.attempts[("failover", 2)],
            "provider_job_id": "veo-op-replacement",
            "normalized_status": "RUNNING",
        },
    )
    assert_only(await check_invariants(Database(engine)), I.I3_JOB_NEVER_OVERWRITTEN)


async def test_duplicate_job_id_on_an_account_breaks_job_never_overwritten(
    engine: AsyncEngine, history: History, tamper: Tamper
) -> None:
    """One provider job id stored twice on the same account is reported under I3."""
    await tamper.drop_constraint("provider_jobs", "uq_provider_jobs_provider_job_id")
    J = provider_jobs
    job_id = await _one_id(engine, J.c.id, J.c.provider_job_id == "rw-job-1")
    await tamper.copy_row(J, job_id, attempt_id=history.attempts[("failed", 1)])
    assert_only(await check_invariants(Database(engine)), I.I3_JOB_NEVER_OVERWRITTEN)


# ---- I4, I5: adoption --------------------------------------------------------------------------


async def test_succeeded_task_without_output_breaks_adoption(
    engine: AsyncEngine, history: History, tamper: Tamper
) -> None:
    """A SUCCEEDED task without output_asset is reported under I4."""
    task = history.tasks["failover"]
    await tamper.sql("UPDATE generation_tasks SET output_asset = NULL WHERE id = :t", t=task)
    assert_only(await check_invariants(Database(engine)), I.I4_SINGLE_ADOPTED_OUTPUT)


async def test_failed_task_with_output_breaks_adoption(
    engine: AsyncEngine, history: History, tamper: Tamper
) -> None:
    """A FAILED task that carries an output_asset is reported under I4."""
    T = generation_tasks
    stmt = update(T).where(T.c.id == history.tasks["failed"]).values(output_asset={"uri": "x"})
    await tamper.sql(stmt)
    assert_only(await check_invariants(Database(engine)), I.I4_SINGLE_ADOPTED_OUTPUT)


async def test_adopting_another_tasks_attempt_breaks_adoption(
    engine: AsyncEngine, history: History, tamper: Tamper
) -> None:
    """A task whose adopted attempt belongs to another task is reported under I4."""
    await tamper.sql(
        "UPDATE generation_tasks SET adopted_attempt_id = :a WHERE id = :t",
        a=history.attempts[("cancelled", 1)],
        t=history.tasks["failover"],
    )
    assert_only(await check_invariants(Database(engine)), I.I4_SINGLE_ADOPTED_OUTPUT)


async def test_rescheduling_after_adoption_breaks_adoption_stability(
    engine: AsyncEngine, history: History, tamper: Tamper
) -> None:
    """A late event moving an adopted task back to SCHEDULING is reported under I5."""
    await tamper.append_event(
        history.tasks["failover"], "task.state_changed", {"state": "SCHEDULING"}
    )
    assert_only(await check_invariants(Database(engine)), I.I5_ADOPTION_STABLE)


async def test_history_adopting_another_attempt_breaks_adoption_stability(
    engine: AsyncEngine, history: History, tamper: Tamper
) -> None:
    """History recording an adopted attempt other than the row's is reported under I5."""
    await tamper.append_event(
        history.tasks["failover"],
        "task.state_changed",
        {"state": "SUCCEEDED", "adopted_attempt_id": history.attempts[("failover", 1)]},
    )
    assert_only(await check_invariants(Database(engine)), I.I5_ADOPTION_STABLE)


# ---- I6, I7: cost and route decisions ----------------------------------------------------------


async def test_lowercase_currency_breaks_cost_accounting(
    engine: AsyncEngine, history: History, tamper: Tamper
) -> None:
    """An attempt whose currency is not an ISO-4217 code is reported under I6."""
    attempt = history.attempts[("failover", 2)]
    await tamper.sql("UPDATE task_attempts SET currency = 'usd' WHERE id = :a", a=attempt)
    assert_only(await check_invariants(Database(engine)), I.I6_COST_PER_ATTEMPT)


async def test_float_cost_breaks_cost_accounting(
    engine: AsyncEngine, history: History, tamper: Tamper, backend: str
) -> None:
    """A fractional cost (SQLite) or a float cost column (PostgreSQL) is reported under I6."""
    attempt = history.attempts[("failover", 2)]
    if backend == "postgresql":
        await tamper.sql(
            "ALTER TABLE task_attempts ALTER COLUMN actual_cost_micros TYPE double precision"
        )
    else:
        await tamper.sql(
            "UPDATE task_attempts SET actual_cost_micros = 2.5 WHERE id = :a", a=attempt
        )
    report = await check_invariants(Database(engine))
    assert_only(report, I.I6_COST_PER_ATTEMPT)


async def test_attempt_without_route_decision_breaks_explainability(
    engine: AsyncEngine, history: History, tamper: Tamper
) -> None:
    """An attempt that references no route decision is reported under I7."""
    attempt = history.attempts[("running", 1)]
    await tamper.sql("UPDATE task_attempts SET route_decision_id = NULL WHERE id = :a", a=attempt)
    assert_only(await check_invariants(Database(engine)), I.I7_ROUTE_DECISION_EXPLAINED)


async def test_decision_without_reason_breaks_explainability(
    engine: AsyncEngine, history: History, tamper: Tamper
) -> None:
    """A route decision with a blank reason_code is reported under I7."""
    decision = await _attempt_decision(engine, history.attempts[("failed", 1)])
    await tamper.sql("UPDATE route_decisions SET reason_code = ' ' WHERE id = :d", d=decision)
    assert_only(await check_invariants(Database(engine)), I.I7_ROUTE_DECISION_EXPLAINED)


async def test_decision_of_another_task_breaks_explainability(
    engine: AsyncEngine, history: History, tamper: Tamper
) -> None:
    """An attempt pointing at another task's route decision is reported under I7."""
    decision = await _attempt_decision(engine, history.attempts[("failed", 1)])
    await tamper.sql(
        "UPDATE task_attempts SET route_decision_id = :d WHERE id = :a",
        d=decision,
        a=history.attempts[("running", 1)],
    )
    assert_only(await check_invariants(Database(engine)), I.I7_ROUTE_DECISION_EXPLAINED)


# ---- I8: state sanity --------------------------------------------------------------------------


async def test_terminal_task_with_attempt_in_flight_breaks_state_sanity(
    engine: AsyncEngine, history: History, tamper: Tamper
) -> None:
    """A FAILED task whose attempt is still RUNNING is reported under I8."""
    task = history.tasks["running"]
    await tamper.sql("UPDATE generation_tasks SET status = 'FAILED' WHERE id = :t", t=task)
    assert_only(await check_invariants(Database(engine)), I.I8_STATE_SANITY)


async def test_cancelled_task_with_unsettled_cancel_breaks_state_sanity(
    engine: AsyncEngine, history: History, tamper: Tamper
) -> None:
    """A CANCELLED task whose attempt is still CANCEL_REQUESTED is reported under I8."""
    attempt = history.attempts[("cancelled", 1)]
    await tamper.sql(
        "UPDATE task_attempts SET status = 'CANCEL_REQUESTED' WHERE id = :a", a=attempt
    )
    report = await check_invariants(Database(engine))
    assert_only(report, I.I8_STATE_SANITY)
    assert "in flight" in report.violations[0].detail


async def test_unsent_attempt_of_ended_task_is_tolerated_while_its_submit_is_pending(
    engine: AsyncEngine, history: History, tamper: Tamper
) -> None:
    """An unsent attempt under a FAILED task passes while its attempt.submit message is undone."""
    attempt = history.attempts[("failed", 1)]
    await tamper.sql("UPDATE task_attempts SET status = 'READY_TO_SUBMIT' WHERE id = :a", a=attempt)
    report = await check_invariants(Database(engine))
    assert report.ok, report.render()


async def test_unsent_attempt_of_ended_task_breaks_state_sanity_once_settled(
    engine: AsyncEngine, db: Database, tamper: Tamper
) -> None:
    """With require_all_terminal an unsent attempt under a FAILED task is reported under I8."""
    history = await build_history(db, live=False)
    attempt = history.attempts[("failed", 1)]
    await tamper.sql("UPDATE task_attempts SET status = 'READY_TO_SUBMIT' WHERE id = :a", a=attempt)
    assert_only(
        await check_invariants(Database(engine), require_all_terminal=True), I.I8_STATE_SANITY
    )


async def test_two_live_attempts_break_state_sanity(
    engine: AsyncEngine, history: History, tamper: Tamper
) -> None:
    """A task with two live attempts at once is reported under I8."""
    running = history.attempts[("running", 1)]
    decision = await tamper.copy_row(
        route_decisions, await _attempt_decision(engine, running), decision_no=2
    )
    await tamper.copy_row(
        task_attempts,
        running,
        attempt_no=2,
        route_decision_id=decision,
        client_request_key="second-live",
        status="READY_TO_SUBMIT",
    )
    assert_only(await check_invariants(Database(engine)), I.I8_STATE_SANITY)


async def test_unknown_status_breaks_state_sanity(
    engine: AsyncEngine, history: History, tamper: Tamper, backend: str
) -> None:
    """A task status outside TaskState is reported under I8."""
    if backend == "postgresql":
        await tamper.drop_constraint("generation_tasks", "status_enum")
    await tamper.sql(
        "UPDATE generation_tasks SET status = 'PAUSED' WHERE id = :t",
        ignore_checks=True,
        t=history.tasks["queued"],
    )
    assert_only(await check_invariants(Database(engine)), I.I8_STATE_SANITY)
