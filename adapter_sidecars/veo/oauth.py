"""OAuth 2 access tokens for Vertex AI from a service-account key (RFC 7523 JWT bearer grant).

The account's ``credential_ref`` names the key JSON Google issues for a service account
(``type: service_account``, ``client_email``, ``private_key``, ``private_key_id``,
``token_uri``). For each account we sign an RS256 assertion with `google-auth`'s signer
(``iss``/``sub`` the client email, ``aud`` Google's token endpoint `TOKEN_AUDIENCE` as
google-auth sets it whatever the key's ``token_uri``, the cloud-platform scope, one hour of
validity) and exchange it at the key's ``token_uri`` for an access token. The token
is cached per account and replaced `REFRESH_MARGIN_S` (scaled) before it expires, so no call
ever leaves with a token about to lapse; concurrent callers share one exchange (a lock per
account). The key file is read at each exchange, so a rotated key is picked up.

Failures are values of our error classes, never exceptions: an unreadable key or a refused
grant (4xx, ``invalid_grant``) is AUTH; a token endpoint that cannot be reached or answers 5xx
is TRANSIENT_NETWORK; 429 is RATE_LIMITED. Nothing here has reached the provider, so a Submit
that cannot get a token is REJECTED with nothing sent.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import httpx
from google.auth import crypt, jwt

from adapter_sidecars.common.config import Account, ConfigError
from vidroute_core.errors import ErrorClass, ProviderError, make_error

SCOPE = "https://www.googleapis.com/auth/cloud-platform"
GRANT_TYPE = "urn:ietf:params:oauth:grant-type:jwt-bearer"
#: The audience Google's token endpoint requires of an assertion (google-auth's constant).
TOKEN_AUDIENCE = "https://oauth2.googleapis.com/token"
#: Lifetime asked of an assertion (Google's maximum).
ASSERTION_LIFETIME_S = 3600
#: A cached token is replaced this long before its expiry (multiplied by the time scale).
REFRESH_MARGIN_S = 300.0
_KEY_FIELDS = ("client_email", "private_key", "token_uri")


@dataclass(frozen=True, slots=True)
class ServiceAccountKey:
    """The parts of a service-account key JSON the grant needs."""

    client_email: str
    private_key: str
    private_key_id: str
    token_uri: str

    @classmethod
    def parse(cls, text: str) -> ServiceAccountKey:
        """Read a key JSON; `ConfigError` names what is missing (never the key itself)."""
        try:
            data = json.loads(text)
        except ValueError:
            raise ConfigError("the service-account key is not JSON") from None
        if not isinstance(data, dict) or data.get("type") != "service_account":
            raise ConfigError("the credential is not a service-account key (type)")
        missing = [f for f in _KEY_FIELDS if not isinstance(data.get(f), str) or not data[f]]
        if missing:
            raise ConfigError(f"the service-account key lacks {', '.join(missing)}")
        return cls(
            data["client_email"],
            data["private_key"],
            str(data.get("private_key_id") or ""),
            data["token_uri"],
        )

    def assertion(self, now: float) -> str:
        """The signed RS256 JWT of one token request."""
        signer = crypt.RSASigner.from_string(  # type: ignore[no-untyped-call]  # unannotated
            self.private_key, self.private_key_id or None
        )
        issued = int(now)
        payload = {
            "iss": self.client_email,
            "sub": self.client_email,
            "aud": TOKEN_AUDIENCE,
            "scope": SCOPE,
            "iat": issued,
            "exp": issued + ASSERTION_LIFETIME_S,
        }
        token = jwt.encode(signer, payload)  # type: ignore[no-untyped-call]  # google-auth is unannotated here
        return token.decode("ascii") if isinstance(token, bytes) else str(token)


@dataclass(frozen=True, slots=True)
class AccessToken:
    """One access token and the monotonic time after which it must not be used."""

    value: str
    refresh_at: float


class TokenSource:
    """Access tokens per account, cached until `REFRESH_MARGIN_S` before their expiry."""

    def __init__(
        self,
        client: httpx.AsyncClient,
        *,
        time_scale: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self._client = client
        self._margin_s = REFRESH_MARGIN_S * time_scale
        self._clock = clock
        self._wall = wall_clock
        self._tokens: dict[str, AccessToken] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        #: Exchanges made, per account (for tests and metrics).
        self.exchanges: dict[str, int] = {}

    def cached(self, account: Account) -> str | None:
        """The account's current token, if one is cached and not due for refresh."""
        token = self._tokens.get(account.name)
        if token is None or self._clock() >= token.refresh_at:
            return None
        return token.value

    async def token(self, account: Account) -> str | ProviderError:
        """A usable access token for `account`, exchanging a new assertion when due."""
        if (value := self.cached(account)) is not None:
            return value
        lock = self._locks.setdefault(account.name, asyncio.Lock())
        async with lock:
            if (value := self.cached(account)) is not None:
                return value
            got = await self._exchange(account)
            if isinstance(got, ProviderError):
                return got
            self._tokens[account.name] = got
            return got.value

    def forget(self, account: Account) -> None:
        """Drop the cached token (the provider refused it: 401)."""
        self._tokens.pop(account.name, None)

    async def _exchange(self, account: Account) -> AccessToken | ProviderError:
        try:
            key = ServiceAccountKey.parse(account.credential.resolve().reveal())
            assertion = key.assertion(self._wall())
        except ConfigError as exc:
            return _auth_error("SERVICE_ACCOUNT_KEY", str(exc))
        except (ValueError, TypeError):
            return _auth_error("SERVICE_ACCOUNT_KEY", "the service-account private key is unusable")
        started = self._clock()
        try:
            response = await self._client.post(
                key.token_uri,
                data={"grant_type": GRANT_TYPE, "assertion": assertion},
                headers={"accept": "application/json"},
            )
        except httpx.HTTPError as exc:
            return make_error(
                ErrorClass.TRANSIENT_NETWORK,
                "TOKEN_ENDPOINT_UNREACHABLE",
                f"{type(exc).__name__} calling the token endpoint",
            )
        self.exchanges[account.name] = self.exchanges.get(account.name, 0) + 1
        return _read_token(response, started, self._margin_s)


def _read_token(
    response: httpx.Response, started: float, margin_s: float
) -> AccessToken | ProviderError:
    body: Any
    try:
        body = response.json()
    except ValueError:
        body = None
    status = response.status_code
    if status == 200 and isinstance(body, Mapping):
        value, lifetime = body.get("access_token"), body.get("expires_in")
        if isinstance(value, str) and value and isinstance(lifetime, int | float):
            # Refresh early, but never plan a refresh before the token was even issued.
            refresh_at = started + max(float(lifetime) - margin_s, float(lifetime) / 2)
            return AccessToken(value, refresh_at)
        return make_error(
            ErrorClass.INTERNAL_RETRYABLE, "TOKEN_UNREADABLE", "token response without a token"
        )
    reason = str(body.get("error") or "") if isinstance(body, Mapping) else ""
    detail = str(body.get("error_description") or "") if isinstance(body, Mapping) else ""
    message = f"token endpoint answered HTTP {status} {reason}: {detail}".strip(" :")
    if status == 429:
        return make_error(
            ErrorClass.RATE_LIMITED, "TOKEN_HTTP_429", message, raw_status_code=status
        )
    if status >= 500 or status in (408, 425):
        return make_error(
            ErrorClass.TRANSIENT_NETWORK, f"TOKEN_HTTP_{status}", message, raw_status_code=status
        )
    return make_error(
        ErrorClass.AUTH, (reason or f"TOKEN_HTTP_{status}").upper(), message, raw_status_code=status
    )


def _auth_error(code: str, message: str) -> ProviderError:
    return make_error(ErrorClass.AUTH, code, message)
