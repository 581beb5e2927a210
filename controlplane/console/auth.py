"""Who is looking at the console: the API's bearer tokens, from a cookie or a header.

The console authenticates exactly like the gRPC API (`controlplane.api.auth.Authenticator`: the
SHA-256 digest of the token looked up in the configured entries; no tokens configured is the
open mode, every caller an admin). A browser signs in once on ``/login``: the token goes into an
``HttpOnly; SameSite=Strict`` cookie (``Secure`` when the console is served over https), so page
scripts cannot read it and no other site's page can send it. Tools may send
``Authorization: Bearer <token>`` instead. Nothing is stored server-side: signing out deletes the
cookie, revoking a token is deleting its entry, as for the API.
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response

from controlplane.api.auth import Authenticator
from controlplane.service.access import Caller

COOKIE = "vidroute_console"
MAX_TOKEN_CHARS = 512  # issued tokens are ~46 characters
COOKIE_MAX_AGE_S = 12 * 3600  # a browser session; the token itself does not expire


def caller_of(auth: Authenticator, request: Request) -> Caller | None:
    """The caller the request's header or cookie identifies; None: sign in first."""
    header = request.headers.get("authorization")
    if header is not None:
        return auth.authenticate([("authorization", header)])
    token = request.cookies.get(COOKIE, "")
    if not token and auth.enabled:
        return None
    return auth.authenticate([("authorization", f"Bearer {token}")])


def sign_in(auth: Authenticator, token: str) -> Caller | None:
    """The caller `token` identifies (None: unknown token); bounded before hashing."""
    token = token.strip()
    if not token or len(token) > MAX_TOKEN_CHARS:
        return None
    return auth.authenticate([("authorization", f"Bearer {token}")])


def set_session(response: Response, token: str, *, secure: bool) -> None:
    response.set_cookie(
        COOKIE,
        token.strip(),
        max_age=COOKIE_MAX_AGE_S,
        path="/",
        httponly=True,
        samesite="strict",
        secure=secure,
    )


def end_session(response: Response, *, secure: bool) -> None:
    response.delete_cookie(COOKIE, path="/", httponly=True, samesite="strict", secure=secure)
