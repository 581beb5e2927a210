"""mTLS between the control plane and the adapter sidecars: credentials read from PEM files.

Both sides read the same variables (each composition root passes its environment in; nothing
here reads ``os.environ``):

``VIDROUTE_TLS_CERT_FILE``
    PEM certificate (chain) of this process: the sidecar's server certificate (its SANs name
    the address the control plane dials, e.g. ``adapter-runway``), the control plane's client
    certificate.
``VIDROUTE_TLS_KEY_FILE``
    Its PEM private key.
``VIDROUTE_TLS_CA_FILE``
    PEM bundle of the CA the peer's certificate must chain to (sidecar: the CA of its clients,
    whose certificate it REQUIRES; control plane: the CA of the sidecars).
``VIDROUTE_TLS``
    ``""`` (default): TLS when the three files are set, else plaintext, which a sidecar accepts
    only on a loopback address (``make up``) and the control plane only towards loopback
    sidecars. ``on``: refuse to start without the files. ``off``: plaintext on any address
    (explicitly: e.g. a service mesh does mTLS instead).
``VIDROUTE_TLS_SERVER_NAME``
    Control plane only, optional: the name checked on every sidecar certificate instead of the
    dialled host.

Sidecars also take ``VIDROUTE_HEALTH_LISTEN`` (``adapter_sidecars.common.server``): a plaintext
port serving only ``grpc.health.v1``, for Kubernetes' native gRPC probes, which cannot present
a client certificate.

Kubernetes (``k8s/base``): each component has a Secret ``<component>-tls`` (type
``kubernetes.io/tls`` plus ``ca.crt``, cert-manager's layout) mounted at
``/var/run/secrets/vidroute-tls/``: ``tls.crt``, ``tls.key``, ``ca.crt`` (`K8S_*` below).

The gRPC credentials built from these files are the proto edge's (`vidroute_core.wire.tls`:
``server_credentials``, ``channel_credentials``); this module only reads and checks.

The sidecar re-reads the files when they change (Kubernetes rotates a mounted Secret in place),
for new connections; the control plane reads them when its channels are built (a rotation takes
a restart, which rolling the Deployment on a Secret change does).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

ENV_CERT = "VIDROUTE_TLS_CERT_FILE"
ENV_KEY = "VIDROUTE_TLS_KEY_FILE"
ENV_CA = "VIDROUTE_TLS_CA_FILE"
ENV_MODE = "VIDROUTE_TLS"
ENV_SERVER_NAME = "VIDROUTE_TLS_SERVER_NAME"
MODES = ("", "on", "off")

#: Where the Kubernetes manifests mount each component's TLS Secret.
K8S_TLS_DIR = "/var/run/secrets/vidroute-tls"
K8S_CERT_FILE = f"{K8S_TLS_DIR}/tls.crt"
K8S_KEY_FILE = f"{K8S_TLS_DIR}/tls.key"
K8S_CA_FILE = f"{K8S_TLS_DIR}/ca.crt"


class TlsConfigError(ValueError):
    """The TLS configuration is incomplete, unreadable, or would send plaintext off-host."""


@dataclass(frozen=True, slots=True)
class TlsFiles:
    """This process's certificate and key, and the CA its peers must chain to."""

    cert_file: Path
    key_file: Path
    ca_file: Path

    def read(self) -> tuple[bytes, bytes, bytes]:
        """(certificate chain, private key, CA bundle) as PEM bytes; each must be non-empty."""
        return (
            _read_pem(self.cert_file, "certificate"),
            _read_pem(self.key_file, "key"),
            _read_pem(self.ca_file, "CA"),
        )

    def stamp(self) -> tuple[tuple[int, int], ...]:
        """(mtime_ns, size) of each file: what changes when a Secret is rotated."""
        stamps = []
        for path in (self.cert_file, self.key_file, self.ca_file):
            try:
                st = path.stat()
            except OSError:
                stamps.append((-1, -1))
            else:
                stamps.append((st.st_mtime_ns, st.st_size))
        return tuple(stamps)


def _read_pem(path: Path, what: str) -> bytes:
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise TlsConfigError(f"cannot read the TLS {what} file {path}: {exc}") from exc
    if b"-----BEGIN " not in data:
        raise TlsConfigError(f"the TLS {what} file {path} holds no PEM block")
    return data


@dataclass(frozen=True, slots=True)
class TlsSettings:
    """What ``VIDROUTE_TLS*`` say: the files (None: plaintext) and whether plaintext may leave
    the host."""

    files: TlsFiles | None = None
    plaintext_anywhere: bool = False
    server_name: str = ""

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> TlsSettings:
        """`build` from a mapping of the ``VIDROUTE_TLS*`` variables."""
        return cls.build(
            mode=env.get(ENV_MODE, ""),
            cert_file=env.get(ENV_CERT, ""),
            key_file=env.get(ENV_KEY, ""),
            ca_file=env.get(ENV_CA, ""),
            server_name=env.get(ENV_SERVER_NAME, ""),
        )

    @classmethod
    def build(
        cls, *, mode: str, cert_file: str, key_file: str, ca_file: str, server_name: str = ""
    ) -> TlsSettings:
        """The settings the module docstring describes; the files are read once to check them."""
        mode = mode.strip().lower()
        if mode not in MODES:
            raise TlsConfigError(f"{ENV_MODE} must be one of {MODES}, got {mode!r}")
        paths = {ENV_CERT: cert_file.strip(), ENV_KEY: key_file.strip(), ENV_CA: ca_file.strip()}
        given = [name for name, value in paths.items() if value]
        if mode == "off":
            return cls(plaintext_anywhere=True)
        if given and len(given) < len(paths):
            missing = sorted(set(paths) - set(given))
            raise TlsConfigError(f"TLS needs all of {sorted(paths)}; missing {missing}")
        if not given:
            if mode == "on":
                raise TlsConfigError(f"{ENV_MODE}=on but {sorted(paths)} are not set")
            return cls()
        files = TlsFiles(Path(paths[ENV_CERT]), Path(paths[ENV_KEY]), Path(paths[ENV_CA]))
        files.read()  # fail at start, with the file named, rather than at the first handshake
        return cls(files=files, server_name=server_name.strip())

    def check_plaintext(self, address: str, *, role: str) -> None:
        """Refuse plaintext to or on `address` unless it is loopback or ``VIDROUTE_TLS=off``."""
        if self.files is not None or self.plaintext_anywhere or is_loopback(address):
            return
        raise TlsConfigError(
            f"{role} {address} is not a loopback address: configure {ENV_CERT}, {ENV_KEY} and "
            f"{ENV_CA} (mTLS), or set {ENV_MODE}=off to allow plaintext explicitly"
        )


def host_of(address: str) -> str:
    """The host part of ``host:port``, ``[v6]:port`` or a ``scheme:`` gRPC target."""
    target = address
    for prefix in ("dns:///", "ipv4:", "ipv6:"):
        target = target.removeprefix(prefix)
    if target.startswith("["):
        return target[1 : target.find("]")]
    host, sep, _port = target.rpartition(":")
    return host if sep else target


def is_loopback(address: str) -> bool:
    """Whether `address` can only be reached from this host (``localhost``, 127/8, ::1)."""
    host = host_of(address)
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def channel_options(settings: TlsSettings) -> list[tuple[str, str]]:
    """gRPC channel options for `settings` (the server name override when one is configured)."""
    if settings.files is not None and settings.server_name:
        return [("grpc.ssl_target_name_override", settings.server_name)]
    return []


__all__ = [
    "K8S_CA_FILE",
    "K8S_CERT_FILE",
    "K8S_KEY_FILE",
    "K8S_TLS_DIR",
    "TlsConfigError",
    "TlsFiles",
    "TlsSettings",
    "channel_options",
    "host_of",
    "is_loopback",
]
