"""Finance's margin view (design 9.23, 9.24; issue 23 "the numbers finance needs"): revenue
charged against provider cost, with the platform's loss, grouped by day, tenant, provider or
model. Pure: `margins` folds money facts (one per ledger entry or refund, read by
`controlplane.persistence.finance_reads`) into rows; integers only.

* revenue: what tenants were charged (CHARGE entries, less REFUND entries);
* provider cost: per attempt its ACTUAL entry (else its EXPECTED one), plus the losses the bill
  confirmed (`confirmed-loss:` entries: money beyond what the attempt was expected to cost),
  less what providers refunded on disputes;
* platform loss: PLATFORM_LOSS entries less dispute refunds (the part of the cost nobody was
  charged for);
* margin = revenue - provider cost.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import date

__all__ = ["Grouping", "MarginRow", "MoneyFact", "margins"]


class Grouping(enum.Enum):
    DAY = "day"
    TENANT = "tenant"
    PROVIDER = "provider"
    MODEL = "model"


@dataclass(frozen=True, slots=True)
class MoneyFact:
    """One entry's contribution, in micros of `currency` (any may be negative: a refund)."""

    day: date
    tenant: str
    provider: str
    model: str
    currency: str
    revenue_micros: int = 0
    cost_micros: int = 0
    loss_micros: int = 0


@dataclass(frozen=True, slots=True)
class MarginRow:
    key: str
    currency: str
    revenue_micros: int
    provider_cost_micros: int
    platform_loss_micros: int

    @property
    def margin_micros(self) -> int:
        return self.revenue_micros - self.provider_cost_micros


def _key(fact: MoneyFact, by: Grouping) -> str:
    if by is Grouping.DAY:
        return fact.day.isoformat()
    if by is Grouping.TENANT:
        return fact.tenant or "-"
    if by is Grouping.PROVIDER:
        return fact.provider or "-"
    return f"{fact.provider or '-'}/{fact.model or '-'}"


def margins(facts: Iterable[MoneyFact], by: Grouping) -> list[MarginRow]:
    """One row per (group, currency), sorted by key then currency."""
    sums: dict[tuple[str, str], list[int]] = {}
    for f in facts:
        acc = sums.setdefault((_key(f, by), f.currency), [0, 0, 0])
        acc[0] += f.revenue_micros
        acc[1] += f.cost_micros
        acc[2] += f.loss_micros
    return [
        MarginRow(key, currency, r, c, loss)
        for (key, currency), (r, c, loss) in sorted(sums.items())
    ]
