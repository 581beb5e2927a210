"""Every submit boundary of design 9.25.3, through real processes: emulator -> sidecar -> control
plane on PostgreSQL (and SQLite) with Redis leases, on production terms.

Production terms: each sidecar runs its shipped config, the control plane its defaults, the
emulators answer like the real providers (no emulator-only route), and every duration of the
run (timeouts, deadlines, polling, recovery windows, job times, fault durations) is multiplied
by one factor, `TIME_SCALE`, so every deadline keeps its production order.

Each case injects one fault into a provider emulator, creates one task pinned to that provider
(STRICT_MODEL), waits for a terminal state and then compares three views: the control plane's
GetTask, its persisted event history, and the emulator's truth (every job it really created).
In every "may have been accepted" case the proof is the same: exactly one provider job exists
for the attempt, no new attempt was created while the first one was unknown, and the job is
adopted (SUCCEEDED with an MP4 that really is 4 s long) when something can name it: the
self-hosted API's idempotency key and listing, or the sidecar's submit journal for a Runway
answer that arrived while the control plane was down or its database away. The Runway/Veo cases
that nothing can name end ABANDONED: tests/e2e/test_unknown_submits.py.
"""

from __future__ import annotations

import asyncio
import secrets
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from sqlalchemy import text

from tests.conftest import PostgresServer
from tests.support.evidence import audit, task_events, wait_for_a_refused_submit
from tests.support.module_stack import module_database, started_platform
from tests.support.stack import (
    UNRESOLVABLE_URL,
    ControlPlane,
    ProviderFarm,
    RedisDb,
    describe,
    local_path,
    probe_mp4,
    wait_for,
)
from tests.support.workload import POLL_ROUTE, SUBMIT_ROUTE
from vidroute.common.v1 import error_pb2 as errors_pb2
from vidroute.scheduler.v1 import scheduler_pb2 as sp

pytestmark = [pytest.mark.e2e, pytest.mark.postgres, pytest.mark.redis, pytest.mark.timeout(180)]

UNKNOWN = "SUBMIT_UNKNOWN"
FRAME_TOLERANCE = 1.0  # frames
TIME_SCALE = 0.02
# Production seconds. Self-hosted's shipped submit_read is 30 s, Runway's 60 s.
STALL_PAST_SELFHOSTED_READ_S = 45.0
STALL_WITHIN_RUNWAY_READ_S = 40.0
# A network blip the shipped retry policy rides out: each attempt's own retries (~3.5-7 s), a
# requeue backoff (5-10 s), a second attempt whose sends trip the breaker (8 consecutive
# failures), the breaker's 30 s cooldown: the third attempt comes >= ~42 s after the first send.
REFUSED_FOR_S = 30.0
# An outage that outlasts all of it: the third attempt also fails, MAX_TOTAL_ATTEMPTS (3) ends it.
REFUSED_LONG_S = 300.0
# Longer than any test waits: the test ends the refusal itself (`_refuse` restarts the window).
REFUSED_UNTIL_REOPENED_S = 100 * REFUSED_LONG_S
MAX_TOTAL_ATTEMPTS = 3  # FailoverLimits' shipped default


class Stack:
    """One farm and one control plane shared by a module's tests (reset between tests)."""

    def __init__(self, farm: ProviderFarm, cp: ControlPlane, redis: RedisDb) -> None:
        self.farm = farm
        self.cp = cp
        self.redis = redis

    def run(
        self, provider: str, faults: list[dict[str, Any]], timeout_s: float = 60.0
    ) -> tuple[sp.Task, list[dict[str, Any]]]:
        """Reset the emulators, add `faults`, run one pinned task to a terminal state."""
        self.farm.reset()
        if faults:
            self.farm.emulator(provider).add_faults(faults)
        prompt = f"a red kite over a green hill {secrets.token_hex(4)}"
        task_id = self.cp.create_task(provider, prompt=prompt)
        task = self.cp.wait_terminal(task_id, timeout_s)
        return task, self.farm.truth(provider)

    def history(self, task: sp.Task) -> list[tuple[str, dict[str, Any]]]:
        return task_events(self.cp.database_url, task.task_id)

    def assert_clean(self) -> None:
        report = audit(self.cp.database_url, self.redis.url)
        assert report.ok, report.render()


@pytest.fixture(scope="module")
def stack(
    e2e_backend: str,
    postgres_server: PostgresServer,
    redis_server_url: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Stack]:
    """Emulators, sidecars and a control plane on a fresh database, for one module."""
    workdir = tmp_path_factory.mktemp(f"boundaries-{e2e_backend}")
    with (
        module_database(postgres_server, e2e_backend, workdir) as url,
        started_platform(workdir, url, redis_server_url, time_scale=TIME_SCALE) as platform,
    ):
        yield Stack(*platform)


def _states(history: list[tuple[str, dict[str, Any]]], attempt_id: str) -> list[str]:
    """The states an attempt went through, in order, from the persisted history."""
    states = []
    for kind, payload in history:
        if str(payload.get("attempt_id", "")) != attempt_id:
            continue
        if kind in ("attempt.created", "attempt.state_changed"):
            states.append(str(payload["state"]))
    return states


def _assert_mp4(task: sp.Task, seconds: float = 4.0) -> None:
    duration, fps = probe_mp4(local_path(task.output.uri))
    assert abs(duration - seconds) <= FRAME_TOLERANCE / fps, (duration, fps)


def _assert_recovered(stack: Stack, task: sp.Task, truth: list[dict[str, Any]]) -> None:
    """The "may have been accepted" proof: one job, no new attempt, recovered job adopted."""
    shown = describe(task)
    assert len(truth) == 1, f"provider jobs created: {truth}"
    assert len(task.attempts) == 1, f"a new attempt was created:\n{shown}"
    [attempt] = task.attempts
    history = stack.history(task)
    states = _states(history, attempt.attempt_id)
    assert UNKNOWN in states, f"the fault did not make the submit unknown: {states}"
    assert task.state == sp.TASK_STATE_SUCCEEDED, shown
    assert attempt.state == sp.ATTEMPT_STATE_SUCCEEDED, shown
    assert task.adopted_attempt_id == attempt.attempt_id
    assert attempt.provider_job.provider_job_id == truth[0]["id"]
    _assert_mp4(task)
    stack.assert_clean()


# -- provably not accepted: retry is safe ----------------------------------------------------


@pytest.mark.parametrize(
    "base_url",
    [
        pytest.param(UNRESOLVABLE_URL, id="dns-failure"),
        # TEST-NET-1 (RFC 5737): never routed, so the connect attempt never completes.
        pytest.param("http://192.0.2.1:9", id="connect-timeout"),
    ],
)
def test_failure_before_connect_is_retried_and_never_unknown(
    base_url: str,
    tmp_path: Path,
    fresh_postgres_url: str,
    redis_db: RedisDb,
) -> None:
    """A submit that never reached the provider (DNS, connect) is retried, never made UNKNOWN."""
    farm_dir = tmp_path / "farm"
    with ProviderFarm(
        farm_dir, time_scale=TIME_SCALE, base_urls={"runway": base_url}, providers=["runway"]
    ) as farm:
        cp = ControlPlane(
            tmp_path / "cp", farm, database_url=fresh_postgres_url, redis_url=redis_db.url
        )
        (tmp_path / "cp").mkdir()
        cp.start()
        try:
            task = cp.wait_terminal(cp.create_task("runway"), timeout_s=90)
            history = task_events(fresh_postgres_url, task.task_id)
            assert farm.truth("runway") == []
            assert task.state == sp.TASK_STATE_FAILED, describe(task)
            for attempt in task.attempts:
                states = _states(history, attempt.attempt_id)
                assert UNKNOWN not in states, states
                assert attempt.error.error_class != errors_pb2.ERROR_CLASS_SUBMISSION_UNKNOWN
            assert task.failure.error_class != errors_pb2.ERROR_CLASS_SUBMISSION_UNKNOWN
            report = audit(fresh_postgres_url, redis_db.url)
            assert report.ok, report.render()
        finally:
            cp.kill()


def _refuse(stack: Stack, provider: str, production_s: float) -> None:
    """Reset the emulators, then refuse every connection to `provider` for `production_s`."""
    stack.farm.reset()
    emulator = stack.farm.emulator(provider)
    emulator.call(emulator.emulator.refuse_connections, stack.farm.seconds(production_s) * 1000)


def _listening(url: str) -> bool:
    """Whether the emulator behind `url` accepts TCP connections again."""
    parts = urlsplit(url)
    try:
        with socket.create_connection((parts.hostname or "127.0.0.1", parts.port or 80), 0.5):
            return True
    except OSError:
        return False


def _assert_refused_attempts(stack: Stack, task: sp.Task) -> None:
    """Every attempt that did not succeed was refused before sending: FAILED, never UNKNOWN."""
    history = stack.history(task)
    for attempt in task.attempts:
        assert UNKNOWN not in _states(history, attempt.attempt_id), describe(task)
        if attempt.state != sp.ATTEMPT_STATE_SUCCEEDED:
            assert attempt.state == sp.ATTEMPT_STATE_FAILED, describe(task)
            assert attempt.error.error_class == errors_pb2.ERROR_CLASS_TRANSIENT_NETWORK


@pytest.mark.parametrize("provider", ["runway", "self_hosted"])
def test_refused_connection_at_the_only_candidate_is_ridden_out_with_one_job(
    stack: Stack, provider: str
) -> None:
    """ECONNREFUSED proves nothing was sent: a 30 s refusal at the only candidate is retried
    (each attempt with its own key, new attempts on the same candidate paced by backoff and its
    breaker) until it succeeds, with exactly one provider job.

    The refusal holds until the first submit has hit it, then 30 s more: the control plane's
    own CPU time from CreateTask to the first submit does not shrink with the time scale, so a
    window opened before CreateTask could close before the submit is ever refused."""
    _refuse(stack, provider, REFUSED_UNTIL_REOPENED_S)
    task_id = stack.cp.create_task(provider, prompt=f"refused {secrets.token_hex(4)}")
    wait_for_a_refused_submit(stack.cp.database_url, task_id, 30)
    _refuse(stack, provider, REFUSED_FOR_S)  # the window restarts now
    task = stack.cp.wait_terminal(task_id, 60)
    truth = stack.farm.truth(provider)
    assert task.state == sp.TASK_STATE_SUCCEEDED, describe(task)
    assert len(truth) == 1
    first = _states(stack.history(task), task.attempts[0].attempt_id)
    # The refusal was really hit: the first attempt was re-sent, or ended and a new one came.
    assert len(task.attempts) > 1 or first.count("SUBMITTING") > 1, first
    assert len(task.attempts) <= MAX_TOTAL_ATTEMPTS
    _assert_refused_attempts(stack, task)
    _assert_mp4(task)
    stack.assert_clean()


# -- may have been accepted: UNKNOWN, recovery, never a second job ---------------------------


def test_body_half_written_is_unknown_until_proven_absent(stack: Stack) -> None:
    """A body cut in half is UNKNOWN; only after recovery proves no job exists (the self-hosted
    listing by key) may a new attempt (or the idempotent re-send) create the one job.
    """
    provider = "self_hosted"
    task, truth = stack.run(
        provider, [{"route": SUBMIT_ROUTE[provider], "action": "drop_after_partial_body"}]
    )
    shown = describe(task)
    assert task.state == sp.TASK_STATE_SUCCEEDED, shown
    assert len(truth) == 1, truth
    history = stack.history(task)
    first = task.attempts[0]
    assert UNKNOWN in _states(history, first.attempt_id)
    if len(task.attempts) > 1:
        # The new attempt was created only after the first left SUBMIT_UNKNOWN (proven absent).
        mine = [
            (i, p["state"])
            for i, (kind, p) in enumerate(history)
            if kind == "attempt.state_changed" and str(p["attempt_id"]) == first.attempt_id
        ]
        became_unknown = next(n for n, (_, state) in enumerate(mine) if state == UNKNOWN)
        left_unknown = mine[became_unknown + 1][0]
        created = [
            i
            for i, (kind, p) in enumerate(history)
            if kind == "attempt.created" and str(p.get("attempt_id")) != first.attempt_id
        ]
        assert all(i > left_unknown for i in created), history
        assert first.state == sp.ATTEMPT_STATE_FAILED, shown
    adopted = next(a for a in task.attempts if a.attempt_id == task.adopted_attempt_id)
    assert adopted.provider_job.provider_job_id == truth[0]["id"]
    _assert_mp4(task)
    stack.assert_clean()


@pytest.mark.parametrize("provider", ["self_hosted"])
@pytest.mark.parametrize(
    "fault",
    [
        pytest.param(
            {"action": "stall_response", "seconds": STALL_PAST_SELFHOSTED_READ_S},
            id="read-timeout-after-body",
        ),
        pytest.param({"action": "drop_after_body"}, id="reset-after-body"),
        pytest.param({"action": "corrupt_json"}, id="2xx-corrupt-json"),
        pytest.param({"action": "missing_id"}, id="2xx-without-job-id"),
    ],
)
def test_maybe_accepted_submit_recovers_the_one_job(
    stack: Stack, provider: str, fault: dict[str, Any]
) -> None:
    """The job the provider created behind a lost answer is recovered and adopted, never
    submitted twice and never replaced by a new attempt.
    """
    if "seconds" in fault:
        fault = {**fault, "seconds": stack.farm.seconds(fault["seconds"])}
    task, truth = stack.run(provider, [{"route": SUBMIT_ROUTE[provider], **fault}])
    _assert_recovered(stack, task, truth)


def _block_database(url: str, allow: bool) -> None:
    """Refuse (or allow again) every connection to the test database, dropping existing ones."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.pool import NullPool

    parsed = make_url(url)
    admin = parsed.set(database="postgres")

    async def go() -> None:
        from sqlalchemy.ext.asyncio import create_async_engine

        engine = create_async_engine(admin, isolation_level="AUTOCOMMIT", poolclass=NullPool)
        try:
            async with engine.connect() as conn:
                flag = "true" if allow else "false"
                await conn.execute(
                    text(f'ALTER DATABASE "{parsed.database}" ALLOW_CONNECTIONS {flag}')
                )
                if not allow:
                    await conn.execute(
                        text(
                            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                            "WHERE datname = :d AND pid <> pg_backend_pid()"
                        ),
                        {"d": parsed.database},
                    )
        finally:
            await engine.dispose()

    asyncio.run(go())


def test_database_failure_after_job_id_is_recovered(stack: Stack) -> None:
    """PostgreSQL goes away between Runway's job id and its commit: the attempt is settled as
    UNKNOWN later and the job adopted from the sidecar's submit journal, never re-submitted.
    """
    if not stack.cp.database_url.startswith("postgresql"):
        pytest.skip("blocks PostgreSQL connections")
    provider = "runway"
    stack.farm.reset()
    emulator = stack.farm.emulator(provider)
    # The job is created at once, the answer (with its id) 40 s later: the window we cut.
    stall = stack.farm.seconds(STALL_WITHIN_RUNWAY_READ_S)
    emulator.add_faults(
        {"route": SUBMIT_ROUTE[provider], "action": "stall_response", "seconds": stall}
    )
    proc = stack.cp.proc
    assert proc is not None
    log_mark = len(proc.log())
    task_id = stack.cp.create_task(provider, prompt=f"db failure {secrets.token_hex(4)}")
    wait_for(emulator.truth, timeout_s=30, what="the provider job")
    _block_database(stack.cp.database_url, allow=False)
    try:
        wait_for(
            lambda: "execution step submit failed" in proc.log()[log_mark:],
            timeout_s=20,
            what="the submit outcome failing to commit",
        )
    finally:
        _block_database(stack.cp.database_url, allow=True)
    task = stack.cp.wait_terminal(task_id, 90)
    _assert_recovered(stack, task, emulator.truth())


def test_crash_after_job_created_is_recovered(stack: Stack) -> None:
    """SIGKILL of the control plane once Runway created the job (its answer still in flight):
    after a restart the job is adopted from the sidecar's submit journal, never submitted again.
    """
    provider = "runway"
    stack.farm.reset()
    emulator = stack.farm.emulator(provider)
    stall = stack.farm.seconds(STALL_WITHIN_RUNWAY_READ_S)
    emulator.add_faults(
        {"route": SUBMIT_ROUTE[provider], "action": "stall_response", "seconds": stall}
    )
    task_id = stack.cp.create_task(provider, prompt=f"crash {secrets.token_hex(4)}")
    wait_for(emulator.truth, timeout_s=30, what="the provider job")
    stack.cp.kill()
    stack.cp.start()
    task = stack.cp.wait_terminal(task_id, 90)
    _assert_recovered(stack, task, emulator.truth())


# -- callbacks and statuses ------------------------------------------------------------------


@pytest.mark.parametrize(
    "action", ["callback_before_response", "callback_twice", "callback_out_of_order"]
)
def test_callback_faults_end_in_one_adopted_result(stack: Stack, action: str) -> None:
    """Early, duplicated and reordered webhooks neither create work nor move a task backwards."""
    task, truth = stack.run(
        "self_hosted", [{"route": SUBMIT_ROUTE["self_hosted"], "action": action}]
    )
    assert task.state == sp.TASK_STATE_SUCCEEDED, describe(task)
    assert len(truth) == 1
    assert [a.state for a in task.attempts] == [sp.ATTEMPT_STATE_SUCCEEDED]
    history = stack.history(task)
    task_states = [p["state"] for k, p in history if k == "task.state_changed"]
    assert task_states.count("SUCCEEDED") == 1, task_states
    assert task_states[-1] == "SUCCEEDED", task_states
    deliveries = stack.farm.emulator("self_hosted").call(
        lambda: list(stack.farm.emulator("self_hosted").emulator.callbacks.deliveries)
    )
    assert deliveries, "the emulator sent no webhook"
    _assert_mp4(task)
    stack.assert_clean()


@pytest.mark.parametrize("provider", ["runway", "self_hosted"])
def test_unknown_provider_status_keeps_polling(stack: Stack, provider: str) -> None:
    """A status the adapter has never seen is not terminal: polling continues to SUCCEEDED."""
    task, truth = stack.run(
        provider,
        [
            {
                "route": POLL_ROUTE[provider],
                "action": "unknown_status",
                "value": "WARMING_UP",
                "polls": 3,
            }
        ],
    )
    assert task.state == sp.TASK_STATE_SUCCEEDED, describe(task)
    assert len(truth) == 1
    assert len(task.attempts) == 1
    _assert_mp4(task)
    stack.assert_clean()


@pytest.mark.parametrize("provider", ["runway", "self_hosted"])
def test_expired_output_url_is_refreshed(stack: Stack, provider: str) -> None:
    """An output link that is already expired is refreshed from the provider, not re-generated."""
    task, truth = stack.run(
        provider, [{"route": POLL_ROUTE[provider], "action": "expire_output", "polls": 1}]
    )
    assert task.state == sp.TASK_STATE_SUCCEEDED, describe(task)
    assert len(truth) == 1
    assert len(task.attempts) == 1
    _assert_mp4(task)
    stack.assert_clean()


def test_veo_output_is_stored(stack: Stack) -> None:
    """A Veo job that succeeded is stored and adopted: its Gemini file URI needs the API key,
    which only the sidecar holds, so the control plane downloads it through FetchOutput."""
    task, truth = stack.run("google", [])
    assert len(truth) == 1
    assert len(task.attempts) == 1
    assert task.state == sp.TASK_STATE_SUCCEEDED, describe(task)
    _assert_mp4(task)
    stack.assert_clean()


@pytest.mark.timeout(300)
@pytest.mark.parametrize("provider", ["runway", "self_hosted"])
def test_refusal_past_the_retry_policy_fails_with_its_true_class(
    stack: Stack, provider: str
) -> None:
    """A refusal that outlasts the retry policy ends the task FAILED at MAX_TOTAL_ATTEMPTS with
    TRANSIENT_NETWORK (never NO_ELIGIBLE_CANDIDATE for the candidate it kept), and no job.

    The refusal lasts until the task has ended (at least 300 s): the control plane's own CPU
    time between attempts does not shrink with the time scale, so a fixed scaled window could
    end on a loaded machine before the third attempt is refused."""
    _refuse(stack, provider, REFUSED_UNTIL_REOPENED_S)
    task_id = stack.cp.create_task(provider, prompt=f"refused long {secrets.token_hex(4)}")
    started = time.monotonic()
    try:
        # Three attempts' sends, requeues and the breaker's cooldown: seconds when scaled, but
        # each refused send still costs real CPU in three processes (120 s at load 20).
        task = stack.cp.wait_terminal(task_id, 120)
        assert stack.farm.truth(provider) == []
        assert task.state == sp.TASK_STATE_FAILED, describe(task)
        assert task.failure.error_class == errors_pb2.ERROR_CLASS_TRANSIENT_NETWORK, describe(task)
        assert "MAX_TOTAL_ATTEMPTS" in task.failure.message, describe(task)
        assert "NO_ELIGIBLE_CANDIDATE" not in (task.failure.code + task.failure.message)
        assert len(task.attempts) == MAX_TOTAL_ATTEMPTS, describe(task)
        _assert_refused_attempts(stack, task)
    finally:
        # The next test needs the emulator back: reopen once 300 s (scaled) have passed.
        held = time.monotonic() - started
        _refuse(stack, provider, max(0.0, REFUSED_LONG_S - held / TIME_SCALE))
        url = stack.farm.emulator(provider).url
        wait_for(lambda: _listening(url), timeout_s=30, what=f"{provider} listening again")
    stack.assert_clean()
