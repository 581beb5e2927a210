"""The platform safety policy: each rule, the tenant floor, text normalization, the document."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from controlplane.domain.safety import (
    REASON,
    BlockRule,
    PolicyError,
    SafetyPolicy,
    TenantRules,
    ensure_allowed,
    normalize_text,
)
from vidroute_core.exceptions import PreconditionFailed
from vidroute_core.spec import AssetRef, GenerationSpec, Mode, OutputSpec

ROOT = Path(__file__).resolve().parents[3]
GORE = BlockRule("graphic-violence", terms=("gore", "severed head"), fields=("prompt",))
POLICY = SafetyPolicy(
    version="t1",
    rules=TenantRules(
        blocked=(GORE, BlockRule("weapons", patterns=(r"(?<!\w)ak-?47(?!\w)",))),
        allowed_modes=frozenset({Mode.TEXT_TO_VIDEO, Mode.IMAGE_TO_VIDEO}),
        max_duration_ms=10_000,
        max_frame_pixels=1920 * 1080,
        asset_hosts=frozenset({"uploads.example.com", ".cdn.example.com"}),
    ),
    tenants={
        "kids": TenantRules(
            blocked=(BlockRule("scary", terms=("ghost",)),),
            allowed_modes=frozenset({Mode.TEXT_TO_VIDEO}),
            max_duration_ms=5_000,
        )
    },
)


def spec(**changes: Any) -> GenerationSpec:
    output = replace(OutputSpec(1280, 720, 5000), **changes.pop("output", {}))
    base = GenerationSpec(
        tenant_id="acme", prompt="a cat surfing", mode=Mode.TEXT_TO_VIDEO, output=output
    )
    return replace(base, **changes)


def rules_of(s: GenerationSpec, policy: SafetyPolicy = POLICY) -> list[tuple[str, str]]:
    return [(v.rule, v.field) for v in policy.check(s)]


def test_a_compliant_spec_passes() -> None:
    """A spec that breaks no rule has no violations and `ensure_allowed` returns."""
    assert POLICY.check(spec()) == []
    ensure_allowed(POLICY, spec())


def test_blocked_term_in_prompt_is_named_with_rule_and_field() -> None:
    """A blocked term in the prompt is refused with the rule's name and the prompt field."""
    assert rules_of(spec(prompt="a movie scene full of GORE")) == [("graphic-violence", "prompt")]


def test_multi_word_term_matches_across_any_whitespace() -> None:
    """A multi-word term matches whatever whitespace separates its words."""
    assert rules_of(spec(prompt="a severed\n\t head on a plate")) == [
        ("graphic-violence", "prompt")
    ]


def test_terms_match_whole_words_only() -> None:
    """A term inside a longer word ("gorest", "Gorey") is not a match."""
    assert rules_of(spec(prompt="the gorest hills of Edward Gorey")) == []


def test_rule_fields_limit_where_it_applies() -> None:
    """A prompt-only rule ignores the negative prompt; a rule for both checks both."""
    assert rules_of(spec(negative_prompt="no gore please")) == []
    assert rules_of(spec(negative_prompt="an AK47")) == [("weapons", "negative_prompt")]


def test_mode_outside_the_allowed_set_is_refused() -> None:
    """A mode the policy does not allow is refused on the mode field."""
    video = AssetRef("https://uploads.example.com/a.mp4", "video/mp4")
    assert rules_of(spec(mode=Mode.VIDEO_TO_VIDEO, source_video=video)) == [("mode", "mode")]


def test_duration_and_frame_limits_carry_the_numbers() -> None:
    """Too long and too large are refused, with the asked and allowed figures attached."""
    found = POLICY.check(spec(output={"duration_ms": 12_000, "width": 3840, "height": 2160}))
    assert [(v.rule, v.field) for v in found] == [
        ("max_duration", "output.duration_ms"),
        ("max_frame_pixels", "output.width"),
    ]
    assert found[0].numbers == {"duration_ms": 12_000, "max_duration_ms": 10_000}
    assert found[1].numbers == {"frame_pixels": 3840 * 2160, "max_frame_pixels": 1920 * 1080}


@pytest.mark.parametrize(
    ("uri", "allowed"),
    [
        ("https://uploads.example.com/cat.png?sig=x", True),
        ("https://a.b.cdn.example.com/cat.png", True),
        ("https://UPLOADS.EXAMPLE.COM/cat.png", True),
        ("asset://platform/cat.png", True),
        ("https://evil.example.org/cat.png", False),
        ("https://cdn.example.com.evil.org/cat.png", False),
        ("https://notcdn.example.com/cat.png", False),
        ("s3://someone-elses-bucket/cat.png", False),
    ],
)
def test_asset_hosts_allow_list(uri: str, allowed: bool) -> None:
    """Only hosts on the allow-list (exact, or under a ".suffix") may supply input assets."""
    s = spec(mode=Mode.IMAGE_TO_VIDEO, first_frame=AssetRef(uri, "image/png"))
    expected = [] if allowed else [("asset_host", "first_frame.object_uri")]
    assert rules_of(s) == expected


def test_tenant_section_tightens_the_global_rules() -> None:
    """A tenant's own rules apply on top of the global ones, only for that tenant."""
    assert rules_of(spec(prompt="a friendly ghost")) == []
    assert rules_of(spec(tenant_id="kids", prompt="a friendly ghost")) == [("scary", "prompt")]
    assert rules_of(spec(tenant_id="kids", output={"duration_ms": 8000})) == [
        ("max_duration", "output.duration_ms")
    ]
    assert rules_of(spec(tenant_id="kids", prompt="gore")) == [("graphic-violence", "prompt")]


_MODES = st.sets(st.sampled_from(list(Mode)))
_LIMIT = st.integers(min_value=0, max_value=20_000)


@given(
    global_modes=st.none() | _MODES.map(frozenset),
    tenant_modes=st.none() | _MODES.map(frozenset),
    global_max=_LIMIT,
    tenant_max=_LIMIT,
    mode=st.sampled_from(list(Mode)),
    duration=st.integers(min_value=1, max_value=25_000),
)
def test_a_tenant_never_allows_what_the_global_policy_refuses(
    *,
    global_modes: frozenset[Mode] | None,
    tenant_modes: frozenset[Mode] | None,
    global_max: int,
    tenant_max: int,
    mode: Mode,
    duration: int,
) -> None:
    """For every pair of global and tenant rules, the tenant's effective rules are no laxer."""
    policy = SafetyPolicy(
        rules=TenantRules(allowed_modes=global_modes, max_duration_ms=global_max),
        tenants={"t": TenantRules(allowed_modes=tenant_modes, max_duration_ms=tenant_max)},
    )
    probe = spec(mode=mode, output={"duration_ms": duration})
    global_refusals = {v.rule for v in policy.check(probe)}
    tenant_refusals = {v.rule for v in policy.check(replace(probe, tenant_id="t"))}
    assert global_refusals <= tenant_refusals


_WORD_CHARS = st.characters(whitelist_categories=("Ll", "Lu", "Nd"))
_SEPARATORS = st.sampled_from([" ", ", ", ". ", "\n", "! ", " (", ") "])


@given(
    before=st.text(_WORD_CHARS, max_size=12),
    after=st.text(_WORD_CHARS, max_size=12),
    sep_before=_SEPARATORS,
    sep_after=_SEPARATORS,
    upper=st.lists(st.booleans(), min_size=4, max_size=4),
    zero_width_at=st.integers(min_value=0, max_value=4),
    fullwidth=st.booleans(),
)
def test_a_blocked_term_is_found_however_it_is_dressed(
    *,
    before: str,
    after: str,
    sep_before: str,
    sep_after: str,
    upper: list[bool],
    zero_width_at: int,
    fullwidth: bool,
) -> None:
    """Case, full-width forms and zero-width characters never hide a blocked term."""
    word = "".join(c.upper() if u else c for c, u in zip("gore", upper, strict=True))
    if fullwidth:
        word = "".join(chr(ord(c) + 0xFEE0) for c in word)
    word = word[:zero_width_at] + "\u200b" + word[zero_width_at:]
    prompt = f"{before}{sep_before}{word}{sep_after}{after}"
    assert ("graphic-violence", "prompt") in rules_of(spec(prompt=prompt))


@given(st.text(st.characters(whitelist_categories=("Ll", "Zs"), max_codepoint=0x7F), max_size=60))
def test_text_without_the_letters_of_a_term_never_matches(prompt: str) -> None:
    """A prompt that cannot contain "gore" (no letter g) is never refused by that rule."""
    prompt = prompt.replace("g", "")
    assert ("graphic-violence", "prompt") not in rules_of(spec(prompt=prompt or "x"))


@given(st.text(max_size=40))
def test_normalization_is_idempotent(text: str) -> None:
    """Normalizing twice is normalizing once, so a stored normalized form matches again."""
    once = normalize_text(text)
    assert normalize_text(once) == once


def test_ensure_allowed_raises_precondition_with_rule_field_and_version() -> None:
    """A refusal is PreconditionFailed with reason SAFETY_POLICY_VIOLATION and its labels."""
    with pytest.raises(PreconditionFailed) as caught:
        ensure_allowed(POLICY, spec(prompt="gore", output={"duration_ms": 12_000}))
    exc = caught.value
    assert exc.reason == REASON
    assert exc.labels == {"rule": "graphic-violence", "field": "prompt", "policy_version": "t1"}
    assert exc.numbers["violations"] == 2
    assert "output.duration_ms" in exc.message


def test_shipped_default_policy_loads_and_refuses_a_blocked_prompt() -> None:
    """The default policy file parses, and refuses what it says it blocks."""
    doc = yaml.safe_load((ROOT / "controlplane" / "safety_policy.yaml").read_text())
    policy = SafetyPolicy.from_mapping(doc)
    assert policy.version == "platform-default-2026-12"
    assert rules_of(spec(prompt="a beheading in the square"), policy) == [
        ("graphic-violence", "prompt")
    ]
    assert rules_of(spec(prompt="a red kite over a green hill"), policy) == []


def test_document_parsing_reads_every_rule_kind() -> None:
    """Every key of the document lands in the rules it names."""
    policy = SafetyPolicy.from_mapping(
        {
            "version": "v9",
            "rules": {
                "blocked": [{"name": "x", "terms": ["foo bar"], "fields": ["prompt"]}],
                "allowed_modes": ["TEXT_TO_VIDEO"],
                "max_duration_ms": 4000,
                "max_frame_pixels": 100,
                "asset_hosts": ["Example.COM"],
            },
            "tenants": {"t": {"max_duration_ms": 1000}},
        }
    )
    assert policy.rules.allowed_modes == frozenset({Mode.TEXT_TO_VIDEO})
    assert policy.rules.asset_hosts == frozenset({"example.com"})
    assert policy.effective("t").max_duration_ms == 1000
    assert policy.rules.blocked[0].matches("say foo  bar")


@pytest.mark.parametrize(
    "doc",
    [
        {"rules": {"blocked": [{"terms": ["x"]}]}},  # no name
        {"rules": {"blocked": [{"name": "x", "patterns": ["("]}]}},  # bad regex
        {"rules": {"blocked": [{"name": "x", "fields": ["seed"]}]}},  # unknown field
        {"rules": {"allowed_modes": ["TELEPORT"]}},
        {"rules": {"max_duration_ms": -1}},
        {"rules": {"max_duration": 5}},  # unknown key
        {"tenants": ["a"]},
    ],
)
def test_malformed_documents_are_refused_at_load(doc: dict[str, Any]) -> None:
    """A malformed policy is an error when it is loaded, never a silent no-op."""
    with pytest.raises(PolicyError):
        SafetyPolicy.from_mapping(doc)
