"""The provider-neutral half of compiling a spec (design 9.7): decide values, record each decision.

`resolve` walks the spec in proto field order against one `Capability` and settles every value
a provider request needs (mode, aspect ratio, resolution class, duration, audio, seed, ...),
recording a `Transformation` per decision:

* EXACT: same meaning, same form (prompt, seed, a supported duration).
* LOSSLESS: same meaning, other form (1920x1080 -> "16:9" + "1080p"; audio stripped later).
* DEGRADE: the model cannot fully honour it (7 s -> 8 s, no negative prompt, silent model).
  Recorded as DEGRADE only when ``routing.allow_semantic_degrade``; otherwise as REJECT whose
  detail starts with "DEGRADE not permitted", so the scheduler can explain the alternative.
* REJECT: no legal mapping (unsupported mode, last frame, aspect ratio, sample count).

Durations are chosen among the values that satisfy the entry's constraints given everything
else, so "1080p requires 8 s" turns 6 s into a DEGRADE to 8 s rather than an invalid request.
Each adapter's ``compile.py`` then only maps `Resolved` onto its wire format and calls `finish`,
which adds the cost estimate (price micros/s x seconds x samples) and the 9.7.3 request hash.
Everything here is deterministic: same spec + entry -> byte-identical plan.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from math import gcd
from typing import Any

from vidroute_core.adapter import CompiledPlan, Transformation, TransformationKind
from vidroute_core.capabilities.constraints import violations
from vidroute_core.capabilities.loader import Capability
from vidroute_core.hashing import canonical_json, normalize_asset_uri, request_hash
from vidroute_core.spec import AssetRef, GenerationSpec, Mode

#: Short side in pixels of each resolution class.
RESOLUTION_PX: Mapping[str, int] = {
    "480p": 480,
    "540p": 540,
    "720p": 720,
    "1080p": 1080,
    "1440p": 1440,
    "4k": 2160,
}
DEFAULT_FPS = 24
_K = TransformationKind


@dataclass(frozen=True, slots=True)
class Resolved:
    """The values a provider request is built from."""

    mode: Mode
    aspect_ratio: str  # "16:9"
    resolution: str  # "720p"
    duration_seconds: int
    generate_audio: bool
    sample_count: int
    seed: int | None
    negative_prompt: str

    def environment(self, spec: GenerationSpec) -> dict[str, str | int | bool]:
        """The constraint-language view of this request."""
        return constraint_env(
            spec,
            resolution=self.resolution,
            aspect_ratio=self.aspect_ratio,
            duration_seconds=self.duration_seconds,
            with_audio=self.generate_audio,
        )


def constraint_env(
    spec: GenerationSpec,
    *,
    resolution: str,
    aspect_ratio: str,
    duration_seconds: int,
    with_audio: bool,
) -> dict[str, str | int | bool]:
    """Identifier values for `vidroute_core.capabilities.constraints`."""
    return {
        "mode": spec.mode.value,
        "resolution": resolution,
        "aspect_ratio": aspect_ratio,
        "duration_seconds": duration_seconds,
        "with_audio": with_audio,
        "sample_count": spec.output.sample_count or 1,
        "has_last_frame": spec.last_frame is not None,
        "reference_count": len(spec.references),
        "has_negative_prompt": bool(spec.negative_prompt),
        "has_seed": spec.seed is not None,
    }


@dataclass
class Draft:
    """Transformations collected while compiling one spec for one entry."""

    spec: GenerationSpec
    capability: Capability
    items: list[Transformation] = field(default_factory=list)

    def add(self, field_path: str, kind: TransformationKind, detail: str) -> None:
        """Record a decision as is."""
        self.items.append(Transformation(field_path, kind, detail))

    def degrade(self, field_path: str, detail: str) -> None:
        """Record a DEGRADE, or a REJECT when the user did not allow semantic degradation."""
        if self.spec.routing.allow_semantic_degrade:
            self.add(field_path, _K.DEGRADE, detail)
        else:
            self.add(field_path, _K.REJECT, f"DEGRADE not permitted: {detail}")

    @property
    def submittable(self) -> bool:
        """No REJECT recorded (unpermitted DEGRADEs are recorded as REJECT)."""
        return all(t.kind is not _K.REJECT for t in self.items)


def aspect_label(width: int, height: int) -> str:
    """1920x1080 -> "16:9"."""
    d = gcd(width, height) or 1
    return f"{width // d}:{height // d}"


def _prompt_units(text: str) -> int:
    # Runway counts UTF-16 code units; counting them is never less than code points.
    return len(text.encode("utf-16-le")) // 2


def resolve(spec: GenerationSpec, cap: Capability) -> tuple[Resolved, Draft]:
    """Decide every request value for `cap` and record why (see the module docstring)."""
    draft = Draft(spec, cap)
    out = spec.output
    if cap.max_prompt_chars and _prompt_units(spec.prompt) > cap.max_prompt_chars:
        draft.add("prompt", _K.REJECT, f"longer than the model's {cap.max_prompt_chars} characters")
    else:
        draft.add("prompt", _K.EXACT, "prompt text")
    negative = ""
    if spec.negative_prompt:
        if cap.supports_negative_prompt:
            negative = spec.negative_prompt
            draft.add("negative_prompt", _K.EXACT, "negative prompt")
        else:
            draft.degrade("negative_prompt", "model has no negative prompt; dropped")
    _resolve_mode_and_inputs(spec, cap, draft)
    aspect, resolution = _resolve_size(out.width, out.height, cap, draft)
    generate_audio = _resolve_audio(out.with_audio, cap, draft)
    duration = _resolve_duration(
        spec, cap, draft, resolution=resolution, aspect=aspect, audio=generate_audio
    )
    fps = out.fps or DEFAULT_FPS
    if fps != DEFAULT_FPS:
        draft.degrade("output.fps", f"{fps} fps requested; the model renders {DEFAULT_FPS} fps")
    samples = out.sample_count or 1
    if samples > cap.max_sample_count:
        draft.add(
            "output.sample_count", _K.REJECT, f"{samples} videos; model max {cap.max_sample_count}"
        )
    seed: int | None = None
    if spec.seed is not None:
        if cap.supports_seed:
            seed = spec.seed
            draft.add("seed", _K.EXACT, f"seed {seed}")
        else:
            draft.degrade("seed", "model ignores seeds; result not reproducible")
    resolved = Resolved(
        spec.mode, aspect, resolution, duration, generate_audio, samples, seed, negative
    )
    for broken in violations(cap.constraints, resolved.environment(spec)):
        draft.add("constraints", _K.REJECT, broken.describe())
    return resolved, draft


def _resolve_mode_and_inputs(spec: GenerationSpec, cap: Capability, draft: Draft) -> None:
    if spec.mode not in cap.modes:
        supported = ", ".join(m.value for m in cap.modes)
        draft.add("mode", _K.REJECT, f"{spec.mode.value} not supported (model: {supported})")
    else:
        draft.add("mode", _K.EXACT, spec.mode.value)
    if spec.first_frame is not None:
        draft.add("first_frame", _K.EXACT, "first frame image")
    if spec.last_frame is not None:
        if cap.supports_last_frame:
            draft.add("last_frame", _K.EXACT, "last frame image")
        else:
            draft.add("last_frame", _K.REJECT, "model does not accept a last frame")
    if spec.source_video is not None:
        draft.add("source_video", _K.EXACT, "source video")
    if spec.references:
        n, limit = len(spec.references), cap.max_reference_images
        if n > limit:
            draft.add("references", _K.REJECT, f"{n} reference images; model accepts {limit}")
        else:
            draft.add("references", _K.EXACT, f"{n} reference images")


def _resolve_size(width: int, height: int, cap: Capability, draft: Draft) -> tuple[str, str]:
    path = "output.width,output.height"
    aspect = aspect_label(width, height)
    short = min(width, height)
    ranked = sorted(cap.resolutions, key=lambda r: RESOLUTION_PX.get(r, 0))
    fitting = [r for r in ranked if RESOLUTION_PX.get(r, 0) >= short]
    resolution = fitting[0] if fitting else ranked[-1]
    if aspect not in cap.aspect_ratios:
        draft.add(
            path,
            _K.REJECT,
            f"{width}x{height} is {aspect}; model offers {', '.join(cap.aspect_ratios)} "
            "(cropping is not equivalent)",
        )
    elif not fitting:
        draft.degrade(path, f"{width}x{height} exceeds the model's best {resolution}")
    else:
        draft.add(path, _K.LOSSLESS, f"{width}x{height} -> {aspect} {resolution}")
    return aspect, resolution


def _resolve_audio(with_audio: bool, cap: Capability, draft: Draft) -> bool:
    if with_audio and not cap.native_audio:
        draft.degrade("output.with_audio", "model is silent; no native audio")
        return False
    if with_audio:
        draft.add("output.with_audio", _K.EXACT, "native audio")
        return True
    if cap.native_audio and not cap.audio_optional:
        draft.add("output.with_audio", _K.LOSSLESS, "model always adds audio; stripped on delivery")
        return True
    draft.add("output.with_audio", _K.EXACT, "no audio")
    return False


def _resolve_duration(
    spec: GenerationSpec,
    cap: Capability,
    draft: Draft,
    *,
    resolution: str,
    aspect: str,
    audio: bool,
) -> int:
    path = "output.duration_ms"
    wanted_ms = spec.output.duration_ms

    def allowed(seconds: int) -> bool:
        env = constraint_env(
            spec,
            resolution=resolution,
            aspect_ratio=aspect,
            duration_seconds=seconds,
            with_audio=audio,
        )
        return not violations(cap.constraints, env)

    legal = [s for s in cap.durations_seconds if allowed(s)]
    offered = ", ".join(str(s) for s in cap.durations_seconds)
    if wanted_ms % 1000 == 0 and wanted_ms // 1000 in legal:
        draft.add(path, _K.EXACT, f"{wanted_ms // 1000} s")
        return wanted_ms // 1000
    if not legal:
        draft.add(path, _K.REJECT, f"no duration of {offered} s satisfies the model's constraints")
        return cap.durations_seconds[-1]
    # Nearest legal value; on a tie the longer one (trimming later is possible, stretching isn't).
    chosen = min(legal, key=lambda s: (abs(s * 1000 - wanted_ms), -s))
    why = f"model supports {offered}"
    if wanted_ms % 1000 == 0 and wanted_ms // 1000 in cap.durations_seconds:
        env = constraint_env(
            spec,
            resolution=resolution,
            aspect_ratio=aspect,
            duration_seconds=wanted_ms // 1000,
            with_audio=audio,
        )
        why = "; ".join(c.describe() for c in violations(cap.constraints, env))
    draft.degrade(path, f"{wanted_ms} ms -> {chosen} s ({why})")
    return chosen


def _assets(spec: GenerationSpec) -> dict[str, AssetRef]:
    found: dict[str, AssetRef] = {}
    for name in ("first_frame", "last_frame", "source_video"):
        asset = getattr(spec, name)
        if asset is not None:
            found[name] = asset
    for i, ref in enumerate(spec.references):
        found[f"references[{i}]"] = ref
    return found


def _unsigned(value: Any) -> Any:
    """`value` with every https URL stripped of its signature (hashing only, 9.7.3)."""
    if isinstance(value, str) and value.startswith("https://"):
        return normalize_asset_uri(value)
    if isinstance(value, Mapping):
        return {k: _unsigned(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_unsigned(v) for v in value]
    return value


def finish(
    draft: Draft,
    resolved: Resolved,
    *,
    endpoint: str,
    native_request: Mapping[str, Any] | None,
) -> CompiledPlan:
    """Build the `CompiledPlan`: canonical native JSON, cost estimate and request hash.

    A plan that is not submittable carries no native request and no hash: it cannot be sent.
    """
    spec, cap = draft.spec, draft.capability
    com = cap.commercial
    cost = (
        com.micros_per_second(resolved.generate_audio)
        * resolved.duration_seconds
        * resolved.sample_count
    )
    transformations = tuple(draft.items)
    submittable = draft.submittable and native_request is not None
    body: Mapping[str, Any] | None = native_request if submittable else None
    native_json = canonical_json(body).decode("utf-8") if body is not None else ""
    digest = ""
    if body is not None:
        digest = request_hash(
            spec,
            provider=cap.provider,
            model=cap.model,
            model_version=cap.model_version,
            capability_version=cap.capability_version,
            compile_plan={
                "endpoint": endpoint,
                "native_request": _unsigned(body),
                "transformations": [[t.field, t.kind.value, t.detail] for t in transformations],
            },
            asset_checksums={
                path: asset.checksum_sha256
                for path, asset in _assets(spec).items()
                if asset.checksum_sha256
            },
        )
    return CompiledPlan(
        provider=cap.provider,
        account=cap.account,
        model=cap.model,
        model_version=cap.model_version,
        capability_version=cap.capability_version,
        price_version=com.price_version,
        endpoint=endpoint,
        native_request=body,
        native_request_json=native_json,
        request_hash=digest,
        transformations=transformations,
        estimated_cost_micros=cost,
        currency=com.currency,
        submittable=submittable,
    )


def asset_uri(asset: AssetRef | None) -> str | None:
    """The asset's URI as the provider should fetch it (None when absent)."""
    return asset.object_uri if asset is not None else None
