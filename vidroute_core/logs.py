"""Logging for every vidroute process: JSON lines with the id chain, and redaction.

Both deployables log through here; only their composition roots call `configure_logging`.

- The id chain of design 9.24 (task_id, attempt_id, client_request_key, provider_request_id,
  provider_job_id, route_decision_id) lives in a context variable: `bind_ids` binds ids for a
  block (one task or attempt being handled), `add_ids` adds ids found inside that block (the
  attempt's key once its row is read). Every record formatted carries the bound ids, so a line
  about an attempt can be found by its task_id without the message having to say it. Both also
  set the ids as attributes of the current OpenTelemetry span (`vidroute_core.tracing`), and a
  JSON line logged inside a span carries its ``trace_id`` and ``span_id``: logs and traces
  find each other both ways. Only the OpenTelemetry API is imported here (no SDK).
- `RedactingFilter` sits on the root handler, not on loggers: a logger's filters only see records
  logged on that logger, a handler's see every record that reaches it, so httpx, httpcore, grpc
  and uvicorn records are redacted too. It removes URL query strings (signed locators carry
  credentials there: ``?_jwt=``, ``X-Goog-Signature``), bearer tokens, Authorization and API-key
  values, and truncates long string arguments (prompts) and long messages.
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import logging
import re
import sys
from collections.abc import Iterator, Mapping
from datetime import UTC, datetime
from types import MappingProxyType
from typing import IO, Any

from opentelemetry import trace

__all__ = [
    "ID_FIELDS",
    "JsonFormatter",
    "RedactingFilter",
    "TextFormatter",
    "add_ids",
    "bind_ids",
    "bound_ids",
    "configure_logging",
    "ids_of",
    "redact",
    "span_attributes",
]

ID_FIELDS = (
    "task_id",
    "attempt_id",
    "client_request_key",
    "provider_request_id",
    "provider_job_id",
    "route_decision_id",
)
LOG_FORMATS = ("json", "text")
MAX_ARG_CHARS = 256  # a prompt argument longer than this is cut (the spec hash identifies it)
MAX_MESSAGE_CHARS = 4096

_IDS: contextvars.ContextVar[Mapping[str, object]] = contextvars.ContextVar(
    "vidroute_log_ids", default=MappingProxyType({})
)


@contextlib.contextmanager
def bind_ids(**ids: object) -> Iterator[None]:
    """Bind ids (None values skipped) on top of the current ones for the block."""
    given = {k: v for k, v in ids.items() if v is not None}
    token = _IDS.set({**_IDS.get(), **given})
    _annotate_span(given)
    try:
        yield
    finally:
        _IDS.reset(token)


def add_ids(**ids: object) -> None:
    """Add ids to the current binding; use inside `bind_ids`, whose exit drops them again."""
    given = {k: v for k, v in ids.items() if v is not None}
    _IDS.set({**_IDS.get(), **given})
    _annotate_span(given)


def _attribute(value: object) -> str | int | float | bool:
    return value if isinstance(value, str | int | float | bool) else str(value)


def span_attributes(ids: Mapping[str, object] | None = None) -> dict[str, str | int | float | bool]:
    """`ids` (default: the bound ones) as span attributes."""
    return {k: _attribute(v) for k, v in (bound_ids() if ids is None else ids).items()}


def _annotate_span(ids: Mapping[str, object]) -> None:
    span = trace.get_current_span()
    if ids and span.is_recording():
        span.set_attributes(span_attributes(ids))


def bound_ids() -> Mapping[str, object]:
    """The ids bound now."""
    return _IDS.get()


def ids_of(attempt: object | None = None, job: object | None = None) -> dict[str, object]:
    """The chain ids an attempt row and a provider job row carry (duck-typed: any object with
    the persistence records' field names; the kernel does not know the control plane's types)."""
    ids: dict[str, object] = {}
    if attempt is not None:
        ids["attempt_id"] = getattr(attempt, "id", None)
        for name in ("task_id", "client_request_key", "route_decision_id"):
            ids[name] = getattr(attempt, name, None)
    if job is not None:
        for name in ("provider_job_id", "provider_request_id"):
            ids[name] = getattr(job, name, None) or None
    return {k: v for k, v in ids.items() if v is not None}


_URL_QUERY = re.compile(r"(?i)\b((?:https?|wss?|s3|gs)://[^\s?#\"'<>]+)\?[^\s#\"'<>]*")
_SECRET_PARAM = re.compile(
    r"(?i)\b(_jwt|jwt|x-goog-signature|x-goog-credential|x-amz-signature|x-amz-credential"
    r"|x-amz-security-token|signature|sig|token|access_token|api_key|apikey|secret)=[^&\s\"']+"
)
_BEARER = re.compile(r"(?i)\b(bearer|basic)\s+[A-Za-z0-9._~+/=-]{6,}")
_AUTH_HEADER = re.compile(
    r"(?i)([\"']?(?:authorization|proxy-authorization|x-api-key|api[-_]key|x-goog-api-key)[\"']?"
    r"\s*[:=]\s*[\"']?)(?!<redacted>)[^\s\"',}\]]+"
)
REDACTED = "<redacted>"


def redact(text: str) -> str:
    """`text` with URL queries, secret parameters, bearer tokens and auth header values removed."""
    text = _URL_QUERY.sub(rf"\1?{REDACTED}", text)
    text = _SECRET_PARAM.sub(rf"\1={REDACTED}", text)
    text = _BEARER.sub(rf"\1 {REDACTED}", text)
    return _AUTH_HEADER.sub(rf"\1{REDACTED}", text)


def _truncate(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    return f"{text[:limit]}...(+{len(text) - limit} chars)"


def _short_arg(arg: object) -> object:
    if isinstance(arg, str):
        return _truncate(arg, MAX_ARG_CHARS)
    if isinstance(arg, bytes):
        return f"<{len(arg)} bytes>"
    return arg


class RedactingFilter(logging.Filter):
    """Rewrites every record it sees: message rendered, redacted and bounded (module doc)."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if isinstance(args, tuple):
            args = tuple(_short_arg(a) for a in args)
        elif isinstance(args, Mapping):
            args = {k: _short_arg(v) for k, v in args.items()}
        try:
            message = str(record.msg) % args if args else str(record.msg)
        except (TypeError, ValueError, KeyError):  # a bad format string still gets logged
            message = f"{record.msg} {args!r}"
        record.msg = _truncate(redact(message), MAX_MESSAGE_CHARS)
        record.args = None
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = redact(record.exc_text)
        return True


_STANDARD = frozenset(logging.LogRecord("", 0, "", 0, "", None, None).__dict__) | {
    "message",
    "asctime",
    "taskName",
}


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ts, level, logger, msg, the bound ids, extras, exc."""

    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        doc.update(bound_ids())
        context = trace.get_current_span().get_span_context()
        if context.is_valid:
            doc["trace_id"] = trace.format_trace_id(context.trace_id)
            doc["span_id"] = trace.format_span_id(context.span_id)
        for key, value in record.__dict__.items():
            if key not in _STANDARD and key not in doc:
                doc[key] = redact(value) if isinstance(value, str) else value
        if record.exc_info and not record.exc_text:
            record.exc_text = self.formatException(record.exc_info)
        if record.exc_text:
            doc["exc"] = record.exc_text
        return json.dumps(doc, default=str, ensure_ascii=False)


class TextFormatter(logging.Formatter):
    """The classic line, with the bound ids appended as ``[task_id=.. attempt_id=..]``."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        ids = bound_ids()
        if not ids:
            return line
        head, sep, tail = line.partition("\n")  # ids on the message line, not after a traceback
        chain = " ".join(f"{k}={v}" for k, v in ids.items())
        return f"{head} [{chain}]{sep}{tail}"


_HANDLER_NAME = "vidroute"


def configure_logging(
    level: str = "INFO", fmt: str = "json", stream: IO[str] | None = None
) -> None:
    """Replace the root handlers with one redacting handler on `stream` (stderr) in `fmt`."""
    if fmt not in LOG_FORMATS:
        raise ValueError(f"log format must be one of {LOG_FORMATS}, got {fmt!r}")
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    handler.addFilter(RedactingFilter())
    handler.set_name(_HANDLER_NAME)
    root = logging.getLogger()
    for old in list(root.handlers):  # only our own: a test harness's capture handlers stay
        if old.get_name() == _HANDLER_NAME:
            root.removeHandler(old)
            old.close()
    root.addHandler(handler)
    root.setLevel(getattr(logging, level.upper(), logging.INFO))
