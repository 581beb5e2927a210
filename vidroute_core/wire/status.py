"""Domain errors -> gRPC status codes with `google.rpc` details, in one place.

`to_status` is the whole mapping and `DomainErrorInterceptor` applies it to every RPC of a
`grpc.aio` server. Anything that is not a `DomainError` becomes INTERNAL, logged once with its
context; its message never leaks to the client.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import grpc
from google.protobuf import any_pb2
from google.rpc import code_pb2, error_details_pb2, status_pb2
from grpc_status import rpc_status

from vidroute_core.exceptions import (
    DomainError,
    IdempotencyConflict,
    IllegalTransition,
    InvalidSpec,
    NotFound,
    PermissionDenied,
    PreconditionFailed,
    Unauthenticated,
)

log = logging.getLogger(__name__)
ERROR_DOMAIN = "vidroute.dev"


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


def to_status(exc: BaseException) -> grpc.Status:
    """The gRPC status a client sees for `exc`."""
    if isinstance(exc, InvalidSpec):
        bad = error_details_pb2.BadRequest(
            field_violations=[
                error_details_pb2.BadRequest.FieldViolation(
                    field=v.field, description=v.description
                )
                for v in exc.violations
            ]
        )
        return _status(code_pb2.INVALID_ARGUMENT, str(exc), bad)
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
            reason="PERMISSION_DENIED", domain=ERROR_DOMAIN, metadata={"operation": exc.operation}
        )
        return _status(code_pb2.PERMISSION_DENIED, exc.message, info)
    if isinstance(exc, DomainError):
        return _status(code_pb2.FAILED_PRECONDITION, str(exc))
    return _status(code_pb2.INTERNAL, "internal error")


def _log_unexpected(exc: BaseException, method: str) -> None:
    if not isinstance(exc, DomainError):
        log.exception("unhandled error in %s", method, exc_info=exc)


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
                try:
                    return await inner_unary(request, context)
                except DomainError as exc:
                    await context.abort_with_status(to_status(exc))
                except (grpc.RpcError, grpc.aio.AbortError):
                    raise
                except Exception as exc:
                    _log_unexpected(exc, method)
                    await context.abort_with_status(to_status(exc))

            return grpc.unary_unary_rpc_method_handler(
                unary,
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
        if handler.unary_stream is not None:
            inner_stream = handler.unary_stream

            # A server-streaming handler is either an async generator or a coroutine that
            # writes with `context.write` (grpc_health's Watch); the wrapper writes both ways,
            # so it must itself be a coroutine: an async generator cannot call `context.write`.
            async def stream(request: Any, context: Any) -> None:
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
                    _log_unexpected(exc, method)
                    await context.abort_with_status(to_status(exc))

            return grpc.unary_stream_rpc_method_handler(
                stream,
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
        return handler
