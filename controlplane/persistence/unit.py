"""`SqlUnitOfWork`: the one writer of the control plane's database (PostgreSQL or SQLite).

`Database.unit(now)` opens ONE transaction and yields a unit; everything a writer does (task and
attempt transitions, route decisions, provider jobs, outbox messages, runtime rows, catalog
publication, health and lease-audit rows) is a method here, so a crash never leaves half of a
decision behind and each rule of the write path is written once. Reads a writer needs inside its
transaction are here too, with row locks (``SELECT ... FOR UPDATE`` on PostgreSQL; SQLite's
``BEGIN IMMEDIATE`` serialises writers). Locks are taken attempt first, then task.

State changes are the compare-and-set of design 9.8.1::

    UPDATE ... SET status = :new, status_version = status_version + 1
     WHERE id = :id AND status_version = :expected AND status IN (:allowed_from)

where ``allowed_from`` comes from `TASK_MACHINE` / `ATTEMPT_MACHINE`; the unit enforces the
transition tables but makes no decisions of its own. A change that wins its CAS appends a
``task_events`` row (numbered by ``generation_tasks.last_event_seq``, which the same UPDATE
bumps, so the row lock orders concurrent writers) and its outbox messages in the same
transaction: `_move_task` is the only place that writes that step for one task, and
`transitions` (`move_tasks`, the dispatcher's `write_selected`) its set-based form for many,
checked against it row for row by a differential test.

The execution side's writes (jobs, runtime rows, provider events, claims) are in
`_unit_execution`, the catalog's (accounts, versions, health and lease-audit rows) in
`_unit_catalog`; the clock is injected (``now``, an aware datetime, for the whole unit).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, cast

from sqlalchemy import select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncConnection

from controlplane.domain.money import Reservation
from controlplane.domain.outbox import Topic
from controlplane.domain.requeue import RequeueRequest
from controlplane.domain.states import (
    ATTEMPT_MACHINE,
    NOT_SENT_ATTEMPT_STATES,
    TASK_MACHINE,
    AttemptState,
    TaskState,
)
from controlplane.domain.webhooks import WebhookSubscription, outputs_of
from controlplane.persistence import (
    _create,
    _deferred,
    _reads,
    _rows,
    _sql,
    batch,
    exclusions,
    ledger,
    quality,
    transitions,
)
from controlplane.persistence._unit_admin import AdminWrites
from controlplane.persistence._unit_catalog import CatalogWrites
from controlplane.persistence._unit_execution import ExecutionWrites
from controlplane.persistence.endings import Ending
from controlplane.persistence.errors import ConcurrentModification, DuplicateRecord
from controlplane.persistence.models import outbox as O
from controlplane.persistence.records import (
    AccountInfo,
    AttemptChanges,
    AttemptRecord,
    AttemptRuntime,
    Failure,
    NewAttempt,
    NewOutboxMessage,
    NewRouteDecision,
    OutboxRecord,
    ProviderJobRecord,
    RouteDecisionRecord,
    TaskEnd,
    TaskRecord,
)
from vidroute_core.exceptions import NotFound
from vidroute_core.spec import GenerationSpec

__all__ = ["SqlUnitOfWork"]


@dataclass(frozen=True, slots=True)
class _Moved:
    """A task CAS that won: the moved task, and the route decision stored alongside it, if any."""

    task: TaskRecord
    decision: RouteDecisionRecord | None


@dataclass(frozen=True, slots=True)
class _Event:
    """A task event not yet written (`SqlUnitOfWork.flush_events`); `outputs` go into its
    caller-webhook message."""

    kind: str
    payload: dict[str, Any]
    outputs: tuple[Mapping[str, Any], ...] = ()


class SqlUnitOfWork(ExecutionWrites, CatalogWrites, AdminWrites):
    """One open transaction (see the module docstring); made by `Database.unit`."""

    def __init__(self, conn: AsyncConnection, now: datetime) -> None:
        # Statements go out on `conn` after the unit's deferred writes (`_deferred`); the few
        # that provably leave those writes' tables alone (the task and attempt CAS, outbox and
        # usage INSERTs, task events) use `_direct`, so they do not send them early.
        self._direct = conn
        self._writes = _deferred.Deferred()
        self._held = _deferred.Held()
        self._rates: dict[tuple[str, str], ledger.UnitRate | None] = {}
        self.conn = cast(AsyncConnection, _deferred.AutoFlush(conn, self._flush_writes))
        self.now = now
        self.topics: set[str] = set()  # outbox topics written: woken after commit (wakeups)
        self.endings: list[Ending] = []  # terminal tasks, ABANDONED attempts: logged on commit
        # Task events are written at the end of the unit, all in one statement (`flush_events`):
        # those still to be numbered, by task, in the order they happened, and the numbered.
        self._unnumbered: dict[int, list[_Event]] = {}
        self._numbered: list[tuple[int, int, _Event]] = []

    # ---- reads inside the transaction ------------------------------------------------------

    async def hold(self, attempt_ids: Sequence[int]) -> None:
        """Lock the attempts and their tasks (attempt id order) and keep them, with their jobs
        and runtime rows, for this unit's reads: ONE statement for a whole batch, after which
        `attempt`, `task`, `runtime`, `job_of`, `job_by_ref` and `jobs_by_refs` of those rows
        read nothing (`_deferred.Held`); the first `attempts_of` of a held task reads the
        attempts of every held task in one more. Rows already held stay."""
        held = self._held
        wanted = [i for i in attempt_ids if i not in held.attempts]
        if not wanted:
            return
        found = await _reads.held(self.conn, wanted)
        for attempt, task, job, runtime in found.values():
            held.attempts[attempt.id] = attempt
            held.tasks.setdefault(task.id, task)  # one this unit moved is newer
            held.runtimes[attempt.id] = runtime
            held.jobs_of[attempt.id] = job
            if job is not None:
                held.jobs[job.provider_account_id, job.provider_job_id] = job

    async def attempt(self, attempt_id: int, *, lock: bool = True) -> AttemptRecord | None:
        held = self._held.attempts.get(attempt_id)
        if held is not None:
            return held
        return await _reads.attempt(self.conn, attempt_id, lock=lock)

    async def task(self, task_id: int, *, lock: bool = True) -> TaskRecord | None:
        held = self._held.tasks.get(task_id)
        if held is not None:
            return held
        return await _reads.task(self.conn, task_id, lock=lock)

    async def attempts_and_tasks(
        self, attempt_ids: Sequence[int]
    ) -> dict[int, tuple[AttemptRecord, TaskRecord]]:
        """The attempts and each one's task, locked (attempt and task rows in attempt id
        order), in ONE statement: a batch's `attempt` + `task` per item."""
        return await _reads.attempts_and_tasks(self.conn, attempt_ids)

    async def attempts_of(self, task_id: int) -> list[AttemptRecord]:
        held = self._held
        if task_id in held.tasks and task_id not in held.siblings:
            # The attempts of every held task not read yet, in one statement for the batch.
            families = sorted(held.tasks.keys() - held.siblings.keys())
            read = await _reads.attempts_of_tasks(self.conn, families)
            held.siblings.update({t: read.get(t, []) for t in families})
        family = held.siblings.get(task_id)
        if family is not None:
            return list(family)
        return await _reads.attempts_of(self.conn, task_id)

    async def job_of(self, attempt_id: int) -> ProviderJobRecord | None:
        if attempt_id in self._held.jobs_of:
            return self._held.jobs_of[attempt_id]
        return await _reads.job_of(self.conn, attempt_id)

    async def job_by_ref(self, account_id: int, job_id: str) -> ProviderJobRecord | None:
        held = self._held.jobs.get((account_id, job_id))
        if held is not None:
            return held
        return await _reads.job_by_ref(self.conn, account_id, job_id)

    async def jobs_by_refs(
        self, refs: Sequence[tuple[int, str]]
    ) -> dict[tuple[int, str], ProviderJobRecord]:
        """`job_by_ref` of many: the recorded jobs by (account, job id), those this unit holds
        (`hold`) read from the held rows, the others in ONE statement."""
        held = self._held.jobs
        found = {ref: held[ref] for ref in refs if ref in held}
        rest = [ref for ref in refs if ref not in found]
        if rest:
            found.update(await _reads.jobs_by_refs(self.conn, rest))
        return found

    async def account(self, account_id: int) -> AccountInfo:
        return await _reads.account(self.conn, account_id)

    async def runtime(self, attempt_id: int) -> AttemptRuntime | None:
        if attempt_id in self._held.runtimes:
            return self._held.runtimes[attempt_id]
        return await _reads.runtime(self.conn, attempt_id)

    # ---- tasks ----------------------------------------------------------------------------

    async def create_task(
        self,
        spec: GenerationSpec,
        *,
        idempotency_key: str,
        spec_hash: str,
        queue_deadline_at: datetime | None = None,
        deadline_at: datetime | None = None,
        reservation: Reservation | None = None,
        trace_context: str | None = None,
        webhook: WebhookSubscription | None = None,
    ) -> tuple[TaskRecord, bool]:
        """Insert a QUEUED task with its first event and a ``task.queued`` outbox message.
        `trace_context` is the creating call's W3C traceparent (a replay keeps the first one's).

        With a `reservation`, the task's one RESERVE entry is written with it (9.23.1); under a
        policy with a floor after the tenant is locked and its available credit checked
        (`ledger.check_and_lock`), last, so the tenant's lock is held for as little of the
        transaction as possible. A refusal raises `InsufficientCredit` and the unit rolls back,
        so nothing is written. A replay reserves nothing again.

        Returns ``(task, created)``. A replay of ``(tenant, idempotency_key)`` with the same
        `spec_hash` returns the stored task with ``created=False``; with another hash it raises
        `IdempotencyConflict`. Concurrent creators meet in INSERT ... ON CONFLICT DO NOTHING: the
        loser inserts nothing and returns the winner's task. On PostgreSQL the whole write is one
        statement (`_create`).
        """
        new = _create.NewTask(
            spec, idempotency_key, spec_hash, queue_deadline_at, deadline_at, trace_context, webhook
        )
        record, created = await _create.insert_task(self.conn, new, reservation, self.now)
        if created:  # `_create` wrote the outbox row itself, not through `enqueue`
            self.topics.add(str(Topic.QUEUED))
        return record, created

    async def move_task(
        self,
        record: TaskRecord,
        target: TaskState,
        reason: str = "",
        *,
        failure: Failure | None = None,
        adopted_attempt_id: int | None = None,
        output_asset: Mapping[str, Any] | None = None,
        outbox: Sequence[NewOutboxMessage] = (),
    ) -> TaskRecord | None:
        """CAS the task from `record`'s version; the moved task, or None when the table forbids
        it or the CAS lost. Optional columns are set only if given."""
        if not TASK_MACHINE.can(record.state, target):
            return None
        moved = await self._move_task(
            record.id,
            record.status_version,
            target,
            reason,
            failure=failure,
            adopted_attempt_id=adopted_attempt_id,
            output_asset=output_asset,
            outbox=outbox,
            defer=True,
        )
        return None if moved is None else moved.task

    async def move_task_at(
        self,
        task_id: int,
        expected_version: int,
        target: TaskState,
        reason: str = "",
        *,
        failure: Failure | None = None,
        adopted_attempt_id: int | None = None,
        output_asset: Mapping[str, Any] | None = None,
        outbox: Sequence[NewOutboxMessage] = (),
    ) -> bool:
        """`move_task` for a caller that knows only the id and version; True if it applied."""
        moved = await self._move_task(
            task_id,
            expected_version,
            target,
            reason,
            failure=failure,
            adopted_attempt_id=adopted_attempt_id,
            output_asset=output_asset,
            outbox=outbox,
            defer=True,
        )
        return moved is not None

    async def end_tasks(self, ends: Sequence[TaskEnd]) -> dict[int, TaskRecord]:
        """`move_task` into a terminal state for many tasks, set-based: the CASes in one UPDATE
        per (from, to) state (`transitions.cas_task_rows`), each won move's event and ending as
        `_move_task` writes them (the events numbered with the unit's others), then the
        settlements together (`ledger.settle_tasks`: one statement per step whatever the number
        of tasks). The moved tasks by id; a forbidden or lost move is left out, as
        `move_task`'s None. tests/integration/persistence/test_transition_paths.py compares it
        with `move_task` row for row."""
        if len({e.record.id for e in ends}) != len(ends):
            raise ValueError("a task may be ended once per call")
        for end in ends:
            if not TASK_MACHINE.is_terminal(end.target):
                raise ValueError(f"{end.target.value} is not a terminal task state")
        todo = [e for e in ends if TASK_MACHINE.can(e.record.state, e.target)]
        if not todo:
            return {}
        if self._writes.moves:
            await self._flush_writes()  # the kept moves first, in the order they were made
        moved = await transitions.cas_task_rows(
            self._direct,
            [
                transitions.TaskCas(
                    e.record.id,
                    e.record.state,
                    e.record.status_version,
                    e.target,
                    _sql.task_extra(e.failure, None, e.output_asset),
                )
                for e in todo
            ],
            self.now,
        )
        for end in todo:
            task = moved.get(end.record.id)
            if task is None:
                continue
            self._held.moved_task(task)
            payload = _sql.state_payload(end.target, task.status_version, end.reason, end.failure)
            self.add_event(task.id, "task.state_changed", payload, outputs_of(end.output_asset))
            self.endings.append(Ending(task.id, end.target.value, end.reason, end.failure))
        if moved:
            # 9.23.1: the terminal states and the tenants' settlements commit together.
            await ledger.settle_tasks(
                self.conn,
                [
                    ledger.Settle(t.id, t.state, adopted=(t.adopted_attempt_id,))
                    for t in moved.values()
                ],
                self.now,
            )
        return moved

    async def cancel_queued_task(self, task_id: int, reason: str = "") -> TaskRecord:
        """Cancel the task if it is still QUEUED; return its current record either way.

        The caller compares ``record.state`` with CANCELLED to learn whether it won. Raises
        `NotFound` if there is no such task.
        """
        current = await self.task(task_id)
        if current is None:
            raise NotFound("task", str(task_id))
        if current.state is not TaskState.QUEUED:
            return current
        moved = await self._move_task(task_id, current.status_version, TaskState.CANCELLED, reason)
        return current if moved is None else moved.task

    async def record_decision(
        self,
        task_id: int,
        expected_version: int,
        target: TaskState,
        decision: NewRouteDecision,
        *,
        reason: str = "",
        failure: Failure | None = None,
        outbox: Sequence[NewOutboxMessage] = (),
    ) -> RouteDecisionRecord | None:
        """CAS the task from SCHEDULING to `target` and store the decision (NO_CAPACITY,
        NO_ELIGIBLE_CANDIDATE: a decision without an attempt); None if the CAS lost."""
        moved = await self._move_task(
            task_id,
            expected_version,
            target,
            reason,
            failure=failure,
            outbox=outbox,
            decision=decision,
        )
        return None if moved is None else moved.decision

    async def _move_task(
        self,
        task_id: int,
        expected_version: int,
        target: TaskState,
        reason: str,
        *,
        failure: Failure | None = None,
        adopted_attempt_id: int | None = None,
        output_asset: Mapping[str, Any] | None = None,
        outbox: Sequence[NewOutboxMessage] = (),
        decision: NewRouteDecision | None = None,
        settle: bool = True,
        defer: bool = False,
    ) -> _Moved | None:
        """The task CAS + its event + its outbox messages: the one place this step is written
        for one task (`move_tasks` is its bulk form, checked against it row for row by
        tests/integration/persistence/test_transition_paths.py).

        None if the CAS lost. A `decision` is stored after the CAS won, and its number goes into
        the event. A terminal move settles the task unless `settle` is False: the caller then
        settles it in this unit (`end_tasks`, which settles its tasks together).

        `defer`: a held task's non-terminal move without a decision is kept and sent with the
        unit's other kept writes (`_deferred`); its event is numbered with the unit's others."""
        extra = _sql.task_extra(failure, adopted_attempt_id, output_asset)
        held = self._held.tasks.get(task_id)
        if (
            defer
            and held is not None
            and decision is None
            and not TASK_MACHINE.is_terminal(target)
            and task_id not in self._writes.task_moves
        ):
            if held.status_version != expected_version or not TASK_MACHINE.can(held.state, target):
                return None  # the row is locked by this unit: its CAS would lose
            kept = _deferred.moved_task(held, target, extra, self.now)
            step = transitions.TaskCas(task_id, held.state, expected_version, target, extra)
            self._writes.task_moves[task_id] = (step, kept)
            self._held.moved_task(kept)
            payload = _sql.state_payload(target, expected_version + 1, reason, failure)
            self.add_event(task_id, "task.state_changed", payload, outputs_of(output_asset))
            for message in outbox:
                self.topics.add(str(message.topic))
                self._writes.outbox.append(message)
            return _Moved(kept, None)
        if self._writes.moves:
            await self._flush_writes()  # the kept moves first, in the order they were made
        # The task's events still unnumbered (an attempt's moves before this one) take the
        # numbers just before this move's, reserved by the same UPDATE.
        earlier = self._unnumbered.pop(task_id, [])
        cas = await _sql.cas_task(
            self._direct,
            task_id,
            expected_version,
            target,
            now=self.now,
            events=1 + len(earlier),
            extra=extra,
        )
        if cas is None:
            if earlier:
                self._unnumbered[task_id] = earlier
            return None
        moved, seq = cas
        self._held.moved_task(moved)
        self._numbered.extend((task_id, seq - len(earlier) + i, e) for i, e in enumerate(earlier))
        payload = _sql.state_payload(target, expected_version + 1, reason, failure)
        stored = None
        if decision is not None:
            stored = await _sql.insert_decision(self.conn, task_id, decision, self.now)
            payload["route_decision_no"] = stored.decision_no
        event = _Event("task.state_changed", payload, tuple(outputs_of(output_asset)))
        self._numbered.append((task_id, seq, event))
        for message in outbox:
            await self.enqueue(message)
        if TASK_MACHINE.is_terminal(target):
            # 9.23.1: the terminal state and the tenant's settlement commit together.
            if settle:
                await ledger.settle_task(
                    self.conn, task_id, target, self.now, adopted=(moved.adopted_attempt_id,)
                )
            self.endings.append(Ending(task_id, target.value, reason, failure))
        return _Moved(moved, stored)

    # ---- task events ----------------------------------------------------------------------

    def add_event(
        self,
        task_id: int,
        kind: str,
        payload: Mapping[str, Any],
        outputs: Sequence[Mapping[str, Any]] = (),
    ) -> None:
        """A task event, numbered and written with the unit's others (`flush_events`)."""
        self._unnumbered.setdefault(task_id, []).append(_Event(kind, dict(payload), tuple(outputs)))

    async def flush_events(self) -> None:
        """Write the unit's task events: the numbers still missing reserved in ONE statement
        (each task's ``last_event_seq``, under its row lock), then the events and their
        caller-webhook messages in ONE more on PostgreSQL (`transitions.insert_events`).
        `Database.unit` calls it before the commit; a read of the events calls it first. The
        unit's deferred writes go out first (`_deferred`)."""
        await self._flush_writes()
        if self._unnumbered:
            pending, self._unnumbered = self._unnumbered, {}
            lasts = await _sql.reserve_seqs(self._direct, {t: len(e) for t, e in pending.items()})
            for task_id, events in pending.items():
                first = lasts[task_id] - len(events) + 1
                self._numbered.extend((task_id, first + i, e) for i, e in enumerate(events))
        if not self._numbered:
            return
        numbered, self._numbered = self._numbered, []
        rows = [
            {"task_id": t, "seq": seq, "kind": e.kind, "payload": e.payload, "created_at": self.now}
            for t, seq, e in numbered
        ]
        outputs = {(t, seq): e.outputs for t, seq, e in numbered if e.outputs}
        if await transitions.insert_events(self._direct, rows, self.now, outputs=outputs):
            self.topics.add(str(Topic.WEBHOOK))  # a caller-webhook message may be written

    async def _flush_writes(self) -> None:
        """Send the deferred writes (`_deferred.Deferred.flush`), if any."""
        if self._writes:
            await self._writes.flush(self._direct, self.now)

    @asynccontextmanager
    async def _savepoint(self) -> AsyncIterator[None]:
        """A savepoint whose task events are written inside it: rolled back, they are gone
        with the rows they describe."""
        await self.flush_events()
        try:
            async with self.conn.begin_nested():
                yield
                await self.flush_events()
        except BaseException:
            self._unnumbered, self._numbered = {}, []
            raise

    # ---- a dispatch round in bulk (`batch`) -------------------------------------------------

    async def claim_queued(self, expected: Mapping[int, int]) -> set[int]:
        """Lock the QUEUED tasks of `expected` (id -> routed version) no other transaction
        holds; those still at the routed version are this unit's (`batch.claim`)."""
        return await batch.claim(self.conn, expected)

    async def write_selected(self, items: Sequence[batch.SelectedTask]) -> dict[int, batch.Written]:
        """The claimed SELECTED tasks of a round, written set-based (`batch.write_selected`)."""
        await self.flush_events()
        written = await batch.write_selected(self.conn, items, self.now)
        for task_id in written:
            self._held.tasks.pop(task_id, None)
        if written:  # the after-commit wake-up relay (controlplane.wakeups)
            self.topics.add(str(Topic.SUBMIT))
        if any(w.announced for w in written.values()):
            self.topics.add(str(Topic.WEBHOOK))
        return written

    async def move_tasks(self, moves: Sequence[transitions.TaskMove]) -> set[int]:
        """The bulk form of `move_task`: every edge of every move asked of `TASK_MACHINE`
        (`IllegalTransition` before any write), the CAS set-based, the same events, webhook
        messages and, for a move that ends the task, its settlement (`transitions`). The ids
        whose CAS won; a lost one is left as it was, like the single path's."""
        await self.flush_events()  # numbers this path reserves itself come after them
        moved = await transitions.cas_many(self.conn, moves, self.now)
        for task_id in moved:
            self._held.tasks.pop(task_id, None)  # read again if asked for
        events = [e for m in moved.values() for e in m.events]
        if events and await transitions.insert_events(self.conn, events, self.now):
            self.topics.add(str(Topic.WEBHOOK))
        ended = [m for m in moves if m.task_id in moved and TASK_MACHINE.is_terminal(m.final)]
        if ended:
            # 9.23.1: the terminal state and the tenant's settlement commit together.
            await ledger.settle_tasks(
                self.conn, [ledger.Settle(m.task_id, m.final) for m in ended], self.now
            )
        for m in ended:
            self.endings.append(Ending(m.task_id, m.final.value, m.steps[-1].reason, None))
        return set(moved)

    # ---- attempts -------------------------------------------------------------------------

    async def create_attempt(
        self,
        task_id: int,
        expected_task_version: int,
        attempt: NewAttempt,
        decision: NewRouteDecision,
        *,
        outbox_topic: str = Topic.SUBMIT,
        outbox_payload: Mapping[str, Any] | None = None,
    ) -> tuple[AttemptRecord, RouteDecisionRecord]:
        """Persist the scheduler's choice atomically (design 9.10 / 9.10.1).

        Task SCHEDULING -> SUBMITTING (CAS on `expected_task_version`), the next RouteDecision,
        the next Attempt pointing at it, an outbox message on `outbox_topic` whose payload is
        `outbox_payload` plus ``task_id`` and ``attempt_id``, and two events. Raises
        `ConcurrentModification` if the task CAS loses and `DuplicateRecord` if the ``(account,
        client_request_key)`` is taken; either way nothing is written (a savepoint).
        """
        if attempt.initial_state not in NOT_SENT_ATTEMPT_STATES:
            raise ValueError(f"an attempt cannot start in {attempt.initial_state.value}")
        try:
            async with self._savepoint():
                moved = await self._move_task(
                    task_id, expected_task_version, TaskState.SUBMITTING, ""
                )
                if moved is None:
                    raise ConcurrentModification(
                        f"task {task_id} is not SCHEDULING at version {expected_task_version}"
                    )
                decision_row = await _sql.insert_decision(self.conn, task_id, decision, self.now)
                attempt_row = await _sql.insert_attempt(
                    self.conn, task_id, attempt, decision_row.id, self.now
                )
                self.add_event(task_id, "attempt.created", _sql.attempt_payload(attempt_row))
                self._held.siblings.pop(task_id, None)  # the task has one more attempt
                body = {**(outbox_payload or {}), "task_id": task_id, "attempt_id": attempt_row.id}
                await self.enqueue(NewOutboxMessage(outbox_topic, str(attempt_row.id), body))
        except IntegrityError as exc:
            raise DuplicateRecord(
                f"attempt for task {task_id} violates a UNIQUE constraint"
            ) from exc
        return attempt_row, decision_row

    async def move_attempt(
        self,
        record: AttemptRecord,
        target: AttemptState,
        reason: str = "",
        changes: AttemptChanges | None = None,
        *,
        outbox: Sequence[NewOutboxMessage] = (),
    ) -> AttemptRecord | None:
        """CAS the attempt from `record`'s version; None when the table forbids it or it lost.
        `changes` fields are set when not None. The batch of one of `move_attempts`."""
        if not ATTEMPT_MACHINE.can(record.state, target):
            return None
        move = transitions.AttemptMove.of(record, target, reason, changes)
        moved = (await self.move_attempts([move])).get(record.id)
        if moved is None:
            return None
        for message in outbox:
            await self.enqueue(message)
        return moved

    async def move_attempts(
        self, moves: Sequence[transitions.AttemptMove]
    ) -> dict[int, AttemptRecord]:
        """Attempt state changes, one or many: every move asked of `ATTEMPT_MACHINE`
        (`IllegalTransition` before any write), the CAS set-based (`transitions.cas_attempts`),
        an ``attempt.state_changed`` event per moved attempt, added in the order of `moves`.
        The moved attempts by id; a lost CAS is left as it was, like the single path's."""
        moved = await self._cas_attempts(moves)
        for m in moves:
            attempt = moved.get(m.attempt_id)
            if attempt is None:
                continue
            self._held.moved_attempt(attempt)
            failure = None if m.changes is None else m.changes.failure
            if attempt.state is AttemptState.ABANDONED:
                self.endings.append(
                    Ending(attempt.task_id, attempt.state.value, m.reason, failure, attempt.id)
                )
            payload = _sql.attempt_moved_payload(attempt, m.reason, m.changes)
            self.add_event(attempt.task_id, "attempt.state_changed", payload)
        return moved

    async def _cas_attempts(
        self, moves: Sequence[transitions.AttemptMove]
    ) -> dict[int, AttemptRecord]:
        """The CAS of `moves`: kept when every row is held and has no kept move yet
        (`_deferred`: the outcome is known now), else sent at once after the kept writes."""
        held, kept = self._held.attempts, self._writes.attempt_moves
        if not all(m.attempt_id in held and m.attempt_id not in kept for m in moves):
            if self._writes.moves:
                await self._flush_writes()  # the kept moves first, in the order they were made
            return await transitions.cas_attempts(self._direct, moves, self.now)
        for m in moves:  # every edge asked before anything is kept, as `cas_attempts`
            ATTEMPT_MACHINE.check(m.state, m.target)
        if len({m.attempt_id for m in moves}) != len(moves):
            raise ValueError("an attempt may be moved once per call")
        moved = {}
        for m in moves:
            row = held[m.attempt_id]
            if (row.state, row.status_version) != (m.state, m.expected_version):
                continue  # the row is locked by this unit: its CAS would lose
            moved[m.attempt_id] = _deferred.moved_attempt(row, m.target, m.changes, self.now)
            kept[m.attempt_id] = (m, moved[m.attempt_id])
        return moved

    # ---- outbox ---------------------------------------------------------------------------

    async def enqueue(self, message: NewOutboxMessage) -> int:
        """Add a message (a state change's own messages go through its `outbox=` argument)."""
        self.topics.add(str(message.topic))
        return await _sql.enqueue(self._direct, message, self.now)

    async def record_usage(self, usage: ledger.NewUsage) -> None:
        """A provider usage entry (EXPECTED / ACTUAL), once per idempotency key (kept and
        written with the unit's other kept writes, `_deferred`)."""
        self._writes.usage.append(usage)

    async def unit_rate(self, provider: str, rate_version: str) -> ledger.UnitRate | None:
        """The provider's unit conversion rate stored under `rate_version` (a stored version
        never changes: read once per unit)."""
        key = (provider, rate_version)
        if key not in self._rates:
            self._rates[key] = await ledger.rate_version(self._direct, provider, rate_version)
        return self._rates[key]

    async def put_unit_rates(self, rates: Sequence[ledger.UnitRate]) -> int:
        """Store conversion rate versions (an existing version is kept); how many were new."""
        self._rates.clear()
        return sum([await ledger.put_unit_rate(self.conn, rate) for rate in rates])

    async def record_quality_checks(self, checks: Sequence[quality.NewCheck]) -> int:
        """The probe's technical checks and their counters (`persistence.quality`)."""
        return await quality.record_checks(self.conn, checks, self.now)

    async def record_requeue(self, request: RequeueRequest) -> None:
        """Store a requeue's failover history (its exclusions merged into the task's rows)."""
        await exclusions.record_requeue(self.conn, request, self.now)

    async def claim_messages(
        self, topic: str, worker: str, *, limit: int, lease_seconds: float
    ) -> list[OutboxRecord]:
        """Claim up to `limit` due messages of `topic` for `lease_seconds`, oldest first.

        A message is due when not done, ``available_at <= now`` and unclaimed or its claim has
        expired. On PostgreSQL the candidate rows are picked with ``FOR UPDATE SKIP LOCKED``, so
        concurrent claimers never get the same row; on SQLite the clause is not rendered and the
        single writer lock (``BEGIN IMMEDIATE``) serialises claimers instead.
        """
        now = self.now
        due = (
            select(O.c.id)
            .where(
                O.c.topic == topic,
                O.c.done_at.is_(None),
                O.c.available_at <= now,
                (O.c.claimed_until.is_(None)) | (O.c.claimed_until < now),
            )
            .order_by(O.c.id)
            .limit(limit)
            .with_for_update(skip_locked=True)
            .cte("due")
        )
        stmt = (
            update(O)
            .where(O.c.id.in_(select(due.c.id)))
            .values(
                claimed_by=worker,
                claimed_until=now + timedelta(seconds=lease_seconds),
                attempts=O.c.attempts + 1,
            )
            .returning(O)
        )
        rows = (await self.conn.execute(stmt)).mappings().all()
        return sorted((_rows.outbox_message(m) for m in rows), key=lambda r: r.id)

    async def complete_message(self, message_id: int, worker: str) -> bool:
        """Mark a message done; False if `worker` no longer holds it or it is already done.
        Done in the transaction of the message's effect, so effect and ack commit together.
        A claimed message's row is none of the unit's kept writes: they are not sent first."""
        result = await self._direct.execute(
            update(O)
            .where(O.c.id == message_id, O.c.claimed_by == worker, O.c.done_at.is_(None))
            .values(done_at=self.now, claimed_until=None)
        )
        return result.rowcount == 1

    async def complete_messages(self, message_ids: Sequence[int], worker: str) -> set[int]:
        """`complete_message` for many in ONE statement: the ids this call marked done."""
        if not message_ids:
            return set()
        result = await self._direct.execute(  # no kept write touches a claimed message
            update(O)
            .where(O.c.id.in_(message_ids), O.c.claimed_by == worker, O.c.done_at.is_(None))
            .values(done_at=self.now, claimed_until=None)
            .returning(O.c.id)
        )
        return {int(i) for i in result.scalars()}

    async def retry_message(self, message_id: int, worker: str, *, available_at: datetime) -> bool:
        """Release `worker`'s claim so the message becomes due again at `available_at`."""
        result = await self._direct.execute(  # no kept write touches a claimed message
            update(O)
            .where(O.c.id == message_id, O.c.claimed_by == worker, O.c.done_at.is_(None))
            .values(claimed_by=None, claimed_until=None, available_at=available_at)
        )
        return result.rowcount == 1
