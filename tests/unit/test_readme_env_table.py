"""README's Configuration table lists exactly the declared variables (`vidroute_core.settings`),
and no code names a ``VIDROUTE_*`` variable that is not declared (issue 13: "every environment
variable in one README table ... checked against the settings code"; issue 21: declared once).

The declarations are imported; the code is read from the source with `ast`, nothing imported: a
name is a string literal that is a whole ``VIDROUTE_*`` name (``env.get("VIDROUTE_LISTEN")``,
``"VIDROUTE_TLS_CERT_FILE"``), or an f-string template of one (``f"VIDROUTE_ADAPTER_{k}_TIMEOUT"``
stands for every declared name it matches), in the deployables, the kernel, the clients, the
tests and the benchmarks. Docstrings and messages that mention a variable inside a sentence are
not reads.
"""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

from vidroute_core.settings import OTHER_PROGRAMS, PROGRAMS, known_names

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("controlplane", "adapter_sidecars", "clients", "vidroute_core", "tests", "bench")
# Names the tests use precisely because nothing declares them (typos and examples).
UNDECLARED_ON_PURPOSE = frozenset(
    {"VIDROUTE_MADE_UP", "VIDROUTE_DATABSE_URL", "VIDROUTE_ADAPTER_BASE_URI"}
)
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
def named_by_code() -> dict[str, list[str]]:
    """Variable (or template) -> the files that name it (scanned once per run)."""
    out: dict[str, list[str]] = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            for name in names_in_code(path.read_text(encoding="utf-8")):
                out.setdefault(name, []).append(str(path.relative_to(ROOT)))
    return out


def declared(name: str, known: frozenset[str]) -> bool:
    """Whether `name` (a ``<NAME>`` template matching at least one) is a declared name."""
    if "<NAME>" not in name:
        return name in known
    pattern = re.compile(re.escape(name).replace(re.escape("<NAME>"), "[A-Z0-9_]+"))
    return any(pattern.fullmatch(k) for k in known)


def programs_variables() -> set[str]:
    """The variables the programs declare (not `OTHER_PROGRAMS`: test and bench knobs)."""
    return {name for program in PROGRAMS for name in program.variables()}


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


def test_every_declared_variable_is_in_the_readme_table() -> None:
    """A variable a program declares but README's Configuration table lacks fails here."""
    missing = programs_variables() - readme_table()
    assert not missing, f"add rows to README's Configuration table for: {sorted(missing)}"


def test_every_table_row_is_declared() -> None:
    """A name in the table that no program declares (renamed or removed) fails here."""
    stale = readme_table() - programs_variables()
    assert not stale, f"README's Configuration table lists undeclared variables: {stale}"


def test_every_variable_the_code_names_is_declared() -> None:
    """A module (or test, or benchmark) naming a VIDROUTE_ variable nobody declares fails here,
    with its files: a program would refuse that name at start."""
    known = known_names()
    stray = {
        name: files
        for name, files in named_by_code().items()
        if not declared(name, known) and name not in UNDECLARED_ON_PURPOSE
    }
    assert not stray, f"declare in vidroute_core.settings (a program or OTHER_PROGRAMS): {stray}"


def test_the_other_programs_names_are_not_the_programs() -> None:
    """A name is declared for a program or for another program, never both."""
    assert not set(OTHER_PROGRAMS) & programs_variables()


def test_the_rule_fails_on_an_undeclared_name() -> None:
    """The check above is not vacuous: a made-up name is not declared, a template of declared
    names is, and one of nothing is not."""
    known = known_names()
    assert not declared("VIDROUTE_MADE_UP", known)
    assert declared("VIDROUTE_ADAPTER_<NAME>_TIMEOUT", known)
    assert not declared("VIDROUTE_NOTHING_<NAME>_HERE", known)
