"""A refusal is in force for pooled connections the moment `close_listener` returns.

The emulator acknowledges a ``refuse_connection`` fault right after closing its listener and
its idle keep-alives. If those keep-alives were closed only on the event loop's next iteration
(asyncio's `transport.abort()`), a client that saw the acknowledgement could still reuse one
while the emulator's process waits for a CPU, and its request would die with a read error:
to an adapter, a submit that may have been received. Here the server's loop is held right
after `close_listener`, as a loaded host would hold it.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator

import httpx
import pytest

from adapter_sidecars.emulators.http import BodyReader, HttpServer, Request, Response

HELD_S = 1.0


async def _ok(request: Request, read_body: BodyReader) -> Response:
    await read_body(None)
    return Response.json({"ok": True}, 200)


class _ServerThread:
    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.server = HttpServer(_ok)
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)

    def __enter__(self) -> _ServerThread:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self.server.start(), self.loop).result(10)
        return self

    def __exit__(self, *exc: object) -> None:
        asyncio.run_coroutine_threadsafe(self.server.stop(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        self.loop.close()

    def refuse_and_hold(self) -> threading.Event:
        """Close the listener on the server's loop, then keep the loop busy for HELD_S."""
        closed = threading.Event()

        def refuse() -> None:
            self.server.close_listener()
            closed.set()
            time.sleep(HELD_S)  # the loop runs nothing else meanwhile

        self.loop.call_soon_threadsafe(refuse)
        return closed


@pytest.fixture
def served() -> Iterator[_ServerThread]:
    with _ServerThread() as served:
        yield served


def test_a_pooled_connection_is_closed_before_the_refusal_is_acknowledged(
    served: _ServerThread,
) -> None:
    """A request after `close_listener` returns fails to connect; it never rides a keep-alive
    into a read error."""
    with httpx.Client(base_url=served.server.url, timeout=5 * HELD_S) as client:
        assert client.get("/").status_code == 200  # leaves a keep-alive in the pool
        assert served.refuse_and_hold().wait(5)
        with pytest.raises(httpx.ConnectError):
            client.get("/")
