"""The composition root serves the console on VIDROUTE_CONSOLE_LISTEN: a busy port refuses the
start in one line naming the variable; a started control plane answers the console's pages and
its vendored htmx over HTTP, and stops listening at stop."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from pathlib import Path

import grpc
import httpx
import pytest

from controlplane.api.auth import hash_token, new_token
from controlplane.bootstrap import Settings, start_control_plane
from controlplane.startup import EXIT_CONFIG, StartupRefused
from tests.support.stack import free_port, spec_for
from vidroute.scheduler.v1 import scheduler_service_pb2 as api
from vidroute.scheduler.v1 import scheduler_service_pb2_grpc

pytestmark = pytest.mark.timeout(60)


def _sqlite(path: Path) -> str:
    return f"sqlite+aiosqlite:///{path}"


def test_the_console_listen_address_comes_from_the_environment() -> None:
    """VIDROUTE_CONSOLE_LISTEN sets it; unset, there is no console."""
    assert Settings.from_env({}).console_listen == ""
    env = {"VIDROUTE_CONSOLE_LISTEN": "127.0.0.1:8088"}
    assert Settings.from_env(env).console_listen == "127.0.0.1:8088"


async def test_a_busy_console_port_refuses_before_anything_starts(tmp_path: Path) -> None:
    """A taken console port is one refusal line naming VIDROUTE_CONSOLE_LISTEN (exit status 78),
    before the database is migrated."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        with pytest.raises(StartupRefused, match="VIDROUTE_CONSOLE_LISTEN") as refused:
            await start_control_plane(
                Settings(
                    database_url=_sqlite(tmp_path / "cp.db"),
                    listen="127.0.0.1:0",
                    api_only=True,
                    console_listen=f"127.0.0.1:{port}",
                )
            )
    assert refused.value.code == EXIT_CONFIG
    assert f"127.0.0.1:{port}" in str(refused.value)
    assert not (tmp_path / "cp.db").exists()


async def test_a_started_control_plane_serves_the_console_until_it_stops(tmp_path: Path) -> None:
    """The sign-in page and the vendored htmx answer on the console port (authentication on, so
    a page without a token redirects to the sign-in); after stop the port is closed."""
    port = free_port()
    digest = "0" * 64  # any configured token switches authentication on
    running = await start_control_plane(
        Settings.from_env(
            {
                "VIDROUTE_DATABASE_URL": _sqlite(tmp_path / "cp.db"),
                "VIDROUTE_API_ONLY": "1",
                "VIDROUTE_LISTEN": "127.0.0.1:0",
                "VIDROUTE_CONSOLE_LISTEN": f"127.0.0.1:{port}",
                "VIDROUTE_AUTH_TOKENS": f"{digest}=admin",
            }
        )
    )
    base = f"http://127.0.0.1:{port}"
    try:
        async with httpx.AsyncClient(base_url=base, timeout=5) as http:
            tasks = await http.get("/tasks")
            assert tasks.status_code == 303
            assert tasks.headers["location"].startswith("/login")
            login = await http.get("/login")
            assert login.status_code == 200
            assert 'name="token"' in login.text
            script = await http.get("/static/htmx.min.js")
            assert script.status_code == 200
            assert script.text.startswith("/*! htmx.org ")
            # Pages: a strict CSP, no framing, never cached; static files may be cached.
            assert "script-src 'self'" in login.headers["content-security-policy"]
            assert login.headers["x-frame-options"] == "DENY"
            assert login.headers["cache-control"] == "no-store"
            assert "no-store" not in script.headers.get("cache-control", "")
    finally:
        await running.stop(grace=1)
    async with httpx.AsyncClient(base_url=base, timeout=2) as http:
        with pytest.raises(httpx.ConnectError):
            await http.get("/login")


async def test_stop_ends_an_open_task_event_stream(tmp_path: Path) -> None:
    """A browser following a queued task's events (a stream that would never end) does not hold
    the control plane's stop past the console's grace period."""
    port, token = free_port(), new_token()
    running = await start_control_plane(
        Settings.from_env(
            {
                "VIDROUTE_DATABASE_URL": _sqlite(tmp_path / "cp.db"),
                "VIDROUTE_API_ONLY": "1",
                "VIDROUTE_LISTEN": "127.0.0.1:0",
                "VIDROUTE_CONSOLE_LISTEN": f"127.0.0.1:{port}",
                "VIDROUTE_AUTH_TOKENS": f"{hash_token(token)}=admin",
                "VIDROUTE_TIME_SCALE": "0.2",
            }
        )
    )
    stream: asyncio.Task[list[str]] | None = None
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{running.port}") as channel:
            stub = scheduler_service_pb2_grpc.SchedulerServiceStub(channel)
            created = await stub.CreateTask(
                api.CreateTaskRequest(spec=spec_for("runway"), idempotency_key="k-sse"),
                metadata=(("authorization", f"Bearer {token}"),),
            )
        url = f"http://127.0.0.1:{port}/tasks/{created.task.task_id}/events"
        opened = asyncio.Event()

        async def follow() -> list[str]:
            lines: list[str] = []
            headers = {"authorization": f"Bearer {token}"}
            async with (
                httpx.AsyncClient(timeout=30) as http,
                http.stream("GET", url, headers=headers) as response,
            ):
                assert response.status_code == 200
                async for line in response.aiter_lines():
                    lines.append(line)
                    opened.set()
            return lines

        stream = asyncio.create_task(follow())
        await asyncio.wait_for(opened.wait(), 10)  # the queued event arrived: it is streaming
    finally:
        started = time.monotonic()
        await running.stop(grace=1)
        took = time.monotonic() - started
    assert stream is not None
    with contextlib.suppress(httpx.HTTPError):
        await asyncio.wait_for(stream, 5)  # the server closed it (or cut it off)
    assert stream.done()
    assert took < 8, took
