"""Tenants as configuration, transport-neutral (design 9.12.1-9.12.3, 9.25.5).

`TenantConfigService` validates a tenants document whole (`domain.tenants`; every problem an
`InvalidSpec` field violation, nothing written) and publishes it through the path every
versioned document shares (`service.versioned`): a version is immutable (the same text again is
a retried publish, another text is refused), a publication returns its diff against the active
version and takes effect now, at a scheduled time or when a staged version is activated, a
rollback makes an earlier version active again, each activation is audited (who, when asked and
effective, the version it replaced, why), and a dry run writes nothing. Admin only.

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
import time
from collections.abc import Callable
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
from controlplane.persistence.documents import DocumentRow
from controlplane.rate_limits import InProcessRateLimiter, RateLimiter
from controlplane.service.access import SYSTEM, Caller, ensure_admin
from controlplane.service.documents import (
    DocumentBook,
    DocumentKind,
    version_or_builtin,
)
from controlplane.service.versioned import DocumentHistory, DocumentService, VersionedDocuments
from vidroute_core.exceptions import (
    InvalidSpec,
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


TENANTS: DocumentKind[Tenants] = DocumentKind(
    "tenants", store.DOCUMENTS, parse_tenants_document, BUILTIN
)


class TenantBook(DocumentBook[Tenants]):
    """The active tenants document, re-read when older than the caller's bound."""

    def __init__(self, db: Database, *, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__(db, TENANTS, clock=clock)

    async def current(self, max_age_s: float = CREATE_MAX_AGE_S) -> Tenants:
        return await super().current(max_age_s)


# Every published version (newest first) and every activation (oldest first).
TenantHistory = DocumentHistory


class TenantConfigService(DocumentService):
    """Publish, activate, roll back, read and list tenants documents (admin)."""

    default_source = DEFAULT_SOURCE

    def __init__(
        self,
        db: Database,
        book: TenantBook,
        *,
        clock: Callable[[], datetime] = _utcnow,
        safety: SafetyPolicy | None = None,
        on_schedule: Callable[[], None] | None = None,
    ) -> None:
        self._db, self._book, self._clock = db, book, clock
        # The safety policy this process enforces: a document naming a profile it lacks is
        # refused at publication (None: not checked, as in tools and tests).
        self._safety = safety
        self.documents = VersionedDocuments(
            db,
            store.DOCUMENTS,
            noun="tenants",
            reason_key="TENANT_CONFIG",
            rpc="TenantConfig",
            clock=clock,
            on_change=book.invalidate,
            on_schedule=on_schedule,
        )

    async def get(self, version: str = "", caller: Caller = SYSTEM) -> DocumentRow:
        """The named version, else the active one, else the built-in document (never stored)."""
        ensure_admin(caller, "GetTenantConfig")
        builtin = (BUILTIN_VERSION, BUILTIN_DOCUMENT)
        return await version_or_builtin(self._db, store.DOCUMENTS, version, builtin, "tenants")

    async def validated(self, text: str) -> str:
        """The tenants document's version; with a safety policy, every profile it names must
        be one of the policy's."""
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
        return tenants.version


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
            async with self._db.reads() as reads:
                queued = await reads.queued_count(tenant, spec.service_class.value)
            if queued >= share.max_queued:
                raise PreconditionFailed(
                    f"tenant {tenant!r} has {queued} {spec.service_class.value} tasks queued,"
                    f" its max_queued is {share.max_queued}",
                    {"queued": queued, "max_queued": share.max_queued},
                    reason="TENANT_QUEUE_FULL",
                    labels={"service_class": spec.service_class.value},
                )
        return tenants.entry(tenant)
