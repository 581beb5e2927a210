"""`ExecutionEngine`: the execution workers as concurrent asyncio loops of one replica.

Loops: submit, recovery, poll, cancel, output fetch, the renewal of waiting attempts' leases
(`WaitingLeases`), and a sweep that settles interrupted submits (SUBMITTING with no provider job
past `submitting_grace_s` -> SUBMIT_UNKNOWN; with a job -> completed). The sweep runs once at
`start()` before any loop, then periodically. Any number of replicas may run against one
PostgreSQL: outbox messages and due polls/recoveries are claimed with ``FOR UPDATE SKIP LOCKED``
and every state change is a CAS on a locked row, so a message is handled once and a submit is
sent once. A crashed replica's claims expire and are re-taken.

Clock, sleep and randomness are injected so tests drive time instead of waiting for it;
`run_until_idle()` runs every step until nothing is due, which is what most tests use.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import Awaitable, Callable, Mapping
from datetime import UTC, datetime, timedelta

from controlplane.adapters.grpc_client import AdapterClient
from controlplane.execution.breakers import OperationBreakers, OperationGate
from controlplane.execution.cancel import CancelService, CancelWorker
from controlplane.execution.config import ExecutionConfig
from controlplane.execution.events import EventNormalizer
from controlplane.execution.leasing import LeaseKeeper, LeaseSource
from controlplane.execution.outcomes import (
    AttemptEndObserver,
    DurationSource,
    ExecutionDeps,
    SubmitObserver,
    UsageDeclared,
)
from controlplane.execution.output_fetch import FetchRequest, FetchResult
from controlplane.execution.output_step import FetchFn, OutputStep
from controlplane.execution.poller import Poller
from controlplane.execution.recovery import RecoveryWorker
from controlplane.execution.submit_worker import SubmitWorker
from controlplane.execution.waiting import WaitingLeases
from controlplane.leases.base import LeaseStore
from controlplane.persistence.database import Database
from controlplane.persistence.execution import ExecutionQueries
from controlplane.persistence.statement_tally import labelled
from controlplane.persistence.tasks import TaskQueries

__all__ = ["ExecutionEngine"]

log = logging.getLogger(__name__)


def _utcnow() -> datetime:
    return datetime.now(UTC)


async def _no_fetch(_request: FetchRequest) -> FetchResult:  # pragma: no cover - wiring guard
    raise RuntimeError("no output fetcher configured")


class ExecutionEngine:
    """One replica of the execution side; `start()`/`stop()` or `run_until_idle()`."""

    def __init__(
        self,
        db: Database,
        adapters: Mapping[str, AdapterClient],
        *,
        config: ExecutionConfig | None = None,
        leases: LeaseStore | None = None,
        fetch: FetchFn | None = None,
        clock: Callable[[], datetime] = _utcnow,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        rng: random.Random | None = None,
        on_submit: SubmitObserver | None = None,
        on_attempt_end: AttemptEndObserver | None = None,
        breakers: OperationBreakers | None = None,
        lease_source: LeaseSource | None = None,
        durations: DurationSource | None = None,
        usage_declared: UsageDeclared | None = None,
    ) -> None:
        """`lease_source` gives an attempt that lost its lease before the send a new one (the
        dispatcher's request for its candidate); without it such an attempt fails unsent.
        `durations` (the scheduler's health windows) gives the poller each model's learned p95
        and max plausible duration; without it the configured ones hold. `usage_declared` says
        whether an attempt's candidate declares usage records (recovery reads them only
        there); without it every provider is asked."""
        self.config = config or ExecutionConfig()
        self.db = db
        self.deps = ExecutionDeps(
            db=db,
            reads=ExecutionQueries(db),
            tasks=TaskQueries(db),
            adapters=adapters,
            leases=LeaseKeeper(leases, lease_source),
            config=self.config,
            clock=clock,
            rng=rng or random.Random(),
            on_submit=on_submit,
            on_attempt_end=on_attempt_end,
            gate=OperationGate(breakers),
            durations=durations,
            usage_declared=usage_declared,
        )
        self._sleep = sleep
        self.normalizer = EventNormalizer(self.deps)
        self.submitter = SubmitWorker(self.deps, self.normalizer)
        self.recovery = RecoveryWorker(self.deps)
        self.poller = Poller(self.deps, self.normalizer)
        self.canceller = CancelWorker(self.deps, self.normalizer)
        self.cancel_service = CancelService(self.deps)
        self.output = OutputStep(self.deps, fetch or _no_fetch, self.normalizer)
        self.waiting = WaitingLeases(self.deps)
        self._tasks: list[asyncio.Task[None]] = []
        self._stopping = asyncio.Event()
        self._wakes: dict[str, asyncio.Event] = {name: asyncio.Event() for name in self._steps()}
        self.errors = 0

    async def sweep(self) -> int:
        """Settle interrupted submits (crash between request start and outcome)."""
        cfg = self.config
        started_before = self.deps.clock() - timedelta(seconds=cfg.submitting_grace_s)
        ids = await self.deps.reads.stale_submitting(
            started_before=started_before, limit=cfg.batch_size
        )
        settled = 0
        for attempt_id in ids:
            settled += await self.submitter.settle(attempt_id)
        return settled

    def _steps(self) -> dict[str, Callable[[], Awaitable[int]]]:
        return {
            "submit": self.submitter.run_once,
            "recovery": self.recovery.run_once,
            "poll": self.poller.run_once,
            "cancel": self.canceller.run_once,
            "output": self.output.run_once,
            "waiting": self.waiting.run_once,
            "sweep": self.sweep,
        }

    async def run_until_idle(self, max_rounds: int = 50) -> int:
        """Run every step until a whole round finds nothing due; returns the work items done."""
        total = 0
        for _ in range(max_rounds):
            done = 0
            for step in self._steps().values():
                done += await step()
            total += done
            if done == 0:
                return total
        return total

    async def start(self) -> None:
        """Sweep once, then run each step in its own loop until `stop()`."""
        if self._tasks:
            return
        self._stopping.clear()
        with labelled("sweep"):
            await self.sweep()
        # In its loop the poller claims its next round while the last one's observations are
        # written (`Poller.run_round`); stepped by hand (`run_until_idle`), each round settles.
        steps = {**self._steps(), "poll": self.poller.run_round}
        for name, step in steps.items():
            with labelled(name):  # the loop's statements, and its items', counted as `name`
                loop = asyncio.create_task(self._loop(name, step), name=f"exec-{name}")
            self._tasks.append(loop)

    async def stop(self, grace_s: float = 5.0) -> None:
        """Let each loop finish its current item (up to `grace_s`), then cancel. Idempotent.

        An item cut off by the cancel is safe: its message claim expires and the state it left
        (at worst SUBMITTING) is settled by the next sweep, never re-sent blindly.
        """
        self._stopping.set()
        tasks, self._tasks = self._tasks, []
        if not tasks:
            return
        _, pending = await asyncio.wait(tasks, timeout=grace_s)
        for task in pending:
            task.cancel()
        for task in pending:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        # The observations already polled are written (or refused) before stop returns.
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.poller.settle(), timeout=grace_s)

    async def _loop(self, name: str, step: Callable[[], Awaitable[int]]) -> None:
        while not self._stopping.is_set():
            try:
                done = await step()
            except Exception:
                self.errors += 1
                log.exception("execution step %s failed; retrying after a pause", name)
                done = 0
            if done == 0 and not self._stopping.is_set():
                await self._idle(name)

    def wake(self, step: str | None = None) -> None:
        """End the idle pause of one step's loop (None: every loop) so it looks for work now.

        The seam for wake-ups (a broker message, an outbox commit): a wake only shortens a
        pause, so a lost one delays nothing by more than `idle_sleep_s`.
        """
        for name, event in self._wakes.items():
            if step is None or name == step:
                event.set()

    async def _idle(self, name: str) -> None:
        event = self._wakes.setdefault(name, asyncio.Event())
        if event.is_set():
            event.clear()
            return
        pause = asyncio.ensure_future(self._sleep(self.config.idle_sleep_s))
        woken = asyncio.ensure_future(event.wait())
        try:
            await asyncio.wait({pause, woken}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiter in (pause, woken):
                waiter.cancel()
            event.clear()
