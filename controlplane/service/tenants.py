"""Tenants as configuration, transport-neutral (design 9.12.1-9.12.3, 9.25.5).

`TenantConfigService` publishes, rolls back and lists tenants documents the way routing policies
are (`service.routing_policies`): the document is validated whole (`domain.tenants`; every
problem an `InvalidSpec` field violation, nothing written), a version is immutable (the same
text again is a retried publish, another text is refused), publishing makes it active in one
unit with its activation recorded (who, when, the version it replaced), a rollback makes an
earlier version active again, audited the same way, and a dry run writes nothing. Admin only.

`TenantBook` is the active document as every reader sees it: re-read when older than the
reader's bound (the dispatcher: every round; CreateTask: at most once a second per replica), and
at once in the replica that published. Before any publication it is `domain.tenants.BUILTIN`.

`TenantAdmission` is CreateTask's gate, in this order: the tenant must be entitled to the
service class (PERMISSION_DENIED naming the classes it may use), within its CreateTask rate
(RESOURCE_EXHAUSTED with RetryInfo; token buckets shared through Redis when the leases use it,
else in this process: `controlplane.rate_limits`) and under
its ``max_queued`` of the class (FAILED_PRECONDITION with the numbers). Nothing is written when
it refuses.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime

from controlplane.domain.safety import SafetyPolicy
from controlplane.domain.tenants import (
    BUILTIN,
    BUILTIN_DOCUMENT,
    BUILTIN_VERSION,
    TenantEntry,
    Tenants,
    ensure_entitled,
    ensure_publishable,
    parse_tenants_document,
)
from controlplane.persistence import tenant_configs as store
from controlplane.persistence.database import Database
from controlplane.persistence.documents import ActivationRow, DocumentRow
from controlplane.rate_limits import InProcessRateLimiter, RateLimiter
from controlplane.service.access import SYSTEM, Caller, ensure_admin
from controlplane.service.documents import checked_source, same_text
from vidroute_core.exceptions import (
    InvalidSpec,
    NotFound,
    PreconditionFailed,
    RateLimited,
)
from vidroute_core.spec import GenerationSpec
from vidroute_core.validation import FieldViolation

log = logging.getLogger(__name__)

DEFAULT_SOURCE = "PublishTenantConfig"
DISPATCH_MAX_AGE_S = 0.0  # a dispatch round reads the active version every round
CREATE_MAX_AGE_S = 1.0  # CreateTask: at most one read a second per replica


def _utcnow() -> datetime:
    return datetime.now(UTC)


class TenantBook:
    """The active tenants document, re-read when older than the caller's bound."""

    def __init__(self, db: Database, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._db, self._clock = db, clock
        self._tenants = BUILTIN
        self._read_at = -math.inf

    def invalidate(self) -> None:
        """A publish or rollback happened here: the next read goes to the database."""
        self._read_at = -math.inf

    async def current(self, max_age_s: float = CREATE_MAX_AGE_S) -> Tenants:
        now = self._clock()
        if now - self._read_at <= max_age_s:
            return self._tenants
        async with self._db.reading() as conn:
            name = await store.DOCUMENTS.active_version(conn)
            if name is None:
                self._tenants = BUILTIN
            elif name != self._tenants.version:
                row = await store.DOCUMENTS.version(conn, name)
                if row is not None:
                    self._load(row)
        self._read_at = now
        return self._tenants

    def _load(self, row: DocumentRow) -> None:
        try:
            self._tenants = parse_tenants_document(row.document)
        except InvalidSpec:  # validated at publication; a bad row must not stop the service
            log.exception("tenants %s does not parse; keeping %s", row.version, self.version)
            return
        log.info("tenants %s active", row.version)

    @property
    def version(self) -> str:
        return self._tenants.version


@dataclass(frozen=True, slots=True)
class TenantHistory:
    """Every published version (newest first) and every activation (oldest first)."""

    versions: tuple[DocumentRow, ...]
    activations: tuple[ActivationRow, ...]


class TenantConfigService:
    """Publish, roll back, read and list tenants documents (admin)."""

    def __init__(
        self,
        db: Database,
        book: TenantBook,
        *,
        clock: Callable[[], datetime] = _utcnow,
        safety: SafetyPolicy | None = None,
    ) -> None:
        self._db, self._book, self._clock = db, book, clock
        # The safety policy this process enforces: a document naming a profile it lacks is
        # refused at publication (None: not checked, as in tools and tests).
        self._safety = safety

    async def get(self, version: str = "", caller: Caller = SYSTEM) -> DocumentRow:
        """The named version, else the active one, else the built-in document (never stored)."""
        ensure_admin(caller, "GetTenantConfig")
        async with self._db.reading() as conn:
            row = await (
                store.DOCUMENTS.version(conn, version) if version else store.DOCUMENTS.active(conn)
            )
        if row is None and version and version != BUILTIN_VERSION:
            raise NotFound("tenants version", version)
        if row is None:
            at = datetime.fromtimestamp(0, UTC)
            return DocumentRow(BUILTIN_VERSION, BUILTIN_DOCUMENT, "built in", not version, at, None)
        return row

    async def publish(
        self, text: str, source: str = "", dry_run: bool = False, caller: Caller = SYSTEM
    ) -> DocumentRow:
        ensure_admin(caller, "PublishTenantConfig")
        source = checked_source(source, DEFAULT_SOURCE)
        tenants = parse_tenants_document(text)
        ensure_publishable(tenants)
        if self._safety is not None:
            policy = self._safety
            unknown = [
                FieldViolation(path, f"safety policy {policy.version} has no profile {name!r}")
                for path, name in tenants.safety_profiles().items()
                if name not in policy.profiles
            ]
            if unknown:
                raise InvalidSpec(unknown)
        name, now = tenants.version, self._clock()
        async with self._db.reading() as conn:
            existing = await store.DOCUMENTS.version(conn, name)
        if existing is not None:
            return same_text(existing, text)  # a retried publish: nothing changes
        if dry_run:
            return DocumentRow(name, text, source, False, now, None)
        async with self._db.unit(now) as u:
            await store.DOCUMENTS.lock_publication(u.conn)
            if (existing := await store.DOCUMENTS.version(u.conn, name)) is not None:
                return same_text(existing, text)  # published meanwhile
            row = await store.DOCUMENTS.insert_active(
                u.conn, name, text, source, now, actor=caller.name
            )
        self._book.invalidate()
        log.info("tenants %s published by %s from %s", name, caller.name, source)
        return row

    async def rollback(self, version: str = "", caller: Caller = SYSTEM) -> DocumentRow:
        ensure_admin(caller, "RollbackTenantConfig")
        now = self._clock()
        async with self._db.unit(now) as u:
            await store.DOCUMENTS.lock_publication(u.conn)
            current = await store.DOCUMENTS.active(u.conn, lock=True)
            if version:
                target = await store.DOCUMENTS.version(u.conn, version)
                if target is None:
                    raise NotFound("tenants version", version)
            else:
                if current is None:
                    raise PreconditionFailed(
                        "no tenants document is published; nothing to roll back",
                        {"published_versions": 0},
                        reason="NO_ACTIVE_TENANT_CONFIG",
                    )
                target = await store.DOCUMENTS.before(u.conn, current.version)
                if target is None:
                    raise PreconditionFailed(
                        f"{current.version} is the first published version; nothing before it",
                        {"published_versions": 1},
                        reason="NO_EARLIER_TENANT_CONFIG",
                    )
            if current is None or current.version != target.version:
                await store.DOCUMENTS.activate(u.conn, target.version, now, actor=caller.name)
        self._book.invalidate()
        log.warning(
            "tenants rolled back by %s: %s -> %s",
            caller.name,
            current and current.version,
            target.version,
        )
        return DocumentRow(
            target.version, target.document, target.source, True, target.published_at, now
        )

    async def history(self, caller: Caller = SYSTEM) -> TenantHistory:
        ensure_admin(caller, "ListTenantConfigHistory")
        async with self._db.reading() as conn:
            versions = await store.DOCUMENTS.versions(conn)
            activations = await store.DOCUMENTS.activations(conn)
        return TenantHistory(tuple(versions), tuple(activations))


class TenantAdmission:
    """CreateTask's tenant gate: entitlement, then rate, then the class's queued cap."""

    def __init__(
        self,
        db: Database,
        book: TenantBook,
        *,
        limiter: RateLimiter | None = None,
    ) -> None:
        self._db, self._book = db, book
        self._limiter = limiter or InProcessRateLimiter()

    async def admit(self, spec: GenerationSpec) -> TenantEntry:
        """The tenant's entry if `spec` may be created now; raise what refuses it otherwise."""
        tenants = await self._book.current(CREATE_MAX_AGE_S)
        tenant = spec.tenant_id
        share = ensure_entitled(tenants, tenant, spec.service_class)
        rate = tenants.entry(tenant).create_rate
        if rate is not None:
            verdict = await self._limiter.take(tenant, rate.per_second, rate.burst)
            if not verdict.allowed:
                raise RateLimited(
                    f"tenant {tenant!r} is over its CreateTask rate ({rate.per_second:g}/s,"
                    f" burst {rate.burst}); retry in {verdict.retry_after_s:.2f} s",
                    verdict.retry_after_s,
                    labels={
                        "tenant_id": tenant,
                        "per_second": f"{rate.per_second:g}",
                        "burst": str(rate.burst),
                    },
                )
        if share.max_queued is not None:
            async with self._db.reading() as conn:
                queued = await store.queued_count(conn, tenant, spec.service_class.value)
            if queued >= share.max_queued:
                raise PreconditionFailed(
                    f"tenant {tenant!r} has {queued} {spec.service_class.value} tasks queued,"
                    f" its max_queued is {share.max_queued}",
                    {"queued": queued, "max_queued": share.max_queued},
                    reason="TENANT_QUEUE_FULL",
                    labels={"service_class": spec.service_class.value},
                )
        return tenants.entry(tenant)
