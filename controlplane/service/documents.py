"""What publishing a versioned document means, whichever document it is (routing policies,
tenants documents): the recorded source's bounds, and the immutability of a version.

Both `routing_policies` and `tenants` publish through these, so a retried publish and a refused
one read the same in every document's API.
"""

from __future__ import annotations

from typing import Protocol, TypeVar

from vidroute_core.exceptions import InvalidSpec
from vidroute_core.validation import FieldViolation

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
