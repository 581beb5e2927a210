"""Shared fixtures: emulators started in-process, httpx clients, a webhook receiver."""

from __future__ import annotations

import asyncio
import ssl
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import httpx
import pytest

from adapter_sidecars.emulators.http import BodyReader, HttpServer, Request, Response
from adapter_sidecars.emulators.runway import RunwayConfig, RunwayEmulator

RUNWAY_HEADERS = {"Authorization": "Bearer key_test", "X-Runway-Version": "2024-11-06"}
# One SSL context for every test client: building one per client costs ~0.3 s.
TLS = ssl.create_default_context()
T2V_BODY = {
    "model": "gen4.5",
    "promptText": "a lighthouse at dusk",
    "ratio": "1280:720",
    "duration": 5,
}


def client(base_url: str, **kwargs: Any) -> httpx.AsyncClient:
    """An httpx client for an emulator, sharing the test SSL context."""
    return httpx.AsyncClient(
        base_url=base_url, verify=TLS, timeout=kwargs.pop("timeout", 5), **kwargs
    )


async def eventually(
    check: Callable[[], Awaitable[Any]] | Callable[[], Any], within: float = 10.0
) -> Any:
    """Poll `check` until it returns a truthy value, failing after `within` seconds."""
    deadline = time.monotonic() + within
    while True:
        result = check()
        if asyncio.iscoroutine(result):
            result = await result
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {within}s")
        await asyncio.sleep(0.02)


class Receiver:
    """A tiny webhook receiver recording every POST it gets."""

    def __init__(self) -> None:
        self.requests: list[Request] = []
        self._server = HttpServer(self._handle)

    @property
    def url(self) -> str:
        return self._server.url + "/hook"

    async def _handle(self, request: Request, read_body: BodyReader) -> Response:
        request.body = await read_body(None)
        self.requests.append(request)
        return Response.empty(204)

    async def __aenter__(self) -> Receiver:
        await self._server.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._server.stop()


@pytest.fixture
async def receiver() -> AsyncIterator[Receiver]:
    async with Receiver() as r:
        yield r


@pytest.fixture
def runway_config() -> RunwayConfig:
    return RunwayConfig()


@pytest.fixture
async def runway(runway_config: RunwayConfig) -> AsyncIterator[RunwayEmulator]:
    async with RunwayEmulator(runway_config) as emu:
        yield emu


@pytest.fixture
async def rw(runway: RunwayEmulator) -> AsyncIterator[httpx.AsyncClient]:
    async with client(runway.url, headers=RUNWAY_HEADERS) as c:
        yield c


async def poll_until(client: httpx.AsyncClient, path: str, key: str, values: set[Any]) -> Any:
    """GET `path` until `body[key]` is one of `values`; return the body."""

    async def check() -> Any:
        body = (await client.get(path)).json()
        return body if body.get(key) in values else None

    return await eventually(check)
