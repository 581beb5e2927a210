"""The platform's S3-compatible object store for end-to-end tests: moto's S3 over TLS.

A provider fetches input URLs only over https from a host name (provider-apis.md §1.7), so the
store a test presigns URLs from serves https on ``localhost`` with a certificate from a throwaway
CA (`tests.support.pki`). Processes that talk to it trust that CA (``AWS_CA_BUNDLE`` for boto3,
the emulator's ``asset_ca_file``). Clients use dummy keys; nothing touches the AWS environment.

moto 5.2 does not enforce a presigned URL's lifetime; real S3 answers 403 ``AccessDenied``
("Request has expired") once ``X-Amz-Date`` + ``X-Amz-Expires`` has passed. `expiring` adds
exactly that check in front of moto, so an expired URL fails here the way it fails on S3.
"""

from __future__ import annotations

import secrets
import ssl
import threading
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

import boto3
from botocore.config import Config
from moto.moto_server.werkzeug_app import DomainDispatcherApplication, create_backend_app
from werkzeug.serving import WSGIRequestHandler, make_server

from tests.support.pki import make_pki

REGION = "us-east-1"
DUMMY_KEY = "testing"


@dataclass(frozen=True)
class TlsS3:
    """A running store: its https endpoint, the CA file that trusts it, an admin client."""

    endpoint: str
    ca_file: Path
    client: Any

    def ssl_context(self) -> ssl.SSLContext:
        """A client context trusting the store's CA (for httpx)."""
        return ssl.create_default_context(cafile=str(self.ca_file))

    @property
    def env(self) -> dict[str, str]:
        """What a process needs to reach the store with boto3's standard credential chain."""
        return {
            "AWS_ACCESS_KEY_ID": DUMMY_KEY,
            "AWS_SECRET_ACCESS_KEY": DUMMY_KEY,
            "AWS_DEFAULT_REGION": REGION,
            "AWS_CA_BUNDLE": str(self.ca_file),
        }

    def store_url(self, bucket: str) -> str:
        """The object-store URL form (``controlplane.storage.factory``) of `bucket`."""
        return f"s3://{bucket}?endpoint_url={self.endpoint}&region={REGION}"

    def create_bucket(self) -> str:
        name = f"vidroute-e2e-{secrets.token_hex(4)}"
        self.client.create_bucket(Bucket=name)
        return name

    def presign(self, bucket: str, key: str, expires_s: int) -> str:
        """A presigned GET URL of one object (SigV4, `expires_s` seconds)."""
        url: str = self.client.generate_presigned_url(
            "get_object", Params={"Bucket": bucket, "Key": key}, ExpiresIn=expires_s
        )
        return url


_EXPIRED = (
    b"<?xml version='1.0' encoding='UTF-8'?><Error><Code>AccessDenied</Code>"
    b"<Message>Request has expired</Message></Error>"
)
Wsgi = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]


def expiring(app: Wsgi) -> Wsgi:
    """`app` behind S3's presigned-URL lifetime check (see the module docstring)."""

    def checked(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        query = parse_qs(environ.get("QUERY_STRING", ""))
        signed, lifetime = query.get("X-Amz-Date", [""])[0], query.get("X-Amz-Expires", [""])[0]
        if signed and lifetime.isdigit():
            issued = datetime.strptime(signed, "%Y%m%dT%H%M%SZ").replace(tzinfo=UTC)
            if datetime.now(UTC) > issued + timedelta(seconds=int(lifetime)):
                start_response("403 Forbidden", [("Content-Type", "application/xml")])
                return [_EXPIRED]
        return app(environ, start_response)

    return checked


class _QuietHandler(WSGIRequestHandler):
    def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
        """Not one line per request in the test's captured log."""


@contextmanager
def tls_s3(directory: Path) -> Iterator[TlsS3]:
    """moto's S3 on https://localhost:<free port> for the duration of the block."""
    pki = make_pki(directory)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(str(pki.server.cert_file), str(pki.server.key_file))
    app = expiring(DomainDispatcherApplication(create_backend_app))
    server = make_server(
        "127.0.0.1", 0, app, threaded=True, ssl_context=context, request_handler=_QuietHandler
    )
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    endpoint = f"https://localhost:{server.server_port}"
    session = boto3.session.Session(
        aws_access_key_id=DUMMY_KEY, aws_secret_access_key=DUMMY_KEY, region_name=REGION
    )
    client = session.client(
        "s3",
        endpoint_url=endpoint,
        verify=str(pki.ca.cert_file),
        config=Config(signature_version="s3v4", s3={"addressing_style": "path"}),
    )
    try:
        yield TlsS3(endpoint, pki.ca.cert_file, client)
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
