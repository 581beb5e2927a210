"""Where plaintext is allowed (vidroute_core.tls): only to and on loopback addresses, unless
VIDROUTE_TLS=off; the control plane's composition root applies the rule to every sidecar."""

from __future__ import annotations

import pytest

from controlplane.adapters.connect import adapter_client
from vidroute_core.tls import TlsConfigError, TlsSettings, host_of, is_loopback


@pytest.mark.parametrize(
    ("address", "host", "loopback"),
    [
        ("127.0.0.1:50061", "127.0.0.1", True),
        ("127.9.8.7:1", "127.9.8.7", True),
        ("localhost:50061", "localhost", True),
        ("[::1]:50061", "::1", True),
        ("ipv4:127.0.0.1:50061", "127.0.0.1", True),
        ("0.0.0.0:50061", "0.0.0.0", False),
        ("[::]:50061", "::", False),
        ("adapter-runway:50061", "adapter-runway", False),
        ("dns:///adapter-veo:50062", "adapter-veo", False),
        ("10.0.0.7:50061", "10.0.0.7", False),
        ("localhost.evil.example:1", "localhost.evil.example", False),
    ],
)
def test_loopback_addresses(address: str, host: str, loopback: bool) -> None:
    """The host of a gRPC address, and whether only this machine can reach it."""
    assert host_of(address) == host
    assert is_loopback(address) is loopback


async def test_plaintext_to_a_remote_sidecar_is_refused_unless_tls_is_off() -> None:
    """Without certificate files the control plane dials only loopback sidecars, unless
    VIDROUTE_TLS=off says plaintext is intended."""
    with pytest.raises(TlsConfigError, match="VIDROUTE_TLS=off"):
        adapter_client(TlsSettings(), "adapter-runway:50061", {})
    off = TlsSettings.from_env({"VIDROUTE_TLS": "off"})
    for settings, address in ((TlsSettings(), "127.0.0.1:50061"), (off, "adapter-runway:50061")):
        await adapter_client(settings, address, {}).close()  # built: nothing dialled yet
