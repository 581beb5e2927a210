"""`LoadBook`: the model servers' live load, read by GetLoad once per interval (design 9.21).

`run` asks every adapter for its load (``GetLoad``) once per ``interval_s`` (the composition root
scales it by the time scale), all adapters concurrently, each under ``timeout_s``; an adapter
that reports nothing (Runway, Veo) gives an empty report, one that fails keeps its last report
until it is older than ``max_age_s`` and then counts as reporting nothing: stale load is no
evidence. The dispatcher turns the reports into `LoadView`s once per round (`views`, no I/O),
so deciding a task only looks them up.

Per replica: every control-plane replica that dispatches reads the load itself (one GetLoad per
adapter per interval each) rather than sharing it through Redis like the health windows: the
report is a cheap, idempotent read of the server's current state, and a replica's own read is
never older than the interval, where a shared copy would add Redis's round trip and its loss.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from controlplane.adapters.grpc_client import AdapterClient
from controlplane.domain.routing.candidates import Candidate
from controlplane.domain.routing.load import LoadScoring, LoadView, load_view
from vidroute_core.adapter import ModelLoad

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class LoadConfig:
    """Refresh period, per-call timeout and the age after which a report is dropped (0: three
    periods); `scoring` is how load moves a score."""

    interval_s: float = 10.0
    timeout_s: float = 10.0
    max_age_s: float = 0.0
    scoring: LoadScoring = field(default_factory=LoadScoring)


class LoadBook:
    """The last load report of every adapter, keyed by provider and model."""

    def __init__(
        self,
        adapters: Mapping[str, AdapterClient],
        config: LoadConfig | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._adapters = adapters
        self.config = config or LoadConfig()
        self._clock = clock
        self._reports: dict[str, tuple[float, dict[str, ModelLoad]]] = {}
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
            await self.refresh()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.config.interval_s)
