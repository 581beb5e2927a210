"""Provider callbacks: signature check, then a wake-up for the one event normalizer (9.18.1).

A callback is signed ``X-Vidroute-Signature: t=<unix>,v1=<hex>`` with HMAC-SHA256 over
``f"{t}.{body}"`` and the provider's shared secret; outside the replay window (300 s) or with a
wrong MAC it is rejected and counted. A valid callback is NOT parsed for its status: that is
adapter knowledge. We only take the job id it names (`JobIdExtractor`, default: the first of
``id``/``job_id``/``task_id``/``name`` in the JSON body), ask the adapter for the job with
`get_job`, and feed that snapshot to the normalizer with source ``callback``. A job we have not
recorded yet (the callback beat the submit response) is found through the ``attempt`` query
parameter our callback URL carries, and stored as early evidence.

Everything here takes hostile input: a header, body or query that is not what a provider sends
is refused with a status (400 malformed, 401 unverified) and never reaches the database as an
exception. The HTTP side (timeouts, sizes, keep-alive) is `callback_server.CallbackServer`.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime

from controlplane.execution.events import EventNormalizer, EventSource, Observation
from controlplane.execution.outcomes import ExecutionDeps, job_ref

__all__ = ["SIGNATURE_HEADER", "CallbackReceiver", "CallbackVerifier"]

log = logging.getLogger(__name__)
SIGNATURE_HEADER = "X-Vidroute-Signature"
JobIdExtractor = Callable[[object], str | None]
# Bounds on what a well-formed callback carries; anything past them is malformed (400), so no
# oversized integer reaches float arithmetic or a BIGINT column, and no deep JSON the stack.
MAX_JSON_DEPTH = 32
MAX_JOB_ID_CHARS = 256
MAX_ATTEMPT_ID = 2**63 - 1
_TIMESTAMP = re.compile(r"[0-9]{1,12}")  # unix seconds until the year 33658
_HEX_MAC = re.compile(r"[0-9a-f]{64}")
_DECIMAL = re.compile(r"[0-9]{1,19}")


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
        # Shape first: a timestamp too long for float arithmetic or a MAC that is not 64 hex
        # digits is a bad signature, not an exception.
        stamp, mac = parts.get("t", "").strip(), parts.get("v1", "").strip()
        if not _TIMESTAMP.fullmatch(stamp) or not _HEX_MAC.fullmatch(mac):
            self.bad_signature += 1
            return False
        timestamp = int(stamp)
        if abs(self.clock().timestamp() - timestamp) > self.tolerance_s:
            self.stale += 1
            return False
        expected = hmac.new(
            secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256
        ).hexdigest()
        if not hmac.compare_digest(expected, mac):
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
        except (ValueError, RecursionError):  # bad UTF-8 or JSON, a huge integer, too deep
            self.malformed += 1
            return 400
        job_id = self.extractors.get(provider, default_job_id)(parsed)
        hint = query.get("attempt", "")
        if (
            _depth(parsed) > MAX_JSON_DEPTH
            or not _valid_job_id(job_id)
            or (hint and not _valid_attempt(hint))
        ):
            self.malformed += 1
            return 400
        assert job_id is not None  # _valid_job_id
        reads = self.deps.reads
        snap = await reads.snapshot_of_job(provider, job_id)
        if snap is None and hint:  # a job not recorded yet: the attempt the URL names
            snap = await reads.snapshot(int(hint))
        if snap is None:
            self.unresolved += 1
            return 202  # nothing of ours; stored nowhere, acknowledged so the sender stops
        attempt = snap[0]
        account = await self.deps.account(attempt.provider_account_id)
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


def _depth(value: object) -> int:
    """Nesting depth of parsed JSON, walked without recursion (the input chooses the depth)."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, level = stack.pop()
        if isinstance(item, dict | list):
            deepest = max(deepest, level)
            if level > MAX_JSON_DEPTH:
                break
            children = item.values() if isinstance(item, dict) else item
            stack.extend((child, level + 1) for child in children)
    return deepest


def _valid_job_id(job_id: str | None) -> bool:
    """A provider job id: short printable text (a NUL byte would fail in PostgreSQL)."""
    return bool(job_id) and len(job_id or "") <= MAX_JOB_ID_CHARS and (job_id or "").isprintable()


def _valid_attempt(hint: str) -> bool:
    """Our own attempt id as we wrote it into the URL: ASCII decimal within BIGINT."""
    return bool(_DECIMAL.fullmatch(hint)) and 0 < int(hint) <= MAX_ATTEMPT_ID
