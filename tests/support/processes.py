"""Start project processes for end-to-end tests and wait for them without guessing.

Processes report readiness by writing their bound port to a `--port-file`; we poll for that
file with a deadline (never a fixed sleep) and stop processes with SIGTERM, then SIGKILL.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path


@dataclass
class Proc:
    """A started child process and its log."""

    popen: subprocess.Popen[bytes]
    log_path: Path
    port: int

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def stop(self, timeout: float = 10.0) -> int:
        """SIGTERM, wait, then SIGKILL; returns the exit code."""
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(timeout)
        return int(self.popen.returncode)

    def kill(self) -> None:
        if self.popen.poll() is None:
            self.popen.kill()
            self.popen.wait(10)


def start(
    args: Sequence[str],
    *,
    workdir: Path,
    name: str,
    env: Mapping[str, str] | None = None,
    ready_timeout: float = 60.0,
) -> Proc:
    """Run `python -m ...args --port-file F` and wait until F holds the bound port."""
    port_file = workdir / f"{name}.port"
    port_file.unlink(missing_ok=True)
    log_path = workdir / f"{name}.log"
    full_env = {**os.environ, **(env or {}), "PYTHONUNBUFFERED": "1"}
    with log_path.open("wb") as log:
        popen = subprocess.Popen(
            [sys.executable, *args, "--port-file", str(port_file)],
            cwd=workdir,
            env=full_env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    deadline = time.monotonic() + ready_timeout
    while time.monotonic() < deadline:
        if port_file.exists() and port_file.read_text().strip():
            return Proc(popen, log_path, int(port_file.read_text()))
        if popen.poll() is not None:
            break
        time.sleep(0.05)
    popen.kill()
    popen.wait()
    raise RuntimeError(f"{name} did not become ready:\n{log_path.read_text(errors='replace')}")
