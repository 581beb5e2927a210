"""The text of a versioned document (a routing policy, a tenants document) before its own rules:
present, within its size, and one YAML or JSON document; and `Checker`, the violations its
reader collects. Pure: the caller passes the text."""

from __future__ import annotations

from typing import Any

from vidroute_core.exceptions import InvalidSpec
from vidroute_core.validation import FieldViolation
from vidroute_core.yamldoc import YamlDocumentError, load_one


def load_document(text: str, max_chars: int, error: type[InvalidSpec]) -> Any:
    """The single document of `text` as plain values, or `error` naming why it is none."""
    if not text.strip():
        raise error([FieldViolation("document", "is required")])
    if len(text) > max_chars:
        raise error([FieldViolation("document", f"at most {max_chars} characters")])
    try:
        return load_one(text)
    except YamlDocumentError as exc:
        raise error([FieldViolation("document", str(exc))]) from exc


class Checker:
    """Collects violations; each reader returns a usable default so checking goes on."""

    def __init__(self) -> None:
        self.found: list[FieldViolation] = []

    def bad(self, path: str, message: str) -> None:
        self.found.append(FieldViolation(path, message))

    def integer(self, value: Any, path: str, lo: int, hi: int) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            self.bad(path, f"must be an integer, got {value!r}")
            return lo
        if not lo <= value <= hi:
            self.bad(path, f"must be in [{lo}, {hi}], got {value}")
            return lo
        return value
