"""The deployables ship what they name: each wheel runs on its own, without the other side.

scripts/build_dists.py builds the wheels; tests.support.isolated installs them into a directory
of their own and runs their entry points where neither the source tree nor an undeclared
third-party library can be imported. A sidecar starts from its console script and answers
Describe from the capability files it ships; the control plane migrates a database and serves.
`import controlplane` is impossible beside the sidecars, `import adapter_sidecars` beside the
control plane, and each process ran on the dependencies its wheel declares.
"""

from __future__ import annotations

import zipfile
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from scripts.build_dists import NAMES, build
from tests.support.isolated import Isolated, install
from vidroute.adapter.v1 import adapter_service_pb2, adapter_service_pb2_grpc

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]


@pytest.fixture(scope="module")
def wheels(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("wheels")
    return {name: build(name, out) for name in NAMES}


@pytest.fixture(scope="module")
def adapter_image(wheels: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """What `docker build --target adapter` installs: vidroute-core + vidroute-adapters."""
    target = tmp_path_factory.mktemp("adapter-image")
    return install([wheels["core"], wheels["adapters"]], target)


def wheel_rooms(wheel: Path) -> set[str]:
    """A wheel's top-level packages, and the subpackages of adapter_sidecars (shared by two)."""
    names = [n for n in zipfile.ZipFile(wheel).namelist() if ".dist-info/" not in n]
    rooms = {n.split("/")[0] for n in names}
    rooms |= {
        "/".join(n.split("/")[:2])
        for n in names
        if n.startswith("adapter_sidecars/") and n.count("/") > 1
    }
    return rooms


def test_each_wheel_holds_only_its_own_packages(wheels: dict[str, Path]) -> None:
    """core: protos + kernel; client: the SDK and the `vidroute` command; control plane:
    controlplane; adapters: the sidecars without test tooling; contract: the contract suite and
    the emulators."""
    assert wheel_rooms(wheels["core"]) == {"vidroute", "vidroute_core"}
    assert wheel_rooms(wheels["client"]) == {"clients"}
    assert wheel_rooms(wheels["controlplane"]) == {"controlplane"}
    assert wheel_rooms(wheels["adapters"]) == {
        "adapter_sidecars",
        "adapter_sidecars/common",
        "adapter_sidecars/runway",
        "adapter_sidecars/veo",
        "adapter_sidecars/selfhosted",
    }
    assert wheel_rooms(wheels["contract"]) == {
        "adapter_sidecars",
        "adapter_sidecars/contract",
        "adapter_sidecars/emulators",
    }


def test_client_wheel_marks_the_sdk_typed(wheels: dict[str, Path]) -> None:
    """vidroute-client ships the PEP 561 marker, so a caller's mypy checks its calls against
    the SDK's annotations instead of treating `clients.sdk` as untyped."""
    assert "clients/py.typed" in zipfile.ZipFile(wheels["client"]).namelist()


@pytest.mark.parametrize("name", ["runway", "veo", "selfhosted"])
def test_sidecar_wheel_starts_and_describes_without_the_control_plane(
    adapter_image: Path, tmp_path: Path, name: str
) -> None:
    """`vidroute-adapter-<name>` of vidroute-adapters serves Describe from its shipped
    capability files; the control plane cannot be imported and was not."""
    port_file = tmp_path / "port"
    config = adapter_image / "adapter_sidecars" / name / "config.example.yaml"
    runner = Isolated(
        adapter_image,
        tmp_path,
        "vidroute-adapters",
        f"vidroute-adapter-{name}",
        *("--config", str(config), "--listen", "127.0.0.1:0", "--port-file", str(port_file)),
    )
    refused = runner.code("import controlplane")
    assert "No module named 'controlplane'" in refused.stderr, refused.stderr

    proc = runner.start()
    try:
        port = runner.wait_for_port(proc, port_file)
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = adapter_service_pb2_grpc.ProviderAdapterServiceStub(channel)
            reply = stub.Describe(adapter_service_pb2.DescribeRequest(), timeout=10)
    finally:
        assert runner.stop(proc) == 0, runner.log()
    assert reply.capabilities, runner.log()
    modules = runner.loaded_modules()
    assert f"adapter_sidecars.{name}.adapter" in modules
    assert not [m for m in modules if m.split(".")[0] in {"controlplane", "pytest", "sqlalchemy"}]


def test_contract_wheel_adds_its_command_beside_the_sidecars(
    wheels: dict[str, Path], tmp_path: Path
) -> None:
    """vidroute-adapter-contract installs into vidroute-adapters' adapter_sidecars and
    `vidroute-contract --help` runs on what it declares."""
    target = install([wheels[n] for n in ("core", "adapters", "contract")], tmp_path / "kit")
    runner = Isolated(target, tmp_path, "vidroute-adapter-contract", "vidroute-contract", "--help")
    done = runner.run()
    assert done.returncode == 0, done.stderr
    assert "usage" in done.stdout.lower()


def test_control_plane_wheel_migrates_and_serves_without_the_sidecars(
    wheels: dict[str, Path], tmp_path: Path
) -> None:
    """`vidroute migrate` and `vidroute serve` (vidroute-client's command) run the control plane
    of vidroute-controlplane on SQLite; the sidecars cannot be imported and were not."""
    target = install(
        [wheels["core"], wheels["client"], wheels["controlplane"]], tmp_path / "controlplane-image"
    )
    env = {
        "VIDROUTE_DATABASE_URL": f"sqlite+aiosqlite:///{tmp_path / 'vidroute.db'}",
        "VIDROUTE_ADAPTERS": "",
        "VIDROUTE_API_ONLY": "1",  # serving without sidecars is an API-only replica
        "VIDROUTE_REDIS_URL": "",
    }
    migrate = Isolated(target, tmp_path, "vidroute-client", "vidroute", "migrate")
    refused = migrate.code("import adapter_sidecars")
    assert "No module named 'adapter_sidecars'" in refused.stderr, refused.stderr
    done = migrate.run(env)
    assert done.returncode == 0, done.stderr

    port_file = tmp_path / "cp.port"
    serve = Isolated(
        target,
        tmp_path,
        "vidroute-client",
        "vidroute",
        *("serve", "--listen", "127.0.0.1:0", "--port-file", str(port_file)),
    )
    proc = serve.start(env)
    try:
        port = serve.wait_for_port(proc, port_file)
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            health = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service="liveness"), timeout=10
            )
    finally:
        assert serve.stop(proc) == 0, serve.log()
    assert health.status == health_pb2.HealthCheckResponse.SERVING
    modules = serve.loaded_modules()
    assert "controlplane.bootstrap" in modules
    assert not [m for m in modules if m.split(".")[0] in {"adapter_sidecars", "pytest"}]


def test_client_wheel_alone_imports_the_sdk_and_runs_its_command(
    wheels: dict[str, Path], tmp_path: Path
) -> None:
    """vidroute-client with vidroute-core only: `clients.sdk` imports on what the wheel
    declares, `vidroute --help` runs, and neither the control plane nor the sidecars exist."""
    target = install([wheels["core"], wheels["client"]], tmp_path / "client-only")
    runner = Isolated(target, tmp_path, "vidroute-client", "vidroute", "--help")
    sdk = runner.code(
        "from clients.sdk import AsyncClient, Client, errors; "
        "c = Client('127.0.0.1:1', token=''); c.close(); print(errors.NotFound.__name__)"
    )
    assert sdk.returncode == 0, sdk.stderr
    assert sdk.stdout.strip() == "NotFound"
    for absent in ("controlplane", "adapter_sidecars"):
        refused = runner.code(f"import {absent}")
        assert f"No module named '{absent}'" in refused.stderr, refused.stderr
    done = runner.run()
    assert done.returncode == 0, done.stderr
    assert "submit" in done.stdout
    modules = runner.loaded_modules()
    assert not [m for m in modules if m.split(".")[0] in {"controlplane", "sqlalchemy"}]
