"""`LoadBook`: the model servers' live load, read by GetLoad once per interval (design 9.21).

`run` asks every adapter for its load (``GetLoad``) once per ``interval_s`` (the composition root
scales it by the time scale), all adapters concurrently, each under ``timeout_s``; an adapter
that reports nothing (Runway, Veo) gives an empty report, one that fails keeps its last report
until it is older than ``max_age_s`` and then counts as reporting nothing: stale load is no
evidence. The dispatcher turns the reports into `LoadView`s once per round (`views`, no I/O),
so deciding a task only looks them up.

Shared like the health windows (scale-out): with Redis (`RedisLoadShare`, one hash
``{prefix}:model-load``, a field per adapter) only the replica that `is_leader` (shard 0's leader,
as for lease upkeep) calls GetLoad and publishes each report with its wall-clock time; the other
replicas read the hash once per interval instead, so a fleet makes one GetLoad per adapter per
interval. A follower that cannot read Redis, or finds no fresh report (a leader gone), asks the
adapters itself: losing Redis loses only the sharing. Without Redis every replica asks.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from controlplane.adapters.grpc_client import AdapterClient
from controlplane.domain.routing.candidates import Candidate
from controlplane.domain.routing.load import LoadScoring, LoadView, load_view
from vidroute_core.adapter import ModelLoad

log = logging.getLogger(__name__)
Reports = dict[str, tuple[float, dict[str, ModelLoad]]]  # adapter -> (measured at, per model)


@dataclass(frozen=True, slots=True)
class LoadConfig:
    """Refresh period, per-call timeout and the age after which a report is dropped (0: three
    periods); `scoring` is how load moves a score."""

    interval_s: float = 10.0
    timeout_s: float = 10.0
    max_age_s: float = 0.0
    scoring: LoadScoring = field(default_factory=LoadScoring)


class RedisLoadShare:
    """The leader's load reports in one Redis hash; values are JSON ``{"at", "models"}``."""

    def __init__(self, client: Any, prefix: str = "vidroute") -> None:
        self._redis = client  # redis.asyncio.Redis, typed loosely like the shared state's
        self.key = f"{prefix}:model-load"

    async def publish(self, reports: Reports) -> None:
        mapping = {
            name: json.dumps({"at": at, "models": [dataclasses.asdict(m) for m in models.values()]})
            for name, (at, models) in reports.items()
        }
        if mapping:
            await self._redis.hset(self.key, mapping=mapping)

    async def read(self) -> Reports:
        out: Reports = {}
        for name, raw in (await self._redis.hgetall(self.key)).items():
            doc = json.loads(raw)
            models = (ModelLoad(**m) for m in doc["models"])
            key = name.decode() if isinstance(name, bytes) else str(name)
            out[key] = (float(doc["at"]), {m.model: m for m in models})
        return out


class LoadBook:
    """The last load report of every adapter, keyed by provider and model."""

    def __init__(
        self,
        adapters: Mapping[str, AdapterClient],
        config: LoadConfig | None = None,
        clock: Callable[[], float] = time.time,
        *,
        share: RedisLoadShare | None = None,
        is_leader: Callable[[], bool] = lambda: True,
    ) -> None:
        self._adapters = adapters
        self.config = config or LoadConfig()
        self._clock = clock  # wall clock: shared reports carry their time to other replicas
        self._share = share
        self._is_leader = is_leader
        self._reports: Reports = {}
        self.refreshes = 0

    @property
    def max_age_s(self) -> float:
        return self.config.max_age_s or 3 * self.config.interval_s

    def report(self, provider: str) -> Mapping[str, ModelLoad]:
        """The provider's current (not stale) load per model; empty when none."""
        held = self._reports.get(provider)
        if held is None or self._clock() - held[0] > self.max_age_s:
            return {}
        return held[1]

    async def refresh(self) -> None:
        """One GetLoad per adapter, concurrently; a failure keeps the last report."""
        names = list(self._adapters)
        answers = await asyncio.gather(
            *(self._ask(name) for name in names), return_exceptions=False
        )
        now = self._clock()
        for name, models in zip(names, answers, strict=True):
            if models is not None:
                self._reports[name] = (now, models)
        self.refreshes += 1

    async def tick(self) -> None:
        """One interval's work: a follower reads the leader's reports, else (the leader, no
        Redis, or nothing fresh shared) GetLoad, published when shared."""
        leader = self._share is None or self._is_leader()
        if not leader and self._share is not None:
            try:
                shared = await self._share.read()
            except Exception as exc:  # Redis lost: ask the adapters ourselves
                log.info("shared model load not readable: %s", type(exc).__name__)
            else:
                for name, held in shared.items():  # never older than our own read
                    if name not in self._reports or held[0] >= self._reports[name][0]:
                        self._reports[name] = held
                now = self._clock()
                if all(
                    name in shared and now - shared[name][0] <= self.max_age_s
                    for name in self._adapters
                ):
                    return
        await self.refresh()
        if leader and self._share is not None:
            try:
                await self._share.publish(self._reports)
            except Exception as exc:
                log.info("model load not shared: %s", type(exc).__name__)

    async def _ask(self, name: str) -> dict[str, ModelLoad] | None:
        try:
            async with asyncio.timeout(self.config.timeout_s):
                report = await self._adapters[name].get_load()
        except Exception as exc:  # a hint: never fails the loop, the report ages out
            log.info("GetLoad of %s failed: %s", name, type(exc).__name__)
            return None
        return {m.model: m for m in report.models}

    def views(
        self, candidates: Iterable[Candidate], mean_latency: Callable[[str], float | None]
    ) -> dict[str, LoadView]:
        """The round's `LoadView` per candidate whose provider reports its model's load;
        `mean_latency` gives a candidate's window mean latency (None: unknown)."""
        out: dict[str, LoadView] = {}
        fresh: dict[str, Mapping[str, ModelLoad]] = {}
        for c in candidates:
            models = fresh.get(c.provider)
            if models is None:
                models = fresh[c.provider] = self.report(c.provider)
            load = models.get(c.model)
            if load is not None:
                out[c.id] = load_view(load, mean_latency(c.id), self.config.scoring)
        return out

    async def run(self, stop: asyncio.Event) -> None:
        """Refresh every interval until `stop`."""
        while not stop.is_set():
            await self.tick()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.config.interval_s)
