"""Publish versioned capability entries into the catalog (design 9.6.4, 9.19.2, 9.25.5).

Two sources, one code path: the YAML files under ``adapter_sidecars/*/capabilities/`` and the
entries an adapter returns from Describe. Both become schema documents, which are validated by
the loader's JSON Schema and constraint parser, checked for price completeness and
contradictory constraints (`controlplane.capabilities.consistency`), expanded per configured
account (an entry without ``account`` applies to every account of its provider) and written by
`SqlUnitOfWork.publish` in one unit of work. A file with any bad entry is rejected whole, with
an error naming the entry; stored versions are never deleted or rewritten.

The stored ``capabilities`` JSON is the schema document itself (account and region filled in),
so the catalog re-reads it with the same parser (`controlplane.capabilities.catalog`).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import date, datetime
from pathlib import Path
from typing import Any

import yaml

from controlplane.capabilities.consistency import ConsistencyError, check_entry
from controlplane.persistence.catalog import (
    AccountSpec,
    CapabilityVersion,
    CatalogConflict,
    PriceVersion,
    PublishCounts,
)
from controlplane.persistence.database import Database
from controlplane.persistence.ledger import UnitRate
from vidroute.adapter.v1 import adapter_pb2
from vidroute_core.capabilities.loader import (
    ANY_ACCOUNT,
    Capability,
    CapabilityLoadError,
    Commercial,
    parse_entry,
)
from vidroute_core.wire.capability import capability_document, capability_to_proto

PRICE_UNIT = "output_second"


class PublishError(ValueError):
    """A publication was refused; nothing was written. The message names the bad entry."""


class _DryRun(Exception):
    """Rolls a dry run's unit back, carrying its counts out."""

    def __init__(self, counts: PublishCounts) -> None:
        super().__init__("dry run")
        self.counts = counts


@dataclass(frozen=True, slots=True)
class AccountConfig:
    """A configured provider account; the credential is a reference, never the secret."""

    provider: str
    account_name: str
    region: str
    credential_ref: str
    adapter_address: str = ""
    status: str = "ACTIVE"
    config: Mapping[str, Any] = field(default_factory=dict)

    def spec(self) -> AccountSpec:
        config = dict(self.config)
        if self.adapter_address:
            config["adapter_address"] = self.adapter_address
        return AccountSpec(
            self.provider, self.account_name, self.region, self.credential_ref, self.status, config
        )


@dataclass(frozen=True, slots=True)
class Publication:
    """What one publish call will write, after every check passed."""

    accounts: tuple[AccountSpec, ...]
    capabilities: tuple[CapabilityVersion, ...]
    prices: tuple[PriceVersion, ...]
    # Provider-native unit conversions (9.23.2), versioned by the price version they came with.
    unit_rates: tuple[UnitRate, ...] = ()


def _plain(value: Any) -> Any:
    """YAML dates become ISO strings, keys strings: the JSON the schema and the database see."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, datetime | date):
        return value.isoformat()
    return value


def canonical_document(doc: Mapping[str, Any]) -> Mapping[str, Any]:
    """The entry as Describe carries it: what two publications of one version must agree on
    (a file's entry keeps its ``native`` wire facts and unit rate, Describe does not; neither
    belongs to the catalog's version). A document that no longer parses is its own canon."""
    try:
        return capability_document(capability_to_proto(parse_entry(doc)))
    except CapabilityLoadError:
        return doc


def documents_from_file(path: Path) -> list[dict[str, Any]]:
    """The YAML documents of one capability file (not validated yet)."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise PublishError(f"{path}: {exc}") from exc
    return documents_from_text(text, str(path))


def documents_from_text(text: str, source: str = "<memory>") -> list[dict[str, Any]]:
    """The documents of a capability file's text: YAML (JSON is YAML), one entry per document;
    a document that is a list holds entries too (a JSON array). Not validated yet."""
    try:
        docs = [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.YAMLError as exc:
        raise PublishError(f"{source}: {exc}") from exc
    entries = [e for d in docs for e in (d if isinstance(d, list) else [d])]
    out = []
    for i, doc in enumerate(entries):
        if not isinstance(doc, dict):
            raise PublishError(f"{source}#{i}: a document must be a mapping")
        out.append(_plain(doc))
    return out


def documents_from_directory(directory: Path) -> list[dict[str, Any]]:
    """The documents of every ``*.yaml`` file of `directory`, files in name order."""
    docs: list[dict[str, Any]] = []
    for path in sorted(directory.glob("*.yaml")):
        docs.extend(documents_from_file(path))
    return docs


def _check(doc: Mapping[str, Any], where: str) -> Capability:
    if "commercial" not in doc:
        raise PublishError(f"{where}: model {doc.get('model')!r} has no price (commercial)")
    try:
        cap = parse_entry(doc, where)
        check_entry(cap)
    except (CapabilityLoadError, ConsistencyError) as exc:
        raise PublishError(str(exc)) from exc
    return cap


def plan_publication(
    documents: Sequence[Mapping[str, Any]],
    accounts: Iterable[AccountConfig],
    *,
    effective_from: datetime,
    source: str = "<memory>",
) -> Publication:
    """Validate every document, expand templates per account and build the rows; pure."""
    configured = list(accounts)
    caps: list[CapabilityVersion] = []
    prices: list[PriceVersion] = []
    rates: dict[tuple[str, str, str], UnitRate] = {}
    used: dict[tuple[str, str, str], AccountSpec] = {}
    seen: set[tuple[str, ...]] = set()
    for i, raw in enumerate(documents):
        where = f"{source}#{i}"
        _check(raw, where)
        for doc, account in _expand(raw, configured, where):
            cap = _check(doc, where)
            key = (cap.provider, cap.account, cap.region, cap.model, cap.model_version)
            if key in seen:
                raise PublishError(f"{where}: duplicate entry for {'/'.join(key)}")
            seen.add(key)
            used[(account.provider, account.account_name, account.region)] = account.spec()
            caps.append(
                CapabilityVersion(
                    cap.provider,
                    cap.account,
                    cap.region,
                    cap.model,
                    cap.model_version,
                    cap.capability_version,
                    cap.lifecycle,
                    doc,
                    effective_from,
                )
            )
            com = cap.commercial
            prices.append(
                PriceVersion(
                    cap.provider,
                    cap.account,
                    cap.region,
                    cap.model,
                    com.price_version,
                    PRICE_UNIT,
                    com.price_micros_per_output_second,
                    com.currency,
                    effective_from,
                )
            )
            rate = unit_rate_of(cap.provider, com, effective_from)
            if rate is not None:
                rates.setdefault((rate.provider, rate.unit_name, rate.rate_version), rate)
    return Publication(tuple(used.values()), tuple(caps), tuple(prices), tuple(rates.values()))


def unit_rate_of(provider: str, com: Commercial, effective_from: datetime) -> UnitRate | None:
    """The conversion of the model's provider-native unit to micros, versioned by its price
    version: the declared micros per unit, else the exact fraction of the per-second price over
    the per-second milliunits (Describe carries only those), reduced; None without a unit."""
    if not com.provider_unit:
        return None
    if com.micros_per_provider_unit > 0:
        num, den = com.micros_per_provider_unit, 1
    elif com.provider_milliunits_per_output_second > 0:
        num = com.price_micros_per_output_second * 1000
        den = com.provider_milliunits_per_output_second
    else:
        return None
    common = math.gcd(num, den) or 1
    return UnitRate(
        provider=provider,
        unit_name=com.provider_unit,
        rate_version=com.price_version,
        micros_per_unit=num // common,
        unit_divisor=den // common,
        currency=com.currency,
        effective_from=effective_from,
        effective_to=None,
    )


def _expand(
    doc: Mapping[str, Any], accounts: Sequence[AccountConfig], where: str
) -> list[tuple[dict[str, Any], AccountConfig]]:
    provider = str(doc["provider"])
    mine = [a for a in accounts if a.provider == provider]
    name = str(doc.get("account", ANY_ACCOUNT))
    if name != ANY_ACCOUNT:
        match = [a for a in mine if a.account_name == name]
        if not match:
            # An adapter reported an account we have no config for: register it by reference.
            region = str(doc.get("region", ""))
            if not region:
                raise PublishError(f"{where}: account {name!r} is not configured and has no region")
            match = [AccountConfig(provider, name, region, f"adapter://{provider}/{name}")]
        mine = match
    if not mine:
        raise PublishError(f"{where}: no configured account of provider {provider!r}")
    out = []
    for account in mine:
        stamped = copy.deepcopy(dict(doc))
        stamped["account"] = account.account_name
        stamped["region"] = str(doc.get("region") or account.region)
        out.append((stamped, account))
    return out


async def publish_documents(
    db: Database,
    documents: Sequence[Mapping[str, Any]],
    accounts: Iterable[AccountConfig],
    *,
    now: datetime,
    source: str = "<memory>",
    dry_run: bool = False,
) -> PublishCounts:
    """Check and write a batch; `PublishError` (nothing written) on any bad entry. `dry_run`
    writes in a unit that is rolled back: the counts (and conflicts) are those of a real run.
    A version already stored stays as it is (the sidecars' Describe at every start)."""
    plan = plan_publication(documents, accounts, effective_from=now, source=source)
    try:
        async with db.unit(now) as u:
            counts = await u.publish(
                plan.accounts, plan.capabilities, plan.prices, canon=canonical_document
            )
            await u.put_unit_rates(plan.unit_rates)
            if dry_run:
                raise _DryRun(counts)
            return counts
    except CatalogConflict as exc:
        raise PublishError(f"{source}: {exc}") from exc
    except _DryRun as rolled_back:
        return rolled_back.counts


async def publish_file(
    db: Database, path: Path, accounts: Iterable[AccountConfig], *, now: datetime
) -> PublishCounts:
    """Publish one YAML file, whole or not at all."""
    return await publish_documents(
        db, documents_from_file(path), accounts, now=now, source=str(path)
    )


async def publish_directory(
    db: Database, directory: Path, accounts: Iterable[AccountConfig], *, now: datetime
) -> PublishCounts:
    """Publish every ``*.yaml`` of `directory` as one batch (one transaction)."""
    docs = documents_from_directory(directory)
    return await publish_documents(db, docs, accounts, now=now, source=str(directory))


async def publish_describe(
    db: Database,
    entries: Iterable[adapter_pb2.CapabilityEntry],
    accounts: Iterable[AccountConfig],
    *,
    now: datetime,
    source: str = "describe",
) -> PublishCounts:
    """Publish what an adapter's Describe reported, through the same checks as a file."""
    docs = [capability_document(e) for e in entries]
    return await publish_documents(db, docs, accounts, now=now, source=source)
