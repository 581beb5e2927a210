"""Rules about tasks: adoption (9.3.4 #4, #5), state sanity (9.8) and quiescence.

Pure functions over a `Snapshot`, like `execution_rules`.

How a cancel that races a success is judged (``controlplane/execution/events.py``, ``cancel.py``):
a task adopts its attempt when that attempt SUCCEEDED, moving to OUTPUT_FETCHING with
``adopted_attempt_id`` set in the same CAS; ``output_asset`` is written only by the move to
SUCCEEDED once the output is stored. If a cancel was requested and the provider succeeded first,
the engine either discards the result (task CANCELLED, nothing adopted) or delivers it (task
adopts and normally ends SUCCEEDED), and a cancel that lands during OUTPUT_FETCHING leaves a
CANCELLED task that did adopt. An output fetch that fails leaves FAILED with an adoption too.
So the checker accepts an adopted attempt on an OUTPUT_FETCHING, SUCCEEDED, FAILED or CANCELLED
task, but only a SUCCEEDED task may carry ``output_asset``: a delivered output means SUCCEEDED.

A terminal task may keep an ABANDONED attempt (terminal: recovery gave up, the job may still run
and is reconciled in the background), but never one in flight: the engine settles the attempt
before it ends the task, so a CANCEL_REQUESTED attempt under a CANCELLED task means the task
ended before the provider answered. An attempt not sent yet under an ended task is tolerated
only while its ``attempt.submit`` message is pending (see `check_state_sanity`).
"""

from __future__ import annotations

from collections import defaultdict

from controlplane.audit.execution_rules import int_or_none, non_empty
from controlplane.audit.report import Invariant, Violation
from controlplane.domain.outbox import Topic
from controlplane.domain.states import (
    ATTEMPT_MACHINE,
    IN_FLIGHT_ATTEMPT_STATES,
    TASK_MACHINE,
    AttemptState,
    TaskState,
)
from controlplane.persistence.snapshot import AttemptRow, EventRow, OutboxRow, Snapshot

__all__ = [
    "check_adopted_output",
    "check_adoption_stable",
    "check_quiescent",
    "check_state_sanity",
    "is_terminal_task",
]

_TASK_STATES = frozenset(s.value for s in TaskState)
_ATTEMPT_STATES = frozenset(s.value for s in AttemptState)
_TERMINAL_ATTEMPT = frozenset(s.value for s in ATTEMPT_MACHINE.terminal)
_IN_FLIGHT = frozenset(s.value for s in IN_FLIGHT_ATTEMPT_STATES)
# States a task passes through before it adopts a result; it never returns to them afterwards.
_BEFORE_ADOPTION = frozenset(
    s.value
    for s in (TaskState.QUEUED, TaskState.SCHEDULING, TaskState.SUBMITTING, TaskState.RUNNING)
)
_ADOPTING = frozenset({TaskState.OUTPUT_FETCHING.value, TaskState.SUCCEEDED.value})


def is_terminal_task(status: str) -> bool:
    """Whether a raw task status is one of the task machine's terminal states."""
    return status in {s.value for s in TASK_MACHINE.terminal}


def _v(invariant: Invariant, subject: str, detail: str) -> Violation:
    return Violation(invariant.value, subject, detail)


def check_adopted_output(snap: Snapshot) -> list[Violation]:
    """I4: one adopted SUCCEEDED attempt of the same task; output only on SUCCEEDED."""
    rule = Invariant.I4_SINGLE_ADOPTED_OUTPUT
    attempts = {a.id: a for a in snap.attempts}
    found: list[Violation] = []
    for t in snap.tasks:
        subject = f"task {t.id} ({t.status})"
        if t.adopted_attempt_id is not None:
            adopted = attempts.get(t.adopted_attempt_id)
            if adopted is None:
                found.append(_v(rule, subject, f"adopted attempt {t.adopted_attempt_id} missing"))
            elif adopted.task_id != t.id:
                found.append(
                    _v(rule, subject, f"adopted attempt {adopted.id} is of task {adopted.task_id}")
                )
            elif adopted.status != AttemptState.SUCCEEDED.value:
                found.append(_v(rule, subject, f"adopted attempt {adopted.id} is {adopted.status}"))
        elif t.status in _ADOPTING:
            found.append(_v(rule, subject, "no adopted attempt"))
        has_output = non_empty(t.output_asset)
        if t.status == TaskState.SUCCEEDED.value and not has_output:
            found.append(_v(rule, subject, "SUCCEEDED without output_asset"))
        if t.output_asset is not None and t.status != TaskState.SUCCEEDED.value:
            found.append(_v(rule, subject, "output_asset on a task that did not succeed"))
    return found


def check_adoption_stable(snap: Snapshot) -> list[Violation]:
    """I5: the adopted attempt never changes, and adoption is never undone by a later event.

    The store's ``task.state_changed`` payloads do not record ``adopted_attempt_id`` today (the
    column is set in the same CAS as the move to OUTPUT_FETCHING), so the history check is:
    after the first move to OUTPUT_FETCHING or SUCCEEDED, no event moves the task back to
    QUEUED/SCHEDULING/SUBMITTING/RUNNING, and a task holding an adoption is not in one of those
    states. If a writer does put ``adopted_attempt_id`` in the payloads, every value recorded
    must be the same one and equal the column.
    """
    rule = Invariant.I5_ADOPTION_STABLE
    history: dict[int, list[EventRow]] = defaultdict(list)
    for event in snap.events:
        if event.kind == "task.state_changed":
            history[event.task_id].append(event)
    found: list[Violation] = []
    for t in snap.tasks:
        subject = f"task {t.id} ({t.status})"
        if t.adopted_attempt_id is not None and t.status in _BEFORE_ADOPTION:
            found.append(
                _v(rule, subject, f"adopted attempt {t.adopted_attempt_id} yet back in {t.status}")
            )
        adopted_at: int | None = None
        recorded: list[int] = []
        for event in history.get(t.id, []):
            state = str(event.payload.get("state", ""))
            if adopted_at is None and state in _ADOPTING:
                adopted_at = event.seq
            elif adopted_at is not None and state in _BEFORE_ADOPTION:
                found.append(
                    _v(
                        rule,
                        subject,
                        f"event #{event.seq} moved it to {state} after it adopted a result "
                        f"(event #{adopted_at})",
                    )
                )
            value = int_or_none(event.payload.get("adopted_attempt_id"))
            if value is not None:
                recorded.append(value)
        distinct = sorted(set(recorded))
        if len(distinct) > 1:
            found.append(_v(rule, subject, f"history adopted several attempts: {distinct}"))
        elif distinct and distinct[0] != t.adopted_attempt_id:
            found.append(
                _v(
                    rule,
                    subject,
                    f"history adopted attempt {distinct[0]}, the row holds {t.adopted_attempt_id}",
                )
            )
    return found


def check_state_sanity(snap: Snapshot, *, settled: bool = False) -> list[Violation]:
    """I8: valid status values; no live attempt under a terminal task; one live attempt at most.

    One transient is tolerated unless `settled`: an attempt not sent yet (CREATED, RESERVING,
    READY_TO_SUBMIT) under a task that ended, while its ``attempt.submit`` message is still
    pending. The submit worker cancels such an attempt when it takes the message ("task
    ended"), so only a settled system (the soak test's end) must not show it.
    """
    rule = Invariant.I8_STATE_SANITY
    awaiting_submit = set() if settled else _awaiting_submit(snap)
    found: list[Violation] = []
    found.extend(
        _v(rule, f"task {t.id}", f"unknown status {t.status!r}")
        for t in snap.tasks
        if t.status not in _TASK_STATES
    )
    found.extend(
        _v(rule, f"attempt {a.id} (task {a.task_id})", f"unknown status {a.status!r}")
        for a in snap.attempts
        if a.status not in _ATTEMPT_STATES
    )
    found.extend(
        _v(rule, f"provider job {j.id}", f"unknown normalized_status {j.normalized_status!r}")
        for j in snap.jobs
        if j.normalized_status not in _ATTEMPT_STATES
    )
    live: dict[int, list[AttemptRow]] = defaultdict(list)
    for a in snap.attempts:
        if a.status in _ATTEMPT_STATES and a.status not in _TERMINAL_ATTEMPT:
            live[a.task_id].append(a)
    for t in snap.tasks:
        subject = f"task {t.id} ({t.status})"
        attempts = live.get(t.id, [])
        names = [f"{a.id}:{a.status}" for a in attempts]
        if is_terminal_task(t.status):
            unsettled = [
                f"{a.id}:{a.status}"
                for a in attempts
                if a.status in _IN_FLIGHT or a.id not in awaiting_submit
            ]
            if unsettled:
                what = "in flight" if any(a.status in _IN_FLIGHT for a in attempts) else "unsent"
                found.append(_v(rule, subject, f"terminal task with attempts {what}: {unsettled}"))
        elif len(attempts) > 1:
            found.append(_v(rule, subject, f"{len(attempts)} live attempts: {names}"))
    return found


def _awaiting_submit(snap: Snapshot) -> set[int]:
    """Ids of attempts an undone ``attempt.submit`` message still names."""
    named = (
        int_or_none(m.payload.get("attempt_id")) or int_or_none(m.aggregate_id)
        for m in snap.undone_outbox
        if m.topic == Topic.SUBMIT
    )
    return {attempt_id for attempt_id in named if attempt_id is not None}


def check_quiescent(snap: Snapshot) -> list[Violation]:
    """I10: every task is terminal; an undone outbox message belongs to a terminal task."""
    rule = Invariant.I10_QUIESCENT
    found = [
        _v(rule, f"task {t.id}", f"not terminal: {t.status}")
        for t in snap.tasks
        if not is_terminal_task(t.status)
    ]
    status = {t.id: t.status for t in snap.tasks}
    owner = {a.id: a.task_id for a in snap.attempts}
    for message in snap.undone_outbox:
        subject = f"outbox {message.id} ({message.topic})"
        task_id = _task_of(message, owner)
        if task_id is None or task_id not in status:
            found.append(_v(rule, subject, "undone and not tied to any known task"))
        elif not is_terminal_task(status[task_id]):
            found.append(_v(rule, subject, f"undone for live task {task_id}"))
    return found


def _task_of(message: OutboxRow, attempt_task: dict[int, int]) -> int | None:
    """The task a message is about: its payload's task_id, else via attempt or aggregate id."""
    task_id = int_or_none(message.payload.get("task_id"))
    if task_id is not None:
        return task_id
    attempt_id = int_or_none(message.payload.get("attempt_id"))
    aggregate = int_or_none(message.aggregate_id)
    if attempt_id is None and not message.topic.startswith("task."):
        attempt_id = aggregate
    if attempt_id is not None:
        return attempt_task.get(attempt_id)
    return aggregate
