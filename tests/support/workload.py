"""Seeded random workloads for the soak and crash tests: tasks, faults, cancels, and the checks.

A `Workload` draws, from one `random.Random`, which provider each task is pinned to, which fault
(if any) is armed on that provider's emulator just before the task is created, and whether the
task is cancelled a little later. The same seed gives the same plan; the interleaving with the
control plane's own timing is of course not replayed. Fault and cancel times are production
seconds, multiplied by the farm's one time scale.

On real-provider terms a Runway or Veo create whose answer is lost cannot be proven absent or
named (no listing, no idempotency key), so such a task may end FAILED(SUBMISSION_UNKNOWN) with
its attempt ABANDONED and the provider's job unrecorded. `check_truth` compares the emulators'
truth with GetTask: every job a provider really created is recorded by exactly one attempt or
is the one job of an ABANDONED attempt of its task (matched by the task's unique prompt); any
other job is a duplicate (created twice for one task or attempt) or a lost one.
"""

from __future__ import annotations

import json
import random
import secrets
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any

from tests.support.evidence import task_events
from tests.support.stack import ControlPlane, ProviderFarm
from vidroute.common.v1 import error_pb2
from vidroute.scheduler.v1 import scheduler_pb2 as sp

SUBMIT_ROUTE = {
    "runway": "POST /v1/text_to_video",
    "google": "POST /v1beta/models/*:predictLongRunning",
    "self_hosted": "POST /v1/jobs",
}
POLL_ROUTE = {
    "runway": "GET /v1/tasks/*",
    "google": "GET /v1beta/models/*/operations/*",
    "self_hosted": "GET /v1/jobs/*",
}
CALLBACK_PROVIDERS = frozenset({"self_hosted"})
# Providers whose submit neither takes an idempotency key nor can be searched (provider-apis §5):
# a lost answer there is never proven absent, so the task may end FAILED(SUBMISSION_UNKNOWN).
UNNAMEABLE_PROVIDERS = frozenset({"runway", "google"})
# Faults after which the create may have been accepted without its answer (9.17.3).
MAYBE_ACCEPTED = frozenset(
    {"drop_after_partial_body", "drop_after_body", "stall_response", "corrupt_json", "missing_id"}
)
# Production seconds (times the farm's scale): a stall past every shipped submit_read (30-60 s),
# one within it, how long a refused port stays closed.
STALL_PAST_READ_S = 90.0
STALL_WITHIN_READ_S = 20.0
REFUSED_FOR_S = 15.0

# (name, weight, rule builder or None for "no fault"); a builder gets (provider, rng). The rule's
# action is the name unless the builder sets one. Faults that make a Runway/Veo create unknown
# are rarer there: an account holds at most two unknown submits (9.11.3) for the whole 1800 s
# recovery window, which is most of a modest run.
FAULTS: list[tuple[str, int, Any]] = [
    ("none", 8, None),
    ("refuse_connection", 1, "refuse"),
    ("drop_after_partial_body", 2, lambda p, r: {"route": SUBMIT_ROUTE[p]}),
    ("drop_after_body", 2, lambda p, r: {"route": SUBMIT_ROUTE[p]}),
    ("stall_response", 2, lambda p, r: {"route": SUBMIT_ROUTE[p], "seconds": STALL_PAST_READ_S}),
    (
        "slow_response",
        2,
        lambda p, r: {
            "route": SUBMIT_ROUTE[p],
            "action": "stall_response",
            "seconds": STALL_WITHIN_READ_S,
        },
    ),
    ("corrupt_json", 2, lambda p, r: {"route": SUBMIT_ROUTE[p]}),
    ("missing_id", 1, lambda p, r: {"route": SUBMIT_ROUTE[p]}),
    (
        "status",
        2,
        lambda p, r: {"route": SUBMIT_ROUTE[p], "code": r.choice([429, 503]), "retry_after": 1},
    ),
    ("unknown_status", 1, lambda p, r: {"route": POLL_ROUTE[p], "value": "WARMING_UP"}),
    ("expire_output", 1, lambda p, r: {"route": POLL_ROUTE[p]}),
    ("throttle_polls", 1, lambda p, r: {"route": POLL_ROUTE[p], "n": 2}),
    (
        "fail_job",
        1,
        lambda p, r: {
            "route": SUBMIT_ROUTE[p],
            "code": "INTERNAL.BAD_OUTPUT" if p == "runway" else "INTERNAL",
        },
    ),
    ("callback_twice", 1, lambda p, r: {"route": SUBMIT_ROUTE[p]}),
    ("callback_out_of_order", 1, lambda p, r: {"route": SUBMIT_ROUTE[p]}),
    ("callback_before_response", 1, lambda p, r: {"route": SUBMIT_ROUTE[p]}),
]
CALLBACK_FAULTS = frozenset({"callback_twice", "callback_out_of_order", "callback_before_response"})


def _weight(name: str, weight: int, provider: str) -> int:
    if provider in UNNAMEABLE_PROVIDERS and name in MAYBE_ACCEPTED:
        return 1
    return weight


@dataclass
class Planned:
    """One task of the plan and what happened to it."""

    index: int
    provider: str
    fault: str
    cancel_after_s: float | None
    prompt: str
    task_id: str = ""


@dataclass
class Workload:
    """The plan of a seeded run over `providers`."""

    seed: int
    size: int
    providers: tuple[str, ...]
    cancel_share: float = 0.1
    tasks: list[Planned] = field(default_factory=list)

    def __post_init__(self) -> None:
        rng = random.Random(self.seed)
        self._rng = rng
        tag = secrets.token_hex(3)
        for i in range(self.size):
            provider = rng.choice(self.providers)
            names = [
                (name, _weight(name, weight, provider))
                for name, weight, _ in FAULTS
                if name not in CALLBACK_FAULTS or provider in CALLBACK_PROVIDERS
            ]
            fault = rng.choices([n for n, _ in names], [w for _, w in names])[0]
            # Production seconds after creation; scaled when the cancel is sent.
            cancel = rng.uniform(10.0, 150.0) if rng.random() < self.cancel_share else None
            self.tasks.append(Planned(i, provider, fault, cancel, f"soak {tag} #{i} kite"))
        self.armed: Counter[str] = Counter()

    def arm(self, farm: ProviderFarm, planned: Planned) -> None:
        """Add the planned fault to the provider's emulator (next matching request fires it)."""
        if planned.fault == "none":
            return
        self.armed[planned.fault] += 1
        emulator = farm.emulator(planned.provider)
        builder = next(b for n, _, b in FAULTS if n == planned.fault)
        if builder == "refuse":
            emulator.call(emulator.emulator.refuse_connections, farm.seconds(REFUSED_FOR_S) * 1000)
            return
        rule = {"action": planned.fault, **builder(planned.provider, self._rng)}
        if "seconds" in rule:
            rule["seconds"] = farm.seconds(rule["seconds"])
        emulator.add_faults(rule)

    def submit_all(
        self, farm: ProviderFarm, cp: ControlPlane, *, gap_s: tuple[float, float] = (0.0, 0.3)
    ) -> None:
        """Create every task (arming its fault first); cancel the chosen ones when due."""
        cancels: list[tuple[float, Planned]] = []
        for planned in self.tasks:
            self.arm(farm, planned)
            planned.task_id = cp.create_task(planned.provider, prompt=planned.prompt)
            if planned.cancel_after_s is not None:
                due = time.monotonic() + farm.seconds(planned.cancel_after_s)
                cancels.append((due, planned))
            self._cancel_due(cp, cancels)
            wait_until = time.monotonic() + self._rng.uniform(*gap_s)
            while time.monotonic() < wait_until:
                self._cancel_due(cp, cancels)
                time.sleep(0.02)
        while cancels:
            self._cancel_due(cp, cancels)
            time.sleep(0.05)

    @staticmethod
    def _cancel_due(cp: ControlPlane, cancels: list[tuple[float, Planned]]) -> None:
        now = time.monotonic()
        for entry in [c for c in cancels if c[0] <= now]:
            cancels.remove(entry)
            try:
                cp.cancel_task(entry[1].task_id)
            except Exception as exc:  # a task already terminal refuses the cancel
                if "FAILED_PRECONDITION" not in repr(exc):
                    raise

    def wait_all_terminal(self, cp: ControlPlane, timeout_s: float) -> dict[str, sp.Task]:
        """Every task terminal within `timeout_s` (one deadline for the whole run)."""
        deadline = time.monotonic() + timeout_s
        done: dict[str, sp.Task] = {}
        for planned in self.tasks:
            left = max(1.0, deadline - time.monotonic())
            done[planned.task_id] = cp.wait_terminal(planned.task_id, timeout_s=left)
        return done

    @property
    def prompts(self) -> dict[str, str]:
        """Task id -> its unique prompt (what finds its jobs in the emulators' truth)."""
        return {p.task_id: p.prompt for p in self.tasks}

    def summary(self, tasks: dict[str, sp.Task]) -> str:
        outcome: Counter[tuple[str, str, str]] = Counter()
        for planned in self.tasks:
            task = tasks[planned.task_id]
            state = sp.TaskState.Name(task.state).removeprefix("TASK_STATE_")
            if task.failure.code:
                state += f"/{task.failure.code}"
            outcome[(planned.provider, planned.fault, state)] += 1
        return "\n".join(
            f"  {p:<12} {f:<26} {s:<40} {n}" for (p, f, s), n in sorted(outcome.items())
        )


def jobs_of(farm: ProviderFarm, provider: str, prompt: str) -> list[dict[str, Any]]:
    """The provider's jobs whose create body carries `prompt` (unique per task)."""
    return [j for j in farm.truth(provider) if prompt in json.dumps(j.get("body", {}))]


@dataclass
class TruthReport:
    """What the emulators' truth says about the run; `problems` must be empty."""

    jobs: int = 0
    abandoned_jobs: int = 0  # jobs of ABANDONED attempts, which nothing could name
    duplicates: int = 0  # jobs beyond one per attempt that recorded it or was abandoned
    problems: list[str] = field(default_factory=list)


def check_truth(
    farm: ProviderFarm, tasks: dict[str, sp.Task], prompts: dict[str, str] | None = None
) -> TruthReport:
    """Compare every provider job with the attempts; `prompts` maps task id -> its prompt."""
    report = TruthReport()
    recorded: dict[tuple[str, str], str] = {}
    for task in tasks.values():
        for attempt in task.attempts:
            job_id = attempt.provider_job.provider_job_id
            if job_id:
                recorded[(attempt.provider, job_id)] = attempt.attempt_id
    unrecorded: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for provider in farm.providers:
        per_key: dict[str, list[str]] = defaultdict(list)
        for job in farm.truth(provider):
            report.jobs += 1
            if (provider, job["id"]) not in recorded:
                unrecorded[provider].append(job)
            key = job.get("idempotency_key") or job.get("client_key")
            if key:
                per_key[key].append(job["id"])
        for key, ids in per_key.items():
            if len(ids) > 1:
                report.duplicates += len(ids) - 1
                report.problems.append(f"{provider}: {len(ids)} jobs for one attempt key {key}")
    claimed: set[tuple[str, str]] = set()
    for task in tasks.values():
        prompt = (prompts or {}).get(task.task_id, "")
        mine = [
            (p, job)
            for p, jobs in unrecorded.items()
            for job in jobs
            if prompt and prompt in json.dumps(job.get("body", {}))
        ]
        abandoned = sum(a.state == sp.ATTEMPT_STATE_ABANDONED for a in task.attempts)
        for p, job in mine[:abandoned]:
            claimed.add((p, job["id"]))
            report.abandoned_jobs += 1
        if len(mine) > abandoned:
            report.duplicates += len(mine) - abandoned
    for provider, jobs in unrecorded.items():
        for job in jobs:
            if (provider, job["id"]) not in claimed:
                report.problems.append(
                    f"{provider} job {job['id']} was created but no attempt recorded it and no "
                    f"ABANDONED attempt of its task explains it (key={job.get('client_key')}, "
                    f"body={job.get('body')})"
                )
    return report


def assert_truth(
    farm: ProviderFarm, tasks: dict[str, sp.Task], prompts: dict[str, str] | None = None
) -> TruthReport:
    report = check_truth(farm, tasks, prompts)
    if report.problems or report.duplicates:
        raise AssertionError(f"{report.duplicates} duplicate jobs\n" + "\n".join(report.problems))
    return report


def faults_fired(farm: ProviderFarm) -> int:
    """How many fault rules fired on the emulators (refused connections not included)."""
    return sum(
        int(rule.get("fired", 0))
        for p in farm.providers
        for rule in farm.emulator(p).call(farm.emulator(p).emulator.faults)
    )


# Providers whose expire_output fault is final: the Veo emulator puts the job's files past
# retention (404 for good), so refreshing the job cannot help and the task rightly ends
# FAILED/OUTPUT_EXPIRED. Runway and self-hosted hand out fresh links on the next poll.
EXPIRY_IS_FINAL = frozenset({"google"})


def _failed_by_provider(farm: ProviderFarm, task: sp.Task) -> bool:
    """Did the provider itself fail one of the task's jobs (an injected fail_job)?

    A fault rule fires on the next matching request, which may belong to another task than the
    one it was armed for, so the emulator's truth says which job it landed on.
    """
    failed = {job["id"] for p in farm.providers for job in farm.truth(p) if job.get("failure")}
    return any(a.provider_job.provider_job_id in failed for a in task.attempts)


def _abandoned_unknown(task: sp.Task) -> bool:
    """FAILED(SUBMISSION_UNKNOWN) with its last attempt ABANDONED, what 9.17.5 prescribes; any
    earlier attempt ended FAILED (e.g. a submit a kill interrupted, proven never sent, requeued)."""
    states = [a.state for a in task.attempts]
    return (
        task.state == sp.TASK_STATE_FAILED
        and task.failure.error_class == error_pb2.ERROR_CLASS_SUBMISSION_UNKNOWN
        and bool(states)
        and states[-1] == sp.ATTEMPT_STATE_ABANDONED
        and all(s == sp.ATTEMPT_STATE_FAILED for s in states[:-1])
    )


def _interrupted_submit(history: list[tuple[str, dict[str, Any]]]) -> bool:
    """Did the control plane die inside this task's submit? A restarted submit worker finds the
    attempt still SUBMITTING with no job and marks it unknown at SUBMIT_INTERRUPTED."""
    return any(
        kind == "attempt.state_changed"
        and payload.get("state") == "SUBMIT_UNKNOWN"
        and "SUBMIT_INTERRUPTED" in str(payload.get("reason", ""))
        for kind, payload in history
    )


def unexplained_outcomes(
    workload: Workload, tasks: dict[str, sp.Task], farm: ProviderFarm, database_url: str
) -> list[str]:
    """Tasks that ended neither SUCCEEDED nor for a reason the run explains (faults armed)."""
    bad = []
    # An armed fault fires on the next matching request, whichever task it belongs to, so count
    # the final expiries armed per provider rather than matching them to tasks.
    final_expiries = Counter(
        p.provider
        for p in workload.tasks
        if p.fault == "expire_output" and p.provider in EXPIRY_IS_FINAL
    )
    # Likewise the may-have-been-accepted faults on providers where nothing can name the job.
    unnameable = Counter(
        p.provider
        for p in workload.tasks
        if p.fault in MAYBE_ACCEPTED and p.provider in UNNAMEABLE_PROVIDERS
    )
    for planned in workload.tasks:
        task = tasks[planned.task_id]
        if task.state == sp.TASK_STATE_SUCCEEDED:
            continue
        if task.state == sp.TASK_STATE_CANCELLED and planned.cancel_after_s is not None:
            continue
        if task.state == sp.TASK_STATE_FAILED and _failed_by_provider(farm, task):
            continue
        if task.failure.code == "OUTPUT_EXPIRED" and final_expiries[planned.provider] > 0:
            final_expiries[planned.provider] -= 1
            continue
        # A kill inside the submit explains itself first, so it never spends an armed fault's
        # allowance that a task which really met the fault needs.
        if (
            _abandoned_unknown(task)
            and planned.provider in UNNAMEABLE_PROVIDERS
            and _interrupted_submit(task_events(database_url, task.task_id))
        ):
            continue  # a kill landed inside its submit: may have been accepted, nothing names it
        if _abandoned_unknown(task) and unnameable[planned.provider] > 0:
            unnameable[planned.provider] -= 1
            continue
        errors = [(a.attempt_no, a.error.code, a.error.message) for a in task.attempts]
        bad.append(
            f"task {planned.task_id} ({planned.provider}, fault {planned.fault}, cancel "
            f"{planned.cancel_after_s}): {sp.TaskState.Name(task.state)} {task.failure.code} "
            f"{task.failure.message[:200]}; attempts {errors}; history:\n"
            + "\n".join(f"    {k} {p}" for k, p in task_events(database_url, task.task_id))
        )
    return bad
