"""Composition root: configuration -> implementations -> a running control plane.

The only module that reads environment variables:

- ``VIDROUTE_DATABASE_URL``: SQLAlchemy async URL. Default: embedded SQLite under ``./var/``.
  PostgreSQL: ``postgresql+asyncpg://user@127.0.0.1:5432/vidroute``.
- ``VIDROUTE_REDIS_URL``: Redis for leases and shared breaker state. Default: none, which
  selects the in-process implementations (single replica only).
- ``VIDROUTE_LISTEN``: gRPC listen address. Default ``127.0.0.1:50051``.
- ``VIDROUTE_LOG_LEVEL``: logging level. Default ``INFO``.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass

from controlplane.api.servicer import SchedulerServicer
from controlplane.persistence.db import create_engine
from controlplane.persistence.migrate import upgrade
from controlplane.persistence.repository import Store
from controlplane.server import ControlPlaneServer, start_server
from controlplane.service.tasks import TaskService

DEFAULT_DATABASE_URL = "sqlite+aiosqlite:///./var/vidroute.db"
DEFAULT_LISTEN = "127.0.0.1:50051"


@dataclass(frozen=True, slots=True)
class Settings:
    """Everything the control plane is configured with."""

    database_url: str = DEFAULT_DATABASE_URL
    redis_url: str | None = None
    listen: str = DEFAULT_LISTEN
    log_level: str = "INFO"
    migrate_on_start: bool = True
    health_probe_interval_s: float = 5.0

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **overrides: object) -> Settings:
        env = os.environ if env is None else env
        values: dict[str, object] = {
            "database_url": env.get("VIDROUTE_DATABASE_URL") or DEFAULT_DATABASE_URL,
            "redis_url": env.get("VIDROUTE_REDIS_URL") or None,
            "listen": env.get("VIDROUTE_LISTEN") or DEFAULT_LISTEN,
            "log_level": env.get("VIDROUTE_LOG_LEVEL") or "INFO",
        }
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)  # type: ignore[arg-type]


def configure_logging(level: str) -> None:
    logging.basicConfig(
        level=getattr(logging, level.upper(), logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )


async def start_control_plane(settings: Settings) -> ControlPlaneServer:
    """Migrate (if asked), wire the services and start serving."""
    if settings.migrate_on_start:
        await upgrade(settings.database_url)
    engine = create_engine(settings.database_url)
    store = Store(engine)

    async def probe() -> bool:
        await store.ping()
        return True

    servicer = SchedulerServicer(TaskService(store))
    return await start_server(
        servicer,
        listen=settings.listen,
        probe=probe,
        cleanup=[engine.dispose],
        probe_interval=settings.health_probe_interval_s,
    )
