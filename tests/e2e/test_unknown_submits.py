"""Submits that may have reached Runway or Veo, on the real providers' terms (9.17, 9.25.3).

Neither Runway nor the Gemini Veo API lists jobs or honours an idempotency key, and Runway's usage
rows are daily totals per model, so once a create's answer is lost nothing can prove the job
absent or name it: the attempt stays SUBMIT_UNKNOWN until the unknown-recovery deadline, then is
ABANDONED and the task FAILS with SUBMISSION_UNKNOWN (``allow_new_attempt_after_abandon`` is off
by default). Only the sidecar's submit journal can still name a job whose answer arrived after
the control plane gave up. The proof in every case: exactly one provider job (none if the body
never arrived) per task in the emulator's truth, one create request per task, no second attempt.

Shipped configs and control-plane defaults, every duration times one factor (`TIME_SCALE`):
the 1800 s deadline is 36 s here, so the abandon cases run together in one batch.
"""

from __future__ import annotations

import fnmatch
import json
import secrets
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from tests.conftest import PostgresServer
from tests.support.evidence import audit, task_events
from tests.support.module_stack import module_database, started_platform
from tests.support.stack import (
    ControlPlane,
    ProviderFarm,
    RedisDb,
    describe,
    wait_for,
)
from tests.support.workload import SUBMIT_ROUTE as ALL_SUBMIT_ROUTES
from vidroute.common.v1 import error_pb2
from vidroute.scheduler.v1 import scheduler_pb2 as sp

pytestmark = [pytest.mark.e2e, pytest.mark.postgres, pytest.mark.redis, pytest.mark.timeout(240)]

TIME_SCALE = 0.02
# The two providers whose submits take no idempotency key; the tests are parametrized over them.
SUBMIT_ROUTE = {p: ALL_SUBMIT_ROUTES[p] for p in ("runway", "google")}
# Production seconds: Runway's and Veo's shipped submit_read is 60 s.
STALL_PAST_SUBMIT_READ_S = 90.0
STALL_WITHIN_SUBMIT_READ_S = 40.0  # longer than the control plane's old fixed 30 s deadline
# (provider, fault, does the provider create a job?), in the order the creates will hit them.
# Two per provider: an account holds at most max(2, 5 % of its capacity) unknown submits at once
# (9.11.3), so two per provider is the most one unknown-recovery window can settle. The other
# boundaries on the same path (missing id, Runway's corrupt 2xx and read timeout) are the
# self-hosted cases of test_submit_boundaries and the soak's random faults.
BATCH: list[tuple[str, dict[str, Any], bool]] = [
    ("runway", {"action": "drop_after_body"}, True),
    ("runway", {"action": "drop_after_partial_body"}, False),
    ("google", {"action": "stall_response", "seconds": STALL_PAST_SUBMIT_READ_S}, True),
    ("google", {"action": "corrupt_json"}, True),
]


def _jobs_for(truth: list[dict[str, Any]], prompt: str) -> list[dict[str, Any]]:
    """The provider jobs whose create body carries `prompt` (prompts are unique per task)."""
    return [job for job in truth if prompt in json.dumps(job.get("body", {}))]


def _creates(farm: ProviderFarm, provider: str) -> int:
    """How many create requests the provider received (every one, faulted or not)."""
    stats: dict[str, int] = farm.emulator(provider).call(
        lambda: dict(farm.emulator(provider).emulator.counters)
    )
    method, _, pattern = SUBMIT_ROUTE[provider].partition(" ")
    return sum(n for key, n in stats.items() if fnmatch.fnmatch(key, f"{method} {pattern}"))


@dataclass
class Batch:
    """The abandon cases, created together so their 36 s deadlines run in parallel."""

    prompts: dict[tuple[str, int], str] = field(default_factory=dict)
    tasks: dict[tuple[str, int], sp.Task] = field(default_factory=dict)


class Stack:
    def __init__(self, farm: ProviderFarm, cp: ControlPlane, redis: RedisDb) -> None:
        self.farm, self.cp, self.redis = farm, cp, redis
        self._batch: Batch | None = None

    def batch(self) -> Batch:
        """Run the batch once: arm each fault on its provider's Nth create, create the tasks.

        Each task is created once the previous task's fault has fired, so the Nth task is the
        one the Nth fault hit; all four then wait out the unknown-recovery deadline together.
        """
        if self._batch is not None:
            return self._batch
        batch = Batch()
        created: dict[tuple[str, int], str] = {}
        for provider in ("google", "runway"):
            emulator = self.farm.emulator(provider)
            cases = [fault for p, fault, _ in BATCH if p == provider]
            offset = len(emulator.call(emulator.emulator.faults))
            rules = []
            for n, fault in enumerate(cases, 1):
                rule = {"route": SUBMIT_ROUTE[provider], "nth": n, **fault}
                if "seconds" in rule:
                    rule["seconds"] = self.farm.seconds(rule["seconds"])
                rules.append(rule)
            emulator.add_faults(rules)
            for n in range(1, len(cases) + 1):
                prompt = f"unknown {provider} {n} {secrets.token_hex(4)} kite"
                batch.prompts[(provider, n)] = prompt
                created[(provider, n)] = self.cp.create_task(provider, prompt=prompt)
                index = offset + n - 1
                wait_for(
                    lambda i=index, e=emulator: e.call(e.emulator.faults)[i]["fired"] >= 1,  # type: ignore[misc]  # defaults bind the loop variables; mypy cannot infer lambda defaults
                    timeout_s=90,
                    what=f"{provider} fault {n} fired",
                )
        for key, task_id in created.items():
            batch.tasks[key] = self.cp.wait_terminal(task_id, timeout_s=90)
        self._batch = batch
        return batch


@pytest.fixture(scope="module")
def stack(
    postgres_server: PostgresServer, redis_server_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Stack]:
    """Runway and Veo emulators answering like the real APIs, shipped sidecars, a control plane."""
    workdir = tmp_path_factory.mktemp("unknown-submits")
    with (
        module_database(postgres_server, "postgresql", workdir) as url,
        started_platform(
            workdir, url, redis_server_url, time_scale=TIME_SCALE, providers=("runway", "google")
        ) as platform,
    ):
        yield Stack(*platform)


def _states(stack: Stack, task: sp.Task, attempt: sp.Attempt) -> list[str]:
    return [
        str(p["state"])
        for kind, p in task_events(stack.cp.database_url, task.task_id)
        if kind in ("attempt.created", "attempt.state_changed")
        and str(p.get("attempt_id", "")) == attempt.attempt_id
    ]


def test_stall_past_the_old_deadline_but_within_submit_read_is_adopted(stack: Stack) -> None:
    """A Runway create that answers after 40 s (past the control plane's old 30 s deadline,
    within the sidecar's 60 s submit_read) is adopted: task SUCCEEDED, exactly one provider job.
    """
    farm, provider = stack.farm, "runway"
    creates = _creates(farm, provider)
    farm.emulator(provider).add_faults(
        {
            "route": SUBMIT_ROUTE[provider],
            "action": "stall_response",
            "seconds": farm.seconds(STALL_WITHIN_SUBMIT_READ_S),
        }
    )
    prompt = f"stalled 40 s {secrets.token_hex(4)} kite"
    task = stack.cp.wait_terminal(stack.cp.create_task(provider, prompt=prompt), timeout_s=60)
    jobs = _jobs_for(farm.truth(provider), prompt)
    shown = describe(task)
    assert len(jobs) == 1, f"provider jobs for the task: {jobs}"
    assert _creates(farm, provider) == creates + 1, "a second create was sent"
    assert task.state == sp.TASK_STATE_SUCCEEDED, shown
    assert len(task.attempts) == 1, shown
    assert task.attempts[0].provider_job.provider_job_id == jobs[0]["id"], shown


@pytest.mark.parametrize("provider", list(SUBMIT_ROUTE))
def test_unknown_submit_ends_abandoned_with_at_most_the_one_job(
    stack: Stack, provider: str
) -> None:
    """Every may-have-been-accepted create (body cut, reset after body, read timeout, corrupt
    2xx) becomes UNKNOWN, is never re-sent or failed over, and ends ABANDONED with
    the task FAILED(SUBMISSION_UNKNOWN); the provider holds exactly the one job it created.
    """
    batch = stack.batch()
    cases = [(fault, creates_job) for p, fault, creates_job in BATCH if p == provider]
    order = [(provider, n) for n in range(1, len(cases) + 1)]
    truth = stack.farm.truth(provider)
    for key, (fault, creates_job) in zip(order, cases, strict=True):
        task, prompt = batch.tasks[key], batch.prompts[key]
        shown = f"{fault['action']}:\n{describe(task)}"
        jobs = _jobs_for(truth, prompt)
        assert len(jobs) == (1 if creates_job else 0), f"{shown}\njobs: {jobs}"
        assert len(task.attempts) == 1, f"a new attempt was created: {shown}"
        [attempt] = task.attempts
        assert "SUBMIT_UNKNOWN" in _states(stack, task, attempt), shown
        assert attempt.state == sp.ATTEMPT_STATE_ABANDONED, shown
        assert task.state == sp.TASK_STATE_FAILED, shown
        assert task.failure.error_class == error_pb2.ERROR_CLASS_SUBMISSION_UNKNOWN, shown
        assert not attempt.provider_job.provider_job_id, f"adopted a job it cannot name: {shown}"
    assert _creates(stack.farm, provider) >= len(cases)


def test_runway_drop_after_body_with_daily_usage_and_404_never_submits_twice(
    stack: Stack,
) -> None:
    """Scenario 1 of the issue: drop_after_body on a Runway create, usage rows that are daily
    totals, a 404 for any id that is not a job: one job in the emulator's truth, the task FAILED
    with SUBMISSION_UNKNOWN, the attempt ABANDONED, no failover and no second create.
    """
    batch = stack.batch()
    first = next(fault for p, fault, _ in BATCH if p == "runway")
    assert first["action"] == "drop_after_body"
    key = ("runway", 1)  # the first Runway create got drop_after_body
    task, prompt = batch.tasks[key], batch.prompts[key]
    shown = describe(task)
    truth = stack.farm.truth("runway")
    assert len(_jobs_for(truth, prompt)) == 1, truth
    assert [a.state for a in task.attempts] == [sp.ATTEMPT_STATE_ABANDONED], shown
    assert task.failure.error_class == error_pb2.ERROR_CLASS_SUBMISSION_UNKNOWN, shown
    counters: dict[str, int] = stack.farm.emulator("runway").call(
        lambda: dict(stack.farm.emulator("runway").emulator.counters)
    )
    polled = {k.split(" /v1/tasks/", 1)[1] for k in counters if k.startswith("GET /v1/tasks/")}
    named = {job["id"] for job in truth}
    assert polled <= named, f"polled ids that are no job (a guess): {polled - named}"
    # Each Runway create of this module is one task's; the stall test's task made the other.
    tasks_seen = len([k for k in batch.tasks if k[0] == "runway"]) + 1
    assert _creates(stack.farm, "runway") == tasks_seen, counters


def test_the_batch_leaves_every_invariant_intact(stack: Stack) -> None:
    """After the abandon batch, the invariant checker over database and leases finds nothing."""
    stack.batch()
    report = audit(stack.cp.database_url, stack.redis.url)
    assert report.ok, report.render()
