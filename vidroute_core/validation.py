"""Rules a `GenerationSpec` must satisfy before it is stored or scheduled (design 9.4).

`validate_spec` reports *every* broken rule, not just the first, in proto field order, so a client
fixes a request in one round trip. Each `FieldViolation.field` is the snake_case path of the field
in ``vidroute.common.v1.GenerationSpec`` (``output.duration_ms``, ``references[2].checksum_sha256``,
``routing.max_estimated_cost.amount_micros``), which the gRPC boundary copies one-to-one into
``google.rpc.BadRequest``.

These are platform rules only. Whether a particular model supports a resolution or duration is the
capability matrix's business (9.6); the limits below merely reject what no model could serve.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit

from vidroute_core.exceptions import InvalidSpec
from vidroute_core.spec import AssetRef, GenerationSpec, Mode, RoutingMode, ServiceClass

# Prompt lengths count Unicode code points after NFC; the largest provider limits are about 4k.
MAX_PROMPT_CHARS = 4000
MAX_NEGATIVE_PROMPT_CHARS = 2000
# Ten minutes: today's models produce seconds to a couple of minutes; more is a unit mistake.
MAX_DURATION_MS = 600_000
# 8K UHD in either orientation: the long side at most 7680 px, the short side at most 4320 px.
MAX_LONG_SIDE_PX = 7680
MAX_SHORT_SIDE_PX = 4320
MIN_FPS, MAX_FPS = 1, 120
MIN_SAMPLE_COUNT, MAX_SAMPLE_COUNT = 1, 4
MAX_REFERENCES = 8
# Far more providers than any deployment has; a longer list is a client bug, not a preference.
MAX_PREFERRED_PROVIDERS = 16
MIN_PRIORITY, MAX_PRIORITY = -100, 100
# Seeds travel as uint32: the narrowest seed type among providers, so any valid seed fits all.
MAX_SEED = 2**32 - 1
# Pre-signed URLs with long policies run to a few KiB.
MAX_ASSET_URI_CHARS = 8192
# As in the proto: https for fetchable objects, s3/gs for buckets the platform reads with its own
# credentials, asset:// for assets already in platform storage. Never http (plaintext leaks
# signatures) or file (a user must not make the control plane read its own disk).
ASSET_URI_SCHEMES = frozenset({"https", "s3", "gs", "asset"})

# Identifiers end up in Redis keys (``lease:{provider}:...``), metric labels and URLs, so they are
# ASCII, start alphanumeric and exclude ``:``, ``{}``, ``/`` and whitespace.
IDENTIFIER_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
# Model names may carry a path-like prefix ("models/veo-3.0-generate-001").
MODEL_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_./-]{0,127}")
_SHA256_HEX = re.compile(r"[0-9a-f]{64}")  # lower-case, as the proto documents
_CURRENCY = re.compile(r"[A-Z]{3}")
_MIME_TYPE = re.compile(r"[a-z]+/[A-Za-z0-9.+_-]+")
# C0/C1 controls other than tab and newlines, and lone surrogates (not encodable as UTF-8, and
# PostgreSQL text rejects NUL outright).
_ALLOWED_CONTROLS = frozenset("\t\n\r")

# Which single-asset inputs each mode requires; every other slot must be empty, so an input the
# mode would ignore is reported instead of being silently dropped. References fit every mode.
_FRAME_SLOTS = ("first_frame", "last_frame", "source_video")
MODE_INPUTS: Mapping[Mode, frozenset[str]] = {
    Mode.TEXT_TO_VIDEO: frozenset(),
    Mode.IMAGE_TO_VIDEO: frozenset({"first_frame"}),
    Mode.FIRST_LAST_TO_VIDEO: frozenset({"first_frame", "last_frame"}),
    Mode.VIDEO_TO_VIDEO: frozenset({"source_video"}),
    Mode.EXTEND_VIDEO: frozenset({"source_video"}),
}
# MIME type families accepted in each asset slot, when the client states a MIME type.
_SLOT_MEDIA = {
    "first_frame": ("image/",),
    "last_frame": ("image/",),
    "source_video": ("video/",),
    "references": ("image/",),  # the proto defines references as images
}


@dataclass(frozen=True, slots=True)
class FieldViolation:
    """One broken rule: the proto field path and a sentence a client developer can act on."""

    field: str
    description: str


def validate_spec(spec: GenerationSpec) -> list[FieldViolation]:
    """Every rule `spec` breaks, in proto field order; empty when the spec is valid."""
    return [FieldViolation(f, d) for f, d in _violations(spec)]


def ensure_valid(spec: GenerationSpec) -> None:
    """Raise `InvalidSpec` listing every violation, or return if the spec is valid."""
    violations = validate_spec(spec)
    if violations:
        raise InvalidSpec(violations)


_Found = Iterator[tuple[str, str]]


def _violations(spec: GenerationSpec) -> _Found:
    if not spec.tenant_id:
        yield "tenant_id", "required"
    else:
        yield from _identifier("tenant_id", spec.tenant_id)
    yield from _identifier("user_id", spec.user_id)
    yield from _identifier("project_id", spec.project_id)
    if not spec.prompt.strip():
        yield "prompt", "required and must not be blank"
    yield from _text("prompt", spec.prompt, MAX_PROMPT_CHARS)
    yield from _text("negative_prompt", spec.negative_prompt, MAX_NEGATIVE_PROMPT_CHARS)
    yield from _mode_inputs(spec)
    # Oversize repeated fields: one violation for the count, and only the first items checked,
    # so 10,000 bad references cost one line in the BadRequest, not 10,000.
    if len(spec.references) > MAX_REFERENCES:
        yield "references", f"at most {MAX_REFERENCES} references"
    for i, ref in enumerate(spec.references[:MAX_REFERENCES]):
        yield from _asset(f"references[{i}]", ref, _SLOT_MEDIA["references"])
    yield from _output(spec)
    if spec.seed is not None and not 0 <= spec.seed <= MAX_SEED:
        yield "seed", f"must be within 0..{MAX_SEED} (uint32)"
    yield from _identifier("safety_profile", spec.safety_profile)
    yield from _routing(spec)
    if not isinstance(spec.service_class, ServiceClass):
        yield "service_class", "must be specified"
    if not MIN_PRIORITY <= spec.priority <= MAX_PRIORITY:
        yield "priority", f"must be within {MIN_PRIORITY}..{MAX_PRIORITY}"


def _identifier(path: str, value: str, pattern: re.Pattern[str] = IDENTIFIER_RE) -> _Found:
    """Optional identifiers: empty is fine, anything else must match `pattern`."""
    if value and not pattern.fullmatch(value):
        yield path, f"must match {pattern.pattern}"


def _text(path: str, value: str, max_chars: int) -> _Found:
    if len(unicodedata.normalize("NFC", value)) > max_chars:
        yield path, f"at most {max_chars} characters"
    if any(_forbidden_char(ch) for ch in value):
        yield path, "must not contain control characters other than tab and newlines"


def _forbidden_char(ch: str) -> bool:
    return ch not in _ALLOWED_CONTROLS and unicodedata.category(ch) in ("Cc", "Cs")


def _mode_inputs(spec: GenerationSpec) -> _Found:
    if not isinstance(spec.mode, Mode):
        yield "mode", "must be specified"
        return
    needed = MODE_INPUTS[spec.mode]
    for slot in _FRAME_SLOTS:
        asset: AssetRef | None = getattr(spec, slot)
        if asset is None and slot in needed:
            yield slot, f"required when mode is {spec.mode.value}"
        elif asset is not None and slot not in needed:
            yield slot, f"must be empty when mode is {spec.mode.value}"
        elif asset is not None:
            yield from _asset(slot, asset, _SLOT_MEDIA[slot])


def _asset(path: str, asset: AssetRef, media: tuple[str, ...]) -> _Found:
    yield from _identifier(f"{path}.asset_id", asset.asset_id)
    uri = asset.object_uri
    if not uri and not asset.asset_id:
        yield f"{path}.object_uri", "required unless asset_id is set"
    elif uri:
        problem = _uri_problem(uri)
        if problem:
            yield f"{path}.object_uri", problem
    if asset.mime_type and not (
        _MIME_TYPE.fullmatch(asset.mime_type) and asset.mime_type.startswith(media)
    ):
        yield f"{path}.mime_type", f"must be a MIME type starting with one of {', '.join(media)}"
    if asset.size_bytes < 0:
        yield f"{path}.size_bytes", "must not be negative"
    if asset.checksum_sha256 and not _SHA256_HEX.fullmatch(asset.checksum_sha256):
        yield f"{path}.checksum_sha256", "must be 64 lower-case hexadecimal digits (SHA-256)"


def _uri_problem(uri: str) -> str:
    """Why `uri` is unusable as an asset location, or '' if it is fine."""
    if len(uri) > MAX_ASSET_URI_CHARS:
        return f"at most {MAX_ASSET_URI_CHARS} characters"
    if any(ch.isspace() or _forbidden_char(ch) for ch in uri):
        return "must not contain whitespace or control characters"
    try:
        parts = urlsplit(uri)
    except ValueError:
        return "not a valid URI"
    if parts.scheme.lower() not in ASSET_URI_SCHEMES:
        return f"scheme must be one of {', '.join(sorted(ASSET_URI_SCHEMES))}"
    if not parts.netloc:
        return "must name a host, bucket or asset namespace"
    if "@" in parts.netloc:
        # Credentials in a URI end up in logs; pre-signed query strings are the supported way.
        return "must not embed user credentials"
    return ""


def _output(spec: GenerationSpec) -> _Found:
    out = spec.output
    landscape = out.width >= out.height
    yield from _side(
        "output.width", out.width, MAX_LONG_SIDE_PX if landscape else MAX_SHORT_SIDE_PX
    )
    yield from _side(
        "output.height", out.height, MAX_SHORT_SIDE_PX if landscape else MAX_LONG_SIDE_PX
    )
    if out.duration_ms <= 0:
        yield "output.duration_ms", "must be positive"
    elif out.duration_ms > MAX_DURATION_MS:
        yield "output.duration_ms", f"at most {MAX_DURATION_MS} ms"
    if not MIN_FPS <= out.fps <= MAX_FPS:
        yield "output.fps", f"must be within {MIN_FPS}..{MAX_FPS}"
    if not MIN_SAMPLE_COUNT <= out.sample_count <= MAX_SAMPLE_COUNT:
        yield "output.sample_count", f"must be within {MIN_SAMPLE_COUNT}..{MAX_SAMPLE_COUNT}"


def _side(path: str, pixels: int, limit: int) -> _Found:
    """One frame side; `limit` is the long or short side's bound, by the frame's orientation."""
    if pixels <= 0:
        yield path, "must be positive"
    elif pixels % 2:
        yield path, "must be even (4:2:0 video needs even dimensions)"
    elif pixels > limit:
        yield path, f"frame must fit {MAX_LONG_SIDE_PX}x{MAX_SHORT_SIDE_PX} in either orientation"


def _routing(spec: GenerationSpec) -> _Found:
    r = spec.routing
    if not isinstance(r.mode, RoutingMode):
        yield "routing.mode", "must be specified"
    elif r.mode is RoutingMode.PREFERRED and not (r.preferred_providers or r.required_model):
        yield "routing.mode", "PREFERRED needs routing.preferred_providers or required_model"
    yield from _identifier("routing.required_provider", r.required_provider)
    if r.mode is RoutingMode.STRICT_MODEL and not r.required_model:
        yield "routing.required_model", "required when routing.mode is STRICT_MODEL"
    yield from _identifier("routing.required_model", r.required_model, MODEL_NAME_RE)
    if len(r.preferred_providers) > MAX_PREFERRED_PROVIDERS:
        yield "routing.preferred_providers", f"at most {MAX_PREFERRED_PROVIDERS} providers"
    seen: set[str] = set()
    for i, provider in enumerate(r.preferred_providers[:MAX_PREFERRED_PROVIDERS]):
        path = f"routing.preferred_providers[{i}]"
        if not provider:
            yield path, "must not be empty"
        yield from _identifier(path, provider)
        if provider in seen:
            yield path, "duplicate provider"
        seen.add(provider)
    if r.max_estimated_cost_micros < 0:
        yield "routing.max_estimated_cost.amount_micros", "must not be negative (0 means no cap)"
    if (r.currency or r.max_estimated_cost_micros) and not _CURRENCY.fullmatch(r.currency):
        yield "routing.max_estimated_cost.currency_code", "must be an ISO 4217 code like USD"
    if r.max_queue_delay_ms < 0:
        yield "routing.max_queue_delay_ms", "must not be negative (0 means no limit)"
    yield from _identifier("routing.region", r.region)
