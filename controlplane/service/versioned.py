"""The one publish path of every versioned document (design 9.6.4, 9.25.5): a diff against the
active version, activation now, at a scheduled time or staged, rollback, and the audit of each.

`VersionedDocuments` is what a kind's service (tenants and accounts documents, routing
policies) calls once it has validated a document: it never parses one, only diffs the parsed
values (`domain.document_diff`). `DocumentService` is the part of those services that is the
same for every kind (admin checks, source, publish, activate, rollback, history); a kind adds
its validation (`validated`). A publication is
- *now* (the default): inserted active in one unit, its activation recorded (PUBLISHED);
- *scheduled* (``activate_at``): inserted inactive with a pending SCHEDULED activation, made
  effective by `apply_due` at or after that time;
- *staged*: inserted inactive; `activate` makes it active later (ACTIVATED).
`rollback` makes an earlier version active (ROLLED_BACK). Every activation row says who, when it
was asked for and when it took effect, what it replaced and the operator's optional reason.

Scheduled activations, in a multi-replica deployment: every scheduling replica runs
`DocumentActivator`, which sleeps until the soonest pending activation (re-reading the pending
ones every ``poll_s``) and calls `apply_due`. That takes the kind's publication lock (the
PostgreSQL advisory lock its publications take; SQLite's single writer) and re-reads what is
due inside it, so of the replicas that wake together one applies it and the others find
nothing: no second writer. Readers keep reading the ``active`` flag, so the dispatcher's
per-round read sees the new version from its next round. A pending schedule is left in place
by a later publish, activate or rollback: it is the operator's standing instruction, visible in
``history`` (chosen so that a rollback never silently cancels a planned change).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from controlplane.domain.document_diff import Change, diff_texts
from controlplane.persistence.database import Database
from controlplane.persistence.documents import (
    ActivationRow,
    DocumentRow,
    Documents,
    OpenDocuments,
)
from controlplane.persistence.unit import SqlUnitOfWork
from controlplane.service.access import SYSTEM, Caller, ensure_admin
from controlplane.service.documents import checked_source, same_text
from vidroute_core.exceptions import InvalidSpec, NotFound, PreconditionFailed
from vidroute_core.validation import FieldViolation

log = logging.getLogger(__name__)

MAX_REASON_CHARS = 500
MAX_SCHEDULE_AHEAD = timedelta(days=366)

# Run in the activating unit (e.g. reconcile a routing policy's canaries): the unit, the
# version made active, its text, the time, and a label of why ("published", "rollback to v1").
OnActivate = Callable[[SqlUnitOfWork, str, str, datetime, str], Awaitable[None]]


def _utcnow() -> datetime:
    return datetime.now(UTC)


@dataclass(frozen=True, slots=True)
class Release:
    """How a publication takes effect: now (the default), at `activate_at`, or `staged`."""

    activate_at: datetime | None = None
    staged: bool = False
    reason: str = ""


NOW = Release()


@dataclass(frozen=True, slots=True)
class Publication:
    """A version published (or, for a dry run, that would be) and what it changes against the
    version active when it was checked; `activate_at` when its activation is scheduled."""

    row: DocumentRow
    changes: tuple[Change, ...]
    activate_at: datetime | None = None


@dataclass(frozen=True, slots=True)
class DocumentHistory:
    """Every published version (newest first) and every activation (oldest first; pending
    scheduled ones included)."""

    versions: tuple[DocumentRow, ...]
    activations: tuple[ActivationRow, ...]


def checked_reason(reason: str) -> str:
    reason = reason.strip()
    if len(reason) > MAX_REASON_CHARS or "\x00" in reason:
        raise InvalidSpec([FieldViolation("reason", f"at most {MAX_REASON_CHARS} characters")])
    return reason


def checked_release(release: Release, now: datetime) -> Release:
    """`release` with its reason checked, or `InvalidSpec` naming what is wrong."""
    found: list[FieldViolation] = []
    at = release.activate_at
    if at is not None and release.staged:
        found.append(FieldViolation("activate_at", "a staged publication has no activation time"))
    elif at is not None and at.tzinfo is None:
        found.append(FieldViolation("activate_at", "must carry a time zone"))
    elif at is not None and at <= now:
        found.append(
            FieldViolation("activate_at", f"must be after now ({now.isoformat()}), got {at}")
        )
    elif at is not None and at - now > MAX_SCHEDULE_AHEAD:
        found.append(FieldViolation("activate_at", f"at most {MAX_SCHEDULE_AHEAD.days} days ahead"))
    if found:
        raise InvalidSpec(found)
    return Release(at, release.staged, checked_reason(release.reason))


class VersionedDocuments:
    """Publish, activate, roll back and list one kind of versioned document."""

    def __init__(
        self,
        db: Database,
        documents: Documents,
        *,
        noun: str,
        reason_key: str,
        rpc: str,
        clock: Callable[[], datetime] = _utcnow,
        on_activate: OnActivate | None = None,
        on_change: Callable[[], None] | None = None,
        on_schedule: Callable[[], None] | None = None,
    ) -> None:
        self._db, self._docs, self._clock = db, documents, clock
        self._noun = noun  # "tenants", "routing policy": in NotFound and log lines
        self._key = reason_key  # "TENANT_CONFIG": NO_ACTIVE_<key>, NO_EARLIER_<key>
        self.rpc = rpc  # "TenantConfig": the admin check names Activate<rpc>, Rollback<rpc>
        self._on_activate = on_activate
        self._on_change = on_change  # this process's readers re-read (e.g. TenantBook)
        self._on_schedule = on_schedule  # this process's `DocumentActivator.kick`

    async def _activated(
        self, u: SqlUnitOfWork, name: str, text: str, now: datetime, why: str
    ) -> None:
        if self._on_activate is not None:
            await self._on_activate(u, name, text, now, why)

    def _changed(self) -> None:
        if self._on_change is not None:
            self._on_change()

    def _scheduled(self) -> None:
        if self._on_schedule is not None:
            self._on_schedule()

    async def publish(
        self,
        name: str,
        text: str,
        source: str,
        *,
        dry_run: bool = False,
        release: Release = NOW,
        actor: str = "",
    ) -> Publication:
        """Publish the validated `text` as `name` (see the module docstring for `release`)."""
        now = self._clock()
        release = checked_release(release, now)
        async with self._db.reads() as reads:
            published = reads.documents(self._docs)
            existing = await published.version(name)
            active = await published.active()
        changes = tuple(diff_texts(None if active is None else active.document, text))
        if existing is not None:  # a retried publish: nothing changes
            return Publication(same_text(existing, text), changes)
        if dry_run:
            return Publication(
                DocumentRow(name, text, source, False, now, None), changes, release.activate_at
            )
        immediate = release.activate_at is None and not release.staged
        async with self._db.unit(now) as u:
            docs = u.documents(self._docs)
            await docs.lock_publication()
            if (existing := await docs.version(name)) is not None:
                return Publication(same_text(existing, text), changes)  # published meanwhile
            # The diff the operator reads is against what is active inside the lock.
            active = await docs.active()
            changes = tuple(diff_texts(None if active is None else active.document, text))
            if immediate:
                row = await docs.insert_active(
                    name, text, source, actor=actor, reason=release.reason
                )
                await self._activated(u, name, text, now, "published")
            else:
                row = await docs.insert(name, text, source)
                if release.activate_at is not None:
                    await docs.schedule(
                        name, release.activate_at, actor=actor, reason=release.reason
                    )
        if immediate:
            self._changed()
        elif release.activate_at is not None:
            self._scheduled()
        how = (
            "active"
            if immediate
            else f"active at {release.activate_at}"
            if release.activate_at
            else "staged"
        )
        log.info("%s %s published (%s) by %s from %s", self._noun, name, how, actor, source)
        return Publication(row, changes, release.activate_at)

    async def activate(
        self,
        version: str,
        *,
        actor: str = "",
        release: Release = NOW,
        rollback: bool = False,
    ) -> DocumentRow:
        """Make the published `version` active now, or schedule it (`release.activate_at`).
        Empty with `rollback`: the version before the active one that was ever active."""
        now = self._clock()
        release = checked_release(release, now)
        if release.staged:
            raise InvalidSpec([FieldViolation("staged", "an activation cannot be staged")])
        at = release.activate_at
        async with self._db.unit(now) as u:
            docs = u.documents(self._docs)
            await docs.lock_publication()
            current = await docs.active(lock=True)
            target = await self._target(docs, version, current)
            if at is not None:
                await docs.schedule(target.version, at, actor=actor, reason=release.reason)
            elif current is None or current.version != target.version:
                action, why = (
                    ("ROLLED_BACK", f"rollback to {target.version}")
                    if rollback
                    else ("ACTIVATED", f"activation of {target.version}")
                )
                await docs.activate(
                    target.version, actor=actor, action=action, reason=release.reason
                )
                await self._activated(u, target.version, target.document, now, why)
        if at is not None:
            self._scheduled()
            log.info("%s %s to be active at %s (%s)", self._noun, target.version, at, actor)
            return target
        self._changed()
        log.warning(
            "%s %s by %s: %s -> %s",
            self._noun,
            "rolled back" if rollback else "activated",
            actor,
            current and current.version,
            target.version,
        )
        return DocumentRow(
            target.version, target.document, target.source, True, target.published_at, now
        )

    async def activate_as(
        self, caller: Caller, version: str, release: Release = NOW
    ) -> DocumentRow:
        """`activate` for an admin caller; the version is required."""
        ensure_admin(caller, f"Activate{self.rpc}")
        if not version:
            raise InvalidSpec([FieldViolation("version", "is required")])
        return await self.activate(version, actor=caller.name, release=release)

    async def rollback_as(self, caller: Caller, version: str, reason: str = "") -> DocumentRow:
        """A rollback by an admin caller (empty `version`: the one before the active)."""
        ensure_admin(caller, f"Rollback{self.rpc}")
        return await self.activate(
            version, actor=caller.name, release=Release(reason=reason), rollback=True
        )

    async def _target(
        self, docs: OpenDocuments, version: str, current: DocumentRow | None
    ) -> DocumentRow:
        if version:
            target = await docs.version(version)
            if target is None:
                raise NotFound(f"{self._noun} version", version)
            return target
        if current is None:
            raise PreconditionFailed(
                f"no {self._noun} document is published; nothing to roll back",
                {"published_versions": 0},
                reason=f"NO_ACTIVE_{self._key}",
            )
        target = await docs.before(current.version)
        if target is None:
            raise PreconditionFailed(
                f"{current.version} is the first published version; nothing before it",
                {"published_versions": 1},
                reason=f"NO_EARLIER_{self._key}",
            )
        return target

    async def history(self) -> DocumentHistory:
        async with self._db.reads() as reads:
            published = reads.documents(self._docs)
            versions = await published.versions()
            activations = await published.activations()
        return DocumentHistory(tuple(versions), tuple(activations))

    async def next_due(self) -> datetime | None:
        """The soonest pending scheduled activation's time (None: none pending)."""
        async with self._db.reads() as reads:
            pending = await reads.documents(self._docs).pending()
        return pending[0].at if pending else None

    async def apply_due(self) -> list[ActivationRow]:
        """Make every scheduled activation due now effective (see the module docstring)."""
        now = self._clock()
        async with self._db.reads() as reads:  # the common case, nothing due: no write
            if not any(a.at <= now for a in await reads.documents(self._docs).pending()):
                return []
        async with self._db.unit(now) as u:
            docs = u.documents(self._docs)
            await docs.lock_publication()
            done = await docs.apply_due()
            for a in done:
                row = await docs.version(a.version)
                if row is not None:
                    await self._activated(u, a.version, row.document, now, "scheduled")
        if done:
            self._changed()
            for a in done:
                log.warning(
                    "%s %s active as scheduled for %s (by %s)", self._noun, a.version, a.at, a.actor
                )
        return done


class DocumentService:
    """What every kind's service (tenants, accounts, routing policies) does around
    `VersionedDocuments` the same way: the admin check, the source, then publish, activate,
    roll back or list. A kind gives `documents`, its `default_source` and `validated`."""

    documents: VersionedDocuments
    default_source: str

    async def validated(self, text: str) -> str:
        """The version of `text` once the kind has checked it whole, or `InvalidSpec`."""
        raise NotImplementedError

    async def publish(
        self, text: str, source: str = "", dry_run: bool = False, caller: Caller = SYSTEM
    ) -> DocumentRow:
        """Validate `text` and make it the active version (`release`, activating now)."""
        return (await self.release(text, source, dry_run, caller)).row

    async def release(
        self,
        text: str,
        source: str = "",
        dry_run: bool = False,
        caller: Caller = SYSTEM,
        *,
        release: Release = NOW,
    ) -> Publication:
        """Validate `text`, then publish it as `release` says (now, scheduled, staged), with
        what it changes against the active version."""
        ensure_admin(caller, f"Publish{self.documents.rpc}")
        source = checked_source(source, self.default_source)
        version = await self.validated(text)
        return await self.documents.publish(
            version, text, source, dry_run=dry_run, release=release, actor=caller.name
        )

    async def activate(
        self, version: str, caller: Caller = SYSTEM, *, release: Release = NOW
    ) -> DocumentRow:
        """Make a published (e.g. staged) version active now, or at `release.activate_at`."""
        return await self.documents.activate_as(caller, version, release)

    async def rollback(
        self, version: str = "", caller: Caller = SYSTEM, *, reason: str = ""
    ) -> DocumentRow:
        """Make an earlier version active again (empty: the one before the active version)."""
        return await self.documents.rollback_as(caller, version, reason)

    async def history(self, caller: Caller = SYSTEM) -> DocumentHistory:
        """Every published version and every activation (`DocumentHistory`)."""
        ensure_admin(caller, f"List{self.documents.rpc}History")
        return await self.documents.history()
