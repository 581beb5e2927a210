"""Self-hosted job status and error normalization (provider-apis.md §3.4).

Job errors: OOM, WORKER_LOST and TIMEOUT are infrastructure failures worth another try
(INTERNAL_RETRYABLE; an OOM may pass on a less fragmented GPU, design 9.21); INVALID_INPUT is
the request's fault; INTERNAL follows the server's own ``retryable`` flag. HTTP on create:
503 + Retry-After is a full queue (nothing created), 409 is an Idempotency-Key reused with a
different body (nothing created for this body), other 5xx are UNKNOWN — recoverable by key.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from math import isfinite
from typing import Any

from adapter_sidecars.common.jobs import (
    map_state,
    parse_timestamp,
    progress_of,
    queue_position_of,
    url_expiry,
)
from adapter_sidecars.common.transport import HttpReply, create_error_outcome, retry_after_ms
from vidroute_core.adapter import JobOutput, JobSnapshot, JobState, ModelLoad, SubmitOutcome
from vidroute_core.errors import ErrorClass, ProviderError, classify_http_status, make_error

STATUS: Mapping[str, JobState] = {
    "queued": JobState.QUEUED,
    "running": JobState.RUNNING,
    "succeeded": JobState.SUCCEEDED,
    "failed": JobState.FAILED,
    "cancelled": JobState.CANCELLED,
}
JOB_ERRORS: Mapping[str, ErrorClass] = {
    "OOM": ErrorClass.INTERNAL_RETRYABLE,
    "WORKER_LOST": ErrorClass.INTERNAL_RETRYABLE,
    "TIMEOUT": ErrorClass.INTERNAL_RETRYABLE,
    "INVALID_INPUT": ErrorClass.INVALID_INPUT,
}
NOT_CREATED_5XX = frozenset({503})
# The model server numbers its queue from 1 (the job that starts next); JobStatus from 0.
FIRST_QUEUE_POSITION = 1


def job_error(error: Mapping[str, Any] | None) -> ProviderError:
    """Class of a failed job's ``error`` object."""
    error = error or {}
    code = str(error.get("code") or "INTERNAL")
    message = str(error.get("message") or "job failed")
    error_class = JOB_ERRORS.get(code)
    if error_class is None:
        retryable = error.get("retryable") is True
        error_class = ErrorClass.INTERNAL_RETRYABLE if retryable else ErrorClass.INTERNAL_PERMANENT
    return make_error(error_class, code, message)


def job_status(
    job: Mapping[str, Any], *, url_ttl_seconds: int, now: datetime, micros_per_gpu_second: int
) -> JobSnapshot:
    """Normalize ``GET /v1/jobs/{id}``; cost = reported GPU seconds x rate."""
    raw = str(job.get("status", ""))
    state = map_state(raw, STATUS)
    updated = parse_timestamp(
        job.get("finished_at") or job.get("started_at") or job.get("created_at")
    )
    metrics = job.get("metrics") if isinstance(job.get("metrics"), dict) else {}
    gpu_seconds = metrics.get("gpu_seconds") if metrics else None
    cost = None
    if isinstance(gpu_seconds, int | float) and state.terminal:
        cost = round(float(gpu_seconds) * micros_per_gpu_second)
    outputs: tuple[JobOutput, ...] = ()
    failure = None
    if state is JobState.SUCCEEDED:
        outputs = tuple(
            JobOutput(
                str(o["url"]),
                str(o.get("content_type") or "video/mp4"),
                parse_timestamp(o.get("expires_at"))
                or url_expiry(str(o["url"]), url_ttl_seconds, now),
            )
            for o in job.get("outputs") or []
            if isinstance(o, dict) and o.get("url")
        )
    elif state is JobState.FAILED:
        failure = job_error(job.get("error") if isinstance(job.get("error"), dict) else None)
    return JobSnapshot(
        state,
        raw,
        progress=progress_of(job.get("progress")),
        outputs=outputs,
        failure=failure,
        updated_at=updated,
        actual_cost_micros=cost,
        currency="USD" if cost is not None else "",
        queue_position=queue_position_of(job.get("queue_position"), first=FIRST_QUEUE_POSITION)
        if state is JobState.QUEUED
        else None,
    )


def http_error(reply: HttpReply, *, creating: bool = False) -> ProviderError:
    """Class of a non-2xx reply from the job API."""
    body = reply.json()
    error = body.get("error") if isinstance(body, dict) else None
    error = error if isinstance(error, dict) else {}
    code = str(error.get("code") or f"HTTP_{reply.status}")
    message = str(error.get("message") or f"HTTP {reply.status}")
    error_class = classify_http_status(
        reply.status,
        provider_contract_says_not_created=not creating or reply.status in NOT_CREATED_5XX,
    )
    if reply.status == 409:
        error_class = ErrorClass.INVALID_INPUT  # key reused with another body: a caller bug
    elif reply.status == 503:
        error_class = ErrorClass.PROVIDER_OVERLOADED
    return make_error(
        error_class,
        code,
        message,
        retry_after_ms=retry_after_ms(reply.headers),
        raw_status_code=reply.status,
    )


def submit_error(reply: HttpReply) -> SubmitOutcome:
    """A non-2xx create reply."""
    return create_error_outcome(
        reply, lambda r: http_error(r, creating=True), not_created_5xx=NOT_CREATED_5XX
    )


def _number(value: Any) -> float:
    """A finite non-negative JSON number, else 0."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not isfinite(value):
        return 0.0
    return max(0.0, float(value))


def _count(value: Any) -> int:
    return int(_number(value))


def _fraction(value: Any) -> float:
    return min(1.0, _number(value))


def model_load(model: str, row: Mapping[str, Any]) -> ModelLoad:
    """One model of the server's ``GET /v1/load`` document, reported as capability `model`.

    Only ``state: "warm"`` is warm (``loading`` still costs the rest of a cold start); a missing
    or malformed number reads as 0."""
    return ModelLoad(
        model=model,
        queue_length=_count(row.get("queue_length")),
        warm=row.get("state") == "warm",
        cold_start_s=_number(row.get("cold_start_s")),
        gpu_utilization=_fraction(row.get("gpu_utilization")),
        vram_free_mb=_count(row.get("vram_free_mb")),
        vram_total_mb=_count(row.get("vram_total_mb")),
        available_slots=_count(row.get("available_slots")),
        ready_replicas=_count(row.get("ready_replicas")),
    )
