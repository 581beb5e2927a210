"""No SQL outside `controlplane/persistence/`: the unit of work is the only writer.

The scanner reads every module of the control plane (and the clients) with `ast` and reports

* an import of ``sqlalchemy`` (or a driver: ``asyncpg``, ``aiosqlite``, ``sqlite3``, ``psycopg``),
* a call of ``execute`` / ``exec_driver_sql`` / ``scalar`` / ``scalars`` / ``begin`` on something
  named like a database handle (``conn``, ``connection``, ``session``, ``engine``, ``raw``, with
  or without a leading underscore or attribute path, e.g. ``self._store.engine.begin()``),

anywhere but in the persistence package. Redis pipelines (``pipe.execute()``) are not database
handles and pass. The scanner itself is tested on synthetic sources, so it can fail.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCANNED = ("controlplane", "clients")
ALLOWED = ROOT / "controlplane" / "persistence"
DB_MODULES = frozenset({"sqlalchemy", "asyncpg", "aiosqlite", "sqlite3", "psycopg", "psycopg2"})
DB_HANDLES = frozenset({"conn", "connection", "session", "engine", "raw", "db_conn"})
SQL_CALLS = frozenset({"execute", "exec_driver_sql", "scalar", "scalars", "begin", "stream"})


def _handle_name(node: ast.expr) -> str:
    """The last name of the receiver of a call: ``self._store.engine`` -> ``engine``."""
    if isinstance(node, ast.Name):
        return node.id.lstrip("_")
    if isinstance(node, ast.Attribute):
        return node.attr.lstrip("_")
    return ""


def violations(source: str, path: str) -> list[str]:
    """What in `source` (the module at `path`) speaks SQL; empty when nothing does."""
    found: list[str] = []
    for node in ast.walk(ast.parse(source, filename=path)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] in DB_MODULES:
                    found.append(f"{path}:{node.lineno}: import {alias.name}")
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level == 0 and module.split(".")[0] in DB_MODULES:
                found.append(f"{path}:{node.lineno}: from {module} import ...")
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in SQL_CALLS
            and _handle_name(node.func.value) in DB_HANDLES
        ):
            found.append(
                f"{path}:{node.lineno}: {_handle_name(node.func.value)}.{node.func.attr}()"
            )
    return found


def _modules() -> list[Path]:
    return sorted(
        p
        for top in SCANNED
        for p in (ROOT / top).rglob("*.py")
        if ALLOWED not in p.parents and "__pycache__" not in p.parts
    )


def test_no_module_outside_persistence_speaks_sql() -> None:
    """The rooms above persistence hold no SQL, no SQLAlchemy and no database driver."""
    modules = _modules()
    assert len(modules) > 50  # the scan really covers the control plane
    found = [v for p in modules for v in violations(p.read_text(), str(p.relative_to(ROOT)))]
    assert found == [], "\n".join(found)


def test_the_scanner_finds_sql_in_a_synthetic_module() -> None:
    """Each kind of violation is reported, with its line."""
    source = (
        "from sqlalchemy import select\n"
        "import sqlalchemy.ext.asyncio\n"
        "async def f(conn, self):\n"
        "    await conn.execute(select(1))\n"
        "    await self._session.execute('x')\n"
        "    async with self._store.engine.begin() as c:\n"
        "        await c.scalar('y')\n"
        "    await conn.exec_driver_sql('DELETE FROM t')\n"
    )
    found = violations(source, "controlplane/scheduling/bad.py")
    assert found == [
        "controlplane/scheduling/bad.py:1: from sqlalchemy import ...",
        "controlplane/scheduling/bad.py:2: import sqlalchemy.ext.asyncio",
        "controlplane/scheduling/bad.py:4: conn.execute()",
        "controlplane/scheduling/bad.py:5: session.execute()",
        "controlplane/scheduling/bad.py:6: engine.begin()",
        "controlplane/scheduling/bad.py:8: conn.exec_driver_sql()",
    ]


def test_the_scanner_leaves_other_execute_calls_alone() -> None:
    """Redis pipelines, unit-of-work calls and persistence imports are not SQL here."""
    source = (
        "from controlplane.persistence.database import Database\n"
        "async def f(pipe, db, u):\n"
        "    await pipe.execute()\n"
        "    async with db.unit(now) as u:\n"
        "        await u.move_task(task, target)\n"
    )
    assert violations(source, "controlplane/scheduling/good.py") == []


def test_persistence_is_outside_the_scan() -> None:
    """The one room allowed to speak SQL is the one the scan skips."""
    assert all(ALLOWED not in p.parents for p in _modules())
    assert (ALLOWED / "unit.py").exists()
