"""No SQL outside `controlplane/persistence/`: the unit of work is the only writer.

The scanner reads every module of the control plane and of every other deployable (the clients,
the kernel, the adapter sidecars and emulators, the SDK) with `ast` and reports

* an import of ``sqlalchemy`` (or a driver: ``asyncpg``, ``aiosqlite``, ``sqlite3``, ``psycopg``),
* a call of ``execute`` / ``exec_driver_sql`` / ``scalar`` / ``scalars`` / ``begin`` on something
  named like a database handle (``conn``, ``connection``, ``session``, ``engine``, ``raw``, with
  or without a leading underscore or attribute path, e.g. ``self._store.engine.begin()``),
* any use of a ``.conn`` attribute (issue 22: ``u.conn`` handed a unit's connection to write
  functions outside the unit); the one foreign ``conn`` allowed is uvicorn's: ``self.conn`` (an
  ``h11.Connection``) inside a subclass of ``H11Protocol``,
* a call of ``reading()`` (``Database.reading`` yields a bare connection: services read through
  the named reads of ``db.reads()``) and an import of a connection type (``Connection``,
  ``AsyncConnection``) from the persistence package, so no read hands a connection out either,
* SQL text in a string (``SELECT ... FROM``, ``INSERT INTO``, ``UPDATE t SET``, ``DELETE FROM``,
  DDL; keywords in capitals, so English prose passes), docstrings aside,

anywhere but in the persistence package. Redis pipelines (``pipe.execute()``) are not database
handles and pass. The scanner itself is tested on synthetic sources, so it can fail.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# Every package that ships; bench/, scripts/ and tests/ are tools around the database.
SCANNED = ("controlplane", "clients", "vidroute_core", "adapter_sidecars", "vidroute")
ALLOWED = ROOT / "controlplane" / "persistence"
DB_MODULES = frozenset({"sqlalchemy", "asyncpg", "aiosqlite", "sqlite3", "psycopg", "psycopg2"})
DB_HANDLES = frozenset({"conn", "connection", "session", "engine", "raw", "db_conn"})
SQL_CALLS = frozenset({"execute", "exec_driver_sql", "scalar", "scalars", "begin", "stream"})
# `Database.reading()` yields a connection; above persistence the named reads (`db.reads()`).
CONNECTION_CALLS = frozenset({"reading"})
CONNECTION_TYPES = frozenset({"Connection", "AsyncConnection"})
# Classes whose own ``self.conn`` is not a database connection (uvicorn's h11 protocol).
FOREIGN_CONN_BASES = frozenset({"H11Protocol"})
SQL_TEXT = re.compile(
    r"\b(SELECT\b[\s\S]*\bFROM|INSERT\s+INTO|UPDATE\s+\S+\s+SET|DELETE\s+FROM"
    r"|(CREATE|ALTER|DROP)\s+(TABLE|INDEX)|TRUNCATE\s+\w)",
)  # keywords in capitals, as every statement in this code base is written


def _handle_name(node: ast.expr) -> str:
    """The last name of the receiver of a call: ``self._store.engine`` -> ``engine``."""
    if isinstance(node, ast.Name):
        return node.id.lstrip("_")
    if isinstance(node, ast.Attribute):
        return node.attr.lstrip("_")
    return ""


def _docstrings(tree: ast.Module) -> set[int]:
    """The ids of the docstring constants of `tree` (prose may name SQL)."""
    owners = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
    return {
        id(n.body[0].value)
        for n in ast.walk(tree)
        if isinstance(n, owners)
        and n.body
        and isinstance(n.body[0], ast.Expr)
        and isinstance(n.body[0].value, ast.Constant)
    }


def _foreign_conns(tree: ast.Module) -> set[int]:
    """The ids of ``self.conn`` nodes inside classes whose ``conn`` is not a database's."""
    allowed: set[int] = set()
    for cls in ast.walk(tree):
        if isinstance(cls, ast.ClassDef) and any(
            _handle_name(b) in FOREIGN_CONN_BASES for b in cls.bases
        ):
            allowed.update(
                id(n)
                for n in ast.walk(cls)
                if isinstance(n, ast.Attribute)
                and n.attr == "conn"
                and isinstance(n.value, ast.Name)
                and n.value.id == "self"
            )
    return allowed


def violations(source: str, path: str) -> list[str]:
    """What in `source` (the module at `path`) speaks SQL; empty when nothing does."""
    found: list[str] = []
    tree = ast.parse(source, filename=path)
    docstrings, foreign = _docstrings(tree), _foreign_conns(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr == "conn" and id(node) not in foreign:
            found.append(f"{path}:{node.lineno}: .conn")
        elif (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and id(node) not in docstrings
            and SQL_TEXT.search(node.value)
        ):
            found.append(f"{path}:{node.lineno}: SQL text")
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] in DB_MODULES:
                    found.append(f"{path}:{node.lineno}: import {alias.name}")
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level == 0 and module.split(".")[0] in DB_MODULES:
                found.append(f"{path}:{node.lineno}: from {module} import ...")
            elif module.startswith("controlplane.persistence") and any(
                a.name in CONNECTION_TYPES for a in node.names
            ):
                found.append(f"{path}:{node.lineno}: a connection type from {module}")
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in CONNECTION_CALLS
        ):
            found.append(f"{path}:{node.lineno}: {node.func.attr}() hands out a connection")
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in SQL_CALLS
            and _handle_name(node.func.value) in DB_HANDLES
        ):
            found.append(
                f"{path}:{node.lineno}: {_handle_name(node.func.value)}.{node.func.attr}()"
            )
    return sorted(found, key=lambda v: int(v.split(":")[1]))


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


def test_the_scanner_finds_a_held_connection_and_sql_text() -> None:
    """A unit's connection handed on, or SQL written as text, is reported with its line."""
    source = (
        '"""A docstring may say SELECT id FROM tasks."""\n'
        "async def f(u, store):\n"
        "    await store.note(u.conn, 1)\n"
        "    conn = u.conn\n"
        "    await store.run('SELECT id FROM generation_tasks WHERE id = 1')\n"
        "    await store.run(f'UPDATE tasks SET x = {1}')\n"
        "    await store.run('DELETE FROM outbox')\n"
        "class Proto(Base):\n"
        "    def f(self):\n"
        "        return self.conn\n"
    )
    found = violations(source, "controlplane/service/bad.py")
    assert found == [
        "controlplane/service/bad.py:3: .conn",
        "controlplane/service/bad.py:4: .conn",
        "controlplane/service/bad.py:5: SQL text",
        "controlplane/service/bad.py:6: SQL text",
        "controlplane/service/bad.py:7: SQL text",
        "controlplane/service/bad.py:10: .conn",
    ]


def test_the_scanner_allows_uvicorns_own_connection_only() -> None:
    """``self.conn`` of an ``H11Protocol`` subclass is h11's, not a database's; any other
    ``.conn`` in the same class is still reported, and so is plain prose in a string."""
    source = (
        "class P(H11Protocol):\n"
        "    def f(self, u):\n"
        "        state = self.conn.their_state\n"
        "        return u.conn\n"
        "MESSAGE = 'select a model from the list'\n"
    )
    assert violations(source, "controlplane/execution/srv.py") == [
        "controlplane/execution/srv.py:4: .conn",
    ]


def test_the_scanner_finds_a_read_connection_handed_out() -> None:
    """A read connection taken above persistence (``db.reading()``, a connection type imported
    from it) is reported with its line; the named reads of ``db.reads()`` pass."""
    source = (
        "from controlplane.persistence.database import Connection, Database\n"
        "async def f(db, store):\n"
        "    async with db.reading() as conn:\n"
        "        return await store.versions(conn)\n"
        "async def g(self):\n"
        "    async with self._db.reads() as reads:\n"
        "        return await reads.documents(DOCS).versions()\n"
        "async def h(self, load):\n"
        "    async with self._store.db.reading() as c:\n"
        "        await load(c)\n"
    )
    assert violations(source, "controlplane/service/bad.py") == [
        "controlplane/service/bad.py:1: a connection type from controlplane.persistence.database",
        "controlplane/service/bad.py:3: reading() hands out a connection",
        "controlplane/service/bad.py:9: reading() hands out a connection",
    ]


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
        "controlplane/scheduling/bad.py:8: SQL text",
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
    """The one room allowed to speak SQL is the one the scan skips; every other shipped package
    is read."""
    modules = _modules()
    assert all(ALLOWED not in p.parents for p in modules)
    assert {p.relative_to(ROOT).parts[0] for p in modules} == set(SCANNED)
    assert (ALLOWED / "unit.py").exists()
