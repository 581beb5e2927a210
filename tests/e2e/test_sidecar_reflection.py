"""Each adapter sidecar, as a real process, can be driven by a reflection-only gRPC client.

This is what grpcurl does: no generated stubs, only descriptors fetched from the server's
reflection service, then Describe and Compile called with dynamically built messages.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf import descriptor_pool, json_format, message_factory
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (
    ProtoReflectionDescriptorDatabase,
)

from adapter_sidecars.emulators import (
    EmulatorThread,
    RunwayEmulator,
    SelfHostedEmulator,
    VeoEmulator,
)
from tests.support import processes

pytestmark = pytest.mark.e2e
ROOT = Path(__file__).resolve().parents[2]
SERVICE = "vidroute.adapter.v1.ProviderAdapterService"
CASES = {
    "runway": (RunwayEmulator, "gen4.5"),
    "veo": (VeoEmulator, "veo-3.1-generate-preview"),
    "selfhosted": (SelfHostedEmulator, "wan2.2-t2v"),
}


@pytest.fixture(params=sorted(CASES))
def sidecar(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, str]]:
    name = str(request.param)
    emulator_cls, model = CASES[name]
    with EmulatorThread(emulator_cls()) as emulator:
        proc = processes.start(
            [
                "-m",
                f"adapter_sidecars.{name}",
                "--config",
                str(ROOT / "adapter_sidecars" / name / "config.example.yaml"),
                "--listen",
                "127.0.0.1:0",
            ],
            workdir=tmp_path,
            name=f"adapter-{name}",
            env={"VIDROUTE_ADAPTER_BASE_URL": emulator.url},
        )
        try:
            yield proc.address, model
        finally:
            assert proc.stop() == 0, proc.log()


def _call(channel: grpc.Channel, pool: Any, method: str, body: dict[str, Any]) -> dict[str, Any]:
    service = pool.FindServiceByName(SERVICE)
    desc = service.FindMethodByName(method)
    request_cls = message_factory.GetMessageClass(desc.input_type)
    response_cls = message_factory.GetMessageClass(desc.output_type)
    call: grpc.UnaryUnaryMultiCallable[Any, Any] = channel.unary_unary(
        f"/{SERVICE}/{method}",
        request_serializer=lambda m: m.SerializeToString(),
        response_deserializer=response_cls.FromString,
    )
    reply = call(json_format.ParseDict(body, request_cls()), timeout=10)
    return json_format.MessageToDict(reply, preserving_proto_field_name=True)


def test_reflection_client_calls_describe_and_compile(sidecar: tuple[str, str]) -> None:
    """Describe lists the model's capability entry and Compile returns a submittable plan."""
    address, model = sidecar
    with grpc.insecure_channel(address) as channel:
        database = ProtoReflectionDescriptorDatabase(channel)
        assert SERVICE in database.get_services()
        pool = descriptor_pool.DescriptorPool(database)
        described = _call(channel, pool, "Describe", {})
        assert model in {c["model"] for c in described["capabilities"]}
        compiled = _call(
            channel,
            pool,
            "Compile",
            {
                "model": model,
                "spec": {
                    "tenant_id": "acme",
                    "prompt": "a red kite over a green hill",
                    "mode": "MODE_TEXT_TO_VIDEO",
                    "output": {"width": 1280, "height": 720, "duration_ms": 8000},
                    "routing": {"allow_semantic_degrade": True},
                },
            },
        )
        plan = compiled["plan"]
        assert plan["submittable"] is True
        live = health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service="liveness"), timeout=5
        )
        assert live.status == health_pb2.HealthCheckResponse.SERVING
        assert plan["request_hash"].startswith("sha256:")
        assert plan["model"] == model
