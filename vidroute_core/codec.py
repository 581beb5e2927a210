"""Plain-JSON encoding of a `GenerationSpec`, for storage and for hashing.

The encoding is total and reversible: ``spec_from_dict(spec_to_dict(s)) == s``. Enums become their
string values and tuples become lists, so the result is safe for JSON columns on PostgreSQL and
SQLite alike.
"""

from __future__ import annotations

from typing import Any

from vidroute_core.spec import (
    NO_TAGS,
    AssetRef,
    CameraMotion,
    ContentCategory,
    ContentTags,
    GenerationSpec,
    Mode,
    OutputSpec,
    RoutingMode,
    RoutingPolicy,
    ServiceClass,
    Style,
)


def _asset_to_dict(asset: AssetRef | None) -> dict[str, Any] | None:
    if asset is None:
        return None
    return {
        "object_uri": asset.object_uri,
        "mime_type": asset.mime_type,
        "size_bytes": asset.size_bytes,
        "checksum_sha256": asset.checksum_sha256,
        "asset_id": asset.asset_id,
    }


def _asset_from_dict(data: dict[str, Any] | None) -> AssetRef | None:
    if data is None:
        return None
    return AssetRef(
        object_uri=data["object_uri"],
        mime_type=data.get("mime_type", ""),
        size_bytes=int(data.get("size_bytes", 0)),
        checksum_sha256=data.get("checksum_sha256", ""),
        asset_id=data.get("asset_id", ""),
    )


def content_to_dict(tags: ContentTags) -> dict[str, Any]:
    """The content tags, every tag present: an enum's value, a bool, or None (not said)."""
    return {
        "category": None if tags.category is None else tags.category.value,
        "style": None if tags.style is None else tags.style.value,
        "has_human": tags.has_human,
        "camera_motion": None if tags.camera_motion is None else tags.camera_motion.value,
    }


def content_from_dict(data: dict[str, Any] | None) -> ContentTags:
    """Decode `content_to_dict`; a spec stored before tags existed has none (`NO_TAGS`)."""
    if not data:
        return NO_TAGS
    category, style, camera = data.get("category"), data.get("style"), data.get("camera_motion")
    human = data.get("has_human")
    tags = ContentTags(
        category=None if category is None else ContentCategory(category),
        style=None if style is None else Style(style),
        has_human=None if human is None else bool(human),
        camera_motion=None if camera is None else CameraMotion(camera),
    )
    return NO_TAGS if tags == NO_TAGS else tags


def spec_to_dict(spec: GenerationSpec) -> dict[str, Any]:
    """Encode a spec as JSON-ready primitives, every field present."""
    out = spec.output
    routing = spec.routing
    return {
        "tenant_id": spec.tenant_id,
        "user_id": spec.user_id,
        "project_id": spec.project_id,
        "prompt": spec.prompt,
        "negative_prompt": spec.negative_prompt,
        "mode": spec.mode.value,
        "first_frame": _asset_to_dict(spec.first_frame),
        "last_frame": _asset_to_dict(spec.last_frame),
        "source_video": _asset_to_dict(spec.source_video),
        "references": [_asset_to_dict(r) for r in spec.references],
        "output": {
            "width": out.width,
            "height": out.height,
            "duration_ms": out.duration_ms,
            "fps": out.fps,
            "with_audio": out.with_audio,
            "sample_count": out.sample_count,
        },
        "seed": spec.seed,
        "safety_profile": spec.safety_profile,
        "routing": {
            "mode": routing.mode.value,
            "required_provider": routing.required_provider,
            "required_model": routing.required_model,
            "preferred_providers": list(routing.preferred_providers),
            "max_estimated_cost_micros": routing.max_estimated_cost_micros,
            "currency": routing.currency,
            "max_queue_delay_ms": routing.max_queue_delay_ms,
            "allow_semantic_degrade": routing.allow_semantic_degrade,
            "region": routing.region,
        },
        "service_class": spec.service_class.value,
        "priority": spec.priority,
        "content": content_to_dict(spec.content),
    }


def spec_from_dict(data: dict[str, Any]) -> GenerationSpec:
    """Decode what `spec_to_dict` produced; optional fields and `routing` may be left out."""
    out = data["output"]
    routing = data.get("routing") or {}
    return GenerationSpec(
        tenant_id=data["tenant_id"],
        user_id=data.get("user_id", ""),
        project_id=data.get("project_id", ""),
        prompt=data["prompt"],
        negative_prompt=data.get("negative_prompt", ""),
        mode=Mode(data["mode"]),
        first_frame=_asset_from_dict(data.get("first_frame")),
        last_frame=_asset_from_dict(data.get("last_frame")),
        source_video=_asset_from_dict(data.get("source_video")),
        references=tuple(
            a for a in (_asset_from_dict(r) for r in data.get("references", [])) if a is not None
        ),
        output=OutputSpec(
            width=int(out["width"]),
            height=int(out["height"]),
            duration_ms=int(out["duration_ms"]),
            fps=int(out.get("fps", 24)),
            with_audio=bool(out.get("with_audio", False)),
            sample_count=int(out.get("sample_count", 1)),
        ),
        seed=data.get("seed"),
        safety_profile=data.get("safety_profile", ""),
        routing=RoutingPolicy(
            mode=RoutingMode(routing.get("mode", "AUTO")),
            required_provider=routing.get("required_provider", ""),
            required_model=routing.get("required_model", ""),
            preferred_providers=tuple(routing.get("preferred_providers", ())),
            max_estimated_cost_micros=int(routing.get("max_estimated_cost_micros", 0)),
            currency=routing.get("currency", "USD"),
            max_queue_delay_ms=int(routing.get("max_queue_delay_ms", 0)),
            allow_semantic_degrade=bool(routing.get("allow_semantic_degrade", False)),
            region=routing.get("region", ""),
        ),
        service_class=ServiceClass(data.get("service_class", "STANDARD")),
        priority=int(data.get("priority", 0)),
        content=content_from_dict(data.get("content")),
    )
