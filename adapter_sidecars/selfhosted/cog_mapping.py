"""Cog prediction payloads and replies, normalized (provider-apis.md §3.5).

Statuses: ``starting`` (accepted, not running yet) is QUEUED, ``processing`` RUNNING,
``succeeded`` / ``failed`` / ``canceled`` the three ends. A failed prediction carries only the
predictor's error text: an out-of-memory one (CUDA/torch wording) may pass on another try
(INTERNAL_RETRYABLE, code OOM, design 9.21), any other is the predictor's own verdict on this
request (INTERNAL_PERMANENT, code PREDICTION_FAILED). A cancel that lands before coglet has
started the predictor's coroutine ends the prediction ``failed`` with coglet's own
``CancelationException`` (coglet 0.23: "Failed to submit coroutine: CancelationException"): the
cancel stopped it, so it reads CANCELLED, never a model failure. Cost is
``metrics.predict_time`` GPU seconds x the capability's micros per GPU second.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from datetime import datetime, timedelta
from math import isfinite
from typing import Any

import httpx

from adapter_sidecars.common.base import with_raw
from adapter_sidecars.common.jobs import map_state
from adapter_sidecars.common.transport import (
    HttpReply,
    rejected,
    retry_after_ms,
    unknown_outcome,
)
from vidroute_core.adapter import (
    JobOutput,
    JobSnapshot,
    JobState,
    ModelLoad,
    SubmitKind,
    SubmitOutcome,
    TransportStage,
)
from vidroute_core.capabilities.loader import Capability
from vidroute_core.errors import ErrorClass, ProviderError, classify_http_status, make_error

STATUS: Mapping[str, JobState] = {
    "starting": JobState.QUEUED,
    "processing": JobState.RUNNING,
    "succeeded": JobState.SUCCEEDED,
    "failed": JobState.FAILED,
    "canceled": JobState.CANCELLED,
}
_OOM_WORDS = ("out of memory", "outofmemoryerror", "cuda oom")
#: The exception coglet raises into a run to cancel it; a run it ends is a cancelled one.
CANCELLED_BY_COG = "CancelationException"
#: 503 never comes from coglet (it answers 409 when busy) but from what fronts it (a Service or
#: ingress with no ready endpoint): the request did not reach the model server.
NOT_CREATED_5XX = frozenset({503})
#: The code of a poll whose prediction can no longer be running and whose end never arrived.
OUTCOME_LOST = "JOB_NOT_FOUND"


def predict_time(payload: Mapping[str, Any]) -> float:
    """``metrics.predict_time`` in seconds (0 when absent or not a finite number)."""
    metrics = payload.get("metrics")
    value = metrics.get("predict_time") if isinstance(metrics, dict) else None
    if isinstance(value, bool) or not isinstance(value, int | float) or not isfinite(value):
        return 0.0
    return max(0.0, float(value))


def failure(payload: Mapping[str, Any]) -> ProviderError:
    """The error of a ``failed`` prediction."""
    message = str(payload.get("error") or "prediction failed")
    if any(word in message.lower() for word in _OOM_WORDS):
        return make_error(ErrorClass.INTERNAL_RETRYABLE, "OOM", message)
    return make_error(ErrorClass.INTERNAL_PERMANENT, "PREDICTION_FAILED", message)


def snapshot(
    payload: Mapping[str, Any], *, micros_per_gpu_second: int, output_ttl_s: float, now: datetime
) -> JobSnapshot:
    """One journaled webhook body (outputs already made public, `public_payload`) as a job
    status; the raw payload is that body."""
    raw = str(payload.get("status", ""))
    state = map_state(raw, STATUS)
    if state is JobState.FAILED and CANCELLED_BY_COG in str(payload.get("error") or ""):
        state = JobState.CANCELLED
    cost = None
    if state.terminal and "metrics" in payload:
        cost = round(predict_time(payload) * micros_per_gpu_second)
    outputs: tuple[JobOutput, ...] = ()
    if state is JobState.SUCCEEDED:
        items = payload.get("output")
        expires = now + timedelta(seconds=output_ttl_s)
        outputs = tuple(
            _output(item, expires)
            for item in (items if isinstance(items, list) else [items])
            if isinstance(item, str) and item
        )
    status = JobSnapshot(
        state,
        raw,
        outputs=outputs,
        failure=failure(payload) if state is JobState.FAILED else None,
        actual_cost_micros=cost,
        currency="USD" if cost is not None else "",
    )
    return with_raw(status, payload)


def public_payload(payload: Mapping[str, Any], outputs_url: str) -> dict[str, Any]:
    """The payload with each journal-held output (``cog://id/output/n#mime``) as its URL under
    `outputs_url` (``.../cog/outputs/id/n.ext``): the control plane stores only http(s)
    locators, and FetchOutput reads the bytes back from the journal."""
    body = dict(payload)
    output = body.get("output")
    if output is None:
        return body
    items = [
        _public(item, outputs_url) for item in (output if isinstance(output, list) else [output])
    ]
    body["output"] = items if isinstance(output, list) else items[0]
    return body


def _public(item: Any, outputs_url: str) -> Any:
    if not isinstance(item, str) or not item.startswith("cog://"):
        return item
    ref, _, mime = item.removeprefix("cog://").partition("#")
    prediction_id, _, index = ref.partition("/output/")
    return f"{outputs_url}/{prediction_id}/{index}{_EXTENSIONS.get(mime, '')}"


_EXTENSIONS = {
    "video/mp4": ".mp4",
    "image/png": ".png",
    "image/webp": ".webp",
    "video/webm": ".webm",
}
#: ``.../cog/outputs/<prediction id>/<index>[.ext]``: an output the journal holds.
OUTPUT_PATH = re.compile(r".*/cog/outputs/([A-Za-z0-9._:-]{1,200})/(\d+)(\.[a-z0-9]+)?")


def _output(item: str, expires: datetime) -> JobOutput:
    match = OUTPUT_PATH.fullmatch(httpx.URL(item).path) if item.startswith("http") else None
    if match is not None:  # held in the journal: only this sidecar can serve it
        suffix = match.group(3) or ""
        mime = next((m for m, ext in _EXTENSIONS.items() if ext == suffix), "")
        return JobOutput(item, mime, expires, fetch_through_adapter=True)
    return JobOutput(item, "video/mp4" if item.endswith(".mp4") else "")


def http_error(reply: HttpReply) -> ProviderError:
    """A non-2xx reply that created nothing (any call but a PUT, or a PUT's 4xx / 503)."""
    error_class = classify_http_status(reply.status, provider_contract_says_not_created=True)
    if reply.status == 503:
        error_class = ErrorClass.PROVIDER_OVERLOADED
    return make_error(
        error_class,
        f"HTTP_{reply.status}",
        f"HTTP {reply.status} from the Cog server",
        retry_after_ms=retry_after_ms(reply.headers),
        raw_status_code=reply.status,
    )


def submit_reply(reply: HttpReply, key: str) -> SubmitOutcome | None:
    """Classify the answer to ``PUT /predictions/{key}``; None: a 2xx without a usable body."""
    if reply.status == 409:
        error = make_error(
            ErrorClass.PROVIDER_OVERLOADED,
            "NO_CAPACITY",
            "every prediction slot of the Cog server is busy; nothing was started",
            raw_status_code=409,
        )
        return rejected(error, reply.started_at)
    if reply.status in {400, 422}:
        body = reply.json()
        detail = body.get("detail") if isinstance(body, dict) else None
        error = make_error(
            ErrorClass.INVALID_INPUT,
            f"HTTP_{reply.status}",
            str(detail or "the model refused the input"),
            raw_status_code=reply.status,
        )
        return rejected(error, reply.started_at)
    if reply.status >= 500 and reply.status not in NOT_CREATED_5XX:
        return unknown_outcome(
            TransportStage.NONE,
            f"HTTP {reply.status} on PUT; the prediction may have started",
            reply.started_at,
            raw_status_code=reply.status,
        )
    if not reply.ok:
        return rejected(http_error(reply), reply.started_at)
    body = reply.json()
    if not isinstance(body, dict) or body.get("id") != key:
        return None
    status = str(body.get("status", ""))
    if status == "failed" and "setup" in str(body.get("error", "")).lower():
        error = make_error(
            ErrorClass.PROVIDER_OVERLOADED,
            "NOT_READY",
            str(body.get("error")),
            raw_status_code=reply.status,
        )
        return rejected(error, reply.started_at)
    return SubmitOutcome(
        SubmitKind.ACCEPTED, raw_status=status, request_started_at=reply.started_at
    )


def outcome_lost(prediction_id: str, health: str) -> ProviderError:
    """The prediction cannot be running any more and no terminal webhook arrived."""
    return make_error(
        ErrorClass.INTERNAL_RETRYABLE,
        OUTCOME_LOST,
        f"prediction {prediction_id} is no longer running (server {health or 'unknown'}) and "
        "its terminal webhook never arrived",
    )


def model_load(model: str, health: str, cap: Capability) -> ModelLoad:
    """A capability model's load from ``/health-check``: one slot, warm once set up."""
    warm = health in ("READY", "BUSY")
    cold = float(cap.self_hosted.cold_start_seconds) if cap.self_hosted else 0.0
    return ModelLoad(
        model=model,
        queue_length=1 if health == "BUSY" else 0,
        warm=warm,
        cold_start_s=0.0 if warm else cold,
        gpu_utilization=1.0 if health == "BUSY" else 0.0,
        available_slots=1 if health == "READY" else 0,
        ready_replicas=1 if warm else 0,
    )
