"""`CapabilityCatalog`: the routing read model of the capability matrix (design 9.6.2).

Only static, versioned facts: which provider/account/region/model/version exists, what it can
do, what it costs and where it is in its lifecycle. Dynamic state (breakers, leases, health)
stays out of it and is joined at decision time. The catalog is rebuilt from PostgreSQL (the
versions effective *now*) and is immutable once built, so a decision reads one consistent
snapshot whose `version` is recorded with it.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime

from controlplane.domain.routing.candidates import Candidate, Price, catalog_version
from controlplane.persistence.catalog import CapabilityRecord, CatalogQueries
from vidroute_core.capabilities.loader import CapabilityLoadError, parse_entry

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CapabilityCatalog:
    """Routable candidates effective at `loaded_at`, and the account facts around them."""

    candidates: tuple[Candidate, ...]
    loaded_at: datetime
    adapter_addresses: dict[str, str] = field(default_factory=dict)  # "provider/account" -> addr
    version: str = ""

    def by_id(self, candidate_id: str) -> Candidate | None:
        return next((c for c in self.candidates if c.id == candidate_id), None)

    def for_provider(self, provider: str) -> tuple[Candidate, ...]:
        return tuple(c for c in self.candidates if c.provider == provider)


def candidate_from_record(record: CapabilityRecord) -> Candidate | None:
    """A routable candidate, or None (with a log line) when the stored version is unusable."""
    where = f"capability {record.id} ({record.capability_version})"
    if record.price_micros_per_unit is None or record.price_version is None:
        log.warning("%s has no effective price; not routable", where)
        return None
    try:
        cap = parse_entry(record.document, where)
    except CapabilityLoadError as exc:
        log.warning("%s no longer parses (%s); not routable", where, exc)
        return None
    audio = cap.commercial.price_micros_per_output_second_with_audio
    return Candidate(
        provider=record.account.provider,
        account=record.account.account_name,
        account_id=record.account.id,
        region=record.account.region,
        model=record.model,
        model_version=record.model_version,
        capability_version=record.capability_version,
        lifecycle=record.lifecycle,
        sunset_at=cap.sunset_at,
        capability=cap,
        price=Price(
            record.price_version,
            record.currency or cap.commercial.currency,
            record.price_micros_per_unit,
            audio,
        ),
    )


def build_catalog(records: Iterable[CapabilityRecord], at: datetime) -> CapabilityCatalog:
    records = list(records)
    candidates = tuple(c for r in records if (c := candidate_from_record(r)) is not None)
    addresses = {
        f"{r.account.provider}/{r.account.account_name}": str(r.account.config["adapter_address"])
        for r in records
        if r.account.config.get("adapter_address")
    }
    return CapabilityCatalog(candidates, at, addresses, catalog_version(candidates))


async def load_catalog(store: CatalogQueries, at: datetime) -> CapabilityCatalog:
    """The catalog of versions effective at `at`, read from the database."""
    return build_catalog(await store.effective_capabilities(at), at)
