"""What a publication would change, per path of the parsed document (design 9.25.5): the diff
an operator reads before and after a publish or a dry run, whichever document it is.

The diff is of the parsed values, not of the text: reordering keys, comments and quoting change
nothing, and a change reads as ``tenants.acme.service_classes.STANDARD.weight: 2 -> 5``. Mappings
are compared key by key; lists element by element (``samples[2].model``), a list that grows or
shrinks adding or removing its tail. A value that appears is ``(absent) -> v``, one that goes is
``v -> (absent)``. Pure: the caller passes both texts, already known to parse.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from vidroute_core.yamldoc import YamlDocumentError, load_one

ABSENT = "(absent)"
MAX_VALUE_CHARS = 120  # a long value (a whole new tenant) is shown shortened: the diff is a summary


@dataclass(frozen=True, slots=True)
class Change:
    """One path whose value differs; `before`/`after` are rendered values or `ABSENT`."""

    path: str
    before: str
    after: str

    def __str__(self) -> str:
        return f"{self.path}: {self.before} -> {self.after}"


def render(value: Any) -> str:
    """A value as one short line: scalars as YAML would read them, containers as compact JSON."""
    if isinstance(value, str):
        text = value if value.strip() == value and value else json.dumps(value)
    elif isinstance(value, bool) or value is None:
        text = json.dumps(value)
    elif isinstance(value, int | float):
        text = repr(value)
    else:
        text = json.dumps(value, sort_keys=True, default=str, separators=(", ", ": "))
    return text if len(text) <= MAX_VALUE_CHARS else text[: MAX_VALUE_CHARS - 3] + "..."


def _join(path: str, key: Any) -> str:
    return f"{path}.{key}" if path else str(key)


def _walk(before: Any, after: Any, path: str, out: list[Change]) -> None:
    if isinstance(before, dict) and isinstance(after, dict):
        for key in sorted(before.keys() | after.keys(), key=str):
            sub = _join(path, key)
            if key not in after:
                out.append(Change(sub, render(before[key]), ABSENT))
            elif key not in before:
                out.append(Change(sub, ABSENT, render(after[key])))
            else:
                _walk(before[key], after[key], sub, out)
        return
    if isinstance(before, list) and isinstance(after, list):
        for i in range(max(len(before), len(after))):
            sub = f"{path}[{i}]"
            if i >= len(after):
                out.append(Change(sub, render(before[i]), ABSENT))
            elif i >= len(before):
                out.append(Change(sub, ABSENT, render(after[i])))
            else:
                _walk(before[i], after[i], sub, out)
        return
    # Equal scalars, or a scalar that became a container (or the reverse): one line.
    if type(before) is not type(after) or before != after:
        out.append(Change(path or "(document)", render(before), render(after)))


def diff_values(before: Any, after: Any) -> list[Change]:
    """Every path whose value differs between two parsed documents, in path order."""
    out: list[Change] = []
    _walk(before, after, "", out)
    return out


def diff_texts(before: str | None, after: str) -> list[Change]:
    """The changes from the text of the active version (None: nothing active) to `after`."""
    try:
        old = {} if before is None else load_one(before)
    except YamlDocumentError:  # a stored row that no longer parses: everything is new
        old = {}
    return diff_values(old, load_one(after))
