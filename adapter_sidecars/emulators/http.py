"""A tiny asyncio HTTP/1.1 server on h11, with socket-level hooks for fault injection.

Why not a framework: the emulators must be able to stop reading half way through a body,
reset a connection after creating a job, or stop listening altogether. Those are socket
decisions, so the server owns the sockets and hands each request to a `RequestHandler`
that may return a `Response` or an `Abort` (close the connection without answering).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import socket
import struct
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl, urlsplit

import h11

MAX_BODY = 64 * 1024 * 1024


@dataclass
class Request:
    """One parsed request; `body` is empty until the server has read it."""

    method: str
    path: str
    query: dict[str, str]
    headers: dict[str, str]
    body: bytes = b""
    params: dict[str, str] = field(default_factory=dict)
    context: dict[str, Any] = field(default_factory=dict)

    def header(self, name: str) -> str | None:
        return self.headers.get(name.lower())

    def json(self) -> Any:
        """Decode the body; raises `ValueError` when it is not JSON."""
        return json.loads(self.body.decode("utf-8")) if self.body else None

    @property
    def content_length(self) -> int:
        try:
            return int(self.headers.get("content-length", "0"))
        except ValueError:
            return 0


@dataclass
class Response:
    """A complete response; `headers` never carries Content-Length (the server sets it)."""

    status: int
    body: bytes = b""
    headers: list[tuple[str, str]] = field(default_factory=list)

    @classmethod
    def json(
        cls, obj: Any, status: int = 200, headers: list[tuple[str, str]] | None = None
    ) -> Response:
        body = json.dumps(obj, separators=(",", ":")).encode()
        return cls(status, body, [("content-type", "application/json"), *(headers or [])])

    @classmethod
    def empty(cls, status: int = 204, headers: list[tuple[str, str]] | None = None) -> Response:
        return cls(status, b"", list(headers or []))

    def json_body(self) -> Any:
        return json.loads(self.body) if self.body else None


Handler = Callable[[Request], Awaitable[Response]]


class Router:
    """Method + path-pattern routing; `{name}` captures one segment (no `/` or `:`)."""

    def __init__(self) -> None:
        self._routes: list[tuple[str, re.Pattern[str], Handler]] = []

    def add(self, method: str, pattern: str, handler: Handler) -> None:
        regex = re.sub(r"\\\{(\w+)\\\}", r"(?P<\1>[^/:]+)", re.escape(pattern))
        self._routes.append((method.upper(), re.compile(f"^{regex}$"), handler))

    def resolve(self, method: str, path: str) -> tuple[Handler | None, dict[str, str], bool]:
        """Return (handler, params, path_known); path_known without handler means 405."""
        path_known = False
        for route_method, regex, handler in self._routes:
            match = regex.match(path)
            if match is None:
                continue
            path_known = True
            if route_method == method:
                return handler, match.groupdict(), True
        return None, {}, path_known


@dataclass
class Abort:
    """Close the connection without a response; `reset` sends a TCP RST."""

    reset: bool = True


BodyReader = Callable[[int | None], Awaitable[bytes]]
RequestHandler = Callable[[Request, BodyReader], Awaitable[Response | Abort]]


class HttpServer:
    """Serve `handler` on a listening socket that can be closed and reopened on the same port."""

    def __init__(self, handler: RequestHandler) -> None:
        self._handler = handler
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._idle: set[asyncio.StreamWriter] = set()
        self.host = "127.0.0.1"
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> None:
        self.host = host
        self._server = await asyncio.start_server(self._on_connect, host, port, reuse_address=True)
        self.port = self._server.sockets[0].getsockname()[1]

    def close_listener(self) -> None:
        """Close the listening socket (new connects are refused) and drop idle keep-alives.

        Synchronous on purpose: when it returns, no client can reach us through a new or a
        pooled connection, so a fault that refuses connections is in force before it is
        acknowledged.
        """
        if self._server is not None:
            self._server.close()
            self._server = None
        for writer in list(self._idle):
            _shut(writer)

    async def stop_listening(self) -> None:
        self.close_listener()

    async def resume_listening(self) -> None:
        if self._server is None:
            self._server = await asyncio.start_server(
                self._on_connect, self.host, self.port, reuse_address=True
            )

    async def stop(self) -> None:
        await self.stop_listening()
        # A connection accepted just before the listener closed gets its handler task on a
        # later loop iteration: yield a few times so none is left with an open transport.
        for _ in range(3):
            await asyncio.sleep(0)
            tasks = list(self._tasks)
            for task in tasks:
                task.cancel()
            if tasks:
                await asyncio.gather(*tasks, return_exceptions=True)

    async def _on_connect(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            await self._serve(reader, writer)
        except (ConnectionError, h11.ProtocolError, asyncio.IncompleteReadError):
            pass
        except asyncio.CancelledError:
            # Only `stop()` cancels these; re-raising would make asyncio's stream callback
            # log the cancellation as an unhandled error.
            pass
        finally:
            self._tasks.discard(task)
            self._idle.discard(writer)
            writer.transport.abort()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn = h11.Connection(h11.SERVER)
        while True:
            self._idle.add(writer)
            event = await _next_event(conn, reader)
            self._idle.discard(writer)
            if not isinstance(event, h11.Request):
                return
            request = _to_request(event)
            read_body = _BodyReader(conn, reader)
            outcome = await self._handler(request, read_body)
            if isinstance(outcome, Abort):
                _abort(writer, outcome.reset)
                return
            if conn.their_state is h11.SEND_BODY:
                await read_body(None)
            # Refusing connections: say so in the response, so that no client pools this
            # connection and carries its next request into our close.
            _write(conn, writer, outcome, close=self._server is None)
            if conn.our_state is h11.MUST_CLOSE or conn.their_state is h11.MUST_CLOSE:
                return
            conn.start_next_cycle()
            # Idle from the moment its response is written, with no await in between: a
            # refusal that starts while the response drains (or before this task runs again)
            # drops this connection too, so a client can never reuse it into a reset.
            self._idle.add(writer)
            await writer.drain()


class _BodyReader:
    """Reads a request body incrementally; calling it with a limit stops early (partial read)."""

    def __init__(self, conn: h11.Connection, reader: asyncio.StreamReader) -> None:
        self._conn, self._reader = conn, reader
        self._received = bytearray()

    async def __call__(self, limit: int | None = None) -> bytes:
        while self._conn.their_state is h11.SEND_BODY and (
            limit is None or len(self._received) < limit
        ):
            event = await _next_event(self._conn, self._reader)
            if isinstance(event, h11.Data):
                self._received.extend(event.data)
                if len(self._received) > MAX_BODY:
                    raise ConnectionError("body too large")
            elif not isinstance(event, h11.EndOfMessage):
                raise ConnectionError("connection closed while reading body")
        return bytes(self._received)


async def _next_event(conn: h11.Connection, reader: asyncio.StreamReader) -> Any:
    while True:
        event = conn.next_event()
        if event is not h11.NEED_DATA:
            return event
        data = await reader.read(65536)
        conn.receive_data(data)


def _to_request(event: h11.Request) -> Request:
    target = urlsplit(event.target.decode("latin-1"))
    headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in event.headers}
    return Request(
        method=event.method.decode("ascii").upper(),
        path=target.path,
        query=dict(parse_qsl(target.query, keep_blank_values=True)),
        headers=headers,
    )


def _write(
    conn: h11.Connection, writer: asyncio.StreamWriter, response: Response, *, close: bool
) -> None:
    """Write `response` to the transport (its buffer drains afterwards); `close` adds
    ``Connection: close``."""
    headers = [*response.headers]
    if close:
        headers.append(("connection", "close"))
    if response.status not in (204, 304):
        headers.append(("content-length", str(len(response.body))))
    data = conn.send(h11.Response(status_code=response.status, headers=headers))
    if response.body:
        data += conn.send(h11.Data(data=response.body))
    data += conn.send(h11.EndOfMessage())
    writer.write(data)


def _shut(writer: asyncio.StreamWriter) -> None:
    """Close a connection now. `transport.abort()` closes the socket only on the loop's next
    iteration, so a response written in between (the one acknowledging a refusal) could reach
    a client while its pooled connection still looks alive; shutting the socket down first
    makes the client see the close before anything we write after this."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)
    writer.transport.abort()


def _abort(writer: asyncio.StreamWriter, reset: bool) -> None:
    sock = writer.get_extra_info("socket")
    if reset and sock is not None:
        # SO_LINGER with a zero timeout makes close() send RST instead of FIN.
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()
