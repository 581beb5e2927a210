"""The caller-webhook delivery worker: claims due messages in batches, signs and POSTs each, and
records every attempt (design 9.18's callbacks, turned towards the caller; issue 13).

Each message is sent with the Standard Webhooks headers: ``webhook-id`` (the message id, the
same on every retry, so a receiver deduplicates by it), ``webhook-timestamp`` (this attempt's
Unix time) and ``webhook-signature`` (``v1,<base64 HMAC-SHA256 of id.timestamp.body>``, keyed
with the tenant's secret; signed by the `standardwebhooks` reference implementation).

SSRF: the receiver's host is resolved at send time and every address it resolves to is
checked (`domain.webhooks.address_refusal`); one refused address refuses the message (state
REFUSED, the reason recorded as its attempt) and no connection is made. The request then goes
to the checked address itself (Host header and TLS SNI keep the name), so a second resolution
cannot swap in another address. The addresses are tried in the resolver's order of
preference, the next one only when no connection could be made to the one before (an IPv6
address on a host without IPv6 routes); a request that reached a receiver is never sent on to
another address in the same attempt. Redirects are not followed.

An answer is judged by `domain.webhooks.verdict`: 2xx DELIVERED, 410 FAILED at once, anything
else (or no whole answer within connect + request timeout, however it trickles in) retried
with growing jittered delays up to the policy's attempts, then FAILED.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import socket
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from urllib.parse import urlsplit, urlunsplit

import httpx
from standardwebhooks.webhooks import Webhook

from controlplane.domain.webhooks import DeliveryState, RetryPolicy, address_refusal, verdict
from controlplane.persistence.webhooks import AttemptResult, ClaimedMessage, WebhookStore
from controlplane.webhooks.config import WebhookPolicy

__all__ = ["DeliveryConfig", "WebhookDeliveryWorker"]

log = logging.getLogger(__name__)

USER_AGENT = "vidroute-webhooks/1"
# Addresses tried in one attempt: with the connect timeout each, the attempt stays well inside
# its claim (4 x 5 s + the 15 s request < the 60 s claim).
MAX_ADDRESSES = 4
MAX_ERROR_CHARS = 500
MAX_ANSWER_BYTES = 200  # of a failed answer's body, kept in its attempt's error

Resolver = Callable[[str, int], Awaitable[list[str]]]


@dataclass(frozen=True, slots=True)
class DeliveryConfig:
    """Timings and sizes of the worker (every duration is multiplied by the time scale)."""

    max_attempts: int = 8
    base_delay_s: float = 120.0
    multiplier: float = 3.0
    max_delay_s: float = 43_200.0
    request_timeout_s: float = 15.0
    connect_timeout_s: float = 5.0
    claim_lease_s: float = 60.0  # past the request timeout: a claim outlives its attempt
    idle_s: float = 1.0  # pause when nothing is due
    batch_size: int = 32
    concurrency: int = 16

    @property
    def retry(self) -> RetryPolicy:
        return RetryPolicy(self.max_attempts, self.base_delay_s, self.multiplier, self.max_delay_s)


def _utcnow() -> datetime:
    return datetime.now(UTC)


async def _resolve(host: str, port: int) -> list[str]:
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    # getaddrinfo's order is the system's preference (RFC 6724): keep it, without repeats.
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


def _in_event_order(message: ClaimedMessage) -> int:
    return message.event_seq


class WebhookDeliveryWorker:
    """Delivers due webhook messages; `run_once()` for one batch, `start()`/`stop()` to loop."""

    def __init__(
        self,
        store: WebhookStore,
        policy: WebhookPolicy,
        http: httpx.AsyncClient,
        *,
        config: DeliveryConfig | None = None,
        clock: Callable[[], datetime] = _utcnow,
        rng: random.Random | None = None,
        resolve: Resolver = _resolve,
    ) -> None:
        self._store = store
        self._policy = policy
        self._http = http
        self.config = config or DeliveryConfig()
        self._clock = clock
        self._rng = rng or random.Random()
        self._resolve = resolve
        self._wake = asyncio.Event()
        self._stopping = asyncio.Event()
        self._loop_task: asyncio.Task[None] | None = None
        self.errors = 0
        self.rounds = 0  # claims made (a test waits for the first before it writes)

    async def run_once(self) -> int:
        """Claim one batch of due messages, attempt each (side by side), record the results."""
        cfg = self.config
        claimed = await self._store.claim(
            self._clock(), limit=cfg.batch_size, lease_s=cfg.claim_lease_s
        )
        self.rounds += 1
        if not claimed:
            return 0
        # One task's messages go one after another, in event order; tasks side by side.
        lanes: dict[int, list[ClaimedMessage]] = {}
        for message in claimed:
            lanes.setdefault(message.task_id, []).append(message)
        gate = asyncio.Semaphore(max(1, cfg.concurrency))

        async def lane(messages: list[ClaimedMessage]) -> list[AttemptResult]:
            async with gate:
                return [await self._attempt(m) for m in sorted(messages, key=_in_event_order)]

        results = [r for done in await asyncio.gather(*map(lane, lanes.values())) for r in done]
        await self._store.settle(results, self._clock())
        return len(results)

    async def _attempt(self, message: ClaimedMessage) -> AttemptResult:
        number = message.attempts + 1
        sent_at = self._clock()
        secret = self._policy.secret_for(message.tenant_id)
        if secret is None:  # the configuration lost the tenant's secret since CreateTask
            return self._failed(message, number, sent_at, 0, "no signing secret for the tenant", 0)
        targets, refusal = await self._targets(message.url)
        if refusal:
            log.warning("webhook %s to %s refused: %s", message.id, message.url, refusal)
            return AttemptResult(
                message.id,
                number,
                sent_at,
                0,
                f"refused: {refusal}",
                0,
                DeliveryState.REFUSED,
                None,
            )
        if not targets:
            return self._failed(message, number, sent_at, 0, "cannot resolve the host", 0)
        headers = {
            "webhook-id": message.id,
            "webhook-timestamp": str(int(sent_at.timestamp())),
            "webhook-signature": Webhook(secret).sign(message.id, sent_at, message.body),
            "content-type": "application/json",
            "user-agent": USER_AGENT,
        }
        started = time.monotonic()
        status, error = 0, ""
        for url, host_header, sni in targets[:MAX_ADDRESSES]:  # the next only if no connection
            status, error, connected = await self._post(
                message, url, {**headers, "host": host_header}, sni
            )
            if connected:
                break
        took_ms = int((time.monotonic() - started) * 1000)
        return self._failed(message, number, sent_at, status, error, took_ms)

    async def _post(
        self, message: ClaimedMessage, url: str, headers: dict[str, str], sni: str
    ) -> tuple[int, str, bool]:
        """One POST to one checked address: ``(status, error, connected)``; not `connected`
        when no connection could be made (the request never left)."""
        cfg = self.config
        timeout = httpx.Timeout(cfg.request_timeout_s, connect=cfg.connect_timeout_s)
        try:
            # The whole exchange is bounded, not each read: a receiver trickling its answer a
            # byte at a time would otherwise hold this lane for as long as it likes.
            async with asyncio.timeout(cfg.connect_timeout_s + cfg.request_timeout_s):
                return (*await self._exchange(message, url, headers, sni, timeout), True)
        except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
            return 0, f"no connection to {url}: {type(exc).__name__}: {exc}", False
        except (httpx.TimeoutException, TimeoutError) as exc:
            return 0, f"timed out ({type(exc).__name__})", True
        except httpx.HTTPError as exc:
            return 0, f"{type(exc).__name__}: {exc}", True

    async def _exchange(
        self,
        message: ClaimedMessage,
        url: str,
        headers: dict[str, str],
        sni: str,
        limits: httpx.Timeout,
    ) -> tuple[int, str]:
        """POST and read at most `MAX_ANSWER_BYTES` of the answer (only a failure's is kept):
        the receiver's body is never read whole, however long it is."""
        async with self._http.stream(
            "POST",
            url,
            content=message.body.encode(),
            headers=headers,
            timeout=limits,
            follow_redirects=False,
            extensions={"sni_hostname": sni} if sni else None,
        ) as response:
            status = response.status_code
            if 200 <= status < 300:
                return status, ""
            head = b""
            async for chunk in response.aiter_raw():
                head += chunk
                if len(head) >= MAX_ANSWER_BYTES:
                    break
        text = head[:MAX_ANSWER_BYTES].decode("utf-8", "replace")
        return status, f"HTTP {status}: {text}"

    def _failed(  # noqa: PLR0917 - one attempt's facts, in AttemptResult's order
        self,
        message: ClaimedMessage,
        number: int,
        sent_at: datetime,
        status: int,
        error: str,
        took_ms: int,
    ) -> AttemptResult:
        """The result of an attempt that was made (or could not be): `verdict` decides."""
        judged = verdict(status, number, self.config.retry)
        next_at = None
        if judged.retry:
            delay = self.config.retry.delay_s(number, self._rng)
            next_at = self._clock() + timedelta(seconds=delay)
        return AttemptResult(
            message.id,
            number,
            sent_at,
            status,
            error[:MAX_ERROR_CHARS],
            took_ms,
            judged.state,
            next_at,
        )

    async def _targets(self, url: str) -> tuple[list[tuple[str, str, str]], str]:
        """``([(url to a checked address, Host header, SNI name), ...], refusal)``, one per
        address in the resolver's order of preference."""
        parts = urlsplit(url)
        host = parts.hostname or ""
        port = parts.port or (443 if parts.scheme == "https" else 80)
        try:
            addresses = await self._resolve(host, port)
        except OSError:
            return [], ""
        policy = self._policy
        for address in addresses:
            refusal = address_refusal(
                address, allow_private=policy.allow_private, allowed=policy.private_allowlist
            )
            if refusal:
                return [], f"{host} resolves to {refusal}"
        host_header = parts.netloc.rsplit("@", 1)[-1]
        sni = host if parts.scheme == "https" else ""
        targets = []
        for address in addresses:
            literal = f"[{address}]" if ":" in address else address
            netloc = f"{literal}:{parts.port}" if parts.port else literal
            direct = urlunsplit((parts.scheme, netloc, parts.path or "/", parts.query, ""))
            targets.append((direct, host_header, sni))
        return targets, ""

    # ---- the loop ---------------------------------------------------------------------

    def wake(self) -> None:
        """Look for due messages now (a committed message's wake-up)."""
        self._wake.set()

    def start(self) -> None:
        if self._loop_task is None:
            self._stopping.clear()
            self._loop_task = asyncio.create_task(self._run(), name="webhook-delivery")

    async def stop(self, grace_s: float = 5.0) -> None:
        """Finish the batch in flight (up to `grace_s`), then cancel; idempotent. A batch cut
        off here is re-sent after its claim expires, under the same message ids."""
        self._stopping.set()
        self._wake.set()
        task, self._loop_task = self._loop_task, None
        if task is None:
            return
        done, _ = await asyncio.wait({task}, timeout=grace_s)
        if not done:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _run(self) -> None:
        while not self._stopping.is_set():
            try:
                done = await self.run_once()
            except Exception:
                self.errors += 1
                log.exception("webhook delivery failed; retrying after a pause")
                done = 0
            if done == 0 and not self._stopping.is_set():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), self.config.idle_s)
                self._wake.clear()
