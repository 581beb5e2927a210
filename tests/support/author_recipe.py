"""The README's adapter-author recipe as data: its ``sh`` block and the per-adapter variables.

The block's one live variables line (``adapter=runway emulator_port=8101 adapter_port=8061
emulator_flags=...``) is followed by the same line, commented, for the other adapters. Running
the recipe for another adapter, or on other ports, replaces that one line and nothing else
(`for_adapter`): every other line runs exactly as a reader types it.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping

_VARIABLES = re.compile(r"^(#\s*\w+:\s*)?(adapter=\S+ .*)$")


def recipe_block(readme: str) -> str:
    """The first ``sh`` block of the README's "For adapter authors" section."""
    section = readme.split("\n## For adapter authors", 1)[1].split("\n## ", 1)[0]
    match = re.search(r"```sh\n(.*?)```", section, re.S)
    if match is None:
        raise ValueError("no sh block in README's For adapter authors section")
    return match.group(1)


def recipe_variables(block: str) -> dict[str, dict[str, str]]:
    """adapter -> its variables (``adapter``, ``emulator_port``, ...), live or commented line."""
    found: dict[str, dict[str, str]] = {}
    for line in block.splitlines():
        match = _VARIABLES.match(line.strip())
        if match:
            values = dict(word.split("=", 1) for word in shlex.split(match.group(2)))
            found[values["adapter"]] = values
    return found


def _line(values: Mapping[str, str]) -> str:
    return " ".join(f"{key}={shlex.quote(value)}" for key, value in values.items())


def for_adapter(block: str, adapter: str, ports: Mapping[str, int] | None = None) -> str:
    """`block` with its live variables line set to `adapter`'s (ports replaced by `ports`)."""
    values = dict(recipe_variables(block)[adapter])
    values.update({key: str(port) for key, port in (ports or {}).items()})
    lines = block.splitlines()
    live = [i for i, line in enumerate(lines) if line.startswith("adapter=")]
    if len(live) != 1:
        raise ValueError(f"the recipe must have exactly one live variables line, found {len(live)}")
    lines[live[0]] = _line(values)
    return "\n".join(lines) + "\n"
