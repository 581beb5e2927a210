"""Billing rules travel with the price: capability file -> Describe -> published document."""

from __future__ import annotations

from pathlib import Path

import pytest

from controlplane.domain.billing_rules import BillingRules, FailureCharge, Granularity
from vidroute_core.capabilities.loader import CapabilityLoadError, load_directory, parse_entry
from vidroute_core.wire.capability import capability_document, capability_to_proto

ROOT = Path(__file__).resolve().parents[3]
SHIPPED = {
    "runway": (FailureCharge.NOTHING, Granularity.MODEL_DAY),
    "veo": (FailureCharge.NOTHING, Granularity.JOB),
    "selfhosted": (FailureCharge.USAGE, Granularity.JOB),
}


@pytest.mark.parametrize("adapter", sorted(SHIPPED))
def test_shipped_rules_survive_describe(adapter: str) -> None:
    """Every shipped entry states its rules, and the Describe round trip keeps them exactly."""
    failed, granularity = SHIPPED[adapter]
    for cap in load_directory(ROOT / "adapter_sidecars" / adapter / "capabilities"):
        doc = capability_document(capability_to_proto(cap))
        again = parse_entry(doc)
        assert dict(again.commercial.billing) == dict(cap.commercial.billing)
        rules = BillingRules.from_commercial(doc["commercial"])
        assert (rules.failed, rules.cancelled, rules.granularity) == (failed, failed, granularity)
        assert rules.price_version == cap.commercial.price_version


def test_a_fixed_fee_round_trips_and_an_unknown_rule_is_refused() -> None:
    """The fixed part survives the wire; a rule the schema does not know fails the load."""
    [cap] = load_directory(ROOT / "adapter_sidecars" / "selfhosted" / "capabilities")[:1]
    doc = capability_document(capability_to_proto(cap))
    doc["commercial"]["billing"] = {"failed": "fixed", "failed_fixed_micros": 5000}
    again = capability_document(capability_to_proto(parse_entry(doc)))
    rules = BillingRules.from_commercial(again["commercial"])
    assert (rules.failed, rules.failed_fixed_micros) == (FailureCharge.FIXED, 5000)
    assert rules.cancelled is FailureCharge.NOTHING
    doc["commercial"]["billing"] = {"failed": "half"}
    with pytest.raises(CapabilityLoadError, match="billing"):
        parse_entry(doc)
