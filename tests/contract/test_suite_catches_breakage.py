"""The contract suite can fail: a deliberately broken adapter is caught by it.

The broken adapter is the real Runway adapter behind a servicer subclass that reports a read
timeout after the whole body was sent (the 9.17.1 incident) as REJECTED instead of UNKNOWN —
exactly the bug that makes a control plane retry and pay twice. It is served in-process on a
real gRPC port; the emulator runs as a process, as in the main suite.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from adapter_sidecars.common.config import parse_config
from adapter_sidecars.common.servicer import AdapterServicer
from adapter_sidecars.contract.driver import AdapterDriver
from adapter_sidecars.contract.emulator_admin import EmulatorAdmin
from adapter_sidecars.contract.harness import ManagedProcess, sidecar_config, start_emulator
from adapter_sidecars.contract.profile import load_profile
from adapter_sidecars.contract.suite import SubmitBoundaryContract
from adapter_sidecars.runway.adapter import RunwayAdapter
from vidroute.adapter.v1 import adapter_pb2, adapter_service_pb2, adapter_service_pb2_grpc
from vidroute.common.v1 import error_pb2
from vidroute_core.wire.status import DomainErrorInterceptor

ROOT = Path(__file__).resolve().parents[2]
BOUNDARY_TEST = "test_read_timeout_after_body_is_unknown_with_one_job"


class ReadTimeoutIsRejectedServicer(AdapterServicer):
    """Broken on purpose: a read timeout after the body becomes REJECTED (the 9.17.1 bug)."""

    async def Submit(
        self,
        request: adapter_service_pb2.SubmitRequest,
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> adapter_service_pb2.SubmitResponse:
        response = await super().Submit(request, context)
        if response.transport_stage == adapter_pb2.TRANSPORT_STAGE_AWAIT_RESPONSE:
            response.kind = adapter_pb2.SUBMIT_OUTCOME_KIND_REJECTED
            response.error.error_class = error_pb2.ERROR_CLASS_TRANSIENT_NETWORK
            response.error.provider_may_have_accepted = False
            response.error.retryable = True
        return response


class InProcessSidecar:
    """A servicer on a real port, served by grpc.aio on its own event-loop thread."""

    def __init__(self, servicer_cls: type[AdapterServicer], emulator_url: str) -> None:
        self._servicer_cls = servicer_cls
        self._emulator_url = emulator_url
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self.address = ""

    async def _start(self) -> int:
        config = parse_config(
            sidecar_config(self._emulator_url, provider_options={"recovery_settle_seconds": 0}), {}
        )
        self._adapter = RunwayAdapter.from_config(config)
        self._server = grpc.aio.server(interceptors=[DomainErrorInterceptor()])
        adapter_service_pb2_grpc.add_ProviderAdapterServiceServicer_to_server(
            self._servicer_cls(self._adapter), self._server
        )
        port = self._server.add_insecure_port("127.0.0.1:0")
        await self._server.start()
        return port

    async def _stop(self) -> None:
        await self._server.stop(0)
        await self._adapter.aclose()

    def __enter__(self) -> InProcessSidecar:
        self._thread.start()
        port = asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(timeout=20)
        self.address = f"127.0.0.1:{port}"
        return self

    def __exit__(self, *exc: object) -> None:
        asyncio.run_coroutine_threadsafe(self._stop(), self._loop).result(timeout=20)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        self._loop.close()


@pytest.fixture(scope="module")
def runway_emulator(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ManagedProcess]:
    proc = start_emulator(
        "adapter_sidecars.emulators.runway",
        tmp_path_factory.mktemp("breakage"),
        {"advance": "polls"},
        cwd=ROOT,
    )
    yield proc
    proc.stop()


def _run_boundary_test(sidecar: InProcessSidecar, emulator_url: str) -> None:
    """Call the suite's read-timeout boundary test directly, as pytest would."""
    with grpc.insecure_channel(sidecar.address) as channel, EmulatorAdmin(emulator_url) as admin:
        admin.reset()
        stub = adapter_service_pb2_grpc.ProviderAdapterServiceStub(channel)
        driver = AdapterDriver(stub, load_profile("runway"))
        getattr(SubmitBoundaryContract(), BOUNDARY_TEST)(adapter=driver, emulator=admin)


def test_honest_adapter_passes_the_boundary_test(runway_emulator: ManagedProcess) -> None:
    """Control: the unmodified servicer passes the read-timeout boundary test."""
    with InProcessSidecar(AdapterServicer, runway_emulator.url) as sidecar:
        _run_boundary_test(sidecar, runway_emulator.url)


def test_broken_adapter_fails_the_boundary_test(runway_emulator: ManagedProcess) -> None:
    """An adapter that turns a read timeout after the body into REJECTED fails the boundary test."""
    with (
        InProcessSidecar(ReadTimeoutIsRejectedServicer, runway_emulator.url) as sidecar,
        pytest.raises(AssertionError, match="kind=REJECTED"),
    ):
        _run_boundary_test(sidecar, runway_emulator.url)


def test_vidroute_contract_reports_the_broken_adapter(runway_emulator: ManagedProcess) -> None:
    """The vidroute-contract command run against the broken adapter exits 1 with one failure."""
    with InProcessSidecar(ReadTimeoutIsRejectedServicer, runway_emulator.url) as sidecar:
        result = subprocess.run(
            [
                sys.executable,
                "-m",
                "adapter_sidecars.contract",
                "--adapter",
                sidecar.address,
                "--emulator",
                runway_emulator.url,
                "--profile",
                "runway",
                "-k",
                BOUNDARY_TEST,
                "-q",
            ],
            check=False,
            capture_output=True,
            text=True,
            cwd=ROOT,
            timeout=100,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )
    assert result.returncode == 1, result.stdout + result.stderr
    assert "1 failed" in result.stdout, result.stdout
    assert "kind=REJECTED" in result.stdout, result.stdout
