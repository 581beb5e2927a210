"""The tenants document (controlplane.domain.tenants): validation by path, the default entry,
inheritance of omitted fields, and CreateTask's entitlement rule."""

from __future__ import annotations

import json
from typing import Any

import pytest

from controlplane.domain.tenants import (
    BUILTIN,
    ClassShare,
    CreateRate,
    TenantsDocumentError,
    ensure_entitled,
    ensure_publishable,
    parse_tenants_document,
)
from vidroute_core.exceptions import PermissionDenied
from vidroute_core.spec import ServiceClass

pytestmark = pytest.mark.timeout(30)

EXAMPLE = """
version: tenants-1
default:
  service_classes:
    STANDARD: {weight: 1, max_queued: 100}
    BATCH: {}
  create_rate: {per_second: 5, burst: 10}
tenants:
  acme:
    service_classes:
      INTERACTIVE: {weight: 5, max_in_flight: 3}
      STANDARD: {weight: 2.5}
    projects: {launch: {priority: 2}, backlog: {priority: -1}}
    allowed_regions: [us-east1]
  free:
    create_rate: null
"""


def violations(text: str) -> dict[str, str]:
    with pytest.raises(TenantsDocumentError) as info:
        parse_tenants_document(text)
    return {v.field: v.description for v in info.value.violations}


def test_example_reads_with_default_for_unlisted_tenants() -> None:
    """A listed tenant gets its entry, any other tenant the default entry."""
    t = parse_tenants_document(EXAMPLE)
    assert t.version == "tenants-1"
    assert t.entry("acme").entitled == (ServiceClass.INTERACTIVE, ServiceClass.STANDARD)
    assert t.entry("someone").entitled == (ServiceClass.STANDARD, ServiceClass.BATCH)
    assert t.weight("acme", ServiceClass.INTERACTIVE) == 5.0
    assert t.weight("acme", "STANDARD") == 2.5
    assert t.max_in_flight("acme", "INTERACTIVE") == 3
    assert t.max_in_flight("someone", "STANDARD") is None
    assert t.share("someone", ServiceClass.STANDARD) == ClassShare(1.0, None, 100)
    assert t.project_priority("acme", "launch") == 2
    assert t.project_priority("acme", "other") == 0
    assert t.allowed_regions("acme") == frozenset({"us-east1"})
    assert t.allowed_regions("someone") is None


def test_a_listed_tenant_inherits_the_fields_it_leaves_out() -> None:
    """Omitted fields come from default (acme's rate); an explicit null clears one (free's)."""
    t = parse_tenants_document(EXAMPLE)
    assert t.entry("acme").create_rate == CreateRate(5.0, 10)
    assert t.entry("free").create_rate is None
    assert t.entry("free").service_classes == t.default.service_classes


def test_every_problem_is_reported_with_its_path() -> None:
    """One violation per problem, each named by its path in the document; nothing is returned."""
    found = violations(
        """
version: "bad version!"
extra: 1
default:
  service_classes: {STANDARD: {weight: 0, max_in_flight: 0}, FAST: {}}
  create_rate: {per_second: 5}
tenants:
  "bad id!": {}
  acme:
    service_classes: {}
    projects: {launch: {priority: 20}, p2: 3}
    allowed_regions: [us, 5]
    colour: red
"""
    )
    assert set(found) == {
        "version",
        "extra",
        "default.service_classes.FAST",
        "default.service_classes.STANDARD.weight",
        "default.service_classes.STANDARD.max_in_flight",
        "default.create_rate.burst",
        'tenants["bad id!"]',
        "tenants.acme.service_classes",
        "tenants.acme.projects.launch.priority",
        "tenants.acme.projects.p2",
        "tenants.acme.allowed_regions[1]",
        "tenants.acme.colour",
    }
    assert "unknown field" in found["extra"]
    assert "(0, 1000]" in found["default.service_classes.STANDARD.weight"]


@pytest.mark.parametrize(
    ("text", "path"),
    [
        ("", "document"),
        ("[1, 2]", "document"),
        ("a: [", "document"),
        ("default: {service_classes: {STANDARD: {}}}", "version"),
        ("version: v1", "default"),
        ("version: v1\ndefault: {}", "default.service_classes"),
        (
            "version: v1\ndefault: {service_classes: {STANDARD: {weight: true}}}",
            "default.service_classes.STANDARD.weight",
        ),
        (
            "version: v1\ndefault: {service_classes: {BATCH: {}}, create_rate: {per_second: 0,"
            " burst: 1}}",
            "default.create_rate.per_second",
        ),
        (
            "version: v1\ndefault: {service_classes: {BATCH: {}}, allowed_regions: us}",
            "default.allowed_regions",
        ),
        ("version: v1\ndefault: {service_classes: {BATCH: {}}}\ntenants: [a]", "tenants"),
    ],
)
def test_malformed_documents_name_the_field(text: str, path: str) -> None:
    """Empty, non-mapping, unparsable and ill-typed documents each name the offending path."""
    assert path in violations(text)


def test_json_is_read_like_yaml() -> None:
    """A JSON document is the same document."""
    doc: dict[str, Any] = {
        "version": "j1",
        "default": {"service_classes": {"BATCH": {"weight": 1e-05}}},
    }
    t = parse_tenants_document(json.dumps(doc))
    assert t.weight("x", "BATCH") == pytest.approx(1e-05)


def test_the_builtin_document_allows_everything_and_is_not_publishable() -> None:
    """Before any publication every class is allowed at weight 1 with no caps or rate."""
    for c in ServiceClass:
        assert ensure_entitled(BUILTIN, "anyone", c) == ClassShare()
    assert BUILTIN.entry("anyone").create_rate is None
    with pytest.raises(TenantsDocumentError):
        ensure_publishable(BUILTIN)


def test_entitlement_refuses_a_class_naming_the_entitled_ones() -> None:
    """A class outside the tenant's entry is PERMISSION_DENIED with the classes it may use."""
    t = parse_tenants_document(EXAMPLE)
    assert ensure_entitled(t, "acme", ServiceClass.INTERACTIVE).weight == 5.0
    with pytest.raises(PermissionDenied) as info:
        ensure_entitled(t, "honest", ServiceClass.INTERACTIVE)
    exc = info.value
    assert exc.reason == "SERVICE_CLASS_NOT_ENTITLED"
    assert exc.labels["entitled_service_classes"] == "STANDARD,BATCH"
    assert exc.labels["service_class"] == "INTERACTIVE"
    assert "entitled: STANDARD, BATCH" in exc.message
    with pytest.raises(PermissionDenied):
        ensure_entitled(t, "acme", ServiceClass.BATCH)


def test_preferred_regions_keep_their_order_and_stay_within_the_allowed() -> None:
    """Preferred regions are ranked as written; a duplicate or one outside allowed_regions
    (the entry's own or inherited) is a violation on the preferred list."""
    t = parse_tenants_document(
        """
version: r1
default: {service_classes: {STANDARD: {}}, preferred_regions: [eu, us]}
tenants:
  acme: {allowed_regions: [us, asia], preferred_regions: [asia, us]}
"""
    )
    assert t.preferred_regions("acme") == ("asia", "us")
    assert t.preferred_regions("other") == ("eu", "us")
    found = violations(
        """
version: r2
default: {service_classes: {STANDARD: {}}, preferred_regions: [eu, eu]}
tenants:
  acme: {allowed_regions: [us]}
  beta: {allowed_regions: [us], preferred_regions: [us, asia]}
"""
    )
    assert found["default.preferred_regions"] == "lists a region twice"
    assert found["tenants.acme.preferred_regions"] == "eu not in allowed_regions"
    assert found["tenants.beta.preferred_regions"] == "asia not in allowed_regions"


def test_a_billing_policy_is_read_like_the_deployments() -> None:
    """billing_policy takes prepaid | postpaid[:micros]; absent, None (the configured one)."""
    t = parse_tenants_document(
        """
version: b1
default: {service_classes: {STANDARD: {}}}
tenants:
  acme: {billing_policy: "postpaid:5000000"}
"""
    )
    policy = t.entry("acme").billing_policy
    assert policy is not None
    assert (policy.mode.value, policy.overdraft_limit_micros) == ("postpaid", 5_000_000)
    assert t.entry("other").billing_policy is None
    found = violations(
        "version: b2\ndefault: {service_classes: {STANDARD: {}}, billing_policy: credit}"
    )
    assert "prepaid or postpaid" in found["default.billing_policy"]


def test_a_routing_scenario_is_an_identifier_inherited_like_the_rest() -> None:
    """routing_scenario names a weight set; a listed tenant without one takes default's."""
    t = parse_tenants_document(
        """
version: s1
default: {service_classes: {STANDARD: {}}, routing_scenario: FREE_TRIAL}
tenants:
  acme: {routing_scenario: AD_PRODUCTION}
  beta: {}
"""
    )
    assert t.routing_scenario("acme") == "AD_PRODUCTION"
    assert t.routing_scenario("beta") == "FREE_TRIAL"
    assert "default.routing_scenario" in violations(
        "version: s2\ndefault: {service_classes: {STANDARD: {}}, routing_scenario: 'a b'}"
    )


def test_safety_profiles_are_listed_by_the_path_that_names_them() -> None:
    """default's profile and each tenant's own (not an inherited one) are listed for the
    publication's check against the safety policy."""
    t = parse_tenants_document(
        """
version: p1
default: {service_classes: {STANDARD: {}}, safety_profile: standard}
tenants:
  acme: {safety_profile: strict}
  beta: {}
"""
    )
    assert t.entry("beta").safety_profile == "standard"
    assert t.safety_profiles() == {
        "default.safety_profile": "standard",
        "tenants.acme.safety_profile": "strict",
    }
