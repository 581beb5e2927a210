"""A real S3-compatible server for tests: moto in server mode on a free local port.

Import the `moto_s3` fixture into a conftest to use it. Clients are built from one boto3
session with explicit dummy keys, so no test depends on, or changes, the AWS environment.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import boto3
import pytest
from moto.server import ThreadedMotoServer

REGION = "us-east-1"
DUMMY_KEY = "testing"


@dataclass(frozen=True)
class MotoS3:
    """A running moto server: its endpoint, a session with dummy keys and an admin client."""

    endpoint: str
    session: boto3.session.Session
    client: Any

    def create_bucket(self) -> str:
        """A fresh bucket with a unique name."""
        name = f"vidroute-test-{secrets.token_hex(4)}"
        self.client.create_bucket(Bucket=name)
        return name

    def read(self, bucket: str, key: str) -> bytes:
        """An object's bytes, read behind the store's back."""
        data: bytes = self.client.get_object(Bucket=bucket, Key=key)["Body"].read()
        return data


@pytest.fixture(scope="session")
def moto_s3() -> Iterator[MotoS3]:
    """moto's S3 HTTP server on 127.0.0.1 (port chosen by the OS) for the whole session."""
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    session = boto3.session.Session(
        aws_access_key_id=DUMMY_KEY, aws_secret_access_key=DUMMY_KEY, region_name=REGION
    )
    try:
        yield MotoS3(endpoint, session, session.client("s3", endpoint_url=endpoint))
    finally:
        server.stop()


def use_fake_aws_credentials(monkeypatch: pytest.MonkeyPatch, tmp_dir: str) -> None:
    """Point the standard boto3 credential chain at dummy keys and away from ~/.aws."""
    for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", DUMMY_KEY)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", DUMMY_KEY)
    monkeypatch.setenv("AWS_DEFAULT_REGION", REGION)
    monkeypatch.setenv("AWS_CONFIG_FILE", f"{tmp_dir}/aws-config-absent")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", f"{tmp_dir}/aws-credentials-absent")
