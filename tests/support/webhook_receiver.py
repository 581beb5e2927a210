"""A caller's webhook receiver for tests: a tiny HTTP/1.1 server on 127.0.0.1 that records every
connection and request (arrival time, headers, body) and answers from a script.

    async with WebhookReceiver([Answer(500), Answer(200)]) as receiver:
        url = receiver.url                      # http://127.0.0.1:<port>/hook
        ...
        await receiver.wait_requests(2, timeout_s=10)

The script's last answer repeats. An answer's `delay_s` holds the reply back after the body was
read (a receiver too slow for the sender's timeout).
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import time
from dataclasses import dataclass, field
from types import TracebackType


@dataclass(frozen=True)
class Answer:
    status: int = 200
    delay_s: float = 0.0
    endless_body: bool = False  # a body that never ends (64 KiB every 20 ms, up to 30 s)
    trickle_headers: bool = False  # a header line one byte per 100 ms (up to 30 s), no end


ENDLESS_FOR_S = 30.0


@dataclass(frozen=True)
class Received:
    at: float  # time.monotonic() when the request was read
    method: str
    path: str
    headers: dict[str, str]
    body: bytes


@dataclass
class WebhookReceiver:
    script: list[Answer] = field(default_factory=lambda: [Answer(200)])
    tls: ssl.SSLContext | None = None  # serve https with this context
    host: str = "127.0.0.1"  # the address it listens on (any of 127.0.0.0/8 on Linux)
    connections: int = 0
    requests: list[Received] = field(default_factory=list)
    _server: asyncio.Server | None = None
    _changed: asyncio.Condition = field(default_factory=asyncio.Condition)

    async def __aenter__(self) -> WebhookReceiver:
        self._server = await asyncio.start_server(self._serve, self.host, 0, ssl=self.tls)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 2.0)

    @property
    def port(self) -> int:
        assert self._server is not None
        return int(self._server.sockets[0].getsockname()[1])

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}/hook"

    async def wait_requests(self, count: int, timeout_s: float) -> list[Received]:
        """The first `count` requests, waiting for them up to `timeout_s`."""
        async with asyncio.timeout(timeout_s), self._changed:
            await self._changed.wait_for(lambda: len(self.requests) >= count)
        return self.requests[:count]

    async def _endless(self, writer: asyncio.StreamWriter, answer: Answer) -> None:
        """A hostile receiver: it answers but never finishes, until the sender hangs up."""
        until = time.monotonic() + ENDLESS_FOR_S
        if answer.trickle_headers:
            writer.write(f"HTTP/1.1 {answer.status} X\r\nx-pad: ".encode())
        else:
            writer.write(f"HTTP/1.1 {answer.status} X\r\nconnection: close\r\n\r\n".encode())
        while time.monotonic() < until:
            writer.write(b"a" if answer.trickle_headers else b"x" * 65536)
            await writer.drain()
            await asyncio.sleep(0.1 if answer.trickle_headers else 0.02)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            lines = head.decode("latin-1").split("\r\n")
            method, path, _ = lines[0].split(" ", 2)
            headers = {}
            for line in lines[1:]:
                if ":" in line:
                    name, _, value = line.partition(":")
                    headers[name.strip().lower()] = value.strip()
            body = await reader.readexactly(int(headers.get("content-length", "0")))
            answer = self.script[min(len(self.requests), len(self.script) - 1)]
            async with self._changed:
                self.requests.append(Received(time.monotonic(), method, path, headers, body))
                self._changed.notify_all()
            if answer.delay_s:
                await asyncio.sleep(answer.delay_s)  # the scripted slowness under test
            if answer.endless_body or answer.trickle_headers:
                await self._endless(writer, answer)
                return
            reply = f"HTTP/1.1 {answer.status} X\r\ncontent-length: 2\r\nconnection: close\r\n"
            writer.write(f"{reply}\r\nok".encode())
            await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, ssl.SSLError):
            pass
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()
