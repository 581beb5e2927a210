"""The user's intent: `GenerationSpec` and its parts (design 9.4).

These are plain frozen dataclasses mirroring `vidroute.common.v1`; the gRPC boundary converts
protobuf messages into them (``vidroute_core.wire.spec``) and nothing below that boundary sees a
protobuf. Durations are whole milliseconds and money is integer micros: no floats travel through
the domain where a rounding error could cost money or flip a constraint.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field


class Mode(enum.Enum):
    """What kind of generation the user asks for."""

    TEXT_TO_VIDEO = "TEXT_TO_VIDEO"
    IMAGE_TO_VIDEO = "IMAGE_TO_VIDEO"
    FIRST_LAST_TO_VIDEO = "FIRST_LAST_TO_VIDEO"
    VIDEO_TO_VIDEO = "VIDEO_TO_VIDEO"
    EXTEND_VIDEO = "EXTEND_VIDEO"


class RoutingMode(enum.Enum):
    """How freely the scheduler may pick a provider (design 9.16.3)."""

    STRICT_MODEL = "STRICT_MODEL"
    PREFERRED = "PREFERRED"
    AUTO = "AUTO"


class ServiceClass(enum.Enum):
    """The first level of fair scheduling (design 9.12.1)."""

    INTERACTIVE = "INTERACTIVE"
    STANDARD = "STANDARD"
    BATCH = "BATCH"


class ContentCategory(enum.Enum):
    """What the clip shows (a quality bucket dimension, design 9.14); a closed vocabulary."""

    PEOPLE = "PEOPLE"
    ANIMALS = "ANIMALS"
    NATURE = "NATURE"
    URBAN = "URBAN"
    PRODUCT = "PRODUCT"
    FOOD = "FOOD"
    SPORTS = "SPORTS"
    TEXT_GRAPHICS = "TEXT_GRAPHICS"
    ABSTRACT = "ABSTRACT"
    OTHER = "OTHER"


class Style(enum.Enum):
    """How the clip looks (a quality bucket dimension, design 9.14); a closed vocabulary."""

    PHOTOREALISTIC = "PHOTOREALISTIC"
    CINEMATIC = "CINEMATIC"
    ANIME = "ANIME"
    CARTOON = "CARTOON"
    RENDER_3D = "RENDER_3D"
    PAINTERLY = "PAINTERLY"
    PIXEL_ART = "PIXEL_ART"
    OTHER = "OTHER"


class CameraMotion(enum.Enum):
    """How the camera moves (a quality bucket dimension, design 9.14); a closed vocabulary."""

    STATIC = "STATIC"
    PAN = "PAN"
    TILT = "TILT"
    ZOOM = "ZOOM"
    DOLLY = "DOLLY"
    ORBIT = "ORBIT"
    TRACKING = "TRACKING"
    HANDHELD = "HANDHELD"
    AERIAL = "AERIAL"
    OTHER = "OTHER"


@dataclass(frozen=True, slots=True)
class ContentTags:
    """The caller's optional description of the content (design 9.14): None means "not said".

    Tags never reach a provider; they only pick the quality bucket whose evidence routes the
    task, so a model good at anime and poor at people is judged per kind of clip."""

    category: ContentCategory | None = None
    style: Style | None = None
    has_human: bool | None = None
    camera_motion: CameraMotion | None = None


NO_TAGS = ContentTags()


@dataclass(frozen=True, slots=True)
class AssetRef:
    """An input media asset. `object_uri` may carry a signing query string; hashes ignore it."""

    object_uri: str
    mime_type: str = ""
    size_bytes: int = 0
    checksum_sha256: str = ""
    asset_id: str = ""


@dataclass(frozen=True, slots=True)
class OutputSpec:
    """What the delivered video must look like."""

    width: int
    height: int
    duration_ms: int
    fps: int = 24
    with_audio: bool = False
    sample_count: int = 1


@dataclass(frozen=True, slots=True)
class RoutingPolicy:
    """The user's routing constraints; `max_estimated_cost_micros == 0` means no budget cap."""

    mode: RoutingMode = RoutingMode.AUTO
    required_provider: str = ""
    required_model: str = ""
    preferred_providers: tuple[str, ...] = ()
    max_estimated_cost_micros: int = 0
    currency: str = "USD"
    max_queue_delay_ms: int = 0
    allow_semantic_degrade: bool = False
    region: str = ""


@dataclass(frozen=True, slots=True)
class GenerationSpec:
    """A whole generation request as the user expressed it (design 9.4)."""

    tenant_id: str
    prompt: str
    mode: Mode
    output: OutputSpec
    user_id: str = ""
    project_id: str = ""
    negative_prompt: str = ""
    first_frame: AssetRef | None = None
    last_frame: AssetRef | None = None
    source_video: AssetRef | None = None
    references: tuple[AssetRef, ...] = ()
    seed: int | None = None
    safety_profile: str = ""
    routing: RoutingPolicy = field(default_factory=RoutingPolicy)
    service_class: ServiceClass = ServiceClass.STANDARD
    priority: int = 0
    content: ContentTags = NO_TAGS

    @property
    def duration_seconds(self) -> float:
        """Duration in seconds, for display and constraint expressions only."""
        return self.output.duration_ms / 1000
