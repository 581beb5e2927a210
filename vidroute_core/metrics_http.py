"""The /metrics HTTP endpoint every process serves (the control plane and each sidecar).

Each process keeps its own `CollectorRegistry` (tests run several in one interpreter); this
serves one on ``host:port`` from prometheus_client's threaded WSGI server.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from dataclasses import dataclass
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, start_http_server

log = logging.getLogger(__name__)


@dataclass
class MetricsServer:
    """The /metrics HTTP endpoint of one process."""

    httpd: WSGIServer
    thread: threading.Thread

    @property
    def port(self) -> int:
        return int(self.httpd.server_port)

    async def stop(self) -> None:
        await asyncio.to_thread(self.httpd.shutdown)
        self.httpd.server_close()


def serve_metrics(registry: CollectorRegistry, listen: str) -> MetricsServer:
    """Serve `registry` on ``host:port`` (port 0: any free port) at /metrics."""
    host, _, port = listen.rpartition(":")
    httpd, thread = start_http_server(int(port), addr=host or "0.0.0.0", registry=registry)
    log.info("metrics on http://%s:%d/metrics", host or "0.0.0.0", httpd.server_port)
    return MetricsServer(httpd, thread)
