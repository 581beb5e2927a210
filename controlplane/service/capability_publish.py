"""PublishCapabilities and the capability releases, transport-neutral: an admin publishes a
capability document, activates a staged one, rolls back, reads the history.

The document is a capabilities file's text (YAML, or JSON, which is YAML): every entry goes
through the same checks as the sidecars' files and Describe (`controlplane.capabilities.publish`),
against the accounts the catalog has (an entry naming an account we do not have registers it by
reference when it names its region). Any bad entry rejects the whole document with
`InvalidSpec`: one field violation per bad entry (``document[i]``), or one for the document
(``document``: not YAML, too large, aliases, a duplicate across entries, a version conflict);
nothing is written. Then the release checks (`service.capability_checks`: the sample compile
against the live sidecars, the diff against the catalog in effect, the serving check), then the
write (`service.capability_releases`): now, at `activate_at`, or staged. A dry run checks
everything, the database's conflicts included, and rolls back: its counts and changes are what
a real run would write. A release is named by `version` (default: its text's digest); the same
text under a published name is a retry that changes nothing, another text is refused.
"""

from __future__ import annotations

import dataclasses
import logging
import re
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import yaml

from controlplane.capabilities.publish import (
    AccountConfig,
    Publication,
    PublishError,
    documents_from_text,
    plan_publication,
)
from controlplane.capabilities.release import ModelChange, release_version
from controlplane.persistence import capability_releases as store
from controlplane.persistence.capability_releases import ActivationRow, ReleaseRow
from controlplane.persistence.catalog import AccountRecord, CatalogQueries, PublishCounts
from controlplane.persistence.database import Database
from controlplane.service.access import SYSTEM, Caller, ensure_admin
from controlplane.service.capability_checks import Force, SampleCompile, check_release
from controlplane.service.capability_releases import (
    ACTIVATED,
    PUBLISHED,
    ROLLED_BACK,
    SCHEDULED,
    Activation,
    rollback_plan,
    rollback_target,
    stage,
    write_activation,
)
from vidroute_core.exceptions import InvalidSpec, NotFound, PreconditionFailed
from vidroute_core.validation import FieldViolation

log = logging.getLogger(__name__)

MAX_DOCUMENT_CHARS = 1_000_000
MAX_SOURCE_CHARS = 200
DEFAULT_SOURCE = "PublishCapabilities"


MAX_VERSION_CHARS = 100
NO_FORCE = Force()
_VERSION_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:/@+-]*")


@dataclass(frozen=True, slots=True)
class PublishInput:
    """A publish: `activate_at` schedules it (None: now), `staged` keeps it for `activate`."""

    document: str
    source: str = ""
    dry_run: bool = False
    version: str = ""
    activate_at: datetime | None = None
    staged: bool = False
    force: Force = field(default_factory=Force)


@dataclass(frozen=True, slots=True)
class PublishResult:
    """Rows written (or that a dry run would write) per kind, and the release's facts."""

    counts: Mapping[str, int]
    dry_run: bool
    version: str = ""
    state: str = ""  # ACTIVE, SCHEDULED or STAGED (of a dry run: what it would be)
    effective_from: datetime | None = None
    changes: tuple[ModelChange, ...] = ()
    samples_compiled: int = 0
    forced_reason: str = ""
    unchanged: bool = False  # a retry of a published release: nothing was written


@dataclass(frozen=True, slots=True)
class CapabilityHistory:
    """Every release (newest first) and every activation (oldest first)."""

    releases: tuple[ReleaseRow, ...]
    activations: tuple[ActivationRow, ...]


def _counts(counts: PublishCounts) -> dict[str, int]:
    raw = dataclasses.asdict(counts)
    return {
        "accounts": raw["accounts"],
        "capabilities": raw["capabilities_inserted"],
        "capabilities_unchanged": raw["capabilities_unchanged"],
        "prices": raw["prices_inserted"],
        "prices_unchanged": raw["prices_unchanged"],
    }


def _accounts(records: Iterable[AccountRecord]) -> list[AccountConfig]:
    """The catalog's accounts as publication sees configured ones (their stored config kept)."""
    return [
        AccountConfig(
            provider=r.provider,
            account_name=r.account_name,
            region=r.region,
            credential_ref=r.credential_ref,
            status=r.status,
            config=dict(r.config),
        )
        for r in records
    ]


# libyaml's parser when present: linear, and it refuses nesting past 1000 levels (the Python one
# takes seconds on a few thousand brackets, then the loader recurses out).
_PARSER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def _has_alias(text: str) -> bool:
    """Whether the YAML uses an alias (expanding them is how a small document gets huge)."""
    return any(isinstance(event, yaml.AliasEvent) for event in yaml.parse(text, Loader=_PARSER))


def _violation(error: PublishError, source: str, index: int | None = None) -> FieldViolation:
    """A refusal's message (``<source>#<i>: ...`` or ``<source>: ...``) as a field violation
    of ``document[i]`` (`index` for a document checked alone) or of ``document``."""
    found = re.fullmatch(rf"{re.escape(source)}(?:#(\d+))?: (.*)", str(error), re.DOTALL)
    if found is None:
        return FieldViolation("document", str(error))
    at = found.group(1)
    if at is not None and index is not None:
        at = str(index)
    return FieldViolation("document" if at is None else f"document[{at}]", found.group(2))


def _yaml_error(exc: yaml.YAMLError) -> str:
    mark = getattr(exc, "problem_mark", None)
    where = "" if mark is None else f" at line {mark.line + 1}, column {mark.column + 1}"
    return f"not YAML or JSON: {getattr(exc, 'problem', None) or exc}{where}"


class CapabilityPublishService:
    def __init__(
        self,
        db: Database,
        *,
        on_published: Callable[[], Awaitable[Any]] | None = None,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
        samples: SampleCompile | None = None,
    ) -> None:
        self._db, self._catalog, self._clock = db, CatalogQueries(db), clock
        self._on_published = on_published
        # The sample compile against the live sidecars; None in a replica without them.
        self._samples = samples

    def _documents(self, inp: PublishInput, source: str) -> list[dict[str, Any]]:
        violations = []
        if not inp.document.strip():
            violations.append(FieldViolation("document", "is required"))
        elif len(inp.document) > MAX_DOCUMENT_CHARS:
            violations.append(
                FieldViolation("document", f"at most {MAX_DOCUMENT_CHARS} characters")
            )
        if len(inp.source) > MAX_SOURCE_CHARS or "\x00" in inp.source:
            violations.append(
                FieldViolation("source", f"at most {MAX_SOURCE_CHARS} characters, no NUL")
            )
        if violations:
            raise InvalidSpec(violations)
        try:
            if _has_alias(inp.document):
                raise InvalidSpec([FieldViolation("document", "YAML aliases are not allowed")])
            docs = documents_from_text(inp.document, source)
        except yaml.YAMLError as exc:
            raise InvalidSpec([FieldViolation("document", _yaml_error(exc))]) from exc
        except PublishError as exc:
            raise InvalidSpec([_violation(exc, source)]) from exc
        if not docs:
            raise InvalidSpec([FieldViolation("document", "holds no capability entry")])
        return docs

    @staticmethod
    def _check_each(
        docs: list[dict[str, Any]], accounts: list[AccountConfig], now: datetime, source: str
    ) -> None:
        """Each entry on its own, so every bad one is named (the whole, for duplicates, next)."""
        violations = []
        for i, doc in enumerate(docs):
            try:
                plan_publication([doc], accounts, effective_from=now, source=source)
            except PublishError as exc:
                violations.append(_violation(exc, source, i))
        if violations:
            raise InvalidSpec(violations)

    def _plan(
        self, docs: list[dict[str, Any]], accounts: list[AccountConfig], at: datetime, source: str
    ) -> tuple[Publication, list[int]]:
        """The whole document's rows, and the document index of each capability row."""
        indexes: list[int] = []
        for i, doc in enumerate(docs):
            one = plan_publication([doc], accounts, effective_from=at, source=source)
            indexes += [i] * len(one.capabilities)
        try:
            return plan_publication(docs, accounts, effective_from=at, source=source), indexes
        except PublishError as exc:
            raise InvalidSpec([_violation(exc, source)]) from exc

    async def _checked(
        self,
        docs: list[dict[str, Any]],
        now: datetime,
        at: datetime,
        source: str,
        force: Force,
    ) -> tuple[Publication, Any]:
        try:
            accounts = _accounts(await self._catalog.accounts())
            self._check_each(docs, accounts, at, source)
            plan, indexes = self._plan(docs, accounts, at, source)
        except RecursionError:  # the parser and the checks recurse: a bomb of brackets
            raise InvalidSpec([FieldViolation("document", "nested too deeply")]) from None
        prices = {(p.provider, p.account_name, p.model): p for p in plan.prices}
        writes = [
            (i, c, prices.get((c.provider, c.account_name, c.model)))
            for i, c in zip(indexes, plan.capabilities, strict=True)
        ]
        current = await self._catalog.effective_capabilities(now)
        return plan, await check_release(current, writes, (), self._samples, force)

    async def publish(self, inp: PublishInput, caller: Caller = SYSTEM) -> PublishResult:
        ensure_admin(caller, "PublishCapabilities")
        source = inp.source.strip() or DEFAULT_SOURCE
        try:
            docs = self._documents(inp, source)
        except RecursionError:
            raise InvalidSpec([FieldViolation("document", "nested too deeply")]) from None
        version = _version(inp.version, inp.document)
        now = self._clock()
        at = _activation_time(inp, now)
        async with self._db.reads() as reads:
            existing = await reads.release(version)
        if existing is not None:
            return _retried(existing, inp.document, now)
        plan, checked = await self._checked(docs, now, at, source, inp.force)
        forced = inp.force.recorded() if checked.forced else None
        state = "STAGED" if inp.staged else "SCHEDULED" if at > now else "ACTIVE"
        release = ReleaseRow(
            version,
            inp.document,
            source,
            caller.name,
            store.STAGED if inp.staged else store.APPLIED,
            now,
            None if inp.staged else at,
            forced,
            tuple(c.to_json() for c in checked.changes),
        )
        if inp.staged and not inp.dry_run:
            await stage(self._db, release)
            counts = PublishCounts()
        elif inp.staged:
            counts = PublishCounts()
        else:
            action = SCHEDULED if at > now else PUBLISHED
            counts = await write_activation(
                self._db,
                Activation(version, action, caller.name, now, at, checked.changes, forced),
                plan,
                release=release,
                dry_run=inp.dry_run,
            )
        log.info(
            "capability release %s %s by %s from %s (%s%s): %s",
            version,
            "checked (dry run)" if inp.dry_run else state.lower(),
            caller.name,
            source,
            at.isoformat(),
            f", forced: {forced}" if forced else "",
            counts,
        )
        if not inp.dry_run and not inp.staged:
            await self._published()
        return PublishResult(
            _counts(counts),
            inp.dry_run,
            version,
            state,
            None if inp.staged else at,
            checked.changes,
            checked.samples,
            forced or "",
        )

    async def _published(self) -> None:
        if self._on_published is not None:
            await self._on_published()

    async def activate(
        self,
        version: str,
        *,
        activate_at: datetime | None = None,
        force: Force = NO_FORCE,
        caller: Caller = SYSTEM,
    ) -> PublishResult:
        """Activate a staged release (now, or at `activate_at`), through every check again."""
        ensure_admin(caller, "ActivateCapabilities")
        async with self._db.reads() as reads:
            row = await reads.release(version)
        if row is None:
            raise NotFound("capability release", version)
        if row.state != store.STAGED:
            raise PreconditionFailed(
                f"release {version!r} is not staged (it is {row.state})",
                {},
                reason="CAPABILITY_RELEASE_NOT_STAGED",
                labels={"version": version},
            )
        now = self._clock()
        at = _activation_time(PublishInput(row.document, activate_at=activate_at), now)
        docs = self._documents(PublishInput(row.document), row.source)
        plan, checked = await self._checked(docs, now, at, row.source, force)
        forced = force.recorded() if checked.forced else None
        action = SCHEDULED if at > now else ACTIVATED
        counts = await write_activation(
            self._db,
            Activation(version, action, caller.name, now, at, checked.changes, forced),
            plan,
            staged_version=version,
        )
        log.warning("capability release %s activated by %s from %s", version, caller.name, at)
        await self._published()
        state = "SCHEDULED" if at > now else "ACTIVE"
        return PublishResult(
            _counts(counts), False, version, state, at, checked.changes, checked.samples,
            forced or "",
        )  # fmt: skip

    async def rollback(
        self, version: str = "", *, force: Force = NO_FORCE, caller: Caller = SYSTEM
    ) -> PublishResult:
        """Return the catalog to an earlier release (`version`, else the one the current
        release replaced), from now, through the serving check."""
        ensure_admin(caller, "RollbackCapabilities")
        now = self._clock()
        current, target, then = await rollback_target(self._db, version, now)
        restore = rollback_plan(
            await self._catalog.effective_capabilities(then),
            await self._catalog.effective_capabilities(now),
            now,
        )
        writes = [(None, c, p) for c, p in _paired(restore.plan)]
        checked = await check_release(
            await self._catalog.effective_capabilities(now),
            writes,
            restore.removed_keys,
            self._samples,
            force,
        )
        forced = force.recorded() if checked.forced else None
        counts = await write_activation(
            self._db,
            Activation(target.version, ROLLED_BACK, caller.name, now, now, checked.changes, forced),
            restore.plan,
            removed=restore.removed,
        )
        log.warning(
            "capabilities rolled back by %s: %s -> %s%s",
            caller.name,
            current and current.version,
            target.version,
            f" (forced: {forced})" if forced else "",
        )
        await self._published()
        return PublishResult(
            _counts(counts), False, target.version, "ACTIVE", now, checked.changes,
            checked.samples, forced or "",
        )  # fmt: skip

    async def history(self, caller: Caller = SYSTEM) -> CapabilityHistory:
        ensure_admin(caller, "ListCapabilityHistory")
        async with self._db.reads() as reads:
            releases = await reads.releases()
            activations = await reads.release_activations()
        return CapabilityHistory(tuple(releases), tuple(activations))


def _paired(plan: Publication) -> list[tuple[Any, Any]]:
    prices = {(p.provider, p.account_name, p.model): p for p in plan.prices}
    return [(c, prices.get((c.provider, c.account_name, c.model))) for c in plan.capabilities]


def _version(given: str, text: str) -> str:
    version = given.strip() or release_version(text)
    if len(version) > MAX_VERSION_CHARS or not _VERSION_RE.fullmatch(version):
        raise InvalidSpec(
            [
                FieldViolation(
                    "version",
                    f"1..{MAX_VERSION_CHARS} of letters, digits and ._:/@+- (first a letter or"
                    " digit)",
                )
            ]
        )
    return version


def _activation_time(inp: PublishInput, now: datetime) -> datetime:
    at = inp.activate_at
    if at is None:
        return now
    if inp.staged:
        raise InvalidSpec(
            [FieldViolation("activate_at", "a staged release gets its time when activated")]
        )
    if at < now:
        raise InvalidSpec(
            [FieldViolation("activate_at", f"{at.isoformat()} is in the past (now {now})")]
        )
    return at


def _retried(existing: ReleaseRow, text: str, now: datetime) -> PublishResult:
    """A publish of a published release: the same text is a retry, another is refused."""
    if existing.document != text:
        raise InvalidSpec(
            [
                FieldViolation(
                    "version",
                    f"{existing.version!r} is published with another document;"
                    " a release is immutable",
                )
            ]
        )
    eff = existing.effective_from
    state = "STAGED" if eff is None else "SCHEDULED" if eff > now else "ACTIVE"
    changes = tuple(ModelChange.from_json(c) for c in existing.changes)
    return PublishResult(
        _counts(PublishCounts()), False, existing.version, state, eff, changes, 0,
        existing.forced_reason or "", unchanged=True,
    )  # fmt: skip
