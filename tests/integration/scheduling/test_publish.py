"""Capability publication: schema, contradictions and prices checked; versions only appended."""

from __future__ import annotations

import copy
from datetime import timedelta
from typing import Any

import pytest

from controlplane.capabilities.catalog import load_catalog
from controlplane.capabilities.publish import (
    PublishError,
    documents_from_file,
    publish_describe,
    publish_documents,
    publish_file,
)
from controlplane.persistence.catalog import CatalogQueries
from controlplane.persistence.database import Database
from tests.integration.scheduling.support import (
    ACCOUNTS,
    CAPABILITY_DIRS,
    NOW,
    catalog_capabilities,
)
from vidroute_core.wire.capability import capability_to_proto as capability_proto

RUNWAY = next(d for d in CAPABILITY_DIRS if d.parent.name == "runway") / "runway-2026-06.yaml"


def gen45() -> dict[str, Any]:
    return copy.deepcopy(documents_from_file(RUNWAY)[0])


async def test_publishes_every_sidecar_file_and_builds_the_catalog(
    db: Database, catalogs: CatalogQueries, published: None
) -> None:
    """All entries land, expanded per account, and the catalog reads them back with prices."""
    catalog = await load_catalog(catalogs, NOW)
    assert len(catalog.candidates) == len(catalog_capabilities())
    veo = catalog.by_id("google/veo-3.1-generate-preview/veo-prod-apac")
    assert veo is not None
    assert veo.region == "asia-northeast1"
    assert veo.price.price_version == "veo-2026-06"
    assert veo.price.micros_per_second == 400_000
    assert catalog.adapter_addresses["runway/prod-us"] == "127.0.0.1:7001"


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda d: d.update(unknown_field=1), "Additional properties"),
        (
            lambda d: d["constraints"].append(
                {"when": 'resolution == "720p"', "require": "duration_seconds == 11"}
            ),
            "can never be satisfied",
        ),
        (lambda d: d.pop("commercial"), "no price"),
        (lambda d: d["constraints"].append({"when": "mode ==", "require": "true"}), "mode"),
    ],
    ids=["schema", "contradiction", "no-price", "syntax"],
)
async def test_a_bad_entry_rejects_the_whole_file(
    db: Database, catalogs: CatalogQueries, mutate: Any, message: str
) -> None:
    """One broken document refuses the batch: nothing at all is written."""
    bad = gen45()
    mutate(bad)
    docs = [documents_from_file(RUNWAY)[1], bad]
    with pytest.raises(PublishError, match=message):
        await publish_documents(db, docs, ACCOUNTS, now=NOW, source="bad.yaml")
    assert await catalogs.accounts() == []


async def test_new_versions_close_old_ones_which_are_kept(
    db: Database, catalogs: CatalogQueries
) -> None:
    """A new capability and price version supersedes the old one at its effective time."""
    await publish_file(db, RUNWAY, ACCOUNTS, now=NOW)
    again = await publish_file(db, RUNWAY, ACCOUNTS, now=NOW + timedelta(hours=1))
    assert again.capabilities_inserted == 0
    assert again.capabilities_unchanged == 3
    newer = gen45()
    newer["capability_version"] = "runway/gen4.5/2026-07-01"
    newer["commercial"] = {
        **newer["commercial"],
        "price_version": "runway-2026-07",
        "price_micros_per_output_second": 110_000,
    }
    later = NOW + timedelta(days=7)
    await publish_documents(db, [newer], ACCOUNTS, now=later)
    account = (await catalogs.accounts())[0]
    history = await catalogs.capability_history(account.id, "gen4.5")
    assert [h.capability_version for h in history] == [
        "runway/gen4.5/2026-06-01",
        "runway/gen4.5/2026-07-01",
    ]
    assert history[0].effective_to == later
    assert history[1].effective_to is None
    prices = await catalogs.price_history(account.id, "gen4.5")
    assert [p["price_micros_per_unit"] for p in prices] == [120_000, 110_000]
    before = (await load_catalog(catalogs, NOW + timedelta(days=1))).by_id("runway/gen4.5/prod-us")
    after = (await load_catalog(catalogs, later)).by_id("runway/gen4.5/prod-us")
    assert before is not None
    assert before.price.micros_per_second == 120_000
    assert after is not None
    assert after.capability_version == "runway/gen4.5/2026-07-01"


async def test_an_existing_version_cannot_be_rewritten(
    db: Database, catalogs: CatalogQueries
) -> None:
    """Publishing other content under a stored version is refused (versions are immutable)."""
    await publish_file(db, RUNWAY, ACCOUNTS, now=NOW)
    changed = gen45()
    changed["output"]["durations_seconds"] = [5, 10]
    with pytest.raises(PublishError, match="immutable"):
        await publish_documents(db, [changed], ACCOUNTS, now=NOW + timedelta(days=1))


async def test_describe_entries_go_through_the_same_path(
    db: Database, catalogs: CatalogQueries
) -> None:
    """Entries an adapter reports from Describe are checked and stored like file entries."""
    entries = [capability_proto(c) for c in catalog_capabilities() if c.provider == "google"]
    counts = await publish_describe(db, entries, ACCOUNTS, now=NOW)
    assert counts.capabilities_inserted == len(entries)
    catalog = await load_catalog(catalogs, NOW)
    assert {c.provider for c in catalog.candidates} == {"google"}
    no_price = capability_proto(catalog_capabilities()[0])
    no_price.ClearField("price")
    with pytest.raises(PublishError, match="no price"):
        await publish_describe(db, [no_price], ACCOUNTS, now=NOW)
