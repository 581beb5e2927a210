"""Cross-site request forgery protection for the console's two forms (sign in, sign out).

A double-submit token: the first page a browser gets sets a random token in the
``vidroute_csrf`` cookie (``HttpOnly; SameSite=Strict``, ``Secure`` over https) and renders the
same value into each form's hidden ``csrf`` field; a POST is honoured only when the field equals
the cookie. Another site's page cannot read the cookie to copy it into its form (and a strict
cookie is not even sent with its cross-site POST), so a forged sign-in (logging the victim in as
the attacker) or sign-out is refused with 403 and changes nothing. The sign-in form needs it
before any session exists, which is why the token is not derived from the session; it holds no
secret and nothing is stored server-side, so any replica checks any form.
"""

from __future__ import annotations

import hmac
import secrets

from starlette.requests import Request
from starlette.responses import Response

COOKIE = "vidroute_csrf"
FIELD = "csrf"
_TOKEN_BYTES = 32
_MAX_CHARS = 128  # a token is 43 characters; anything longer is not ours


def token_of(request: Request) -> str | None:
    """The request's cookie token when it looks like one we issued, else None."""
    token = request.cookies.get(COOKIE, "")
    if not token or len(token) > _MAX_CHARS or not token.isascii():
        return None
    return token


def new_token() -> str:
    return secrets.token_urlsafe(_TOKEN_BYTES)


def set_cookie(response: Response, token: str, *, secure: bool) -> None:
    """A browser-session cookie (no max-age): it lives as long as the pages holding its forms."""
    response.set_cookie(COOKIE, token, path="/", httponly=True, samesite="strict", secure=secure)


def accepted(request: Request, form: dict[str, str]) -> bool:
    """Whether the form's token is present and equals the cookie's (compared in constant time)."""
    cookie, field = token_of(request), form.get(FIELD, "")
    if cookie is None or not field or len(field) > _MAX_CHARS or not field.isascii():
        return False
    return hmac.compare_digest(cookie.encode(), field.encode())
