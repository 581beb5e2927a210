"""Fail fast and say so (issue 13): a control plane that cannot do its job as configured refuses
to start with one line and exit status 78 (`controlplane.startup`), before it migrates, binds
or starts a worker.

In process the refusal is `StartupRefused`; as `vidroute serve` (a child process, as a user
runs it) it is one log line on stderr, no traceback.
"""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import grpc
import pytest

from controlplane.bootstrap import Settings, start_control_plane
from controlplane.server import ControlPlaneServer
from controlplane.startup import EXIT_CONFIG, EXIT_UNAVAILABLE, StartupRefused
from vidroute_core.wire.listen import SERVER_OPTIONS

ROOT = Path(__file__).resolve().parents[3]


def _sqlite(path: Path) -> str:
    return f"sqlite+aiosqlite:///{path}"


def _serve(workdir: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """`python -m clients.cli serve ARGS` in `workdir`, configured only by `env` (no inherited
    VIDROUTE_* variable), until it exits."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("VIDROUTE_")}
    clean.update(PYTHONPATH=str(ROOT), VIDROUTE_LOG_FORMAT="text", **env)
    return subprocess.run(
        [sys.executable, "-m", "clients.cli", "serve", *args],
        cwd=workdir,
        env=clean,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def _refusal(done: subprocess.CompletedProcess[str]) -> str:
    """The one refusal line of a child that refused to start."""
    assert done.returncode == EXIT_CONFIG, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    lines = [line for line in done.stderr.splitlines() if "refusing to start" in line]
    assert len(lines) == 1, done.stderr
    return lines[0]


@pytest.fixture
async def api_only(tmp_path: Path) -> AsyncIterator[Callable[..., object]]:
    """Starts in-process API-only control planes on SQLite files under `tmp_path`."""
    started: list[ControlPlaneServer] = []

    async def start(db: str = "a.db", listen: str = "127.0.0.1:0") -> ControlPlaneServer:
        server = await start_control_plane(
            Settings(database_url=_sqlite(tmp_path / db), listen=listen, api_only=True)
        )
        started.append(server)
        return server

    yield start
    for server in started:
        await server.stop(grace=0.5)


def test_serve_without_adapters_refuses_in_one_line_before_writing(tmp_path: Path) -> None:
    """`vidroute serve` with no VIDROUTE_ADAPTERS exits 78 with one line naming the variable
    and the two fixes, and creates no database."""
    line = _refusal(_serve(tmp_path, "--listen", "127.0.0.1:0"))
    assert "VIDROUTE_ADAPTERS" in line, line
    assert "VIDROUTE_API_ONLY=1" in line, line
    assert not (tmp_path / "var").exists()


async def test_a_database_that_does_not_answer_is_named_in_the_refusal() -> None:
    """A PostgreSQL URL nothing listens on: `StartupRefused` with exit status 69, naming the
    database (password hidden) and VIDROUTE_DATABASE_URL."""
    with socket.socket() as s:  # a port nothing listens on once closed
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"postgresql+asyncpg://vidroute:secret@127.0.0.1:{port}/vidroute"
    with pytest.raises(StartupRefused) as refused:
        await start_control_plane(Settings(database_url=url, listen="127.0.0.1:0", api_only=True))
    assert refused.value.code == EXIT_UNAVAILABLE
    reason = str(refused.value)
    assert f"the database postgresql+asyncpg://vidroute:***@127.0.0.1:{port}/vidroute" in reason
    assert "does not answer" in reason, reason
    assert "VIDROUTE_DATABASE_URL" in reason, reason
    assert "secret" not in reason


async def test_without_adapters_only_an_api_only_replica_starts(tmp_path: Path) -> None:
    """In process: no adapters is `StartupRefused` unless `api_only` is set, which serves."""
    url = _sqlite(tmp_path / "cp.db")
    with pytest.raises(StartupRefused, match="no adapters configured") as refused:
        await start_control_plane(Settings(database_url=url, listen="127.0.0.1:0"))
    assert refused.value.code == EXIT_CONFIG
    assert not (tmp_path / "cp.db").exists()
    server = await start_control_plane(
        Settings(database_url=url, listen="127.0.0.1:0", api_only=True)
    )
    try:
        assert server.port > 0
    finally:
        await server.stop(grace=0.5)


async def test_a_second_serve_on_a_busy_port_or_the_same_sqlite_file_refuses(
    tmp_path: Path, api_only: Callable[..., object]
) -> None:
    """With a control plane serving (SQLite a.db), `vidroute serve` on its port (another
    database) says the port is in use and how to fix it; on port 0 with a.db, that the SQLite
    file is held; both exit 78 in one line before writing anything."""
    first = await api_only()  # type: ignore[misc]  # the fixture returns an awaitable typed object
    port = first.port
    work = tmp_path / "second"
    work.mkdir()

    busy = await asyncio.to_thread(
        _serve,
        work,
        "--listen",
        f"127.0.0.1:{port}",
        VIDROUTE_API_ONLY="1",
        VIDROUTE_DATABASE_URL=_sqlite(work / "b.db"),
    )
    line = _refusal(busy)
    assert f"port {port} (127.0.0.1:{port}) is in use" in line, line
    assert "VIDROUTE_LISTEN" in line, line
    assert not (work / "b.db").exists()

    shared = await asyncio.to_thread(
        _serve,
        work,
        "--listen",
        "127.0.0.1:0",
        VIDROUTE_API_ONLY="1",
        VIDROUTE_DATABASE_URL=_sqlite(tmp_path / "a.db"),
    )
    line = _refusal(shared)
    assert f"{tmp_path / 'a.db'} is in use by another control plane (pid {os.getpid()}" in line


async def test_a_busy_callback_port_refuses_before_anything_starts(tmp_path: Path) -> None:
    """A scheduling control plane whose VIDROUTE_CALLBACK_LISTEN port is taken refuses in one
    line naming that variable, before it migrates (no database file)."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        with pytest.raises(StartupRefused, match="VIDROUTE_CALLBACK_LISTEN") as refused:
            await start_control_plane(
                Settings(
                    database_url=_sqlite(tmp_path / "cp.db"),
                    listen="127.0.0.1:0",
                    adapters={"runway": "127.0.0.1:1"},
                    callback_listen=f"127.0.0.1:{port}",
                )
            )
    assert f"port {port} (127.0.0.1:{port}) is in use" in str(refused.value)
    assert not (tmp_path / "cp.db").exists()


async def test_the_sqlite_lock_is_released_at_stop(
    tmp_path: Path, api_only: Callable[..., object]
) -> None:
    """A second in-process control plane on the same SQLite file is refused while the first
    runs, and starts once the first has stopped."""
    first = await api_only()  # type: ignore[misc]  # the fixture returns an awaitable typed object
    with pytest.raises(StartupRefused, match="in use by another control plane"):
        await api_only()  # type: ignore[misc]  # the fixture returns an awaitable typed object
    await first.stop(grace=0.5)
    second = await api_only()  # type: ignore[misc]  # the fixture returns an awaitable typed object
    assert second.port > 0


async def test_our_servers_socket_cannot_be_shared_through_so_reuseport() -> None:
    """A gRPC server built with SERVER_OPTIONS holds its port alone: a second server that asks
    for SO_REUSEPORT (gRPC's default) fails to bind it, instead of splitting its connections."""
    ours = grpc.aio.server(options=SERVER_OPTIONS)
    port = ours.add_insecure_port("127.0.0.1:0")
    await ours.start()
    try:
        intruder = grpc.aio.server()  # grpc.so_reuseport defaults to on
        with pytest.raises(RuntimeError, match="Failed to bind"):
            intruder.add_insecure_port(f"127.0.0.1:{port}")
    finally:
        await ours.stop(None)


@pytest.mark.parametrize("args", [(), ("--down",)], ids=["up", "down"])
def test_migrate_against_a_database_that_does_not_answer_is_one_line_exit_69(
    tmp_path: Path, args: tuple[str, ...]
) -> None:
    """`vidroute migrate` names the database it could not reach and the fix in one line, exit
    69 like `serve`, instead of a bare ConnectionRefusedError."""
    with socket.socket() as probe:  # a port nothing listens on once closed
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    url = f"postgresql+asyncpg://nobody@127.0.0.1:{port}/vidroute"
    clean = {k: v for k, v in os.environ.items() if not k.startswith("VIDROUTE_")}
    clean.update(PYTHONPATH=str(ROOT), VIDROUTE_DATABASE_URL=url)
    done = subprocess.run(
        [sys.executable, "-m", "clients.cli", "migrate", *args],
        cwd=tmp_path,
        env=clean,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == EXIT_UNAVAILABLE, done.stderr
    (line,) = done.stderr.splitlines()
    assert line.startswith(f"error: the database postgresql+asyncpg://nobody@127.0.0.1:{port}/")
    assert "does not answer" in line
    assert "VIDROUTE_DATABASE_URL" in line
