"""Safety profiles (controlplane.domain.safety): a named section the tenants document assigns,
tightening the global rules before the tenant's own section; an unknown one refuses."""

from __future__ import annotations

import pytest

from controlplane.domain.safety import SafetyPolicy, ensure_allowed
from vidroute_core.exceptions import PreconditionFailed
from vidroute_core.spec import GenerationSpec, Mode, OutputSpec

pytestmark = pytest.mark.timeout(30)

POLICY = SafetyPolicy.from_mapping(
    {
        "version": "s1",
        "rules": {"max_duration_ms": 60_000},
        "profiles": {"strict": {"max_duration_ms": 5_000, "blocked": [
            {"name": "no-brands", "fields": ["prompt"], "terms": ["logo"]}
        ]}},
        "tenants": {"acme": {"max_duration_ms": 4_000}},
    }
)  # fmt: skip


def spec(tenant: str, seconds: int, prompt: str = "a kite") -> GenerationSpec:
    return GenerationSpec(
        tenant_id=tenant,
        prompt=prompt,
        mode=Mode.TEXT_TO_VIDEO,
        output=OutputSpec(width=1280, height=720, duration_ms=seconds * 1000),
    )


def test_a_profile_tightens_the_global_rules() -> None:
    """Under strict an 8 s task and a blocked term are refused; without it both pass."""
    ensure_allowed(POLICY, spec("beta", 8, "a logo"))
    found = POLICY.check(spec("beta", 8, "a logo"), "strict")
    assert {v.rule for v in found} == {"max_duration", "no-brands"}


def test_the_tenants_own_section_tightens_after_the_profile() -> None:
    """acme's own 4 s maximum holds under the 5 s profile too."""
    assert POLICY.effective("acme", "strict").max_duration_ms == 4_000
    assert POLICY.effective("beta", "strict").max_duration_ms == 5_000


def test_an_unknown_profile_refuses_rather_than_skips() -> None:
    """A profile the policy lacks is SAFETY_PROFILE_UNKNOWN, naming it."""
    with pytest.raises(PreconditionFailed) as info:
        ensure_allowed(POLICY, spec("beta", 1), "lenient")
    assert info.value.reason == "SAFETY_PROFILE_UNKNOWN"
    assert info.value.labels["safety_profile"] == "lenient"
