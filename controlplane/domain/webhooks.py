"""Caller webhooks (issue 13): what a task may subscribe to, the message a subscribed event
becomes, when a failed delivery is retried, and which addresses are never called (SSRF).

Pure: no I/O. The persistence side writes a message in the transaction of the task event it
announces (`controlplane.persistence.webhooks`); the delivery worker (`controlplane.webhooks`)
signs and POSTs it (Standard Webhooks) and asks this module what to do with the answer.

Event types: the terminal ones (``task.succeeded``, ``task.failed``, ``task.cancelled``) are
always sent to a subscribed task; ``task.progress`` (the throttled ``provider.progress`` task
events) and ``task.state_changed`` (every non-terminal state change) only when named. A
terminal change is sent as its terminal type only, never also as ``task.state_changed``.
"""

from __future__ import annotations

import enum
import ipaddress
import json
import random
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from urllib.parse import urlsplit

from vidroute_core.validation import FieldViolation

__all__ = [
    "OPTIONAL_EVENTS",
    "TERMINAL_EVENTS",
    "DeliveryState",
    "RetryPolicy",
    "Verdict",
    "WebhookSubscription",
    "address_refusal",
    "event_bit",
    "event_type_for",
    "events_from_mask",
    "message_body",
    "new_message_id",
    "outputs_of",
    "subscription_violations",
    "verdict",
]

TERMINAL_EVENTS: dict[str, str] = {
    "SUCCEEDED": "task.succeeded",
    "FAILED": "task.failed",
    "CANCELLED": "task.cancelled",
}
# Optional event types and their bit in ``generation_tasks.webhook_events`` (a mask, so the
# outbox insert can test a subscription in SQL on both backends).
OPTIONAL_EVENTS: dict[str, int] = {"task.progress": 1, "task.state_changed": 2}
KNOWN_EVENTS = frozenset(TERMINAL_EVENTS.values()) | frozenset(OPTIONAL_EVENTS)
MAX_URL_CHARS = 2048
MAX_EVENTS = 16


class DeliveryState(enum.Enum):
    """A message's delivery state (``webhook_messages.state``)."""

    PENDING = "PENDING"
    DELIVERED = "DELIVERED"
    FAILED = "FAILED"
    REFUSED = "REFUSED"


@dataclass(frozen=True, slots=True)
class WebhookSubscription:
    """Where a task's events go; `events` are the optional types named (terminal ones implied)."""

    url: str
    events: tuple[str, ...] = ()

    @property
    def mask(self) -> int:
        return sum({OPTIONAL_EVENTS[e] for e in self.events if e in OPTIONAL_EVENTS})

    @classmethod
    def stored(cls, url: str, mask: int | None) -> WebhookSubscription:
        return cls(url, events_from_mask(mask or 0))


def events_from_mask(mask: int) -> tuple[str, ...]:
    return tuple(name for name, bit in OPTIONAL_EVENTS.items() if mask & bit)


def event_bit(event_type: str) -> int:
    """The subscription bit an event type needs; 0 for the terminal types (always sent)."""
    return OPTIONAL_EVENTS.get(event_type, 0)


def subscription_violations(
    url: str, events: Sequence[str], *, allow_http: bool, field: str = "webhook"
) -> list[FieldViolation]:
    """What is wrong with a subscription (proto field paths under `field`); empty when valid.

    Only the form is checked here; where the host resolves is checked at send time, because a
    name's addresses can change between CreateTask and the delivery."""
    found: list[FieldViolation] = []
    schemes = ("https", "http") if allow_http else ("https",)
    problem = _url_problem(url, schemes)
    if problem:
        found.append(FieldViolation(f"{field}.url", problem))
    if len(events) > MAX_EVENTS:
        found.append(FieldViolation(f"{field}.events", f"at most {MAX_EVENTS} event types"))
    for i, name in enumerate(events[:MAX_EVENTS]):
        if name not in KNOWN_EVENTS:
            known = ", ".join(sorted(KNOWN_EVENTS))
            found.append(
                FieldViolation(f"{field}.events[{i}]", f"unknown event type; one of {known}")
            )
    return found


def literal_refusal(
    url: str, *, allow_private: bool = False, allowed: Iterable[_Network] = ()
) -> str:
    """Why a well-formed URL's host is refused before anything is stored: an IP literal that
    `address_refusal` refuses, or ``localhost`` (always loopback, RFC 6761). Other names are
    judged at send time, where they resolve; empty when nothing is known to be wrong yet."""
    host = (urlsplit(url).hostname or "").rstrip(".").lower()
    if host == "localhost" or host.endswith(".localhost"):
        return "" if allow_private else f"{host} is a loopback name"
    try:
        return address_refusal(host, allow_private=allow_private, allowed=allowed)
    except ValueError:  # a name, not an address
        return ""


def _url_problem(url: str, schemes: Sequence[str]) -> str:
    if not url:
        return "is required"
    if len(url) > MAX_URL_CHARS or not url.isascii() or any(c.isspace() for c in url):
        return f"must be an ASCII URL of at most {MAX_URL_CHARS} characters without spaces"
    try:
        parts = urlsplit(url)
        _ = parts.port  # raises on a port that is not a number in 0..65535
    except ValueError:
        return "is not a valid URL"
    if parts.scheme not in schemes:
        return f"scheme must be {' or '.join(schemes)}"
    if not parts.hostname:
        return "must name a host"
    if parts.username is not None or parts.password is not None:
        return "must not carry credentials (the signature authenticates the sender)"
    if parts.fragment:
        return "must not have a fragment"
    return ""


def event_type_for(kind: str, payload: Mapping[str, Any]) -> str | None:
    """The webhook event type a task event is, or None when no webhook announces it."""
    if kind == "provider.progress":
        return "task.progress"
    if kind == "task.state_changed":
        state = str(payload.get("state", ""))
        return TERMINAL_EVENTS.get(state, "task.state_changed")
    return None


def outputs_of(output_asset: Mapping[str, Any] | None) -> list[dict[str, Any]]:
    """The stored samples a task's ``output_asset`` holds (a ``samples`` list, or itself)."""
    if not output_asset:
        return []
    samples = output_asset.get("samples")
    if isinstance(samples, list) and samples:
        return [dict(s) for s in samples if isinstance(s, Mapping)]
    return [{k: v for k, v in output_asset.items() if k != "samples"}]


def new_message_id() -> str:
    """A message's id (the ``webhook-id`` header), the same on every retry of it."""
    return f"msg_{uuid.uuid4().hex}"


def message_body(
    event_type: str,
    at: datetime,
    task_id: int,
    payload: Mapping[str, Any],
    outputs: Iterable[Mapping[str, Any]] = (),
) -> str:
    """The JSON body POSTed (stored as sent, since the signature covers its exact bytes).

    ``{"type", "timestamp", "data": {task_id, state, status_version, reason, failure,
    outputs}}``, for task.progress ``data: {task_id, attempt_id, progress: {fraction,
    queue_position}}``; absent parts are left out."""
    data: dict[str, Any] = {"task_id": str(task_id)}
    if event_type == "task.progress":  # the payload's state is its attempt's, not the task's
        data["attempt_id"] = str(payload.get("attempt_id", ""))
        data["progress"] = {
            k: payload[k] for k in ("fraction", "queue_position") if payload.get(k) is not None
        }
    else:
        for key in ("state", "status_version", "reason", "failure"):
            if key in payload:
                data[key] = payload[key]
    listed = [dict(o) for o in outputs]
    if listed:
        data["outputs"] = listed
    body = {"type": event_type, "timestamp": at.isoformat(), "data": data}
    return json.dumps(body, separators=(",", ":"), sort_keys=True, default=str)


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """Exponential backoff with jitter: the delay before attempt ``n + 1`` after ``n`` failed.

    The ceiling of delay n is ``min(max_delay_s, base_delay_s * multiplier ** (n - 1))`` and the
    delay is drawn uniformly from its upper half ("equal jitter"): spread like full jitter, but
    with a multiplier of at least 2 each delay is at least the previous one's ceiling, so the
    delays grow, and a retry never follows a failure at once. At scale 1 the 8 attempts span
    about 18 hours (ceilings 2 min, 6 min, 18 min, 54 min, 2.7 h, 8.1 h, 12 h)."""

    max_attempts: int = 8
    base_delay_s: float = 120.0
    multiplier: float = 3.0
    max_delay_s: float = 43_200.0

    def ceiling(self, failed_attempts: int) -> float:
        exponent = max(0, failed_attempts - 1)
        return min(self.max_delay_s, self.base_delay_s * self.multiplier**exponent)

    def delay_s(self, failed_attempts: int, rng: random.Random) -> float:
        top = self.ceiling(failed_attempts)
        return top / 2 + rng.uniform(0, top / 2)


@dataclass(frozen=True, slots=True)
class Verdict:
    """What an answer (or its absence) means for the message."""

    state: DeliveryState  # PENDING: try again
    retry: bool


def verdict(status_code: int, attempts: int, policy: RetryPolicy) -> Verdict:
    """2xx delivered; 410 Gone stops (the receiver unsubscribed); anything else, or no answer
    (`status_code` 0), is retried until `policy.max_attempts` attempts were made."""
    if 200 <= status_code < 300:
        return Verdict(DeliveryState.DELIVERED, retry=False)
    if status_code == 410 or attempts >= policy.max_attempts:
        return Verdict(DeliveryState.FAILED, retry=False)
    return Verdict(DeliveryState.PENDING, retry=True)


_Network = ipaddress.IPv4Network | ipaddress.IPv6Network
_IP = ipaddress.IPv4Address | ipaddress.IPv6Address
# IPv6 prefixes that carry an IPv4 address a router forwards to: NAT64's well-known prefix
# (RFC 6052, the IPv4 address in the last 32 bits) and 6to4 (2002::/16, bits 16..48).
_NAT64 = ipaddress.ip_network("64:ff9b::/96")
_SITE_LOCAL = ipaddress.ip_network("fec0::/10")  # deprecated (RFC 3879), still not public


def _reached(ip: _IP) -> _IP:
    """The IPv4 address an IPv6 address really reaches (mapped, NAT64, 6to4), else itself."""
    if isinstance(ip, ipaddress.IPv4Address):
        return ip
    if ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    if ip in _NAT64:
        return ipaddress.IPv4Address(int(ip) & 0xFFFF_FFFF)
    if ip.sixtofour is not None:
        return ip.sixtofour
    return ip


def address_refusal(
    address: str, *, allow_private: bool = False, allowed: Iterable[_Network] = ()
) -> str:
    """Why a receiver at `address` (an IP) must not be called; empty when it may be.

    Loopback, private, link-local, site-local, multicast, reserved, unspecified and shared
    (CGNAT) ranges are refused unless configuration allows private addresses or lists the
    network. An IPv6 address that embeds the IPv4 address it reaches (IPv4-mapped, NAT64's
    64:ff9b::/96, 6to4's 2002::/16) is judged by that IPv4 address."""
    given = ipaddress.ip_address(address.split("%", 1)[0])
    ip = _reached(given)
    if allow_private or any(ip in net or given in net for net in allowed):
        return ""
    shown = str(ip) if ip == given else f"{given} (reaching {ip})"
    for label, hit in (
        ("a loopback", ip.is_loopback),
        ("a link-local", ip.is_link_local),
        ("a site-local", ip in _SITE_LOCAL),
        ("a multicast", ip.is_multicast),
        ("an unspecified", ip.is_unspecified),
        ("a private", ip.is_private),
        ("a reserved", ip.is_reserved),
    ):
        if hit:
            return f"{shown} is {label} address"
    if not ip.is_global:
        return f"{shown} is not globally routable"
    return ""
