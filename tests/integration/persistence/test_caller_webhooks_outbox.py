"""The caller-webhook outbox on both backends: CreateTask stores the subscription in its one
write (batched or alone), a subscribed event writes its message in the event's transaction, an
unsubscribed one writes nothing, and a refused subscription writes no task."""

from __future__ import annotations

import asyncio
import base64
import json
import secrets

import pytest
from sqlalchemy import func, select

from controlplane.domain.states import TaskState
from controlplane.domain.webhooks import WebhookSubscription
from controlplane.persistence import webhooks
from controlplane.persistence.database import Database
from controlplane.persistence.models import generation_tasks, webhook_messages
from controlplane.service.tasks import CreateTaskInput, TaskService
from controlplane.service.webhooks import WebhookSubscriptions
from controlplane.webhooks.config import TenantWebhooks, WebhookPolicy
from tests.integration.persistence.builders import NOW, make_spec
from vidroute_core.exceptions import InvalidSpec, PreconditionFailed

SECRET = "whsec_" + base64.b64encode(secrets.token_bytes(24)).decode()
HOOK = "https://hooks.example.com/vidroute"
DEFAULT = WebhookSubscription("https://default.example.com/in", ("task.progress",))
POLICY = WebhookPolicy(
    {
        "tenant-a": TenantWebhooks(SECRET),
        "tenant-d": TenantWebhooks(SECRET, DEFAULT),
    }
)


def service(db: Database) -> TaskService:
    return TaskService(db, webhooks=WebhookSubscriptions(POLICY))


async def create(
    svc: TaskService, webhook: WebhookSubscription | None, tenant: str = "tenant-a"
) -> int:
    record, _ = await svc.create_task(
        CreateTaskInput(make_spec(tenant), f"key-{secrets.token_hex(4)}", webhook=webhook)
    )
    return record.id


async def messages(db: Database, task_id: int) -> list[dict[str, object]]:
    async with db.reading() as conn:
        rows = await conn.execute(
            select(webhook_messages)
            .where(webhook_messages.c.task_id == task_id)
            .order_by(webhook_messages.c.event_seq)
        )
        return [dict(r) for r in rows.mappings()]


async def test_concurrent_creates_store_each_subscription(db: Database) -> None:
    """Creates written together (group commit) each keep their own webhook, read back as sent."""
    svc = service(db)
    subs = [
        WebhookSubscription(f"{HOOK}/{i}", ("task.state_changed",) if i % 2 else ())
        for i in range(6)
    ]
    ids = await asyncio.gather(*(create(svc, s) for s in subs), create(svc, None))
    for task_id, sub in zip(ids, [*subs, None], strict=True):
        detail = await svc.get_task(task_id)
        assert detail.task.webhook == sub


async def test_the_tenant_default_applies_when_none_is_named(db: Database) -> None:
    """A task of a tenant with a default webhook, naming none, is subscribed to the default."""
    svc = service(db)
    task_id = await create(svc, None, tenant="tenant-d")
    assert (await svc.get_task(task_id)).task.webhook == DEFAULT


async def test_a_terminal_event_writes_its_message_with_the_event(db: Database) -> None:
    """Cancelling a subscribed task writes one task.cancelled message; an unsubscribed task's
    cancel writes none."""
    svc = service(db)
    subscribed = await create(svc, WebhookSubscription(HOOK))
    plain = await create(svc, None)
    for task_id in (subscribed, plain):
        await svc.cancel_task(task_id, "not needed")
    (message,) = await messages(db, subscribed)
    assert await messages(db, plain) == []
    assert message["event_type"] == "task.cancelled"
    assert message["url"] == HOOK
    assert message["tenant_id"] == "tenant-a"
    assert message["state"] == "PENDING"
    assert message["attempts"] == 0
    assert str(message["id"]).startswith("msg_")
    body = json.loads(str(message["body"]))
    assert body["type"] == "task.cancelled"
    assert body["data"] == {
        "task_id": str(subscribed),
        "state": "CANCELLED",
        "status_version": 1,
        "reason": "not needed",
    }


async def test_state_changes_are_sent_only_to_those_who_asked(db: Database) -> None:
    """A non-terminal change writes a task.state_changed message only when it was named."""
    svc = service(db)
    asked = await create(svc, WebhookSubscription(HOOK, ("task.state_changed",)))
    terminal_only = await create(svc, WebhookSubscription(HOOK))
    for task_id in (asked, terminal_only):
        record = (await svc.get_task(task_id)).task
        async with db.unit(NOW) as u:
            assert await u.move_task(record, TaskState.SCHEDULING) is not None
    assert [m["event_type"] for m in await messages(db, asked)] == ["task.state_changed"]
    assert await messages(db, terminal_only) == []


@pytest.mark.parametrize(
    ("webhook", "fields"),
    [
        (WebhookSubscription("http://hooks.example.com/"), ["webhook.url"]),
        (WebhookSubscription(HOOK, ("task.progress", "task.boom")), ["webhook.events[1]"]),
    ],
)
async def test_a_bad_subscription_is_refused_and_writes_nothing(
    db: Database, webhook: WebhookSubscription, fields: list[str]
) -> None:
    """A malformed webhook is INVALID_ARGUMENT on its field, reported with the spec's own
    violations, and no task row is written."""
    svc = service(db)
    with pytest.raises(InvalidSpec) as caught:
        await svc.create_task(CreateTaskInput(make_spec(), "key-bad", webhook=webhook))
    assert [v.field for v in caught.value.violations] == fields
    assert await task_count(db) == 0


async def test_a_tenant_without_a_secret_cannot_subscribe(db: Database) -> None:
    """A webhook for a tenant with no signing secret is FAILED_PRECONDITION; nothing is written."""
    svc = service(db)
    with pytest.raises(PreconditionFailed, match="no webhook signing secret"):
        await svc.create_task(
            CreateTaskInput(make_spec("tenant-x"), "key-x", webhook=WebhookSubscription(HOOK))
        )
    assert await task_count(db) == 0
    await create(svc, None, tenant="tenant-x")  # without a webhook the tenant is fine
    assert await task_count(db) == 1


async def task_count(db: Database) -> int:
    async with db.reading() as conn:
        return int(await conn.scalar(select(func.count()).select_from(generation_tasks)) or 0)


async def test_bulk_events_write_messages_only_for_subscribers(db: Database) -> None:
    """The dispatcher's bulk events (one statement on PostgreSQL) write a message for each event
    a task is subscribed to, in its event's order, and nothing for the others."""
    svc = service(db)
    asked = await create(svc, WebhookSubscription(HOOK, ("task.state_changed",)))
    terminal_only = await create(svc, WebhookSubscription(HOOK))
    plain = await create(svc, None)
    events = [
        {"task_id": t, "seq": seq, "kind": kind, "payload": {"state": state}}
        for t in (asked, terminal_only, plain)
        for seq, kind, state in (
            (2, "task.state_changed", "SCHEDULING"),
            (3, "task.state_changed", "SUBMITTING"),
            (4, "attempt.created", "READY_TO_SUBMIT"),
        )
    ]
    async with db.unit(NOW) as u:
        await webhooks.enqueue_many(u.conn, events, NOW)
    found = await messages(db, asked)
    assert [(m["event_seq"], json.loads(str(m["body"]))["data"]["state"]) for m in found] == [
        (2, "SCHEDULING"),
        (3, "SUBMITTING"),
    ]
    assert await messages(db, terminal_only) == []
    assert await messages(db, plain) == []
