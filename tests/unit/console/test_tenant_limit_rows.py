"""The tenants' limits view as pure rows: which tenants are listed, and the gauges' labels
bounded by the tenants document whatever the traffic."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from controlplane.domain.tenants import parse_tenants_document
from controlplane.persistence.tenant_configs import TenantUse
from controlplane.service import tenant_limits
from controlplane.service.tenant_limits import gauge_rows, limits_page

AT = datetime(2026, 12, 5, tzinfo=UTC)


def document(named: int) -> str:
    tenants = ", ".join(
        f"t{i}: {{service_classes: {{STANDARD: {{weight: 2}}}}}}" for i in range(named)
    )
    return (
        "version: v\n"
        "default: {service_classes: {STANDARD: {weight: 1, max_queued: 9}}}\n"
        f"tenants: {{{tenants}}}\n"
    )


def test_named_tenants_first_then_busy_others_under_the_default_entry() -> None:
    """The document's tenants come first; tenants it does not name appear only with work, the
    busiest first, with the default entry's limits."""
    use = TenantUse(
        in_flight={("x", "STANDARD"): 1},
        queued={("y", "STANDARD"): 5, ("t0", "STANDARD"): 2},
        created={"x": 3},
        creates_capped=False,
    )
    page = limits_page(parse_tenants_document(document(1)), use, AT)
    assert [(t.tenant, t.named) for t in page.tenants] == [("t0", True), ("y", False), ("x", False)]
    y = page.tenants[1]
    standard = next(c for c in y.classes if c.service_class == "STANDARD")
    assert (standard.weight, standard.max_queued, standard.queued) == (1.0, 9, 5)
    assert page.tenants[2].create_rate == 3 / 60


def test_gauge_labels_are_bounded_by_the_document_not_the_traffic(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A thousand busy tenants the document does not name are one "(default)" label with all
    their use; named tenants past the bound are one "(other)" label, their use summed and no
    limits of theirs. The console's page shows at most MAX_ROWS and says how many more."""
    monkeypatch.setattr(tenant_limits, "MAX_GAUGE_TENANTS", 2)
    use = TenantUse(
        in_flight={},
        queued={(f"busy{i}", "STANDARD"): 1 for i in range(1000)}
        | {(f"t{i}", "STANDARD"): 1 for i in range(4)},
        created={},
        creates_capped=False,
    )
    tenants = parse_tenants_document(document(4))
    limits, uses = gauge_rows(limits_page(tenants, use, AT, max_rows=None))
    assert {k[0] for k in uses} == {"t0", "t1", "(other)", "(default)"}
    assert {k[0] for k in limits} == {"t0", "t1", "(default)"}
    assert uses[("(default)", "STANDARD", "queued")] == 1000
    assert uses[("(other)", "STANDARD", "queued")] == 2
    shown = limits_page(tenants, use, AT)
    assert (len(shown.tenants), shown.more) == (
        tenant_limits.MAX_ROWS,
        1004 - tenant_limits.MAX_ROWS,
    )
