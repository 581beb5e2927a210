"""Who is calling the API: bearer tokens checked against configured hashes, per RPC.

Tokens are opaque secrets the operator hands out; the control plane stores only their SHA-256
hex digests, each mapped to a role and (for tenants) a tenant::

    <sha256-hex>=tenant:acme
    <sha256-hex>=admin

Hashes rather than JWTs: nothing to verify but one digest lookup, no signing key to distribute
or rotate, no clock skew or algorithm confusion; revoking a token is deleting its line. The price
(no expiry inside the token, no claims) is fine for a service API with a handful of callers.
A leaked configuration yields no usable token: the digest is not the secret, and the tokens are
random (`new_token`), so a digest cannot be reversed by guessing.

`AuthInterceptor` authenticates every call except health and reflection (which probes and
grpcurl need without credentials): metadata ``authorization: Bearer <token>``; a missing or
unknown token is UNAUTHENTICATED before any handler runs. The caller it found is published in a
context variable for the call, which the servicer reads (`current_caller`).

With no tokens configured the interceptor runs in the open mode: every caller is an admin, and
the server logs a WARNING at start. The composition root decides when that is allowed.
"""

from __future__ import annotations

import contextvars
import hashlib
import inspect
import logging
import secrets
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any

import grpc
from grpc_health.v1 import health
from grpc_reflection.v1alpha import reflection

from controlplane.service.access import Caller, Role
from vidroute_core.exceptions import Unauthenticated

log = logging.getLogger(__name__)

BEARER = "bearer "
# Health and reflection (both reflection versions grpcurl may ask for) stay open.
OPEN_SERVICES = frozenset(
    {health.SERVICE_NAME, reflection.SERVICE_NAME, "grpc.reflection.v1.ServerReflection"}
)
OPEN_CALLER = Caller.admin("anonymous (authentication off)")

_caller: contextvars.ContextVar[Caller | None] = contextvars.ContextVar(
    "vidroute_caller", default=None
)


def current_caller() -> Caller | None:
    """The authenticated caller of the RPC being served (None outside an intercepted call)."""
    return _caller.get()


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def new_token() -> str:
    """A fresh random token (256 bits), for `make up` and operators."""
    return "vr_" + secrets.token_urlsafe(32)


def parse_entry(digest: str, grant: str) -> tuple[str, Caller]:
    """One ``<sha256-hex>=tenant:<id>`` or ``<sha256-hex>=admin`` entry."""
    digest = digest.strip().lower()
    if len(digest) != 64 or any(c not in "0123456789abcdef" for c in digest):
        raise ValueError(f"auth entry: {digest[:12]!r}... is not a SHA-256 hex digest")
    role, _, tenant = grant.strip().partition(":")
    if role == Role.ADMIN.value and not tenant:
        return digest, Caller.admin(f"admin:{digest[:8]}")
    if role == Role.TENANT.value and tenant.strip():
        return digest, Caller.tenant(tenant.strip(), f"tenant:{tenant.strip()}:{digest[:8]}")
    raise ValueError(f"auth entry for {digest[:8]}: expected 'admin' or 'tenant:<id>'")


def parse_entries(lines: Iterable[str]) -> dict[str, Caller]:
    """Entries separated by commas or newlines; ``#`` starts a comment."""
    out: dict[str, Caller] = {}
    for line in lines:
        for item in line.split("#", 1)[0].split(","):
            if not item.strip():
                continue
            digest, sep, grant = item.partition("=")
            if not sep:
                raise ValueError("auth entry: expected <sha256-hex>=<grant>")
            key, caller = parse_entry(digest, grant)
            if key in out:
                raise ValueError(f"auth entry for {key[:8]} given twice")
            out[key] = caller
    return out


class Authenticator:
    """Bearer token -> `Caller`; `tokens` maps SHA-256 digests to callers. Empty: open mode."""

    def __init__(self, tokens: Mapping[str, Caller] | None = None) -> None:
        self._tokens = dict(tokens or {})

    @property
    def enabled(self) -> bool:
        return bool(self._tokens)

    def authenticate(self, metadata: Iterable[tuple[str, Any]] | None) -> Caller | None:
        """The caller a call's metadata identifies, or None (UNAUTHENTICATED)."""
        if not self._tokens:
            return OPEN_CALLER
        for key, value in metadata or ():
            if key != "authorization" or not isinstance(value, str):
                continue
            if value[: len(BEARER)].lower() == BEARER:
                return self._tokens.get(hash_token(value[len(BEARER) :].strip()))
        return None


def _service_of(method: str) -> str:
    return method.lstrip("/").split("/", 1)[0]


class AuthInterceptor(grpc.aio.ServerInterceptor):
    """UNAUTHENTICATED for calls without a valid token; publishes the caller otherwise."""

    def __init__(self, authenticator: Authenticator) -> None:
        self._auth = authenticator

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[Any]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> Any:
        handler = await continuation(handler_call_details)
        if handler is None or _service_of(handler_call_details.method) in OPEN_SERVICES:
            return handler
        caller = self._auth.authenticate(handler_call_details.invocation_metadata)
        if caller is None:
            # Refused before the request is even decoded: no deserializer, no handler code.
            if handler.unary_stream is not None:
                return grpc.unary_stream_rpc_method_handler(_refuse)
            return grpc.unary_unary_rpc_method_handler(_refuse)
        if handler.unary_unary is not None:
            inner_unary = handler.unary_unary

            async def unary(request: Any, context: Any) -> Any:
                token = _caller.set(caller)
                try:
                    return await inner_unary(request, context)
                finally:
                    _caller.reset(token)

            return grpc.unary_unary_rpc_method_handler(
                unary,
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
        if handler.unary_stream is not None:
            inner_stream = handler.unary_stream

            async def stream(request: Any, context: Any) -> None:
                token = _caller.set(caller)
                try:
                    produced = inner_stream(request, context)
                    if inspect.isawaitable(produced):
                        await produced
                        return
                    async for item in produced:
                        await context.write(item)
                finally:
                    _caller.reset(token)

            return grpc.unary_stream_rpc_method_handler(
                stream,
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
        return handler  # streaming requests: none on this service; authenticated anyway


async def _refuse(request: object, context: Any) -> None:
    await context.abort(
        grpc.StatusCode.UNAUTHENTICATED, "missing or invalid bearer token (authorization metadata)"
    )


def require_caller(default: Caller | None = None) -> Caller:
    """The call's caller; `default` serves a servicer driven without the server (tests)."""
    caller = _caller.get() or default
    if caller is None:  # fail closed: a servicer mounted without `AuthInterceptor`
        raise Unauthenticated("no authenticated caller for this call")
    return caller
