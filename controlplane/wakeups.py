"""Wake-ups: the outbox relay's fast path (design 9.12.4 "唤醒和异步传递", 9.20).

Every outbox row is written in the transaction of the state it announces; once that transaction
commits, the `after_commit` its `Database` was built with hands this bus the topics it wrote,
and the bus wakes the consumers of those topics (the dispatcher for ``task.queued`` /
``task.requeue``, the execution workers for theirs) in this replica at once and, over the
broker, in every other replica. A wake-up only shortens a consumer's sleep: each consumer still
polls its table every poll interval, and that poll is what is relied on. So a wake-up carries no
data, a lost one (broker down, process killed between commit and publish) costs at most one poll
interval, and a duplicate costs one extra cheap read.

`LocalWakeBus` is the embedded default (one process: SQLite, `make up`). On PostgreSQL without a
broker, `PgNotifyWakeBus` carries the same wake-ups between replicas with ``pg_notify`` on the
channel ``vidroute_wake`` (one dedicated LISTEN connection per replica). `NatsWakeBus` adds a
NATS broker (``VIDROUTE_BROKER_URL=nats://host:4222``): plain NATS subjects
``{prefix}.{topic}``, fanned out to every subscribed replica, because every replica's leader
of a shard must hear a wake-up and a wake-up stored past one poll interval is worthless (a
JetStream stream would persist and replay exactly what polling already covers). Publishes are
coalesced: however many transactions commit meanwhile, one message per topic per flush, and
at most one flush per `min_interval_s` (20 ms).

The bus never raises into a writer: a commit has happened, and a broker outage must not turn
it into an error. While the broker is away the bus keeps waking this replica and reconnects in
the background; the other replicas fall back to their poll.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from collections.abc import Callable, Iterable
from typing import Any, Protocol

__all__ = ["LocalWakeBus", "NatsWakeBus", "PgNotifyWakeBus", "WakeBus", "wake_bus_for"]

log = logging.getLogger(__name__)

Callback = Callable[[], None]


class WakeBus(Protocol):
    """Wake-ups by outbox topic."""

    def subscribe(self, topic: str, callback: Callback) -> None:
        """Call `callback` (cheap, synchronous: e.g. ``Dispatcher.wake``) on each wake-up."""
        ...

    def notify(self, topics: Iterable[str]) -> None:
        """Rows of `topics` were committed: wake their consumers here and elsewhere."""
        ...

    async def start(self) -> None: ...

    async def close(self) -> None: ...


class LocalWakeBus:
    """Wake-ups inside one process (the embedded default)."""

    def __init__(self) -> None:
        self._subscribers: dict[str, list[Callback]] = {}
        self.delivered = 0  # callbacks called (local and remote), for tests and metrics

    def subscribe(self, topic: str, callback: Callback) -> None:
        self._subscribers.setdefault(str(topic), []).append(callback)

    def notify(self, topics: Iterable[str]) -> None:
        for topic in set(topics):
            self._deliver(str(topic))

    def _deliver(self, topic: str) -> None:
        for callback in self._subscribers.get(topic, ()):
            try:
                callback()
                self.delivered += 1
            except Exception:  # a consumer's wake must not fail the committer
                log.exception("wake-up callback for %s failed", topic)

    async def start(self) -> None:
        return None

    async def close(self) -> None:
        return None


class NatsWakeBus(LocalWakeBus):
    """Local wake-ups plus NATS fan-out to the other replicas (see the module docstring)."""

    def __init__(
        self,
        url: str,
        *,
        prefix: str = "vidroute.wake",
        reconnect_wait_s: float = 0.5,
        connect_timeout_s: float = 2.0,
        origin: str | None = None,
    ) -> None:
        super().__init__()
        self.url = url
        self.where = _without_credentials(url)  # what the logs name
        self.prefix = prefix
        self.origin = origin or secrets.token_hex(8)  # this replica: its own echoes are skipped
        self._reconnect_wait_s = reconnect_wait_s
        # After a publish the pump gathers topics this long before the next one: at most one
        # message per topic per interval, whatever the commit rate (a wake-up 20 ms later is
        # still far inside a poll interval).
        self.min_interval_s = 0.02
        self._connect_timeout_s = connect_timeout_s
        self._pending: set[str] = set()
        self._has_pending = asyncio.Event()
        self._nc: Any = None  # nats.aio.client.Client once connected
        self._tasks: list[asyncio.Task[None]] = []
        self._closing = False
        self.published = 0  # broker messages sent
        self.received = 0  # broker messages from other replicas
        self.publish_failures = 0
        self._last_warning = 0.0

    @property
    def connected(self) -> bool:
        return self._nc is not None and bool(self._nc.is_connected)

    def notify(self, topics: Iterable[str]) -> None:
        wanted = {str(t) for t in topics}
        super().notify(wanted)
        if wanted and not self._closing:
            self._pending |= wanted
            self._has_pending.set()

    async def start(self) -> None:
        """Connect in the background (a broker down at start-up delays nothing) and pump."""
        if not self._tasks:
            self._closing = False
            self._tasks = [
                asyncio.create_task(self._connect_loop(), name="wakeups-connect"),
                asyncio.create_task(self._pump(), name="wakeups-publish"),
            ]

    async def close(self) -> None:
        self._closing = True
        tasks, self._tasks = self._tasks, []
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        nc, self._nc = self._nc, None
        if nc is not None:
            with contextlib.suppress(Exception):
                await nc.close()

    async def wait_connected(self, timeout_s: float) -> bool:
        """Wait until the broker connection is up (tests, start-up logs); False on timeout."""
        deadline = time.monotonic() + timeout_s
        while not self.connected:
            if time.monotonic() >= deadline:
                return False
            await asyncio.sleep(0.02)
        return True

    async def _connect_loop(self) -> None:
        import nats  # the broker client is needed only when a broker is configured

        while self._nc is None:
            try:
                nc = await nats.connect(
                    self.url,
                    name=f"vidroute-{self.origin}",
                    connect_timeout=self._connect_timeout_s,
                    reconnect_time_wait=self._reconnect_wait_s,
                    max_reconnect_attempts=-1,  # forever: the broker comes back
                    allow_reconnect=True,
                    error_cb=self._on_error,
                    disconnected_cb=self._on_disconnected,
                    reconnected_cb=self._on_reconnected,
                )
                await nc.subscribe(f"{self.prefix}.>", cb=self._on_message)
                self._nc = nc
                log.info("wake-ups: connected to %s", self.where)
            except Exception as exc:
                self._warn("wake-ups: broker %s unreachable (%r); polling only", self.where, exc)
                await asyncio.sleep(self._reconnect_wait_s)

    async def _pump(self) -> None:
        """Publish pending topics, one message per topic per pass, however many commits."""
        while True:
            await self._has_pending.wait()
            self._has_pending.clear()
            topics, self._pending = self._pending, set()
            if not self.connected:
                continue  # dropped: the other replicas' polls cover it
            for topic in sorted(topics):
                try:
                    await self._nc.publish(f"{self.prefix}.{topic}", self.origin.encode())
                    self.published += 1
                except Exception as exc:
                    self.publish_failures += 1
                    self._warn("wake-ups: publish of %s failed (%r)", topic, exc)
            await asyncio.sleep(self.min_interval_s)

    async def _on_message(self, msg: Any) -> None:
        if msg.data.decode(errors="replace") == self.origin:
            return  # our own, already delivered locally
        self.received += 1
        self._deliver(msg.subject.removeprefix(f"{self.prefix}."))

    async def _on_error(self, exc: Exception) -> None:
        self._warn("wake-ups: broker error %r", exc)

    async def _on_disconnected(self) -> None:
        self._warn("wake-ups: disconnected from %s; polling only until it is back", self.where)

    async def _on_reconnected(self) -> None:
        log.info("wake-ups: reconnected to %s", self.where)

    def _warn(self, message: str, *args: object) -> None:
        now = time.monotonic()
        if now - self._last_warning >= 30.0:  # one line per outage, not one per publish
            self._last_warning = now
            log.warning(message, *args)


class PgNotifyWakeBus(NatsWakeBus):
    """Local wake-ups plus PostgreSQL ``LISTEN``/``NOTIFY`` between replicas (no broker).

    The same coalescing pump and reconnect loop as NATS; a payload is ``origin topic``.
    """

    CHANNEL = "vidroute_wake"

    def __init__(self, database_url: str, **kwargs: Any) -> None:
        super().__init__("postgresql", **kwargs)  # `url` is only named in logs: no secrets
        from controlplane.persistence.notify import NotifyChannel

        self._channel = NotifyChannel(database_url, self.CHANNEL)

    @property
    def connected(self) -> bool:
        return self._channel.open

    async def close(self) -> None:
        await super().close()
        await self._channel.close()

    async def _connect_loop(self) -> None:
        while True:
            if not self._channel.open:
                try:
                    await self._channel.listen(self._on_notify, self._connect_timeout_s)
                    log.info("wake-ups: listening on PostgreSQL channel %s", self.CHANNEL)
                except Exception as exc:
                    self._warn("wake-ups: PostgreSQL LISTEN failed (%r); polling only", exc)
            await asyncio.sleep(self._reconnect_wait_s)  # also how soon a lost one is noticed

    async def _pump(self) -> None:
        while True:
            await self._has_pending.wait()
            self._has_pending.clear()
            topics, self._pending = self._pending, set()
            if not self._channel.open:
                continue
            for topic in sorted(topics):
                try:
                    await self._channel.notify(f"{self.origin} {topic}")
                    self.published += 1
                except Exception as exc:
                    self.publish_failures += 1
                    self._warn("wake-ups: NOTIFY of %s failed (%r)", topic, exc)
            await asyncio.sleep(self.min_interval_s)

    def _on_notify(self, payload: str) -> None:
        origin, _, topic = payload.partition(" ")
        if origin == self.origin:
            return
        self.received += 1
        self._deliver(topic)


def _without_credentials(url: str) -> str:
    scheme, sep, rest = url.partition("://")
    return scheme + sep + rest.rpartition("@")[2] if sep else url


def wake_bus_for(broker_url: str | None, database_url: str = "") -> LocalWakeBus:
    """The bus for ``VIDROUTE_BROKER_URL``: ``nats://`` -> NATS; none -> PostgreSQL
    ``LISTEN``/``NOTIFY`` when the store is PostgreSQL, else in-process."""
    if not broker_url:
        if database_url.startswith("postgresql"):
            return PgNotifyWakeBus(database_url)
        return LocalWakeBus()
    scheme = broker_url.split("://", 1)[0].lower()
    if scheme in {"nats", "tls"}:
        return NatsWakeBus(broker_url)
    raise ValueError(f"VIDROUTE_BROKER_URL: unsupported scheme {scheme!r} (use nats://host:port)")
