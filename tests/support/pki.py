"""Throwaway certificate authorities for the mTLS tests (``cryptography``, written as PEM files).

`make_pki(directory)` writes a CA, a server certificate for the names a test dials (localhost,
127.0.0.1 and the Kubernetes Service names) and a client certificate, all from that CA; a
second, unrelated CA with its own client certificate stands for a stranger.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from vidroute_core.tls import TlsFiles

SERVER_NAMES = ("localhost", "adapter-runway", "adapter-veo", "adapter-selfhosted")


@dataclass(frozen=True)
class Authority:
    """A CA's certificate and key, in memory and as a PEM file."""

    cert: x509.Certificate
    key: ec.EllipticCurvePrivateKey
    cert_file: Path


@dataclass(frozen=True)
class Pki:
    """The files a test hands to servers and clients."""

    ca: Authority
    server: TlsFiles  # signed by `ca`, trusts `ca` for its clients
    client: TlsFiles  # signed by `ca`, trusts `ca` for servers
    stranger: TlsFiles  # client signed by another CA (which trusts `ca` for servers)
    directory: Path


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def make_authority(directory: Path, name: str) -> Authority:
    """A self-signed CA valid for a day, written to ``<name>-ca.crt``."""
    key = ec.generate_private_key(ec.SECP256R1())
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(f"{name} test CA"))
        .issuer_name(_name(f"{name} test CA"))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .sign(key, hashes.SHA256())
    )
    path = _write(directory / f"{name}-ca.crt", cert.public_bytes(serialization.Encoding.PEM))
    return Authority(cert, key, path)


def issue(
    authority: Authority,
    directory: Path,
    name: str,
    *,
    server: bool,
    trust: Path,
) -> TlsFiles:
    """A leaf certificate for `name` signed by `authority` (SANs: `SERVER_NAMES` and 127.0.0.1
    for a server), written as ``<name>.crt`` / ``<name>.key``, trusting the CA file `trust`."""
    key = ec.generate_private_key(ec.SECP256R1())
    now = dt.datetime.now(dt.UTC)
    usage = ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH
    sans: list[x509.GeneralName] = [x509.DNSName(name)]
    if server:
        sans = [x509.DNSName(n) for n in SERVER_NAMES]
        sans.append(x509.IPAddress(ipaddress.ip_address("127.0.0.1")))
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(name))
        .issuer_name(authority.cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .sign(authority.key, hashes.SHA256())
    )
    cert_file = _write(directory / f"{name}.crt", cert.public_bytes(serialization.Encoding.PEM))
    key_file = _write(directory / f"{name}.key", _pem_key(key))
    return TlsFiles(cert_file, key_file, trust)


def make_pki(directory: Path) -> Pki:
    """A CA with a server and a client certificate, and a stranger's client certificate."""
    directory.mkdir(parents=True, exist_ok=True)
    ca = make_authority(directory, "vidroute")
    other = make_authority(directory, "other")
    return Pki(
        ca=ca,
        server=issue(ca, directory, "sidecar", server=True, trust=ca.cert_file),
        client=issue(ca, directory, "controlplane", server=False, trust=ca.cert_file),
        stranger=issue(other, directory, "stranger", server=False, trust=ca.cert_file),
        directory=directory,
    )
