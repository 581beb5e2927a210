"""The Cog backend's webhook receiver: ``POST /cog/webhooks/{prediction id}`` into the journal.

coglet sends ``start`` and ``completed`` webhooks (the ones the sidecar asks for) with
``Authorization: Bearer $WEBHOOK_AUTH_TOKEN`` when the server has that variable; the receiver
then requires the same token (the account's credential), compared in constant time. A webhook
is answered 200 only after it is journaled (fsync'd), so coglet keeps retrying a terminal one
(200 ms doubling, measured) while the sidecar is down or restarting instead of losing it.
The body must be a JSON object whose ``id`` is the path's; anything else is 400, a body over
the limit 413, a wrong token 401. Served by uvicorn on a socket bound early so the public URL
is known before the first submit.
"""

from __future__ import annotations

import hmac
import json
import logging
import re
import socket
from collections.abc import Callable

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route

from adapter_sidecars.selfhosted.cog_journal import PredictionJournal

__all__ = ["WEBHOOK_PATH", "WebhookReceiver"]

log = logging.getLogger(__name__)
WEBHOOK_PATH = "/cog/webhooks"
_ID = re.compile(r"[A-Za-z0-9._:-]{1,200}")
_MAX_BODY = 512 * 1024 * 1024  # a data: URL carries the whole video


class WebhookReceiver:
    """`bind` (the URL is known), `start`, `stop` (see the module docstring)."""

    def __init__(
        self,
        journal: PredictionJournal,
        listen: str,
        *,
        token: Callable[[], str] | None = None,
        public_url: str = "",
        max_body_bytes: int = _MAX_BODY,
    ) -> None:
        host, _, port = listen.rpartition(":")
        self._host, self._port = host.strip("[]") or "127.0.0.1", int(port or 0)
        self.journal = journal
        self._token = token
        self._public_url = public_url.rstrip("/")
        self._max_body = max_body_bytes
        self._socket: socket.socket | None = None
        self._server: uvicorn.Server | None = None

    @property
    def url(self) -> str:
        """The base URL coglet calls back (configured, else the bound address)."""
        if self._public_url:
            return self._public_url
        if self._socket is None:
            self.bind()
        assert self._socket is not None
        host, port = self._socket.getsockname()[:2]
        return f"http://{host}:{port}"

    def webhook_url(self, prediction_id: str) -> str:
        """Where coglet reports `prediction_id`."""
        return f"{self.url}{WEBHOOK_PATH}/{prediction_id}"

    def bind(self) -> None:
        family = socket.AF_INET6 if ":" in self._host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self._host, self._port))
        sock.setblocking(False)
        self._socket = sock

    async def start(self) -> None:
        if self._socket is None:
            self.bind()
        assert self._socket is not None
        app = Starlette(routes=[Route(WEBHOOK_PATH + "/{pid}", self._hook, methods=["POST"])])
        config = uvicorn.Config(
            app,
            ws="none",
            lifespan="off",
            log_config=None,
            access_log=False,
            server_header=False,
        )
        config.load()
        server = uvicorn.Server(config)
        server.lifespan = config.lifespan_class(config)
        await server.startup(sockets=[self._socket])
        self._server = server
        log.info("cog webhooks received on %s%s", self.url, WEBHOOK_PATH)

    async def stop(self) -> None:
        if self._server is not None:
            server, self._server = self._server, None
            await server.shutdown()
        if self._socket is not None:
            self._socket.close()
            self._socket = None

    async def _hook(self, request: Request) -> Response:
        pid = request.path_params["pid"]
        if not _ID.fullmatch(pid):
            return PlainTextResponse("bad prediction id", status_code=400)
        if self._token is not None:
            expected = f"Bearer {self._token()}".encode()
            given = request.headers.get("authorization", "").encode()
            if not hmac.compare_digest(expected, given):
                return PlainTextResponse("unauthorized", status_code=401)
        declared = request.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > self._max_body:
            return PlainTextResponse("too large", status_code=413)
        try:
            body = json.loads(await request.body())
        except ValueError:
            return PlainTextResponse("not JSON", status_code=400)
        if not isinstance(body, dict) or body.get("id") != pid:
            return PlainTextResponse("id does not match the path", status_code=400)
        self.journal.received(pid, body)
        log.info("cog webhook %s: %s", pid, body.get("status"))
        return PlainTextResponse("ok")
