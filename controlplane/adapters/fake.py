"""`FakeAdapterClient`: a scriptable in-process `AdapterClient` for tests of the execution side.

Each operation reads from a script queue and records its call, so a test states the provider's
behaviour and then asserts what the control plane did::

    fake = FakeAdapterClient()
    fake.script_submit(SubmitOutcome(SubmitKind.UNKNOWN, transport_stage=AWAIT_RESPONSE))
    fake.script_recover(RecoverResult(RecoveryVerdict.FOUND, job=JobRef("job-1", "prod")))
    fake.set_job("job-1", running_snapshot, succeeded_snapshot)   # successive get_job answers

A scripted item may be a value, an exception instance (raised), or a callable taking the call's
arguments and returning the value (sync or async), which lets a test act at the exact moment of
the call (e.g. deliver a callback before the submit response). An empty submit script accepts
with a fresh job id; an empty recover script is INCONCLUSIVE; `get_job` of an unscripted job is
QUEUED. A job's last scripted snapshot repeats. `load` is what `get_load` answers (empty by
default; set it to a `LoadReport`, an exception or a callable like any script item).
`set_output(uri, ...)` scripts what `fetch_output` streams for a URI (bytes, split into
chunks, or `OutputChunk`s); an unscripted URI ends with an OUTPUT_EXPIRED error.
"""

from __future__ import annotations

import inspect
import itertools
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, TypeVar

from vidroute_core.adapter import (
    AdapterDescription,
    CancelResult,
    CompiledPlan,
    JobRef,
    JobSnapshot,
    JobState,
    LoadReport,
    OutputChunk,
    PollResult,
    RecoverQuery,
    RecoverResult,
    RecoveryVerdict,
    SubmitKind,
    SubmitOutcome,
    UsageRecord,
)
from vidroute_core.capabilities.loader import Capability
from vidroute_core.errors import ErrorClass, make_error
from vidroute_core.spec import GenerationSpec

__all__ = ["FakeAdapterClient", "SubmitCall"]

V = TypeVar("V")


@dataclass(frozen=True, slots=True)
class SubmitCall:
    """One recorded submit."""

    plan: CompiledPlan
    client_request_key: str
    callback_url: str


@dataclass
class FakeAdapterClient:
    """An `AdapterClient` whose answers come from per-operation scripts."""

    account: str = "prod"
    submit_calls: list[SubmitCall] = field(default_factory=list)
    get_job_calls: list[JobRef] = field(default_factory=list)
    cancel_calls: list[JobRef] = field(default_factory=list)
    recover_calls: list[RecoverQuery] = field(default_factory=list)
    usage_calls: list[tuple[str, datetime, datetime]] = field(default_factory=list)
    usage: list[UsageRecord] = field(default_factory=list)
    fetch_output_calls: list[tuple[JobRef, str, int]] = field(default_factory=list)
    load: Any = field(default_factory=LoadReport)
    load_calls: int = 0
    _outputs: dict[str, list[OutputChunk]] = field(default_factory=dict)
    _submits: deque[Any] = field(default_factory=deque)
    _recovers: deque[Any] = field(default_factory=deque)
    _cancels: deque[Any] = field(default_factory=deque)
    _jobs: dict[str, deque[Any]] = field(default_factory=dict)
    _ids: itertools.count[int] = field(default_factory=lambda: itertools.count(1))

    # ---- scripting ------------------------------------------------------------------------

    def script_submit(self, *items: Any) -> None:
        self._submits.extend(items)

    def script_recover(self, *items: Any) -> None:
        self._recovers.extend(items)

    def script_cancel(self, *items: Any) -> None:
        self._cancels.extend(items)

    def set_job(self, job_id: str, *snapshots: Any) -> None:
        """Replace the answers `get_job` gives for `job_id` (the last one repeats)."""
        self._jobs[job_id] = deque(snapshots)

    def set_output(
        self,
        uri: str,
        body: bytes | list[OutputChunk],
        *,
        content_type: str = "video/mp4",
        chunk_size: int = 64 * 1024,
    ) -> None:
        """What `fetch_output(uri)` streams: `body` in chunks (declaring its type and length),
        or exactly the given `OutputChunk`s."""
        if isinstance(body, list):
            self._outputs[uri] = list(body)
            return
        pieces = [body[i : i + chunk_size] for i in range(0, len(body), chunk_size)] or [b""]
        chunks = [OutputChunk(data=p) for p in pieces]
        chunks[0] = OutputChunk(pieces[0], content_type, len(body))
        self._outputs[uri] = chunks

    def accepted(self, job_id: str | None = None, raw_status: str = "PENDING") -> SubmitOutcome:
        """An ACCEPTED result with `job_id` (or a fresh one)."""
        job = job_id or f"job-{next(self._ids)}"
        return SubmitOutcome(SubmitKind.ACCEPTED, JobRef(job, self.account), raw_status=raw_status)

    # ---- AdapterClient --------------------------------------------------------------------

    async def describe(self) -> AdapterDescription:
        return AdapterDescription(adapter="fake", adapter_version="0")

    async def compile(
        self,
        spec: GenerationSpec,
        *,
        account: str,
        model: str,
        model_version: str = "",
        capability: Capability | None = None,
    ) -> CompiledPlan:
        raise NotImplementedError("the fake does not compile; build plans in the test")

    async def submit(
        self, plan: CompiledPlan, client_request_key: str, callback_url: str = ""
    ) -> SubmitOutcome:
        self.submit_calls.append(SubmitCall(plan, client_request_key, callback_url))
        if not self._submits:
            return self.accepted()
        result: SubmitOutcome = await _resolve(
            self._submits.popleft(), plan, client_request_key, callback_url
        )
        return result

    async def get_job(self, job: JobRef) -> PollResult:
        self.get_job_calls.append(job)
        script = self._jobs.get(job.provider_job_id)
        if not script:
            return PollResult(JobSnapshot(JobState.QUEUED, "QUEUED", '{"status":"QUEUED"}'))
        item = script.popleft() if len(script) > 1 else script[0]
        value = await _resolve(item, job)
        return value if isinstance(value, PollResult) else PollResult(value)

    async def cancel_job(self, job: JobRef) -> CancelResult:
        self.cancel_calls.append(job)
        if not self._cancels:
            return CancelResult(acknowledged=True)
        cancelled: CancelResult = await _resolve(self._cancels.popleft(), job)
        return cancelled

    async def recover(self, query: RecoverQuery) -> RecoverResult:
        self.recover_calls.append(query)
        if not self._recovers:
            return RecoverResult(RecoveryVerdict.INCONCLUSIVE, method="fake")
        recovered: RecoverResult = await _resolve(self._recovers.popleft(), query)
        return recovered

    async def list_usage(self, account: str, start: datetime, end: datetime) -> list[UsageRecord]:
        self.usage_calls.append((account, start, end))
        return [u for u in self.usage if u.usage_time is None or start <= u.usage_time <= end]

    async def get_load(self) -> LoadReport:
        self.load_calls += 1
        report: LoadReport = await _resolve(self.load)
        return report

    async def fetch_output(
        self, job: JobRef, uri: str, max_bytes: int
    ) -> AsyncIterator[OutputChunk]:
        self.fetch_output_calls.append((job, uri, max_bytes))
        script = self._outputs.get(uri)
        if script is None:
            yield OutputChunk(
                error=make_error(ErrorClass.OUTPUT_EXPIRED, "OUTPUT_EXPIRED", "no such output")
            )
            return
        for chunk in script:
            yield chunk


async def _resolve(item: Any, *args: Any) -> Any:
    if isinstance(item, BaseException):
        raise item
    if callable(item) and not isinstance(item, type):
        call: Callable[..., Any] = item
        result = call(*args)
        if inspect.isawaitable(result):
            result = await result
        return result
    return item
