"""The text of a versioned document (a routing policy, a tenants document) before its own rules:
present, within its size, and one YAML or JSON document; `Checker`, the violations its
reader collects with the readers every document shares; and `join_path`, how a violation names
where it is. Pure: the caller passes the text."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from vidroute_core.exceptions import InvalidSpec
from vidroute_core.validation import IDENTIFIER_RE, FieldViolation
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

    def header(self, top: Mapping[str, Any]) -> tuple[str, str]:
        """The document's required ``version`` and optional ``description``."""
        version = ""
        if "version" not in top:
            self.bad("version", "is required")
        else:
            version = self.identifier(top["version"], "version")
        description = top.get("description", "")
        if not isinstance(description, str) or len(description) > 2000:
            self.bad("description", "must be a string of at most 2000 characters")
            description = ""
        return version, description

    def fields(self, value: Any, path: str, allowed: frozenset[str] | None) -> dict[str, Any]:
        """`value`'s string keys (those in `allowed`, when given); every other key reported."""
        if not isinstance(value, Mapping):
            self.bad(path or "document", f"must be a mapping, got {type(value).__name__}")
            return {}
        out: dict[str, Any] = {}
        for key, item in value.items():
            if not isinstance(key, str):
                self.bad(path or "document", f"key {key!r} must be a string")
            elif allowed is not None and key not in allowed:
                where = join_path(path, key)
                self.bad(where, f"unknown field (known: {', '.join(sorted(allowed))})")
            else:
                out[key] = item
        return out

    def bounded(self, value: Any, path: str, lo: float, hi: float, *, open_lo: bool) -> float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            self.bad(path, f"must be a number, got {type(value).__name__}")
            return hi
        low_ok = value > lo if open_lo else value >= lo
        if not math.isfinite(value) or not low_ok or value > hi:
            bracket = "(" if open_lo else "["
            self.bad(path, f"must be in {bracket}{lo:g}, {hi:g}], got {value!r}")
            return hi
        return float(value)

    def identifier(self, value: Any, path: str) -> str:
        if not isinstance(value, str) or not IDENTIFIER_RE.fullmatch(value):
            self.bad(path, f"must match {IDENTIFIER_RE.pattern}, got {value!r}")
            return ""
        return value


def join_path(path: str, key: str) -> str:
    """`path` one key deeper: ``a.b`` for a plain key, ``a["gen4.5"]`` for one with a dot."""
    simple = IDENTIFIER_RE.fullmatch(key) and "." not in key
    step = f".{key}" if simple else f'["{key}"]'
    return f"{path}{step}" if path else step.lstrip(".")
