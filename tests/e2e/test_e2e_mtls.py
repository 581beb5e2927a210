"""The control plane and a sidecar as processes, configured for mTLS the way the manifests do
(``VIDROUTE_TLS=on`` and the three files on both sides): a task runs through the TLS sidecar,
whose port refuses a plaintext caller while its plaintext health port answers probes."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tests.support.pki import make_pki
from tests.support.stack import ControlPlane, ProviderFarm, describe, free_port
from vidroute.adapter.v1 import adapter_service_pb2 as svc
from vidroute.adapter.v1 import adapter_service_pb2_grpc
from vidroute.scheduler.v1 import scheduler_pb2 as sp
from vidroute_core.tls import TlsFiles

pytestmark = [pytest.mark.e2e]


def _tls_env(files: TlsFiles) -> dict[str, str]:
    return {
        "VIDROUTE_TLS": "on",
        "VIDROUTE_TLS_CERT_FILE": str(files.cert_file),
        "VIDROUTE_TLS_KEY_FILE": str(files.key_file),
        "VIDROUTE_TLS_CA_FILE": str(files.ca_file),
    }


@pytest.mark.timeout(180)
def test_a_task_runs_through_a_tls_sidecar(tmp_path: Path) -> None:
    """CreateTask -> SUCCEEDED with one Runway job, over mTLS; plaintext to the sidecar's port is
    refused, and its health port serves SERVING without a certificate."""
    pki = make_pki(tmp_path / "pki")
    health_port = free_port()
    sidecar_env = {
        **_tls_env(pki.server),
        "VIDROUTE_HEALTH_LISTEN": f"127.0.0.1:{health_port}",
    }
    with ProviderFarm(tmp_path / "farm", providers=["runway"], sidecar_env=sidecar_env) as farm:
        sidecar = farm.sidecars["runway"].address
        with grpc.insecure_channel(sidecar) as plain:
            stub = adapter_service_pb2_grpc.ProviderAdapterServiceStub(plain)
            with pytest.raises(grpc.RpcError) as refused:
                stub.Describe(svc.DescribeRequest(), timeout=5)
            assert refused.value.code() is grpc.StatusCode.UNAVAILABLE
        with grpc.insecure_channel(f"127.0.0.1:{health_port}") as plain:
            health = health_pb2_grpc.HealthStub(plain)
            answer = health.Check(health_pb2.HealthCheckRequest(service="liveness"), timeout=5)
            assert answer.status == health_pb2.HealthCheckResponse.SERVING

        workdir = tmp_path / "cp"
        workdir.mkdir()
        cp = ControlPlane(
            workdir,
            farm,
            database_url=f"sqlite+aiosqlite:///{workdir / 'vidroute.db'}",
            redis_url=None,
            env=_tls_env(pki.client),
        )
        try:
            cp.start()  # waits until the sidecar's Describe (over mTLS) was published
            prompt = "a kite over a hill, through mTLS"
            task = cp.wait_terminal(cp.create_task("runway", prompt=prompt), timeout_s=120)
            assert task.state == sp.TASK_STATE_SUCCEEDED, describe(task)
            jobs = [job for job in farm.truth("runway") if prompt in str(job)]
            assert len(jobs) == 1, jobs
            assert cp.stop() == 0, cp.logs()
        finally:
            cp.kill()
