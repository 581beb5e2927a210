"""Every environment variable the code reads is in README's Configuration table, and every
variable the table lists is read by some code (issue 13: "every environment variable in one
README table ... checked against the settings code").

Read from the source with `ast`, nothing imported: a variable is a string literal that is a whole
``VIDROUTE_*`` name (``env.get("VIDROUTE_LISTEN")``, ``"VIDROUTE_TLS_CERT_FILE"``), or an
f-string template of one (``f"VIDROUTE_ADAPTER_{key.upper()}_TIMEOUT"`` is the table's
``VIDROUTE_ADAPTER_<NAME>_TIMEOUT``), in the deployables, the kernel and the clients. Docstrings
and messages that mention a variable inside a sentence are not reads.
"""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("controlplane", "adapter_sidecars", "clients", "vidroute_core")
NAME = re.compile(r"VIDROUTE_[A-Z0-9_]*[A-Z0-9]")
# A table row's names: `VIDROUTE_X` in its first cell; <NAME> stands for an f-string's hole.
ROW_NAME = re.compile(r"`(VIDROUTE_[A-Z0-9_<>]+)`")


def _template(node: ast.JoinedStr) -> str | None:
    """An f-string as a name with ``<…>`` holes, when its literal text makes a VIDROUTE_ name."""
    parts = [
        v.value if isinstance(v, ast.Constant) and isinstance(v.value, str) else "<NAME>"
        for v in node.values
    ]
    text = "".join(parts)
    probe = text.replace("<NAME>", "X")
    return text if text.startswith("VIDROUTE_") and NAME.fullmatch(probe) else None


def names_in_code(source: str) -> set[str]:
    """The VIDROUTE_ variables a module's code names as whole string literals or templates."""
    found: set[str] = set()
    tree = ast.parse(source)
    formatted = {id(v) for n in ast.walk(tree) if isinstance(n, ast.JoinedStr) for v in n.values}
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):
            template = _template(node)
            if template is not None:
                found.add(template)
        elif (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and id(node) not in formatted
            and NAME.fullmatch(node.value)
        ):
            found.add(node.value)
    return found


@functools.cache
def read_by_code() -> dict[str, list[str]]:
    """Variable -> the files that read it (scanned once per run)."""
    out: dict[str, list[str]] = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            for name in names_in_code(path.read_text(encoding="utf-8")):
                out.setdefault(name, []).append(str(path.relative_to(ROOT)))
    return out


def readme_table() -> set[str]:
    """The names in the first cell of each row of README's Configuration table."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text.split("\n## Configuration", 1)[1].split("\n## ", 1)[0]
    names: set[str] = set()
    for line in section.splitlines():
        if line.startswith("| `"):
            names.update(ROW_NAME.findall(line.split(" | ", 1)[0]))
    return names


def test_the_collector_finds_literals_and_templates_but_not_sentences() -> None:
    """The source scan sees a read, a template and a constant, never a mention in a message."""
    source = (
        '"""Reads VIDROUTE_DOCUMENTED."""\n'
        'a = env.get("VIDROUTE_LISTEN")\n'
        'b = env.get(f"VIDROUTE_ADAPTER_{key.upper()}_TIMEOUT")\n'
        'c = f"set VIDROUTE_FOO to {x}"\n'
        'raise ValueError("VIDROUTE_BAR must be set")\n'
        'd = f"{name}: VIDROUTE_BAZ"\n'
    )
    assert names_in_code(source) == {"VIDROUTE_LISTEN", "VIDROUTE_ADAPTER_<NAME>_TIMEOUT"}


def test_every_variable_read_is_in_the_readme_table() -> None:
    """A VIDROUTE_ variable some code reads but README's Configuration table lacks fails here,
    named with the files that read it."""
    documented = readme_table()
    missing = {name: files for name, files in read_by_code().items() if name not in documented}
    assert not missing, f"add rows to README's Configuration table for: {missing}"


def test_every_table_row_is_read_by_some_code() -> None:
    """A name in the table that no code reads (a renamed or removed variable) fails here."""
    stale = readme_table() - set(read_by_code())
    assert not stale, f"README's Configuration table lists variables nothing reads: {stale}"
