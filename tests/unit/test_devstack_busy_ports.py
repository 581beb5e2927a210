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


# Where the kernel takes the local port of an outgoing connection: Linux's default
# net.ipv4.ip_local_port_range, and IANA's dynamic range (macOS, Windows). A listener fixed
# inside one can find its port held by any client connection on a busy machine (issue 25).
EPHEMERAL_RANGES = (range(32768, 61000), range(49152, 65536))


def _dev_ports() -> dict[str, int]:
    """Every fixed port `vidroute up` binds or the CLI and SDK dial by default, by name."""
    from adapter_sidecars.common.config import load_config
    from clients import cli, devstack
    from clients.cli_config import DEFAULT_TARGET as CLI_TARGET
    from clients.sdk._common import DEFAULT_TARGET as SDK_TARGET
    from controlplane.bootstrap import DEFAULT_LISTEN

    ports = {
        "control plane gRPC (DEFAULT_LISTEN)": int(DEFAULT_LISTEN.rsplit(":", 1)[1]),
        "CLI default target": int(CLI_TARGET.rsplit(":", 1)[1]),
        "SDK default target": int(SDK_TARGET.rsplit(":", 1)[1]),
        "control plane /metrics": cli.DEV_METRICS_PORT,
        "console": cli.DEV_CONSOLE_PORT,
        "callback ingress": devstack.DEV_CALLBACK_PORT,
    }
    for name in ("runway", "veo", "selfhosted"):
        ports[f"{name} emulator"] = cli.DEV_PROVIDER_PORTS[name]
        ports[f"{name} sidecar"] = cli.DEV_ADAPTER_PORTS[name]
        ports[f"{name} sidecar /metrics"] = devstack.DEV_METRICS_PORTS[name]
        example = Path(__file__).parents[2] / "adapter_sidecars" / name / "config.example.yaml"
        listen = load_config(example, {}).listen
        ports[f"{name} config.example.yaml listen"] = int(listen.rsplit(":", 1)[1])
    return ports


def test_no_fixed_dev_port_is_in_an_ephemeral_range() -> None:
    """Every fixed port of the dev stack (gRPC, sidecars, emulators, console, metrics, callback
    ingress) and the clients' default target lie outside the ranges outgoing connections use."""
    inside = {
        name: port
        for name, port in _dev_ports().items()
        if any(port in r for r in EPHEMERAL_RANGES)
    }
    assert inside == {}


def test_the_clients_dial_the_port_the_control_plane_listens_on() -> None:
    """The CLI's and the SDK's default target are the control plane's default port."""
    ports = _dev_ports()
    assert ports["CLI default target"] == ports["control plane gRPC (DEFAULT_LISTEN)"]
    assert ports["SDK default target"] == ports["control plane gRPC (DEFAULT_LISTEN)"]
