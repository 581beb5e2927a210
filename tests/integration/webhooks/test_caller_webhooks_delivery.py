"""Caller webhooks delivered to a receiver this test runs (issue 13's Done-when).

Messages come from the real path: CreateTask with a webhook through `TaskService`, then a
cancel that ends the task, whose CANCELLED event writes the message in its transaction. The
delivery worker POSTs to an HTTP server on 127.0.0.1; its configuration must allow loopback
(and plain http) for that, which the refusal test shows is not the default.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import dataclasses
import itertools
import json
import random
import secrets
import ssl
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import httpx
import pytest
from sqlalchemy import func, select
from standardwebhooks.webhooks import Webhook, WebhookVerificationError

from controlplane.domain.outbox import Topic
from controlplane.domain.webhooks import DeliveryState, WebhookSubscription
from controlplane.persistence.database import Database
from controlplane.persistence.models import generation_tasks
from controlplane.persistence.webhooks import DeliveryRecord, WebhookStore
from controlplane.service.tasks import CreateTaskInput, TaskService
from controlplane.service.webhooks import WebhookSubscriptions
from controlplane.wakeups import LocalWakeBus
from controlplane.webhooks.config import TenantWebhooks, WebhookPolicy
from controlplane.webhooks.delivery import DeliveryConfig, WebhookDeliveryWorker
from tests.integration.persistence.builders import make_spec
from tests.support.pki import make_pki
from tests.support.webhook_receiver import ENDLESS_FOR_S, Answer, WebhookReceiver
from vidroute_core.exceptions import InvalidSpec

pytestmark = [pytest.mark.timeout(60)]

TENANT = "tenant-a"
SECRET = "whsec_" + base64.b64encode(secrets.token_bytes(32)).decode()
FAST = DeliveryConfig(
    max_attempts=4,
    base_delay_s=0.4,
    multiplier=3.0,
    max_delay_s=60.0,
    request_timeout_s=0.5,
    connect_timeout_s=0.5,
    claim_lease_s=5.0,
    idle_s=0.02,
)


LONG_CLAIM = dataclasses.replace(FAST, claim_lease_s=120.0)


def policy(*, allow_private: bool) -> WebhookPolicy:
    return WebhookPolicy(
        {TENANT: TenantWebhooks(SECRET)}, allow_http=True, allow_private=allow_private
    )


async def cancelled_task(db: Database, url: str, pol: WebhookPolicy) -> int:
    """A task subscribed to `url`, created and cancelled: one task.cancelled message."""
    service = TaskService(db, webhooks=WebhookSubscriptions(pol))
    record, _ = await service.create_task(
        CreateTaskInput(
            make_spec(TENANT), f"key-{secrets.token_hex(4)}", webhook=WebhookSubscription(url)
        )
    )
    await service.cancel_task(record.id, "caller changed its mind")
    return record.id


async def until(
    check: Callable[[], Awaitable[list[DeliveryRecord]]],
    done: Callable[[list[DeliveryRecord]], bool],
    timeout_s: float = 20.0,
) -> list[DeliveryRecord]:
    """Poll `check` until `done` holds, failing after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while True:
        found = await check()
        if done(found):
            return found
        assert time.monotonic() < deadline, f"condition not met: {found}"
        await asyncio.sleep(0.02)


@contextlib.asynccontextmanager
async def running(
    db: Database, pol: WebhookPolicy, config: DeliveryConfig = FAST
) -> AsyncIterator[WebhookDeliveryWorker]:
    async with httpx.AsyncClient() as http:
        worker = WebhookDeliveryWorker(
            WebhookStore(db), pol, http, config=config, rng=random.Random(7)
        )
        worker.start()
        try:
            yield worker
        finally:
            await worker.stop()


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"], indirect=True)
async def test_a_delivered_message_verifies_with_the_reference_algorithm(db: Database) -> None:
    """The POST carries the Standard Webhooks headers, and `Webhook.verify` accepts it."""
    async with WebhookReceiver([Answer(200)]) as receiver:
        task_id = await cancelled_task(db, receiver.url, policy(allow_private=True))
        async with running(db, policy(allow_private=True)):
            (got,) = await receiver.wait_requests(1, timeout_s=20)
            store = WebhookStore(db)
            (delivery,) = await until(
                lambda: store.deliveries(task_id),
                lambda d: bool(d) and d[0].state is DeliveryState.DELIVERED,
            )
    assert (got.method, got.path) == ("POST", "/hook")
    assert got.headers["webhook-id"] == delivery.id
    assert delivery.id.startswith("msg_")
    assert got.headers["webhook-signature"].startswith("v1,")
    payload = Webhook(SECRET).verify(got.body, got.headers)
    assert payload["type"] == "task.cancelled"
    assert payload["data"]["task_id"] == str(task_id)
    assert payload["data"]["state"] == "CANCELLED"
    assert payload["data"]["reason"] == "caller changed its mind"
    other = "whsec_" + base64.b64encode(secrets.token_bytes(32)).decode()
    with pytest.raises(WebhookVerificationError):
        Webhook(other).verify(got.body, got.headers)  # the check can fail: it is the key
    assert [(a.attempt_no, a.status_code, a.error) for a in delivery.attempts] == [(1, 200, "")]


LAG_S = 5.0  # how late a due retry may be sent on a loaded machine


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
async def test_a_failing_receiver_gets_retries_with_growing_delays(db: Database) -> None:
    """500s are retried; each gap is within its jitter bounds and longer than the one before,
    and after the last attempt the message is FAILED with every attempt recorded."""
    async with WebhookReceiver([Answer(500)]) as receiver:
        task_id = await cancelled_task(db, receiver.url, policy(allow_private=True))
        async with running(db, policy(allow_private=True)):
            got = await receiver.wait_requests(FAST.max_attempts, timeout_s=30)
            store = WebhookStore(db)
            (delivery,) = await until(
                lambda: store.deliveries(task_id),
                lambda d: bool(d) and d[0].state is DeliveryState.FAILED,
            )
        assert len(receiver.requests) == FAST.max_attempts  # no attempt after the last
    gaps = [b.at - a.at for a, b in itertools.pairwise(got)]
    retry = FAST.retry
    for n, gap in enumerate(gaps, start=1):
        # Never early (the lower half of the jitter is exact); late only by the worker's wake-up
        # lag, which on a loaded 2-core machine reached 1.5 s (CI at load 20).
        assert retry.ceiling(n) / 2 <= gap <= retry.ceiling(n) + LAG_S, (n, gaps)
    assert gaps == sorted(gaps), gaps
    assert {r.headers["webhook-id"] for r in got} == {delivery.id}
    assert [a.status_code for a in delivery.attempts] == [500] * FAST.max_attempts
    assert [a.attempt_no for a in delivery.attempts] == [1, 2, 3, 4]
    assert all("HTTP 500" in a.error for a in delivery.attempts)


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
async def test_a_retried_delivery_carries_the_same_webhook_id(db: Database) -> None:
    """A receiver answering after the sender's timeout gets the message again, with the same
    webhook-id and body, so it can deduplicate; the second answer delivers it."""
    slow = Answer(200, delay_s=FAST.request_timeout_s * 3)
    async with WebhookReceiver([slow, Answer(200)]) as receiver:
        task_id = await cancelled_task(db, receiver.url, policy(allow_private=True))
        async with running(db, policy(allow_private=True)):
            first, second = await receiver.wait_requests(2, timeout_s=20)
            store = WebhookStore(db)
            (delivery,) = await until(
                lambda: store.deliveries(task_id),
                lambda d: bool(d) and d[0].state is DeliveryState.DELIVERED,
            )
    assert first.headers["webhook-id"] == second.headers["webhook-id"] == delivery.id
    assert first.body == second.body
    for request in (first, second):
        Webhook(SECRET).verify(request.body, request.headers)
    assert delivery.attempts[0].status_code == 0
    assert "timed out" in delivery.attempts[0].error
    assert delivery.attempts[1].status_code == 200


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
@pytest.mark.parametrize("host", ["127.0.0.1", "localhost"])
async def test_a_loopback_receiver_is_refused_by_default(db: Database, host: str) -> None:
    """With the default policy (no private addresses) a receiver on loopback, by address or by
    name, is never connected to: the message is REFUSED with the reason as its attempt. (The
    task is created where private receivers were allowed: under the default policy CreateTask
    already refuses these URLs, see the next test; the send-time check is what holds for a name
    whose addresses change after CreateTask, or a policy tightened since.)"""
    async with WebhookReceiver([Answer(200)]) as receiver:
        url = f"http://{host}:{receiver.port}/hook"
        task_id = await cancelled_task(db, url, policy(allow_private=True))
        async with running(db, policy(allow_private=False)):
            store = WebhookStore(db)
            (delivery,) = await until(
                lambda: store.deliveries(task_id),
                lambda d: bool(d) and d[0].state is DeliveryState.REFUSED,
            )
        assert receiver.connections == 0
        assert receiver.requests == []
    (attempt,) = delivery.attempts
    assert attempt.status_code == 0
    assert "loopback" in attempt.error
    assert delivery.next_attempt_at is None


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
@pytest.mark.parametrize(
    "host", ["127.0.0.1", "localhost", "[::1]", "10.1.2.3", "[::ffff:192.168.0.7]", "169.254.1.1"]
)
async def test_create_task_refuses_a_private_literal_receiver(db: Database, host: str) -> None:
    """Under the default policy a webhook URL whose host is a private or loopback IP literal, or
    localhost, is INVALID_ARGUMENT on webhook.url at CreateTask and no task is written; allowed
    once the policy allows private receivers."""
    url = f"http://{host}:8080/hook"
    with pytest.raises(InvalidSpec) as refused:
        await cancelled_task(db, url, policy(allow_private=False))
    assert [v.field for v in refused.value.violations] == ["webhook.url"]
    assert "never called" in refused.value.violations[0].description
    async with db.reading() as conn:
        assert (
            await conn.execute(select(func.count()).select_from(generation_tasks))
        ).scalar() == 0
    assert await cancelled_task(db, url, policy(allow_private=True)) > 0


@pytest.mark.parametrize("backend", ["postgresql"], indirect=True)
async def test_two_workers_never_send_one_message_twice(db: Database) -> None:
    """Two workers on one PostgreSQL claim disjoint messages (SKIP LOCKED): each of several
    messages reaches the receiver exactly once."""
    pol = policy(allow_private=True)
    async with WebhookReceiver([Answer(200, delay_s=0.05)]) as receiver:
        tasks = [await cancelled_task(db, receiver.url, pol) for _ in range(12)]
        store = WebhookStore(db)
        async with httpx.AsyncClient() as http:
            workers = [
                # A claim that outlives any loaded-machine batch: an expired claim is re-sent by
                # design (at least once), which is not what this test is about.
                WebhookDeliveryWorker(store, pol, http, config=LONG_CLAIM, rng=random.Random(i))
                for i in range(2)
            ]
            for worker in workers:
                worker.start()
            try:
                await receiver.wait_requests(len(tasks), timeout_s=20)
                for task_id in tasks:
                    await until(
                        lambda t=task_id: store.deliveries(t),  # type: ignore[misc]  # defaults bind the loop variables; mypy cannot infer lambda defaults
                        lambda d: bool(d) and d[0].state is DeliveryState.DELIVERED,
                    )
            finally:
                for worker in workers:
                    await worker.stop()
    ids = [r.headers["webhook-id"] for r in receiver.requests]
    assert len(ids) == len(set(ids)) == len(tasks)
    bodies = {json.loads(r.body)["data"]["task_id"] for r in receiver.requests}
    assert bodies == {str(t) for t in tasks}


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
async def test_a_committed_message_wakes_the_idle_worker(db: Database) -> None:
    """The terminal event's commit wakes the delivery worker through the wake-up bus: with a
    30 s idle pause the message still arrives within seconds."""
    bus = LocalWakeBus()
    db = db.notifying(bus.notify)
    await bus.start()
    pol = policy(allow_private=True)
    slow_poll = dataclasses.replace(FAST, idle_s=30.0)
    try:
        async with WebhookReceiver([Answer(200)]) as receiver:
            async with running(db, pol, slow_poll) as worker:
                bus.subscribe(Topic.WEBHOOK, worker.wake)
                deadline = time.monotonic() + 10
                while worker.rounds < 1:  # its first claim found nothing: idle for 30 s now
                    assert time.monotonic() < deadline
                    await asyncio.sleep(0.01)
                started = time.monotonic()
                await cancelled_task(db, receiver.url, pol)
                # Order, not speed: delivered before the idle pause could have ended it.
                await receiver.wait_requests(1, timeout_s=slow_poll.idle_s)
            assert time.monotonic() - started < slow_poll.idle_s
    finally:
        await bus.close()


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
async def test_https_goes_to_the_checked_address_and_verifies_the_name(
    db: Database, tmp_path: Path
) -> None:
    """Over https the worker connects to the address it checked and verifies the certificate
    against the URL's name (SNI), not the address: a name the certificate lacks fails, though
    the certificate also lists 127.0.0.1."""
    pki = make_pki(tmp_path / "pki")
    served = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    served.load_cert_chain(pki.server.cert_file, pki.server.key_file)
    trusted = ssl.create_default_context(cafile=str(pki.ca.cert_file))
    pol = policy(allow_private=True)
    looked_up: list[str] = []

    async def resolve(host: str, port: int) -> list[str]:
        looked_up.append(host)
        return ["127.0.0.1"]  # neither name is in DNS: only this resolver knows them

    async with WebhookReceiver([Answer(200)], tls=served) as receiver:
        port = receiver.port
        good = await cancelled_task(db, f"https://adapter-veo:{port}/hook", pol)
        wrong = await cancelled_task(db, f"https://hooks.invalid:{port}/hook", pol)
        async with httpx.AsyncClient(verify=trusted) as http:
            worker = WebhookDeliveryWorker(
                WebhookStore(db), pol, http, config=FAST, rng=random.Random(1), resolve=resolve
            )
            assert await worker.run_once() == 2
        (got,) = receiver.requests
    assert got.headers["host"] == f"adapter-veo:{port}"
    Webhook(SECRET).verify(got.body, got.headers)
    store = WebhookStore(db)
    (delivered,) = await store.deliveries(good)
    assert delivered.state is DeliveryState.DELIVERED
    (failed,) = await store.deliveries(wrong)
    assert failed.state is DeliveryState.PENDING  # retried later: a certificate can be fixed
    assert "CERTIFICATE_VERIFY_FAILED" in failed.attempts[0].error
    assert sorted(looked_up) == ["adapter-veo", "hooks.invalid"]


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
async def test_an_address_without_a_listener_falls_back_to_the_next_one(db: Database) -> None:
    """A name whose preferred address takes no connection (an IPv6 address on a host without
    IPv6 routes) is delivered to its next address in the same attempt, in the resolver's order:
    the first address is tried first even where it sorts after the second."""
    pol = policy(allow_private=True)
    tried: list[str] = []

    async def resolve(host: str, port: int) -> list[str]:
        return ["127.0.0.3", "127.0.0.2"]  # nothing listens on .3; the receiver is on .2

    async with WebhookReceiver([Answer(200)], host="127.0.0.2") as receiver:
        port = receiver.port
        task_id = await cancelled_task(db, f"http://hooks.example:{port}/hook", pol)

        async def record(request: httpx.Request) -> None:
            tried.append(request.url.host)

        async with httpx.AsyncClient(event_hooks={"request": [record]}) as http:
            worker = WebhookDeliveryWorker(
                WebhookStore(db), pol, http, config=FAST, rng=random.Random(3), resolve=resolve
            )
            assert await worker.run_once() == 1
        (got,) = receiver.requests
    assert tried == ["127.0.0.3", "127.0.0.2"]
    assert got.headers["host"] == f"hooks.example:{port}"
    Webhook(SECRET).verify(got.body, got.headers)
    (delivery,) = await WebhookStore(db).deliveries(task_id)
    assert delivery.state is DeliveryState.DELIVERED
    assert [(a.attempt_no, a.status_code) for a in delivery.attempts] == [(1, 200)]


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
@pytest.mark.parametrize(
    ("answer", "error"),
    [
        (Answer(500, endless_body=True), "HTTP 500: xxxx"),
        (Answer(200, trickle_headers=True), "timed out"),
    ],
    ids=["endless-body", "trickled-headers"],
)
async def test_a_receiver_that_never_finishes_its_answer_cannot_hold_the_worker(
    db: Database, answer: Answer, error: str
) -> None:
    """An answer whose body never ends is read only as far as the error keeps (200 bytes), and
    one trickled a byte at a time (each read within the timeout) is cut at the request's
    timeout: the attempt ends in about a second (FAST), a retry scheduled, not after the
    receiver's 30 s."""
    pol = policy(allow_private=True)
    async with WebhookReceiver([answer]) as receiver:
        task_id = await cancelled_task(db, receiver.url, pol)
        async with httpx.AsyncClient() as http:
            worker = WebhookDeliveryWorker(
                WebhookStore(db), pol, http, config=FAST, rng=random.Random(5)
            )
            started = time.monotonic()
            assert await worker.run_once() == 1
            took = time.monotonic() - started
    assert took < ENDLESS_FOR_S, took  # cut, not read to the end of the receiver's 30 s
    (delivery,) = await WebhookStore(db).deliveries(task_id)
    (attempt,) = delivery.attempts
    assert delivery.state is DeliveryState.PENDING
    assert attempt.error.startswith(error), attempt.error
    assert len(attempt.error) <= len("HTTP 500: ") + 200
