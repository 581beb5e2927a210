"""What each stage of the control plane costs the database: statements, transactions and round
trips, counted with SQLAlchemy's engine events and labelled by the stage that ran them.

A stage is a name in a context variable (`STAGE`), set by whoever runs a loop (`labelled`): the
execution engine names each worker loop ("submit", "poll", "output", ...), the composition root
names the dispatcher's tasks. asyncio copies the context into every task it creates, so the
items a worker runs side by side are counted under its name; SQLAlchemy runs the driver calls in
a greenlet that keeps the caller's context. Anything unlabelled is "other" (the API, upkeep).

Counted per event (`sink(stage, kind)`, kind one of `KINDS`):

* ``statement``: one ``before_cursor_execute``, one statement sent;
* ``transaction``: a ``begin`` that sends BEGIN (not on an AUTOCOMMIT connection, whose
  statements are atomic alone and cost no BEGIN/COMMIT round trips);
* ``round_trip``: every statement plus every BEGIN, COMMIT and ROLLBACK sent. The asyncpg
  driver's statement preparation (once per statement text per connection) is not counted.

The composition root attaches it when metrics are served (`bench.lifecycle` reads the family).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

from sqlalchemy import event
from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import AsyncEngine

__all__ = ["KINDS", "STAGE", "count_statements", "labelled"]

STAGE: ContextVar[str] = ContextVar("vidroute_db_stage", default="other")
KINDS = ("statement", "transaction", "round_trip")

Sink = Callable[[str, str], None]


@contextmanager
def labelled(stage: str) -> Iterator[None]:
    """Count the statements of this block, and of the tasks it creates, under `stage`."""
    token = STAGE.set(stage)
    try:
        yield
    finally:
        STAGE.reset(token)


def _autocommit(conn: Connection) -> bool:
    return conn.get_execution_options().get("isolation_level") == "AUTOCOMMIT"


def count_statements(engine: AsyncEngine, sink: Sink) -> None:
    """Report every statement, BEGIN, COMMIT and ROLLBACK of `engine` to `sink` (see above)."""
    target = engine.sync_engine

    def statement(*_args: Any, **_kwargs: Any) -> None:
        stage = STAGE.get()
        sink(stage, "statement")
        sink(stage, "round_trip")

    def begin(conn: Connection) -> None:
        if not _autocommit(conn):
            stage = STAGE.get()
            sink(stage, "transaction")
            sink(stage, "round_trip")

    def end(conn: Connection) -> None:
        if not _autocommit(conn):
            sink(STAGE.get(), "round_trip")

    event.listen(target, "before_cursor_execute", statement)
    event.listen(target, "begin", begin)
    event.listen(target, "commit", end)
    event.listen(target, "rollback", end)
