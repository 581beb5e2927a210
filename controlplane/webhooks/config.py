"""Caller-webhook configuration: each tenant's signing secret and default webhook, and what the
deployment allows (plain http, private addresses).

The document is the YAML of ``VIDROUTE_WEBHOOKS_FILE`` (read by `controlplane.bootstrap`)::

    tenants:
      acme:
        secret: "whsec_<base64 of 24..64 random bytes>"   # required to use webhooks at all
        url: https://hooks.acme.example/vidroute            # optional default webhook
        events: [task.progress]                             # optional extra event types

A tenant without a secret cannot subscribe (CreateTask is FAILED_PRECONDITION): every message
is signed, with a key only that tenant's receivers know.
"""

from __future__ import annotations

import base64
import binascii
import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import yaml

from controlplane.domain.webhooks import WebhookSubscription, subscription_violations

__all__ = ["TenantWebhooks", "WebhookPolicy", "parse_networks", "parse_webhooks_document"]

SECRET_PREFIX = "whsec_"
MIN_SECRET_BYTES = 24  # the Standard Webhooks spec: between 24 and 64 bytes
MAX_SECRET_BYTES = 64

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


@dataclass(frozen=True, slots=True)
class TenantWebhooks:
    """One tenant's signing secret (``whsec_<base64>``) and default subscription."""

    secret: str = field(repr=False)
    default: WebhookSubscription | None = None


@dataclass(frozen=True, slots=True)
class WebhookPolicy:
    """What the deployment allows. Private addresses (loopback, RFC 1918, link-local, ...) are
    refused at send time unless `allow_private`, or the address is in `private_allowlist`."""

    tenants: Mapping[str, TenantWebhooks] = field(default_factory=dict)
    allow_http: bool = False
    allow_private: bool = False
    private_allowlist: tuple[Network, ...] = ()

    def secret_for(self, tenant_id: str) -> str | None:
        found = self.tenants.get(tenant_id)
        return None if found is None else found.secret

    def default_for(self, tenant_id: str) -> WebhookSubscription | None:
        found = self.tenants.get(tenant_id)
        return None if found is None else found.default


def _secret(tenant: str, raw: object) -> str:
    if not isinstance(raw, str) or not raw.startswith(SECRET_PREFIX):
        raise ValueError(f"webhooks: tenant {tenant!r}: secret must be 'whsec_<base64>'")
    try:
        key = base64.b64decode(raw.removeprefix(SECRET_PREFIX), validate=True)
    except (binascii.Error, ValueError) as exc:
        raise ValueError(f"webhooks: tenant {tenant!r}: secret is not valid base64") from exc
    if not MIN_SECRET_BYTES <= len(key) <= MAX_SECRET_BYTES:
        raise ValueError(
            f"webhooks: tenant {tenant!r}: secret must decode to "
            f"{MIN_SECRET_BYTES}..{MAX_SECRET_BYTES} bytes, not {len(key)}"
        )
    return raw


def _tenant(name: str, raw: Any, allow_http: bool) -> TenantWebhooks:
    if not isinstance(raw, dict):
        raise ValueError(f"webhooks: tenant {name!r} must be a mapping")
    unknown = set(raw) - {"secret", "url", "events"}
    if unknown:
        raise ValueError(f"webhooks: tenant {name!r}: unknown keys {sorted(unknown)}")
    secret = _secret(name, raw.get("secret"))
    url = raw.get("url")
    if url is None:
        return TenantWebhooks(secret)
    events = raw.get("events") or []
    if not isinstance(url, str) or not isinstance(events, list):
        raise ValueError(f"webhooks: tenant {name!r}: url must be text and events a list")
    names = [str(e) for e in events]
    problems = subscription_violations(url, names, allow_http=allow_http, field=name)
    if problems:
        listed = "; ".join(f"{p.field}: {p.description}" for p in problems)
        raise ValueError(f"webhooks: default webhook of {listed}")
    return TenantWebhooks(secret, WebhookSubscription(url, tuple(names)))


def parse_webhooks_document(
    text: str,
    *,
    allow_http: bool = False,
    allow_private: bool = False,
    private_allowlist: tuple[Network, ...] = (),
) -> WebhookPolicy:
    """The policy of a webhooks file (module docstring); ValueError names what is wrong."""
    data = yaml.safe_load(text) if text.strip() else {}
    if not isinstance(data, dict) or not isinstance(data.get("tenants", {}), dict):
        raise ValueError("webhooks: the file must be a mapping with a 'tenants' mapping")
    tenants = {
        str(name): _tenant(str(name), raw, allow_http)
        for name, raw in (data.get("tenants") or {}).items()
    }
    return WebhookPolicy(tenants, allow_http, allow_private, private_allowlist)


def parse_networks(
    raw: str, name: str = "VIDROUTE_WEBHOOK_PRIVATE_ALLOWLIST"
) -> tuple[Network, ...]:
    """``10.0.0.0/8,fd00::/8,192.0.2.7`` -> networks (a bare address is its own /32 or /128);
    a bad entry is a ValueError naming the variable `name` and the entry."""
    found: list[Network] = []
    for item in (part.strip() for part in raw.split(",")):
        if not item:
            continue
        try:
            found.append(ipaddress.ip_network(item, strict=False))
        except ValueError:
            raise ValueError(
                f"{name}: {item!r} is not an IP network or address (e.g. 10.1.2.0/24, fd00::/8)"
            ) from None
    return tuple(found)
