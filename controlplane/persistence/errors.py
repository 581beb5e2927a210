"""Errors the persistence seam raises besides the domain's own.

The unit of work raises `vidroute_core.exceptions.IdempotencyConflict` and `NotFound` directly; the
classes here cover what only storage can know. Hierarchy::

    PersistenceError
    ├── ConcurrentModification   a compare-and-set inside a multi-row write lost; nothing written
    ├── DuplicateRecord          a UNIQUE constraint rejected a write that is not a replay
    ├── InvalidPageToken         a list page token this store did not issue (also a ValueError)
    └── StoreUnavailable         the database cannot be reached (also the kernel's `Unavailable`)

Suggested gRPC mapping: ABORTED, ALREADY_EXISTS, INVALID_ARGUMENT; StoreUnavailable is mapped
(UNAVAILABLE with a RetryInfo) by `vidroute_core.wire.status`. `translate_outage` is the one place
that decides which driver errors are an outage rather than a bug.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from contextlib import contextmanager

from sqlalchemy import exc as sa_exc

from vidroute_core.exceptions import Unavailable


class PersistenceError(Exception):
    """Root of every storage-specific error this package raises on purpose."""


class ConcurrentModification(PersistenceError):
    """A guarded write lost its compare-and-set; the whole transaction was rolled back."""


class DuplicateRecord(PersistenceError):
    """A UNIQUE constraint rejected a row that is not a replay of the existing one."""


class InvalidPageToken(PersistenceError, ValueError):
    """A page token that is malformed or was not issued for this query."""


class StoreUnavailable(PersistenceError, Unavailable):
    """The database refused or dropped the connection; nothing may be assumed written."""

    def __init__(self, detail: str, retry_after_s: float = 1.0) -> None:
        Unavailable.__init__(self, "database", retry_after_s)
        self.detail = detail


# SQLite reports a busy file as OperationalError too; its other OperationalErrors (no such
# table, syntax) are bugs and must stay INTERNAL.
_SQLITE_TRANSIENT = ("database is locked", "unable to open database", "disk i/o error")


# SQLSTATEs of a server that cannot take the work now, never of a bad statement: class 08
# (connection exception), 53300 too_many_connections, 57P01-57P03 admin/crash shutdown and
# cannot_connect_now.
_OUTAGE_SQLSTATE_CLASSES = ("08",)
_OUTAGE_SQLSTATES = frozenset({"53300", "57P01", "57P02", "57P03"})


def is_outage(exc: BaseException) -> bool:
    """Whether `exc` means the database is unreachable (down, restarting, network), not a bug."""
    if isinstance(exc, (ConnectionError, TimeoutError, socket.gaierror, sa_exc.TimeoutError)):
        return True  # connection refused/reset (asyncpg raises them raw), pool timeout
    if isinstance(exc, OSError):
        # asyncio's "Multiple exceptions: [Errno 111] Connect call failed" for a host with two
        # addresses; any other OSError (a file in the block) is not the database's.
        return "connect call failed" in str(exc).lower()
    if isinstance(exc, sa_exc.DBAPIError):
        if exc.connection_invalidated or isinstance(exc, sa_exc.InterfaceError):
            return True
        if isinstance(exc, sa_exc.OperationalError):
            text = str(exc.orig).lower()
            sqlite = type(exc.orig).__module__.startswith("sqlite3")
            return not sqlite or any(t in text for t in _SQLITE_TRANSIENT)
        # asyncpg's "cannot connect now" / admin shutdown arrive as other DBAPIError subclasses;
        # through SQLAlchemy's asyncpg adapter `orig` is the adapter's generic Error, so the
        # server's SQLSTATE tells instead (a full server answers 53300 "too many connections").
        sqlstate = str(getattr(exc.orig, "sqlstate", "") or "")
        return (
            sqlstate.startswith(_OUTAGE_SQLSTATE_CLASSES)
            or sqlstate in _OUTAGE_SQLSTATES
            or (
                type(exc.orig).__name__
                in {
                    "CannotConnectNowError",
                    "AdminShutdownError",
                    "ConnectionDoesNotExistError",
                    "ConnectionFailureError",
                    "TooManyConnectionsError",
                }
            )
        )
    return type(exc).__name__ in {"CannotConnectNowError", "ConnectionDoesNotExistError"}


@contextmanager
def translate_outage() -> Iterator[None]:
    """Re-raise driver errors that mean "database down" as `StoreUnavailable`."""
    try:
        yield
    except StoreUnavailable:
        raise
    except Exception as exc:
        if is_outage(exc):
            raise StoreUnavailable(f"{type(exc).__name__}: {exc}") from exc
        raise
