"""Provider-neutral job records and their lifecycle (queued -> running -> terminal).

Each emulator maps `Phase` to its own raw status strings. Progression is either driven by
polls (``advance="polls"``: every GET of a job moves it one step, deterministic for tests)
or by the clock (``advance="time"``: a ticker moves jobs after ``queue_s`` / ``run_s``).
A job may be *held* in the queue by the emulator (Runway concurrency, busy GPU workers).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

from adapter_sidecars.emulators.faults import FaultRule


class Phase(StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def terminal(self) -> bool:
        return self in (Phase.SUCCEEDED, Phase.FAILED, Phase.CANCELLED)


@dataclass
class JobFaults:
    """Job-level faults attached by matching fault rules."""

    throttle_polls: int = 0
    unknown_status: str | None = None
    unknown_polls: int = 0
    fail: tuple[str, str] | None = None
    expire_polls: int = 0
    callback_twice: bool = False
    callback_out_of_order: bool = False
    callback_before_response: bool = False

    def attach(self, rule: FaultRule) -> None:
        p = rule.params
        if rule.action == "throttle_polls":
            self.throttle_polls += int(p["n"])
        elif rule.action == "unknown_status":
            self.unknown_status, self.unknown_polls = str(p["value"]), int(p.get("polls", 1))
        elif rule.action == "fail_job":
            self.fail = (str(p["code"]), str(p.get("message", f"Injected failure {p['code']}")))
        elif rule.action == "expire_output":
            self.expire_polls = int(p.get("polls", 1))
        elif rule.action == "callback_twice":
            self.callback_twice = True
        elif rule.action == "callback_out_of_order":
            self.callback_out_of_order = True
        elif rule.action == "callback_before_response":
            self.callback_before_response = True


def iso(ts: float | None) -> str | None:
    """ISO-8601 UTC with milliseconds and a Z, as providers print timestamps."""
    if ts is None:
        return None
    return (
        datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%S.")
        + f"{int(ts * 1000) % 1000:03d}Z"
    )


@dataclass
class Job:
    """What the emulator really created; `data` holds provider-specific parsed inputs."""

    id: str
    route: str
    body: Any
    created_at: float = field(default_factory=time.time)
    idempotency_key: str | None = None
    client_key: str | None = None
    data: dict[str, Any] = field(default_factory=dict)
    callback_urls: list[str] = field(default_factory=list)
    faults: JobFaults = field(default_factory=JobFaults)
    phase: Phase = Phase.QUEUED
    progress: float = 0.0
    held: bool = False
    steps: int = 0
    phase_since: float = field(default_factory=time.time)
    started_at: float | None = None
    finished_at: float | None = None
    failure: tuple[str, str] | None = None
    polls: int = 0
    deleted: bool = False
    done_event: asyncio.Event = field(default_factory=asyncio.Event)

    def truth(self, status: str) -> dict[str, Any]:
        return {
            "id": self.id,
            "route": self.route,
            "body": self.body,
            "idempotency_key": self.idempotency_key,
            "client_key": self.client_key,
            "created_at": iso(self.created_at),
            # When it reached a terminal phase (None while it runs): with created_at, the span
            # the provider counted it against its concurrency.
            "finished_at": iso(self.finished_at),
            "status": status,
            "phase": self.phase.value,
            "polls": self.polls,
            "deleted": self.deleted,
            "failure": list(self.failure) if self.failure else None,
        }


@dataclass(frozen=True)
class Pace:
    """How fast jobs move; see `EmulatorConfig` for the meaning of each field."""

    advance: str = "polls"
    queued_polls: int = 1
    running_polls: int = 2
    queue_s: float = 0.5
    run_s: float = 2.0


class Lifecycle:
    """Moves jobs between phases and reports every change to `on_change`."""

    def __init__(
        self,
        pace: Pace,
        can_start: Callable[[Job], bool],
        on_change: Callable[[Job], None],
    ) -> None:
        self.pace = pace
        self._can_start = can_start
        self._on_change = on_change

    def on_poll(self, job: Job) -> None:
        """Count a poll; in polls mode advance one step unless a fault holds the job."""
        job.polls += 1
        if job.faults.throttle_polls > 0 or job.faults.unknown_polls > 0:
            return
        if self.pace.advance != "polls" or job.phase.terminal:
            return
        if job.phase is Phase.QUEUED:
            may_start = self._try_hold(job)
            if job.steps < self.pace.queued_polls or not may_start:
                job.steps += 1
                return
            self.start(job)
        if job.steps < self.pace.running_polls:
            job.steps += 1
            job.progress = round(job.steps / (self.pace.running_polls + 1), 4)
            return
        self.finish(job)

    def tick(self, job: Job, now: float) -> None:
        """Time mode: advance by the clock. A throttled job waits in the queue: the provider
        holds it there until the throttle lifts (it then starts at once, its queue time spent)."""
        if job.phase is Phase.QUEUED and job.faults.throttle_polls == 0:
            may_start = self._try_hold(job)
            if may_start and now - job.phase_since >= self.pace.queue_s:
                self.start(job, now)
        if job.phase is Phase.RUNNING:
            elapsed = now - job.phase_since
            if elapsed >= self.pace.run_s:
                self.finish(job, now)
            else:
                job.progress = round(min(0.99, elapsed / max(self.pace.run_s, 1e-9)), 4)

    def _try_hold(self, job: Job) -> bool:
        """Return True if the job may start; otherwise mark it held."""
        job.held = not self._can_start(job)
        return not job.held

    def start(self, job: Job, now: float | None = None) -> None:
        job.phase, job.steps, job.progress = Phase.RUNNING, 0, 0.0
        job.phase_since = job.started_at = now or time.time()
        self._on_change(job)

    def finish(
        self, job: Job, now: float | None = None, failure: tuple[str, str] | None = None
    ) -> None:
        job.failure = failure or job.faults.fail
        job.phase = Phase.FAILED if job.failure else Phase.SUCCEEDED
        job.progress = 1.0 if job.phase is Phase.SUCCEEDED else job.progress
        job.finished_at = job.phase_since = now or time.time()
        job.done_event.set()
        self._on_change(job)

    def cancel(self, job: Job) -> bool:
        """Cancel a non-terminal job; return False if it had already ended."""
        if job.phase.terminal:
            return False
        job.phase = Phase.CANCELLED
        job.finished_at = job.phase_since = time.time()
        job.done_event.set()
        self._on_change(job)
        return True
