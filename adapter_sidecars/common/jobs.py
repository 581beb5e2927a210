"""Helpers shared by the providers' status mappings: raw states, timestamps, output expiry.

An unknown raw status is never an exception: it maps to UNRECOGNIZED with the raw value kept
(design 9.8, 9.25.3 "供应商返回未知新状态"). JobOutput expiry is read from the signed URL itself
when it says (``exp``/``Expires`` unix seconds, ``X-Goog-Date`` + ``X-Goog-Expires``, a JWT's
``exp`` claim in ``_jwt``/``token``), otherwise it is "now + the entry's known TTL": the link
was minted no earlier than this poll, so that bound is never too late by more than the TTL.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import json
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from decimal import ROUND_HALF_EVEN, Decimal, InvalidOperation
from urllib.parse import parse_qs, urlsplit

from vidroute_core.adapter import JobState


def map_state(raw: str, table: Mapping[str, JobState]) -> JobState:
    """Normalize a raw status; anything not in `table` is UNRECOGNIZED (never a crash)."""
    return table.get(raw, JobState.UNRECOGNIZED)


def parse_timestamp(value: object) -> datetime | None:
    """ISO-8601 (with ``Z``) or unix seconds -> aware UTC datetime; None when unreadable."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, int | float):
        return datetime.fromtimestamp(float(value), UTC)
    if not isinstance(value, str) or not value:
        return None
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def _jwt_exp(token: str) -> int | None:
    parts = token.split(".")
    if len(parts) != 3:
        return None
    padded = parts[1] + "=" * (-len(parts[1]) % 4)
    try:
        claims = json.loads(base64.urlsafe_b64decode(padded))
    except (binascii.Error, ValueError):
        return None
    exp = claims.get("exp") if isinstance(claims, dict) else None
    return exp if isinstance(exp, int) else None


def url_expiry(url: str, ttl_seconds: int, now: datetime) -> datetime | None:
    """When a signed output URL stops working (see the module docstring)."""
    query = {k.lower(): v[0] for k, v in parse_qs(urlsplit(url).query).items() if v}
    for key in ("exp", "expires"):
        if key in query:
            with contextlib.suppress(ValueError, OverflowError, OSError):
                return datetime.fromtimestamp(int(query[key]), UTC)
    if "x-goog-date" in query and "x-goog-expires" in query:
        with contextlib.suppress(ValueError):
            signed = datetime.strptime(query["x-goog-date"], "%Y%m%dT%H%M%SZ").replace(tzinfo=UTC)
            return signed + timedelta(seconds=int(query["x-goog-expires"]))
    for key in ("_jwt", "token", "jwt"):
        if key in query and (exp := _jwt_exp(query[key])) is not None:
            return datetime.fromtimestamp(exp, UTC)
    if ttl_seconds > 0:
        return now + timedelta(seconds=ttl_seconds)
    return None


def progress_of(value: object) -> float | None:
    """A 0..1 progress value, or None when absent or nonsensical."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return min(1.0, max(0.0, float(value)))


def queue_position_of(value: object, *, first: int = 0) -> int | None:
    """A provider's queue position counted from 0 (0 is next), or None when absent or
    nonsensical; `first` is the number the provider gives the job that runs next."""
    if isinstance(value, bool) or not isinstance(value, int) or value < first:
        return None
    return value - first


def iso_z(when: datetime) -> str:
    """RFC 3339 in UTC with a ``Z``, as provider query parameters expect."""
    return when.astimezone(UTC).isoformat().replace("+00:00", "Z")


def scaled_int(value: object, scale: int) -> int:
    """A provider's decimal number (JSON int, float or string) times `scale`, as an exact
    integer (half-even rounding): ``scaled_int(0.1, 1_000_000) == 100_000``, never a float
    product. Money and provider units go through this; anything unreadable is 0."""
    try:
        number = Decimal(str(value)) if value is not None else Decimal(0)
    except (InvalidOperation, ValueError):
        return 0
    if not number.is_finite():
        return 0
    return int((number * scale).to_integral_value(rounding=ROUND_HALF_EVEN))
