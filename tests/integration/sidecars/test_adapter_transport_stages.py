"""Submit-stage classification (design 9.17.3) against real sockets: emulator fault actions for
every adapter, and a raw server that misbehaves at exact points of the exchange."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import httpx
import pytest
from adapter_support import make_spec, sidecar_config

from adapter_sidecars.common import transport
from adapter_sidecars.common.config import Account
from adapter_sidecars.common.types import CompileInput, ProviderAdapter, SubmitInput
from adapter_sidecars.emulators import SelfHostedEmulator
from adapter_sidecars.runway.adapter import RunwayAdapter
from adapter_sidecars.selfhosted.adapter import SelfHostedAdapter
from vidroute_core.adapter import SubmitKind, SubmitOutcome, TransportStage
from vidroute_core.errors import ErrorClass

MODELS = {"runway": "gen4.5", "veo": "veo-3.1-generate-preview", "selfhosted": "wan2.2-t2v"}
ROUTES = {
    "runway": "POST /v1/text_to_video",
    "veo": "POST /v1beta/models/*:predictLongRunning",
    "selfhosted": "POST /v1/jobs",
}
ADAPTERS = list(MODELS)
# (name, adapter, emulator): the three adapters and emulators share no typed base.
Provider = tuple[str, Any, Any]


@pytest.fixture(params=ADAPTERS)
def provider(request: pytest.FixtureRequest) -> Provider:
    """(name, adapter, emulator) for each provider."""
    name = request.param
    adapter = request.getfixturevalue(f"{name}_adapter")
    emulator = request.getfixturevalue(f"{name}_emulator")
    return name, adapter, emulator


async def _submit(name: str, adapter: ProviderAdapter, key: str = "attempt-1") -> SubmitOutcome:
    duration = 8000 if name == "veo" else 5000
    plan = adapter.compile(CompileInput(make_spec(duration_ms=duration), MODELS[name]))
    assert plan.submittable, plan.transformations
    return await adapter.submit(SubmitInput(plan, key))


async def _with_fault(
    provider: Provider, action: str, **params: object
) -> tuple[SubmitOutcome, Any]:
    name, adapter, emulator = provider
    emulator.add_faults({"route": ROUTES[name], "action": action, **params})
    return await _submit(name, adapter), emulator


def _assert_unknown(outcome: SubmitOutcome, stage: TransportStage) -> None:
    assert outcome.kind is SubmitKind.UNKNOWN, outcome
    assert outcome.transport_stage is stage, outcome
    assert outcome.error is not None
    assert outcome.error.error_class is ErrorClass.SUBMISSION_UNKNOWN
    assert outcome.error.provider_may_have_accepted
    assert not outcome.error.retryable
    assert not outcome.error.failoverable
    assert outcome.request_started_at is not None


async def test_accepted_when_all_goes_well(provider: Provider) -> None:
    """A clean exchange is ACCEPTED with the provider's job id and exactly one job created."""
    name, adapter, emulator = provider
    outcome = await _submit(name, adapter)
    assert outcome.kind is SubmitKind.ACCEPTED
    assert outcome.job is not None
    assert [j["id"] for j in emulator.truth()] == [outcome.job.provider_job_id]


async def test_partial_body_drop_is_unknown(provider: Provider) -> None:
    """A connection dropped while the body is being read is UNKNOWN (请求体部分写入后断开)."""
    outcome, emulator = await _with_fault(provider, "drop_after_partial_body")
    assert outcome.kind is SubmitKind.UNKNOWN
    assert outcome.transport_stage in (TransportStage.SEND_REQUEST, TransportStage.AWAIT_RESPONSE)
    assert emulator.truth() == []


async def test_drop_after_body_is_unknown_and_the_job_exists(provider: Provider) -> None:
    """Body written, job created, connection reset before the answer: UNKNOWN, one job."""
    outcome, emulator = await _with_fault(provider, "drop_after_body")
    _assert_unknown(outcome, TransportStage.AWAIT_RESPONSE)
    assert len(emulator.truth()) == 1


async def test_stall_past_the_submit_read_timeout_is_unknown(provider: Provider) -> None:
    """No response within the submit read timeout: UNKNOWN at AWAIT_RESPONSE."""
    outcome, emulator = await _with_fault(provider, "stall_response", seconds=3)
    _assert_unknown(outcome, TransportStage.AWAIT_RESPONSE)
    assert len(emulator.truth()) == 1


@pytest.mark.parametrize("action", ["corrupt_json", "missing_id"])
async def test_unusable_2xx_body_is_unknown_at_read_response(
    provider: Provider, action: str
) -> None:
    """A 2xx with a corrupt body or without an id is UNKNOWN at READ_RESPONSE."""
    outcome, emulator = await _with_fault(provider, action)
    _assert_unknown(outcome, TransportStage.READ_RESPONSE)
    assert outcome.error is not None
    assert outcome.error.raw_status_code is not None
    assert 200 <= outcome.error.raw_status_code < 300
    assert len(emulator.truth()) == 1


async def test_refused_connection_is_rejected_at_connect(provider: Provider) -> None:
    """ECONNREFUSED before any byte is REJECTED (TRANSIENT_NETWORK, CONNECT)."""
    name, adapter, emulator = provider
    if name == "selfhosted":
        pytest.skip("self-hosted retries a not-sent submit once; covered separately")
    emulator.add_faults({"action": "refuse_connection", "duration_ms": 1500})
    await asyncio.sleep(0.1)
    outcome = await _submit(name, adapter)
    assert outcome.kind is SubmitKind.REJECTED, outcome
    assert outcome.transport_stage is TransportStage.CONNECT
    assert outcome.error is not None
    assert outcome.error.error_class is ErrorClass.TRANSIENT_NETWORK
    assert outcome.error.retryable


async def test_429_is_rejected_with_retry_after(provider: Provider) -> None:
    """An explicit 429 is REJECTED as RATE_LIMITED or QUOTA and keeps Retry-After."""
    outcome, emulator = await _with_fault(provider, "status", code=429, retry_after=7)
    assert outcome.kind is SubmitKind.REJECTED
    assert outcome.transport_stage is TransportStage.NONE
    assert outcome.error is not None
    assert outcome.error.error_class in (ErrorClass.RATE_LIMITED, ErrorClass.QUOTA)
    assert outcome.error.retry_after_ms == 7000
    assert outcome.error.raw_status_code == 429
    assert emulator.truth() == []


async def test_503_is_rejected_as_overloaded(provider: Provider) -> None:
    """503 is documented as not-created by every provider here: REJECTED, retryable."""
    outcome, _ = await _with_fault(provider, "status", code=503)
    assert outcome.kind is SubmitKind.REJECTED
    assert outcome.error is not None
    assert outcome.error.error_class is ErrorClass.PROVIDER_OVERLOADED
    assert outcome.error.retryable


async def test_500_on_create_is_unknown(provider: Provider) -> None:
    """A 500 is not documented as not-created: UNKNOWN, recover before anything else."""
    outcome, _ = await _with_fault(provider, "status", code=500)
    assert outcome.kind is SubmitKind.UNKNOWN
    assert outcome.transport_stage is TransportStage.NONE
    assert outcome.error is not None
    assert outcome.error.raw_status_code == 500


async def test_dns_failure_is_rejected_at_dns() -> None:
    """An unresolvable host is REJECTED at DNS: nothing can have been sent."""
    adapter = RunwayAdapter.from_config(
        sidecar_config("http://nonexistent.invalid", "RUNWAY_API_KEY")
    )
    try:
        outcome = await _submit("runway", adapter)
    finally:
        await adapter.aclose()
    assert outcome.kind is SubmitKind.REJECTED
    assert outcome.transport_stage is TransportStage.DNS
    assert outcome.error is not None
    assert outcome.error.error_class is ErrorClass.TRANSIENT_NETWORK


async def test_selfhosted_retries_a_refused_submit_once_with_the_same_key(
    selfhosted_adapter: SelfHostedAdapter, selfhosted_emulator: SelfHostedEmulator
) -> None:
    """A not-sent self-hosted submit is retried once with the same Idempotency-Key."""
    selfhosted_emulator.add_faults({"action": "refuse_connection", "duration_ms": 300})
    await asyncio.sleep(0.05)
    original = selfhosted_adapter.send_create
    calls = []

    async def counting(request: SubmitInput, account: Account) -> SubmitOutcome:
        calls.append(request.client_request_key)
        if len(calls) == 2:
            await asyncio.sleep(0.5)  # let the refusal window pass before the retry
        return await original(request, account)

    selfhosted_adapter.send_create = counting  # type: ignore[method-assign]  # spy on the retry
    outcome = await _submit("selfhosted", selfhosted_adapter, key="same-key")
    assert calls == ["same-key", "same-key"]
    assert outcome.kind is SubmitKind.ACCEPTED
    assert [j["idempotency_key"] for j in selfhosted_emulator.truth()] == ["same-key"]


# -- a raw server that misbehaves at exact points ---------------------------------------------

Behaviour = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]
RawServer = Callable[[Behaviour], Awaitable[str]]


@pytest.fixture
async def raw_server() -> AsyncIterator[Callable[[Behaviour], Awaitable[str]]]:
    """Start a TCP server running a behaviour per connection; returns its base URL.

    At teardown the connections still open are aborted and their behaviours cancelled, so no
    socket outlives the test (a leaked one surfaces as an error in whichever test runs next)."""
    servers: list[asyncio.Server] = []
    open_connections: list[tuple[asyncio.Task[None], asyncio.StreamWriter]] = []

    async def start(behaviour: Behaviour) -> str:
        async def tracked(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            task = asyncio.current_task()
            assert task is not None
            open_connections.append((task, writer))
            # Cancelled only at teardown; re-raising would make asyncio log it as unhandled.
            with contextlib.suppress(asyncio.CancelledError):
                await behaviour(reader, writer)

        server = await asyncio.start_server(tracked, "127.0.0.1", 0)
        servers.append(server)
        return f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"

    yield start
    for server in servers:
        server.close()
    for task, writer in open_connections:
        task.cancel()
        writer.transport.abort()
    await asyncio.gather(*(task for task, _ in open_connections), return_exceptions=True)


def _reset(writer: asyncio.StreamWriter) -> None:
    sock = writer.get_extra_info("socket")
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
    writer.transport.abort()


async def _classify(
    url: str, body: bytes = b"{}", read: float = 0.5
) -> SubmitOutcome | transport.HttpReply:
    timeout = httpx.Timeout(connect=0.5, read=read, write=0.5, pool=0.5)
    async with httpx.AsyncClient(timeout=timeout) as client:
        request = client.build_request("POST", url + "/create", content=body)
        return await transport.send_submit(client, request)


async def test_reset_while_the_request_body_is_being_written_is_unknown(
    raw_server: RawServer,
) -> None:
    """The peer resets after a few bytes of a large body: UNKNOWN (SEND_REQUEST or later)."""

    async def behaviour(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read(100)
        _reset(writer)

    url = await raw_server(behaviour)
    outcome = await _classify(url, body=b"x" * 8_000_000)
    assert isinstance(outcome, SubmitOutcome)
    assert outcome.kind is SubmitKind.UNKNOWN
    assert outcome.transport_stage in (TransportStage.SEND_REQUEST, TransportStage.AWAIT_RESPONSE)


async def test_close_after_status_line_is_unknown_at_read_response(
    raw_server: RawServer,
) -> None:
    """Headers arrive, then the body is cut short: UNKNOWN at READ_RESPONSE."""

    async def behaviour(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n{}")
        writer.write(b'HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n{"id":')
        await writer.drain()
        writer.close()

    url = await raw_server(behaviour)
    outcome = await _classify(url)
    assert isinstance(outcome, SubmitOutcome)
    assert outcome.kind is SubmitKind.UNKNOWN
    assert outcome.transport_stage is TransportStage.READ_RESPONSE


async def test_silence_after_the_body_is_unknown_at_await_response(
    raw_server: RawServer,
) -> None:
    """The whole request is read and nothing comes back before the read timeout."""

    async def behaviour(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n{}")
        await asyncio.sleep(2)
        writer.close()

    url = await raw_server(behaviour)
    outcome = await _classify(url, read=0.3)
    assert isinstance(outcome, SubmitOutcome)
    assert outcome.kind is SubmitKind.UNKNOWN
    assert outcome.transport_stage is TransportStage.AWAIT_RESPONSE
