"""What publishing a versioned document means, whichever document it is (routing policies,
tenants and accounts documents): the recorded source's bounds, and the immutability of a
version; and `DocumentBook`, the active document of a kind as its readers see it.

`routing_policies`, `tenants` and `accounts` publish through these, so a retried publish and a
refused one read the same in every document's API.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Generic, Protocol, TypeVar

from controlplane.persistence.database import Database
from controlplane.persistence.documents import DocumentRow, Documents
from vidroute_core.exceptions import InvalidSpec, NotFound
from vidroute_core.validation import FieldViolation

log = logging.getLogger(__name__)

MAX_SOURCE_CHARS = 200


class _Published(Protocol):
    @property
    def version(self) -> str: ...

    @property
    def document(self) -> str: ...


R = TypeVar("R", bound=_Published)


def checked_source(source: str, default: str) -> str:
    """`source` stripped (empty: `default`), or `InvalidSpec` when too long or holding a NUL."""
    source = source.strip() or default
    if len(source) > MAX_SOURCE_CHARS or "\x00" in source:
        raise InvalidSpec(
            [FieldViolation("source", f"at most {MAX_SOURCE_CHARS} characters, no NUL")]
        )
    return source


def same_text(existing: R, text: str) -> R:
    """A publish of a published version: the same text is a retry, another is refused."""
    if existing.document != text:
        raise InvalidSpec(
            [
                FieldViolation(
                    "version",
                    f"{existing.version!r} is published with another document;"
                    " a version is immutable",
                )
            ]
        )
    return existing


class _Versioned(Protocol):
    @property
    def version(self) -> str: ...


D = TypeVar("D", bound=_Versioned)


@dataclass(frozen=True)
class DocumentKind(Generic[D]):
    """What a `DocumentBook` reads: a kind's versions, its parser and its built-in document."""

    noun: str  # "tenants", "accounts": log lines
    store: Documents
    parse: Callable[[str], D]  # the whole document validated, or InvalidSpec
    builtin: D  # in use while nothing is published


class DocumentBook(Generic[D]):
    """The active document as every reader sees it: re-read when older than the reader's bound
    (a dispatcher: every round; CreateTask: at most once a second per replica), and at once in
    the replica that published (`invalidate`). Before any publication it is the built-in one."""

    def __init__(
        self, db: Database, kind: DocumentKind[D], *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._db, self._kind, self._clock = db, kind, clock
        self._document = kind.builtin
        self._read_at = -math.inf

    def invalidate(self) -> None:
        """A publish or rollback happened here: the next read goes to the database."""
        self._read_at = -math.inf

    async def current(self, max_age_s: float = 1.0) -> D:
        now = self._clock()
        if now - self._read_at <= max_age_s:
            return self._document
        async with self._db.reads() as reads:
            docs = reads.documents(self._kind.store)
            name = await docs.active_version()
            if name is None:
                self._document = self._kind.builtin
            elif name != self._document.version:
                row = await docs.version(name)
                if row is not None:
                    self._load(row)
        self._read_at = now
        return self._document

    @property
    def latest(self) -> D:
        """The document the last `current` read (no I/O)."""
        return self._document

    def _load(self, row: DocumentRow) -> None:
        try:
            self._document = self._kind.parse(row.document)
        except InvalidSpec:  # validated at publication; a bad row must not stop the service
            noun = self._kind.noun
            log.exception("%s %s does not parse; keeping %s", noun, row.version, self.version)
            return
        log.info("%s %s active", self._kind.noun, row.version)

    @property
    def version(self) -> str:
        return self._document.version


async def version_or_builtin(
    db: Database, store: Documents, version: str, builtin: tuple[str, str], noun: str
) -> DocumentRow:
    """The named version, else the active one, else the kind's built-in document (`builtin`:
    its version and text; never stored); `NotFound` for a version never published."""
    async with db.reads() as reads:
        docs = reads.documents(store)
        row = await (docs.version(version) if version else docs.active())
    name, text = builtin
    if row is None and version and version != name:
        raise NotFound(f"{noun} version", version)
    if row is None:
        return DocumentRow(
            name, text, "built in", not version, datetime.fromtimestamp(0, UTC), None
        )
    return row
