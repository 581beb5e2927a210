"""Runway inputs from the platform's own object store, through real processes (issue 24).

The store is moto's S3 over TLS (`tests.support.tls_s3`, which also refuses expired presigned
URLs as S3 does); the Runway emulator fetches https inputs at create as Runway does and refuses
the create with 400 when it cannot (``fetch_assets``); the Runway sidecar runs its shipped config
plus ``provider.options.platform_store`` naming that store, as an operator would set it.

* An ``s3://`` input goes through Runway's uploads: the one task Runway created references the
  ``runway://`` URI, and the uploaded bytes are the stored object's.
* A presigned input URL that expired before Runway fetched it is re-signed by the sidecar and the
  create sent once more inside the same attempt: the task succeeds, with exactly one Runway task
  (emulator truth) whose input is a fresh URL of the same object, and one attempt.
"""

from __future__ import annotations

import struct
import uuid
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from adapter_sidecars.emulators.runway import RunwayEmulator
from tests.conftest import PostgresServer
from tests.support.module_stack import module_database
from tests.support.stack import ControlPlane, ProviderFarm, RedisDb, describe, wait_for
from tests.support.tls_s3 import TlsS3, tls_s3
from vidroute.common.v1 import generation_pb2 as gen
from vidroute.scheduler.v1 import scheduler_pb2 as sp
from vidroute.scheduler.v1 import scheduler_service_pb2 as api

pytestmark = [pytest.mark.e2e, pytest.mark.postgres, pytest.mark.redis, pytest.mark.timeout(120)]

TIME_SCALE = 0.02
I2V_MODEL = "gen4.5"


def _png(width: int = 4, height: int = 4) -> bytes:
    """A small valid PNG (solid colour), built by hand: no imaging library needed."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        body = kind + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))

    rows = b"".join(b"\x00" + b"\xc8\x30\x30" * width for _ in range(height))
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(rows))
        + chunk(b"IEND", b"")
    )


@dataclass
class Stack:
    farm: ProviderFarm
    cp: ControlPlane
    store: TlsS3
    bucket: str

    def put_image(self, name: str) -> tuple[str, bytes]:
        key = f"inputs/{uuid.uuid4().hex}/{name}"
        data = _png()
        self.store.client.put_object(
            Bucket=self.bucket, Key=key, Body=data, ContentType="image/png"
        )
        return key, data

    def create_i2v(self, first_frame_uri: str) -> str:
        spec = gen.GenerationSpec(
            tenant_id="acme",
            prompt="the kite rises over the hill",
            mode=gen.MODE_IMAGE_TO_VIDEO,
            first_frame=gen.AssetRef(object_uri=first_frame_uri, mime_type="image/png"),
            output=gen.OutputSpec(width=1280, height=720, duration_ms=4000),
            routing=gen.RoutingPolicy(
                mode=gen.ROUTING_MODE_STRICT_MODEL,
                required_provider="runway",
                required_model=I2V_MODEL,
            ),
        )
        request = api.CreateTaskRequest(spec=spec, idempotency_key=uuid.uuid4().hex)
        return self.cp._call(lambda s: s.CreateTask(request, timeout=30)).task.task_id

    def jobs_with_prompt_image(self) -> list[dict[str, Any]]:
        return [j for j in self.farm.truth("runway") if "promptImage" in j["body"]]


@pytest.fixture(scope="module")
def stack(
    tmp_path_factory: pytest.TempPathFactory,
    postgres_server: PostgresServer,
    redis_server_url: str,
) -> Iterator[Stack]:
    """TLS S3 store, Runway emulator fetching inputs, the shipped sidecar with the store set."""
    workdir: Path = tmp_path_factory.mktemp("runway-inputs")
    with tls_s3(workdir / "pki") as store:
        bucket = store.create_bucket()
        with (
            module_database(postgres_server, "postgresql", workdir) as url,
            ProviderFarm(
                workdir / "farm",
                time_scale=TIME_SCALE,
                providers=("runway",),
                emulator_options={
                    "runway": {"fetch_assets": True, "asset_ca_file": str(store.ca_file)}
                },
                sidecar_options={"runway": {"platform_store": store.store_url(bucket)}},
                sidecar_env=store.env,
            ) as farm,
            RedisDb(redis_server_url) as redis,
        ):
            (workdir / "cp").mkdir()
            cp = ControlPlane(workdir / "cp", farm, database_url=url, redis_url=redis.url)
            cp.start()
            try:
                yield Stack(farm, cp, store, bucket)
            finally:
                cp.kill()


def test_an_input_in_the_platform_store_reaches_runway_through_an_upload(stack: Stack) -> None:
    """An s3:// first frame is uploaded through /v1/uploads; the one task Runway created uses
    the runway:// URI, whose uploaded bytes are the stored object's, and the task succeeds."""
    key, data = stack.put_image("kite.png")
    task_id = stack.create_i2v(f"s3://{stack.bucket}/{key}")
    task = stack.cp.wait_terminal(task_id, timeout_s=60)
    assert task.state == sp.TASK_STATE_SUCCEEDED, describe(task)
    jobs = [
        j
        for j in stack.jobs_with_prompt_image()
        if j["id"] == task.attempts[-1].provider_job.provider_job_id
    ]
    assert len(jobs) == 1, stack.farm.truth("runway")
    images = jobs[0]["body"]["promptImage"]
    uri = images[0]["uri"]
    assert uri.startswith("runway://"), images
    emulator = stack.farm.emulator("runway")
    assert isinstance(emulator.emulator, RunwayEmulator)
    slot = emulator.call(emulator.emulator.uploads.file, uri)
    assert slot is not None
    assert (slot.data, slot.content_type) == (data, "image/png")


def test_an_input_url_that_expired_before_the_fetch_is_re_signed_once(stack: Stack) -> None:
    """A presigned URL that expired before Runway fetched it: Runway refuses the create (400,
    no task), the sidecar re-signs and sends once more; the task succeeds with one attempt and
    exactly one Runway task, whose input is a fresh URL of the same object."""
    key, _ = stack.put_image("dawn.png")
    expired = stack.store.presign(stack.bucket, key, 1)
    with httpx.Client(verify=stack.store.ssl_context()) as storage:
        wait_for(
            lambda: storage.get(expired).status_code == 403,
            timeout_s=10,
            interval_s=0.2,
            what="the presigned URL has expired at the store",
        )
    before = {j["id"] for j in stack.farm.truth("runway")}
    task_id = stack.create_i2v(expired)
    task = stack.cp.wait_terminal(task_id, timeout_s=60)
    assert task.state == sp.TASK_STATE_SUCCEEDED, describe(task)
    assert len(task.attempts) == 1, describe(task)
    created = [j for j in stack.farm.truth("runway") if j["id"] not in before]
    assert [j["id"] for j in created] == [task.attempts[0].provider_job.provider_job_id], created
    sent = created[0]["body"]["promptImage"][0]["uri"]
    assert sent != expired
    assert f"/{stack.bucket}/{key}?" in sent
    with httpx.Client(verify=stack.store.ssl_context()) as storage:
        assert storage.get(sent).status_code == 200
    log = stack.farm.sidecars["runway"].log()
    assert "Runway could not fetch an input (HTTP_400); re-signed, sending once more" in log
