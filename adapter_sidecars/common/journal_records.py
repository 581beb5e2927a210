"""How the submit journal writes one outcome as a JSON object and reads it back."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from vidroute_core.adapter import JobRef, SubmitKind, SubmitOutcome, TransportStage
from vidroute_core.errors import ErrorClass, ProviderError, make_error

__all__ = ["dump_outcome", "load_outcome"]


def dump_outcome(outcome: SubmitOutcome) -> dict[str, Any]:
    job = outcome.job
    err = outcome.error
    return {
        "kind": outcome.kind.value,
        "job": None
        if job is None
        else {
            "id": job.provider_job_id,
            "account": job.account,
            "model": job.model,
            "request_id": job.provider_request_id,
        },
        "raw_status": outcome.raw_status,
        "stage": outcome.transport_stage.value,
        "started_at": outcome.request_started_at.isoformat()
        if outcome.request_started_at
        else None,
        "error": None
        if err is None
        else {
            "class": err.error_class.value,
            "code": err.code,
            "message": err.message,
            "retry_after_ms": err.retry_after_ms,
            "raw_status_code": err.raw_status_code,
        },
    }


def load_outcome(record: dict[str, Any]) -> SubmitOutcome:
    job = record.get("job")
    err = record.get("error")
    error: ProviderError | None = None
    if isinstance(err, dict):
        error = make_error(
            ErrorClass(err["class"]),
            str(err.get("code", "")),
            str(err.get("message", "")),
            retry_after_ms=err.get("retry_after_ms"),
            raw_status_code=err.get("raw_status_code"),
        )
    started = record.get("started_at")
    return SubmitOutcome(
        SubmitKind(record["kind"]),
        job=None
        if not isinstance(job, dict)
        else JobRef(str(job["id"]), str(job["account"]), str(job["model"]), str(job["request_id"])),
        raw_status=str(record.get("raw_status", "")),
        error=error,
        transport_stage=TransportStage(record.get("stage", "NONE")),
        request_started_at=datetime.fromisoformat(started) if started else None,
    )
