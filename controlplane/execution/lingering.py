"""A lingering close for the callback ingress: the response survives a client that keeps sending.

When a server closes a TCP connection whose client is still sending (a 408 to a slowloris, a 413
to an oversize body, a keep-alive connection reused just as it idles out), the bytes that arrive
after the close, or that sit unread in the socket when it closes, make the kernel answer with a
reset instead of an orderly end. The reset can overtake the response: the peer's kernel may drop
what it has not handed over yet, and a client library that sees the error first (asyncio's
streams do) reports "connection reset" instead of the status it was sent.

So the ingress closes the way RFC 9112 section 9.6 asks and Apache's ``lingering_close`` does:
send the response, shut down the sending side (a FIN after the last byte), keep reading and
dropping what still arrives, and close for good when the client ends its side or after
``linger_s``, whichever comes first. A client that keeps sending past that gets its reset,
having had `linger_s` to read the answer; a server shutdown does not wait for the linger.

`LingeringTransport` wraps the connection's transport so that every close uvicorn makes (after a
``connection: close`` response, on a bad request, at the keep-alive timeout) and ours (the head
deadline) lingers; the protocol drops the data it receives while `lingering`.
"""

from __future__ import annotations

import asyncio
from typing import Any

__all__ = ["LingeringTransport"]


class LingeringTransport(asyncio.Transport):
    """`inner` with `close` made a lingering close; everything else is passed through."""

    def __init__(self, inner: asyncio.Transport, linger_s: float) -> None:
        super().__init__()
        self._inner = inner
        self._linger_s = linger_s
        self._timer: asyncio.TimerHandle | None = None
        self._lingering = False

    @property
    def lingering(self) -> bool:
        """The response is out and the sending side shut: what arrives now is to be dropped."""
        return self._lingering

    def close(self) -> None:
        if self._lingering or self._inner.is_closing():
            return
        if not self._inner.can_write_eof():
            self._inner.close()
            return
        self._lingering = True
        try:
            self._inner.write_eof()  # the FIN goes out after what is still buffered
        except OSError:  # the peer is gone already: nothing left to protect
            self._inner.close()
            return
        self._inner.resume_reading()  # drain even if the request's reader was paused
        self._timer = asyncio.get_running_loop().call_later(self._linger_s, self.close_now)

    def close_now(self) -> None:
        """Close without lingering (the linger is over, the client ended, the server stops)."""
        self.forget_timer()
        self._inner.close()

    def forget_timer(self) -> None:
        """The connection is gone: no close is due any more."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def is_closing(self) -> bool:
        return self._lingering or self._inner.is_closing()

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if not self._lingering:  # after a close, as asyncio's own transports do: dropped
            self._inner.write(data)

    def abort(self) -> None:
        self.forget_timer()
        self._inner.abort()

    def pause_reading(self) -> None:
        if not self._lingering:  # a lingering connection must keep draining
            self._inner.pause_reading()

    def resume_reading(self) -> None:
        self._inner.resume_reading()

    def is_reading(self) -> bool:
        return self._inner.is_reading()

    def write_eof(self) -> None:
        self._inner.write_eof()

    def can_write_eof(self) -> bool:
        return self._inner.can_write_eof()

    def get_write_buffer_size(self) -> int:
        return self._inner.get_write_buffer_size()

    def get_write_buffer_limits(self) -> tuple[int, int]:
        return self._inner.get_write_buffer_limits()

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        self._inner.set_write_buffer_limits(high, low)

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self._inner.get_extra_info(name, default)

    def set_protocol(self, protocol: asyncio.BaseProtocol) -> None:
        self._inner.set_protocol(protocol)

    def get_protocol(self) -> asyncio.BaseProtocol:
        return self._inner.get_protocol()
