"""A second `vidroute up` where one runs refuses before it writes anything under ./var: the dev
tokens there are what the running stack's CLI users authenticate with (a refused `up` used to
replace them, so the running stack answered UNAUTHENTICATED), and no emulator or sidecar starts.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from controlplane.startup import EXIT_CONFIG, SqliteLock

pytestmark = [pytest.mark.timeout(120)]

TOKENS = ("dev-admin-token", "dev-tenant-token")


@pytest.fixture
def running_here(tmp_path: Path) -> Iterator[Path]:
    """A directory whose ./var holds a running stack's tokens and its database lock."""
    var = tmp_path / "var"
    var.mkdir()
    for name in TOKENS:
        (var / name).write_text(f"running-{name}\n", encoding="utf-8")
    lock = SqliteLock(var / "vidroute.db")
    lock.acquire()
    try:
        yield tmp_path
    finally:
        lock.drop()


def _up(workdir: Path, **env: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("VIDROUTE_")}
    clean.update({"VIDROUTE_LISTEN": "127.0.0.1:0", **env})
    return subprocess.run(
        [sys.executable, "-m", "clients.cli", "up", "--ephemeral-ports"],
        cwd=workdir,
        env=clean,
        capture_output=True,
        text=True,
        timeout=100,
        check=False,
    )


def _untouched(workdir: Path) -> None:
    for name in TOKENS:
        assert (workdir / "var" / name).read_text(encoding="utf-8") == f"running-{name}\n"
    assert not (workdir / "var" / "log").exists()  # no child was started


def test_a_held_database_refuses_before_the_tokens_are_replaced(running_here: Path) -> None:
    """The SQLite file another control plane holds: exit 78 with the one line naming it, the
    running stack's tokens as they were, no child started."""
    done = _up(running_here)
    assert done.returncode == EXIT_CONFIG, done.stderr
    assert "is in use by another control plane" in done.stderr
    assert "dev API tokens" not in done.stdout
    _untouched(running_here)


def test_a_busy_listen_port_refuses_before_the_tokens_are_replaced(tmp_path: Path) -> None:
    """The gRPC port something listens on: exit 78 naming the port, tokens untouched."""
    (tmp_path / "var").mkdir()
    for name in TOKENS:
        (tmp_path / "var" / name).write_text(f"running-{name}\n", encoding="utf-8")
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        done = _up(tmp_path, VIDROUTE_LISTEN=f"127.0.0.1:{port}")
    assert done.returncode == EXIT_CONFIG, done.stderr
    assert f"port {port} (127.0.0.1:{port}) is in use" in done.stderr
    _untouched(tmp_path)
