"""Rules about attempts, provider jobs, costs and route decisions (9.3.4 #1, #2, #3, #6, #7).

Pure functions over a `Snapshot`: no I/O, so every rule can be reasoned about row by row. Each
returns the violations it found, tagged with its stable `Invariant` id. The database already
enforces some of these with constraints (UNIQUE job per attempt, UNIQUE account + job id); the
rules check them again because the checker exists to catch what slipped past everything else: a
migration that dropped a constraint, a hand edit, a bug in a path that bypasses the unit of work.
"""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from controlplane.audit.report import Invariant, Violation
from controlplane.domain.states import AttemptState
from controlplane.persistence.snapshot import AttemptRow, Snapshot

__all__ = [
    "check_attempt_binding",
    "check_attempt_numbering",
    "check_cost_accounting",
    "check_job_never_overwritten",
    "check_one_job_per_attempt",
    "check_route_decisions",
    "dense_gap",
    "int_or_none",
    "is_int",
    "non_empty",
]

_CURRENCY = re.compile(r"[A-Z]{3}")
_ATTEMPT_EVENTS = frozenset({"attempt.created", "attempt.state_changed"})


def is_int(value: object) -> bool:
    """A real integer (bool is an int in Python, but never a count of micros)."""
    return isinstance(value, int) and not isinstance(value, bool)


def non_empty(value: object) -> bool:
    """A non-blank string, or a non-empty JSON object / array."""
    if isinstance(value, str):
        return bool(value.strip())
    if isinstance(value, Mapping | Sequence):
        return len(value) > 0
    return False


def dense_gap(numbers: Iterable[int]) -> str | None:
    """Why `numbers` is not exactly 1..n (duplicates, gaps, a bad start), or None if it is."""
    got = sorted(numbers)
    want = list(range(1, len(got) + 1))
    return None if got == want else f"numbers {got} are not 1..{len(got)}"


def _v(invariant: Invariant, subject: str, detail: str) -> Violation:
    return Violation(invariant.value, subject, detail)


def check_attempt_binding(snap: Snapshot) -> list[Violation]:
    """I1: one account, model and compile plan per attempt, agreed on by its job and history."""
    rule = Invariant.I1_ATTEMPT_BINDING
    accounts = {a.id for a in snap.accounts}
    attempts = {a.id: a for a in snap.attempts}
    found: list[Violation] = []
    for a in snap.attempts:
        subject = f"attempt {a.id} (task {a.task_id})"
        if a.provider_account_id is None or a.provider_account_id not in accounts:
            found.append(_v(rule, subject, f"unknown provider account {a.provider_account_id}"))
        if not non_empty(a.provider_model):
            found.append(_v(rule, subject, "provider_model is empty"))
        if not (isinstance(a.compile_plan, Mapping) and a.compile_plan):
            found.append(_v(rule, subject, f"compile_plan is empty: {a.compile_plan!r}"))
    for job in snap.jobs:
        owner = attempts.get(job.attempt_id)
        if owner is not None and job.provider_account_id != owner.provider_account_id:
            found.append(
                _v(
                    rule,
                    f"provider job {job.id} (attempt {owner.id})",
                    f"job is on account {job.provider_account_id}, "
                    f"attempt on {owner.provider_account_id}",
                )
            )
    # The attempt's own events recorded its account and model; a later row that disagrees was
    # re-pointed in place instead of failing over to a new attempt.
    for event in snap.events:
        if event.kind not in _ATTEMPT_EVENTS:
            continue
        owner = attempts.get(int_or_none(event.payload.get("attempt_id")) or -1)
        if owner is None:
            continue
        for key, current in (
            ("provider_account_id", owner.provider_account_id),
            ("provider_model", owner.provider_model),
        ):
            if key in event.payload and event.payload[key] != current:
                found.append(
                    _v(
                        rule,
                        f"attempt {owner.id} (task {owner.task_id})",
                        f"{key} is {current!r} but event {event.kind} #{event.seq} "
                        f"recorded {event.payload[key]!r}",
                    )
                )
    return found


def check_attempt_numbering(snap: Snapshot) -> list[Violation]:
    """I2: attempt_no is 1..n per task, so a failover added an attempt instead of reusing one."""
    per_task: dict[int, list[int]] = defaultdict(list)
    for a in snap.attempts:
        per_task[a.task_id].append(a.attempt_no)
    found: list[Violation] = []
    for task_id, numbers in sorted(per_task.items()):
        gap = dense_gap(numbers)
        if gap is not None:
            found.append(_v(Invariant.I2_ATTEMPT_NUMBERING, f"task {task_id}", f"attempt {gap}"))
    return found


def check_one_job_per_attempt(snap: Snapshot) -> list[Violation]:
    """I2b: an attempt has at most one provider job, and every job belongs to an attempt."""
    rule = Invariant.I2B_ONE_JOB_PER_ATTEMPT
    attempts = {a.id for a in snap.attempts}
    jobs_of: dict[int, list[str]] = defaultdict(list)
    found: list[Violation] = []
    for job in snap.jobs:
        jobs_of[job.attempt_id].append(job.provider_job_id)
        if job.attempt_id not in attempts:
            found.append(_v(rule, f"provider job {job.id}", f"no attempt {job.attempt_id}"))
    for attempt_id, job_ids in sorted(jobs_of.items()):
        if len(job_ids) > 1:
            found.append(
                _v(rule, f"attempt {attempt_id}", f"{len(job_ids)} provider jobs: {job_ids}")
            )
    return found


def check_job_never_overwritten(snap: Snapshot) -> list[Violation]:
    """I3: the recorded job of an attempt never changes; a job id names one job per account."""
    rule = Invariant.I3_JOB_NEVER_OVERWRITTEN
    found: list[Violation] = []
    stored: dict[int, set[str]] = defaultdict(set)
    for job in snap.jobs:
        stored[job.attempt_id].add(job.provider_job_id)
    recorded: dict[int, list[str]] = defaultdict(list)
    for event in snap.events:
        if event.kind == "provider_job.recorded":
            attempt_id = int_or_none(event.payload.get("attempt_id"))
            if attempt_id is not None:
                recorded[attempt_id].append(str(event.payload.get("provider_job_id")))
    for attempt_id, names in sorted(recorded.items()):
        distinct = sorted(set(names))
        if len(distinct) > 1:
            found.append(
                _v(rule, f"attempt {attempt_id}", f"events recorded several jobs: {distinct}")
            )
        elif attempt_id in stored and distinct[0] not in stored[attempt_id]:
            held = sorted(stored[attempt_id])
            found.append(
                _v(
                    rule,
                    f"attempt {attempt_id}",
                    f"events recorded job {distinct[0]!r}, the rows hold {held}",
                )
            )
    keys = Counter((job.provider_account_id, job.provider_job_id) for job in snap.jobs)
    for (account, job_id), n in sorted(keys.items()):
        if n > 1:
            found.append(
                _v(rule, f"account {account} job {job_id!r}", f"stored {n} times (must be unique)")
            )
    found.extend(
        _v(rule, f"provider job {job.id}", "provider_job_id is empty")
        for job in snap.jobs
        if not non_empty(job.provider_job_id)
    )
    return found


def check_cost_accounting(snap: Snapshot) -> tuple[list[Violation], int]:
    """I6: integer micros >= 0 and an ISO-4217 currency on every attempt; no float columns.

    Also returns how many SUCCEEDED attempts with a provider job have no actual cost yet. That is
    a count, not a violation: the engine records ``actual_cost_micros`` only when the provider
    reports a cost with the job status, and the daily bill reconciliation (9.23.3) fills in the
    rest later, so an unset actual cost is "not settled yet", not "accounted elsewhere".
    """
    rule = Invariant.I6_COST_PER_ATTEMPT
    found = [
        _v(rule, column, "money column is not an integer type")
        for column in snap.non_integer_money_columns
    ]
    with_job = {job.attempt_id for job in snap.jobs}
    unsettled = 0
    for a in snap.attempts:
        subject = f"attempt {a.id} (task {a.task_id})"
        if not (is_int(a.estimated_cost_micros) and a.estimated_cost_micros >= 0):
            found.append(
                _v(rule, subject, f"estimated_cost_micros {a.estimated_cost_micros!r} invalid")
            )
        actual = a.actual_cost_micros
        if actual is not None and not (is_int(actual) and actual >= 0):
            found.append(_v(rule, subject, f"actual_cost_micros {actual!r} invalid"))
        if not (isinstance(a.currency, str) and _CURRENCY.fullmatch(a.currency)):
            found.append(_v(rule, subject, f"currency {a.currency!r} is not ISO-4217"))
        if a.status == AttemptState.SUCCEEDED.value and a.id in with_job and actual is None:
            unsettled += 1
    return found, unsettled


def check_route_decisions(snap: Snapshot) -> list[Violation]:
    """I7: each attempt has its own explained decision of its task; decision_no is 1..n."""
    rule = Invariant.I7_ROUTE_DECISION_EXPLAINED
    decisions = {d.id: d for d in snap.decisions}
    found: list[Violation] = []
    users: dict[int, list[AttemptRow]] = defaultdict(list)
    for a in snap.attempts:
        subject = f"attempt {a.id} (task {a.task_id})"
        decision = decisions.get(a.route_decision_id) if a.route_decision_id is not None else None
        if decision is None:
            found.append(_v(rule, subject, f"no route decision ({a.route_decision_id})"))
            continue
        users[decision.id].append(a)
        if decision.task_id != a.task_id:
            found.append(
                _v(rule, subject, f"route decision {decision.id} is of task {decision.task_id}")
            )
    for decision_id, sharing in sorted(users.items()):
        if len(sharing) > 1:
            ids = [a.id for a in sharing]
            found.append(_v(rule, f"route decision {decision_id}", f"shared by attempts {ids}"))
    per_task: dict[int, list[int]] = defaultdict(list)
    for d in snap.decisions:
        per_task[d.task_id].append(d.decision_no)
        subject = f"route decision {d.id} (task {d.task_id})"
        for name, value in (
            ("candidate_snapshot", d.candidate_snapshot),
            ("reason_code", d.reason_code),
            ("policy_version", d.policy_version),
        ):
            if not non_empty(value):
                found.append(_v(rule, subject, f"{name} is empty: {value!r}"))
    for task_id, numbers in sorted(per_task.items()):
        gap = dense_gap(numbers)
        if gap is not None:
            found.append(_v(rule, f"task {task_id}", f"decision {gap}"))
    return found


def int_or_none(value: Any) -> int | None:
    """An id read from a JSON payload: an int, or a string of digits; else None."""
    if is_int(value):
        return int(value)
    if isinstance(value, str) and value.isdigit():
        return int(value)
    return None
