"""Runway task and error normalization (provider-apis.md §1.5-1.7, design 9.8, 9.9).

Tables, not branches: `STATUS` maps raw task statuses, `FAILURE_PREFIXES` maps dot-separated
``failureCode`` values by longest matching prefix, and `submit_error` applies Runway's documented
HTTP contract for task creation (400/401/404 never create a task; 429 is a daily quota or a rate
limit; 502/503/504 are load shedding that creates nothing; any other 5xx is not documented as
"not created" and is therefore UNKNOWN).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from datetime import datetime
from typing import Any

from adapter_sidecars.common.jobs import (
    map_state,
    parse_timestamp,
    progress_of,
    scaled_int,
    url_expiry,
)
from adapter_sidecars.common.transport import HttpReply, create_error_outcome, retry_after_ms
from vidroute_core.adapter import JobOutput, JobSnapshot, JobState, SubmitOutcome
from vidroute_core.capabilities.loader import Commercial
from vidroute_core.errors import ErrorClass, ProviderError, classify_http_status, make_error

STATUS: Mapping[str, JobState] = {
    "PENDING": JobState.QUEUED,
    "THROTTLED": JobState.THROTTLED,
    "RUNNING": JobState.RUNNING,
    "SUCCEEDED": JobState.SUCCEEDED,
    "FAILED": JobState.FAILED,
    "CANCELLED": JobState.CANCELLED,
}

#: failureCode prefix -> class; the longest matching prefix wins.
FAILURE_PREFIXES: Mapping[str, ErrorClass] = {
    "SAFETY.INPUT": ErrorClass.SAFETY_INPUT,
    "SAFETY.OUTPUT": ErrorClass.SAFETY_OUTPUT,
    "INPUT_PREPROCESSING.SAFETY": ErrorClass.SAFETY_INPUT,
    "INPUT_PREPROCESSING.INTERNAL": ErrorClass.INTERNAL_RETRYABLE,
    "INTERNAL.BAD_OUTPUT": ErrorClass.INTERNAL_RETRYABLE,
    "INTERNAL": ErrorClass.INTERNAL_RETRYABLE,
    "THIRD_PARTY.UNAVAILABLE": ErrorClass.INTERNAL_RETRYABLE,
    "ASSET.INVALID": ErrorClass.ASSET_INVALID,
}
#: Statuses Runway documents as "no task was created" on a create call.
NOT_CREATED_5XX = frozenset({502, 503, 504})


def failure_class(code: str | None) -> ErrorClass:
    """Class of a ``failureCode``; null and unknown codes are retryable internal failures."""
    if not code:
        return ErrorClass.INTERNAL_RETRYABLE
    best: tuple[int, ErrorClass] | None = None
    for prefix, error_class in FAILURE_PREFIXES.items():
        if (code == prefix or code.startswith(prefix + ".")) and (
            best is None or len(prefix) > best[0]
        ):
            best = (len(prefix), error_class)
    return best[1] if best else ErrorClass.INTERNAL_RETRYABLE


def task_status(task: Mapping[str, Any], *, url_ttl_seconds: int, now: datetime) -> JobSnapshot:
    """Normalize one task object (``GET /v1/tasks/{id}``)."""
    raw = str(task.get("status", ""))
    state = map_state(raw, STATUS)
    created = parse_timestamp(task.get("createdAt"))
    if state is JobState.SUCCEEDED:
        urls = [u for u in task.get("output") or [] if isinstance(u, str)]
        outputs = tuple(
            JobOutput(u, "video/mp4", url_expiry(u, url_ttl_seconds, now)) for u in urls
        )
        return JobSnapshot(state, raw, outputs=outputs, updated_at=created, progress=1.0)
    if state is JobState.FAILED:
        code = task.get("failureCode")
        code = code if isinstance(code, str) else None
        failure = make_error(
            failure_class(code), code or "UNKNOWN", str(task.get("failure") or "task failed")
        )
        return JobSnapshot(state, raw, failure=failure, updated_at=created)
    return JobSnapshot(state, raw, progress=progress_of(task.get("progress")), updated_at=created)


def with_cost(status: JobSnapshot, task: Mapping[str, Any], commercial: Commercial) -> JobSnapshot:
    """A terminal task's final ``cost.credits`` (§5) as the actual cost in integer micros.

    Only terminal tasks carry ``cost``; ``estimatedCost`` on running ones is a ceiling, not a
    charge, so it is not reported. No price per credit known: no actual cost."""
    cost = task.get("cost")
    credits = cost.get("credits") if isinstance(cost, dict) else None
    per_credit = commercial.micros_per_provider_unit
    if not status.state.terminal or per_credit <= 0:
        return status
    if isinstance(credits, bool) or not isinstance(credits, int | float):
        return status
    # Exact decimal times the integer rate (fractional credits, e.g. 114.5): never a float.
    return replace(
        status, actual_cost_micros=scaled_int(credits, per_credit), currency=commercial.currency
    )


def _message(body: Any, status: int) -> str:
    if isinstance(body, dict):
        text = str(body.get("error") or f"HTTP {status}")
        issues = body.get("issues")
        if isinstance(issues, list) and issues:
            shown = "; ".join(
                f"{'.'.join(str(p) for p in i.get('path', []))}: {i.get('message', i.get('code'))}"
                for i in issues[:5]
                if isinstance(i, dict)
            )
            text = f"{text}: {shown}"
        return text
    return f"HTTP {status}"


def http_error(reply: HttpReply, *, creating: bool = False) -> ProviderError:
    """Class of a non-2xx Runway reply; only a create call can leave a 5xx's fate unknown."""
    status, body = reply.status, reply.json()
    message = _message(body, status)
    lowered = message.lower()
    wait = retry_after_ms(reply.headers)
    error_class = classify_http_status(
        status, provider_contract_says_not_created=not creating or status in NOT_CREATED_5XX
    )
    code = f"HTTP_{status}"
    if status == 400 and "enough credits" in lowered:
        error_class, code = ErrorClass.QUOTA, "INSUFFICIENT_CREDITS"
    elif status == 400 and ("fetch" in lowered or "download" in lowered):
        error_class = ErrorClass.ASSET_UNAVAILABLE
    elif status == 429:
        daily = "daily" in lowered or "per day" in lowered
        error_class = ErrorClass.QUOTA if daily else ErrorClass.RATE_LIMITED
        code = "DAILY_GENERATION_LIMIT" if daily else "RATE_LIMITED"
    elif status == 409:
        # Runway takes no client idempotency key, so a 409 cannot mean "your job exists".
        error_class = ErrorClass.INVALID_INPUT
    return make_error(error_class, code, message, retry_after_ms=wait, raw_status_code=status)


def submit_error(reply: HttpReply) -> SubmitOutcome:
    """A non-2xx create reply: REJECTED under Runway's contract, UNKNOWN for other 5xx."""
    return create_error_outcome(
        reply, lambda r: http_error(r, creating=True), not_created_5xx=NOT_CREATED_5XX
    )
