"""Running emulators from sync code (thread) and as standalone processes (CLI + SIGTERM)."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from adapter_sidecars.emulators.runner import EmulatorThread
from adapter_sidecars.emulators.runway import RunwayEmulator

from .conftest import RUNWAY_HEADERS, T2V_BODY, TLS

ROOT = Path(__file__).resolve().parents[3]


def test_thread_runner_serves_sync_clients() -> None:
    """EmulatorThread serves HTTP to sync code and proxies the Python admin API."""
    with (
        EmulatorThread(RunwayEmulator()) as runner,
        httpx.Client(base_url=runner.url, headers=RUNWAY_HEADERS, verify=TLS, timeout=5) as c,
    ):
        runner.add_faults({"route": "POST /v1/text_to_video", "action": "drop_after_body"})
        with pytest.raises(httpx.TransportError):
            c.post("/v1/text_to_video", json=T2V_BODY)
        assert len(runner.truth()) == 1
        runner.reset()
        assert c.get("/__emulator/jobs").json() == {"jobs": []}


@pytest.mark.parametrize("module", ["runway", "veo", "selfhosted"])
def test_cli_serves_and_stops_on_sigterm(module: str) -> None:
    """`python -m adapter_sidecars.emulators.<x>` serves until SIGTERM, then exits 0."""
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            f"adapter_sidecars.emulators.{module}",
            "--port",
            "0",
            "--advance",
            "time",
            "--queue-s",
            "0.1",
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()  # blocks until the server prints its URL
        url = line.rsplit(" ", 1)[-1].strip()
        assert url.startswith("http://127.0.0.1:"), line
        with httpx.Client(verify=TLS, timeout=5) as c:
            assert c.get(f"{url}/__emulator/jobs").json() == {"jobs": []}
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()
