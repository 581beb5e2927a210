"""Spec validation: each platform rule, reported against its proto field path."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from vidroute_core.exceptions import DomainError, InvalidSpec
from vidroute_core.spec import (
    AssetRef,
    GenerationSpec,
    Mode,
    OutputSpec,
    RoutingMode,
    RoutingPolicy,
)
from vidroute_core.validation import (
    MAX_DURATION_MS,
    MAX_NEGATIVE_PROMPT_CHARS,
    MAX_PROMPT_CHARS,
    MAX_REFERENCES,
    MAX_SEED,
    FieldViolation,
    ensure_valid,
    validate_spec,
)

SHA = "ab" * 32
IMAGE = AssetRef("https://cdn.example.com/in/cat.png?X-Amz-Signature=x", "image/png", 10, SHA)
VIDEO = AssetRef("s3://bucket/in/clip.mp4", "video/mp4")


def spec(**changes: Any) -> GenerationSpec:
    """A valid text-to-video spec with `changes` applied (output.* and routing.* via dicts)."""
    output = replace(OutputSpec(1280, 720, 5000), **changes.pop("output", {}))
    routing = replace(RoutingPolicy(), **changes.pop("routing", {}))
    base = GenerationSpec(
        tenant_id="acme", prompt="a cat surfing", mode=Mode.TEXT_TO_VIDEO, output=output
    )
    return replace(base, routing=routing, **changes)


def fields(s: GenerationSpec) -> list[str]:
    return [v.field for v in validate_spec(s)]


def test_valid_specs_pass() -> None:
    """A complete, well-formed spec in every mode has no violations."""
    assert validate_spec(spec()) == []
    assert validate_spec(spec(mode=Mode.IMAGE_TO_VIDEO, first_frame=IMAGE)) == []
    assert (
        validate_spec(spec(mode=Mode.FIRST_LAST_TO_VIDEO, first_frame=IMAGE, last_frame=IMAGE))
        == []
    )
    assert validate_spec(spec(mode=Mode.VIDEO_TO_VIDEO, source_video=VIDEO)) == []
    rich = spec(
        mode=Mode.EXTEND_VIDEO,
        source_video=AssetRef("asset://ast_1", asset_id="ast_1"),
        references=(IMAGE, AssetRef("gs://b/ref.webp", "image/webp")),
        user_id="u-1",
        project_id="p.1",
        seed=MAX_SEED,
        priority=100,
        routing={"mode": RoutingMode.STRICT_MODEL, "required_model": "models/veo-3.0"},
        output={"width": 4320, "height": 7680, "fps": 120, "sample_count": 4},
    )
    assert validate_spec(rich) == []
    ensure_valid(rich)


@pytest.mark.parametrize("tenant", ["", "acme corp", "a:b", "{acme}", "é", "-acme", "a" * 65])
def test_tenant_required_and_safe(tenant: str) -> None:
    """tenant_id must be present and a safe ASCII identifier (it ends up in Redis keys)."""
    assert fields(spec(tenant_id=tenant)) == ["tenant_id"]


def test_optional_ids_must_be_safe_when_given() -> None:
    """user_id and project_id may be empty, but otherwise must be safe identifiers."""
    assert fields(spec(user_id="bob smith", project_id="p/1")) == ["user_id", "project_id"]


@pytest.mark.parametrize("prompt", ["", "   ", "\n\t"])
def test_blank_prompt(prompt: str) -> None:
    """An empty or whitespace-only prompt is rejected on `prompt`."""
    assert fields(spec(prompt=prompt)) == ["prompt"]


def test_oversize_prompt_and_negative_prompt() -> None:
    """Prompts longer than the limits are rejected, each on its own field."""
    assert fields(spec(prompt="x" * MAX_PROMPT_CHARS)) == []
    s = spec(
        prompt="x" * (MAX_PROMPT_CHARS + 1), negative_prompt="y" * (MAX_NEGATIVE_PROMPT_CHARS + 1)
    )
    assert fields(s) == ["prompt", "negative_prompt"]


def test_prompt_length_counts_nfc_code_points() -> None:
    """A decomposed accent counts as one character, as the normalized prompt does."""
    assert fields(spec(prompt="e\u0301" * MAX_PROMPT_CHARS)) == []


def test_prompt_control_characters() -> None:
    """NUL and other control characters are rejected; tabs and newlines are fine."""
    assert fields(spec(prompt="line1\nline2\ttab")) == []
    assert fields(spec(prompt="a\x00b", negative_prompt="\x1b[31m")) == [
        "prompt",
        "negative_prompt",
    ]


@pytest.mark.parametrize(
    ("mode", "given", "expected"),
    [
        (Mode.IMAGE_TO_VIDEO, {}, ["first_frame"]),
        (Mode.FIRST_LAST_TO_VIDEO, {"first_frame": IMAGE}, ["last_frame"]),
        (Mode.FIRST_LAST_TO_VIDEO, {"last_frame": IMAGE}, ["first_frame"]),
        (Mode.VIDEO_TO_VIDEO, {}, ["source_video"]),
        (Mode.EXTEND_VIDEO, {"first_frame": IMAGE}, ["first_frame", "source_video"]),
        (Mode.TEXT_TO_VIDEO, {"first_frame": IMAGE}, ["first_frame"]),
        (
            Mode.TEXT_TO_VIDEO,
            {"last_frame": IMAGE, "source_video": VIDEO},
            ["last_frame", "source_video"],
        ),
        (Mode.IMAGE_TO_VIDEO, {"first_frame": IMAGE, "last_frame": IMAGE}, ["last_frame"]),
    ],
)
def test_mode_input_mismatch(mode: Mode, given: dict[str, AssetRef], expected: list[str]) -> None:
    """Each mode requires its inputs and rejects inputs it would silently ignore."""
    violations = validate_spec(spec(mode=mode, **given))
    assert [v.field for v in violations] == expected
    assert all(mode.value in v.description for v in violations)


@pytest.mark.parametrize(
    "uri",
    [
        "http://cdn.example.com/a.png",
        "file:///etc/passwd",
        "vidroute://assets/a1",
        "ftp://host/a.png",
        "https:///no-host.png",
        "https://user:pw@cdn.example.com/a.png",
        "https://cdn.example.com/a b.png",
        "https://[::1/a.png",
        "https://cdn.example.com/" + "a" * 8200,
    ],
)
def test_asset_uri_rules(uri: str) -> None:
    """Asset URIs must be https/s3/gs/asset, name a host, and carry no credentials."""
    s = spec(mode=Mode.IMAGE_TO_VIDEO, first_frame=AssetRef(uri))
    assert fields(s) == ["first_frame.object_uri"]


def test_asset_needs_uri_or_id() -> None:
    """An asset with neither object_uri nor asset_id is rejected on its object_uri."""
    s = spec(mode=Mode.IMAGE_TO_VIDEO, first_frame=AssetRef(""))
    assert fields(s) == ["first_frame.object_uri"]
    ok = spec(mode=Mode.IMAGE_TO_VIDEO, first_frame=AssetRef("", asset_id="ast_9"))
    assert fields(ok) == []


@pytest.mark.parametrize("checksum", ["abc", "g" * 64, SHA + "0", " " + SHA[1:], SHA.upper()])
def test_checksum_must_be_sha256_hex(checksum: str) -> None:
    """A given checksum must be exactly 64 lower-case hex digits, reported with its index path."""
    refs = (IMAGE, IMAGE, replace(IMAGE, checksum_sha256=checksum))
    assert fields(spec(references=refs)) == ["references[2].checksum_sha256"]


def test_asset_metadata_rules() -> None:
    """MIME type must suit the slot, size must not be negative, asset_id must be safe."""
    bad = AssetRef("https://h/x.png", mime_type="video/mp4", size_bytes=-1, asset_id="a b")
    s = spec(mode=Mode.IMAGE_TO_VIDEO, first_frame=bad)
    assert fields(s) == [
        "first_frame.asset_id",
        "first_frame.mime_type",
        "first_frame.size_bytes",
    ]
    audio_ref = AssetRef("https://h/a.mp3", mime_type="audio/mpeg")
    assert fields(spec(references=(audio_ref,))) == ["references[0].mime_type"]


def test_too_many_references() -> None:
    """More than MAX_REFERENCES references are rejected on `references`."""
    assert fields(spec(references=(IMAGE,) * MAX_REFERENCES)) == []
    assert fields(spec(references=(IMAGE,) * (MAX_REFERENCES + 1))) == ["references"]


@pytest.mark.parametrize("duration", [0, -1, MAX_DURATION_MS + 1])
def test_duration_bounds(duration: int) -> None:
    """Duration must be positive and at most ten minutes."""
    assert fields(spec(output={"duration_ms": duration})) == ["output.duration_ms"]


@pytest.mark.parametrize(
    ("width", "height", "expected"),
    [
        (0, 720, ["output.width"]),
        (1280, -2, ["output.height"]),
        (1281, 721, ["output.width", "output.height"]),
        (7682, 720, ["output.width"]),
        (1280, 7682, ["output.height"]),
        (7680, 4322, ["output.height"]),
        (4322, 7680, ["output.width"]),
        (5000, 5000, ["output.height"]),
    ],
)
def test_frame_size_bounds(width: int, height: int, expected: list[str]) -> None:
    """Width and height must be positive, even and fit 7680x4320 in either orientation."""
    assert fields(spec(output={"width": width, "height": height})) == expected


@pytest.mark.parametrize(("fps", "ok"), [(0, False), (1, True), (120, True), (121, False)])
def test_fps_bounds(fps: int, ok: bool) -> None:
    """fps must be within 1..120."""
    assert fields(spec(output={"fps": fps})) == ([] if ok else ["output.fps"])


@pytest.mark.parametrize(("count", "ok"), [(0, False), (1, True), (4, True), (5, False)])
def test_sample_count_bounds(count: int, ok: bool) -> None:
    """sample_count must be within 1..4."""
    assert fields(spec(output={"sample_count": count})) == ([] if ok else ["output.sample_count"])


@pytest.mark.parametrize(("seed", "ok"), [(0, True), (MAX_SEED, True), (-1, False), (2**32, False)])
def test_seed_is_uint32(seed: int, ok: bool) -> None:
    """seed must fit an unsigned 32-bit integer."""
    assert fields(spec(seed=seed)) == ([] if ok else ["seed"])


def test_strict_model_requires_model() -> None:
    """STRICT_MODEL without required_model is rejected on routing.required_model."""
    s = spec(routing={"mode": RoutingMode.STRICT_MODEL, "required_provider": "runway"})
    assert fields(s) == ["routing.required_model"]


def test_preferred_requires_a_preference() -> None:
    """PREFERRED with neither preferred providers nor a required model is rejected."""
    assert fields(spec(routing={"mode": RoutingMode.PREFERRED})) == ["routing.mode"]
    assert fields(spec(routing={"mode": RoutingMode.PREFERRED, "required_model": "m"})) == []
    ok = spec(routing={"mode": RoutingMode.PREFERRED, "preferred_providers": ("veo",)})
    assert fields(ok) == []


def test_routing_names_must_be_safe() -> None:
    """Provider, model, region and preferred-provider names must be safe and not repeated."""
    s = spec(
        routing={
            "required_model": "veo 3",
            "required_provider": "run:way",
            "preferred_providers": ("veo", "", "veo"),
            "region": "us central",
        }
    )
    assert fields(s) == [
        "routing.required_provider",
        "routing.required_model",
        "routing.preferred_providers[1]",
        "routing.preferred_providers[2]",
        "routing.region",
    ]


def test_negative_budget() -> None:
    """A negative budget is rejected on routing.max_estimated_cost.amount_micros."""
    s = spec(routing={"max_estimated_cost_micros": -1})
    assert fields(s) == ["routing.max_estimated_cost.amount_micros"]


@pytest.mark.parametrize("currency", ["usd", "US", "USDT", "U$D"])
def test_currency_must_be_iso_code(currency: str) -> None:
    """A currency that is not three upper-case letters is rejected."""
    s = spec(routing={"max_estimated_cost_micros": 2_000_000, "currency": currency})
    assert fields(s) == ["routing.max_estimated_cost.currency_code"]


def test_currency_needed_only_with_budget() -> None:
    """An empty currency is fine without a budget and rejected with one."""
    assert fields(spec(routing={"currency": ""})) == []
    s = spec(routing={"currency": "", "max_estimated_cost_micros": 1})
    assert fields(s) == ["routing.max_estimated_cost.currency_code"]


def test_negative_queue_delay() -> None:
    """A negative max queue delay is rejected."""
    assert fields(spec(routing={"max_queue_delay_ms": -1})) == ["routing.max_queue_delay_ms"]


@pytest.mark.parametrize(
    ("priority", "ok"), [(-100, True), (100, True), (-101, False), (101, False)]
)
def test_priority_range(priority: int, ok: bool) -> None:
    """priority must be within -100..100."""
    assert fields(spec(priority=priority)) == ([] if ok else ["priority"])


def test_unset_enums_reported() -> None:
    """A mode, routing mode or service class that is not an enum member is reported as unset."""
    s = spec(mode=None, service_class=0, routing={"mode": None})
    assert fields(s) == ["mode", "routing.mode", "service_class"]


def test_all_violations_reported_in_field_order() -> None:
    """Every broken rule is reported, in proto field order, not just the first."""
    s = spec(
        tenant_id="",
        prompt=" ",
        mode=Mode.IMAGE_TO_VIDEO,
        output={"width": 3, "height": 0, "duration_ms": 0, "fps": 0, "sample_count": 9},
        seed=-5,
        routing={"mode": RoutingMode.STRICT_MODEL, "max_queue_delay_ms": -1},
        priority=500,
    )
    assert fields(s) == [
        "tenant_id",
        "prompt",
        "first_frame",
        "output.width",
        "output.height",
        "output.duration_ms",
        "output.fps",
        "output.sample_count",
        "seed",
        "routing.required_model",
        "routing.max_queue_delay_ms",
        "priority",
    ]
    assert validate_spec(s) == validate_spec(s)
    with pytest.raises(InvalidSpec) as excinfo:
        ensure_valid(s)
    assert isinstance(excinfo.value, DomainError)
    assert [v.field for v in excinfo.value.violations] == fields(s)
    assert all(isinstance(v, FieldViolation) and v.description for v in excinfo.value.violations)
