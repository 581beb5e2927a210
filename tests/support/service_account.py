"""Throwaway Google service-account keys for tests (never a real account's).

`new_service_account` makes an RSA key pair and the key JSON Google would issue for it, with the
``token_uri`` pointed at an emulator's token endpoint; the emulator is given the public half
(``VeoConfig.service_accounts``) so it can verify the signed assertions.
"""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa


@dataclass(frozen=True)
class ServiceAccount:
    """A key JSON (as a dict) and its public key PEM."""

    email: str
    key: dict[str, Any]
    public_pem: str

    def key_json(self, token_uri: str) -> dict[str, Any]:
        """The key JSON with its ``token_uri`` (the emulator's, known once it listens)."""
        return {**self.key, "token_uri": token_uri}

    def write(self, path: Path, token_uri: str) -> Path:
        """Write the key JSON to `path` (what a ``credential_ref: file:`` names)."""
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.key_json(token_uri)), encoding="utf-8")
        return path


def new_service_account(name: str = "vidroute-test") -> ServiceAccount:
    """A fresh 2048-bit service-account key (give the emulator `public_pem`)."""
    private = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    private_pem = private.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    ).decode("ascii")
    public_pem = (
        private.public_key()
        .public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
        .decode("ascii")
    )
    email = f"{name}@vidroute-test.iam.gserviceaccount.com"
    key = {
        "type": "service_account",
        "project_id": "vidroute-test",
        "private_key_id": secrets.token_hex(20),
        "private_key": private_pem,
        "client_email": email,
        "client_id": str(secrets.randbelow(10**20)),
        "token_uri": "https://oauth2.googleapis.com/token",
    }
    return ServiceAccount(email, key, public_pem)
