"""The one HTTP ingress for every provider's callbacks: ``POST /callbacks/{provider}`` on uvicorn.

The endpoint faces the internet, so the HTTP layer bounds what a client can hold: a request
head must arrive within `CallbackLimits.head_timeout_s` (a half-sent request is answered 408 and
closed: no slowloris), a body within `body_timeout_s`, an idle keep-alive connection is closed
after `keep_alive_s`; a head past `max_head_bytes` is 400 (h11's limit), a body past
`max_body_bytes` 413. Every request gets a status; malformed input is 400 and never an
exception. A connection the ingress closes is closed lingering (`lingering`): the response, a
FIN, then what the client still sends is read and dropped for at most `linger_s`, so a client
that keeps sending reads its 408 or 413 rather than a reset. What a verified callback means is
`callbacks.CallbackReceiver`'s business.

uvicorn runs as a library inside the control plane's event loop (`startup`/`shutdown`, not
`serve`, which would take over the process's signal handlers) with a plain ASGI callable:
one route needs no framework.
"""

from __future__ import annotations

import asyncio
import logging
import re
import socket
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl

import h11
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from controlplane.execution.callbacks import SIGNATURE_HEADER, CallbackReceiver
from controlplane.execution.lingering import LingeringTransport
from vidroute_core.exceptions import Unavailable

__all__ = ["CallbackLimits", "CallbackServer"]

log = logging.getLogger(__name__)
Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

_ROUTE = re.compile(rb"/callbacks/([A-Za-z0-9_.-]{1,64})/?")
_SIGNATURE = SIGNATURE_HEADER.lower().encode()
_REASONS = {
    400: b"malformed callback\n",
    401: b"signature not verified\n",
    404: b"no such callback route\n",
    405: b"callbacks are POSTed\n",
    408: b"request not received in time\n",
    413: b"callback body too large\n",
    500: b"internal error\n",
    503: b"try again later\n",
}
_TIMEOUT_408 = b"HTTP/1.1 408 Request Timeout\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
# The least linger whatever the time scale: a client on a loaded machine needs this long to be
# scheduled and read its response before a late byte of its own turns the close into a reset.
MIN_LINGER_S = 2.0


@dataclass(frozen=True)
class CallbackLimits:
    """What one client may hold of the ingress; durations follow the time scale."""

    head_timeout_s: float = 10.0  # from connect (or the previous response) to a full head
    body_timeout_s: float = 30.0
    keep_alive_s: float = 5.0
    linger_s: float = 5.0  # a closed connection drains this long (never under MIN_LINGER_S)
    shutdown_grace_s: float = 5.0
    max_head_bytes: int = 16 * 1024
    max_body_bytes: int = 1024 * 1024
    max_query_fields: int = 16
    max_connections: int = 1000  # past it: 503 (uvicorn's limit_concurrency)


class _HeadTimedH11(H11Protocol):
    """uvicorn's h11 protocol plus a deadline for the request head, which uvicorn lacks."""

    head_timeout_s = 10.0
    keep_alive_s = 5.0
    linger_s = MIN_LINGER_S
    _head_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]  # uvicorn types it BaseTransport; asyncio hands a Transport
        # uvicorn and the cycles it starts see only the wrapper: each of their closes lingers.
        self._linger = LingeringTransport(transport, self.linger_s)
        super().connection_made(self._linger)
        # Fractional seconds (uvicorn's Config types it int; its timer takes a float): the
        # time scale shrinks it below one second.
        self.timeout_keep_alive = self.keep_alive_s  # type: ignore[assignment]  # uvicorn's Config says int; its timer takes a float
        self._arm_head_timer()

    def data_received(self, data: bytes) -> None:
        if self._linger.lingering:  # answered and closing: read only to keep the close clean
            return
        super().data_received(data)
        self._disarm_once_head_read()

    def eof_received(self) -> None:
        # The client ended its side: nothing more can arrive to reset the close. Returning None
        # lets asyncio close the transport, as uvicorn's own eof_received does.
        self._linger.forget_timer()

    def shutdown(self) -> None:
        if self._linger.lingering:  # the server stops: it does not wait out a linger
            self._linger.close_now()
            return
        super().shutdown()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing():
            self._arm_head_timer()  # the next request's head has the same deadline
            self._disarm_once_head_read()  # unless a pipelined one was already parsed

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_head_timer()
        self._linger.forget_timer()
        super().connection_lost(exc)

    def _arm_head_timer(self) -> None:
        self._cancel_head_timer()
        self._head_timer = self.loop.call_later(self.head_timeout_s, self._head_timed_out)

    def _cancel_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _disarm_once_head_read(self) -> None:
        if self.conn.their_state is not h11.IDLE:  # h11 parsed a Request: the head is in
            self._cancel_head_timer()

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if self.transport.is_closing() or self.conn.their_state is not h11.IDLE:
            return
        if self.conn.trailing_data[0]:  # part of a head arrived: say why we hang up
            self.transport.write(_TIMEOUT_408)
        self.transport.close()


class CallbackServer:
    """The ingress: `bind` (so the public URL is known early), `start(receiver)`, `stop`."""

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        limits: CallbackLimits | None = None,
    ) -> None:
        self._host, self._port = host, port
        self.limits = limits or CallbackLimits()
        self._receiver: CallbackReceiver | None = None
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
        sock.bind((self._host, self._port))
        sock.setblocking(False)
        self._socket = sock

    async def start(self, receiver: CallbackReceiver) -> None:
        if self._socket is None:
            self.bind()
        assert self._socket is not None
        self._receiver, limits = receiver, self.limits
        timing = {
            "head_timeout_s": limits.head_timeout_s,
            "keep_alive_s": limits.keep_alive_s,
            "linger_s": max(limits.linger_s, MIN_LINGER_S),
        }
        protocol = type("HeadTimedH11", (_HeadTimedH11,), timing)
        config = uvicorn.Config(
            self._app,
            http=protocol,
            ws="none",
            lifespan="off",
            interface="asgi3",
            log_config=None,  # the control plane's logging, not uvicorn's dictConfig
            access_log=False,
            proxy_headers=False,
            server_header=False,
            timeout_graceful_shutdown=max(1, round(self.limits.shutdown_grace_s)),
            h11_max_incomplete_event_size=self.limits.max_head_bytes,
            limit_concurrency=self.limits.max_connections,
        )
        config.load()
        server = uvicorn.Server(config)
        server.lifespan = config.lifespan_class(config)
        await server.startup(sockets=[self._socket])
        self._server = server
        log.info("callback ingress listening on %s", self.url)

    async def stop(self) -> None:
        if self._server is not None:
            server, self._server = self._server, None
            await server.shutdown()
        if self._socket is not None:
            self._socket.close()
            self._socket = None

    async def _app(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        status = await self._status(scope, receive)
        if status is None:  # the client went away: nobody to answer
            return
        headers = [
            (b"content-type", b"text/plain"),
            (b"content-length", b"%d" % len(_REASONS.get(status, b""))),
        ]
        if status in (408, 413):  # the rest of the body is unread: the connection cannot go on
            headers.append((b"connection", b"close"))
        if status == 405:
            headers.append((b"allow", b"POST"))
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": _REASONS.get(status, b"")})

    async def _status(self, scope: Scope, receive: Receive) -> int | None:
        route = _ROUTE.fullmatch(scope.get("raw_path") or b"")
        if route is None:
            return 404
        if scope["method"] != "POST":
            return 405
        headers: dict[bytes, bytes] = dict(scope["headers"])
        declared = headers.get(b"content-length")  # h11 checked it is decimal
        if declared is not None and (
            len(declared) > 19 or int(declared) > self.limits.max_body_bytes
        ):
            return 413
        body = await self._body(receive)
        if not isinstance(body, bytes):
            return body
        try:
            query = dict(
                parse_qsl(
                    scope["query_string"].decode("ascii"),
                    max_num_fields=self.limits.max_query_fields,
                    errors="strict",
                )
            )
            raw_signature = headers.get(_SIGNATURE)
            signature = None if raw_signature is None else raw_signature.decode("ascii")
        except (UnicodeDecodeError, ValueError):  # non-ASCII, bad %-escapes, too many fields
            return 400
        assert self._receiver is not None
        provider = route.group(1).decode("ascii")
        try:
            return await self._receiver.handle(provider, signature, body, query)
        except (OSError, TimeoutError, Unavailable) as exc:  # the database or Redis is away
            log.warning("callback for %s not processed, answering 503: %r", provider, exc)
            return 503
        except Exception:  # a bug: logged once, with its traceback, the sender retries
            log.exception("callback for %s failed", provider)
            return 500

    async def _body(self, receive: Receive) -> bytes | int | None:
        """The whole body, 413 past the size limit, 408 past the deadline, None if gone."""
        chunks, size = [], 0
        try:
            async with asyncio.timeout(self.limits.body_timeout_s):
                while True:
                    message = await receive()
                    if message["type"] == "http.disconnect":
                        return None
                    chunk = message.get("body", b"")
                    size += len(chunk)
                    if size > self.limits.max_body_bytes:
                        return 413
                    chunks.append(chunk)
                    if not message.get("more_body", False):
                        return b"".join(chunks)
        except TimeoutError:
            return 408
