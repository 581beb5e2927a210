"""Domain errors -> gRPC status codes with `google.rpc` details, in one place.

`to_status` is the whole mapping and `DomainErrorInterceptor` applies it to every RPC of a
`grpc.aio` server. Anything that is not a `DomainError` becomes INTERNAL, logged once with its
context and the trace id (`vidroute_core.tracing`; a random error id when tracing is off); its
message never leaks to the client, the id does (in the message and a `google.rpc.RequestInfo`),
so an operator finds the trace and the log line from what the client reports.

Two kinds of bad input never reach a handler's own code as an exception:

* bytes that do not parse as the request message: grpc.aio runs the request deserializer before
  the handler and turns its exception into UNKNOWN, so the interceptor swaps in a deserializer
  that returns a `_Malformed` marker instead, and the wrapped handler answers INVALID_ARGUMENT;
* a BadRequest too big for a client's metadata limit (16 KiB by default, some proxies 8 KiB):
  at most `MAX_VIOLATIONS` violations with bounded text, then one "... and K more" entry.
"""

from __future__ import annotations

import inspect
import logging
import secrets
from collections.abc import Awaitable, Callable
from typing import Any

import grpc
from google.protobuf import any_pb2, duration_pb2
from google.rpc import code_pb2, error_details_pb2, status_pb2
from grpc_status import rpc_status

from vidroute_core import tracing
from vidroute_core.exceptions import (
    DomainError,
    IdempotencyConflict,
    IllegalTransition,
    InvalidSpec,
    NotFound,
    PermissionDenied,
    PreconditionFailed,
    RateLimited,
    Unauthenticated,
    Unavailable,
)

log = logging.getLogger(__name__)
ERROR_DOMAIN = "vidroute.dev"
# Bounds of a BadRequest: at most 20 violations, each clipped, and at most 4 KiB of them
# (base64 in grpc-status-details-bin makes that ~5.5 KiB), with a status message of at most 512
# characters: the whole trailer stays under 8 KiB.
MAX_VIOLATIONS = 20
MAX_FIELD_CHARS = 128
MAX_DESCRIPTION_CHARS = 240
MAX_VIOLATION_BYTES = 4096
MAX_MESSAGE_CHARS = 512


def _status(code: int, message: str, *details: Any) -> grpc.Status:
    packed = []
    for detail in details:
        holder = any_pb2.Any()
        holder.Pack(detail)
        packed.append(holder)
    status: grpc.Status = rpc_status.to_status(
        status_pb2.Status(code=code, message=message, details=packed)
    )
    return status


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def bad_request(exc: InvalidSpec) -> tuple[str, error_details_pb2.BadRequest]:
    """The bounded status message and BadRequest for `exc` (see the module docstring)."""
    bad = error_details_pb2.BadRequest()
    for v in exc.violations[:MAX_VIOLATIONS]:
        entry = error_details_pb2.BadRequest.FieldViolation(
            field=_clip(v.field, MAX_FIELD_CHARS),
            description=_clip(v.description, MAX_DESCRIPTION_CHARS),
        )
        if bad.ByteSize() + entry.ByteSize() + 4 > MAX_VIOLATION_BYTES:
            break
        bad.field_violations.append(entry)
    rest = len(exc.violations) - len(bad.field_violations)
    if rest:
        bad.field_violations.add(field="", description=f"... and {rest} more")
    summary = "; ".join(f"{v.field}: {v.description}" for v in bad.field_violations[:3])
    count = len(exc.violations)
    message = f"invalid request ({count} violation{'s' if count != 1 else ''}): {summary}"
    return _clip(message, MAX_MESSAGE_CHARS), bad


def _retry_info(seconds: float) -> error_details_pb2.RetryInfo:
    return error_details_pb2.RetryInfo(
        retry_delay=duration_pb2.Duration(seconds=int(seconds), nanos=int((seconds % 1) * 1e9))
    )


def to_status(exc: BaseException) -> grpc.Status:
    """The gRPC status a client sees for `exc`."""
    if isinstance(exc, InvalidSpec):
        message, bad = bad_request(exc)
        return _status(code_pb2.INVALID_ARGUMENT, message, bad)
    if isinstance(exc, Unavailable):
        return _status(code_pb2.UNAVAILABLE, str(exc), _retry_info(exc.retry_after_s))
    if isinstance(exc, RateLimited):
        info = error_details_pb2.ErrorInfo(
            reason="RATE_LIMITED", domain=ERROR_DOMAIN, metadata=dict(exc.labels)
        )
        return _status(
            code_pb2.RESOURCE_EXHAUSTED, exc.message, _retry_info(exc.retry_after_s), info
        )
    if isinstance(exc, IdempotencyConflict):
        info = error_details_pb2.ErrorInfo(
            reason="IDEMPOTENCY_KEY_REUSED",
            domain=ERROR_DOMAIN,
            metadata={
                "idempotency_key": exc.key,
                "existing_spec_hash": exc.existing_spec_hash,
                "requested_spec_hash": exc.requested_spec_hash,
            },
        )
        return _status(code_pb2.ALREADY_EXISTS, str(exc), info)
    if isinstance(exc, PreconditionFailed):
        info = error_details_pb2.ErrorInfo(
            reason=exc.reason,
            domain=ERROR_DOMAIN,
            metadata={**{k: str(v) for k, v in exc.numbers.items()}, **exc.labels},
        )
        return _status(code_pb2.FAILED_PRECONDITION, exc.message, info)
    if isinstance(exc, IllegalTransition):
        info = error_details_pb2.ErrorInfo(
            reason="ILLEGAL_STATE_TRANSITION",
            domain=ERROR_DOMAIN,
            metadata={"current": exc.current.value, "target": exc.target.value},
        )
        return _status(code_pb2.FAILED_PRECONDITION, str(exc), info)
    if isinstance(exc, NotFound):
        info = error_details_pb2.ResourceInfo(
            resource_type=exc.resource, resource_name=exc.resource_id
        )
        return _status(code_pb2.NOT_FOUND, str(exc), info)
    if isinstance(exc, Unauthenticated):
        return _status(code_pb2.UNAUTHENTICATED, str(exc))
    if isinstance(exc, PermissionDenied):
        info = error_details_pb2.ErrorInfo(
            reason=exc.reason,
            domain=ERROR_DOMAIN,
            metadata={"operation": exc.operation, **exc.labels},
        )
        return _status(code_pb2.PERMISSION_DENIED, exc.message, info)
    if isinstance(exc, DomainError):
        return _status(code_pb2.FAILED_PRECONDITION, str(exc))
    return _status(code_pb2.INTERNAL, "internal error")


def internal_error(exc: BaseException, method: str) -> grpc.Status:
    """Log a real bug once with the id an operator will be given, and the INTERNAL status that
    gives it: the trace id inside a span, otherwise a fresh error id."""
    trace_id = tracing.current_trace_id()
    ref = trace_id or secrets.token_hex(16)
    label = "trace_id" if trace_id else "error_id"
    log.error("unhandled error in %s (%s %s)", method, label, ref, exc_info=exc, extra={label: ref})
    return _status(
        code_pb2.INTERNAL,
        f"internal error ({label} {ref})",
        error_details_pb2.RequestInfo(request_id=ref, serving_data=label),
    )


class _Malformed:
    """What the tolerant deserializer returns for bytes that are not the request message."""

    __slots__ = ("reason",)

    def __init__(self, reason: str) -> None:
        self.reason = reason


def _tolerant(deserializer: Callable[[bytes], Any] | None) -> Callable[[bytes], Any] | None:
    """`deserializer`, returning `_Malformed` instead of raising (DecodeError, or worse)."""
    if deserializer is None:
        return None

    def deserialize(raw: bytes) -> Any:
        try:
            return deserializer(raw)
        except Exception as exc:  # protobuf raises DecodeError, RecursionError for deep nesting
            return _Malformed(type(exc).__name__)

    return deserialize


async def _reject_malformed(request: _Malformed, context: Any) -> None:
    await context.abort_with_status(
        _status(
            code_pb2.INVALID_ARGUMENT,
            "request is not a valid protobuf message of the method's request type",
            error_details_pb2.BadRequest(
                field_violations=[
                    error_details_pb2.BadRequest.FieldViolation(
                        field="", description=f"undecodable message ({request.reason})"
                    )
                ]
            ),
        )
    )


class DomainErrorInterceptor(grpc.aio.ServerInterceptor):
    """Apply `to_status` to every unary and server-streaming handler of a server."""

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[Any]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> Any:
        handler = await continuation(handler_call_details)
        if handler is None:
            return handler
        method = handler_call_details.method
        if handler.unary_unary is not None:
            inner_unary = handler.unary_unary

            async def unary(request: Any, context: Any) -> Any:
                if isinstance(request, _Malformed):
                    await _reject_malformed(request, context)
                try:
                    return await inner_unary(request, context)
                except DomainError as exc:
                    await context.abort_with_status(to_status(exc))
                except (grpc.RpcError, grpc.aio.AbortError):
                    raise
                except Exception as exc:
                    await context.abort_with_status(internal_error(exc, method))

            return grpc.unary_unary_rpc_method_handler(
                unary,
                request_deserializer=_tolerant(handler.request_deserializer),
                response_serializer=handler.response_serializer,
            )
        if handler.unary_stream is not None:
            inner_stream = handler.unary_stream

            # A server-streaming handler is either an async generator or a coroutine that
            # writes with `context.write` (grpc_health's Watch); the wrapper writes both ways,
            # so it must itself be a coroutine: an async generator cannot call `context.write`.
            async def stream(request: Any, context: Any) -> None:
                if isinstance(request, _Malformed):
                    await _reject_malformed(request, context)
                try:
                    produced = inner_stream(request, context)
                    if inspect.isawaitable(produced):
                        await produced
                        return
                    async for item in produced:
                        await context.write(item)
                except DomainError as exc:
                    await context.abort_with_status(to_status(exc))
                except (grpc.RpcError, grpc.aio.AbortError):
                    raise
                except Exception as exc:
                    await context.abort_with_status(internal_error(exc, method))

            return grpc.unary_stream_rpc_method_handler(
                stream,
                request_deserializer=_tolerant(handler.request_deserializer),
                response_serializer=handler.response_serializer,
            )
        return handler
