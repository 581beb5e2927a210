"""Content tags (design 9.14) at the boundary: the wire's closed vocabularies, and the quality
prior a capability entry may give its model."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from vidroute.common.v1 import generation_pb2 as gen
from vidroute_core.capabilities.loader import CapabilityLoadError, load_directory, parse_entry
from vidroute_core.spec import (
    NO_TAGS,
    CameraMotion,
    ContentCategory,
    ContentTags,
    GenerationSpec,
    Mode,
    OutputSpec,
    Style,
)
from vidroute_core.wire.capability import capability_document, capability_to_proto
from vidroute_core.wire.spec import spec_from_proto, spec_to_proto

ROOT = Path(__file__).resolve().parents[3]
tags = st.builds(
    ContentTags,
    category=st.none() | st.sampled_from(ContentCategory),
    style=st.none() | st.sampled_from(Style),
    has_human=st.none() | st.booleans(),
    camera_motion=st.none() | st.sampled_from(CameraMotion),
)


def _spec(content: ContentTags = NO_TAGS) -> GenerationSpec:
    return GenerationSpec(
        tenant_id="acme",
        prompt="a fox",
        mode=Mode.TEXT_TO_VIDEO,
        output=OutputSpec(width=1280, height=720, duration_ms=4000),
        content=content,
    )


@given(tags)
def test_every_tag_round_trips_the_wire(content: ContentTags) -> None:
    """Any tags in the vocabularies encode and decode to themselves, with no violation."""
    decoded, violations = spec_from_proto(spec_to_proto(_spec(content)))
    assert violations == []
    assert decoded.content == content


def test_each_vocabulary_is_the_proto_enum() -> None:
    """The Python vocabularies and the proto enums name the same values (zero is "not said")."""
    for domain, proto, prefix in (
        (ContentCategory, gen.ContentCategory, "CONTENT_CATEGORY_"),
        (Style, gen.Style, "STYLE_"),
        (CameraMotion, gen.CameraMotion, "CAMERA_MOTION_"),
    ):
        names = {n.removeprefix(prefix) for n, _ in proto.items() if not n.endswith("_UNSPECIFIED")}
        assert names == {m.value for m in domain}


def test_numbers_outside_a_vocabulary_are_field_violations() -> None:
    """An unknown enum number is a violation naming the tag's path; an unset has_human is None
    and an explicit false is kept."""
    msg = spec_to_proto(_spec())
    msg.content.style = gen.Style.ValueType(77)
    msg.content.camera_motion = gen.CameraMotion.ValueType(-1)
    msg.content.has_human = False
    decoded, violations = spec_from_proto(msg)
    assert {v.field for v in violations} == {"content.style", "content.camera_motion"}
    assert decoded.content.has_human is False
    assert spec_from_proto(spec_to_proto(_spec()))[0].content.has_human is None


def _entry() -> dict[str, object]:
    cap = load_directory(ROOT / "adapter_sidecars/runway/capabilities")[0]
    return capability_document(capability_to_proto(cap))


def test_the_capability_prior_is_optional_and_bounded() -> None:
    """An entry without ``quality_prior`` has None (the router's default); 0..1 is kept through
    Describe's proto and back; outside [0, 1] the entry does not load."""
    doc = _entry()
    assert parse_entry(doc).quality_prior is None
    doc["quality_prior"] = 0.75
    cap = parse_entry(doc)
    assert cap.quality_prior == 0.75
    assert parse_entry(capability_document(capability_to_proto(cap))).quality_prior == 0.75
    for bad in (1.5, -0.1, "high"):
        wrong = copy.deepcopy(doc)
        wrong["quality_prior"] = bad
        with pytest.raises(CapabilityLoadError, match="quality_prior"):
            parse_entry(wrong)
