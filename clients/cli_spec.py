"""A CreateTaskRequest from `vidroute submit`'s flags and an optional ``--spec FILE``.

The file is YAML or JSON in the proto JSON shape: a ``GenerationSpec`` (``tenant_id``,
``prompt``, ``output: {width: ...}``; camelCase works too), or a whole ``CreateTaskRequest``
(``spec``, ``idempotency_key``, ``webhook``). Flags override the file field by field; defaults
(text-to-video, 1280x720, 4 s) fill only what neither names. Assets are ``URI`` or
``URI#mime/type``; without a fragment the MIME type is guessed from the path's extension.

Only what the server could never see is checked here (a negative width does not fit the proto's
uint32); every other rule is the server's, which answers with one field violation per problem.
No I/O besides reading the named file.
"""

from __future__ import annotations

import json
import mimetypes
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import TypeVar
from urllib.parse import urlsplit

import yaml
from google.protobuf import json_format

from vidroute.common.v1 import generation_pb2, money_pb2
from vidroute.scheduler.v1 import scheduler_service_pb2


class SpecError(ValueError):
    """A flag or spec file the CLI cannot turn into a request (a usage error, exit code 2)."""


V = TypeVar("V", bound=int)  # an enum's ValueType, so the table's numbers assign to its fields


def _choices(items: Sequence[tuple[str, V]], prefix: str) -> dict[str, V]:
    """``MODE_IMAGE_TO_VIDEO`` -> ``image-to-video``: the CLI spelling of each enum value."""
    return {
        name.removeprefix(prefix).lower().replace("_", "-"): number
        for name, number in items
        if not name.endswith("_UNSPECIFIED")
    }


MODES = _choices(generation_pb2.Mode.items(), "MODE_")
ROUTING_MODES = _choices(generation_pb2.RoutingMode.items(), "ROUTING_MODE_")
SERVICE_CLASSES = _choices(generation_pb2.ServiceClass.items(), "SERVICE_CLASS_")
CATEGORIES = _choices(generation_pb2.ContentCategory.items(), "CONTENT_CATEGORY_")
STYLES = _choices(generation_pb2.Style.items(), "STYLE_")
CAMERA_MOTIONS = _choices(generation_pb2.CameraMotion.items(), "CAMERA_MOTION_")
DEFAULT_MODE, DEFAULT_WIDTH, DEFAULT_HEIGHT, DEFAULT_DURATION_MS = "text-to-video", 1280, 720, 4000
MICROS = Decimal(1_000_000)


@dataclass
class SubmitFlags:
    """Every `submit` flag; None (or empty) means "not given": the file or the default wins."""

    spec_file: Path | None = None
    tenant: str | None = None
    user: str | None = None
    project: str | None = None
    prompt: str | None = None
    negative_prompt: str | None = None
    mode: str | None = None
    width: int | None = None
    height: int | None = None
    duration_s: float | None = None
    fps: int | None = None
    audio: bool | None = None
    samples: int | None = None
    seed: int | None = None
    safety_profile: str | None = None
    routing: str | None = None
    provider: str | None = None
    model: str | None = None
    prefer: Sequence[str] = ()
    max_cost: str | None = None
    max_queue_delay_s: float | None = None
    region: str | None = None
    degrade: bool | None = None
    service_class: str | None = None
    priority: int | None = None
    category: str | None = None
    style: str | None = None
    has_human: bool | None = None
    camera_motion: str | None = None
    idempotency_key: str | None = None
    webhook_url: str | None = None
    webhook_events: Sequence[str] = ()
    first_frame: str | None = None
    last_frame: str | None = None
    source_video: str | None = None
    references: Sequence[str] = field(default_factory=tuple)


def asset(text: str) -> generation_pb2.AssetRef:
    """``URI`` or ``URI#mime/type`` as an AssetRef; the MIME type from the extension if unsaid."""
    uri, _, mime = text.partition("#")
    if not uri:
        raise SpecError(f"asset {text!r}: a URI is needed (https://..., s3://..., asset://...)")
    if not mime:
        mime = mimetypes.guess_type(urlsplit(uri).path)[0] or ""
    return generation_pb2.AssetRef(object_uri=uri, mime_type=mime)


def money(text: str) -> money_pb2.Money:
    """``0.50``, ``0.50USD`` or ``0.5 EUR`` as exact integer micros (no float on the way)."""
    amount = text.strip().rstrip("ABCDEFGHIJKLMNOPQRSTUVWXYZ").strip()
    currency = text.strip()[len(amount) :].strip() or "USD"
    try:
        micros = Decimal(amount) * MICROS
    except InvalidOperation:
        raise SpecError(f"--max-cost {text!r}: an amount like 0.50 or 0.50USD") from None
    if micros != micros.to_integral_value():
        raise SpecError(f"--max-cost {text!r}: at most six decimal places")
    return money_pb2.Money(amount_micros=int(micros), currency_code=currency)


def _seconds_ms(flag: str, seconds: float) -> int:
    ms = round(Decimal(str(seconds)) * 1000)
    if not 0 <= ms < 2**32:
        raise SpecError(f"{flag} {seconds:g}: must be between 0 and {(2**32 - 1) // 1000} s")
    return int(ms)


def load_file(path: Path) -> scheduler_service_pb2.CreateTaskRequest:
    """A spec file (YAML or JSON; a GenerationSpec or a CreateTaskRequest) as a request."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise SpecError(f"--spec {path}: {exc.strerror or exc}") from None
    try:
        doc = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except (ValueError, yaml.YAMLError) as exc:
        kind = "JSON" if path.suffix == ".json" else "YAML"
        raise SpecError(f"--spec {path}: not valid {kind}: {_one_line(exc)}") from None
    if not isinstance(doc, Mapping):
        raise SpecError(f"--spec {path}: the document must be a mapping of spec fields")
    whole = "spec" in doc or "idempotency_key" in doc or "idempotencyKey" in doc
    request = scheduler_service_pb2.CreateTaskRequest()
    try:
        if whole:
            json_format.ParseDict(dict(doc), request)
        else:
            json_format.ParseDict(dict(doc), request.spec)
    except json_format.ParseError as exc:
        raise SpecError(f"--spec {path}: {_one_line(exc)}") from None
    return request


def _one_line(exc: Exception) -> str:
    """A parser's complaint as one line: YAML's problem and where (1-based line:column), the
    first line of anything else (protobuf's list of every field name follows on the next)."""
    if isinstance(exc, yaml.MarkedYAMLError) and exc.problem:
        mark = exc.problem_mark
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        return f"{exc.problem}{where}"
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


def build_request(flags: SubmitFlags) -> scheduler_service_pb2.CreateTaskRequest:
    """The request `flags` describe: the file's (if any), each given flag on top, then defaults.

    The idempotency key stays empty when neither names one: the SDK generates it.
    """
    request = (
        load_file(flags.spec_file) if flags.spec_file else scheduler_service_pb2.CreateTaskRequest()
    )
    spec = request.spec
    for name, value in (
        ("tenant_id", flags.tenant),
        ("user_id", flags.user),
        ("project_id", flags.project),
        ("prompt", flags.prompt),
        ("negative_prompt", flags.negative_prompt),
        ("safety_profile", flags.safety_profile),
    ):
        if value is not None:
            setattr(spec, name, value)
    if flags.mode is not None:
        spec.mode = MODES[flags.mode]
    elif spec.mode == generation_pb2.MODE_UNSPECIFIED:
        spec.mode = MODES[DEFAULT_MODE]
    if flags.service_class is not None:
        spec.service_class = SERVICE_CLASSES[flags.service_class]
    if flags.priority is not None:
        spec.priority = flags.priority
    if flags.seed is not None:
        spec.seed = flags.seed
    _content(spec.content, flags)
    _output(spec.output, flags)
    _routing(spec.routing, flags)
    _assets(spec, flags)
    if flags.idempotency_key is not None:
        request.idempotency_key = flags.idempotency_key
    if flags.webhook_url is not None:
        request.webhook.url = flags.webhook_url
    if flags.webhook_events:
        request.webhook.events[:] = list(flags.webhook_events)
    return request


def _content(tags: generation_pb2.ContentTags, flags: SubmitFlags) -> None:
    if flags.category is not None:
        tags.category = CATEGORIES[flags.category]
    if flags.style is not None:
        tags.style = STYLES[flags.style]
    if flags.has_human is not None:
        tags.has_human = flags.has_human
    if flags.camera_motion is not None:
        tags.camera_motion = CAMERA_MOTIONS[flags.camera_motion]


def _output(out: generation_pb2.OutputSpec, flags: SubmitFlags) -> None:
    if flags.width is not None:
        out.width = flags.width
    if flags.height is not None:
        out.height = flags.height
    if flags.duration_s is not None:
        out.duration_ms = _seconds_ms("--duration", flags.duration_s)
    if flags.fps is not None:
        out.fps = flags.fps
    if flags.audio is not None:
        out.with_audio = flags.audio
    if flags.samples is not None:
        out.sample_count = flags.samples
    if not out.width and not out.height:
        out.width, out.height = DEFAULT_WIDTH, DEFAULT_HEIGHT
    if not out.duration_ms:
        out.duration_ms = DEFAULT_DURATION_MS


def _routing(routing: generation_pb2.RoutingPolicy, flags: SubmitFlags) -> None:
    if flags.provider is not None:
        routing.required_provider = flags.provider
    if flags.model is not None:
        routing.required_model = flags.model
    if flags.prefer:
        routing.preferred_providers[:] = list(flags.prefer)
    if flags.max_cost is not None:
        routing.max_estimated_cost.CopyFrom(money(flags.max_cost))
    if flags.max_queue_delay_s is not None:
        routing.max_queue_delay_ms = _seconds_ms("--max-queue-delay", flags.max_queue_delay_s)
    if flags.region is not None:
        routing.region = flags.region
    if flags.degrade is not None:
        routing.allow_semantic_degrade = flags.degrade
    if flags.routing is not None:
        routing.mode = ROUTING_MODES[flags.routing]
    elif routing.mode == generation_pb2.ROUTING_MODE_UNSPECIFIED:
        # A named model pins it; named preferences prefer; otherwise the platform chooses.
        if flags.model is not None:
            routing.mode = generation_pb2.ROUTING_MODE_STRICT_MODEL
        elif flags.prefer:
            routing.mode = generation_pb2.ROUTING_MODE_PREFERRED


def _assets(spec: generation_pb2.GenerationSpec, flags: SubmitFlags) -> None:
    for slot, text in (
        ("first_frame", flags.first_frame),
        ("last_frame", flags.last_frame),
        ("source_video", flags.source_video),
    ):
        if text is not None:
            getattr(spec, slot).CopyFrom(asset(text))
    if flags.references:
        del spec.references[:]
        spec.references.extend(asset(text) for text in flags.references)
