"""Refusing to start, in one line: the checks `controlplane.bootstrap` runs before serving.

A control plane that cannot do its job as configured stops at start with one log line naming
the cause and the fix, and exit status `EXIT_CONFIG` (``EX_CONFIG`` of sysexits.h; a database
that does not answer: `EXIT_UNAVAILABLE`), never a traceback: `StartupRefused` is a
`SystemExit`, so uncaught it ends the process with that status and prints nothing more; in
process (tests) it is caught like any exception.

* No adapters and not an API-only replica (`check_adapters`): tasks would queue forever.
* Another control plane on the same embedded SQLite file (`SqliteLock`): an exclusive
  ``flock`` on ``<database file>.lock``, held until shutdown. `vidroute up` also asks
  (`check_sqlite_free`) before it writes its dev tokens and starts its stack under ./var.
* The listen port taken (`vidroute_core.wire.listen.PortInUse`, raised by the server's bind).
* The database not answering when the migrations run (`migrate`).
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import IO, NoReturn

from controlplane.persistence.errors import is_outage
from controlplane.persistence.migrate import upgrade
from controlplane.persistence.urls import display_url, sqlite_file
from vidroute_core.wire.listen import PortInUse, address_in_use

log = logging.getLogger(__name__)

EXIT_CONFIG = 78  # EX_CONFIG: the configuration does not allow this process to run
EXIT_UNAVAILABLE = 69  # EX_UNAVAILABLE: a service it needs does not answer
# What to do about a busy listen port (`PortInUse`).
LISTEN_FIX = (
    "another vidroute up or serve? Stop it, or set VIDROUTE_LISTEN (or --listen) to a free "
    "address, e.g. 127.0.0.1:0"
)
CALLBACK_LISTEN_FIX = (
    "another vidroute up? Stop it, or set VIDROUTE_CALLBACK_LISTEN to a free address, e.g. "
    "127.0.0.1:0 (`vidroute up --ephemeral-ports` does)"
)


class StartupRefused(SystemExit):
    """The control plane refused to start; ``str()`` is the one line that says why."""

    def __init__(self, reason: str, code: int = EXIT_CONFIG) -> None:
        super().__init__(code)
        self.reason = reason

    def __str__(self) -> str:
        return self.reason


def refuse(reason: str, code: int = EXIT_CONFIG) -> NoReturn:
    """Log the one line and raise `StartupRefused`."""
    log.error("refusing to start: %s", reason)
    raise StartupRefused(reason, code)


def check_adapters(adapters: Mapping[str, str], api_only: bool) -> None:
    """A scheduling control plane needs adapters; only an API-only replica runs without."""
    if adapters or api_only:
        return
    refuse(
        "no adapters configured (VIDROUTE_ADAPTERS is empty), so no task would ever run: set "
        "VIDROUTE_ADAPTERS=provider=host:port,... (`vidroute up` runs a whole stack), or "
        "VIDROUTE_API_ONLY=1 for a replica that only accepts tasks for others to schedule"
    )


def check_listen(listen: str, fix: str = LISTEN_FIX) -> None:
    """Refuse when something listens on `listen` already (checked before anything starts)."""
    if address_in_use(listen):
        refuse(str(PortInUse(listen, fix)))


async def migrate(database_url: str) -> None:
    """Apply the migrations; a database that does not answer is a refusal that names it."""
    try:
        await upgrade(database_url)
    except Exception as exc:
        if not is_outage(exc):
            raise
        refuse(database_outage(database_url, exc), EXIT_UNAVAILABLE)


def database_outage(database_url: str, exc: BaseException) -> str:
    """The one line for a database that does not answer (`is_outage`): where, why, the fix."""
    where = display_url(database_url)
    cause = (str(exc).strip().splitlines() or [""])[0]
    return (
        f"the database {where} does not answer ({type(exc).__name__}: {cause}): start it, "
        "or point VIDROUTE_DATABASE_URL at one that runs"
    )


class SqliteLock:
    """An exclusive, non-blocking ``flock`` on ``<db>.lock`` beside an SQLite database file.

    `acquire` refuses to start (`refuse`) when another process, or another control plane of
    this one, holds it; `release` is idempotent. The kernel drops the lock when the process
    dies, so a killed control plane never leaves a stale one."""

    def __init__(self, database: Path) -> None:
        self.path = database.with_name(database.name + ".lock")
        self._file: IO[str] | None = None

    def acquire(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        handle = self.path.open("a+", encoding="utf-8")
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = handle.read().strip() or "another process"
            handle.close()
            refuse(
                f"the SQLite database {self.path.with_suffix('')} is in use by another "
                f"control plane ({holder}; lock {self.path}): stop it, or give this one its "
                "own VIDROUTE_DATABASE_URL"
            )
        handle.truncate(0)
        handle.write(f"pid {os.getpid()}\n")
        handle.flush()
        self._file = handle

    async def release(self) -> None:
        self.drop()

    def drop(self) -> None:
        """Release the lock now (idempotent); `release` for an async cleanup list."""
        if self._file is None:
            return
        handle, self._file = self._file, None
        with contextlib.suppress(OSError):
            handle.truncate(0)
        fcntl.flock(handle, fcntl.LOCK_UN)
        handle.close()


def check_sqlite_free(database_url: str) -> None:
    """Refuse, as `lock_sqlite` would, when another control plane holds the embedded database;
    holds nothing itself (`vidroute up` asks before it writes anything of its own run)."""
    database = sqlite_file(database_url)
    if database is None:
        return
    lock = SqliteLock(database)
    lock.acquire()
    lock.drop()


def lock_sqlite(database_url: str) -> SqliteLock | None:
    """Take the lock of an embedded SQLite database (None for PostgreSQL or in memory)."""
    database = sqlite_file(database_url)
    if database is None:
        return None
    lock = SqliteLock(database)
    lock.acquire()
    return lock
