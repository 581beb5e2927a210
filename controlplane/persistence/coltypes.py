"""Column types that behave the same on PostgreSQL and SQLite.

* `BigIntPK`: BIGINT (BIGSERIAL) on PostgreSQL, ``INTEGER PRIMARY KEY`` on SQLite, because only
  that exact spelling is SQLite's auto-incrementing rowid alias.
* `JsonDoc` / `JsonDocOrNull`: JSONB on PostgreSQL, JSON text on SQLite. The nullable variant stores
  Python ``None`` as SQL NULL instead of the JSON literal ``null``.
* `UtcDateTime`: TIMESTAMPTZ on PostgreSQL; on SQLite (which has no time zones) the value is stored
  as naive UTC text and read back as an aware UTC datetime. Naive datetimes are refused on the way
  in, so a local wall-clock time can never be stored by accident.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import JSON, BigInteger, DateTime, Integer
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.engine import Dialect
from sqlalchemy.types import TypeDecorator, TypeEngine

BigIntPK: TypeEngine[int] = BigInteger().with_variant(Integer(), "sqlite")

JsonDoc: TypeEngine[Any] = JSON().with_variant(JSONB(), "postgresql")
JsonDocOrNull: TypeEngine[Any] = JSON(none_as_null=True).with_variant(
    JSONB(none_as_null=True), "postgresql"
)


class UtcDateTime(TypeDecorator[datetime]):
    """A timezone-aware timestamp that always round-trips as UTC."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None or value.utcoffset() is None:
            raise ValueError(f"naive datetime {value!r}: pass an aware (UTC) datetime")
        value = value.astimezone(UTC)
        if dialect.name == "sqlite":
            # SQLite stores text; a fixed-offset naive UTC string keeps ordering lexicographic.
            return value.replace(tzinfo=None)
        return value

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            return value.replace(tzinfo=UTC)
        return value.astimezone(UTC)
