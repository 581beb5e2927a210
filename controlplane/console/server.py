"""The console's HTTP listener: uvicorn inside the control plane's event loop, like the callback
ingress (`startup`/`shutdown`, not `serve`, which would take over the signal handlers)."""

from __future__ import annotations

import errno
import logging
import socket
from typing import Any

import uvicorn

from vidroute_core.wire.listen import PortInUse

log = logging.getLogger(__name__)
CONSOLE_LISTEN_FIX = "set VIDROUTE_CONSOLE_LISTEN to a free host:port (or empty: no console)"


class ConsoleServer:
    """`bind` (a busy port is `PortInUse` before anything starts), `start(app)`, `stop`."""

    def __init__(self, listen: str, *, shutdown_grace_s: float = 5.0) -> None:
        host, _, port = listen.rpartition(":")
        self._host, self._port = host.strip("[]") or "127.0.0.1", int(port)
        self._grace = shutdown_grace_s
        self._socket: socket.socket | None = None
        self._server: uvicorn.Server | None = None

    @property
    def url(self) -> str:
        assert self._socket is not None, "bind() first"
        host, port = self._socket.getsockname()[:2]
        return f"http://{host}:{port}"

    def bind(self) -> None:
        family = socket.AF_INET6 if ":" in self._host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((self._host, self._port))
        except OSError as exc:
            sock.close()
            if exc.errno != errno.EADDRINUSE:
                raise
            raise PortInUse(f"{self._host}:{self._port}", CONSOLE_LISTEN_FIX) from exc
        sock.setblocking(False)
        self._socket = sock

    async def start(self, app: Any) -> None:
        if self._socket is None:
            self.bind()
        assert self._socket is not None
        config = uvicorn.Config(
            app,
            ws="none",
            lifespan="off",
            log_config=None,  # the control plane's logging, not uvicorn's dictConfig
            access_log=False,
            proxy_headers=False,
            server_header=False,
            timeout_graceful_shutdown=max(1, round(self._grace)),
        )
        config.load()
        server = uvicorn.Server(config)
        server.lifespan = config.lifespan_class(config)
        await server.startup(sockets=[self._socket])
        self._server = server
        log.info("web console listening on %s", self.url)

    async def stop(self) -> None:
        if self._server is not None:
            server, self._server = self._server, None
            await server.shutdown()
        if self._socket is not None:
            self._socket.close()
            self._socket = None
