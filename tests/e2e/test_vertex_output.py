"""A Veo task on Vertex AI end to end: the control plane process, the real Veo sidecar process
configured from its shipped Vertex config (a service-account key file as credential), and the
Veo emulator standing in for Vertex, Google's OAuth 2 token endpoint and Cloud Storage.

The sidecar obtains its access token with a signed assertion the emulator verifies, the
operation writes its video to ``gs://`` under the account's ``output_uri``, and the control
plane stores it by streaming it through the sidecar's FetchOutput from the Cloud Storage JSON
API: the stored bytes are the bucket object's, read here independently with google-auth's own
service-account credentials.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
import yaml
from google.auth.transport.requests import AuthorizedSession
from google.oauth2 import service_account

from adapter_sidecars.emulators.veo import VeoConfig, VeoEmulator
from tests.support.service_account import ServiceAccount, new_service_account
from tests.support.stack import (
    CALLBACK_SECRET,
    DEFAULT_TIME_SCALE,
    JOB_QUEUE_S,
    JOB_RUN_S,
    ROOT,
    ControlPlane,
    ProviderFarm,
    ProviderSetup,
    RedisDb,
    describe,
    local_path,
)
from vidroute.scheduler.v1 import scheduler_pb2 as sp
from vidroute_core.cloud_labels import ACCOUNT_LABEL as LABEL_ACCOUNT
from vidroute_core.cloud_labels import ATTEMPT_LABEL as LABEL_KEY
from vidroute_core.cloud_labels import label_value

pytestmark = [pytest.mark.timeout(240), pytest.mark.postgres]

SHIPPED = ROOT / "adapter_sidecars" / "veo" / "config.vertex.example.yaml"
MODEL = "veo-3.1-generate-001"
SCOPE = "https://www.googleapis.com/auth/cloud-platform"


def vertex_setup(account: ServiceAccount) -> ProviderSetup:
    """The google provider as Veo on Vertex AI: an emulator that knows the service account's
    public key, and the shipped Vertex sidecar config with the emulator's URLs and the key file."""

    def emulator(scale: float, extensions: frozenset[str]) -> VeoEmulator:
        return VeoEmulator(
            VeoConfig(
                advance="time",
                queue_s=JOB_QUEUE_S * scale,
                run_s=JOB_RUN_S * scale,
                token_ttl_s=3600.0 * scale,
                callback_secret=CALLBACK_SECRET,
                service_accounts={account.email: account.public_pem},
                extensions=extensions,
            )
        )

    def sidecar_config(url: str, workdir: Path) -> dict[str, Any]:
        config: dict[str, Any] = yaml.safe_load(SHIPPED.read_text(encoding="utf-8"))
        config["listen"] = "127.0.0.1:0"
        config["provider"]["base_url"] = url
        config["provider"]["options"]["storage_base_url"] = url
        key = account.write(workdir / "vertex-sa.json", f"{url}/token")
        config["accounts"][0]["credential_ref"] = f"file:{key}"
        return config

    return ProviderSetup(emulator, sidecar_config)


@pytest.fixture
def stack(
    tmp_path: Path, fresh_postgres_url: str, redis_db: RedisDb
) -> Iterator[tuple[ControlPlane, ProviderFarm, ServiceAccount]]:
    account = new_service_account("e2e-vertex")
    setups = {"google": vertex_setup(account)}
    with ProviderFarm(
        tmp_path / "farm", time_scale=DEFAULT_TIME_SCALE, providers=["google"], setups=setups
    ) as farm:
        (tmp_path / "cp").mkdir()
        cp = ControlPlane(
            tmp_path / "cp", farm, database_url=fresh_postgres_url, redis_url=redis_db.url
        )
        try:
            cp.start()
            yield cp, farm, account
        finally:
            cp.kill()


def test_vertex_output_arrives_from_gcs_into_our_storage(
    stack: tuple[ControlPlane, ProviderFarm, ServiceAccount],
) -> None:
    """One Vertex operation per task, labelled with the attempt's request key; its gs:// video
    is what the control plane stored (same bytes and SHA-256 as the bucket object)."""
    cp, farm, account = stack
    task_id = cp.create_task("google", model=MODEL, duration_s=4)
    task = cp.wait_terminal(task_id, timeout_s=120)
    assert task.state == sp.TASK_STATE_SUCCEEDED, describe(task)

    [job] = farm.truth("google")
    assert job["route"].endswith(f"/models/{MODEL}:predictLongRunning")
    assert job["route"].startswith("POST /v1/projects/my-project/locations/us-central1/")
    assert job["body"]["parameters"]["storageUri"] == "gs://my-project-veo-out/vidroute"
    [attempt] = task.attempts
    assert job["body"]["labels"] == {
        LABEL_KEY: label_value(attempt.client_request_key),
        LABEL_ACCOUNT: "veo-vertex-us",
    }

    url = farm.emulator("google").url
    op_id = job["id"].rsplit("/", 1)[1]
    name = f"vidroute/{op_id}/sample_0.mp4"
    credentials = service_account.Credentials.from_service_account_info(  # type: ignore[no-untyped-call]  # google-auth is unannotated
        account.key_json(f"{url}/token"), scopes=[SCOPE]
    )
    with AuthorizedSession(credentials) as session:  # type: ignore[no-untyped-call]  # unannotated
        media = session.get(
            f"{url}/storage/v1/b/my-project-veo-out/o/{quote(name, safe='')}",
            params={"alt": "media"},
            timeout=30,
        )
    assert media.status_code == 200, media.text
    stored = local_path(task.output.uri).read_bytes()
    assert stored == media.content
    assert task.output.checksum_sha256 == hashlib.sha256(media.content).hexdigest()
    assert task.output.mime_type == "video/mp4"
