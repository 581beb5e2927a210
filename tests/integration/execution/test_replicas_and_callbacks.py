"""Two replicas on one PostgreSQL, the signed callback endpoint, and the Redis lease store."""

from __future__ import annotations

import hashlib
import hmac
import json
import random
from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest

from controlplane.domain.states import AttemptState, TaskState
from controlplane.execution.callback_server import CallbackServer
from controlplane.execution.callbacks import SIGNATURE_HEADER, CallbackReceiver, CallbackVerifier
from controlplane.execution.config import ExecutionConfig
from controlplane.execution.engine import ExecutionEngine
from controlplane.leases.redis_store import RedisLeaseStore
from controlplane.persistence.database import Database
from controlplane.persistence.migrate import upgrade
from tests.integration.execution.exec_harness import Harness, _harness, wait_for
from vidroute_core.adapter import JobSnapshot, JobState, SubmitKind, SubmitOutcome, TransportStage
from vidroute_core.errors import ErrorClass, make_error

SECRET = "s3cret"


def sign(body: bytes, t: int, secret: str = SECRET) -> str:
    mac = hmac.new(secret.encode(), f"{t}.".encode() + body, hashlib.sha256).hexdigest()
    return f"t={t},v1={mac}"


@pytest.mark.postgres
async def test_two_replicas_process_each_message_once(fresh_postgres_url: str) -> None:
    """Two engines racing on one PostgreSQL submit every attempt exactly once."""
    async with _harness(fresh_postgres_url) as h:
        attempts = [await h.task_with_attempt() for _ in range(12)]
        other = ExecutionEngine(
            Database.from_url(fresh_postgres_url),
            {"runway": h.fake},
            config=ExecutionConfig(worker_id="w2", idle_sleep_s=0.01),
            leases=h.leases,
            fetch=h.fetch,
            clock=h.clock,
            rng=random.Random(3),
        )
        first = h.engine(worker_id="w1", idle_sleep_s=0.01)
        await first.start()
        await other.start()
        try:

            async def all_running() -> bool:
                details = [await h.detail(a.task_id) for a in attempts]
                return all(d.task.state is TaskState.RUNNING for d in details)

            await wait_for(all_running, what="every task RUNNING")
        finally:
            await first.stop()
            await other.stop()
            await other.db.dispose()
        keys = [c.client_request_key for c in h.fake.submit_calls]
        assert sorted(keys) == sorted(a.client_request_key for a in attempts)
        assert first.submitter.submits + other.submitter.submits == len(attempts)


async def test_callback_endpoint_verifies_and_applies(lite: Harness) -> None:
    """A signed POST wakes the normalizer via get_job; bad and stale signatures are rejected and
    counted.
    """
    attempt = await lite.task_with_attempt()
    lite.fake.script_submit(lite.fake.accepted("job-cb"))
    lite.fake.set_job("job-cb", JobSnapshot(JobState.RUNNING, "PROCESSING", '{"s":"PROCESSING"}'))
    engine = lite.engine()
    await engine.submitter.run_once()
    verifier = CallbackVerifier({"runway": SECRET}, clock=lite.clock)
    receiver = CallbackReceiver(verifier, engine.deps, engine.normalizer)
    server = CallbackServer()
    await server.start(receiver)
    now = int(lite.clock.now.timestamp())
    body = json.dumps({"id": "job-cb", "status": "PROCESSING"}).encode()
    try:
        async with httpx.AsyncClient() as client:
            url = f"{server.url}/callbacks/runway?attempt={attempt.id}"
            good = await client.post(url, content=body, headers={SIGNATURE_HEADER: sign(body, now)})
            dup = await client.post(url, content=body, headers={SIGNATURE_HEADER: sign(body, now)})
            bad = await client.post(
                url, content=body, headers={SIGNATURE_HEADER: sign(body, now, "x")}
            )
            stale = await client.post(
                url, content=body, headers={SIGNATURE_HEADER: sign(body, now - 3600)}
            )
    finally:
        await server.stop()
    assert (good.status_code, dup.status_code) == (204, 204)
    assert (bad.status_code, stale.status_code) == (401, 401)
    assert (verifier.accepted, verifier.bad_signature, verifier.stale) == (2, 1, 1)
    assert (await lite.attempt(attempt.id)).state is AttemptState.RUNNING
    assert len(await lite.reads.events(attempt_id=attempt.id)) == 1  # the duplicate deduplicated


def test_verifier_rejects_unknown_provider_and_garbage() -> None:
    """A callback for a provider without a secret, or without a parsable header, is refused."""
    clock = lambda: datetime(2026, 6, 24, tzinfo=UTC)  # noqa: E731 - a one-line fixed clock
    verifier = CallbackVerifier({"runway": SECRET}, clock=clock)
    assert not verifier.verify("veo", "t=1,v1=00", b"{}")
    assert not verifier.verify("runway", "nonsense", b"{}")
    assert (verifier.unknown_provider, verifier.bad_signature) == (1, 1)


@pytest.mark.redis
async def test_unknown_slot_accounting_on_redis(redis_server_url: str, tmp_path: Path) -> None:
    """With RedisLeaseStore an unknown submit moves its slot to the unknown budget and back when
    found.
    """
    from redis.asyncio import Redis

    from vidroute_core.adapter import JobRef, RecoverResult, RecoveryVerdict

    url = f"sqlite+aiosqlite:///{tmp_path / 'r.db'}"
    await upgrade(url)
    async with _harness(url) as h:
        client = Redis.from_url(redis_server_url)
        h.leases = RedisLeaseStore(client, namespace=f"exec-{random.randrange(10**9)}:")
        try:
            attempt = await h.task_with_attempt()
            h.fake.script_submit(
                SubmitOutcome(
                    SubmitKind.UNKNOWN,
                    error=make_error(ErrorClass.SUBMISSION_UNKNOWN, "T", "timeout"),
                    transport_stage=TransportStage.AWAIT_RESPONSE,
                )
            )
            h.fake.script_recover(RecoverResult(RecoveryVerdict.FOUND, job=JobRef("job-z", "prod")))
            engine = h.engine()
            await engine.run_until_idle()
            assert await h.used(attempt.provider_account_id) == (1, 1)
            h.clock.advance(10)
            await engine.run_until_idle()
            assert await h.used(attempt.provider_account_id) == (1, 0)
        finally:
            await client.aclose()
