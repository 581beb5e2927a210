"""Runway inputs from the platform's object store, at the adapter: uploads, re-signing, refusals.

The store is moto's S3 over TLS (`tests.support.tls_s3`, expired presigned URLs refused as on
S3); the Runway emulator fetches https inputs at create like Runway (``fetch_assets``). The
adapter reads the store through boto3's standard credential chain, pointed at dummy keys and
the store's CA here. What Runway received is the emulator's truth.
"""

from __future__ import annotations

import base64
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest
from adapter_support import make_spec, sidecar_config

from adapter_sidecars.common.types import CompileInput, SubmitInput
from adapter_sidecars.emulators.runway import RunwayConfig, RunwayEmulator
from adapter_sidecars.runway.adapter import RunwayAdapter
from tests.support.stack import wait_for
from tests.support.tls_s3 import TlsS3, tls_s3
from vidroute_core.adapter import CompiledPlan, RecoverQuery, RecoveryVerdict, SubmitKind
from vidroute_core.errors import ErrorClass
from vidroute_core.spec import AssetRef, Mode

MODEL = "gen4.5"
PNG = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg=="
)


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TlsS3]:
    with tls_s3(tmp_path_factory.mktemp("store-pki")) as running:
        yield running


@pytest.fixture
def bucket(store: TlsS3, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> str:
    """A fresh bucket; the adapter's boto3 chain sees only dummy keys and the store's CA."""
    for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3"):
        monkeypatch.delenv(name, raising=False)
    for name, value in store.env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "absent-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "absent-credentials"))
    return store.create_bucket()


@pytest.fixture
async def emulator(store: TlsS3) -> AsyncIterator[RunwayEmulator]:
    config = RunwayConfig(
        queued_polls=1,
        running_polls=1,
        fetch_assets=True,
        asset_ca_file=str(store.ca_file),
        extensions=frozenset({"task_listing"}),
    )
    async with RunwayEmulator(config) as emu:
        yield emu


@pytest.fixture
async def adapter(
    emulator: RunwayEmulator, store: TlsS3, bucket: str
) -> AsyncIterator[RunwayAdapter]:
    options = {
        "platform_store": store.store_url(bucket),
        "task_listing": True,
        "recovery_settle_seconds": 0,
    }
    built = RunwayAdapter.from_config(sidecar_config(emulator.url, "RUNWAY_KEY", options=options))
    yield built
    await built.aclose()


def _put(store: TlsS3, bucket: str, data: bytes = PNG, content_type: str = "image/png") -> str:
    key = f"in/{uuid.uuid4().hex}.png"
    store.client.put_object(Bucket=bucket, Key=key, Body=data, ContentType=content_type)
    return key


def _plan(adapter: RunwayAdapter, uri: str) -> CompiledPlan:
    spec = make_spec(
        mode=Mode.IMAGE_TO_VIDEO, first_frame=AssetRef(object_uri=uri, mime_type="image/png")
    )
    return adapter.compile(CompileInput(spec, MODEL, "prod-us"))


async def _submit(adapter: RunwayAdapter, plan: CompiledPlan) -> tuple[SubmitKind, object]:
    outcome = await adapter.submit(SubmitInput(plan, uuid.uuid4().hex))
    return outcome.kind, outcome.error or outcome.job


def _expired(store: TlsS3, bucket: str, key: str) -> str:
    url = store.presign(bucket, key, 1)
    with httpx.Client(verify=store.ssl_context()) as client:
        wait_for(lambda: client.get(url).status_code == 403, timeout_s=10, interval_s=0.2)
    return url


async def test_an_s3_input_compiles_only_with_a_platform_store(
    emulator: RunwayEmulator, adapter: RunwayAdapter, bucket: str
) -> None:
    """With a store the s3:// input stays in the plan (uploaded at Submit); without one, or of
    another bucket, it is REJECT at compile."""
    ours = _plan(adapter, f"s3://{bucket}/in/a.png")
    assert ours.submittable
    assert ours.native_request is not None
    assert ours.native_request["promptImage"][0]["uri"] == f"s3://{bucket}/in/a.png"
    assert not _plan(adapter, "s3://someone-else/in/a.png").submittable
    plain = RunwayAdapter.from_config(sidecar_config(emulator.url, "RUNWAY_KEY"))
    try:
        assert not _plan(plain, f"s3://{bucket}/in/a.png").submittable
    finally:
        await plain.aclose()


async def test_a_missing_object_is_refused_with_nothing_sent(
    emulator: RunwayEmulator, adapter: RunwayAdapter, bucket: str
) -> None:
    """An s3:// input that is not in the store: REJECTED ASSET_UNAVAILABLE, no task, no upload."""
    kind, error = await _submit(adapter, _plan(adapter, f"s3://{bucket}/in/missing.png"))
    assert kind is SubmitKind.REJECTED
    assert getattr(error, "error_class", None) is ErrorClass.ASSET_UNAVAILABLE
    assert getattr(error, "code", None) == "ASSET_NOT_FOUND"
    assert emulator.truth() == []


async def test_a_stored_file_that_is_no_image_is_refused_by_the_upload(
    emulator: RunwayEmulator, adapter: RunwayAdapter, store: TlsS3, bucket: str
) -> None:
    """Runway's upload takes images and videos only: a text file is ASSET_INVALID, no task."""
    key = _put(store, bucket, b"not an image", "text/plain")
    kind, error = await _submit(adapter, _plan(adapter, f"s3://{bucket}/{key}"))
    assert kind is SubmitKind.REJECTED
    assert getattr(error, "error_class", None) is ErrorClass.ASSET_INVALID
    assert emulator.truth() == []


async def test_an_expired_url_of_another_host_is_refused_without_a_second_send(
    emulator: RunwayEmulator, store: TlsS3, bucket: str
) -> None:
    """Without the store configured nothing can repair an expired URL: Runway's fetch refusal
    is the outcome (REJECTED ASSET_UNAVAILABLE, no task), and the fresh-signature path is off."""
    url = _expired(store, bucket, _put(store, bucket))
    plain = RunwayAdapter.from_config(sidecar_config(emulator.url, "RUNWAY_KEY"))
    try:
        kind, error = await _submit(plain, _plan(plain, url))
    finally:
        await plain.aclose()
    assert kind is SubmitKind.REJECTED
    assert getattr(error, "error_class", None) is ErrorClass.ASSET_UNAVAILABLE
    assert emulator.truth() == []


async def test_a_re_signed_url_that_still_fails_is_refused_once_more_and_not_again(
    emulator: RunwayEmulator, adapter: RunwayAdapter, store: TlsS3, bucket: str
) -> None:
    """The object is gone: the expired URL is re-signed and sent once more, Runway cannot fetch
    that either (404), and Submit answers the refusal: no task, no third send."""
    key = _put(store, bucket)
    url = _expired(store, bucket, key)
    store.client.delete_object(Bucket=bucket, Key=key)
    kind, error = await _submit(adapter, _plan(adapter, url))
    assert kind is SubmitKind.REJECTED
    assert getattr(error, "error_class", None) is ErrorClass.ASSET_UNAVAILABLE
    assert "HTTP 404" in str(getattr(error, "message", ""))
    assert emulator.truth() == []


async def test_recovery_finds_the_task_of_an_uploaded_input(
    emulator: RunwayEmulator, adapter: RunwayAdapter, store: TlsS3, bucket: str
) -> None:
    """Runway recorded the runway:// URI, not the plan's s3:// one: the listing search compares
    the requests without their image URIs and finds the one task."""
    plan = _plan(adapter, f"s3://{bucket}/{_put(store, bucket)}")
    started = datetime.now(UTC)
    kind, job = await _submit(adapter, plan)
    assert kind is SubmitKind.ACCEPTED
    query = RecoverQuery(
        "prod-us",
        MODEL,
        "k",
        submitted_after=started - timedelta(seconds=1),
        submitted_before=datetime.now(UTC),
        plan=plan,
    )
    found = await adapter.recover_submission(query)
    assert found.verdict is RecoveryVerdict.FOUND, found
    assert found.job is not None
    assert found.job.provider_job_id == getattr(job, "provider_job_id", None)
    other = _plan(adapter, f"s3://{bucket}/{_put(store, bucket)}")
    changed = replace(
        other,
        native_request={**(other.native_request or {}), "promptText": "something else"},
    )
    # A window that has settled (sent over 2 s ago, submit_read 1 s): absence is conclusive.
    settled = replace(
        query, plan=changed, submitted_before=datetime.now(UTC) - timedelta(seconds=2)
    )
    missing = await adapter.recover_submission(settled)
    assert missing.verdict is RecoveryVerdict.NOT_FOUND, missing


async def test_an_input_on_a_private_host_is_downloaded_and_uploaded(
    emulator: RunwayEmulator, store: TlsS3, bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A URL on a host named in private_input_hosts (Runway cannot reach it) is fetched by the
    sidecar and sent through the uploads: the task names the runway:// URI of those bytes."""
    monkeypatch.setenv("SSL_CERT_FILE", str(store.ca_file))  # the sidecar trusts the host's CA
    key = _put(store, bucket)
    options = {"private_input_hosts": ["localhost"]}
    private = RunwayAdapter.from_config(sidecar_config(emulator.url, "RUNWAY_KEY", options=options))
    try:
        kind, job = await _submit(private, _plan(private, store.presign(bucket, key, 600)))
    finally:
        await private.aclose()
    assert kind is SubmitKind.ACCEPTED, job
    [task] = emulator.truth()
    uri = task["body"]["promptImage"][0]["uri"]
    assert uri.startswith("runway://")
    slot = emulator.uploads.file(uri)
    assert slot is not None
    assert (slot.data, slot.content_type) == (PNG, "image/png")
