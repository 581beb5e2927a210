"""A real Cog model server (coglet running models/cog_video with the venv's Python) for tests
in this process: started READY, its `/health-check` status and its own prediction log."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import httpx

from adapter_sidecars.selfhosted.cog_server import prediction_runs, start_cog_server
from tests.support.stack import free_port


class CogServer:
    """One coglet process on a free port and its JSON-lines log."""

    def __init__(self, tmp: Path, *, webhook_token: str = "", ready_timeout_s: float = 60) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = tmp / "cog.log"
        self.proc = start_cog_server(self.port, self.log, webhook_token=webhook_token)
        deadline = time.monotonic() + ready_timeout_s
        while self.health() != "READY":
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise AssertionError(f"cog server not READY:\n{self.log.read_text()[-2000:]}")
            time.sleep(0.1)

    def health(self) -> str:
        """The server's `/health-check` status ("" when it does not answer)."""
        try:
            return str(httpx.get(f"{self.url}/health-check", timeout=2).json()["status"])
        except (httpx.HTTPError, ValueError, KeyError):
            return ""

    def runs(self) -> dict[str, int]:
        """How many times the server started each prediction id (its own log's word)."""
        return prediction_runs(self.log.read_text(encoding="utf-8", errors="replace"))

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)
