"""Veo operation and ``google.rpc.Status`` normalization (provider-apis.md §2.1, §2.3).

* ``done`` false/absent: RUNNING (``metadata.state`` PENDING/QUEUED -> QUEUED, THROTTLED ->
  THROTTLED, anything else unknown -> UNRECOGNIZED with the raw value kept).
* ``done`` + samples: SUCCEEDED. A Gemini file URI (``/v1beta/files/{id}:download``) only
  downloads with the API key, so it is marked ``fetch_through_adapter`` (the control plane
  fetches it with FetchOutput); the URI itself never carries the key.
* ``done`` + RAI filter and no samples: FAILED SAFETY_OUTPUT (Google does not bill it).
  ``done`` + ``error``: numeric canonical code (`RPC_ERRORS`).
* HTTP 429 RESOURCE_EXHAUSTED is QUOTA when the quota metric/id is per day or the RetryInfo
  delay is long (`LONG_RETRY_MS`), else RATE_LIMITED. On create, 503 UNAVAILABLE means nothing
  was created; 500 INTERNAL, 502 and 504 DEADLINE_EXCEEDED may have created an operation.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from datetime import datetime
from typing import Any
from urllib.parse import urlsplit

from adapter_sidecars.common.jobs import map_state, url_expiry
from adapter_sidecars.common.transport import HttpReply, create_error_outcome, retry_after_ms
from vidroute_core.adapter import JobOutput, JobSnapshot, JobState, SubmitOutcome
from vidroute_core.errors import ErrorClass, ProviderError, classify_http_status, make_error

PENDING_STATES: Mapping[str, JobState] = {
    "RUNNING": JobState.RUNNING,
    "ACTIVE": JobState.RUNNING,
    "PENDING": JobState.QUEUED,
    "QUEUED": JobState.QUEUED,
    "THROTTLED": JobState.THROTTLED,
}
#: Operation ``error.code`` (google.rpc.Code) -> class.
RPC_ERRORS: Mapping[int, ErrorClass] = {
    2: ErrorClass.INTERNAL_RETRYABLE,  # UNKNOWN
    3: ErrorClass.INVALID_INPUT,  # INVALID_ARGUMENT
    4: ErrorClass.INTERNAL_RETRYABLE,  # DEADLINE_EXCEEDED
    7: ErrorClass.PERMISSION,  # PERMISSION_DENIED
    8: ErrorClass.RATE_LIMITED,  # RESOURCE_EXHAUSTED (QUOTA when the message says so)
    9: ErrorClass.INVALID_INPUT,  # FAILED_PRECONDITION
    13: ErrorClass.INTERNAL_RETRYABLE,  # INTERNAL
    14: ErrorClass.INTERNAL_RETRYABLE,  # UNAVAILABLE
}
RPC_NAMES = {
    2: "UNKNOWN",
    3: "INVALID_ARGUMENT",
    4: "DEADLINE_EXCEEDED",
    7: "PERMISSION_DENIED",
    8: "RESOURCE_EXHAUSTED",
    9: "FAILED_PRECONDITION",
    13: "INTERNAL",
    14: "UNAVAILABLE",
}
NOT_CREATED_5XX = frozenset({503})
LONG_RETRY_MS = 10 * 60 * 1000
_DAILY = re.compile(r"per_?day|perday|daily", re.IGNORECASE)
_GEMINI_FILE = re.compile(r"/v1(?:beta)?/files/[^/]+:download$")


def is_gemini_file(uri: str) -> bool:
    """Whether `uri` is a Gemini Files API download link (needs ``x-goog-api-key``)."""
    parts = urlsplit(uri)
    return parts.scheme in ("http", "https") and bool(_GEMINI_FILE.search(parts.path))


def operation_status(op: Mapping[str, Any], *, url_ttl_seconds: int, now: datetime) -> JobSnapshot:
    """Normalize one operation (``GET /v1beta/{name}``)."""
    metadata = op.get("metadata") if isinstance(op.get("metadata"), dict) else {}
    if not op.get("done"):
        raw = str((metadata or {}).get("state") or "RUNNING")
        return JobSnapshot(map_state(raw, PENDING_STATES), raw)
    error = op.get("error")
    if isinstance(error, dict):
        code = error.get("code")
        if code == 1:
            return JobSnapshot(JobState.CANCELLED, "CANCELLED")
        return JobSnapshot(JobState.FAILED, "ERROR", failure=_operation_error(error))
    response = op.get("response") if isinstance(op.get("response"), dict) else {}
    inner = (response or {}).get("generateVideoResponse", response) or {}
    samples = inner.get("generatedSamples") or inner.get("videos") or []
    outputs = []
    for sample in samples:
        video = sample.get("video", sample) if isinstance(sample, dict) else {}
        uri = video.get("uri") or video.get("gcsUri") if isinstance(video, dict) else None
        if isinstance(uri, str) and uri:
            mime = str(video.get("mimeType") or "video/mp4")
            outputs.append(
                JobOutput(
                    uri,
                    mime,
                    url_expiry(uri, url_ttl_seconds, now),
                    fetch_through_adapter=is_gemini_file(uri),
                )
            )
    if outputs:
        return JobSnapshot(JobState.SUCCEEDED, "DONE", outputs=tuple(outputs), progress=1.0)
    if inner.get("raiMediaFilteredCount"):
        reasons = "; ".join(str(r) for r in inner.get("raiMediaFilteredReasons") or [])
        failure = make_error(ErrorClass.SAFETY_OUTPUT, "RAI_MEDIA_FILTERED", reasons or "filtered")
        return JobSnapshot(JobState.FAILED, "FILTERED", failure=failure)
    failure = make_error(ErrorClass.INTERNAL_RETRYABLE, "EMPTY_RESPONSE", "done without samples")
    return JobSnapshot(JobState.FAILED, "DONE", failure=failure)


def _operation_error(error: Mapping[str, Any]) -> ProviderError:
    code = error.get("code")
    number = code if isinstance(code, int) and not isinstance(code, bool) else 2
    message = str(error.get("message") or "operation failed")
    error_class = RPC_ERRORS.get(number, ErrorClass.INTERNAL_PERMANENT)
    if number == 8 and _DAILY.search(message):
        error_class = ErrorClass.QUOTA
    return make_error(error_class, RPC_NAMES.get(number, str(number)), message)


def _details(error: Mapping[str, Any]) -> dict[str, Mapping[str, Any]]:
    found: dict[str, Mapping[str, Any]] = {}
    for detail in error.get("details") or []:
        if isinstance(detail, dict):
            found[str(detail.get("@type", "")).rsplit(".", 1)[-1]] = detail
    return found


def _retry_info_ms(details: Mapping[str, Mapping[str, Any]]) -> int | None:
    delay = str(details.get("RetryInfo", {}).get("retryDelay") or "")
    match = re.fullmatch(r"(\d+(?:\.\d+)?)s", delay)
    return round(float(match.group(1)) * 1000) if match else None


def http_error(reply: HttpReply, *, creating: bool = False) -> ProviderError:
    """Class of a non-2xx reply carrying a ``google.rpc.Status`` envelope."""
    body = reply.json()
    error = body.get("error") if isinstance(body, dict) else None
    error = error if isinstance(error, dict) else {}
    canonical = str(error.get("status") or f"HTTP_{reply.status}")
    message = str(error.get("message") or f"HTTP {reply.status}")
    details = _details(error)
    wait = _retry_info_ms(details) or retry_after_ms(reply.headers)
    error_class = classify_http_status(
        reply.status,
        provider_contract_says_not_created=not creating or reply.status in NOT_CREATED_5XX,
    )
    reason = str(details.get("ErrorInfo", {}).get("reason") or "")
    if reason == "API_KEY_INVALID":
        error_class = ErrorClass.AUTH
    elif reply.status == 429:
        # Gemini names the quota in ErrorInfo/QuotaFailure details, Vertex only in the message.
        quota_text = " ".join([message, *(str(v) for d in details.values() for v in _flatten(d))])
        daily = bool(_DAILY.search(quota_text)) or (wait or 0) >= LONG_RETRY_MS
        error_class = ErrorClass.QUOTA if daily else ErrorClass.RATE_LIMITED
    elif reply.status == 503:
        error_class = ErrorClass.PROVIDER_OVERLOADED
    return make_error(
        error_class, canonical, message, retry_after_ms=wait, raw_status_code=reply.status
    )


def _flatten(value: Any) -> list[Any]:
    if isinstance(value, dict):
        return [x for v in value.values() for x in _flatten(v)]
    if isinstance(value, list):
        return [x for v in value for x in _flatten(v)]
    return [value]


def submit_error(reply: HttpReply) -> SubmitOutcome:
    """A non-2xx create reply."""
    return create_error_outcome(
        reply, lambda r: http_error(r, creating=True), not_created_5xx=NOT_CREATED_5XX
    )
