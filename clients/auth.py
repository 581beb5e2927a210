"""The client side of API authentication: a channel that sends ``authorization: Bearer <token>``.

One interceptor on the channel instead of ``metadata=`` at every call site, so a client (the CLI,
the e2e harness) cannot forget it on one RPC. The token comes from ``VIDROUTE_TOKEN``; a dev
stack started with `vidroute up` in this directory also leaves its tokens under ``./var`` (see
`DEV_ADMIN_TOKEN_FILE`), which the CLI falls back to so ``make up`` then ``vidroute submit`` works.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, NamedTuple

import grpc

DEV_ADMIN_TOKEN_FILE = Path("var") / "dev-admin-token"
DEV_TENANT_TOKEN_FILE = Path("var") / "dev-tenant-token"


class _Details(NamedTuple):
    method: str
    timeout: float | None
    metadata: Any
    credentials: Any
    wait_for_ready: bool | None
    compression: Any


class _CallDetails(_Details, grpc.ClientCallDetails):
    pass


class BearerAuth(grpc.UnaryUnaryClientInterceptor, grpc.UnaryStreamClientInterceptor):
    """Adds the bearer token to every unary and server-streaming call of a channel."""

    def __init__(self, token: str) -> None:
        self._header = ("authorization", f"Bearer {token}")

    def _details(self, details: grpc.ClientCallDetails) -> grpc.ClientCallDetails:
        metadata = [*(details.metadata or ()), self._header]
        return _CallDetails(
            details.method,
            details.timeout,
            metadata,
            details.credentials,
            getattr(details, "wait_for_ready", None),
            getattr(details, "compression", None),
        )

    def intercept_unary_unary(
        self, continuation: Callable[..., Any], details: grpc.ClientCallDetails, request: Any
    ) -> Any:
        return continuation(self._details(details), request)

    def intercept_unary_stream(
        self, continuation: Callable[..., Any], details: grpc.ClientCallDetails, request: Any
    ) -> Any:
        return continuation(self._details(details), request)


def token_from_env(env: Mapping[str, str] | None = None) -> str:
    """``VIDROUTE_TOKEN``, else the dev admin token `vidroute up` wrote here, else empty."""
    env = os.environ if env is None else env
    if env.get("VIDROUTE_TOKEN"):
        return env["VIDROUTE_TOKEN"].strip()
    if DEV_ADMIN_TOKEN_FILE.is_file():
        return DEV_ADMIN_TOKEN_FILE.read_text(encoding="utf-8").strip()
    return ""


def channel(target: str, token: str) -> grpc.Channel:
    """An insecure channel to `target` sending `token` (none when empty)."""
    plain = grpc.insecure_channel(target)
    return grpc.intercept_channel(plain, BearerAuth(token)) if token else plain


def write_dev_tokens(run_dir: Path, tenant: str) -> dict[str, str]:
    """Fresh admin and `tenant` tokens for one `vidroute up`: printed, left owner-only under
    `run_dir` for the CLI, and returned as the server's ``VIDROUTE_AUTH_TOKENS`` entry."""
    from controlplane.api.auth import hash_token, new_token  # only `up` needs the server side

    admin, member = new_token(), new_token()
    run_dir.mkdir(parents=True, exist_ok=True)
    for name, token in ((DEV_ADMIN_TOKEN_FILE.name, admin), (DEV_TENANT_TOKEN_FILE.name, member)):
        target = run_dir / name
        target.unlink(missing_ok=True)
        target.touch(mode=0o600)  # a secret: owner-only before anything is written to it
        target.write_text(token + "\n", encoding="utf-8")
    print(
        f"dev API tokens (also in {run_dir}/{DEV_ADMIN_TOKEN_FILE.name} and "
        f"{DEV_TENANT_TOKEN_FILE.name}):\n"
        f"  admin:         export VIDROUTE_TOKEN={admin}\n"
        f"  tenant {tenant}:  export VIDROUTE_TOKEN={member}",
        flush=True,
    )
    return {
        "VIDROUTE_AUTH_TOKENS": f"{hash_token(admin)}=admin,{hash_token(member)}=tenant:{tenant}"
    }
