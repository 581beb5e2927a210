"""Binding a gRPC server's port so that a busy port is an error, said in one line.

gRPC's C core binds with ``SO_REUSEPORT`` by default: a second server on a port another process
already listens on "succeeds", and the kernel then splits connections between the two. Every
server of ours is built with `SERVER_OPTIONS` (``grpc.so_reuseport`` 0), and `bind` first
probes the address with a plain socket (``SO_REUSEADDR``, as gRPC sets it, so a port with
connections in TIME_WAIT still binds; not ``SO_REUSEPORT``), so the usual case is refused
before gRPC's own bind logs anything; gRPC's bind failure (a race) becomes the same error.
"""

from __future__ import annotations

import contextlib
import errno
import socket
from collections.abc import Callable

# Options for every grpc.aio.server of the control plane and the sidecars.
SERVER_OPTIONS: tuple[tuple[str, int], ...] = (("grpc.so_reuseport", 0),)


class PortInUse(OSError):
    """The listen address is taken; the message says by what, probably, and the fix."""

    def __init__(self, listen: str, fix: str) -> None:
        super().__init__(errno.EADDRINUSE, f"{_port_text(listen)} is in use: {fix}")
        self.listen = listen

    def __str__(self) -> str:
        return str(self.strerror)


def _port_text(listen: str) -> str:
    host, _, port = listen.rpartition(":")
    return f"port {port} ({listen})" if host and port else f"address {listen}"


def _split(listen: str) -> tuple[str, int] | None:
    host, sep, port = listen.rpartition(":")
    if not sep or not port.isdigit():
        return None
    return host.strip("[]"), int(port)


def address_in_use(listen: str) -> bool:
    """Whether something listens on `listen` already (port 0 and unparsable addresses: no)."""
    parsed = _split(listen)
    if parsed is None or parsed[1] == 0:
        return False
    host, port = parsed
    try:
        infos = socket.getaddrinfo(
            host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )
    except OSError:
        return False  # gRPC's bind reports an unresolvable host
    for family, kind, proto, _, sockaddr in infos:
        with contextlib.closing(socket.socket(family, kind, proto)) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                with contextlib.suppress(OSError):
                    probe.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            try:
                probe.bind(sockaddr)
            except OSError as exc:
                if exc.errno == errno.EADDRINUSE:
                    return True
    return False


def bind(add_port: Callable[[str], int], listen: str, *, fix: str) -> int:
    """``add_port(listen)`` (a server's ``add_insecure_port`` or a partial of
    ``add_secure_port``) -> the bound port; `PortInUse` naming `fix` when the address is taken,
    OSError when it cannot be bound at all."""
    if address_in_use(listen):
        raise PortInUse(listen, fix)
    try:
        port = add_port(listen)
    except RuntimeError as exc:  # grpcio >= 1.5x raises instead of returning 0
        if address_in_use(listen):
            raise PortInUse(listen, fix) from None
        raise OSError(f"cannot listen on {listen}: {exc}") from None
    if port == 0:
        raise OSError(f"cannot listen on {listen}")
    return port
