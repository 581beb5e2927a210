"""A real local HTTP server that plays a provider's output host: files, redirects, errors."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit


@dataclass(frozen=True)
class Route:
    """One canned response; `content_length=False` sends the body until the connection closes."""

    status: int = 200
    body: bytes = b""
    headers: dict[str, str] = field(default_factory=dict)
    content_length: bool = True


class FileServer:
    """Routes by path (query ignored) and records every requested path."""

    def __init__(self, base_url: str) -> None:
        self.base_url = base_url
        self.routes: dict[str, Route] = {}
        self.hits: list[str] = []
        self._lock = threading.Lock()

    def url(self, path: str) -> str:
        return f"{self.base_url}{path}"

    def serve(
        self,
        path: str,
        body: bytes,
        *,
        status: int = 200,
        content_type: str | None = "video/mp4",
        headers: dict[str, str] | None = None,
        content_length: bool = True,
    ) -> str:
        """Answer GET `path` with `body`; returns the URL (with a fake signature query)."""
        all_headers = dict(headers or {})
        if content_type is not None:
            all_headers["Content-Type"] = content_type
        self.routes[path] = Route(status, body, all_headers, content_length)
        return self.url(f"{path}?X-Signature=secret")

    def redirect(self, path: str, target: str, status: int = 302) -> str:
        """Answer GET `path` with a redirect to `target`; returns the URL."""
        self.routes[path] = Route(status, headers={"Location": target})
        return self.url(path)

    def record(self, path: str) -> Route | None:
        with self._lock:
            self.hits.append(path)
        return self.routes.get(urlsplit(path).path)


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def do_GET(self) -> None:
        route = self.server.files.record(self.path) or Route(404, b"not found")
        self.send_response(route.status)
        for name, value in route.headers.items():
            self.send_header(name, value)
        if route.content_length:
            self.send_header("Content-Length", str(len(route.body)))
        self.end_headers()
        # The client may stop reading on purpose (e.g. once max_bytes is reached).
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            self.wfile.write(route.body)

    def log_message(self, format: str, *args: object) -> None:
        pass  # keep test output quiet


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    files: FileServer


@contextmanager
def running_file_server() -> Iterator[FileServer]:
    """A FileServer on 127.0.0.1 with an OS-chosen port, stopped on exit."""
    server = _Server(("127.0.0.1", 0), _Handler)
    host, port = server.server_address[:2]
    server.files = FileServer(f"http://{host!s}:{port}")
    # A short poll interval keeps shutdown() (which waits for the next poll) fast.
    thread = threading.Thread(target=server.serve_forever, args=(0.02,), daemon=True)
    thread.start()
    try:
        yield server.files
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
