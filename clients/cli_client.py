"""The CLI's connection to the control plane: the SDK's `Client` (`clients.sdk`) for the
SchedulerService, and a plain channel for the services the SDK does not cover (billing, health).

Both use the connection `clients.cli_config` resolved: target, bearer token, TLS.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import grpc

from clients import auth as client_auth
from clients.cli_config import Connection
from clients.sdk import Client


def credentials(conn: Connection) -> grpc.ChannelCredentials | None:
    """TLS credentials when the connection asks for TLS (its CA file, else the system roots)."""
    if not conn.tls:
        return None
    roots = conn.ca_file.read_bytes() if conn.ca_file else None
    return grpc.ssl_channel_credentials(root_certificates=roots)


def channel(conn: Connection) -> grpc.Channel:
    """A channel to the connection's target sending its bearer token."""
    creds = credentials(conn)
    if creds is None:
        return client_auth.channel(conn.target, conn.token)
    plain = grpc.secure_channel(conn.target, creds)
    if not conn.token:
        return plain
    return grpc.intercept_channel(plain, client_auth.BearerAuth(conn.token))


@contextmanager
def connect(conn: Connection) -> Iterator[Client]:
    """An SDK client on the connection, closed on exit."""
    with Client(conn.target, token=conn.token, credentials=credentials(conn)) as client:
        yield client
