"""Start provider emulators and adapter sidecars as real processes, with deadlines, not sleeps.

Our CI (``tests/contract/conftest.py``) uses this to stand up, per provider, an emulator and the
adapter sidecar over gRPC; an adapter author can use it the same way in their own harness::

    emu = start_emulator("adapter_sidecars.emulators.runway", workdir, {"advance": "polls"})
    cfg = write_sidecar_config(workdir / "runway.yaml", sidecar_config(emu.url))
    side = start_sidecar("adapter_sidecars.runway", cfg, workdir)
    ...  # side.address is "127.0.0.1:<port>"
    side.stop(); emu.stop()

Every process gets its own session (signals to the test runner never reach it), its output goes
to a log file in `workdir`, and a failed start raises `HarnessError` with the log's tail.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import grpc
import yaml
from grpc_health.v1 import health_pb2, health_pb2_grpc

_LISTENING = re.compile(r"listening on (http://\S+)")


class HarnessError(RuntimeError):
    """A process did not start (or become healthy) in time; the message holds its log tail."""


@dataclass
class ManagedProcess:
    """A child process with its log file; `stop` is idempotent."""

    name: str
    popen: subprocess.Popen[bytes]
    log_path: Path
    _log: IO[bytes] = field(repr=False)
    address: str = ""

    @property
    def url(self) -> str:
        return self.address

    def alive(self) -> bool:
        return self.popen.poll() is None

    def log_tail(self, lines: int = 40) -> str:
        try:
            text = self.log_path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def stop(self, grace_s: float = 5.0) -> None:
        """SIGTERM, wait `grace_s`, then SIGKILL; close the log."""
        if self.popen.poll() is None:
            self.popen.terminate()
            try:
                self.popen.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(timeout=grace_s)
        if not self._log.closed:
            self._log.close()

    def fail(self, why: str) -> HarnessError:
        self.stop(grace_s=2.0)
        return HarnessError(
            f"{self.name}: {why}\n--- {self.log_path} (tail) ---\n{self.log_tail()}"
        )


def spawn(name: str, argv: Sequence[str], workdir: Path, cwd: Path | None = None) -> ManagedProcess:
    """Start `argv` with output to ``workdir/<name>.log``."""
    workdir.mkdir(parents=True, exist_ok=True)
    log_path = workdir / f"{name}.log"
    log = log_path.open("wb")
    env = dict(os.environ)
    root = str(cwd or Path.cwd())
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH", "")) if p)
    env.setdefault("PYTHONUNBUFFERED", "1")
    popen = subprocess.Popen(
        list(argv),
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        cwd=cwd,
        env=env,
        start_new_session=True,
    )
    return ManagedProcess(name, popen, log_path, log)


def _flag_value(value: Any) -> str:
    if isinstance(value, bool):
        raise TypeError("booleans are passed as --flag / --no-flag")
    if isinstance(value, set | frozenset):  # emulator extensions: --extensions a,b
        return ",".join(sorted(value))
    if isinstance(value, Mapping | list | tuple):
        return json.dumps(value)
    return str(value)


def emulator_argv(module: str, options: Mapping[str, Any]) -> list[str]:
    """``python -m <module> --host 127.0.0.1 --port 0 --<option> <value> ...``."""
    argv = [sys.executable, "-m", module, "--host", "127.0.0.1", "--port", "0"]
    for key, value in options.items():
        flag = "--" + key.replace("_", "-")
        if isinstance(value, bool):
            argv.append(flag if value else "--no-" + key.replace("_", "-"))
        else:
            argv += [flag, _flag_value(value)]
    return argv


def start_emulator(
    module: str,
    workdir: Path,
    options: Mapping[str, Any] | None = None,
    *,
    name: str | None = None,
    cwd: Path | None = None,
    deadline_s: float = 30.0,
) -> ManagedProcess:
    """Start an emulator on a free port and wait until it prints its URL."""
    label = name or module.rsplit(".", 1)[-1] + "-emulator"
    proc = spawn(label, emulator_argv(module, options or {}), workdir, cwd)
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        match = _LISTENING.search(proc.log_path.read_text(encoding="utf-8", errors="replace"))
        if match:
            proc.address = match.group(1)
            return proc
        if not proc.alive():
            raise proc.fail(f"exited with status {proc.popen.returncode} before listening")
        time.sleep(0.05)
    raise proc.fail(f"not listening after {deadline_s:.0f} s")


def sidecar_config(
    base_url: str,
    *,
    provider_options: Mapping[str, Any] | None = None,
    timeouts: Mapping[str, float] | None = None,
    account: str = "contract",
    credential_ref: str = "env:VIDROUTE_CONTRACT_KEY:-key_contract_emulator",
    probe_interval_seconds: float = 1.0,
) -> dict[str, Any]:
    """A sidecar configuration (adapter_sidecars/common/config.py format) with test timeouts."""
    return {
        "listen": "127.0.0.1:0",
        "provider": {"base_url": base_url, "options": dict(provider_options or {})},
        "timeouts": dict(
            timeouts or {"connect": 1.0, "write": 2.0, "read": 3.0, "submit_read": 1.5, "pool": 1.0}
        ),
        "health": {"probe_interval_seconds": probe_interval_seconds},
        "shutdown_grace_seconds": 1,
        "accounts": [{"name": account, "region": "us", "credential_ref": credential_ref}],
    }


def write_sidecar_config(path: Path, config: Mapping[str, Any]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(dict(config), sort_keys=False), encoding="utf-8")
    return path


def health_status(address: str, timeout_s: float = 1.0) -> int | None:
    """The overall gRPC health status of `address`, or None when it does not answer."""
    with grpc.insecure_channel(address) as channel:
        try:
            response = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=""), timeout=timeout_s
            )
        except grpc.RpcError:
            return None
    return int(response.status)


def start_sidecar(
    module: str,
    config_path: Path,
    workdir: Path,
    *,
    name: str | None = None,
    cwd: Path | None = None,
    require_serving: bool = True,
    deadline_s: float = 30.0,
) -> ManagedProcess:
    """Start ``python -m <module> --config ... --listen 127.0.0.1:0 --port-file ...``; wait for
    the port file, then for health SERVING (or, with ``require_serving=False``, any answer:
    an adapter whose provider is unreachable stays NOT_SERVING by design)."""
    label = name or module.rsplit(".", 1)[-1] + "-sidecar"
    port_file = workdir / f"{label}.port"
    port_file.unlink(missing_ok=True)
    argv = [
        sys.executable,
        "-m",
        module,
        "--config",
        str(config_path),
        "--listen",
        "127.0.0.1:0",
        "--port-file",
        str(port_file),
    ]
    proc = spawn(label, argv, workdir, cwd)
    deadline = time.monotonic() + deadline_s
    while not proc.address:
        text = port_file.read_text(encoding="utf-8").strip() if port_file.exists() else ""
        if text.isdigit():
            proc.address = f"127.0.0.1:{int(text)}"
        elif not proc.alive():
            raise proc.fail(f"exited with status {proc.popen.returncode} before writing its port")
        elif time.monotonic() > deadline:
            raise proc.fail(f"no port file after {deadline_s:.0f} s")
        else:
            time.sleep(0.05)
    wanted = {health_pb2.HealthCheckResponse.SERVING}
    if not require_serving:
        wanted.add(health_pb2.HealthCheckResponse.NOT_SERVING)
    last: int | None = None
    while time.monotonic() < deadline:
        last = health_status(proc.address)
        if last in wanted:
            return proc
        if not proc.alive():
            raise proc.fail(f"exited with status {proc.popen.returncode}")
        time.sleep(0.1)
    shown = "no answer" if last is None else health_pb2.HealthCheckResponse.ServingStatus.Name(last)
    raise proc.fail(f"health not SERVING after {deadline_s:.0f} s (last: {shown})")
