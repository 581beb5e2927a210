"""Caller-webhook configuration: the tenants' file and the VIDROUTE_WEBHOOK* variables, read by
the composition root; a bad file stops the start with a message naming what is wrong."""

from __future__ import annotations

import base64
import ipaddress
from pathlib import Path

import pytest

from controlplane.bootstrap import Settings
from controlplane.domain.webhooks import WebhookSubscription
from controlplane.webhooks.config import parse_networks, parse_webhooks_document

SECRET = "whsec_" + base64.b64encode(b"k" * 32).decode()


def test_a_tenant_gets_its_secret_and_default(tmp_path: Path) -> None:
    """The file's tenants become the policy: secret, default URL and events."""
    path = tmp_path / "webhooks.yaml"
    path.write_text(
        f"tenants:\n  acme:\n    secret: {SECRET}\n    url: https://h.example/in\n"
        "    events: [task.progress]\n  globex:\n    secret: " + SECRET + "\n",
        encoding="utf-8",
    )
    settings = Settings.from_env(
        {
            "VIDROUTE_WEBHOOKS_FILE": str(path),
            "VIDROUTE_WEBHOOK_ALLOW_PRIVATE": "true",
            "VIDROUTE_WEBHOOK_PRIVATE_ALLOWLIST": "10.1.0.0/16, 192.0.2.7",
        }
    )
    policy = settings.webhooks
    assert policy.secret_for("acme") == SECRET
    assert policy.default_for("acme") == WebhookSubscription(
        "https://h.example/in", ("task.progress",)
    )
    assert policy.default_for("globex") is None
    assert policy.secret_for("initech") is None
    assert policy.allow_private
    assert not policy.allow_http
    assert policy.private_allowlist == (
        ipaddress.ip_network("10.1.0.0/16"),
        ipaddress.ip_network("192.0.2.7/32"),
    )


def test_without_the_file_no_tenant_has_webhooks_and_the_guard_is_on() -> None:
    """The defaults: no tenants, https only, private addresses refused."""
    policy = Settings.from_env({}).webhooks
    assert dict(policy.tenants) == {}
    assert not policy.allow_http
    assert not policy.allow_private
    assert policy.private_allowlist == ()


@pytest.mark.parametrize(
    ("document", "message"),
    [
        ("tenants: [1, 2]", "a 'tenants' mapping"),
        ("tenants:\n  acme: {url: 'https://h.example/'}", "secret must be 'whsec_<base64>'"),
        ("tenants:\n  acme: {secret: 'whsec_%%%'}", "not valid base64"),
        ("tenants:\n  acme: {secret: 'whsec_" + base64.b64encode(b"k").decode() + "'}", "24..64"),
        (f"tenants:\n  acme: {{secret: '{SECRET}', urls: 'x'}}", "unknown keys"),
        (f"tenants:\n  acme: {{secret: '{SECRET}', url: 'http://h.example/'}}", "acme.url"),
        (
            f"tenants:\n  acme: {{secret: '{SECRET}', url: 'https://h.example/', events: [x]}}",
            "acme.events[0]",
        ),
    ],
)
def test_a_bad_file_is_refused_with_the_reason(document: str, message: str) -> None:
    """Each broken entry is a ValueError naming the tenant and the problem."""
    with pytest.raises(ValueError, match="webhooks") as caught:
        parse_webhooks_document(document)
    assert message in str(caught.value)


def test_a_bad_allowlist_or_flag_stops_the_start() -> None:
    """An allowlist entry that is no network, or a flag that is no boolean, is an error that
    names the variable."""
    with pytest.raises(ValueError, match="'not-a-network' is not an IP network"):
        parse_networks("10.0.0.0/8,not-a-network")
    with pytest.raises(ValueError, match=r"^VIDROUTE_WEBHOOK_PRIVATE_ALLOWLIST: '10\.0\.0\.0/33'"):
        Settings.from_env({"VIDROUTE_WEBHOOK_PRIVATE_ALLOWLIST": "10.0.0.0/33"})
    with pytest.raises(ValueError, match="VIDROUTE_WEBHOOK_ALLOW_HTTP"):
        Settings.from_env({"VIDROUTE_WEBHOOK_ALLOW_HTTP": "maybe"})


def test_a_webhooks_file_that_cannot_be_read_names_the_variable(tmp_path: Path) -> None:
    """A missing VIDROUTE_WEBHOOKS_FILE stops the start with a line naming the variable and the
    path, not a bare FileNotFoundError."""
    missing = tmp_path / "nope.yaml"
    with pytest.raises(
        ValueError, match=r"^VIDROUTE_WEBHOOKS_FILE='.*nope\.yaml': Path does not point"
    ):
        Settings.from_env({"VIDROUTE_WEBHOOKS_FILE": str(missing)})
