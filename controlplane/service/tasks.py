"""Task lifecycle operations of the public API (create, get, list, cancel).

Transport-neutral: takes domain inputs, returns persistence records, raises domain errors. Bad
input and requests the platform safety policy refuses (9.9.2) are rejected here before anything
is written, so neither leaves a row behind or reaches a provider. A created task carries its
queue and task deadlines (`controlplane.domain.deadlines`).
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import Enum
from typing import Protocol

from controlplane.capabilities.catalog import CapabilityCatalog
from controlplane.domain.deadlines import DeadlinePolicy, deadlines_for
from controlplane.domain.money import (
    BillingPolicies,
    BillingPolicy,
    Reservation,
    reservation_currency,
    task_reservation,
)
from controlplane.domain.safety import SafetyPolicy, ensure_allowed
from controlplane.domain.states import TASK_MACHINE, TaskState
from controlplane.domain.webhooks import WebhookSubscription
from controlplane.persistence import errors as store_errors
from controlplane.persistence.creates import CreateBatcher, NewTask
from controlplane.persistence.database import Database
from controlplane.persistence.records import TaskDetail, TaskEventRecord, TaskRecord
from controlplane.persistence.tasks import TaskQueries
from controlplane.persistence.webhooks import DeliveryRecord, WebhookStore
from controlplane.service.access import (
    SYSTEM,
    Caller,
    ensure_own_tenant,
    ensure_visible,
    list_scope,
)
from controlplane.service.tenants import TenantAdmission
from controlplane.service.webhooks import WebhookSubscriptions
from vidroute_core import tracing
from vidroute_core.exceptions import InvalidSpec, NotFound, PreconditionFailed
from vidroute_core.hashing import normalized_spec_hash
from vidroute_core.spec import GenerationSpec
from vidroute_core.validation import IDENTIFIER_RE, FieldViolation

MAX_IDEMPOTENCY_KEY = 128
MAX_CANCEL_REASON = 1000
MAX_PAGE_TOKEN = 512  # issued tokens are ~80 characters
MAX_INT64 = 2**63 - 1
_DECIMAL_RE = re.compile(r"[0-9]{1,19}")
_TERMINAL = TASK_MACHINE.terminal
_KEY_RE = re.compile(r"^[\x21-\x7e]+$")  # printable ASCII, no spaces


def utcnow() -> datetime:
    return datetime.now(UTC)


class Canceller(Protocol):
    """Cancels tasks whose attempts may be at a provider (the execution engine)."""

    async def cancel(self, task_id: int, reason: str = "") -> object: ...


class CancelResult(Enum):
    """What a `TaskService.cancel_task` call did (the API's ``CancelOutcome``)."""

    CANCELLED = "CANCELLED"  # not at a provider (or confirmed at once): CANCELLED now
    REQUESTED = "REQUESTED"  # an attempt was asked to cancel; the provider has to confirm
    ALREADY_FINISHED = "ALREADY_FINISHED"  # terminal before the call: nothing changed


def _cancel_result(after: TaskState) -> CancelResult:
    """The outcome of a cancel of a task that was not terminal before it, from its state after."""
    if after is TaskState.CANCELLED:
        return CancelResult.CANCELLED
    return CancelResult.ALREADY_FINISHED if after in _TERMINAL else CancelResult.REQUESTED


@dataclass(frozen=True, slots=True)
class CreateTaskInput:
    """A decoded CreateTask request; `violations` are decoding problems found at the boundary."""

    spec: GenerationSpec
    idempotency_key: str
    violations: Sequence[FieldViolation] = ()
    webhook: WebhookSubscription | None = None  # None: the tenant's default, if any


@dataclass(frozen=True, slots=True)
class ListTasksInput:
    tenant_id: str | None = None
    state: TaskState | None = None
    page_size: int = 0
    page_token: str | None = None


def _decimal(raw: str) -> int | None:
    """`raw` as an int when it is ASCII decimal that fits a signed 64-bit column, else None.

    `str.isdigit` is not enough: it accepts "²" and other digits `int` refuses, and a number
    past int64 makes the database fail instead of the request."""
    if not _DECIMAL_RE.fullmatch(raw):
        return None
    value = int(raw)
    return value if value <= MAX_INT64 else None


def parse_cursor(raw: str) -> int:
    """WatchTask cursors are the decimal sequence number of the last event seen."""
    if not raw:
        return 0
    value = _decimal(raw)
    if value is None:
        raise InvalidSpec([FieldViolation("after_cursor", "must be a cursor from a TaskEvent")])
    return value


def parse_task_id(raw: str, field: str = "task_id") -> int:
    """Task ids are positive decimal integers on the wire; anything else is INVALID_ARGUMENT."""
    value = _decimal(raw)
    if value is None or value <= 0:
        raise InvalidSpec([FieldViolation(field, "must be a positive decimal task id")])
    return value


def text_violations(field: str, value: str, max_chars: int) -> list[FieldViolation]:
    """Free text stored as-is (a cancel reason): bounded, and no NUL (PostgreSQL rejects it)."""
    if len(value) > max_chars:
        return [FieldViolation(field, f"at most {max_chars} characters")]
    if "\x00" in value or any("\ud800" <= ch <= "\udfff" for ch in value):
        return [FieldViolation(field, "must not contain NUL or unpaired surrogates")]
    return []


def _list_violations(query: ListTasksInput) -> list[FieldViolation]:
    found: list[FieldViolation] = []
    if query.tenant_id and not IDENTIFIER_RE.fullmatch(query.tenant_id):
        found.append(FieldViolation("tenant_id", f"must match {IDENTIFIER_RE.pattern}"))
    if query.page_token and (
        len(query.page_token) > MAX_PAGE_TOKEN or not query.page_token.isascii()
    ):
        found.append(FieldViolation("page_token", "not a page token this service issued"))
    return found


def _key_violations(key: str) -> list[FieldViolation]:
    if not key:
        return [FieldViolation("idempotency_key", "is required")]
    if len(key) > MAX_IDEMPOTENCY_KEY:
        return [FieldViolation("idempotency_key", f"must be at most {MAX_IDEMPOTENCY_KEY} chars")]
    if not _KEY_RE.match(key):
        return [FieldViolation("idempotency_key", "must be printable ASCII without spaces")]
    return []


class TaskService:
    """Create, read, list and cancel tasks."""

    def __init__(
        self,
        db: Database,
        clock: Callable[[], datetime] = utcnow,
        *,
        canceller: Canceller | None = None,
        watch_poll_interval_s: float = 0.5,
        safety: SafetyPolicy | None = None,
        deadlines: DeadlinePolicy | None = None,
        billing: BillingPolicies | None = None,
        catalog: Callable[[], Awaitable[CapabilityCatalog]] | None = None,
        webhooks: WebhookSubscriptions | None = None,
        tenants: TenantAdmission | None = None,
    ) -> None:
        self._db = db
        # The tenants document's gate (entitlement, rate, queued cap); None: none (tools, tests).
        self._tenants = tenants
        self._webhooks = webhooks or WebhookSubscriptions()
        self._deliveries = WebhookStore(db)
        self._tasks = TaskQueries(db)
        self._creates = CreateBatcher(db)
        self._clock = clock
        self._canceller = canceller
        self._watch_poll_s = watch_poll_interval_s
        self._safety = safety or SafetyPolicy()
        self._deadlines = deadlines or DeadlinePolicy()
        # 9.23.1: with billing, CreateTask reserves the estimate (`task_reservation`) against
        # the tenant's credit; without it (unit tests, tools) nothing is reserved or settled.
        self._billing = billing
        self._catalog = catalog

    async def create_task(
        self, cmd: CreateTaskInput, caller: Caller = SYSTEM
    ) -> tuple[TaskRecord, bool]:
        """Persist a QUEUED task, or return the one this idempotency key already created.

        The safety policy and the tenant's entitlement, rate and queued cap are checked before
        the idempotency lookup: what the platform refuses today is refused, even for a key that
        an older, laxer policy once accepted."""
        violations = [
            *cmd.violations,
            *_key_violations(cmd.idempotency_key),
            *self._webhooks.violations(cmd.webhook),
            *self._safety.profile_violations(cmd.spec),
        ]
        if violations:
            raise InvalidSpec(violations)
        ensure_own_tenant(caller, cmd.spec.tenant_id)
        entry = None if self._tenants is None else await self._tenants.admit(cmd.spec)
        ensure_allowed(self._safety, cmd.spec, "" if entry is None else entry.safety_profile)
        webhook = self._webhooks.resolve(cmd.webhook, cmd.spec.tenant_id)
        now = self._clock()
        queue_deadline_at, deadline_at = deadlines_for(cmd.spec, self._deadlines, now)
        billing = None if entry is None else entry.billing_policy
        reservation = await self._reservation(cmd.spec, now, billing)
        new = NewTask(
            cmd.spec,
            cmd.idempotency_key,
            normalized_spec_hash(cmd.spec),
            queue_deadline_at,
            deadline_at,
            tracing.current_traceparent(),  # the dispatcher continues it
            webhook=webhook,
        )
        # Concurrent creates are written together (group commit); one needing a credit check
        # in its own transaction.
        return await self._creates.create(new, reservation, now)

    async def _reservation(
        self, spec: GenerationSpec, now: datetime, policy: BillingPolicy | None = None
    ) -> Reservation | None:
        """What to reserve for `spec`: the highest estimate of its eligible candidates, under
        `policy` (the tenants document's) or else the configured one for the tenant."""
        if self._billing is None:
            return None
        candidates = (await self._catalog()).candidates if self._catalog is not None else ()
        return Reservation(
            task_reservation(spec, candidates, now),
            reservation_currency(spec),
            policy or self._billing.for_tenant(spec.tenant_id),
        )

    async def get_task(self, task_id: int, caller: Caller = SYSTEM) -> TaskDetail:
        detail = await self._tasks.get_task(task_id)
        if detail is None:
            raise NotFound("task", str(task_id))
        ensure_visible(caller, detail.task.tenant_id, "task", str(task_id))
        return detail

    async def list_webhook_deliveries(
        self, task_id: int, caller: Caller = SYSTEM
    ) -> list[DeliveryRecord]:
        """The task's caller-webhook messages and their attempts, oldest first (scoped like
        `get_task`: another tenant's task is NotFound)."""
        await self.get_task(task_id, caller)
        return await self._deliveries.deliveries(task_id)

    async def list_tasks(
        self, query: ListTasksInput, caller: Caller = SYSTEM
    ) -> tuple[list[TaskRecord], str | None]:
        violations = _list_violations(query)
        if violations:
            raise InvalidSpec(violations)
        try:
            return await self._tasks.list_tasks(
                tenant_id=list_scope(caller, query.tenant_id),
                state=query.state,
                page_size=query.page_size,
                page_token=query.page_token or None,
            )
        except store_errors.InvalidPageToken as exc:
            raise InvalidSpec([FieldViolation("page_token", str(exc))]) from exc

    async def cancel_task(
        self, task_id: int, reason: str = "", caller: Caller = SYSTEM
    ) -> tuple[TaskDetail, CancelResult]:
        """Cancel a task; the task after the call and what the call did.

        A task terminal before the call is returned unchanged (ALREADY_FINISHED). A queued task
        is CANCELLED at once. A task with an attempt at a provider is a request (attempt
        CANCEL_REQUESTED) that only the provider's confirmation completes (9.18.3): REQUESTED;
        the execution engine's `Canceller` owns that. Without an engine (an API-only replica),
        such a task is FAILED_PRECONDITION with its state named. A task that ended on its own
        while the cancel was being decided is ALREADY_FINISHED too.
        """
        violations = text_violations("reason", reason, MAX_CANCEL_REASON)
        if violations:  # before any read: bad input never touches the database
            raise InvalidSpec(violations)
        before = await self.get_task(task_id, caller)  # another tenant's: NotFound, nothing done
        if before.task.state in _TERMINAL:
            return before, CancelResult.ALREADY_FINISHED
        if self._canceller is not None:
            await self._canceller.cancel(task_id, reason)
            after = await self.get_task(task_id)
            return after, _cancel_result(after.task.state)
        async with self._db.unit(self._clock()) as u:
            record = await u.cancel_queued_task(task_id, reason)
        if record.state not in _TERMINAL:
            raise PreconditionFailed(
                f"task {task_id} is {record.state.value}; only queued tasks can be cancelled "
                "without a running execution worker",
                {"status_version": record.status_version},
            )
        return await self.get_task(task_id), _cancel_result(record.state)

    async def watch(
        self, task_id: int, after_seq: int = 0, caller: Caller = SYSTEM
    ) -> AsyncIterator[TaskEventRecord]:
        """The task's persisted events after `after_seq`, then new ones as they are written.

        Ends once the task is terminal and every event is delivered. A client that reconnects
        passes the last cursor it saw and misses nothing: the history is the database's.
        """
        await self.get_task(task_id, caller)  # NotFound before the stream starts
        cursor = after_seq
        while True:
            events = await self._tasks.task_events(task_id, after_seq=cursor, limit=200)
            for event in events:
                cursor = event.seq
                yield event
            if events:
                continue
            detail = await self.get_task(task_id)
            if detail.task.state in _TERMINAL:
                if not await self._tasks.task_events(task_id, after_seq=cursor, limit=1):
                    return
                continue
            await asyncio.sleep(self._watch_poll_s)
