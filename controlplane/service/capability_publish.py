"""PublishCapabilities, transport-neutral: an admin publishes a capability document.

The document is a capabilities file's text (YAML, or JSON, which is YAML): every entry goes
through the same checks as the sidecars' files and Describe (`controlplane.capabilities.publish`),
against the accounts the catalog has (an entry naming an account we do not have registers it by
reference when it names its region). Any bad entry rejects the whole document with
`InvalidSpec`: one field violation per bad entry (``document[i]``), or one for the document
(``document``: not YAML, too large, aliases, a duplicate across entries, a version conflict);
nothing is written. A dry run checks everything, the database's conflicts included, and rolls
back: its counts are what a real run would write.
"""

from __future__ import annotations

import dataclasses
import logging
import re
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import yaml

from controlplane.capabilities.publish import (
    AccountConfig,
    PublishError,
    documents_from_text,
    plan_publication,
    publish_documents,
)
from controlplane.persistence.catalog import AccountRecord, CatalogQueries, PublishCounts
from controlplane.persistence.database import Database
from controlplane.service.access import SYSTEM, Caller, ensure_admin
from vidroute_core.exceptions import InvalidSpec
from vidroute_core.validation import FieldViolation

log = logging.getLogger(__name__)

MAX_DOCUMENT_CHARS = 1_000_000
MAX_SOURCE_CHARS = 200
DEFAULT_SOURCE = "PublishCapabilities"


@dataclass(frozen=True, slots=True)
class PublishInput:
    document: str
    source: str = ""
    dry_run: bool = False


@dataclass(frozen=True, slots=True)
class PublishResult:
    """Rows written (or that a dry run would write) per kind."""

    counts: Mapping[str, int]
    dry_run: bool


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
    ) -> None:
        self._db, self._catalog, self._clock = db, CatalogQueries(db), clock
        self._on_published = on_published

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

    async def publish(self, inp: PublishInput, caller: Caller = SYSTEM) -> PublishResult:
        ensure_admin(caller, "PublishCapabilities")
        source = inp.source.strip() or DEFAULT_SOURCE
        try:
            docs = self._documents(inp, source)
            accounts = _accounts(await self._catalog.accounts())
            now = self._clock()
            self._check_each(docs, accounts, now, source)
        except RecursionError:  # the parser and the checks recurse: a bomb of brackets
            raise InvalidSpec([FieldViolation("document", "nested too deeply")]) from None
        try:
            counts = await publish_documents(
                self._db, docs, accounts, now=now, source=source, dry_run=inp.dry_run
            )
        except PublishError as exc:
            raise InvalidSpec([_violation(exc, source)]) from exc
        log.info(
            "capabilities %s by %s from %s: %s",
            "checked (dry run)" if inp.dry_run else "published",
            caller.name,
            source,
            counts,
        )
        if not inp.dry_run and self._on_published is not None:
            await self._on_published()
        return PublishResult(_counts(counts), inp.dry_run)
