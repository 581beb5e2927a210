"""Provider callbacks: signature check, then a wake-up for the one event normalizer (9.18.1).

A callback is signed ``X-Vidroute-Signature: t=<unix>,v1=<hex>`` with HMAC-SHA256 over
``f"{t}.{body}"`` and the provider's shared secret; outside the replay window (300 s) or with a
wrong MAC it is rejected and counted. A valid callback is NOT parsed for its status: that is
adapter knowledge. We only take the job id it names (`JobIdExtractor`, default: the first of
``id``/``job_id``/``task_id``/``name`` in the JSON body), ask the adapter for the job with
`get_job`, and feed that snapshot to the normalizer with source ``callback``. A job we have not
recorded yet (the callback beat the submit response) is found through the ``attempt`` query
parameter our callback URL carries, and stored as early evidence.

`CallbackServer` is a minimal asyncio + h11 endpoint for ``POST /callbacks/{provider}``.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import json
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from urllib.parse import parse_qsl, urlsplit

import h11

from controlplane.execution.events import EventNormalizer, EventSource, Observation
from controlplane.execution.outcomes import ExecutionDeps, job_ref

__all__ = ["SIGNATURE_HEADER", "CallbackReceiver", "CallbackServer", "CallbackVerifier"]

log = logging.getLogger(__name__)
SIGNATURE_HEADER = "X-Vidroute-Signature"
JobIdExtractor = Callable[[object], str | None]


def default_job_id(body: object) -> str | None:
    if isinstance(body, dict):
        for key in ("id", "job_id", "task_id", "name"):
            value = body.get(key)
            if isinstance(value, str) and value:
                return value
    return None


@dataclass
class CallbackVerifier:
    """HMAC check with a replay window; the counters are for metrics."""

    secrets: Mapping[str, str]
    clock: Callable[[], datetime]
    tolerance_s: float = 300.0
    accepted: int = 0
    bad_signature: int = 0
    stale: int = 0
    unknown_provider: int = 0

    def verify(self, provider: str, header: str | None, body: bytes) -> bool:
        secret = self.secrets.get(provider)
        if secret is None:
            self.unknown_provider += 1
            return False
        parts = dict(p.split("=", 1) for p in (header or "").split(",") if "=" in p)
        try:
            timestamp = int(parts["t"])
        except (KeyError, ValueError):
            self.bad_signature += 1
            return False
        if abs(self.clock().timestamp() - timestamp) > self.tolerance_s:
            self.stale += 1
            return False
        expected = hmac.new(
            secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256
        ).hexdigest()
        if not hmac.compare_digest(expected, parts.get("v1", "")):
            self.bad_signature += 1
            return False
        self.accepted += 1
        return True


@dataclass
class CallbackReceiver:
    """Turns a verified callback into a `get_job` and a normalizer observation."""

    verifier: CallbackVerifier
    deps: ExecutionDeps
    normalizer: EventNormalizer
    extractors: Mapping[str, JobIdExtractor] = field(default_factory=dict)
    malformed: int = 0
    unresolved: int = 0

    async def handle(
        self, provider: str, signature: str | None, body: bytes, query: Mapping[str, str]
    ) -> int:
        """Process one callback; returns the HTTP status to answer."""
        if not self.verifier.verify(provider, signature, body):
            return 401
        try:
            parsed = json.loads(body.decode("utf-8")) if body else None
        except ValueError:
            self.malformed += 1
            return 400
        job_id = self.extractors.get(provider, default_job_id)(parsed)
        if not job_id:
            self.malformed += 1
            return 400
        reads = self.deps.reads
        job = await reads.job_by_provider(provider, job_id)
        attempt_id = job.attempt_id if job else None
        hint = query.get("attempt", "")
        if attempt_id is None and hint.isdigit():
            attempt_id = int(hint)
        snap = None if attempt_id is None else await reads.snapshot(attempt_id)
        if snap is None:
            self.unresolved += 1
            return 202  # nothing of ours; stored nowhere, acknowledged so the sender stops
        attempt = snap[0]
        account = await reads.account(attempt.provider_account_id)
        if account.provider != provider:
            self.unresolved += 1
            return 202
        try:
            polled = await self.deps.adapter(account).get_job(job_ref(attempt, account, job_id))
        except Exception as exc:
            log.info("callback for %s/%s: get_job raised %r", provider, job_id, exc)
            return 503
        if polled.snapshot is None:
            return 503
        await self.normalizer.ingest(
            Observation(
                attempt.provider_account_id,
                job_id,
                polled.snapshot,
                EventSource.CALLBACK,
                self.deps.clock(),
                attempt.id,
            )
        )
        return 204


class CallbackServer:
    """``POST /callbacks/{provider}`` over asyncio + h11; one request per connection."""

    def __init__(self, receiver: CallbackReceiver, host: str = "127.0.0.1", port: int = 0):
        self._receiver = receiver
        self._host = host
        self._port = port
        self._server: asyncio.Server | None = None

    @property
    def url(self) -> str:
        assert self._server is not None
        host, port = self._server.sockets[0].getsockname()[:2]
        return f"http://{host}:{port}"

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, self._host, self._port)

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn = h11.Connection(h11.SERVER)
        try:
            status = await self._one(conn, reader)
            for event in (
                h11.Response(status_code=status, headers=[("content-length", "0")]),
                h11.EndOfMessage(),
            ):
                writer.write(conn.send(event) or b"")
            await writer.drain()
        except (h11.ProtocolError, ConnectionError, asyncio.IncompleteReadError) as exc:
            log.info("callback connection failed: %r", exc)
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()

    async def _one(self, conn: h11.Connection, reader: asyncio.StreamReader) -> int:
        request: h11.Request | None = None
        body = bytearray()
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                conn.receive_data(await reader.read(65536))
                continue
            if isinstance(event, h11.Request):
                request = event
            elif isinstance(event, h11.Data):
                body.extend(event.data)
                if len(body) > 1024 * 1024:
                    return 413
            elif isinstance(event, h11.EndOfMessage | h11.ConnectionClosed):
                break
        if request is None:
            return 400
        parts = urlsplit(request.target.decode())
        segments = parts.path.strip("/").split("/")
        if request.method != b"POST" or len(segments) != 2 or segments[0] != "callbacks":
            return 404
        headers = {k.decode().lower(): v.decode() for k, v in request.headers}
        return await self._receiver.handle(
            segments[1],
            headers.get(SIGNATURE_HEADER.lower()),
            bytes(body),
            dict(parse_qsl(parts.query)),
        )
