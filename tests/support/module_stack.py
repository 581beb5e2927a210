"""A running platform shared by all the tests of one e2e module, and the database it stands on.

Starting three emulators, their sidecars and a control plane costs seconds; modules whose tests
only reset the emulators between cases share one (``scope="module"`` fixtures built from
these). Each module keeps its own `Stack` class for what its tests ask of the platform.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

from tests.conftest import PostgresServer
from tests.support.stack import PROVIDERS, ControlPlane, ProviderFarm, RedisDb


@contextmanager
def module_database(
    postgres_server: PostgresServer, backend: str, workdir: Path, *, template: str = ""
) -> Iterator[str]:
    """A fresh database of `backend` for one module: a throwaway PostgreSQL database (dropped
    afterwards) or a SQLite file in `workdir`. With `template` (``migrated_postgres_template``)
    the PostgreSQL database is a copy of it: already at the head revision, so the control plane
    started on it applies no migration (one CREATE DATABASE instead of every migration)."""
    if backend == "sqlite":
        yield f"sqlite+aiosqlite:///{workdir / 'vidroute.db'}"
        return
    name = asyncio.run(postgres_server.create_database(secrets.token_hex(4), template=template))
    try:
        yield postgres_server.url_for(name)
    finally:
        asyncio.run(postgres_server.drop_database(name))


@contextmanager
def started_platform(
    workdir: Path,
    database_url: str,
    redis_server_url: str,
    *,
    time_scale: float,
    providers: Iterable[str] = PROVIDERS,
    extensions: Mapping[str, Iterable[str]] | None = None,
) -> Iterator[tuple[ProviderFarm, ControlPlane, RedisDb]]:
    """Emulators (with their `extensions`) and sidecars, a Redis database of their own and one
    started control plane; the control plane is killed, then the farm stopped and Redis
    flushed, on exit."""
    with (
        ProviderFarm(
            workdir / "farm", time_scale=time_scale, providers=providers, extensions=extensions
        ) as farm,
        RedisDb(redis_server_url) as redis,
    ):
        (workdir / "cp").mkdir()
        cp = ControlPlane(workdir / "cp", farm, database_url=database_url, redis_url=redis.url)
        cp.start()
        try:
            yield farm, cp, redis
        finally:
            cp.kill()
