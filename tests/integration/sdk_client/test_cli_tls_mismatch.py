"""A person's mistake about TLS stays one line: `vidroute get --tls` against a plaintext server
prints the one "cannot reach" line, without grpc-core's own handshake log lines around it."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from concurrent import futures

import grpc
import pytest

pytestmark = [pytest.mark.timeout(60)]


@pytest.fixture
def plaintext_port() -> Iterator[int]:
    """A gRPC server without TLS (and without services: the handshake is what fails)."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=1))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield port
    finally:
        server.stop(None)


def test_tls_against_a_plaintext_server_is_one_line_exit_1(plaintext_port: int) -> None:
    """The handshake fails, and stderr holds exactly one line naming the target, exit code 1."""
    env = {k: v for k, v in os.environ.items() if k != "GRPC_VERBOSITY"}
    env["VIDROUTE_TOKEN"] = "t"
    target = f"127.0.0.1:{plaintext_port}"
    done = subprocess.run(
        [sys.executable, "-m", "clients.cli", "get", "1", "--tls", "--target", target],
        capture_output=True,
        text=True,
        env=env,
        timeout=50,
        check=False,
    )
    assert done.returncode == 1, done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith(f"error: cannot reach the control plane at {target} ("), lines
