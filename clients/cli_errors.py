"""Every failure of a client command as short lines on stderr and an exit code.

=======================================  ====  ===============================================
what                                     exit  printed
=======================================  ====  ===============================================
INVALID_ARGUMENT with field violations   2     ``error: <field>: <description>``, one a line
a usage error (flag, spec file, config)  2     ``error: <what is wrong>``
the server cannot be reached             1     ``error: cannot reach the control plane at T``
any other status                         1     ``error: CODE: message`` (+ ErrorInfo numbers)
=======================================  ====  ===============================================

Calls through the SDK fail with `clients.sdk.errors.VidrouteError`; the raw stubs (billing,
health) with `grpc.RpcError`, decoded the same way (`errors.from_rpc_error`). Tracebacks only
with ``--debug``.
"""

from __future__ import annotations

import grpc

from clients.sdk import errors

EXIT_FAILED, EXIT_USAGE = 1, 2
EXIT_CONFIG = 78  # EX_CONFIG, as the control plane's refusals: the environment is wrong
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
    "no route to host",
    "network is unreachable",
)


def unreachable(err: errors.VidrouteError) -> bool:
    """True when the channel never reached a server (nothing the server said)."""
    said = err.message.lower()
    if err.code == grpc.StatusCode.UNAVAILABLE:
        return not said or any(mark in said for mark in _UNREACHABLE)
    return err.code == grpc.StatusCode.DEADLINE_EXCEEDED and "waiting for" in said


def lines(exc: errors.VidrouteError | grpc.RpcError, target: str) -> tuple[list[str], int]:
    """The lines and exit code for a failed call to `target`."""
    err = exc if isinstance(exc, errors.VidrouteError) else errors.from_rpc_error(exc, target)
    if unreachable(err):
        why = err.message.splitlines()[0] if err.message else "no answer"
        return [f"error: cannot reach the control plane at {target} ({why})"], EXIT_FAILED
    code = EXIT_USAGE if err.code == grpc.StatusCode.INVALID_ARGUMENT else EXIT_FAILED
    if err.field_violations:
        return [
            f"error: {v.field}: {v.description}" if v.field else f"error: {v.description}"
            for v in err.field_violations
        ], code
    line = f"error: {err.code.name}: {err.message or err.code.value[1]}"
    if err.error_info_reason or err.error_info_metadata:
        numbers = ", ".join(f"{k}={v}" for k, v in sorted(err.error_info_metadata.items()))
        line += f" ({err.error_info_reason}{': ' if numbers else ''}{numbers})"
    if err.request_id:
        line += f" [request {err.request_id}]"
    return [line], code
