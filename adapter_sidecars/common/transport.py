"""The submit-stage classifier (design 9.17.3): did the provider possibly accept the request?

Every create call goes through `send_submit`, which records how far the HTTP exchange got with
httpx's ``trace`` extension and turns a failure into a `SubmitOutcome` by *stage*, not by
exception type:

=================================================  =========  ================  ===============
what happened                                      outcome    error class       transport_stage
=================================================  =========  ================  ===============
name resolution failed                             REJECTED   TRANSIENT_NETWORK DNS
TCP connect failed / timed out, pool wait expired  REJECTED   TRANSIENT_NETWORK CONNECT
TLS handshake failed (no request byte written)     REJECTED   TRANSIENT_NETWORK TLS
failed while writing headers or body               UNKNOWN    SUBMISSION_UNKNOWN SEND_REQUEST
body written; timeout / reset / close before head  UNKNOWN    SUBMISSION_UNKNOWN AWAIT_RESPONSE
response head received; body unreadable            UNKNOWN    SUBMISSION_UNKNOWN READ_RESPONSE
=================================================  =========  ================  ===============

An HTTP answer (any status) is returned as an `HttpReply` for the adapter to classify under its
provider's contract; a 2xx whose body has no job id is `unknown_response` (READ_RESPONSE).
Anything unexpected after the first request byte may have left the machine, so it is UNKNOWN.
Nothing here retries: a submit is sent exactly once per call.
"""

from __future__ import annotations

import contextlib
import json
import socket
import ssl
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import Any

import httpx

from vidroute_core.adapter import SubmitKind, SubmitOutcome, TransportStage
from vidroute_core.errors import ErrorClass, ProviderError, make_error


@dataclass
class StageTracker:
    """Records the trace events of one request; pass it as ``extensions={"trace": tracker}``."""

    events: list[str] = field(default_factory=list)

    async def __call__(self, event_name: str, info: dict[str, Any]) -> None:
        self.events.append(event_name)

    def _seen(self, suffix: str) -> bool:
        return any(e.endswith(suffix) for e in self.events)

    @property
    def request_bytes_started(self) -> bool:
        """Whether the client began writing the request (headers) to a connection."""
        return self._seen("send_request_headers.started")

    @property
    def body_sent(self) -> bool:
        """Whether the whole request body was handed to the socket."""
        return self._seen("send_request_body.complete")

    @property
    def response_head_received(self) -> bool:
        """Whether the status line and headers arrived."""
        return self._seen("receive_response_headers.complete")

    @property
    def tls_started(self) -> bool:
        """Whether a TLS handshake began."""
        return self._seen("start_tls.started")

    def stage_of_failure(self, exc: BaseException) -> TransportStage:
        """The stage at which `exc` interrupted the exchange."""
        if self.response_head_received:
            return TransportStage.READ_RESPONSE
        if self.body_sent:
            return TransportStage.AWAIT_RESPONSE
        if self.request_bytes_started:
            return TransportStage.SEND_REQUEST
        if _caused_by(exc, socket.gaierror):
            return TransportStage.DNS
        if self.tls_started or _caused_by(exc, ssl.SSLError):
            return TransportStage.TLS
        return TransportStage.CONNECT


def _caused_by(exc: BaseException, kind: type[BaseException]) -> bool:
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        if isinstance(current, kind):
            return True
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return False


_NOT_SENT = frozenset({TransportStage.DNS, TransportStage.CONNECT, TransportStage.TLS})


@dataclass(frozen=True, slots=True)
class HttpReply:
    """A complete HTTP response to a submit."""

    status: int
    headers: httpx.Headers
    body: bytes
    started_at: datetime

    def json(self) -> Any:
        """The decoded JSON body, or None when the body is not JSON."""
        try:
            return json.loads(self.body.decode("utf-8"))
        except (UnicodeDecodeError, ValueError):
            return None

    @property
    def ok(self) -> bool:
        """2xx."""
        return 200 <= self.status < 300


def utcnow() -> datetime:
    """Now, timezone-aware UTC."""
    return datetime.now(UTC)


def transport_failure(
    exc: BaseException, tracker: StageTracker, started_at: datetime
) -> SubmitOutcome:
    """Classify an exception raised while sending a submit (see the module table)."""
    if isinstance(exc, httpx.PoolTimeout):
        # Waiting for a free pooled connection: nothing was written.
        stage = TransportStage.CONNECT
    else:
        stage = tracker.stage_of_failure(exc)
    detail = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    if stage in _NOT_SENT:
        error = make_error(
            ErrorClass.TRANSIENT_NETWORK,
            f"TRANSPORT_{stage.value}",
            f"request not sent ({stage.value.lower()} failed): {detail}",
        )
        return SubmitOutcome(
            SubmitKind.REJECTED, error=error, transport_stage=stage, request_started_at=started_at
        )
    return unknown_outcome(stage, f"request may have been received: {detail}", started_at)


def unknown_outcome(
    stage: TransportStage, message: str, started_at: datetime | None, raw_status_code: int = 0
) -> SubmitOutcome:
    """An UNKNOWN outcome: the provider may hold the job; recover, never retry blindly."""
    error = make_error(
        ErrorClass.SUBMISSION_UNKNOWN,
        f"TRANSPORT_{stage.value}" if stage is not TransportStage.NONE else "SUBMISSION_UNKNOWN",
        message,
        raw_status_code=raw_status_code or None,
    )
    return SubmitOutcome(
        SubmitKind.UNKNOWN, error=error, transport_stage=stage, request_started_at=started_at
    )


def unknown_response(reply: HttpReply, why: str) -> SubmitOutcome:
    """A 2xx whose body is unusable (corrupt JSON, no id): accepted or not, we cannot tell."""
    return unknown_outcome(
        TransportStage.READ_RESPONSE,
        f"HTTP {reply.status} but {why}",
        reply.started_at,
        raw_status_code=reply.status,
    )


def rejected(error: ProviderError, started_at: datetime | None) -> SubmitOutcome:
    """A REJECTED outcome for an explicit provider refusal."""
    return SubmitOutcome(SubmitKind.REJECTED, error=error, request_started_at=started_at)


def create_error_outcome(
    reply: HttpReply,
    classify: Callable[[HttpReply], ProviderError],
    *,
    not_created_5xx: frozenset[int],
) -> SubmitOutcome:
    """A non-2xx create reply: a 4xx is REJECTED; a 5xx is REJECTED only when the provider
    documents that status as "nothing created" (`not_created_5xx`), otherwise UNKNOWN."""
    if reply.status >= 500 and reply.status not in not_created_5xx:
        return unknown_outcome(
            TransportStage.NONE,
            f"HTTP {reply.status} on create; not documented as not-created",
            reply.started_at,
            raw_status_code=reply.status,
        )
    return rejected(classify(reply), reply.started_at)


async def send_submit(
    client: httpx.AsyncClient, request: httpx.Request
) -> HttpReply | SubmitOutcome:
    """Send `request` once; return the reply, or the classified transport failure."""
    tracker = StageTracker()
    request.extensions = {**request.extensions, "trace": tracker}
    started_at = utcnow()
    try:
        response = await client.send(request)
    except httpx.HTTPError as exc:
        return transport_failure(exc, tracker, started_at)
    except OSError as exc:  # raw socket errors that escaped httpx's translation
        return transport_failure(exc, tracker, started_at)
    return HttpReply(response.status_code, response.headers, response.content, started_at)


def retry_after_ms(headers: httpx.Headers, now: datetime | None = None) -> int | None:
    """``retry-after-ms``, or ``Retry-After`` in seconds or as an HTTP date, in milliseconds."""
    raw_ms = headers.get("retry-after-ms")
    if raw_ms:
        with contextlib.suppress(ValueError):
            return max(0, int(float(raw_ms)))
    raw = headers.get("retry-after")
    if not raw:
        return None
    with contextlib.suppress(ValueError):
        return max(0, int(float(raw) * 1000))
    try:
        when = parsedate_to_datetime(raw)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max(0, int((when - (now or utcnow())).total_seconds() * 1000))


async def request_json(
    client: httpx.AsyncClient,
    method: str,
    url: str,
    *,
    headers: dict[str, str],
    json_body: Any = None,
    params: dict[str, str] | None = None,
) -> HttpReply | ProviderError:
    """A side-effect-free or idempotent call (poll, cancel, list): transport errors are plain
    TRANSIENT_NETWORK errors, because repeating such a call can never create a second job."""
    started_at = utcnow()
    try:
        response = await client.request(method, url, headers=headers, json=json_body, params=params)
    except (httpx.HTTPError, OSError) as exc:
        return make_error(ErrorClass.TRANSIENT_NETWORK, "TRANSPORT", f"{type(exc).__name__}: {exc}")
    return HttpReply(response.status_code, response.headers, response.content, started_at)
