"""Veo request validation and `google.rpc.Status` error envelopes (provider-apis.md §2).

`validate(..., gemini=...)` returns a parsed `VeoRequest` or raises `GoogleError`, which
carries the HTTP status and the full error envelope to send. In Gemini mode images
(``image``, ``lastFrame``, ``referenceImages[].image``) must be inline ``bytesBase64Encoded`` +
``mimeType``: ``uri``, ``gcsUri`` and ``inlineData`` are 400 INVALID_ARGUMENT; ``video`` keeps
``uri`` (extending an earlier Veo output) or ``encodedVideo``.
"""

from __future__ import annotations

import base64
import binascii
import re
from dataclasses import dataclass, field
from typing import Any

from adapter_sidecars.emulators.http import Response

CANONICAL = {
    400: "INVALID_ARGUMENT",
    401: "UNAUTHENTICATED",
    403: "PERMISSION_DENIED",
    404: "NOT_FOUND",
    405: "UNIMPLEMENTED",
    409: "ABORTED",
    429: "RESOURCE_EXHAUSTED",
    500: "INTERNAL",
    502: "UNAVAILABLE",
    503: "UNAVAILABLE",
    504: "DEADLINE_EXCEEDED",
}
RPC_CODES = {
    "CANCELLED": 1,
    "UNKNOWN": 2,
    "INVALID_ARGUMENT": 3,
    "DEADLINE_EXCEEDED": 4,
    "NOT_FOUND": 5,
    "PERMISSION_DENIED": 7,
    "RESOURCE_EXHAUSTED": 8,
    "FAILED_PRECONDITION": 9,
    "INTERNAL": 13,
    "UNAVAILABLE": 14,
}
_31 = {
    "durations": [4, 6, 8],
    "resolutions": ["720p", "1080p", "4k"],
    "max_samples": 1,
    "eight_only": ["1080p", "4k"],
}
_30 = {"durations": [4, 6, 8], "resolutions": ["720p", "1080p"], "max_samples": 1, "eight_only": []}
DEFAULT_MODELS: dict[str, dict[str, Any]] = {
    "veo-3.1-generate-preview": _31,
    "veo-3.1-fast-generate-preview": _31,
    "veo-3.1-generate-001": _31,
    "veo-3.1-fast-generate-001": _31,
    "veo-3.0-generate-001": _30,
    "veo-3.0-fast-generate-001": _30,
    "veo-2.0-generate-001": {
        "durations": [5, 6, 8],
        "resolutions": ["720p"],
        "max_samples": 2,
        "eight_only": [],
    },
}
GEMINI_PARAMS = frozenset(
    {
        "aspectRatio",
        "resolution",
        "durationSeconds",
        "negativePrompt",
        "personGeneration",
        "sampleCount",
        "enhancePrompt",
        "seed",
    }
)
VERTEX_PARAMS = GEMINI_PARAMS | {
    "storageUri",
    "fps",
    "generateAudio",
    "compressionQuality",
    "resizeMode",
    "pubsubTopic",
}
RESOLUTION_HEIGHT = {"720p": 720, "1080p": 1080, "4k": 2160}
#: The only fields of a Gemini image (``image``, ``lastFrame``, ``referenceImages[].image``).
IMAGE_FIELDS = frozenset({"bytesBase64Encoded", "mimeType"})


class GoogleError(Exception):
    """An error to answer with; `response()` builds the `google.rpc.Status` envelope."""

    def __init__(
        self, code: int, message: str, details: list[dict[str, Any]] | None = None
    ) -> None:
        super().__init__(message)
        self.code, self.message, self.details = code, message, details or []

    def response(self, headers: list[tuple[str, str]] | None = None) -> Response:
        error = {
            "code": self.code,
            "message": self.message,
            "status": CANONICAL.get(self.code, "UNKNOWN"),
            "details": self.details,
        }
        return Response.json({"error": error}, self.code, headers)


def quota_error(model: str, per: str, limit: int, retry_s: float) -> GoogleError:
    """429 RESOURCE_EXHAUSTED; `per` is "minute" or "day" (visible in quota_metric/limit)."""
    daily = per == "day"
    metric = "generativelanguage.googleapis.com/generate_requests_per_model" + (
        "_per_day" if daily else ""
    )
    quota_id = f"GenerateRequestsPer{'Day' if daily else 'Minute'}PerProjectPerModel"
    details: list[dict[str, Any]] = [
        {
            "@type": "type.googleapis.com/google.rpc.ErrorInfo",
            "reason": "RATE_LIMIT_EXCEEDED",
            "domain": "googleapis.com",
            "metadata": {
                "service": "generativelanguage.googleapis.com",
                "quota_metric": metric,
                "quota_limit": quota_id,
                "quota_limit_value": str(limit),
                "model": model,
                "consumer": "projects/vidroute-emulator",
            },
        },
        {
            "@type": "type.googleapis.com/google.rpc.QuotaFailure",
            "violations": [
                {
                    "quotaMetric": metric,
                    "quotaId": quota_id,
                    "quotaDimensions": {"model": model, "location": "global"},
                    "quotaValue": str(limit),
                }
            ],
        },
        {
            "@type": "type.googleapis.com/google.rpc.Help",
            "links": [
                {
                    "description": "Learn more about Gemini API quotas",
                    "url": "https://ai.google.dev/gemini-api/docs/rate-limits",
                }
            ],
        },
        {
            "@type": "type.googleapis.com/google.rpc.RetryInfo",
            "retryDelay": f"{max(1, int(retry_s))}s",
        },
    ]
    message = (
        "You exceeded your current quota, please check your plan and billing details. "
        f"Quota exceeded for metric: {metric}, limit: {limit}, model: {model}"
    )
    return GoogleError(429, message, details)


def vertex_quota_error(model: str, per: str = "minute") -> GoogleError:
    """Vertex AI's 429: a per-project, per-base-model quota named in the message, no RetryInfo
    (provider-apis.md §2.3: Vertex 429s may carry the legacy ``errors[]`` list too)."""
    metric = "aiplatform.googleapis.com/online_prediction_requests_per_base_model" + (
        "_per_day" if per == "day" else ""
    )
    message = (
        f"Quota exceeded for {metric} with base model: {model}. Please submit a quota "
        "increase request. https://cloud.google.com/vertex-ai/docs/generative-ai/quotas-genai."
    )
    return GoogleError(429, message)


@dataclass(frozen=True)
class VeoRequest:
    """The parts of a validated request the emulator needs."""

    prompt: str
    duration_s: int
    aspect_ratio: str
    resolution: str
    samples: int
    storage_uri: str | None
    webhook_uris: list[str]
    user_metadata: Any
    labels: dict[str, str] = field(default_factory=dict)


#: Values that are free-form JSON (google.protobuf.Struct / map fields): their keys are data.
FREE_FORM = frozenset({"userMetadata", "labels"})


def camel_keys(value: Any, *, free: bool = False) -> Any:
    """Request JSON with snake_case field names turned lowerCamelCase, as Google's proto3 JSON
    parser accepts both spellings; keys inside free-form values (`FREE_FORM`) are left alone."""
    if isinstance(value, list):
        return [camel_keys(v, free=free) for v in value]
    if not isinstance(value, dict) or free:
        return value
    out: dict[str, Any] = {}
    for key, item in value.items():
        name = _camel(key) if isinstance(key, str) else key
        out[name] = camel_keys(item, free=name in FREE_FORM)
    return out


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part[:1].upper() + part[1:] for part in rest)


def _unknown(name: str) -> GoogleError:
    return GoogleError(
        400, f'Invalid JSON payload received. Unknown name "{name}": Cannot find field.'
    )


def _check_media(path: str, media: Any, gemini: bool) -> None:
    if media is None:
        return
    if not isinstance(media, dict):
        raise GoogleError(400, f"{path} must be an object")
    if gemini and "inlineData" in media:
        raise GoogleError(400, "`inlineData` isn't supported by this model.")
    if gemini and "gcsUri" in media:
        raise GoogleError(
            400,
            "`gcsUri` isn't supported by this model. Please remove it or "
            "refer to the Gemini API documentation for supported usage.",
        )
    keys = {"bytesBase64Encoded", "uri", "encodedVideo"} | ({"gcsUri"} if not gemini else set())
    if not keys & set(media):
        raise GoogleError(400, f"{path}: one of {sorted(keys)} is required")


def _check_gemini_image(path: str, media: Any) -> None:
    """Gemini images are inline only: ``bytesBase64Encoded`` (valid base64) + ``mimeType``."""
    if media is None:
        return
    if not isinstance(media, dict):
        raise GoogleError(400, f"{path} must be an object")
    if "inlineData" in media:
        raise GoogleError(400, "`inlineData` isn't supported by this model.")
    if "gcsUri" in media:
        raise GoogleError(
            400,
            "`gcsUri` isn't supported by this model. Please remove it or "
            "refer to the Gemini API documentation for supported usage.",
        )
    if "uri" in media:
        raise GoogleError(
            400,
            f"`uri` isn't supported for {path} by this model. Send the image inline as "
            "bytesBase64Encoded with its mimeType.",
        )
    for key in media:
        if key not in IMAGE_FIELDS:
            raise _unknown(f"{path}.{key}")
    data, mime = media.get("bytesBase64Encoded"), media.get("mimeType")
    if not isinstance(data, str) or not data:
        raise GoogleError(400, f"{path}.bytesBase64Encoded is required")
    try:
        base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        raise GoogleError(400, f"{path}.bytesBase64Encoded is not valid base64") from None
    if not isinstance(mime, str) or not mime.startswith("image/"):
        raise GoogleError(400, f"{path}.mimeType is required and must be an image type")


def validate(model: str, models: dict[str, Any], body: Any, *, gemini: bool) -> VeoRequest:
    """Validate a predictLongRunning body for `model`; raise `GoogleError` when invalid."""
    surface = "v1beta" if gemini else "v1"
    if model not in models:
        raise GoogleError(
            404,
            f"models/{model} is not found for API version {surface}, or is not "
            "supported for predictLongRunning.",
        )
    spec = models[model]
    if not isinstance(body, dict):
        raise GoogleError(400, "Invalid JSON payload received: expected an object")
    for key in body:
        if key not in {"instances", "parameters", "webhookConfig" if gemini else "labels"}:
            raise _unknown(key)
    instances = body.get("instances")
    if not isinstance(instances, list) or len(instances) != 1 or not isinstance(instances[0], dict):
        raise GoogleError(400, "instances must contain exactly one instance")
    instance = instances[0]
    for key in ("image", "lastFrame", "video", "mask"):
        path = f"instances[0].{key}"
        if gemini and key in ("image", "lastFrame"):
            _check_gemini_image(path, instance.get(key))
        else:
            _check_media(path, instance.get(key), gemini)
    for i, ref in enumerate(instance.get("referenceImages") or []):
        path, image = f"instances[0].referenceImages[{i}].image", (ref or {}).get("image")
        if gemini:
            _check_gemini_image(path, image)
        else:
            _check_media(path, image, gemini)
    prompt = instance.get("prompt")
    if not isinstance(prompt, str) and instance.get("image") is None:
        raise GoogleError(400, "instances[0].prompt is required")
    params = body.get("parameters") or {}
    if not isinstance(params, dict):
        raise GoogleError(400, "parameters must be an object")
    for key in params:
        if key not in (GEMINI_PARAMS if gemini else VERTEX_PARAMS):
            raise _unknown(f"parameters.{key}")
    duration = _duration(params.get("durationSeconds", spec["durations"][-1]), spec["durations"])
    aspect = params.get("aspectRatio", "16:9")
    if aspect not in ("16:9", "9:16"):
        raise GoogleError(400, f"Unsupported aspect ratio: {aspect}. Supported: 16:9, 9:16.")
    resolution = params.get("resolution", "720p")
    if resolution not in spec["resolutions"]:
        raise GoogleError(400, f"Unsupported resolution {resolution!r} for {model}.")
    if resolution in spec["eight_only"] and duration != 8:
        raise GoogleError(400, f"Resolution {resolution} requires durationSeconds 8.")
    samples = params.get("sampleCount", 1)
    max_samples = spec["max_samples"] if gemini else 4
    if not isinstance(samples, int) or not 1 <= samples <= max_samples:
        raise GoogleError(400, f"sampleCount must be between 1 and {max_samples}.")
    webhook = body.get("webhookConfig") or {}
    labels = {} if gemini else _labels(body.get("labels"))
    return VeoRequest(
        prompt=prompt if isinstance(prompt, str) else "",
        duration_s=duration,
        aspect_ratio=aspect,
        resolution=resolution,
        samples=samples,
        storage_uri=params.get("storageUri"),
        webhook_uris=list(webhook.get("uris") or []),
        user_metadata=webhook.get("userMetadata"),
        labels=labels,
    )


_LABEL_KEY = re.compile(r"[a-z][a-z0-9_-]{0,62}")
_LABEL_VALUE = re.compile(r"[a-z0-9_-]{0,63}")


def _labels(value: Any) -> dict[str, str]:
    """Vertex request labels: at most 64; keys start with a lowercase letter; keys and values
    at most 63 characters of lowercase letters, digits, ``_`` and ``-``."""
    if value is None:
        return {}
    if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
        raise GoogleError(400, "labels must be a map of strings")
    if len(value) > 64:
        raise GoogleError(400, "At most 64 labels are allowed.")
    for key, item in value.items():
        if not _LABEL_KEY.fullmatch(str(key)):
            raise GoogleError(400, f"Invalid label key: {key!r}.")
        if not _LABEL_VALUE.fullmatch(item):
            raise GoogleError(400, f"Invalid label value for key {key!r}: {item!r}.")
    return dict(value)


def _duration(value: Any, allowed: list[int]) -> int:
    """durationSeconds may be an int or a numeric string."""
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise GoogleError(400, "durationSeconds must be a number")
    try:
        seconds = int(value)
    except ValueError:
        raise GoogleError(400, f"Invalid value for durationSeconds: {value!r}") from None
    if seconds not in allowed:
        raise GoogleError(
            400,
            f"The value of durationSeconds ({seconds}) is out of range; "
            f"supported values: {allowed}.",
        )
    return seconds
