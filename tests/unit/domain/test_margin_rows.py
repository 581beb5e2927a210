"""The margin view's fold (issue 23 finance views): integer micros, grouped, refunds negative."""

from __future__ import annotations

from datetime import date

from hypothesis import given
from hypothesis import strategies as st

from controlplane.domain.margins import Grouping, MoneyFact, margins

D1, D2 = date(2026, 12, 4), date(2026, 12, 5)


def test_groups_and_margin() -> None:
    """A charge and the costs of its attempts; a refund on another day; by each grouping."""
    facts = [
        MoneyFact(D1, "acme", "runway", "gen4.5", "USD", revenue_micros=480_000),
        MoneyFact(D1, "acme", "runway", "gen4.5", "USD", cost_micros=480_000),
        MoneyFact(D1, "beta", "self_hosted", "wan", "USD", cost_micros=14_700, loss_micros=3_500),
        MoneyFact(D2, "", "google", "veo", "USD", cost_micros=-1_600_000, loss_micros=-1_600_000),
    ]
    by_tenant = {
        r.key: (r.revenue_micros, r.margin_micros) for r in margins(facts, Grouping.TENANT)
    }
    assert by_tenant == {"-": (0, 1_600_000), "acme": (480_000, 0), "beta": (0, -14_700)}
    by_model = [r.key for r in margins(facts, Grouping.MODEL)]
    assert by_model == ["google/veo", "runway/gen4.5", "self_hosted/wan"]
    days = margins(facts, Grouping.DAY)
    assert [(r.key, r.provider_cost_micros, r.platform_loss_micros) for r in days] == [
        ("2026-12-04", 494_700, 3_500),
        ("2026-12-05", -1_600_000, -1_600_000),
    ]


money = st.integers(-(10**12), 10**12)
facts_st = st.lists(
    st.builds(
        MoneyFact,
        day=st.sampled_from([D1, D2]),
        tenant=st.sampled_from(["a", "b", ""]),
        provider=st.sampled_from(["runway", "google"]),
        model=st.sampled_from(["m1", "m2"]),
        currency=st.sampled_from(["USD", "EUR"]),
        revenue_micros=money,
        cost_micros=money,
        loss_micros=money,
    ),
    max_size=30,
)


@given(facts=facts_st, by=st.sampled_from(list(Grouping)))
def test_every_grouping_keeps_the_totals(facts: list[MoneyFact], by: Grouping) -> None:
    """Per currency, the rows of any grouping sum to the facts' totals; margin = revenue - cost."""
    rows = margins(facts, by)
    for cur in ("USD", "EUR"):
        mine = [f for f in facts if f.currency == cur]
        got = [r for r in rows if r.currency == cur]
        assert sum(r.revenue_micros for r in got) == sum(f.revenue_micros for f in mine)
        assert sum(r.provider_cost_micros for r in got) == sum(f.cost_micros for f in mine)
        assert sum(r.platform_loss_micros for r in got) == sum(f.loss_micros for f in mine)
    assert all(r.margin_micros == r.revenue_micros - r.provider_cost_micros for r in rows)
