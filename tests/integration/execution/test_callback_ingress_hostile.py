"""The callback ingress under hostile input: every request gets a status, nothing raises.

An attacker reaches this port from the internet. Malformed requests (bad JSON, too deep, not
UTF-8, numbers out of range, oversize heads) are 400, oversize bodies 413, forged or replayed
signatures 401; half-sent requests (slowloris) are answered 408 and closed within the head or
body timeout (scaled down here); keep-alive carries two requests on one connection. Every test
also checks the log holds no traceback and no ERROR line.
"""

from __future__ import annotations

import asyncio
import fcntl
import hashlib
import hmac
import json
import logging
import socket
import struct
import termios
import time
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, replace
from urllib.parse import urlsplit

import pytest
import pytest_asyncio

from controlplane.execution.callback_server import MIN_LINGER_S, CallbackLimits, CallbackServer
from controlplane.execution.callbacks import CallbackReceiver, CallbackVerifier
from controlplane.persistence.errors import StoreUnavailable
from tests.integration.execution.exec_harness import Harness
from vidroute_core.adapter import JobSnapshot, JobState
from vidroute_core.timescale import scale_durations

SECRET = "hostile-secret"
# Production limits; only the body size is smaller, so oversize bodies are cheap to send. The
# tests about the timers themselves (keep-alive, slowloris) use TIMED: every duration times one
# factor, so their order stays (keep-alive < head < body). The others keep production timers:
# a 0.9 s head deadline from connect closed a connection before a starved test process (CI at
# load 20) had written its request, a reset that had nothing to do with what they prove.
PRODUCTION = replace(CallbackLimits(), max_body_bytes=64 * 1024)
TIMED = replace(scale_durations(CallbackLimits(), 0.09), max_body_bytes=64 * 1024)
SLOW_CONNECTIONS = 50  # the slowloris count


@dataclass
class Ingress:
    server: CallbackServer
    verifier: CallbackVerifier
    attempt_id: int
    now: int
    lite: Harness

    @property
    def address(self) -> tuple[str, int]:
        parts = urlsplit(self.server.url)
        assert parts.hostname is not None
        assert parts.port is not None
        return parts.hostname, parts.port

    def sign(self, body: bytes, t: int | None = None, secret: str = SECRET) -> bytes:
        stamp = self.now if t is None else t
        mac = hmac.new(secret.encode(), f"{stamp}.".encode() + body, hashlib.sha256).hexdigest()
        return f"t={stamp},v1={mac}".encode()

    def request(
        self,
        body: bytes,
        *,
        target: bytes | None = None,
        signature: bytes | None = None,
        extra: bytes = b"",
        method: bytes = b"POST",
    ) -> bytes:
        """One raw HTTP/1.1 request; signed with the right secret unless told otherwise."""
        path = target or f"/callbacks/runway?attempt={self.attempt_id}".encode()
        sig = self.sign(body) if signature is None else signature
        return (
            method + b" " + path + b" HTTP/1.1\r\nhost: cb\r\ncontent-type: application/json\r\n"
            b"x-vidroute-signature: "
            + sig
            + b"\r\n"
            + extra
            + b"content-length: %d\r\n\r\n" % len(body)
            + body
        )


@pytest_asyncio.fixture
async def ingress(
    lite: Harness, caplog: pytest.LogCaptureFixture, request: pytest.FixtureRequest
) -> AsyncIterator[Ingress]:
    caplog.set_level(logging.INFO)
    limits: CallbackLimits = getattr(request, "param", PRODUCTION)
    attempt = await lite.task_with_attempt()
    lite.fake.script_submit(lite.fake.accepted("job-cb"))
    lite.fake.set_job("job-cb", JobSnapshot(JobState.RUNNING, "PROCESSING", '{"s":"PROCESSING"}'))
    engine = lite.engine()
    await engine.submitter.run_once()
    verifier = CallbackVerifier({"runway": SECRET}, clock=lite.clock)
    server = CallbackServer(limits=limits)
    await server.start(CallbackReceiver(verifier, engine.deps, engine.normalizer))
    try:
        yield Ingress(server, verifier, attempt.id, int(lite.clock.now.timestamp()), lite)
    finally:
        await server.stop()
    noisy = [r for r in caplog.records if r.exc_info or r.levelno >= logging.ERROR]
    assert not noisy, [(r.name, r.getMessage()) for r in noisy]
    assert "Traceback" not in caplog.text


async def _read_response(reader: asyncio.StreamReader, timeout_s: float = 5.0) -> int:
    """The status of one response (its body read too), or 0 if the server closed first."""
    async with asyncio.timeout(timeout_s):
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except asyncio.IncompleteReadError:
            return 0
        lines = head.decode("latin-1").split("\r\n")
        length = 0
        for line in lines[1:]:
            name, _, value = line.partition(":")
            if name.strip().lower() == "content-length":
                length = int(value)
        await reader.readexactly(length)
        return int(lines[0].split()[1])


async def _exchange(
    ingress: Ingress, data: bytes, *, then_closed: bool = False
) -> tuple[int, bool]:
    """Send `data`, read one response: (status, whether the server then closed, if asked)."""
    reader, writer = await asyncio.open_connection(*ingress.address)
    try:
        writer.write(data)
        await writer.drain()
        status = await _read_response(reader)
        if not then_closed:
            return status, False
        try:
            async with asyncio.timeout(
                ingress.server.limits.keep_alive_s * 0.8
            ):  # before idling out
                return status, await reader.read(1) == b""
        except TimeoutError:
            return status, False
        except ConnectionResetError:  # closed with our unread bytes in its buffer
            return status, True
    finally:
        writer.close()


def _signed_cases(ingress: Ingress) -> dict[str, bytes]:
    deep = b"[" * 20_000 + b"]" * 20_000  # past the C parser's recursion limit
    nested = b'{"id": "job-cb", "x": ' + b"[" * 40 + b"1" + b"]" * 40 + b"}"  # parses, too deep
    huge_int = b'{"id": "job-cb", "n": ' + b"9" * 5000 + b"}"
    cases = {
        "bad json": ingress.request(b'{"id": '),
        "json too deep for the parser": ingress.request(deep),
        "json deeper than allowed": ingress.request(nested),
        "body not utf-8": ingress.request(b'{"id": "\xff\xfe"}'),
        "integer past the digit limit": ingress.request(huge_int),
        "no job id": ingress.request(b'{"status": "done"}'),
        "job id with NUL": ingress.request(b'{"id": "job\\u0000cb"}'),
        "job id too long": ingress.request(json.dumps({"id": "j" * 10_000}).encode()),
    }
    for name, hint in {
        "attempt superscript digit": "%C2%B2",
        "attempt past int64": "9" * 30,
        "attempt zero": "0",
        "attempt negative": "-1",
        "attempt bad percent-escape": "%ff",
    }.items():
        body = b'{"id": "job-unknown"}'
        cases[name] = ingress.request(body, target=f"/callbacks/runway?attempt={hint}".encode())
    cases["too many query fields"] = ingress.request(
        b'{"id": "job-cb"}',
        target=b"/callbacks/runway?" + b"&".join(b"a%d=1" % i for i in range(50)),
    )
    cases["signature header not ascii"] = ingress.request(
        b'{"id": "job-cb"}', signature=b"t=\xff\xfe"
    )
    return cases


async def test_malformed_requests_are_400(ingress: Ingress) -> None:
    """Bad JSON, too deep, not UTF-8, out-of-range numbers and ids: 400, and the connection
    stays usable (keep-alive), never dropped without an answer.
    """
    cases = _signed_cases(ingress)
    cases |= {
        "path not ascii": b"POST /callbacks/\xff\xfe HTTP/1.1\r\nhost: cb\r\n"
        b"content-length: 0\r\n\r\n",
        "content-length not a number": b"POST /callbacks/runway HTTP/1.1\r\nhost: cb\r\n"
        b"content-length: ten\r\n\r\n",
        "head too large": ingress.request(b"{}", extra=b"x-pad: " + b"a" * 40_000 + b"\r\n"),
        "not http (a TLS hello)": b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03"
        + bytes(range(200))
        + b"\r\n\r\n",
    }
    statuses = {name: (await _exchange(ingress, data))[0] for name, data in cases.items()}
    assert statuses == dict.fromkeys(cases, 400)


async def test_routes_methods_and_unrelated_hostile_headers(ingress: Ingress) -> None:
    """Unknown routes are 404, other methods 405; a non-UTF-8 header we do not read is no
    reason to refuse a valid callback.
    """
    body = b'{"id": "job-cb"}'
    assert (await _exchange(ingress, ingress.request(body, target=b"/nope")))[0] == 404
    assert (await _exchange(ingress, ingress.request(body, target=b"/callbacks/a/b")))[0] == 404
    assert (await _exchange(ingress, ingress.request(body, method=b"GET")))[0] == 405
    odd = ingress.request(body, extra=b"x-odd: \xff\xfe\x80\r\n")
    assert (await _exchange(ingress, odd))[0] == 204


async def test_oversize_bodies_are_413_and_closed(ingress: Ingress) -> None:
    """A declared or streamed body past the limit is 413, and the connection is closed."""
    head = b"POST /callbacks/runway HTTP/1.1\r\nhost: cb\r\n"
    declared = head + b"content-length: 10000000\r\n\r\n" + b"{" * 100
    assert await _exchange(ingress, declared, then_closed=True) == (413, True)
    absurd = head + b"content-length: " + b"9" * 5000 + b"\r\n\r\n"
    status, _ = await _exchange(ingress, absurd)
    assert status in (400, 413)
    chunk = b"f000\r\n" + b"a" * 0xF000 + b"\r\n"
    streamed = head + b"transfer-encoding: chunked\r\n\r\n" + chunk * 3
    assert await _exchange(ingress, streamed, then_closed=True) == (413, True)


async def test_forged_signatures_are_401(ingress: Ingress) -> None:
    """A wrong secret, a missing or garbled header, a huge timestamp, an unknown provider: 401."""
    body = b'{"id": "job-cb"}'
    forged = {
        "wrong secret": ingress.request(body, signature=ingress.sign(body, secret="guess")),
        "missing": ingress.request(body, signature=b""),
        "garbled": ingress.request(body, signature=b"t=,v1=,,,==="),
        "huge timestamp": ingress.request(body, signature=b"t=" + b"9" * 5000 + b",v1=00"),
        "far future": ingress.request(body, signature=ingress.sign(body, t=999_999_999_999)),
        "mac not hex": ingress.request(body, signature=b"t=%d,v1=%s" % (ingress.now, b"z" * 64)),
        "other body": ingress.request(b'{"id": "job-cb", "x": 1}', signature=ingress.sign(body)),
        "unknown provider": ingress.request(body, target=b"/callbacks/veo"),
    }
    statuses = {name: (await _exchange(ingress, data))[0] for name, data in forged.items()}
    assert statuses == dict.fromkeys(forged, 401)
    assert ingress.verifier.accepted == 0


async def test_replays_are_refused_or_deduplicated(ingress: Ingress) -> None:
    """A signature older than the replay window is 401; a replay inside it is answered but
    yields no second event.
    """
    body = json.dumps({"id": "job-cb", "status": "PROCESSING"}).encode()
    old = ingress.request(body, signature=ingress.sign(body, t=ingress.now - 3600))
    assert (await _exchange(ingress, old))[0] == 401
    fresh = ingress.request(body)
    assert [(await _exchange(ingress, fresh))[0] for _ in range(3)] == [204, 204, 204]
    events = await ingress.lite.reads.events(attempt_id=ingress.attempt_id)
    assert len(events) == 1
    assert (ingress.verifier.stale, ingress.verifier.accepted) == (1, 3)


@pytest.mark.parametrize("ingress", [TIMED], indirect=True, ids=["timed"])
async def test_keep_alive_carries_two_requests_then_idles_out(ingress: Ingress) -> None:
    """Two requests on one connection both get answers; an idle connection is then closed."""
    body = json.dumps({"id": "job-cb"}).encode()
    reader, writer = await asyncio.open_connection(*ingress.address)
    try:
        writer.write(ingress.request(body))
        assert await _read_response(reader) == 204
        writer.write(ingress.request(b'{"id": '))
        assert await _read_response(reader) == 400
        started = time.monotonic()
        async with asyncio.timeout(5.0):
            assert await reader.read(1) == b""
        assert time.monotonic() - started < TIMED.head_timeout_s  # keep-alive, not head, timer
    finally:
        writer.close()


@pytest.mark.parametrize("ingress", [TIMED], indirect=True, ids=["timed"])
async def test_slowloris_heads_and_bodies_are_cut_off(ingress: Ingress) -> None:
    """Half-sent heads, half-sent bodies and a head sent a byte at a time get a 408 and a
    close within their timeouts.
    """
    conns = [await asyncio.open_connection(*ingress.address) for _ in range(SLOW_CONNECTIONS)]
    started = time.monotonic()
    for i, (_, writer) in enumerate(conns):
        if i % 2:  # half a head
            writer.write(b"POST /callbacks/runway HTTP/1.1\r\nhost: cb\r\nx-slow: ")
        else:  # a full head, a tenth of the body
            writer.write(ingress.request(b'{"id": "job-cb"}' + b" " * 90)[:-90])
    trickle_reader, trickle_writer = await asyncio.open_connection(*ingress.address)
    trickling = asyncio.create_task(
        _trickle(trickle_writer, b"POST /callbacks/runway HTTP/1.1\r\n")
    )
    try:
        results = await asyncio.gather(
            *(_until_closed(reader) for reader, _ in [*conns, (trickle_reader, trickle_writer)])
        )
    finally:
        trickling.cancel()
        for _, writer in [*conns, (trickle_reader, trickle_writer)]:
            writer.close()
    took = time.monotonic() - started
    assert results == [408] * (SLOW_CONNECTIONS + 1)
    assert took < max(TIMED.head_timeout_s, TIMED.body_timeout_s) + 2.0, took


@pytest.mark.parametrize("ingress", [TIMED], indirect=True, ids=["timed"])
async def test_a_client_still_sending_reads_its_408_not_a_reset(ingress: Ingress) -> None:
    """A slowloris that keeps sending after its 408 reads the 408 and a clean end of stream: the
    server drains the late bytes instead of answering them with a reset.

    Deterministic: the late bytes are sent once the server's FIN is in (the 408 precedes it),
    and the next byte only once those were acknowledged or reset; without the lingering close
    the reset is in by then, and asyncio's stream reports the lost connection in place of the
    408 it had buffered (what the slowloris test saw once at load 20).
    """
    reader, writer = await asyncio.open_connection(*ingress.address)
    sock = writer.get_extra_info("socket")
    try:
        writer.write(b"POST /callbacks/runway HTTP/1.1\r\nhost: cb\r\nx-slow: ")
        await _until(lambda: _tcp_state(sock) == TCP_CLOSE_WAIT, TIMED.head_timeout_s + 10.0)
        writer.write(b"still sending" * 100)
        await writer.drain()
        await _until(lambda: _tcp_state(sock) == TCP_CLOSE or _unacknowledged(sock) == 0, 10.0)
        writer.write(b"and more")
        await writer.drain()
        assert await _read_response(reader) == 408
        async with asyncio.timeout(5.0):
            assert await reader.read(1) == b""
    finally:
        writer.close()


@pytest.mark.parametrize("ingress", [TIMED], indirect=True, ids=["timed"])
async def test_a_client_that_never_stops_sending_is_cut_off_after_the_linger(
    ingress: Ingress,
) -> None:
    """The lingering after a 408 is bounded: a client that keeps sending is disconnected once
    the linger is over (at the latest the head timeout plus the linger, with room for load)."""
    reader, writer = await asyncio.open_connection(*ingress.address)
    sock = writer.get_extra_info("socket")
    trickling = asyncio.create_task(_trickle(writer, b"POST /callbacks/runway HTTP/1.1\r\n" * 20))
    try:
        assert await _read_response(reader, TIMED.head_timeout_s + 10.0) == 408
        bound = max(TIMED.linger_s, MIN_LINGER_S) + 10.0
        await _until(lambda: _tcp_state(sock) == TCP_CLOSE or trickling.done(), bound)
        assert _tcp_state(sock) == TCP_CLOSE, "still connected after the trickle ended"
    finally:
        trickling.cancel()
        await asyncio.gather(trickling, return_exceptions=True)  # its write after the reset
        writer.close()


TCP_CLOSE, TCP_CLOSE_WAIT = 7, 8  # linux/tcp_states.h


def _tcp_state(sock: socket.socket) -> int:
    """The kernel's TCP state of our end of the connection (``tcpi_state``, Linux)."""
    return sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 8)[0]


def _unacknowledged(sock: socket.socket) -> int:
    """Bytes we sent that the peer's kernel has not acknowledged yet (SIOCOUTQ, Linux)."""
    queued: int = struct.unpack("i", fcntl.ioctl(sock.fileno(), termios.TIOCOUTQ, b"\0" * 4))[0]
    return queued


async def _until(condition: Callable[[], bool], timeout_s: float) -> None:
    """Poll `condition` until it holds; TimeoutError after `timeout_s`."""
    async with asyncio.timeout(timeout_s):
        while not condition():  # noqa: ASYNC110 - the kernel's TCP state has no event to await
            await asyncio.sleep(0.01)


async def _trickle(writer: asyncio.StreamWriter, head: bytes) -> None:
    """A byte every 50 ms: data keeps coming, the head never completes in time."""
    for i in range(len(head)):
        writer.write(head[i : i + 1])
        await writer.drain()
        await asyncio.sleep(0.05)


async def _until_closed(reader: asyncio.StreamReader) -> int:
    status = await _read_response(reader)
    async with asyncio.timeout(3.0):
        assert await reader.read(1) == b""
    return status


class _DatabaseAway(CallbackReceiver):
    """A receiver whose store is down: what `handle` raises when PostgreSQL is unreachable."""

    async def handle(
        self, provider: str, signature: str | None, body: bytes, query: Mapping[str, str]
    ) -> int:
        raise StoreUnavailable("connection refused")


async def test_a_database_outage_is_503_without_a_traceback(
    ingress: Ingress, caplog: pytest.LogCaptureFixture
) -> None:
    """With the database away a callback is answered 503 (the provider retries), never 500."""
    engine = ingress.lite.engine()
    away = CallbackServer(limits=ingress.server.limits)
    await away.start(_DatabaseAway(ingress.verifier, engine.deps, engine.normalizer))
    try:
        host, port = urlsplit(away.url).hostname, urlsplit(away.url).port
        assert host is not None
        assert port is not None
        reader, writer = await asyncio.open_connection(host, port)
        try:
            body = json.dumps({"id": "job-cb", "status": "PROCESSING"}).encode()
            writer.write(ingress.request(body))
            await writer.drain()
            assert await _read_response(reader) == 503
        finally:
            writer.close()
    finally:
        await away.stop()
    assert any("answering 503" in r.getMessage() for r in caplog.records)
