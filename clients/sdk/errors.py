"""Typed errors of the vidroute SDK: one exception class per gRPC status code the API uses.

Every failed call raises a `VidrouteError` subclass built from the call's status and its
``grpc-status-details-bin`` trailer (``google.rpc.Status``), so the details the server sends are
attributes, not bytes to decode::

    from clients.sdk import Client, errors

    with Client() as client:
        try:
            client.create({"tenant_id": "acme", "prompt": "", "mode": "MODE_TEXT_TO_VIDEO"})
        except errors.InvalidArgument as err:
            for violation in err.field_violations:     # google.rpc.BadRequest
                print(violation.field, violation.description)
        except errors.FailedPrecondition as err:
            print(err.error_info_reason, err.error_info_metadata)   # google.rpc.ErrorInfo
        except errors.Unavailable as err:
            print(err)   # one line: "UNAVAILABLE: ... (target localhost:8051)"

``str(err)`` is one line: the code, the message, and the violations or numbers in brackets.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import grpc
from google.rpc import error_details_pb2
from grpc_status import rpc_status

__all__ = [
    "AlreadyExists",
    "DataLoss",
    "DeadlineExceeded",
    "FailedPrecondition",
    "FieldViolation",
    "Internal",
    "InvalidArgument",
    "NotFound",
    "PermissionDenied",
    "ResourceExhausted",
    "Unauthenticated",
    "Unavailable",
    "VidrouteError",
    "from_rpc_error",
]


@dataclass(frozen=True, slots=True)
class FieldViolation:
    """One ``google.rpc.BadRequest.FieldViolation``: which field, and what is wrong with it."""

    field: str
    description: str


class VidrouteError(Exception):
    """A failed call: the status code, its message and the google.rpc details it carried."""

    def __init__(
        self,
        code: grpc.StatusCode,
        message: str,
        *,
        field_violations: tuple[FieldViolation, ...] = (),
        error_info_reason: str = "",
        error_info_metadata: Mapping[str, str] | None = None,
        request_id: str = "",
        target: str = "",
    ) -> None:
        self.code = code
        self.message = message
        self.field_violations = field_violations
        self.error_info_reason = error_info_reason
        self.error_info_metadata: dict[str, str] = dict(error_info_metadata or {})
        self.request_id = request_id
        self.target = target
        super().__init__(self._line())

    def _line(self) -> str:
        parts = [f"{self.code.name}: {self.message or self.code.value[1]}"]
        if self.field_violations and not all(
            v.description in self.message for v in self.field_violations
        ):  # the server's message usually names them already
            parts.append(
                "[" + "; ".join(f"{v.field}: {v.description}" for v in self.field_violations) + "]"
            )
        if self.error_info_reason or self.error_info_metadata:
            numbers = ", ".join(f"{k}={v}" for k, v in sorted(self.error_info_metadata.items()))
            parts.append(f"[{self.error_info_reason}{': ' if numbers else ''}{numbers}]")
        if self.request_id:
            parts.append(f"(request {self.request_id})")
        if self.target and self.code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.UNKNOWN):
            parts.append(f"(target {self.target})")
        return " ".join(parts).replace("\n", " ")


class InvalidArgument(VidrouteError):
    """Bad input; `field_violations` names every bad field. Nothing was written."""


class NotFound(VidrouteError):
    """The task (or another named resource) does not exist, or is another tenant's."""


class AlreadyExists(VidrouteError):
    """The idempotency key was used before with another spec."""


class FailedPrecondition(VidrouteError):
    """The request is valid but the state forbids it; the numbers are in `error_info_metadata`."""


class Unavailable(VidrouteError):
    """The server or one of its dependencies is unreachable; safe to retry idempotent calls."""


class Unauthenticated(VidrouteError):
    """No or an unknown bearer token (``VIDROUTE_TOKEN``)."""


class PermissionDenied(VidrouteError):
    """The token's role or tenant does not allow the call."""


class DeadlineExceeded(VidrouteError):
    """The call's deadline (the client's `timeout`) passed before an answer."""


class ResourceExhausted(VidrouteError):
    """A quota or rate limit; `error_info_metadata` says which."""


class Internal(VidrouteError):
    """A server bug; `request_id` finds it in the server's log."""


class DataLoss(VidrouteError):
    """Downloaded bytes do not match the stored output's size or SHA-256."""


_BY_CODE: dict[grpc.StatusCode, type[VidrouteError]] = {
    grpc.StatusCode.INVALID_ARGUMENT: InvalidArgument,
    grpc.StatusCode.NOT_FOUND: NotFound,
    grpc.StatusCode.ALREADY_EXISTS: AlreadyExists,
    grpc.StatusCode.FAILED_PRECONDITION: FailedPrecondition,
    grpc.StatusCode.UNAVAILABLE: Unavailable,
    grpc.StatusCode.UNAUTHENTICATED: Unauthenticated,
    grpc.StatusCode.PERMISSION_DENIED: PermissionDenied,
    grpc.StatusCode.DEADLINE_EXCEEDED: DeadlineExceeded,
    grpc.StatusCode.RESOURCE_EXHAUSTED: ResourceExhausted,
    grpc.StatusCode.INTERNAL: Internal,
    grpc.StatusCode.DATA_LOSS: DataLoss,
}


def error_class(code: grpc.StatusCode) -> type[VidrouteError]:
    """The exception class of `code` (`VidrouteError` itself for the codes without one)."""
    return _BY_CODE.get(code, VidrouteError)


def from_rpc_error(err: grpc.RpcError, target: str = "") -> VidrouteError:
    """The typed error of a failed sync or asyncio call, with its google.rpc details decoded."""
    call: Any = err
    code: grpc.StatusCode = call.code()
    message: str = call.details() or ""
    violations: list[FieldViolation] = []
    reason, metadata, request_id = "", {}, ""
    try:
        status = rpc_status.from_call(call)
    except (ValueError, AttributeError, TypeError):
        status = None  # details that do not match the status line, or no trailers at all
    for detail in status.details if status is not None else ():
        bad = error_details_pb2.BadRequest()
        info = error_details_pb2.ErrorInfo()
        request = error_details_pb2.RequestInfo()
        if detail.Is(bad.DESCRIPTOR) and detail.Unpack(bad):
            violations.extend(FieldViolation(v.field, v.description) for v in bad.field_violations)
        elif detail.Is(info.DESCRIPTOR) and detail.Unpack(info):
            reason, metadata = info.reason, dict(info.metadata)
        elif detail.Is(request.DESCRIPTOR) and detail.Unpack(request):
            request_id = request.request_id
    return error_class(code)(
        code,
        message,
        field_violations=tuple(violations),
        error_info_reason=reason,
        error_info_metadata=metadata,
        request_id=request_id,
        target=target,
    )
