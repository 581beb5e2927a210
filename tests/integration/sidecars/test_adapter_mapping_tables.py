"""Status and failure normalization tables: one case per raw status and failure-code row."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest

from adapter_sidecars.common.jobs import url_expiry
from adapter_sidecars.common.transport import HttpReply
from adapter_sidecars.runway import mapping as runway
from adapter_sidecars.selfhosted import mapping as selfhosted
from adapter_sidecars.veo import mapping as veo
from vidroute_core.adapter import JobState, SubmitKind
from vidroute_core.errors import ErrorClass

NOW = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)
E = ErrorClass


def _reply(status: int, body: object, headers: dict[str, str] | None = None) -> HttpReply:
    import json

    return HttpReply(status, httpx.Headers(headers or {}), json.dumps(body).encode(), NOW)


@pytest.mark.parametrize(
    ("raw", "state"),
    [
        ("PENDING", JobState.QUEUED),
        ("THROTTLED", JobState.THROTTLED),
        ("RUNNING", JobState.RUNNING),
        ("SUCCEEDED", JobState.SUCCEEDED),
        ("FAILED", JobState.FAILED),
        ("CANCELLED", JobState.CANCELLED),
        ("ARCHIVED", JobState.UNRECOGNIZED),
    ],
)
def test_runway_status_row(raw: str, state: JobState) -> None:
    """Each Runway status maps to its state; an unknown one is UNRECOGNIZED with raw kept."""
    task = {
        "id": "t",
        "createdAt": "2026-06-01T11:00:00Z",
        "status": raw,
        "progress": 0.5,
        "output": ["https://cdn/x.mp4?exp=1780000000"],
        "failureCode": "INTERNAL",
    }
    status = runway.task_status(task, url_ttl_seconds=86400, now=NOW)
    assert status.state is state
    assert status.raw_status == raw


@pytest.mark.parametrize(
    ("code", "error_class"),
    [
        ("SAFETY.INPUT.TEXT", E.SAFETY_INPUT),
        ("SAFETY.INPUT.IMAGE", E.SAFETY_INPUT),
        ("SAFETY.OUTPUT.VIDEO", E.SAFETY_OUTPUT),
        ("INPUT_PREPROCESSING.SAFETY.TEXT", E.SAFETY_INPUT),
        ("INPUT_PREPROCESSING.INTERNAL", E.INTERNAL_RETRYABLE),
        ("INTERNAL.BAD_OUTPUT.CODE01", E.INTERNAL_RETRYABLE),
        ("ASSET.INVALID", E.ASSET_INVALID),
        ("INTERNAL", E.INTERNAL_RETRYABLE),
        ("THIRD_PARTY.UNAVAILABLE", E.INTERNAL_RETRYABLE),
        (None, E.INTERNAL_RETRYABLE),
        ("SOMETHING.NEW", E.INTERNAL_RETRYABLE),
    ],
)
def test_runway_failure_code_row(code: str, error_class: ErrorClass) -> None:
    """Each failureCode family maps to its class (longest prefix wins)."""
    task = {"id": "t", "status": "FAILED", "failure": "why", "failureCode": code}
    status = runway.task_status(task, url_ttl_seconds=0, now=NOW)
    assert status.state is JobState.FAILED
    assert status.failure is not None
    assert status.failure.error_class is error_class
    assert status.failure.code == (code or "UNKNOWN")


def test_runway_success_keeps_urls_and_reads_expiry_from_the_link() -> None:
    """JobOutput URLs are kept verbatim; expiry comes from the link's exp parameter."""
    url = "https://cdn.example/v.mp4?_jwt=abc&exp=1780000000"
    status = runway.task_status(
        {"status": "SUCCEEDED", "output": [url]}, url_ttl_seconds=5, now=NOW
    )
    assert status.outputs[0].uri == url
    assert status.outputs[0].expires_at == datetime.fromtimestamp(1780000000, UTC)


@pytest.mark.parametrize(
    ("status", "body", "kind", "error_class"),
    [
        (
            400,
            {"error": "Validation of body failed", "issues": []},
            SubmitKind.REJECTED,
            E.INVALID_INPUT,
        ),
        (
            400,
            {"error": "You do not have enough credits to run this task."},
            SubmitKind.REJECTED,
            E.QUOTA,
        ),
        (401, {"error": "Invalid API key"}, SubmitKind.REJECTED, E.AUTH),
        (404, {"error": "Not found"}, SubmitKind.REJECTED, E.UNSUPPORTED_CAPABILITY),
        (
            429,
            {"error": "You have exceeded the daily generation limit for gen4.5."},
            SubmitKind.REJECTED,
            E.QUOTA,
        ),
        (
            429,
            {"error": "You have exceeded the rate limit for this model."},
            SubmitKind.REJECTED,
            E.RATE_LIMITED,
        ),
        (502, {"error": "Bad gateway"}, SubmitKind.REJECTED, E.PROVIDER_OVERLOADED),
        (503, {"error": "Unavailable"}, SubmitKind.REJECTED, E.PROVIDER_OVERLOADED),
        (504, {"error": "Gateway timeout"}, SubmitKind.REJECTED, E.PROVIDER_OVERLOADED),
        (500, {"error": "Internal"}, SubmitKind.UNKNOWN, E.SUBMISSION_UNKNOWN),
    ],
)
def test_runway_create_http_row(
    status: int, body: dict[str, object], kind: SubmitKind, error_class: ErrorClass
) -> None:
    """Runway's documented create statuses: not created (REJECTED) or unknown."""
    outcome = runway.submit_error(_reply(status, body))
    assert outcome.kind is kind
    assert outcome.error is not None
    assert outcome.error.error_class is error_class
    assert outcome.error.raw_status_code == status


@pytest.mark.parametrize(
    ("op", "state", "error_class"),
    [
        ({"name": "n"}, JobState.RUNNING, None),
        ({"name": "n", "done": False}, JobState.RUNNING, None),
        ({"done": False, "metadata": {"state": "PENDING"}}, JobState.QUEUED, None),
        ({"done": False, "metadata": {"state": "THROTTLED"}}, JobState.THROTTLED, None),
        ({"done": False, "metadata": {"state": "WARMING_UP"}}, JobState.UNRECOGNIZED, None),
        (
            {
                "done": True,
                "response": {
                    "generateVideoResponse": {
                        "generatedSamples": [
                            {"video": {"uri": "https://g/v1beta/files/a:download?alt=media"}}
                        ]
                    }
                },
            },
            JobState.SUCCEEDED,
            None,
        ),
        (
            {
                "done": True,
                "response": {
                    "generateVideoResponse": {
                        "raiMediaFilteredCount": 1,
                        "raiMediaFilteredReasons": ["policy"],
                    }
                },
            },
            JobState.FAILED,
            E.SAFETY_OUTPUT,
        ),
        ({"done": True, "error": {"code": 3, "message": "bad"}}, JobState.FAILED, E.INVALID_INPUT),
        (
            {"done": True, "error": {"code": 8, "message": "try later"}},
            JobState.FAILED,
            E.RATE_LIMITED,
        ),
        (
            {"done": True, "error": {"code": 8, "message": "daily quota exceeded"}},
            JobState.FAILED,
            E.QUOTA,
        ),
        (
            {"done": True, "error": {"code": 13, "message": "x"}},
            JobState.FAILED,
            E.INTERNAL_RETRYABLE,
        ),
        (
            {"done": True, "error": {"code": 14, "message": "x"}},
            JobState.FAILED,
            E.INTERNAL_RETRYABLE,
        ),
        ({"done": True, "error": {"code": 1, "message": "cancelled"}}, JobState.CANCELLED, None),
        ({"done": True, "response": {}}, JobState.FAILED, E.INTERNAL_RETRYABLE),
    ],
)
def test_veo_operation_row(
    op: dict[str, Any], state: JobState, error_class: ErrorClass | None
) -> None:
    """Each operation shape maps to its state and failure class."""
    status = veo.operation_status(op, url_ttl_seconds=172800, now=NOW)
    assert status.state is state
    if error_class is None:
        assert status.failure is None
    else:
        assert status.failure is not None
        assert status.failure.error_class is error_class


def _google_429(metric: str, delay: str) -> dict[str, object]:
    return {
        "error": {
            "code": 429,
            "status": "RESOURCE_EXHAUSTED",
            "message": "quota",
            "details": [
                {
                    "@type": "type.googleapis.com/google.rpc.QuotaFailure",
                    "violations": [{"quotaMetric": metric, "quotaId": "x"}],
                },
                {"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": delay},
            ],
        }
    }


@pytest.mark.parametrize(
    ("body", "error_class", "retry_ms"),
    [
        (_google_429("generate_requests_per_model", "30s"), E.RATE_LIMITED, 30_000),
        (_google_429("generate_requests_per_model_per_day", "30s"), E.QUOTA, 30_000),
        (_google_429("generate_requests_per_model", "28800s"), E.QUOTA, 28_800_000),
    ],
)
def test_veo_429_is_quota_or_rate_limit(
    body: dict[str, object], error_class: ErrorClass, retry_ms: int
) -> None:
    """429 RESOURCE_EXHAUSTED: per-day metric or long RetryInfo is QUOTA, else RATE_LIMITED."""
    outcome = veo.submit_error(_reply(429, body))
    assert outcome.kind is SubmitKind.REJECTED
    assert outcome.error is not None
    assert outcome.error.error_class is error_class
    assert outcome.error.retry_after_ms == retry_ms


@pytest.mark.parametrize(
    ("status", "canonical", "kind", "error_class"),
    [
        (400, "INVALID_ARGUMENT", SubmitKind.REJECTED, E.INVALID_INPUT),
        (401, "UNAUTHENTICATED", SubmitKind.REJECTED, E.AUTH),
        (403, "PERMISSION_DENIED", SubmitKind.REJECTED, E.PERMISSION),
        (404, "NOT_FOUND", SubmitKind.REJECTED, E.UNSUPPORTED_CAPABILITY),
        (503, "UNAVAILABLE", SubmitKind.REJECTED, E.PROVIDER_OVERLOADED),
        (500, "INTERNAL", SubmitKind.UNKNOWN, E.SUBMISSION_UNKNOWN),
        (504, "DEADLINE_EXCEEDED", SubmitKind.UNKNOWN, E.SUBMISSION_UNKNOWN),
    ],
)
def test_veo_create_http_row(
    status: int, canonical: str, kind: SubmitKind, error_class: ErrorClass
) -> None:
    """google.rpc.Status envelopes on create."""
    body = {"error": {"code": status, "status": canonical, "message": "m"}}
    outcome = veo.submit_error(_reply(status, body))
    assert outcome.kind is kind
    assert outcome.error is not None
    assert outcome.error.error_class is error_class


def test_veo_invalid_api_key_is_auth() -> None:
    """A 400 whose ErrorInfo says API_KEY_INVALID is AUTH, not INVALID_INPUT."""
    body = {
        "error": {
            "code": 400,
            "status": "INVALID_ARGUMENT",
            "message": "key",
            "details": [
                {"@type": "type.googleapis.com/google.rpc.ErrorInfo", "reason": "API_KEY_INVALID"}
            ],
        }
    }
    outcome = veo.submit_error(_reply(400, body))
    assert outcome.error is not None
    assert outcome.error.error_class is E.AUTH


@pytest.mark.parametrize(
    ("raw", "state"),
    [
        ("queued", JobState.QUEUED),
        ("running", JobState.RUNNING),
        ("succeeded", JobState.SUCCEEDED),
        ("failed", JobState.FAILED),
        ("cancelled", JobState.CANCELLED),
        ("paused", JobState.UNRECOGNIZED),
    ],
)
def test_selfhosted_status_row(raw: str, state: JobState) -> None:
    """Each self-hosted status maps to its state; unknown ones are UNRECOGNIZED."""
    job = {"id": "j", "status": raw, "outputs": [], "metrics": {"gpu_seconds": 10.0}}
    status = selfhosted.job_status(job, url_ttl_seconds=0, now=NOW, micros_per_gpu_second=350)
    assert status.state is state
    assert status.raw_status == raw


@pytest.mark.parametrize(
    ("error", "error_class"),
    [
        ({"code": "OOM", "retryable": False}, E.INTERNAL_RETRYABLE),
        ({"code": "WORKER_LOST", "retryable": True}, E.INTERNAL_RETRYABLE),
        ({"code": "TIMEOUT", "retryable": True}, E.INTERNAL_RETRYABLE),
        ({"code": "INVALID_INPUT", "retryable": False}, E.INVALID_INPUT),
        ({"code": "INTERNAL", "retryable": True}, E.INTERNAL_RETRYABLE),
        ({"code": "INTERNAL", "retryable": False}, E.INTERNAL_PERMANENT),
    ],
)
def test_selfhosted_job_error_row(error: dict[str, Any], error_class: ErrorClass) -> None:
    """Job error codes map to classes; INTERNAL follows the server's retryable flag."""
    job = {"status": "failed", "error": {**error, "message": "m"}, "metrics": {"gpu_seconds": 4}}
    status = selfhosted.job_status(job, url_ttl_seconds=0, now=NOW, micros_per_gpu_second=350)
    assert status.failure is not None
    assert status.failure.error_class is error_class
    assert status.actual_cost_micros == 1400


@pytest.mark.parametrize(
    ("status", "kind", "error_class"),
    [
        (400, SubmitKind.REJECTED, E.INVALID_INPUT),
        (401, SubmitKind.REJECTED, E.AUTH),
        (409, SubmitKind.REJECTED, E.INVALID_INPUT),
        (429, SubmitKind.REJECTED, E.RATE_LIMITED),
        (503, SubmitKind.REJECTED, E.PROVIDER_OVERLOADED),
        (500, SubmitKind.UNKNOWN, E.SUBMISSION_UNKNOWN),
        (502, SubmitKind.UNKNOWN, E.SUBMISSION_UNKNOWN),
    ],
)
def test_selfhosted_create_http_row(status: int, kind: SubmitKind, error_class: ErrorClass) -> None:
    """Self-hosted create statuses: 503 + Retry-After overloaded, 409 key mismatch."""
    body = {"error": {"code": "X", "message": "m", "retryable": False}}
    outcome = selfhosted.submit_error(_reply(status, body, {"retry-after": "5"}))
    assert outcome.kind is kind
    assert outcome.error is not None
    assert outcome.error.error_class is error_class
    if status == 503:
        assert outcome.error.retry_after_ms == 5000


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("https://x/v.mp4?exp=1780000000", datetime.fromtimestamp(1780000000, UTC)),
        ("https://x/v.mp4?Expires=1780000000&Signature=s", datetime.fromtimestamp(1780000000, UTC)),
        (
            "https://x/v.mp4?X-Goog-Date=20260601T120000Z&X-Goog-Expires=3600",
            NOW + timedelta(hours=1),
        ),
        ("https://x/v.mp4", NOW + timedelta(seconds=600)),
    ],
)
def test_output_expiry_from_signed_url_or_known_ttl(url: str, expected: datetime) -> None:
    """Expiry is read from the link's signature parameters, else now + the known TTL."""
    assert url_expiry(url, 600, NOW) == expected


@pytest.mark.parametrize(
    ("job", "progress", "position"),
    [
        ({"status": "queued", "progress": 0.0, "queue_position": 3}, 0.0, 2),
        ({"status": "queued", "progress": 0.0, "queue_position": 1}, 0.0, 0),
        ({"status": "queued", "queue_position": 0}, None, None),  # not a 1-based position
        ({"status": "queued", "queue_position": True}, None, None),
        ({"status": "running", "progress": 0.42, "queue_position": 1}, 0.42, None),
        ({"status": "running", "progress": 1.7}, 1.0, None),
    ],
)
def test_selfhosted_progress_and_queue_position_row(
    job: dict[str, Any], progress: float | None, position: int | None
) -> None:
    """The model server's progress is clamped to 0..1 and its 1-based queue position becomes
    JobStatus's 0 = next, only while the job is queued."""
    status = selfhosted.job_status(job, url_ttl_seconds=0, now=NOW, micros_per_gpu_second=350)
    assert (status.progress, status.queue_position) == (progress, position)


@pytest.mark.parametrize(
    ("task", "progress"),
    [
        ({"status": "PENDING"}, None),
        ({"status": "THROTTLED"}, None),
        ({"status": "RUNNING", "progress": 0.35}, 0.35),
        ({"status": "RUNNING"}, None),
    ],
)
def test_runway_progress_row(task: dict[str, Any], progress: float | None) -> None:
    """Runway's progress is read from RUNNING tasks only; Runway reports no queue position."""
    status = runway.task_status(
        {"id": "t", "createdAt": "2026-06-01T12:00:00.000Z", **task}, url_ttl_seconds=0, now=NOW
    )
    assert (status.progress, status.queue_position) == (progress, None)


def test_veo_running_operation_reports_no_progress() -> None:
    """A not-done Veo operation carries no progress and no queue position: none is invented."""
    op = {"name": "models/m/operations/o", "metadata": {"createTime": "2026-06-01T12:00:00Z"}}
    status = veo.operation_status(op, url_ttl_seconds=0, now=NOW)
    assert (status.progress, status.queue_position) == (None, None)
