"""Fixtures of the scheduling suite: each test runs on SQLite and on a fresh PostgreSQL database
(`database_url` and `engine`, migrated, are tests/integration/conftest.py's)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import pytest_asyncio
from sqlalchemy.ext.asyncio import AsyncEngine

from controlplane.capabilities.publish import documents_from_directory, publish_documents
from controlplane.domain.breaker import BreakerConfig, BreakerRegistry
from controlplane.domain.routing.selection import RouterConfig
from controlplane.domain.scoring import example_policy
from controlplane.leases.memory_store import MemoryLeaseStore
from controlplane.persistence.catalog_store import CatalogStore
from controlplane.persistence.repository import Store
from controlplane.scheduling.dispatcher import Dispatcher, DispatcherConfig
from controlplane.scheduling.health import HealthMonitor
from controlplane.scheduling.leader import LocalLock
from tests.integration.scheduling.support import ACCOUNTS, CAPABILITY_DIRS, NOW, CompilingAdapter

@pytest.fixture
def store(engine: AsyncEngine) -> Store:
    return Store(engine)


@pytest.fixture
def catalog_store(engine: AsyncEngine) -> CatalogStore:
    return CatalogStore(engine)


@pytest_asyncio.fixture
async def published(catalog_store: CatalogStore) -> None:
    """The three sidecars' capability files published for `ACCOUNTS`."""
    docs = [d for directory in CAPABILITY_DIRS for d in documents_from_directory(directory)]
    await publish_documents(catalog_store, docs, ACCOUNTS, now=NOW, source="sidecars")


@pytest.fixture
def adapter() -> CompilingAdapter:
    return CompilingAdapter()


@pytest.fixture
def leases() -> MemoryLeaseStore:
    return MemoryLeaseStore()


@pytest.fixture
def monitor(catalog_store: CatalogStore) -> HealthMonitor:
    return HealthMonitor(
        BreakerRegistry(BreakerConfig(), clock=__import__("time").time), events=catalog_store
    )


DispatcherFactory = Callable[..., Dispatcher]


@pytest.fixture
def make_dispatcher(  # noqa: PLR0917 - pytest injects fixtures positionally
    store: Store,
    catalog_store: CatalogStore,
    leases: MemoryLeaseStore,
    adapter: CompilingAdapter,
    monitor: HealthMonitor,
    published: None,
) -> DispatcherFactory:
    """Build a dispatcher over the test's stores; keyword arguments override the defaults."""

    def build(**overrides: Any) -> Dispatcher:
        kwargs: dict[str, Any] = {
            "store": store,
            "catalog_store": catalog_store,
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
