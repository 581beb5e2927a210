"""One YAML (or JSON, which is YAML) document from text, for the pure modules that take a file's
text: safe loading only, no aliases (a billion-laughs document must not cost memory), exactly one
document (JSON text read as JSON). Errors are `YamlDocumentError`, a sentence naming the line."""

from __future__ import annotations

import json
from typing import Any

import yaml


class YamlDocumentError(ValueError):
    """The text is not one YAML/JSON document; the message says where and why."""


def _has_alias(text: str) -> bool:
    try:
        return any(isinstance(t, yaml.AliasToken) for t in yaml.scan(text, Loader=yaml.SafeLoader))
    except yaml.YAMLError:
        return False  # the load below reports the syntax error


def load_one(text: str) -> Any:
    """The single document of `text` as plain Python values (None for an empty text). JSON is
    read as JSON first: PyYAML (YAML 1.1) reads a number like ``1e-05`` as a string."""
    if text.lstrip().startswith(("{", "[")):
        try:
            return json.loads(text)
        except ValueError:
            pass  # YAML flow style; the YAML parser reports it if it is neither
    if _has_alias(text):
        raise YamlDocumentError("YAML aliases are not allowed")
    try:
        docs = list(yaml.safe_load_all(text))
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        problem = getattr(exc, "problem", None) or str(exc)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
        raise YamlDocumentError(f"not YAML or JSON: {where}{problem}") from exc
    docs = [d for d in docs if d is not None]
    if len(docs) > 1:
        raise YamlDocumentError(f"holds {len(docs)} YAML documents; a policy file is one")
    return docs[0] if docs else None
