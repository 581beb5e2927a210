"""mTLS between the control plane's adapter client and a sidecar (vidroute_core.tls): a client
with a certificate from our CA works end to end; without one, with a stranger's, or in plaintext
it is refused at the handshake and the provider sees nothing."""

from __future__ import annotations

import asyncio
import collections
import shutil
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import grpc
import pytest
from adapter_support import make_spec, sidecar_config
from grpc_health.v1 import health_pb2, health_pb2_grpc

from adapter_sidecars.common.server import SidecarServer
from adapter_sidecars.common.types import SubmitInput
from adapter_sidecars.emulators import RunwayEmulator
from adapter_sidecars.runway.adapter import RunwayAdapter
from controlplane.adapters.grpc_client import GrpcAdapterClient
from tests.support.pki import Pki, issue, make_authority, make_pki
from vidroute.adapter.v1 import adapter_service_pb2 as svc
from vidroute.adapter.v1 import adapter_service_pb2_grpc
from vidroute_core.adapter import AdapterInfo, SubmitKind, SubmitOutcome
from vidroute_core.tls import TlsConfigError, TlsFiles, TlsSettings
from vidroute_core.wire.spec import spec_to_proto
from vidroute_core.wire.tls import channel_credentials


@pytest.fixture
def pki(tmp_path: Path) -> Pki:
    return make_pki(tmp_path / "pki")


class CountingRunway(RunwayAdapter):
    """The Runway adapter, counting the calls the servicer makes into it."""

    calls: collections.Counter[str]

    def describe(self) -> AdapterInfo:
        self.calls["describe"] += 1
        return super().describe()

    async def submit(self, request: SubmitInput) -> SubmitOutcome:
        self.calls["submit"] += 1
        return await super().submit(request)


@pytest.fixture
async def tls_sidecar(
    runway_emulator: RunwayEmulator, pki: Pki
) -> AsyncIterator[tuple[SidecarServer, RunwayEmulator]]:
    """A Runway sidecar serving mTLS on 127.0.0.1 and plaintext health on another port."""
    config = sidecar_config(
        runway_emulator.url, "RUNWAY_API_KEY", options={"recovery_settle_seconds": 0}
    )
    adapter = CountingRunway.from_config(config)
    assert isinstance(adapter, CountingRunway)
    adapter.calls = collections.Counter()
    server = SidecarServer(
        adapter,
        "127.0.0.1:0",
        probe_interval_seconds=0.2,
        shutdown_grace_seconds=1,
        tls=TlsSettings(files=pki.server),
        health_listen="127.0.0.1:0",
    )
    await server.start()
    yield server, runway_emulator
    await server.stop()


def _provider_calls(emulator: RunwayEmulator) -> dict[str, int]:
    """Requests the provider saw other than the sidecar's health probe (a GET)."""
    return {k: v for k, v in emulator.counters.items() if not k.startswith("GET ")}


async def test_client_with_a_certificate_describes_compiles_and_submits(
    tls_sidecar: tuple[SidecarServer, RunwayEmulator], pki: Pki
) -> None:
    """Our client certificate and CA: Describe, Compile and Submit reach the provider."""
    server, emulator = tls_sidecar
    client = GrpcAdapterClient(
        f"127.0.0.1:{server.port}", credentials=channel_credentials(pki.client)
    )
    try:
        described = await client.describe()
        assert described.adapter == "runway"
        plan = await client.compile(make_spec(), account="prod-us", model="gen4.5")
        outcome = await client.submit(plan, "mtls-key-1")
    finally:
        await client.close()
    assert outcome.kind is SubmitKind.ACCEPTED
    assert len(emulator.jobs) == 1
    assert isinstance(server.adapter, CountingRunway)
    assert server.adapter.calls["submit"] == 1  # the count the refusal tests rely on


Refused = Callable[[str], grpc.aio.Channel]


def _no_certificate(pki: Pki) -> Refused:
    creds = grpc.ssl_channel_credentials(root_certificates=pki.ca.cert_file.read_bytes())
    return lambda target: grpc.aio.secure_channel(target, creds)


def _stranger(pki: Pki) -> Refused:
    creds = channel_credentials(pki.stranger)
    return lambda target: grpc.aio.secure_channel(target, creds)


def _plaintext(_pki: Pki) -> Refused:
    return grpc.aio.insecure_channel


@pytest.mark.parametrize(
    "make_channel", [_no_certificate, _stranger, _plaintext], ids=lambda f: f.__name__
)
async def test_a_client_without_a_valid_certificate_is_refused(
    tls_sidecar: tuple[SidecarServer, RunwayEmulator],
    pki: Pki,
    make_channel: Callable[[Pki], Refused],
) -> None:
    """No client certificate, one from another CA, or plaintext: UNAVAILABLE at the handshake;
    neither RPC reaches the adapter, and the provider sees no request."""
    server, emulator = tls_sidecar
    target = f"127.0.0.1:{server.port}"
    async with grpc.aio.secure_channel(target, channel_credentials(pki.client)) as trusted:
        compiled = await adapter_service_pb2_grpc.ProviderAdapterServiceStub(trusted).Compile(
            svc.CompileRequest(spec=spec_to_proto(make_spec()), model="gen4.5")
        )
    assert compiled.plan.submittable  # a plan the provider would accept, were it sent
    adapter = server.adapter
    assert isinstance(adapter, CountingRunway)
    before = dict(adapter.calls)
    channel = make_channel(pki)(target)
    stub = adapter_service_pb2_grpc.ProviderAdapterServiceStub(channel)
    plan_request = svc.SubmitRequest(plan=compiled.plan, client_request_key="refused-1")
    try:
        for call in (
            stub.Describe(svc.DescribeRequest(), timeout=5),
            stub.Submit(plan_request, timeout=5),
        ):
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await call
            assert refused.value.code() is grpc.StatusCode.UNAVAILABLE
    finally:
        await channel.close()
    assert dict(adapter.calls) == before
    assert emulator.jobs == {}
    assert _provider_calls(emulator) == {}


async def test_health_port_is_plaintext_and_serves_only_health(
    tls_sidecar: tuple[SidecarServer, RunwayEmulator],
) -> None:
    """Kubernetes' gRPC probe (no certificate) reads the sidecar's health on the health port;
    the adapter service is not there."""
    server, _ = tls_sidecar
    async with grpc.aio.insecure_channel(f"127.0.0.1:{server.health_port}") as channel:
        health = health_pb2_grpc.HealthStub(channel)
        liveness = await health.Check(health_pb2.HealthCheckRequest(service="liveness"))
        assert liveness.status == health_pb2.HealthCheckResponse.SERVING
        overall = await health.Check(health_pb2.HealthCheckRequest(service=""))
        assert overall.status == health_pb2.HealthCheckResponse.SERVING  # the emulator is up
        stub = adapter_service_pb2_grpc.ProviderAdapterServiceStub(channel)
        with pytest.raises(grpc.aio.AioRpcError) as absent:
            await stub.Describe(svc.DescribeRequest(), timeout=5)
        assert absent.value.code() is grpc.StatusCode.UNIMPLEMENTED


async def test_plaintext_off_loopback_is_refused_unless_tls_is_off(
    runway_emulator: RunwayEmulator,
) -> None:
    """Without certificates the sidecar binds no non-loopback address, unless VIDROUTE_TLS=off."""
    config = sidecar_config(runway_emulator.url, "RUNWAY_API_KEY")
    adapter = RunwayAdapter.from_config(config)
    refused = SidecarServer(adapter, "0.0.0.0:0", probe_interval_seconds=0.2)
    with pytest.raises(TlsConfigError, match="VIDROUTE_TLS=off"):
        await refused.start()
    allowed = SidecarServer(
        RunwayAdapter.from_config(config),
        "0.0.0.0:0",
        probe_interval_seconds=0.2,
        shutdown_grace_seconds=0.1,
        tls=TlsSettings.from_env({"VIDROUTE_TLS": "off"}),
    )
    assert await allowed.start() > 0
    await allowed.stop()
    await adapter.aclose()


def test_settings_from_env_need_every_file_and_readable_pem(pki: Pki, tmp_path: Path) -> None:
    """Partial or unreadable TLS configuration fails at start, naming what is wrong."""
    full = {
        "VIDROUTE_TLS_CERT_FILE": str(pki.server.cert_file),
        "VIDROUTE_TLS_KEY_FILE": str(pki.server.key_file),
        "VIDROUTE_TLS_CA_FILE": str(pki.server.ca_file),
    }
    assert TlsSettings.from_env(full).files == pki.server
    assert TlsSettings.from_env({}).files is None
    with pytest.raises(TlsConfigError, match="VIDROUTE_TLS_KEY_FILE"):
        TlsSettings.from_env({k: v for k, v in full.items() if "KEY" not in k})
    with pytest.raises(TlsConfigError, match="VIDROUTE_TLS=on"):
        TlsSettings.from_env({"VIDROUTE_TLS": "on"})
    (tmp_path / "empty.crt").write_text("not a certificate")
    with pytest.raises(TlsConfigError, match="no PEM block"):
        TlsSettings.from_env({**full, "VIDROUTE_TLS_CERT_FILE": str(tmp_path / "empty.crt")})
    with pytest.raises(TlsConfigError, match="must be one of"):
        TlsSettings.from_env({"VIDROUTE_TLS": "maybe"})


async def _describe_ok(target: str, files: TlsFiles) -> bool:
    client = GrpcAdapterClient(target, credentials=channel_credentials(files), timeout_s=5)
    try:
        await client.describe()
    except grpc.aio.AioRpcError:
        return False
    finally:
        await client.close()
    return True


async def test_rotated_certificate_files_serve_new_connections(
    tls_sidecar: tuple[SidecarServer, RunwayEmulator], pki: Pki, tmp_path: Path
) -> None:
    """Replacing the files in place (a rotated Secret) switches the CA the sidecar trusts for
    new connections, without a restart."""
    server, _ = tls_sidecar
    target = f"127.0.0.1:{server.port}"
    assert await _describe_ok(target, pki.client)
    rotated = tmp_path / "rotated"
    rotated.mkdir()
    new_ca = make_authority(rotated, "rotated")
    new_server = issue(new_ca, rotated, "sidecar", server=True, trust=new_ca.cert_file)
    new_client = issue(new_ca, rotated, "controlplane", server=False, trust=new_ca.cert_file)
    for source, dest in (
        (new_server.cert_file, pki.server.cert_file),
        (new_server.key_file, pki.server.key_file),
        (new_ca.cert_file, pki.server.ca_file),
    ):
        shutil.copyfile(source, dest)
    deadline = time.monotonic() + 10
    while not await _describe_ok(target, new_client):
        assert time.monotonic() < deadline, "the rotated certificate was never served"
        await asyncio.sleep(0.05)
    assert not await _describe_ok(target, pki.client)  # the old CA no longer admits it
