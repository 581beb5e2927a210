"""The accounts document (controlplane.domain.accounts): every violation by its path, today's
behaviour for an unlisted account, and the lease dimensions its limits give a candidate
(controlplane.scheduling.gather.lease_dimensions) and the routing filters they feed."""

from __future__ import annotations

import dataclasses
import json
from datetime import UTC, datetime
from pathlib import Path

import pytest

import controlplane
from controlplane.domain.accounts import (
    BUILTIN,
    AccountLimits,
    AccountsDocumentError,
    parse_accounts_document,
)
from controlplane.domain.routing.candidates import Candidate, Price, RoutingContext
from controlplane.domain.routing.filters import Reason, hard_reject
from controlplane.leases.base import Dimension
from controlplane.scheduling.gather import lease_dimensions
from vidroute_core.capabilities.loader import expand_for_accounts, load_file
from vidroute_core.spec import GenerationSpec, Mode, OutputSpec

pytestmark = pytest.mark.timeout(30)
ROOT = Path(__file__).resolve().parents[3]

EXAMPLE = """
version: accounts-1
description: two accounts
accounts:
  runway:
    prod-us:
      credential_ref: env:RUNWAY_API_KEY
      regions: [us, eu]
      limits:
        max_concurrency: 3
        model_concurrency: {gen4.5: 2}
        modality_concurrency: {IMAGE_TO_VIDEO: 1}
        region_concurrency: {eu: 1}
        submits_per_minute: 60
        generations_per_day: 1000
        spend_per_month_micros: 500000000
    spare:
      credential_ref: kms://runway/spare
      enabled: false
"""


def violations(text: str) -> dict[str, str]:
    with pytest.raises(AccountsDocumentError) as info:
        parse_accounts_document(text)
    return {v.field: v.description for v in info.value.violations}


def test_example_reads_every_limit_and_unlisted_accounts_keep_todays_behaviour() -> None:
    """A listed account gets its limits, enabled flag and regions; any other account none."""
    a = parse_accounts_document(EXAMPLE)
    assert a.version == "accounts-1"
    assert a.limits("runway", "prod-us") == AccountLimits(
        max_concurrency=3,
        model_concurrency={"gen4.5": 2},
        modality_concurrency={"IMAGE_TO_VIDEO": 1},
        region_concurrency={"eu": 1},
        submits_per_minute=60,
        generations_per_day=1000,
        spend_per_month_micros=500_000_000,
    )
    assert a.entry("runway", "prod-us").credential_ref == "env:RUNWAY_API_KEY"
    assert a.allows_region("runway", "prod-us", "eu")
    assert not a.allows_region("runway", "prod-us", "asia")
    assert not a.enabled("runway", "spare")
    assert a.allows_region("runway", "spare", "anywhere")  # no regions: any
    assert a.enabled("veo", "other")
    assert a.limits("veo", "other") == AccountLimits()
    assert BUILTIN.accounts == {}


def test_json_reads_the_same_as_yaml() -> None:
    """JSON is YAML: the same document in JSON gives the same accounts."""
    import yaml

    as_json = json.dumps(yaml.safe_load(EXAMPLE))
    assert parse_accounts_document(as_json).accounts == parse_accounts_document(EXAMPLE).accounts


def test_every_violation_is_named_by_its_path_at_once() -> None:
    """One field violation per problem, by its path in the document, none hiding another."""
    found = violations("""
version: "bad version!"
colour: blue
accounts:
  runway:
    prod-us:
      credential_ref: sk_live_123
      enabled: "yes"
      regions: [us, us]
      secret: x
      limits:
        max_concurrency: 0
        model_concurrency: {gen4.5: -1, "bad model!": 1}
        modality_concurrency: {TEXT_TO_AUDIO: 1}
        region_concurrency: {eu: 1}
        submits_per_minute: 1.5
        generations_per_day: true
        spend_per_month_micros: 1000000000000000000
        burst: 3
    dev:
      credential_ref: "env:KEY:-the_secret"
    nocred: {}
  "bad provider!": {}
""")
    path = "accounts.runway.prod-us"
    limits = f"{path}.limits"
    assert set(found) == {
        "version",
        "colour",
        f"{path}.credential_ref",
        f"{path}.enabled",
        f"{path}.regions",
        f"{path}.secret",
        f"{limits}.max_concurrency",
        f'{limits}.model_concurrency["gen4.5"]',
        f'{limits}.model_concurrency["bad model!"]',
        f"{limits}.modality_concurrency.TEXT_TO_AUDIO",
        f"{limits}.region_concurrency.eu",
        f"{limits}.submits_per_minute",
        f"{limits}.generations_per_day",
        f"{limits}.spend_per_month_micros",
        f"{limits}.burst",
        "accounts.runway.dev.credential_ref",
        "accounts.runway.nocred.credential_ref",
        'accounts["bad provider!"]',
    }, found
    assert "never the secret" in found[f"{path}.credential_ref"]
    assert "default value" in found["accounts.runway.dev.credential_ref"]
    assert "not in the account's regions" in found[f"{limits}.region_concurrency.eu"]
    assert "lists a region twice" in found[f"{path}.regions"]


@pytest.mark.parametrize(
    ("text", "field"),
    [
        ("", "document"),
        ("- a list", "document"),
        ("accounts: {}", "version"),
        ("version: a\naccounts: []", "accounts"),
        ("version: a\naccounts: {runway: {x: []}}", "accounts.runway.x"),
    ],
)
def test_wrong_shapes_are_refused(text: str, field: str) -> None:
    """A document of the wrong shape is refused at the level where the shape is wrong."""
    assert field in violations(text)


def test_the_shipped_example_is_valid() -> None:
    """`vidroute up`'s accounts example parses and limits the dev stack's Runway account."""
    text = (Path(controlplane.__file__).parent / "accounts.example.yaml").read_text("utf-8")
    a = parse_accounts_document(text)
    assert a.limits("runway", "prod-us").max_concurrency == 3


def runway_candidate(model: str = "gen4.5", region: str = "us", cap: int = 2) -> Candidate:
    """The shipped Runway capability of `model` on prod-us in `region`, capped at `cap`."""
    path = ROOT / "adapter_sidecars" / "runway" / "capabilities" / "runway-2026-06.yaml"
    found = next(
        c for c in expand_for_accounts(load_file(path), [("prod-us", region)]) if c.model == model
    )
    capability = dataclasses.replace(found, max_concurrency=cap)
    com = capability.commercial
    return Candidate(
        provider="runway",
        account="prod-us",
        account_id=1,
        region=region,
        model=model,
        model_version=capability.model_version,
        capability_version=capability.capability_version,
        lifecycle=capability.lifecycle,
        sunset_at=None,
        capability=capability,
        price=Price(com.price_version, com.currency, com.price_micros_per_output_second),
    )


def test_lease_dimensions_take_every_configured_limit() -> None:
    """Account total from the document; the model the smaller of document and capability; the
    task's modality and the candidate's region when the document limits them."""
    limits = parse_accounts_document(EXAMPLE).limits("runway", "prod-us")
    c = runway_candidate(region="eu", cap=5)
    assert lease_dimensions(c, 4, limits, "IMAGE_TO_VIDEO") == (
        Dimension("account", 3),
        Dimension("model:gen4.5", 2),
        Dimension("modality:IMAGE_TO_VIDEO", 1),
        Dimension("region:eu", 1),
    )
    assert lease_dimensions(c, 4, limits, "TEXT_TO_VIDEO") == (
        Dimension("account", 3),
        Dimension("model:gen4.5", 2),
        Dimension("region:eu", 1),
    )
    smaller_capability = runway_candidate(cap=1)
    assert lease_dimensions(smaller_capability, 4, limits)[1] == Dimension("model:gen4.5", 1)


def test_without_limits_lease_dimensions_are_as_before() -> None:
    """An unlisted account: account = max(model cap, default), model = the capability's."""
    assert lease_dimensions(runway_candidate(cap=2), 4) == (
        Dimension("account", 4),
        Dimension("model:gen4.5", 2),
    )
    assert lease_dimensions(runway_candidate(cap=6), 4, AccountLimits()) == (
        Dimension("account", 6),
        Dimension("model:gen4.5", 6),
    )


def _spec() -> GenerationSpec:
    return GenerationSpec(
        tenant_id="acme",
        prompt="a kite",
        mode=Mode.TEXT_TO_VIDEO,
        output=OutputSpec(width=1280, height=720, duration_ms=4000),
    )


def test_a_disabled_account_and_a_region_outside_its_own_are_named_in_explain() -> None:
    """Routing refuses a disabled account's candidates as ACCOUNT_DISABLED, and a candidate in
    a region its account does not serve as REGION_NOT_ALLOWED, each naming the account."""
    accounts = parse_accounts_document(EXAMPLE)
    ctx = RoutingContext(now=datetime.now(UTC), accounts=accounts)
    assert hard_reject(_spec(), runway_candidate(), ctx) is None
    reason, detail = hard_reject(_spec(), runway_candidate(region="asia"), ctx) or ("", "")
    assert reason == Reason.REGION_NOT_ALLOWED
    assert "runway/prod-us runs in us, eu" in detail
    prod_off = parse_accounts_document(
        EXAMPLE.replace("      regions: [us, eu]", "      regions: [us, eu]\n      enabled: false")
    )
    off = RoutingContext(now=datetime.now(UTC), accounts=prod_off)
    rejection = hard_reject(_spec(), runway_candidate(), off)
    assert rejection is not None
    assert rejection[0] == Reason.ACCOUNT_DISABLED
    assert "runway/prod-us is disabled (accounts accounts-1)" in rejection[1]
