"""A sidecar's metrics: provider HTTP calls by route template and status, Submit outcomes.

Route labels must stay bounded: job ids, operation names and file names in a provider path are
folded to ``{id}`` (9.24: never an id as a label).
"""

from __future__ import annotations

import httpx
import pytest

from adapter_sidecars.common.metrics import SidecarMetrics, route_template
from vidroute_core.adapter import SubmitKind, SubmitOutcome
from vidroute_core.errors import ErrorClass, make_error

FORBIDDEN = {"task_id", "attempt_id", "job_id", "provider_job_id", "client_request_key"}


@pytest.mark.parametrize(
    ("path", "template"),
    [
        ("/v1/tasks", "/v1/tasks"),
        ("/v1/tasks/7c1e4b8a-52d4-4f6e-9d0c-1f7a2b3c4d5e", "/v1/tasks/{id}"),
        ("/v1/jobs/job-42", "/v1/jobs/{id}"),
        ("/v1/organization/usage", "/v1/organization/usage"),
        ("/v1beta/models/veo-3.0-generate-001:predictLongRunning",
         "/v1beta/models/veo-3.0-generate-001:predictLongRunning"),
        ("/v1beta/models/veo-3/operations/abc123xyz", "/v1beta/models/veo-3/operations/{id}"),
        ("/outputs/9f8e7d6c5b4a39281706f5e4d3c2b1a0.mp4", "/outputs/{id}"),
        ("/media/12345/clip.mp4", "/media/{id}/{id}"),
    ],
)  # fmt: skip
def test_route_templates_fold_ids(path: str, template: str) -> None:
    assert route_template(path) == template


@pytest.mark.asyncio
async def test_instrumented_client_counts_calls_by_route_and_status() -> None:
    def reply(request: httpx.Request) -> httpx.Response:
        return httpx.Response(404 if request.url.path.endswith("missing") else 200, json={})

    metrics = SidecarMetrics("runway")
    async with httpx.AsyncClient(
        transport=httpx.MockTransport(reply), base_url="http://provider"
    ) as client:
        metrics.instrument(client)
        await client.get("/v1/tasks/11111111-2222-3333-4444-555555555555")
        await client.get("/v1/tasks/66666666-7777-8888-9999-000000000000")
        await client.get("/v1/tasks/missing")
    calls = metrics.http_requests
    assert calls.labels("runway", "GET", "/v1/tasks/{id}", "200")._value.get() == 2
    assert calls.labels("runway", "GET", "/v1/tasks/{id}", "404")._value.get() == 1
    for family in metrics.registry.collect():
        for sample in family.samples:
            assert not set(sample.labels) & FORBIDDEN
            assert "5555" not in sample.labels.get("route", "")


def test_submit_outcomes_by_kind_and_class() -> None:
    metrics = SidecarMetrics("google")
    metrics.submitted(SubmitOutcome(SubmitKind.ACCEPTED), 0.2)
    error = make_error(ErrorClass.TRANSIENT_NETWORK, "TIMEOUT", "read timed out")
    metrics.submitted(SubmitOutcome(SubmitKind.UNKNOWN, error=error), 5.0)
    assert metrics.submits.labels("google", "ACCEPTED", "")._value.get() == 1
    assert metrics.submits.labels("google", "UNKNOWN", "TRANSIENT_NETWORK")._value.get() == 1
