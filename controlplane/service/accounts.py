"""Provider accounts as configuration, transport-neutral (design 9.11, 9.19.1, 9.25.5).

`AccountConfigService` validates an accounts document whole (`domain.accounts`; every problem an
`InvalidSpec` field violation, nothing written) and publishes it through the path every
versioned document shares (`service.versioned`: immutable versions, a diff against the active
one, activation now, scheduled or staged, rollback, each activation audited, dry runs). Each
activation also writes the document's settings into ``provider_accounts`` in its unit
(credential references, regions, ACTIVE or DISABLED). `usage` is each account's limits against
its current use, per lease dimension, read from the lease store. Admin only.

`AccountBook` is the active document as every reader sees it; the dispatcher re-reads it every
round, so a publication counts from the next one on every replica. `limits_for` is the lookup
the dispatcher's leases and windows take (an account the document does not list gets no
limits: the behaviour from before accounts were configuration).
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime

from controlplane.domain.accounts import (
    BUILTIN,
    BUILTIN_DOCUMENT,
    BUILTIN_VERSION,
    AccountLimits,
    Accounts,
    ensure_publishable,
    parse_accounts_document,
)
from controlplane.persistence import account_configs as store
from controlplane.persistence.database import Database
from controlplane.persistence.documents import DocumentRow
from controlplane.persistence.unit import SqlUnitOfWork
from controlplane.scheduling.account_usage import AccountUsage
from controlplane.service.access import SYSTEM, Caller, ensure_admin
from controlplane.service.documents import (
    DocumentBook,
    DocumentKind,
    version_or_builtin,
)
from controlplane.service.versioned import DocumentService, VersionedDocuments

ACCOUNTS: DocumentKind[Accounts] = DocumentKind(
    "accounts", store.DOCUMENTS, parse_accounts_document, BUILTIN
)
DEFAULT_SOURCE = "PublishAccountConfig"
DISPATCH_MAX_AGE_S = 0.0  # a dispatch round reads the active version every round

UsageSource = Callable[[], Awaitable[Sequence[AccountUsage]]]


def _utcnow() -> datetime:
    return datetime.now(UTC)


class AccountBook(DocumentBook[Accounts]):
    """The active accounts document, re-read when older than the caller's bound."""

    def __init__(self, db: Database, *, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__(db, ACCOUNTS, clock=clock)

    def limits_for(self, provider: str, account: str) -> AccountLimits:
        """The account's limits in the document the last read found (no I/O)."""
        return self.latest.limits(provider, account)


async def apply_settings(u: SqlUnitOfWork, name: str, text: str, now: datetime, why: str) -> None:
    """`OnActivate` of accounts documents: their settings reach ``provider_accounts``."""
    await u.apply_account_settings(parse_accounts_document(text))


async def no_usage() -> Sequence[AccountUsage]:
    return ()


class AccountConfigService(DocumentService):
    """Publish, activate, roll back, read and list accounts documents; read usage (admin)."""

    default_source = DEFAULT_SOURCE

    def __init__(
        self,
        db: Database,
        book: AccountBook,
        *,
        clock: Callable[[], datetime] = _utcnow,
        usage: UsageSource = no_usage,
        on_schedule: Callable[[], None] | None = None,
    ) -> None:
        self._db, self._clock, self._usage = db, clock, usage
        self.documents = VersionedDocuments(
            db,
            store.DOCUMENTS,
            noun="accounts",
            reason_key="ACCOUNT_CONFIG",
            rpc="AccountConfig",
            clock=clock,
            on_activate=apply_settings,
            on_change=book.invalidate,
            on_schedule=on_schedule,
        )

    async def get(self, version: str = "", caller: Caller = SYSTEM) -> DocumentRow:
        """The named version, else the active one, else the built-in document (never stored)."""
        ensure_admin(caller, "GetAccountConfig")
        builtin = (BUILTIN_VERSION, BUILTIN_DOCUMENT)
        return await version_or_builtin(self._db, store.DOCUMENTS, version, builtin, "accounts")

    async def validated(self, text: str) -> str:
        """The accounts document's version once it is checked whole."""
        accounts = parse_accounts_document(text)
        ensure_publishable(accounts)
        return accounts.version

    async def usage(self, caller: Caller = SYSTEM) -> Sequence[AccountUsage]:
        """Every account's lease dimensions: limit and slots held now (the lease store's)."""
        ensure_admin(caller, "GetAccountUsage")
        return await self._usage()

    async def reapply(self, now: datetime) -> None:
        """Write the active document's settings into ``provider_accounts`` again (a capability
        publication from the sidecars' Describe upserts the rows it names back to ACTIVE)."""
        row = await self.get()
        if row.version == BUILTIN_VERSION:
            return
        async with self._db.unit(now) as u:
            await u.apply_account_settings(parse_accounts_document(row.document))
