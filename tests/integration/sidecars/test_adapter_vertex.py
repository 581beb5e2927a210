"""The Vertex AI Veo adapter against the Veo emulator over real HTTP: OAuth tokens from a
service-account key (cached, refreshed before expiry, dropped on 401), Vertex error shapes,
gs:// outputs only from the account's bucket, recovery without a listing, and one sidecar
serving Gemini-API and Vertex accounts side by side."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from adapter_support import make_spec

from adapter_sidecars.common.config import ConfigError, parse_config
from adapter_sidecars.common.types import (
    CompileInput,
    FetchOutputInput,
    InvalidRequest,
    SubmitInput,
    UnknownAccount,
)
from adapter_sidecars.emulators import VeoConfig, VeoEmulator
from adapter_sidecars.veo import oauth
from adapter_sidecars.veo.adapter import VeoAdapter
from adapter_sidecars.veo.surfaces import VeoSurfaces, build_adapter
from adapter_sidecars.veo.vertex import NO_SEARCH, VertexAdapter
from tests.support.service_account import ServiceAccount, new_service_account
from vidroute_core.adapter import JobRef, JobState, RecoverQuery, RecoveryVerdict, SubmitKind
from vidroute_core.errors import ErrorClass

pytestmark = pytest.mark.timeout(60)

MODEL = "veo-3.1-generate-001"
BUCKET = "vidroute-it-out"
SUBMIT = "POST /v1/projects/*/models/*:predictLongRunning"
POLL = "POST /v1/projects/*/models/*:fetchPredictOperation"


def vertex_account(key_path: Path, name: str = "vx-us", **options: Any) -> dict[str, Any]:
    return {
        "name": name,
        "region": "us-central1",
        "credential_ref": f"file:{key_path}",
        "options": {
            "surface": "vertex",
            "project": "proj-it",
            "output_uri": f"gs://{BUCKET}/runs",
            **options,
        },
    }


def config_for(base_url: str, accounts: list[dict[str, Any]], storage: str = "") -> Any:
    options: dict[str, Any] = {"recovery_settle_seconds": 0}
    if storage:
        options["storage_base_url"] = storage
    return parse_config(
        {
            "provider": {"base_url": base_url, "options": options},
            "timeouts": {"connect": 1, "write": 2, "read": 2, "submit_read": 1, "pool": 1},
            "accounts": accounts,
        },
        {"GEMINI_KEY": "AIza-it"},
    )


@dataclass
class Vertex:
    emulator: VeoEmulator
    account: ServiceAccount
    key_path: Path
    adapter: VertexAdapter


@pytest.fixture
async def vertex(tmp_path: Path) -> AsyncIterator[Vertex]:
    """A Veo emulator knowing one service account, and a Vertex adapter with its key file."""
    account = new_service_account("it")
    config = VeoConfig(
        queued_polls=1, running_polls=1, service_accounts={account.email: account.public_pem}
    )
    async with VeoEmulator(config) as emu:
        key = account.write(tmp_path / "sa.json", f"{emu.url}/token")
        adapter = build_adapter(config_for(emu.url, [vertex_account(key)], storage=emu.url))
        assert isinstance(adapter, VertexAdapter)
        yield Vertex(emu, account, key, adapter)
        await adapter.aclose()


async def _accepted(v: Vertex, key: str = "att-1") -> JobRef:
    plan = v.adapter.compile(CompileInput(make_spec(duration_ms=4000), MODEL, "vx-us"))
    outcome = await v.adapter.submit(SubmitInput(plan, key))
    assert outcome.kind is SubmitKind.ACCEPTED, outcome
    assert outcome.job is not None
    return outcome.job


async def _succeeded(v: Vertex, job: JobRef) -> Any:
    for _ in range(6):
        result = await v.adapter.get_job(job)
        assert result.snapshot is not None, result.error
        if result.snapshot.state.terminal:
            return result.snapshot
    raise AssertionError("not terminal after 6 polls")


async def test_token_is_cached_shared_and_refreshed_before_expiry(vertex: Vertex) -> None:
    """Concurrent callers share one exchange; the token is reused until REFRESH_MARGIN_S before
    its expiry, then a new assertion is exchanged for a new token."""
    now = [1000.0]
    async with httpx.AsyncClient() as client:
        tokens = oauth.TokenSource(client, clock=lambda: now[0])
        account = vertex.adapter.account("vx-us")
        first = await asyncio.gather(*(tokens.token(account) for _ in range(5)))
        assert len(set(first)) == 1
        assert tokens.exchanges == {"vx-us": 1}
        now[0] += 3600 - oauth.REFRESH_MARGIN_S - 2  # the emulator says expires_in 3599
        assert await tokens.token(account) == first[0]
        now[0] += 2
        fresh = await tokens.token(account)
    assert fresh != first[0]
    assert isinstance(fresh, str)
    assert fresh.startswith("ya29.emu-")
    assert tokens.exchanges == {"vx-us": 2}


async def test_submit_poll_fetch_with_labels(vertex: Vertex) -> None:
    """One operation, labelled with the attempt key; its gs:// output is flagged for the
    adapter and FetchOutput streams the bucket object's MP4 bytes."""
    job = await _accepted(vertex, "Att/Upper:Key")
    snapshot = await _succeeded(vertex, job)
    assert snapshot.state is JobState.SUCCEEDED
    [output] = snapshot.outputs
    assert output.uri.startswith(f"gs://{BUCKET}/runs/")
    assert output.fetch_through_adapter
    [truth] = vertex.emulator.truth()
    assert truth["body"]["labels"]["vidroute-request-key"].startswith("att-upper-key-")
    body = b""
    async for part in vertex.adapter.fetch_output(FetchOutputInput(job, output.uri)):
        assert part.error is None, part.error
        body += part.data
    assert body[4:8] == b"ftyp"


async def test_fetch_output_reads_only_the_accounts_bucket(vertex: Vertex) -> None:
    """Another bucket, an https URL or a bucket-less gs:// URI is refused before any request."""
    job = JobRef("projects/p/locations/l/publishers/google/models/m/operations/1", "vx-us")
    for uri in (
        "gs://someone-elses-bucket/secret.mp4",
        f"https://storage.googleapis.com/{BUCKET}/runs/a.mp4",
        f"gs://{BUCKET}",
    ):
        with pytest.raises(InvalidRequest):
            async for _ in vertex.adapter.fetch_output(FetchOutputInput(job, uri)):
                pass
    assert not any(route.startswith("GET /storage/") for route in vertex.emulator.counters)


async def test_unknown_key_is_rejected_with_nothing_sent(vertex: Vertex, tmp_path: Path) -> None:
    """A key the token endpoint refuses makes Submit REJECTED (AUTH): Vertex saw nothing."""
    stranger = new_service_account("stranger")
    key = stranger.write(tmp_path / "stranger.json", f"{vertex.emulator.url}/token")
    adapter = build_adapter(
        config_for(vertex.emulator.url, [vertex_account(key)], storage=vertex.emulator.url)
    )
    try:
        plan = adapter.compile(CompileInput(make_spec(duration_ms=4000), MODEL, "vx-us"))
        outcome = await adapter.submit(SubmitInput(plan, "att-2"))
        assert await adapter.probe() is False
    finally:
        await adapter.aclose()
    assert outcome.kind is SubmitKind.REJECTED
    assert outcome.error is not None
    assert outcome.error.error_class is ErrorClass.AUTH
    assert outcome.error.code == "INVALID_GRANT"
    assert vertex.emulator.truth() == []


async def test_401_drops_the_cached_token(vertex: Vertex) -> None:
    """A poll answered 401 (a revoked token) is AUTH and the next call exchanges a new token."""
    job = await _accepted(vertex)
    vertex.emulator.add_faults({"route": POLL, "action": "status", "code": 401})
    refused = await vertex.adapter.get_job(job)
    assert refused.error is not None
    assert refused.error.error_class is ErrorClass.AUTH
    assert (await vertex.adapter.get_job(job)).snapshot is not None
    assert vertex.adapter.tokens.exchanges == {"vx-us": 2}


@pytest.mark.parametrize(
    ("code", "expected"),
    [
        (403, ErrorClass.PERMISSION),
        (429, ErrorClass.RATE_LIMITED),
        (400, ErrorClass.INVALID_INPUT),
        (503, ErrorClass.PROVIDER_OVERLOADED),
    ],
)
async def test_vertex_status_errors_are_normalised(
    vertex: Vertex, code: int, expected: ErrorClass
) -> None:
    """google.rpc.Status answers on create map to our classes; none created an operation."""
    vertex.emulator.add_faults({"route": SUBMIT, "action": "status", "code": code})
    plan = vertex.adapter.compile(CompileInput(make_spec(duration_ms=4000), MODEL, "vx-us"))
    outcome = await vertex.adapter.submit(SubmitInput(plan, "att-3"))
    assert outcome.kind is SubmitKind.REJECTED, outcome
    assert outcome.error is not None
    assert outcome.error.error_class is expected
    assert vertex.emulator.truth() == []


async def test_a_daily_vertex_quota_is_quota(vertex: Vertex) -> None:
    """Vertex names its quota only in the message: a per-day metric is QUOTA (not worth a retry
    today), the per-minute one RATE_LIMITED."""
    plan = vertex.adapter.compile(CompileInput(make_spec(duration_ms=4000), MODEL, "vx-us"))
    classes = []
    for per in ("day", "minute"):
        vertex.emulator.add_faults({"route": SUBMIT, "action": "status", "code": 429, "quota": per})
        outcome = await vertex.adapter.submit(SubmitInput(plan, f"att-{per}"))
        assert outcome.error is not None
        classes.append(outcome.error.error_class)
    assert classes == [ErrorClass.QUOTA, ErrorClass.RATE_LIMITED]


async def test_recovery_says_it_cannot_search(vertex: Vertex) -> None:
    """Vertex lists no operations: RecoverSubmission is INCONCLUSIVE and names why."""
    plan = vertex.adapter.compile(CompileInput(make_spec(duration_ms=4000), MODEL, "vx-us"))
    result = await vertex.adapter.recover_submission(
        RecoverQuery(account="vx-us", model=MODEL, client_request_key="att-4", plan=plan)
    )
    assert result.verdict is RecoveryVerdict.INCONCLUSIVE
    assert result.method == NO_SEARCH
    entries = vertex.adapter.describe().capabilities
    assert entries
    assert not any(
        c.operations.task_search or c.operations.client_idempotency_key or c.operations.callback
        for c in entries
    )


async def test_one_sidecar_serves_both_surfaces(vertex: Vertex) -> None:
    """Gemini and Vertex accounts in one config: each compiles and submits on its own surface,
    Describe lists both surfaces' entries, an unknown account is refused."""
    accounts = [
        {"name": "gem", "region": "us", "credential_ref": "env:GEMINI_KEY"},
        vertex_account(vertex.key_path),
    ]
    url = vertex.emulator.url
    adapter = build_adapter(config_for(url, accounts, storage=url))
    assert isinstance(adapter, VeoSurfaces)
    try:
        models = {(c.account, c.model) for c in adapter.describe().capabilities}
        assert ("gem", "veo-3.1-generate-preview") in models
        assert ("vx-us", MODEL) in models
        gemini = adapter.compile(
            CompileInput(make_spec(duration_ms=4000), "veo-3.1-generate-preview", "gem")
        )
        vplan = adapter.compile(CompileInput(make_spec(duration_ms=4000), MODEL, "vx-us"))
        assert gemini.endpoint.startswith("POST /v1beta/models/")
        assert vplan.endpoint.startswith("POST /v1/projects/proj-it/locations/us-central1/")
        for plan in (gemini, vplan):
            outcome = await adapter.submit(SubmitInput(plan, f"att-{plan.account}"))
            assert outcome.kind is SubmitKind.ACCEPTED, outcome
        with pytest.raises(UnknownAccount):
            adapter.compile(CompileInput(make_spec(duration_ms=4000), MODEL, "nobody"))
    finally:
        await adapter.aclose()
    assert len(vertex.emulator.truth()) == 2


def test_regional_hosts_on_google(tmp_path: Path) -> None:
    """On Google's base URL each account talks to its location's host (global: no prefix),
    unless it names an endpoint."""
    key = tmp_path / "unused.json"
    accounts = [
        vertex_account(key, "us"),
        vertex_account(key, "glob", location="global"),
        vertex_account(key, "psc", endpoint="https://vertex.internal.example"),
    ]
    adapter = VertexAdapter.from_config(config_for("https://aiplatform.googleapis.com", accounts))
    hosts = {name: adapter.host(adapter.account(name)) for name in ("us", "glob", "psc")}
    assert hosts == {
        "us": "https://us-central1-aiplatform.googleapis.com",
        "glob": "https://aiplatform.googleapis.com",
        "psc": "https://vertex.internal.example",
    }
    assert adapter.storage_url == "https://storage.googleapis.com"


async def test_token_endpoint_down_is_a_retryable_rejection(vertex: Vertex) -> None:
    """A token endpoint answering 503 makes Submit REJECTED with TRANSIENT_NETWORK (nothing
    reached Vertex, so a retry is safe); the next Submit gets a token and is ACCEPTED."""
    vertex.emulator.add_faults({"route": "POST /token", "action": "status", "code": 503})
    plan = vertex.adapter.compile(CompileInput(make_spec(duration_ms=4000), MODEL, "vx-us"))
    refused = await vertex.adapter.submit(SubmitInput(plan, "att-5"))
    assert refused.kind is SubmitKind.REJECTED
    assert refused.error is not None
    assert refused.error.error_class is ErrorClass.TRANSIENT_NETWORK
    assert vertex.emulator.truth() == []
    accepted = await vertex.adapter.submit(SubmitInput(plan, "att-6"))
    assert accepted.kind is SubmitKind.ACCEPTED


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"project": ""}, "project and location"),
        ({"output_uri": "s3://bucket/x"}, "output_uri must be gs://"),
        ({"endpoint": "ftp://x"}, "endpoint must be an http"),
        ({"surface": "bard"}, "surface must be gemini or vertex"),
    ],
)
def test_bad_vertex_accounts_are_refused_at_start(
    tmp_path: Path, options: dict[str, str], message: str
) -> None:
    """A Vertex account without a project, with a non-gs output URI, a non-http endpoint, or
    an unknown surface stops the sidecar at start with the account named."""
    account = vertex_account(tmp_path / "k.json", **options)
    with pytest.raises(ConfigError, match=message):
        build_adapter(config_for("http://127.0.0.1:9", [account]))


def test_submit_budget_covers_the_token_exchange(tmp_path: Path) -> None:
    """Submit may exchange a token before the create call: Describe's budget (from which the
    control plane derives its Submit deadline) holds one more plain call than Gemini's."""
    config = config_for("http://127.0.0.1:9", [vertex_account(tmp_path / "k.json")])
    vertex_budget = VertexAdapter.from_config(config).describe().submit_budget_s
    gemini_budget = VeoAdapter.from_config(config).describe().submit_budget_s
    t = config.timeouts
    assert vertex_budget == gemini_budget + t.pool + t.connect + t.write + t.read
