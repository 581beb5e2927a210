"""The dev stack's caller-webhook signing file (`clients.dev_webhooks`): written once, owner-only,
read by the control plane as the dev tenant's secret; an operator's own file wins."""

from __future__ import annotations

from pathlib import Path

from clients.dev_webhooks import ensure_dev_webhooks
from controlplane.bootstrap import Settings


def test_the_first_start_writes_a_secret_the_control_plane_reads(tmp_path: Path) -> None:
    """No VIDROUTE_WEBHOOKS_FILE: an owner-only file gives tenant acme a signing secret, and
    plain http and private receivers are allowed (a receiver on 127.0.0.1)."""
    added = ensure_dev_webhooks(tmp_path / "var", "acme", {})
    path = Path(added["VIDROUTE_WEBHOOKS_FILE"])
    assert path.parent == tmp_path / "var"
    assert path.stat().st_mode & 0o077 == 0
    settings = Settings.from_env(added)
    secret = settings.webhooks.secret_for("acme")
    assert secret is not None
    assert secret.startswith("whsec_")
    assert settings.webhooks.allow_http
    assert settings.webhooks.allow_private


def test_a_later_start_keeps_the_secret(tmp_path: Path) -> None:
    """The second start reuses the file: a receiver set up with the secret keeps verifying."""
    first = Path(ensure_dev_webhooks(tmp_path, "acme", {})["VIDROUTE_WEBHOOKS_FILE"])
    before = first.read_text()
    second = Path(ensure_dev_webhooks(tmp_path, "acme", {})["VIDROUTE_WEBHOOKS_FILE"])
    assert (second, second.read_text()) == (first, before)


def test_an_operators_own_settings_win(tmp_path: Path) -> None:
    """A set VIDROUTE_WEBHOOKS_FILE is used as is and nothing is written; a set allowance stays."""
    assert ensure_dev_webhooks(tmp_path, "acme", {"VIDROUTE_WEBHOOKS_FILE": "/mine.yaml"}) == {}
    assert not any(tmp_path.iterdir())
    added = ensure_dev_webhooks(tmp_path, "acme", {"VIDROUTE_WEBHOOK_ALLOW_HTTP": "0"})
    assert "VIDROUTE_WEBHOOK_ALLOW_HTTP" not in added
    assert added["VIDROUTE_WEBHOOK_ALLOW_PRIVATE"] == "1"
