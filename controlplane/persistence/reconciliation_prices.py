"""The price facts reconciliation classifies a bill against, read from what was published
(design 9.23; `controlplane.domain.billing_rules`).

Every capability version published for an account carries its ``commercial`` block: the price
version, the per-second figures and the billing rules. `price_book` reads them once per
(provider, account) run; `PriceBook.rules` gives an attempt the rules of the price version it
was estimated at (a later price's rules never rewrite an older attempt's), and
`PriceBook.alternatives` what the attempt would have cost under each *other* published price
version of its model, so a bill priced off an old or wrong version can be named.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncConnection

from controlplane.domain.billing_rules import BillingRules, cost_under
from controlplane.domain.reconciliation import PricedAs
from controlplane.persistence.models import provider_accounts as PA
from controlplane.persistence.models import provider_model_capabilities as PMC
from vidroute_core.codec import spec_from_dict

__all__ = ["PriceBook", "price_book"]


@dataclass(frozen=True, slots=True)
class PriceBook:
    """model -> price version -> its ``commercial`` block (the latest published with it)."""

    commercial: Mapping[str, Mapping[str, Mapping[str, Any]]] = field(default_factory=dict)

    def rules(self, model: str, price_version: str) -> BillingRules:
        """The rules published with the attempt's price version; the default rules (failures
        billed nothing, per job) when that version was never published with a block."""
        found = self.commercial.get(model, {}).get(price_version)
        if found is None:
            return BillingRules(price_version=price_version)
        return BillingRules.from_commercial(found)

    def alternatives(
        self, model: str, price_version: str, spec: Mapping[str, Any] | None
    ) -> tuple[PricedAs, ...]:
        """The attempt's cost under each other published price version of `model` (sorted by
        version); empty without the task's spec (nothing to price)."""
        versions = self.commercial.get(model, {})
        if spec is None or len(versions) < 2:
            return ()
        try:
            output = spec_from_dict(dict(spec)).output
        except (KeyError, ValueError, TypeError):
            return ()
        seconds = -(-output.duration_ms // 1000)  # whole seconds, rounded up, as estimated
        out = []
        for version, com in sorted(versions.items()):
            if version == price_version:
                continue
            micros, milliunits = cost_under(
                com, seconds=seconds, with_audio=output.with_audio, samples=output.sample_count
            )
            out.append(PricedAs(version, micros, milliunits))
        return tuple(out)


async def price_book(conn: AsyncConnection, provider: str, account: str) -> PriceBook:
    """Every published ``commercial`` block of the account's models (any region), oldest first,
    so the latest publication of a price version wins."""
    rows = await conn.execute(
        select(PMC.c.model, PMC.c.capabilities)
        .select_from(PMC.join(PA, PA.c.id == PMC.c.provider_account_id))
        .where(PA.c.provider == provider, PA.c.account_name == account)
        .order_by(PMC.c.effective_from, PMC.c.id)
    )
    book: dict[str, dict[str, Mapping[str, Any]]] = {}
    for model, document in rows.all():
        com = dict(document or {}).get("commercial") or {}
        version = str(com.get("price_version") or "")
        if version:
            book.setdefault(str(model), {})[version] = com
    return PriceBook(book)
