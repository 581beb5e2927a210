"""gRPC credentials from the TLS files `vidroute_core.tls` reads (the one place both the control
plane and the sidecars build them, so both sides load certificates the same way).

* `server_credentials`: the sidecar's port; a client certificate chaining to the configured CA
  is REQUIRED. The files are re-read when they change (a rotated Kubernetes Secret): before each
  new handshake gRPC asks for the configuration, the (mtime, size) stamps are compared, and a
  changed set that loads serves the next connections; one that does not is logged and the
  previous one kept.
* `channel_credentials`: the control plane's channel to a sidecar; our client certificate, and
  only the configured CA is trusted.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import cast

import grpc

from vidroute_core.tls import TlsConfigError, TlsFiles

log = logging.getLogger(__name__)


def channel_credentials(files: TlsFiles) -> grpc.ChannelCredentials:
    """Client side: present our certificate, trust only the configured CA."""
    cert, key, ca = files.read()
    return grpc.ssl_channel_credentials(
        root_certificates=ca, private_key=key, certificate_chain=cert
    )


class _Reloader:
    """Hands gRPC a new certificate configuration when the files change; gRPC calls it on its
    own threads before each handshake."""

    def __init__(self, files: TlsFiles) -> None:
        self._files = files
        self._lock = threading.Lock()
        self._stamp = files.stamp()

    def initial(self) -> grpc.ServerCertificateConfiguration:
        return _configuration(self._files)

    def __call__(self) -> grpc.ServerCertificateConfiguration | None:
        stamp = self._files.stamp()
        with self._lock:
            if stamp == self._stamp:
                return None
            self._stamp = stamp
        try:
            config = _configuration(self._files)
        except TlsConfigError as exc:  # mid-rotation or broken: keep serving the previous set
            log.warning("TLS files changed but do not load, keeping the previous ones: %s", exc)
            with self._lock:
                self._stamp = ()
            return None
        log.info("TLS certificate files reloaded")
        return config


def _configuration(files: TlsFiles) -> grpc.ServerCertificateConfiguration:
    cert, key, ca = files.read()
    return grpc.ssl_server_certificate_configuration([(key, cert)], root_certificates=ca)


def server_credentials(files: TlsFiles) -> grpc.ServerCredentials:
    """Server side: our certificate; a client certificate chaining to the CA is REQUIRED."""
    reloader = _Reloader(files)
    # gRPC documents None as "unchanged"; types-grpcio's signature leaves the None out.
    fetch = cast(Callable[[], grpc.ServerCertificateConfiguration], reloader)
    return grpc.dynamic_ssl_server_credentials(
        reloader.initial(), fetch, require_client_authentication=True
    )
