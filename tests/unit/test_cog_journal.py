"""The Cog backend's pure parts: the webhook journal's rules and the reply classification."""

from __future__ import annotations

import base64
from datetime import UTC, datetime
from pathlib import Path

import httpx

from adapter_sidecars.common.transport import HttpReply
from adapter_sidecars.selfhosted import cog_mapping
from adapter_sidecars.selfhosted.cog_journal import PredictionJournal
from vidroute_core.adapter import JobState, SubmitKind
from vidroute_core.errors import ErrorClass

MP4 = b"\x00\x00\x00\x18ftypisom" + b"\x00" * 64
DATA_URL = "data:video/mp4;base64," + base64.b64encode(MP4).decode()
NOW = datetime(2026, 12, 6, tzinfo=UTC)


def _reply(status: int, body: bytes = b"{}", headers: dict[str, str] | None = None) -> HttpReply:
    return HttpReply(status, httpx.Headers(headers or {}), body, NOW)


def test_an_end_is_never_replaced_by_a_late_or_retried_webhook() -> None:
    """A "processing" webhook that arrives after "succeeded" (coglet's retries race) leaves the
    prediction succeeded with its output."""
    journal = PredictionJournal(retention_s=3600)
    journal.accepted("p1", "wan2.2-t2v")
    journal.received("p1", {"id": "p1", "status": "succeeded", "output": DATA_URL})
    journal.received("p1", {"id": "p1", "status": "processing"})
    record = journal.get("p1")
    assert record is not None
    assert record.status == "succeeded"
    assert record.webhooks == 2
    assert journal.output("p1", 0) == ("video/mp4", MP4)


def test_a_restarted_sidecar_replays_webhooks_outputs_and_models(tmp_path: Path) -> None:
    """The file journal keeps acceptance (with its model), the end and the decoded output
    across a restart; the line itself holds a reference, not the video."""
    path = tmp_path / "cog-webhooks.jsonl"
    first = PredictionJournal(retention_s=3600, path=path)
    first.accepted("p2", "wan2.2-t2v")
    first.received("p2", {"id": "p2", "status": "succeeded", "output": [DATA_URL]})
    assert DATA_URL not in path.read_text()
    again = PredictionJournal(retention_s=3600, path=path)
    record = again.get("p2")
    assert record is not None
    assert record.terminal
    assert record.model == "wan2.2-t2v"
    assert again.output("p2", 0) == ("video/mp4", MP4)


def test_outputs_become_http_urls_the_sidecar_serves() -> None:
    """A journal-held output is published as an http URL under the receiver and flagged
    fetch_through_adapter; the raw payload carries the same URL."""
    journal = PredictionJournal(retention_s=3600)
    journal.received("p3", {"id": "p3", "status": "succeeded", "output": DATA_URL})
    record = journal.get("p3")
    assert record is not None
    assert record.payload is not None
    public = cog_mapping.public_payload(record.payload, "http://127.0.0.1:9/cog/outputs")
    snap = cog_mapping.snapshot(public, micros_per_gpu_second=350, output_ttl_s=60, now=NOW)
    (output,) = snap.outputs
    assert output.uri == "http://127.0.0.1:9/cog/outputs/p3/0.mp4"
    assert output.fetch_through_adapter
    assert output.uri in snap.raw_payload_json


def test_failures_are_classified_by_the_predictors_error() -> None:
    """A CUDA out-of-memory error may pass on another try; any other error is permanent."""
    oom = cog_mapping.failure({"error": "CUDA out of memory. Tried to allocate 2.00 GiB"})
    other = cog_mapping.failure({"error": "prediction failed: bad prompt"})
    assert (oom.error_class, oom.code) == (ErrorClass.INTERNAL_RETRYABLE, "OOM")
    assert (other.error_class, other.code) == (ErrorClass.INTERNAL_PERMANENT, "PREDICTION_FAILED")
    snap = cog_mapping.snapshot(
        {"status": "canceled", "metrics": {"predict_time": 2.0}},
        micros_per_gpu_second=350,
        output_ttl_s=60,
        now=NOW,
    )
    assert snap.state is JobState.CANCELLED
    assert snap.actual_cost_micros == 700


def test_a_cancel_that_beat_the_start_reads_cancelled_not_failed() -> None:
    """coglet 0.23 ends a run whose cancel arrived before the predictor's coroutine started as
    ``failed`` with its own CancelationException (this body is what it sent, seen in CI): the
    cancel stopped the run, so it is CANCELLED with no model failure to count."""
    raced = {
        "status": "failed",
        "error": "Prediction failed: Failed to submit coroutine: CancelationException: ",
    }
    snap = cog_mapping.snapshot(raced, micros_per_gpu_second=350, output_ttl_s=60, now=NOW)
    assert snap.state is JobState.CANCELLED
    assert snap.failure is None
    failed = {"status": "failed", "error": "prediction failed: bad prompt"}
    assert (
        cog_mapping.snapshot(failed, micros_per_gpu_second=350, output_ttl_s=60, now=NOW).state
        is JobState.FAILED
    )


def test_put_replies_never_call_a_maybe_started_prediction_rejected() -> None:
    """409 (every slot busy) and 503 (nothing reached the server) are REJECTED and created
    nothing; any other 5xx may have started the run: UNKNOWN; a 202 is ACCEPTED only with the
    key as id."""
    busy = cog_mapping.submit_reply(_reply(409), "k")
    gateway = cog_mapping.submit_reply(_reply(503, headers={"retry-after": "3"}), "k")
    broken = cog_mapping.submit_reply(_reply(500), "k")
    accepted = cog_mapping.submit_reply(_reply(202, b'{"id":"k","status":"starting"}'), "k")
    other_id = cog_mapping.submit_reply(_reply(202, b'{"id":"x","status":"starting"}'), "k")
    assert busy is not None
    assert busy.kind is SubmitKind.REJECTED
    assert busy.error is not None
    assert (busy.error.error_class, busy.error.code) == (
        ErrorClass.PROVIDER_OVERLOADED,
        "NO_CAPACITY",
    )
    assert gateway is not None
    assert gateway.kind is SubmitKind.REJECTED
    assert gateway.error is not None
    assert gateway.error.retry_after_ms == 3000
    assert broken is not None
    assert broken.kind is SubmitKind.UNKNOWN
    assert accepted is not None
    assert accepted.kind is SubmitKind.ACCEPTED
    assert other_id is None
