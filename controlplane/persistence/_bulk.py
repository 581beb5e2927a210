"""Multi-row INSERTs of a dispatch batch, one array per column on PostgreSQL (issue 10).

SQLAlchemy's multi-row INSERT (``insertmanyvalues``) renders one bind per value: a batch of 256
decisions, attempts, 768 events and 256 outbox rows is ~15,000 binds, and building, binding and
parsing them was most of the batch transaction's client time (bench/RESULTS.md). On PostgreSQL
the rows go instead as one array per column into ``INSERT ... SELECT * FROM unnest(...)``: one
statement per table, compiled and prepared once per (table, columns), ~20 binds whatever the
batch. JSON columns travel as text arrays cast to JSONB in the statement, encoded by orjson (in
C: ~14x ``json.dumps`` on a decision snapshot; the same values, so the same JSONB). SQLite keeps
the plain multi-row INSERT.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

import orjson
from sqlalchemy import JSON, Column, Table, Text, bindparam, cast, column, func, insert, select
from sqlalchemy.dialects import postgresql
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.ext.asyncio import AsyncConnection
from sqlalchemy.sql import Executable

__all__ = ["JsonText", "insert_rows", "unnest_insert", "unnest_params"]

_STATEMENTS: dict[tuple[str, tuple[str, ...], tuple[str, ...]], Executable] = {}
#: Non-str keys as ``json.dumps`` writes them (int keys as strings); datetimes and dataclasses
#: are not encoded by orjson, so they fail over to ``json.dumps`` and raise as they always did.
_JSON_OPTIONS = (
    orjson.OPT_NON_STR_KEYS | orjson.OPT_PASSTHROUGH_DATETIME | orjson.OPT_PASSTHROUGH_DATACLASS
)


class JsonText(bytes):
    """A JSON column's value already rendered as UTF-8 JSON text (`explain.as_json`): written
    as it is on PostgreSQL, parsed back for SQLite's JSON type."""

    __slots__ = ()


def _json_text(value: Any) -> str:
    """`value` as JSON text with the values ``json.dumps`` gives; what orjson refuses (a tuple
    subclass, an int past 64 bits, ...) goes through ``json.dumps``. Rendered text as it is."""
    if type(value) is JsonText:
        return value.decode()
    try:
        return orjson.dumps(value, option=_JSON_OPTIONS).decode()
    except TypeError:  # orjson.JSONEncodeError is a TypeError
        return json.dumps(value)


def _is_json(col: Column[Any]) -> bool:
    return isinstance(col.type, JSON)


def _unnest_statement(
    table: Table, names: tuple[str, ...], returning: tuple[str, ...]
) -> Executable:
    kinds = [Text() if _is_json(table.c[n]) else table.c[n].type for n in names]
    src = (
        func.unnest(
            *(bindparam(f"a_{n}", type_=ARRAY(k)) for n, k in zip(names, kinds, strict=True))
        )
        .table_valued(*(column(n, k) for n, k in zip(names, kinds, strict=True)))
        .render_derived(name="src")
    )
    picked = [cast(src.c[n], postgresql.JSONB) if _is_json(table.c[n]) else src.c[n] for n in names]
    stmt = insert(table).from_select(list(names), select(*picked))
    return stmt.returning(*(table.c[n] for n in returning)) if returning else stmt


def _values(row: Mapping[str, Any]) -> Mapping[str, Any]:
    """`row` with rendered JSON text parsed back into values (SQLite's JSON type encodes)."""
    if not any(type(v) is JsonText for v in row.values()):
        return row
    return {k: orjson.loads(bytes(v)) if type(v) is JsonText else v for k, v in row.items()}


async def insert_rows(
    conn: AsyncConnection,
    table: Table,
    rows: Sequence[Mapping[str, Any]],
    *,
    returning: Sequence[str] = (),
) -> list[tuple[Any, ...]]:
    """Insert `rows` (dicts with the same keys) in one statement; the RETURNING rows (in no
    particular order on PostgreSQL: key them by a returned column), empty without `returning`."""
    if not rows:
        return []
    names = tuple(rows[0])
    back = tuple(returning)
    if conn.dialect.name != "postgresql":
        rows = [_values(r) for r in rows]
        plain = insert(table)
        if back:
            result = await conn.execute(
                plain.returning(*(table.c[n] for n in back), sort_by_parameter_order=True),
                list(rows),
            )
            return [tuple(r) for r in result]
        await conn.execute(plain, list(rows))
        return []
    result = await conn.execute(unnest_insert(table, names, back), unnest_params(table, rows))
    return [tuple(r) for r in result] if back else []


def unnest_insert(table: Table, names: tuple[str, ...], returning: tuple[str, ...] = ()) -> Any:
    """PostgreSQL's one-statement INSERT of `names` from one array per column (built once per
    table, columns and RETURNING); its parameters are `unnest_params`."""
    key = (table.name, names, returning)
    stmt = _STATEMENTS.get(key)
    if stmt is None:
        stmt = _STATEMENTS[key] = _unnest_statement(table, names, returning)
    return stmt


def unnest_params(table: Table, rows: Sequence[Mapping[str, Any]]) -> dict[str, list[Any]]:
    """`unnest_insert`'s parameters: one array per column of `rows` (JSON columns as text)."""
    params: dict[str, list[Any]] = {}
    for n in rows[0]:
        if _is_json(table.c[n]):
            params[f"a_{n}"] = [_json_text(r[n]) for r in rows]
        else:
            params[f"a_{n}"] = [r[n] for r in rows]
    return params
