"""Protobuf <-> domain translation for the scheduler API.

The only module that knows both `vidroute.*_pb2` messages and domain dataclasses for specs.
Decoding never raises on bad values: what the domain types cannot represent (an unset enum, a
missing output block) becomes a field violation, merged with the domain's own validation so the
caller gets every problem at once.
"""

from __future__ import annotations

import enum
from typing import TypeVar

from vidroute.common.v1 import generation_pb2 as gen_pb
from vidroute.common.v1 import money_pb2
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
from vidroute_core.validation import FieldViolation, validate_spec

E = TypeVar("E", bound=enum.Enum)

_FRAME_FIELDS = ("first_frame", "last_frame", "source_video")


def proto_enum_to_domain(
    value: int, enum_type: type[E], descriptor_name: str, prefix: str
) -> E | None:
    """Map a proto enum number to the domain enum of the same suffix; None if unset/unknown."""
    descriptor = gen_pb.DESCRIPTOR.enum_types_by_name[descriptor_name]
    by_number = descriptor.values_by_number.get(value)
    if by_number is None or value == 0:
        return None
    return enum_type(by_number.name.removeprefix(prefix))


def domain_enum_to_proto(value: enum.Enum, prefix: str) -> str:
    """The proto enum value name of a domain enum (e.g. MODE_TEXT_TO_VIDEO)."""
    return f"{prefix}{value.value}"


def _asset(msg: gen_pb.AssetRef, present: bool) -> AssetRef | None:
    if not present:
        return None
    return AssetRef(
        object_uri=msg.object_uri,
        mime_type=msg.mime_type,
        size_bytes=msg.size_bytes,
        checksum_sha256=msg.checksum_sha256,
        asset_id=msg.asset_id,
    )


# The content tags: (field, proto enum, domain enum, value prefix).
_TAG_ENUMS: tuple[tuple[str, str, type[enum.Enum], str], ...] = (
    ("category", "ContentCategory", ContentCategory, "CONTENT_CATEGORY_"),
    ("style", "Style", Style, "STYLE_"),
    ("camera_motion", "CameraMotion", CameraMotion, "CAMERA_MOTION_"),
)


def _content(msg: gen_pb.ContentTags, violations: list[FieldViolation]) -> ContentTags:
    """The tags of a spec; a number outside a tag's vocabulary is a violation (proto3 enums
    are open on the wire, so a client built from another schema can send one)."""
    values: dict[str, enum.Enum | None] = {}
    for name, descriptor, domain, prefix in _TAG_ENUMS:
        number = getattr(msg, name)
        value = proto_enum_to_domain(number, domain, descriptor, prefix)
        if value is None and number != 0:
            names = ", ".join(m.name for m in domain)
            violations.append(
                FieldViolation(f"content.{name}", f"unknown value {number}; one of {names}")
            )
        values[name] = value
    category, style, camera = values["category"], values["style"], values["camera_motion"]
    tags = ContentTags(
        category=category if isinstance(category, ContentCategory) else None,
        style=style if isinstance(style, Style) else None,
        has_human=msg.has_human if msg.HasField("has_human") else None,
        camera_motion=camera if isinstance(camera, CameraMotion) else None,
    )
    return NO_TAGS if tags == NO_TAGS else tags


def _content_to_proto(tags: ContentTags) -> gen_pb.ContentTags | None:
    if tags == NO_TAGS:
        return None
    msg = gen_pb.ContentTags()
    for name, _, _, prefix in _TAG_ENUMS:
        value = getattr(tags, name)
        if value is not None:
            setattr(msg, name, f"{prefix}{value.value}")
    if tags.has_human is not None:
        msg.has_human = tags.has_human
    return msg


def spec_from_proto(msg: gen_pb.GenerationSpec) -> tuple[GenerationSpec, list[FieldViolation]]:
    """Decode and validate a spec; the spec is meaningful only when the list is empty."""
    violations: list[FieldViolation] = []
    mode = proto_enum_to_domain(msg.mode, Mode, "Mode", "MODE_")
    if mode is None:
        violations.append(FieldViolation("mode", "must be one of the Mode values, not unspecified"))
    if not msg.HasField("output"):
        violations.append(FieldViolation("output", "is required"))
    routing_mode = (
        proto_enum_to_domain(msg.routing.mode, RoutingMode, "RoutingMode", "ROUTING_MODE_")
        or RoutingMode.AUTO
    )
    service_class = (
        proto_enum_to_domain(msg.service_class, ServiceClass, "ServiceClass", "SERVICE_CLASS_")
        or ServiceClass.STANDARD
    )
    budget = msg.routing.max_estimated_cost
    spec = GenerationSpec(
        tenant_id=msg.tenant_id,
        user_id=msg.user_id,
        project_id=msg.project_id,
        prompt=msg.prompt,
        negative_prompt=msg.negative_prompt,
        mode=mode or Mode.TEXT_TO_VIDEO,
        first_frame=_asset(msg.first_frame, msg.HasField("first_frame")),
        last_frame=_asset(msg.last_frame, msg.HasField("last_frame")),
        source_video=_asset(msg.source_video, msg.HasField("source_video")),
        references=tuple(a for a in (_asset(r, True) for r in msg.references) if a is not None),
        output=OutputSpec(
            width=msg.output.width,
            height=msg.output.height,
            duration_ms=msg.output.duration_ms,
            fps=msg.output.fps or 24,
            with_audio=msg.output.with_audio,
            sample_count=msg.output.sample_count or 1,
        ),
        seed=msg.seed if msg.HasField("seed") else None,
        safety_profile=msg.safety_profile,
        routing=RoutingPolicy(
            mode=routing_mode,
            required_provider=msg.routing.required_provider,
            required_model=msg.routing.required_model,
            preferred_providers=tuple(msg.routing.preferred_providers),
            max_estimated_cost_micros=budget.amount_micros,
            currency=budget.currency_code or "USD",
            max_queue_delay_ms=msg.routing.max_queue_delay_ms,
            allow_semantic_degrade=msg.routing.allow_semantic_degrade,
            region=msg.routing.region,
        ),
        service_class=service_class,
        priority=msg.priority,
        content=_content(msg.content, violations),
    )
    domain_violations = validate_spec(spec)
    if mode is None:
        # With no mode, mode/input mismatches are noise: the mode violation says it all.
        domain_violations = [
            v for v in domain_violations if v.field.split(".")[0] not in _FRAME_FIELDS
        ]
    if not msg.HasField("output"):
        domain_violations = [v for v in domain_violations if not v.field.startswith("output.")]
    return spec, violations + domain_violations


def _asset_to_proto(asset: AssetRef | None) -> gen_pb.AssetRef | None:
    if asset is None:
        return None
    return gen_pb.AssetRef(
        asset_id=asset.asset_id,
        object_uri=asset.object_uri,
        mime_type=asset.mime_type,
        size_bytes=asset.size_bytes,
        checksum_sha256=asset.checksum_sha256,
    )


def spec_to_proto(spec: GenerationSpec) -> gen_pb.GenerationSpec:
    """Encode a domain spec as the wire message."""
    routing = spec.routing
    msg = gen_pb.GenerationSpec(
        tenant_id=spec.tenant_id,
        user_id=spec.user_id,
        project_id=spec.project_id,
        prompt=spec.prompt,
        negative_prompt=spec.negative_prompt,
        mode=gen_pb.Mode.Value(domain_enum_to_proto(spec.mode, "MODE_")),
        first_frame=_asset_to_proto(spec.first_frame),
        last_frame=_asset_to_proto(spec.last_frame),
        source_video=_asset_to_proto(spec.source_video),
        references=[a for a in (_asset_to_proto(r) for r in spec.references) if a is not None],
        output=gen_pb.OutputSpec(
            width=spec.output.width,
            height=spec.output.height,
            duration_ms=spec.output.duration_ms,
            fps=spec.output.fps,
            with_audio=spec.output.with_audio,
            sample_count=spec.output.sample_count,
        ),
        safety_profile=spec.safety_profile,
        routing=gen_pb.RoutingPolicy(
            mode=gen_pb.RoutingMode.Value(domain_enum_to_proto(routing.mode, "ROUTING_MODE_")),
            required_provider=routing.required_provider,
            required_model=routing.required_model,
            preferred_providers=list(routing.preferred_providers),
            max_estimated_cost=money_pb2.Money(
                amount_micros=routing.max_estimated_cost_micros,
                currency_code=routing.currency,
            ),
            max_queue_delay_ms=routing.max_queue_delay_ms,
            allow_semantic_degrade=routing.allow_semantic_degrade,
            region=routing.region,
        ),
        service_class=gen_pb.ServiceClass.Value(
            domain_enum_to_proto(spec.service_class, "SERVICE_CLASS_")
        ),
        priority=spec.priority,
        content=_content_to_proto(spec.content),
    )
    if spec.seed is not None:
        msg.seed = spec.seed
    return msg
