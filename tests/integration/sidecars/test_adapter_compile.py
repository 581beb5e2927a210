"""Compiling specs (design 9.7): transformation kinds, constraints, cost, request hash, goldens.

The golden files in ``tests/testdata/<adapter>/`` belong to the contract suite (it writes them);
here each one is replayed in-process as a cross-check of the compile path.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from adapter_support import LAST_IMAGE, make_spec, sidecar_config
from google.protobuf import json_format

from adapter_sidecars.common.compiling import aspect_label
from adapter_sidecars.common.types import CompileInput
from adapter_sidecars.runway.adapter import RunwayAdapter
from adapter_sidecars.selfhosted.adapter import SelfHostedAdapter
from adapter_sidecars.veo.adapter import VeoAdapter
from vidroute.common.v1.generation_pb2 import GenerationSpec
from vidroute_core.adapter import CompiledPlan, TransformationKind
from vidroute_core.capabilities.constraints import (
    Constraint,
    ConstraintSyntaxError,
    ConstraintTypeError,
    parse,
)
from vidroute_core.spec import Mode
from vidroute_core.wire.spec import spec_from_proto

K = TransformationKind
TESTDATA = Path(__file__).resolve().parents[2] / "testdata"
ADAPTERS: dict[str, type[RunwayAdapter] | type[VeoAdapter] | type[SelfHostedAdapter]] = {
    "runway": RunwayAdapter,
    "veo": VeoAdapter,
    "selfhosted": SelfHostedAdapter,
}


def _adapter(name: str) -> RunwayAdapter | VeoAdapter | SelfHostedAdapter:
    return ADAPTERS[name].from_config(sidecar_config("http://127.0.0.1:9", "KEY"))


def _compile(name: str, model: str, **spec_fields: object) -> CompiledPlan:
    spec = make_spec(**spec_fields)
    return _adapter(name).compile(CompileInput(spec, model))


def _kinds(plan: CompiledPlan) -> dict[str, K]:
    return {t.field: t.kind for t in plan.transformations}


GOLDEN = sorted((a, p) for a in ADAPTERS for p in (TESTDATA / a).glob("*.golden.json"))


@pytest.mark.parametrize(("adapter", "path"), GOLDEN, ids=[f"{a}-{p.stem}" for a, p in GOLDEN])
def test_compile_matches_the_contract_golden_files(adapter: str, path: Path) -> None:
    """Compiling each golden spec in-process reproduces the contract suite's plan (9.25.2)."""
    golden = json.loads(path.read_text())
    spec, violations = spec_from_proto(json_format.ParseDict(golden["spec"], GenerationSpec()))
    assert not violations
    want = golden["plan"]
    plan = _adapter(adapter).compile(CompileInput(spec, want["model"]))
    assert plan.endpoint == want["endpoint"]
    assert plan.native_request == want.get("native_request")
    assert [[t.field, t.kind.value, t.detail] for t in plan.transformations] == [
        [t["field"], t["kind"], t["detail"]] for t in want["transformations"]
    ]
    assert plan.estimated_cost_micros == int(want["estimated_cost"]["amount_micros"])
    assert plan.request_hash == want["request_hash"]


def test_compile_is_deterministic_and_hash_ignores_url_signatures() -> None:
    """Same spec -> identical plan; a re-signed asset URL keeps the request hash."""
    from dataclasses import replace

    from adapter_support import IMAGE

    one = _compile("runway", "gen4.5", mode=Mode.IMAGE_TO_VIDEO)
    two = _compile("runway", "gen4.5", mode=Mode.IMAGE_TO_VIDEO)
    assert one == two
    resigned = replace(IMAGE, object_uri=IMAGE.object_uri.replace("abc", "xyz"))
    three = _compile("runway", "gen4.5", mode=Mode.IMAGE_TO_VIDEO, first_frame=resigned)
    assert three.native_request_json != one.native_request_json
    assert three.request_hash == one.request_hash
    other_checksum = replace(IMAGE, checksum_sha256="c" * 64)
    four = _compile("runway", "gen4.5", mode=Mode.IMAGE_TO_VIDEO, first_frame=other_checksum)
    assert four.request_hash != one.request_hash


def test_size_maps_losslessly_to_runway_pixel_ratio() -> None:
    """1920x1080 is not gen4.5's resolution; 1280x720 is LOSSLESS to ratio 1280:720."""
    plan = _compile("runway", "gen4.5")
    assert _kinds(plan)["output.width,output.height"] is K.LOSSLESS
    assert plan.native_request is not None
    assert plan.native_request["ratio"] == "1280:720"
    assert aspect_label(1440, 1080) == "4:3"


def test_unsupported_aspect_ratio_is_reject() -> None:
    """A 4:3 text-to-video on gen4.5 breaks its constraint: REJECT, not submittable."""
    plan = _compile("runway", "gen4.5", width=960, height=720)
    assert not plan.submittable
    assert any(t.kind is K.REJECT and "1280:720" in t.detail for t in plan.transformations)


def test_duration_snap_is_degrade_only_when_allowed() -> None:
    """7 s on veo3.1 (4/6/8): DEGRADE to 8 s with permission, REJECT without."""
    allowed = _compile("runway", "veo3.1", duration_ms=7000, degrade=True)
    assert _kinds(allowed)["output.duration_ms"] is K.DEGRADE
    assert allowed.native_request is not None
    assert allowed.native_request["duration"] == 8
    assert allowed.submittable
    refused = _compile("runway", "veo3.1", duration_ms=7000)
    assert _kinds(refused)["output.duration_ms"] is K.REJECT
    assert not refused.submittable
    assert refused.native_request is None
    assert refused.request_hash == ""


def test_1080p_requires_8s_through_the_constraint_evaluator() -> None:
    """1080p at 6 s on Veo 3.1 snaps to 8 s (the only legal duration) as a DEGRADE."""
    plan = _compile(
        "veo", "veo-3.1-generate-preview", width=1920, height=1080, duration_ms=6000, degrade=True
    )
    transformation = next(t for t in plan.transformations if t.field == "output.duration_ms")
    assert transformation.kind is K.DEGRADE
    assert "1080p" in transformation.detail
    assert plan.native_request is not None
    assert plan.native_request["parameters"]["durationSeconds"] == 8
    assert plan.native_request["parameters"]["resolution"] == "1080p"


def test_audio_on_a_silent_model_is_reject_or_degrade() -> None:
    """with_audio on gen4.5 (silent): REJECT by default, DEGRADE when allowed."""
    assert _kinds(_compile("runway", "gen4.5", with_audio=True))["output.with_audio"] is K.REJECT
    degraded = _compile("runway", "gen4.5", with_audio=True, degrade=True)
    assert _kinds(degraded)["output.with_audio"] is K.DEGRADE


def test_audio_price_applies_when_audio_is_generated() -> None:
    """veo3.1 via Runway costs 40 credits/s with audio and 20 without."""
    loud = _compile("runway", "veo3.1", duration_ms=8000, with_audio=True)
    quiet = _compile("runway", "veo3.1", duration_ms=8000)
    assert loud.estimated_cost_micros == 3_200_000
    assert quiet.estimated_cost_micros == 1_600_000
    assert loud.native_request is not None
    assert loud.native_request["audio"] is True


def test_always_on_audio_is_lossless_strip() -> None:
    """Veo 3.1 (Gemini) always renders audio: a silent request is a LOSSLESS strip."""
    plan = _compile("veo", "veo-3.1-generate-preview", duration_ms=8000)
    assert _kinds(plan)["output.with_audio"] is K.LOSSLESS


def test_last_frame_on_a_model_without_it_is_reject() -> None:
    """FIRST_LAST on gen4.5 is REJECT (mode and last frame)."""
    plan = _compile("runway", "gen4.5", mode=Mode.FIRST_LAST_TO_VIDEO)
    kinds = _kinds(plan)
    assert kinds["mode"] is K.REJECT
    assert kinds["last_frame"] is K.REJECT


def test_negative_prompt_without_support_is_degrade() -> None:
    """gen4.5 has no negative prompt: DEGRADE (dropped) when allowed."""
    plan = _compile("runway", "gen4.5", negative_prompt="blurry", degrade=True)
    assert _kinds(plan)["negative_prompt"] is K.DEGRADE
    assert plan.native_request is not None
    assert "negativePrompt" not in plan.native_request


def test_seed_is_exact_where_supported_and_degraded_elsewhere() -> None:
    """A seed is EXACT on gen4.5 and a DEGRADE on Veo 3.1."""
    assert _kinds(_compile("runway", "gen4.5", seed=42))["seed"] is K.EXACT
    veo = _compile("veo", "veo-3.1-generate-preview", duration_ms=8000, seed=42, degrade=True)
    assert _kinds(veo)["seed"] is K.DEGRADE


def test_first_last_on_veo_sends_last_frame() -> None:
    """Veo 3.1 interpolation puts the last frame into instances[0].lastFrame, as an asset
    reference with its checksum (Submit inlines the bytes)."""
    plan = _compile(
        "veo", "veo-3.1-generate-preview", mode=Mode.FIRST_LAST_TO_VIDEO, duration_ms=8000
    )
    assert plan.native_request is not None
    assert plan.native_request["instances"][0]["lastFrame"] == {
        "assetUri": LAST_IMAGE.object_uri,
        "mimeType": LAST_IMAGE.mime_type,
        "checksumSha256": LAST_IMAGE.checksum_sha256,
    }


@pytest.mark.parametrize(
    ("expression", "env", "expected"),
    [
        ('resolution in ["1080p", "4k"]', {"resolution": "4k"}, True),
        ('resolution not in ["1080p", "4k"]', {"resolution": "4k"}, False),
        ("duration_seconds == 8", {"duration_seconds": 8}, True),
        (
            "duration_seconds <= 5 and not with_audio",
            {"duration_seconds": 4, "with_audio": False},
            True,
        ),
        (
            'mode == "EXTEND_VIDEO" or sample_count > 1',
            {"mode": "TEXT_TO_VIDEO", "sample_count": 2},
            True,
        ),
        ("(duration_seconds >= 4) and (duration_seconds != 6)", {"duration_seconds": 6}, False),
    ],
)
def test_constraint_language(
    expression: str, env: dict[str, str | float | int | bool], expected: bool
) -> None:
    """The evaluator handles comparisons, in-lists, and/or/not and parentheses without eval."""
    assert parse(expression).evaluate(env) is expected


@pytest.mark.parametrize("bad", ["resolution ==", "__import__('os')", "colour == 1", "a in [1"])
def test_constraint_syntax_errors(bad: str) -> None:
    """Malformed or unknown-identifier expressions fail at parse time."""
    with pytest.raises(ConstraintSyntaxError):
        parse(bad)


def test_constraint_type_mismatch_is_an_error_not_false() -> None:
    """Comparing a string to a number raises instead of silently switching a rule off."""
    with pytest.raises(ConstraintTypeError):
        Constraint("resolution == 8", "with_audio").check(
            {"resolution": "720p", "with_audio": True}
        )
