"""`vidroute up`: the whole platform on one machine, as child processes of one command.

Starts the three provider emulators (the self-hosted one is the GPU model server), then the
three adapter sidecars pointed at them, then the control plane in this process, wired to the
sidecars. Every child's output goes to ``./var/log/<name>.log``. Ctrl-C (or SIGTERM) stops the
control plane gracefully, then each child with SIGTERM (SIGKILL after a grace period).
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import httpx

log = logging.getLogger("vidroute.up")
ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Child:
    """A process of the dev stack."""

    name: str
    args: tuple[str, ...]
    ready_url: str = ""  # polled until it answers (emulators)
    port_file: bool = False  # waits for --port-file (sidecars)


def stack(provider_ports: Mapping[str, int], adapter_ports: Mapping[str, int]) -> list[Child]:
    """The children, in start order."""
    children: list[Child] = []
    for name, port in provider_ports.items():
        children.append(
            Child(
                name=f"emulator-{name}",
                args=(
                    "-m",
                    f"adapter_sidecars.emulators.{name}",
                    "--port",
                    str(port),
                    "--advance",
                    "time",
                    "--queue-s",
                    "1",
                    "--run-s",
                    "3",
                ),
                ready_url=f"http://127.0.0.1:{port}/__emulator/faults",
            )
        )
    for name, port in adapter_ports.items():
        config = ROOT / "adapter_sidecars" / name / "config.example.yaml"
        children.append(
            Child(
                name=f"adapter-{name}",
                args=(
                    "-m",
                    f"adapter_sidecars.{name}",
                    "--config",
                    str(config),
                    "--listen",
                    f"127.0.0.1:{port}",
                ),
                port_file=True,
            )
        )
    return children


class Supervisor:
    """Starts children, waits for readiness without guessing, and stops them in reverse."""

    def __init__(self, run_dir: Path) -> None:
        self._run_dir = run_dir
        self._procs: list[tuple[Child, subprocess.Popen[bytes]]] = []
        (run_dir / "log").mkdir(parents=True, exist_ok=True)

    def start(self, child: Child, timeout_s: float = 60.0) -> None:
        args = list(child.args)
        port_file = self._run_dir / f"{child.name}.port"
        if child.port_file:
            port_file.unlink(missing_ok=True)
            args += ["--port-file", str(port_file)]
        log_path = self._run_dir / "log" / f"{child.name}.log"
        with log_path.open("ab") as out:
            proc = subprocess.Popen(
                [sys.executable, *args],
                cwd=ROOT,
                stdout=out,
                stderr=subprocess.STDOUT,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )
        self._procs.append((child, proc))
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"{child.name} exited early; see {log_path}")
            if self._ready(child, port_file):
                log.info("%s ready (log %s)", child.name, log_path)
                return
            time.sleep(0.1)
        raise RuntimeError(f"{child.name} not ready after {timeout_s:.0f} s; see {log_path}")

    @staticmethod
    def _ready(child: Child, port_file: Path) -> bool:
        if child.port_file:
            return port_file.exists() and bool(port_file.read_text().strip())
        try:
            return httpx.get(child.ready_url, timeout=1.0).status_code < 500
        except httpx.HTTPError:
            return False

    def stop_all(self, grace_s: float = 10.0) -> None:
        for _child, proc in reversed(self._procs):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        for child, proc in reversed(self._procs):
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                log.warning("%s did not stop; killing it", child.name)
                proc.kill()
                proc.wait()
        self._procs.clear()
