"""Errors the persistence seam raises besides the domain's own.

The unit of work raises `vidroute_core.exceptions.IdempotencyConflict` and `NotFound` directly; the
classes here cover what only storage can know. Hierarchy::

    PersistenceError
    ├── ConcurrentModification   a compare-and-set inside a multi-row write lost; nothing written
    ├── DuplicateRecord          a UNIQUE constraint rejected a write that is not a replay
    └── InvalidPageToken         a list page token this store did not issue (also a ValueError)

Suggested gRPC mapping: ABORTED, ALREADY_EXISTS, INVALID_ARGUMENT.
"""

from __future__ import annotations


class PersistenceError(Exception):
    """Root of every storage-specific error this package raises on purpose."""


class ConcurrentModification(PersistenceError):
    """A guarded write lost its compare-and-set; the whole transaction was rolled back."""


class DuplicateRecord(PersistenceError):
    """A UNIQUE constraint rejected a row that is not a replay of the existing one."""


class InvalidPageToken(PersistenceError, ValueError):
    """A page token that is malformed or was not issued for this query."""
