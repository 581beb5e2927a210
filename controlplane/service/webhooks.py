"""Caller webhooks in the public API: the subscription a CreateTask stores.

`WebhookSubscriptions.resolve` runs before anything is written: a malformed URL, a host that is
a refused IP literal or ``localhost`` (private addresses not allowed), or an unknown event type
is INVALID_ARGUMENT (``webhook.url``, ``webhook.events[i]``, reported with the
spec's other violations); a tenant without a signing secret is FAILED_PRECONDITION. A CreateTask
that names no webhook gets the tenant's default, if its configuration has one.
"""

from __future__ import annotations

from controlplane.domain.webhooks import (
    WebhookSubscription,
    literal_refusal,
    subscription_violations,
)
from controlplane.webhooks.config import WebhookPolicy
from vidroute_core.exceptions import PreconditionFailed
from vidroute_core.validation import FieldViolation

__all__ = ["WebhookSubscriptions"]


class WebhookSubscriptions:
    """What a new task is subscribed to, under the deployment's `WebhookPolicy`."""

    def __init__(self, policy: WebhookPolicy | None = None) -> None:
        self.policy = policy or WebhookPolicy()

    def violations(self, requested: WebhookSubscription | None) -> list[FieldViolation]:
        if requested is None:
            return []
        found = subscription_violations(
            requested.url, requested.events, allow_http=self.policy.allow_http
        )
        if not any(v.field == "webhook.url" for v in found):
            refusal = literal_refusal(
                requested.url,
                allow_private=self.policy.allow_private,
                allowed=self.policy.private_allowlist,
            )
            if refusal:
                found.insert(0, FieldViolation("webhook.url", f"{refusal}: never called"))
        return found

    def resolve(
        self, requested: WebhookSubscription | None, tenant_id: str
    ) -> WebhookSubscription | None:
        """The subscription to store (the request's, else the tenant's default, else None);
        call after `violations` came back empty."""
        chosen = requested or self.policy.default_for(tenant_id)
        if chosen is None:
            return None
        if self.policy.secret_for(tenant_id) is None:
            raise PreconditionFailed(
                f"tenant {tenant_id!r} has no webhook signing secret configured "
                "(VIDROUTE_WEBHOOKS_FILE): a webhook cannot be signed",
                reason="WEBHOOK_SECRET_MISSING",
                labels={"tenant_id": tenant_id},
            )
        # As stored: the optional types in their canonical order (terminal ones are implied).
        return WebhookSubscription.stored(chosen.url, chosen.mask)
