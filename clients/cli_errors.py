"""Every failure of a client command as short lines on stderr and an exit code.

=====================================  ======  =============================================
what                                   exit    printed
=====================================  ======  =============================================
INVALID_ARGUMENT with field violations  2      ``error: <field>: <description>``, one a line
a usage error (flag, spec file)         2      ``error: <what is wrong>``
the server cannot be reached            1      ``error: cannot reach the control plane at T``
any other status                        1      ``error: CODE: message`` (+ ErrorInfo numbers)
=====================================  ======  =============================================

Tracebacks only with ``--debug`` (the CLI re-raises then).
"""

from __future__ import annotations

import grpc
from google.rpc import error_details_pb2
from grpc_status import rpc_status

EXIT_FAILED, EXIT_USAGE = 1, 2
# What grpc-core says when no connection could be made (as opposed to a server's UNAVAILABLE,
# e.g. its database being away, which carries the server's own message).
_UNREACHABLE = (
    "failed to connect",
    "connection refused",
    "dns resolution failed",
    "errors resolving",
    "name resolution",
    "connections to all backends failing",
    "socket closed",
    "deadline exceeded while waiting for",
    "no route to host",
    "network is unreachable",
)


def _details(exc: grpc.RpcError) -> list[object]:
    """The google.rpc detail messages of a status (none when the call never reached a server)."""
    try:
        status = rpc_status.from_call(exc)
    except (ValueError, AttributeError):
        return []
    if status is None:
        return []
    found: list[object] = []
    for packed in status.details:
        for kind in (
            error_details_pb2.BadRequest,
            error_details_pb2.ErrorInfo,
            error_details_pb2.RequestInfo,
        ):
            if packed.Is(kind.DESCRIPTOR):
                message = kind()
                packed.Unpack(message)
                found.append(message)
    return found


def unreachable(exc: grpc.RpcError) -> bool:
    """True when the channel never reached a server (nothing the server said)."""
    code = exc.code()
    details = (exc.details() or "").lower()
    if code == grpc.StatusCode.UNAVAILABLE:
        return any(mark in details for mark in _UNREACHABLE) or not details
    return code == grpc.StatusCode.DEADLINE_EXCEEDED and "waiting for" in details


def rpc_lines(exc: grpc.RpcError, target: str) -> tuple[list[str], int]:
    """The lines and exit code for a failed call to `target`."""
    if unreachable(exc):
        said = exc.details() or ""
        why = said.splitlines()[0] if said else "no answer"
        return [f"error: cannot reach the control plane at {target} ({why})"], EXIT_FAILED
    code = exc.code()
    message = exc.details() or ""
    details = _details(exc)
    bad = [d for d in details if isinstance(d, error_details_pb2.BadRequest)]
    violations = [v for d in bad for v in d.field_violations]
    if code == grpc.StatusCode.INVALID_ARGUMENT and violations:
        return [
            f"error: {v.field}: {v.description}" if v.field else f"error: {v.description}"
            for v in violations
        ], EXIT_USAGE
    line = f"error: {code.name}: {message}"
    for detail in details:
        if isinstance(detail, error_details_pb2.ErrorInfo) and detail.metadata:
            numbers = ", ".join(f"{k}={v}" for k, v in sorted(detail.metadata.items()))
            line += f" ({detail.reason}: {numbers})"
        elif isinstance(detail, error_details_pb2.RequestInfo) and detail.request_id:
            line += f" [request {detail.request_id}]"
    return [line], EXIT_USAGE if code == grpc.StatusCode.INVALID_ARGUMENT else EXIT_FAILED
