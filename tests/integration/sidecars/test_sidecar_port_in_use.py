"""A sidecar on a port something else holds refuses to start (issue 13, fail fast): in process
`PortInUse` naming the fix; as a process one line on stderr and exit status 2, no traceback."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from adapter_sidecars.common.server import SidecarServer
from adapter_sidecars.runway.adapter import RunwayAdapter
from vidroute_core.wire.listen import PortInUse

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture
def held_port() -> Iterator[int]:
    """A loopback port another process's listening socket holds (no SO_REUSEPORT)."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        yield int(holder.getsockname()[1])


async def test_a_sidecar_on_a_held_port_raises_port_in_use(
    runway_adapter: RunwayAdapter, held_port: int
) -> None:
    """SidecarServer.start on a taken port raises PortInUse saying which port and how to fix."""
    server = SidecarServer(runway_adapter, f"127.0.0.1:{held_port}", shutdown_grace_seconds=0.1)
    with pytest.raises(PortInUse) as refused:
        await server.start()
    assert f"port {held_port} (127.0.0.1:{held_port}) is in use" in str(refused.value)
    assert "VIDROUTE_ADAPTER_LISTEN" in str(refused.value)


async def test_the_sidecar_command_on_a_held_port_says_so_in_one_line(held_port: int) -> None:
    """`python -m adapter_sidecars.runway --listen <taken>` exits 2 with one line, no traceback."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("VIDROUTE_")}
    env["PYTHONPATH"] = str(ROOT)
    done = await asyncio.to_thread(
        subprocess.run,
        [
            sys.executable,
            "-m",
            "adapter_sidecars.runway",
            *("--config", str(ROOT / "adapter_sidecars/runway/config.example.yaml")),
            *("--listen", f"127.0.0.1:{held_port}"),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    lines = [line for line in done.stderr.splitlines() if "is in use" in line]
    assert lines == [
        f"vidroute-adapter-runway: port {held_port} (127.0.0.1:{held_port}) is in use: another "
        "sidecar, or a vidroute up? Stop it, or set --listen (or VIDROUTE_ADAPTER_LISTEN) to a "
        "free address, e.g. 127.0.0.1:0"
    ], done.stderr
