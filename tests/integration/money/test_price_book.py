"""The price facts reconciliation reads come from what was published (SQLite and PostgreSQL):
each price version's billing rules, and an attempt's cost under the model's other versions, so
a Runway day billed at an older price is named WRONG_PRICE_VERSION on its attempt."""

from __future__ import annotations

import copy
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from controlplane.capabilities.publish import (
    AccountConfig,
    documents_from_directory,
    publish_documents,
)
from controlplane.domain.billing_rules import FailureCharge, Granularity
from controlplane.domain.reconciliation import (
    Billed,
    DiscrepancyKind,
    Expectation,
    PricedAs,
    reconcile,
)
from controlplane.persistence.database import Database
from controlplane.persistence.reconciliation_prices import price_book

pytestmark = pytest.mark.timeout(60)
ROOT = Path(__file__).resolve().parents[3]
T0 = datetime(2026, 11, 1, tzinfo=UTC)
ACCOUNT = AccountConfig("runway", "main", "us", "sidecar:runway")
SPEC = {
    "tenant_id": "acme",
    "prompt": "a red kite",
    "mode": "TEXT_TO_VIDEO",
    "output": {"width": 1280, "height": 720, "duration_ms": 4000},
}


async def _publish_two_prices(db: Database) -> None:
    """The shipped Runway entries, then veo3.1 again under an older list price (25 credits/s)."""
    docs = documents_from_directory(ROOT / "adapter_sidecars" / "runway" / "capabilities")
    await publish_documents(db, docs, [ACCOUNT], now=T0)
    [veo] = [d for d in docs if d["model"] == "veo3.1"]
    old = copy.deepcopy(veo)
    old["capability_version"] = "runway/veo3.1/2026-01-01"
    old["commercial"].update(
        price_version="runway-2026-01",
        price_micros_per_output_second=250_000,
        provider_milliunits_per_output_second=25_000,
    )
    await publish_documents(db, [old], [ACCOUNT], now=T0 + timedelta(days=1))


async def test_rules_and_alternatives_come_from_the_published_documents(db: Database) -> None:
    """veo3.1's rules are the ones published with its price version (refunds, model-day); a
    4 s clip estimated at runway-2026-06 would cost 100 credits under runway-2026-01."""
    await _publish_two_prices(db)
    async with db.reading() as conn:
        book = await price_book(conn, "runway", "main")
    rules = book.rules("veo3.1", "runway-2026-06")
    assert (rules.failed, rules.granularity) == (FailureCharge.NOTHING, Granularity.MODEL_DAY)
    assert book.alternatives("veo3.1", "runway-2026-06", SPEC) == (
        PricedAs("runway-2026-01", 1_000_000, 100_000),
    )
    assert book.alternatives("gen4.5", "runway-2026-06", SPEC) == ()
    assert book.alternatives("veo3.1", "runway-2026-06", None) == ()
    assert book.rules("veo3.1", "never-published").failed is FailureCharge.NOTHING


async def test_a_day_billed_at_the_older_price_is_named(db: Database) -> None:
    """The day's one veo3.1 job (80 credits) billed 100: the published older version explains
    it exactly, so the row is WRONG_PRICE_VERSION on that attempt, naming the version."""
    await _publish_two_prices(db)
    async with db.reading() as conn:
        book = await price_book(conn, "runway", "main")
    attempt = Expectation(
        attempt_id=7,
        task_id=3,
        provider="runway",
        account="main",
        model="veo3.1",
        state="SUCCEEDED",
        submitted_at=T0,
        expected_micros=800_000,
        currency="USD",
        expected_milliunits=80_000,
        unit="credits",
        price_version="runway-2026-06",
        rules=book.rules("veo3.1", "runway-2026-06"),
        alternatives=book.alternatives("veo3.1", "runway-2026-06", SPEC),
    )
    day = Billed(1, "runway", "main", "veo3.1", T0, 100_000, "credits", 1_000_000, "USD")
    [row] = reconcile([day], [attempt]).discrepancies
    assert (row.kind, row.attempt_id) == (DiscrepancyKind.WRONG_PRICE_VERSION, 7)
    assert row.evidence["billed_price_version"] == "runway-2026-01"
