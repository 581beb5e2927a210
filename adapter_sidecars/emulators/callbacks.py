"""Signed webhook delivery, in order, with duplicate and out-of-order faults.

Signature: header ``X-Vidroute-Signature: t=<unix seconds>,v1=<hex>`` where ``hex`` is
HMAC-SHA256 with the shared secret over ``f"{t}.{body}"`` (body = the exact bytes POSTed).
`verify_signature` is the reference check receivers (and adapters) can copy.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import json
import time
from dataclasses import dataclass, field
from typing import Any

import httpx

SIGNATURE_HEADER = "X-Vidroute-Signature"


def sign(secret: str, body: bytes, timestamp: int | None = None) -> str:
    """Return the signature header value for `body`."""
    t = int(time.time()) if timestamp is None else timestamp
    mac = hmac.new(secret.encode(), f"{t}.".encode() + body, hashlib.sha256).hexdigest()
    return f"t={t},v1={mac}"


def verify_signature(secret: str, header: str, body: bytes, tolerance_s: float = 300.0) -> bool:
    """Check a signature header against `body`, rejecting stale timestamps."""
    parts = dict(p.split("=", 1) for p in header.split(",") if "=" in p)
    try:
        t = int(parts["t"])
    except (KeyError, ValueError):
        return False
    if abs(time.time() - t) > tolerance_s:
        return False
    expected = sign(secret, body, t).split("v1=", 1)[1]
    return hmac.compare_digest(expected, parts.get("v1", ""))


@dataclass
class Delivery:
    """One POST attempt, recorded for `GET /__emulator/callbacks`."""

    job_id: str
    url: str
    payload: Any
    sent_at: float = field(default_factory=time.time)
    status_code: int | None = None
    error: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "job_id": self.job_id,
            "url": self.url,
            "payload": self.payload,
            "sent_at": self.sent_at,
            "status_code": self.status_code,
            "error": self.error,
        }


class CallbackSender:
    """Queue of callbacks sent one at a time, so delivery order is the queue order."""

    def __init__(self, secret: str, timeout_s: float = 5.0) -> None:
        self._secret = secret
        self._timeout_s = timeout_s
        self._queue: asyncio.Queue[tuple[str, str, Any, asyncio.Future[None] | None]] = (
            asyncio.Queue()
        )
        self._held: dict[str, list[tuple[str, Any]]] = {}
        self._task: asyncio.Task[None] | None = None
        self._client: httpx.AsyncClient | None = None
        self.deliveries: list[Delivery] = []

    async def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    def reset(self) -> None:
        self._held.clear()
        self.deliveries.clear()

    def enqueue(
        self,
        job_id: str,
        urls: list[str],
        payload: Any,
        *,
        terminal: bool,
        twice: bool = False,
        out_of_order: bool = False,
    ) -> None:
        """Queue `payload` for every URL, applying the job's callback faults."""
        for url in urls:
            if out_of_order and not terminal:
                # Hold intermediate states back so they arrive after the terminal one.
                self._held.setdefault(job_id, []).append((url, payload))
                continue
            for _ in range(2 if twice else 1):
                self._queue.put_nowait((job_id, url, payload, None))
        if terminal:
            for url, held in self._held.pop(job_id, []):
                for _ in range(2 if twice else 1):
                    self._queue.put_nowait((job_id, url, held, None))

    async def deliver_now(self, job_id: str, urls: list[str], payload: Any) -> None:
        """Queue and wait until delivered (used to make a callback beat the HTTP response)."""
        loop = asyncio.get_running_loop()
        for url in urls:
            done: asyncio.Future[None] = loop.create_future()
            self._queue.put_nowait((job_id, url, payload, done))
            await done

    async def _run(self) -> None:
        while True:
            job_id, url, payload, done = await self._queue.get()
            await self._post(job_id, url, payload)
            if done is not None and not done.done():
                done.set_result(None)

    async def _post(self, job_id: str, url: str, payload: Any) -> None:
        if self._client is None:  # created lazily: building an SSL context costs ~0.3 s
            self._client = httpx.AsyncClient(timeout=self._timeout_s)
        body = json.dumps(payload, separators=(",", ":")).encode()
        delivery = Delivery(job_id, url, payload)
        self.deliveries.append(delivery)
        headers = {"content-type": "application/json", SIGNATURE_HEADER: sign(self._secret, body)}
        try:
            response = await self._client.post(url, content=body, headers=headers)
            delivery.status_code = response.status_code
        except httpx.HTTPError as exc:
            delivery.error = f"{type(exc).__name__}: {exc}"
