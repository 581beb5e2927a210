"""A second `vidroute up` on the fixed dev ports refuses before it starts any child (issue 13:
"a second `up` on the same port also serves"): one line naming the port and
``--ephemeral-ports``, not a sidecar's crash or the other stack's emulator answering."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from clients.devstack import Supervisor, start_stack
from controlplane.startup import EXIT_CONFIG, StartupRefused


@pytest.fixture
def held_port() -> Iterator[int]:
    """A loopback port a listening socket holds, as another stack's emulator would."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        yield int(holder.getsockname()[1])


def test_a_busy_dev_port_refuses_the_stack_before_any_child(tmp_path: Path, held_port: int) -> None:
    """start_stack with an emulator port something holds raises StartupRefused (exit 78) naming
    the port and the ephemeral-ports fix, and has started no process."""
    supervisor = Supervisor(tmp_path / "var")
    with pytest.raises(StartupRefused) as refused:
        start_stack(supervisor, {"runway": held_port}, {"runway": 0})
    assert refused.value.code == EXIT_CONFIG
    assert f"port {held_port} (127.0.0.1:{held_port}) is in use" in str(refused.value)
    assert "--ephemeral-ports" in str(refused.value)
    assert not list((tmp_path / "var" / "log").iterdir())  # no child wrote a log
