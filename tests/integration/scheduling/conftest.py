"""Fixtures of the scheduling suite: each test runs on SQLite and on a fresh PostgreSQL database
(`database_url`, migrated, `engine` and `db` are tests/integration/conftest.py's)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import pytest_asyncio

from controlplane.capabilities.publish import documents_from_directory, publish_documents
from controlplane.domain.breaker import BreakerConfig, BreakerRegistry
from controlplane.domain.routing.selection import RouterConfig
from controlplane.domain.scoring import example_policy
from controlplane.leases.memory_store import MemoryLeaseStore
from controlplane.persistence.catalog import CatalogQueries
from controlplane.persistence.database import Database
from controlplane.scheduling.dispatcher import Dispatcher, DispatcherConfig
from controlplane.scheduling.health import HealthMonitor
from controlplane.scheduling.leader import LocalLock
from tests.integration.scheduling.support import ACCOUNTS, CAPABILITY_DIRS, NOW, CompilingAdapter


@pytest.fixture
def catalogs(db: Database) -> CatalogQueries:
    return CatalogQueries(db)


@pytest_asyncio.fixture
async def published(db: Database) -> None:
    """The three sidecars' capability files published for `ACCOUNTS`."""
    docs = [d for directory in CAPABILITY_DIRS for d in documents_from_directory(directory)]
    await publish_documents(db, docs, ACCOUNTS, now=NOW, source="sidecars")


@pytest.fixture
def adapter() -> CompilingAdapter:
    return CompilingAdapter()


@pytest.fixture
def leases() -> MemoryLeaseStore:
    return MemoryLeaseStore()


@pytest.fixture
def monitor(db: Database) -> HealthMonitor:
    return HealthMonitor(BreakerRegistry(BreakerConfig(), clock=__import__("time").time), db=db)


DispatcherFactory = Callable[..., Dispatcher]


@pytest.fixture
def make_dispatcher(  # noqa: PLR0917 - pytest injects fixtures positionally
    db: Database,
    catalogs: CatalogQueries,
    leases: MemoryLeaseStore,
    adapter: CompilingAdapter,
    monitor: HealthMonitor,
    published: None,
) -> DispatcherFactory:
    """Build a dispatcher over the test's database; keyword arguments override the defaults."""

    def build(**overrides: Any) -> Dispatcher:
        kwargs: dict[str, Any] = {
            "db": db,
            "catalogs": catalogs,
            "leases": leases,
            "adapters": adapter.for_providers(["runway", "google", "self_hosted"]),
            "monitor": monitor,
            "router": RouterConfig(policy=example_policy("router-v17")),
            "leader": LocalLock(f"test-{id(overrides)}"),
            "config": DispatcherConfig(),
            "clock": lambda: NOW,
        }
        kwargs.update(overrides)
        return Dispatcher(**kwargs)

    return build
