"""Runway request validation (provider-apis.md §1.3), reporting zod-style `issues`.

The model table is data, not code paths: add a model by adding a `ModelRule`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

T2V, I2V, V2V = "text_to_video", "image_to_video", "video_to_video"
LANDSCAPE = ("1280:720", "720:1280")
GEN4_RATIOS = (*LANDSCAPE, "1104:832", "832:1104", "960:960", "1584:672")
VEO_RATIOS = (*LANDSCAPE, "1080:1920", "1920:1080")
BASE_KEYS = {
    T2V: {"model", "promptText", "ratio", "duration"},
    I2V: {"model", "promptText", "ratio", "duration", "promptImage"},
    V2V: {"model", "promptText", "videoUri"},
}


@dataclass(frozen=True)
class ModelRule:
    """What one model accepts on each endpoint."""

    ratios: dict[str, tuple[str, ...]]
    durations: tuple[int, ...] = ()
    duration_required: bool = False
    default_duration: int = 5
    prompt_required: frozenset[str] = frozenset({T2V})
    extra_keys: frozenset[str] = frozenset()
    positions: frozenset[str] = frozenset({"first"})
    prompt_max: int = 1000
    ratio_key: str = "ratio"
    endpoints: frozenset[str] = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "endpoints", frozenset(self.ratios))


GEN4 = frozenset({"seed", "contentModeration"})
#: gen4.5's `outputFormat` (runwayml >= 5.14) -> extra credits per second (the SDK's docstring:
#: 5 for ProRes / PNG frames, 20 for every 10-bit-and-deeper profile; >4 MP outputs, 40, never
#: occur at gen4.5's 720p).
OUTPUT_FORMATS = {
    "mp4": 0,
    "prores": 5,
    "png_sequence": 5,
    "hdr10": 20,
    "hlg": 20,
    "sdr_rec709_10bit": 20,
    "hdr_pq_12bit_master": 20,
    "hdr_prores": 20,
    "hdr_png_sequence": 20,
    "hdr_exr_sequence": 20,
    "hdr_exr_acescg_sequence_1_3": 20,
    "hdr_exr_acescg_sequence_2_0": 20,
}
VEO31 = ModelRule(
    ratios={T2V: VEO_RATIOS, I2V: VEO_RATIOS},
    durations=(4, 6, 8),
    default_duration=8,
    # `seed` on veo3.1 / veo3.1_fast: runwayml >= 5.18 (provider-apis.md §5).
    extra_keys=frozenset({"negativePrompt", "audio", "seed"}),
    positions=frozenset({"first", "last"}),
)
MODELS: dict[str, ModelRule] = {
    "gen4_turbo": ModelRule(
        ratios={I2V: GEN4_RATIOS},
        durations=tuple(range(2, 11)),
        default_duration=10,
        prompt_required=frozenset(),
        extra_keys=GEN4,
    ),
    "gen4.5": ModelRule(
        ratios={T2V: LANDSCAPE, I2V: GEN4_RATIOS},
        durations=tuple(range(2, 11)),
        duration_required=True,
        prompt_required=frozenset({T2V, I2V}),
        extra_keys=GEN4 | {"outputFormat"},
    ),
    "veo3": ModelRule(
        ratios={T2V: VEO_RATIOS, I2V: VEO_RATIOS},
        durations=(8,),
        duration_required=True,
        default_duration=8,
        extra_keys=frozenset({"negativePrompt"}),
    ),
    "veo3.1": VEO31,
    "veo3.1_fast": VEO31,
    "gen3a_turbo": ModelRule(
        ratios={I2V: ("1280:768", "768:1280")},
        durations=(5, 10),
        prompt_required=frozenset(),
        extra_keys=frozenset({"seed"}),
        positions=frozenset({"first", "last"}),
    ),
    "gen4_aleph": ModelRule(
        ratios={V2V: GEN4_RATIOS},
        prompt_required=frozenset({V2V}),
        extra_keys=frozenset({"ratio", "seed", "references", "contentModeration"}),
    ),
    "aleph2": ModelRule(
        ratios={V2V: ("16:9", "9:16", "1:1", "4:3", "3:4", "21:9")},
        prompt_required=frozenset({V2V}),
        ratio_key="targetAspectRatio",
        extra_keys=frozenset({"targetAspectRatio", "keyframes", "seed"}),
    ),
}


def _type_issue(path: list[Any], expected: str, value: Any) -> dict[str, Any]:
    received = "undefined" if value is None else type(value).__name__
    return {
        "code": "invalid_type",
        "expected": expected,
        "path": path,
        "message": f"Invalid input: expected {expected}, received {received}",
    }


def _value_issue(path: list[Any], values: list[Any]) -> dict[str, Any]:
    shown = "|".join(f'"{v}"' if isinstance(v, str) else str(v) for v in values)
    return {
        "code": "invalid_value",
        "values": values,
        "path": path,
        "message": f"Invalid option: expected one of {shown}",
    }


def validate(endpoint: str, body: Any) -> list[dict[str, Any]]:
    """Return zod-style issues for a create body (empty list = valid)."""
    if not isinstance(body, dict):
        return [_type_issue([], "object", body)]
    model_name = body.get("model")
    allowed = sorted(m for m, rule in MODELS.items() if endpoint in rule.endpoints)
    if model_name not in allowed:
        return [_value_issue(["model"], allowed)]
    rule = MODELS[model_name]
    issues: list[dict[str, Any]] = []
    unknown = sorted(set(body) - BASE_KEYS[endpoint] - rule.extra_keys)
    if unknown:
        keys = ", ".join(f'"{k}"' for k in unknown)
        issues.append(
            {
                "code": "unrecognized_keys",
                "keys": unknown,
                "path": [],
                "message": f"Unrecognized key{'s' if len(unknown) > 1 else ''}: {keys}",
            }
        )
    issues += _check_prompt(endpoint, rule, body.get("promptText"))
    ratio = body.get(rule.ratio_key)
    if (ratio is not None or endpoint != V2V) and ratio not in rule.ratios[endpoint]:
        issues.append(_value_issue([rule.ratio_key], list(rule.ratios[endpoint])))
    if endpoint != V2V:
        issues += _check_duration(rule, body.get("duration"))
    if endpoint == I2V:
        issues += _check_prompt_image(rule, body.get("promptImage"))
    if "outputFormat" in body and body["outputFormat"] not in OUTPUT_FORMATS:
        issues.append(_value_issue(["outputFormat"], list(OUTPUT_FORMATS)))
    if "seed" in body and (isinstance(body["seed"], bool) or not isinstance(body["seed"], int)):
        issues.append(_type_issue(["seed"], "number", body["seed"]))
    if endpoint == V2V and not isinstance(body.get("videoUri"), str):
        issues.append(_type_issue(["videoUri"], "string", body.get("videoUri")))
    return issues


def _check_prompt(endpoint: str, rule: ModelRule, text: Any) -> list[dict[str, Any]]:
    if text is None:
        required = endpoint in rule.prompt_required
        return [_type_issue(["promptText"], "string", None)] if required else []
    if not isinstance(text, str):
        return [_type_issue(["promptText"], "string", text)]
    if len(text.encode("utf-16-le")) // 2 > rule.prompt_max:
        return [
            {
                "code": "too_big",
                "maximum": rule.prompt_max,
                "origin": "string",
                "path": ["promptText"],
                "message": f"Too big: expected string to have <={rule.prompt_max} characters",
            }
        ]
    if not text.strip():
        return [
            {
                "code": "too_small",
                "minimum": 1,
                "origin": "string",
                "path": ["promptText"],
                "message": "Too small: expected string to have >=1 characters",
            }
        ]
    return []


def _check_duration(rule: ModelRule, duration: Any) -> list[dict[str, Any]]:
    if duration is None:
        return [_type_issue(["duration"], "number", None)] if rule.duration_required else []
    if isinstance(duration, bool) or not isinstance(duration, int):
        return [_type_issue(["duration"], "number", duration)]
    allowed = rule.durations
    contiguous = list(allowed) == list(range(allowed[0], allowed[-1] + 1)) and len(allowed) > 2
    if duration in allowed:
        return []
    if not contiguous:
        return [_value_issue(["duration"], list(allowed))]
    big = duration > allowed[-1]
    bound = allowed[-1] if big else allowed[0]
    return [
        {
            "code": "too_big" if big else "too_small",
            "maximum" if big else "minimum": bound,
            "origin": "number",
            "inclusive": True,
            "path": ["duration"],
            "message": f"Too {'big' if big else 'small'}: expected number to be "
            f"{'<=' if big else '>='}{bound}",
        }
    ]


def _check_prompt_image(rule: ModelRule, image: Any) -> list[dict[str, Any]]:
    if isinstance(image, str):
        return []
    if not isinstance(image, list) or not image:
        return [_type_issue(["promptImage"], "string | array", image)]
    issues: list[dict[str, Any]] = []
    positions = []
    for i, item in enumerate(image):
        if not isinstance(item, dict) or not isinstance(item.get("uri"), str):
            issues.append(_type_issue(["promptImage", i, "uri"], "string", item))
            continue
        position = item.get("position", "first")
        positions.append(position)
        if position not in rule.positions:
            issues.append(_value_issue(["promptImage", i, "position"], sorted(rule.positions)))
    if positions and "first" not in positions:
        issues.append(
            {
                "code": "custom",
                "path": ["promptImage"],
                "message": "A 'first' position image is required",
            }
        )
    return issues


def output_ratio(endpoint: str, body: dict[str, Any]) -> tuple[int, int]:
    """Pixel ratio of the output, as (w, h)."""
    rule = MODELS[body["model"]]
    raw = body.get(rule.ratio_key) or (rule.ratios[endpoint][0] if endpoint != V2V else "1280:720")
    w, h = str(raw).split(":")
    return int(w), int(h)


def duration_of(endpoint: str, body: dict[str, Any]) -> int:
    return int(body.get("duration") or MODELS[body["model"]].default_duration)


def format_surcharge(output_format: Any) -> int:
    """Extra credits per second of a non-mp4 `outputFormat` (0 when absent or unknown)."""
    return OUTPUT_FORMATS.get(output_format, 0) if isinstance(output_format, str) else 0


def media_uris(body: dict[str, Any]) -> list[str]:
    """Every media URI of a create body (``promptImage`` string or items, ``videoUri``)."""
    image = body.get("promptImage")
    uris = [image] if isinstance(image, str) else []
    if isinstance(image, list):
        uris += [i["uri"] for i in image if isinstance(i, dict) and isinstance(i.get("uri"), str)]
    if isinstance(body.get("videoUri"), str):
        uris.append(body["videoUri"])
    return uris
