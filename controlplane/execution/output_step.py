"""Delivery (design 9.22): drives ``output.fetch`` messages through `fetch_output`.

    StoredAsset          for every output of the job (each sample its own key, checksum and
                         probe): task OUTPUT_FETCHING -> SUCCEEDED with all of them
                         (`controlplane.domain.outputs`), lease released
    OutputExpired        re-query the provider job (`get_job`) for a fresh locator and retry;
                         never generate again; after `max_output_refreshes` the task FAILS
    OutputInvalid        task FAILED with the reason (fetching again cannot help)
    TransientFetchError  retry later with backoff; after `max_fetch_attempts` the task FAILS

The fetch function is injected (`FetchFn`); `fetcher_for(http, object_store)` adapts
`controlplane.execution.output_fetch.fetch_output`. An output flagged ``fetch_through_adapter``
(its URI needs the provider's credentials, which only the sidecar holds) is fetched with the
adapter's FetchOutput stream as the request's byte source (`adapter_source`); every other
output is a plain HTTP GET. Both go through the same checks and storage.

The message is completed in the same transaction as the task's final state, so a crash
re-fetches (the storage key is per attempt and sample, so a second fetch overwrites the same
object). A failure of any sample decides the message as above; a retry fetches every sample again.

A claimed batch is handled per round (design 9.20, issue 22): its rows read in one statement,
every message judged side by side (the fetches concurrent, at most `concurrency` at once, no
transaction open), then every outcome of the batch written in ONE unit of work (`_write`: the
rows locked in one read, the task moves with their settlements together, the checks and the
acks each one statement), and the leases released only after its commit. A single message is
the batch of one, through the same function. If the batch's unit raises, it committed nothing:
each outcome is then written alone in its own unit, as one message at a time would be, so one
bad item costs the batch nothing (the fetches are not repeated: only the writes are). Two
messages of one attempt never share a round: the second is judged after the first's commit.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from datetime import datetime, timedelta
from typing import Any

import httpx

from controlplane.adapters.grpc_client import AdapterClient
from controlplane.domain.breaker import Operation
from controlplane.domain.failover import backoff_delay_s
from controlplane.domain.outbox import Topic
from controlplane.domain.outputs import output_document
from controlplane.domain.quality import Defect, bucket_key
from controlplane.domain.states import TaskState
from controlplane.execution.batching import run_batch
from controlplane.execution.breakers import TRANSPORT_FAILURE, GuardedCall
from controlplane.execution.config import ExecutionConfig
from controlplane.execution.events import (
    EventNormalizer,
    EventSource,
    Observation,
    outputs_locator,
)
from controlplane.execution.outcomes import (
    AfterCommit,
    ExecutionDeps,
    claim_batch,
    job_ref,
    outputs_json,
)
from controlplane.execution.output_fetch import (
    ExpectedMedia,
    FetchRequest,
    FetchResult,
    InvalidReason,
    OutputExpired,
    OutputInvalid,
    ProviderChecksum,
    StoredAsset,
    StreamPart,
    StreamSource,
    TransientFetchError,
    fetch_output,
)
from controlplane.persistence import quality as quality_store
from controlplane.persistence.execution import Snapshot
from controlplane.persistence.ports import UnitOfWork
from controlplane.persistence.records import (
    AttemptRecord,
    Failure,
    OutboxRecord,
    ProviderJobRecord,
    TaskEnd,
    TaskRecord,
)
from controlplane.storage.base import ObjectStore, StorageError
from vidroute_core.adapter import JobRef
from vidroute_core.errors import ErrorClass, ProviderError
from vidroute_core.logs import bind_ids
from vidroute_core.spec import GenerationSpec

__all__ = ["FetchFn", "OutputStep", "adapter_source", "fetcher_for"]

log = logging.getLogger(__name__)

FetchFn = Callable[[FetchRequest], Awaitable[FetchResult]]


def fetcher_for(http: httpx.AsyncClient, store: ObjectStore) -> FetchFn:
    """The production `FetchFn` over `fetch_output`."""

    async def fetch(request: FetchRequest) -> FetchResult:
        return await fetch_output(http, store, request)

    return fetch


def _checksum(raw: str) -> ProviderChecksum | None:
    algorithm, _, digest = raw.partition(":")
    try:
        return ProviderChecksum(algorithm, digest) if digest else None
    except ValueError:
        return None


def _request(
    spec: GenerationSpec,
    task_id: str,
    attempt_id: int,
    index: int,
    output: Mapping[str, object],
    *,
    cfg: ExecutionConfig,
) -> FetchRequest:
    """The fetch of sample `index`; `ValueError` when its locator is unusable."""
    expires = output.get("expires_at")
    return FetchRequest(
        task_id=task_id,
        attempt_id=str(attempt_id),
        source_uri=str(output.get("uri", "")),
        expected=ExpectedMedia(
            duration_ms=spec.output.duration_ms,
            width=spec.output.width,
            height=spec.output.height,
            with_audio=spec.output.with_audio,
        ),
        max_bytes=cfg.max_output_bytes,
        expected_mime=str(output.get("mime_type") or "video/mp4"),
        provider_checksum=_checksum(str(output.get("checksum") or "")),
        expires_at=datetime.fromisoformat(str(expires)) if expires else None,
        # A silent request gets a silent file, whatever the model rendered: the compile
        # plan's LOSSLESS "stripped on delivery" happens here.
        strip_audio=not spec.output.with_audio,
        sample_index=index,
        via_adapter=bool(output.get("fetch_through_adapter")),
    )


def _failure_of(error: ProviderError) -> OutputExpired | OutputInvalid | TransientFetchError:
    """What an adapter's FetchOutput error means for delivery."""
    if error.error_class is ErrorClass.OUTPUT_EXPIRED:
        return OutputExpired(f"adapter: {error.message}", error.raw_status_code)
    if error.code == "OUTPUT_TOO_LARGE":
        return OutputInvalid(InvalidReason.TOO_LARGE, f"adapter: {error.message}")
    retry_after = error.retry_after_ms / 1000 if error.retry_after_ms is not None else None
    return TransientFetchError(
        f"adapter {error.code}: {error.message}", error.raw_status_code, retry_after
    )


def adapter_source(client: AdapterClient, job: JobRef, uri: str, max_bytes: int) -> StreamSource:
    """A byte source over the adapter's FetchOutput of `uri` (an output of `job`)."""

    async def stream() -> AsyncIterator[StreamPart]:
        try:
            async for chunk in client.fetch_output(job, uri, max_bytes):
                failure = _failure_of(chunk.error) if chunk.error is not None else None
                yield StreamPart(chunk.data, chunk.content_type, chunk.content_length, failure)
                if failure is not None:
                    return
        except Exception as exc:  # the adapter client failed unexpectedly: try again later
            yield StreamPart(failure=TransientFetchError(f"adapter fetch_output raised {exc!r}"))

    where = f"adapter {job.account or '-'}/{job.provider_job_id}"
    return StreamSource(stream, where)


class OutputStep:
    """Consumes ``output.fetch``; `fetches` counts fetch calls."""

    def __init__(self, deps: ExecutionDeps, fetch: FetchFn, normalizer: EventNormalizer) -> None:
        self._deps = deps
        self._fetch = fetch
        self._normalizer = normalizer
        self.fetches = 0

    async def run_once(self) -> int:
        messages = await claim_batch(self._deps, Topic.OUTPUT_FETCH)
        if not messages:
            return 0
        first: Exception | None = None
        for round_ in _rounds(messages):
            try:
                await self._round(round_)
            except Exception as exc:  # finish the batch, then raise the first (engine logs it)
                first = first or exc
        if first is not None:
            raise first
        return len(messages)

    async def _round(self, messages: list[OutboxRecord]) -> None:
        """Judge `messages` (one per attempt) side by side, then write their outcomes together.
        A message whose judging raised writes nothing: its claim expires, as before."""
        # The round's rows in one read (ONE statement), not a read per message.
        joined = await self._deps.reads.snapshots_and_tasks(
            int(m.payload["attempt_id"]) for m in messages
        )
        outcomes: dict[int, _Outcome] = {}

        async def judge(message: OutboxRecord) -> None:
            payload = message.payload
            snap, task = joined.get(int(payload["attempt_id"]), (None, None))
            # A message names its attempt's task; one naming another finds no task.
            if task is not None and task.id != int(payload["task_id"]):
                task = None
            with bind_ids(task_id=payload.get("task_id"), attempt_id=payload.get("attempt_id")):
                outcomes[message.id] = await self._judge(message, snap, task)

        failed: Exception | None = None
        try:
            await run_batch(
                messages,
                judge,
                key=lambda m: m.payload.get("attempt_id"),
                limit=self._deps.config.concurrency,
            )
        except Exception as exc:
            failed = exc
        await self._apply([outcomes[i] for i in sorted(outcomes)])
        if failed is not None:
            raise failed

    async def _judge(
        self, message: OutboxRecord, snap: Snapshot | None, task: TaskRecord | None
    ) -> _Outcome:
        """Fetch what `message` asks for and decide what to write; no transaction is open.
        `snap` and `task` are its attempt's rows as read for the round."""
        cfg = self._deps.config
        attempt_id = int(message.payload["attempt_id"])
        if (
            snap is None
            or task is None
            or task.state is not TaskState.OUTPUT_FETCHING
            or task.adopted_attempt_id != attempt_id
        ):
            return _Done(message)
        attempt, job, runtime = snap
        outputs = outputs_json(job)
        spec = task.spec
        result: FetchResult
        stored: list[StoredAsset] = []
        if not outputs:
            result = OutputExpired("the provider reported no output locator")
        else:
            try:
                requests = [
                    _request(spec, str(task.id), attempt_id, index, output, cfg=cfg)
                    for index, output in enumerate(outputs)
                ]
            except ValueError as exc:
                result = OutputExpired(f"unusable output locator: {exc}")
            else:
                fetched = await self._fetch_all(attempt, job, requests, outputs)
                if fetched is None:  # a breaker refused; the message is due again later
                    return self._pause(message)
                result, stored = fetched
        if isinstance(result, StoredAsset):
            document = output_document([_asset_fields(a) for a in stored])
            return _End(
                message, attempt_id, TaskState.SUCCEEDED, "output stored",
                asset=document, checks=_probed(stored),
            )  # fmt: skip
        if isinstance(result, OutputInvalid):
            probed = _probed(stored)
            if (defect := _DEFECT_OF.get(result.code)) is not None:
                probed.append((len(stored), (defect,)))
            return _failed(
                message, attempt_id, f"OUTPUT_INVALID_{result.code.value}", result.reason,
                checks=probed,
            )  # fmt: skip
        if isinstance(result, OutputExpired):
            refreshes = runtime.output_refreshes if runtime else 0
            if refreshes >= cfg.max_output_refreshes:
                return _failed(
                    message, attempt_id, "OUTPUT_EXPIRED", result.reason, "OUTPUT_EXPIRED"
                )
            if not await self._refresh(attempt_id):
                # The sidecar gave no answer (stopped, restarting): no evidence about the output,
                # so no refresh is used up; asked again later, like a breaker refusal (issue 20).
                return self._pause(message)
            return _Later(message, self._deps.clock(), attempt, "output_refreshes")
        fetches = runtime.fetch_attempts if runtime else 0
        if fetches + 1 >= cfg.max_fetch_attempts:
            return _failed(message, attempt_id, "OUTPUT_FETCH_GAVE_UP", result.reason)
        delay = result.retry_after_s or backoff_delay_s(
            fetches,
            base_s=cfg.fetch_retry_base_s,
            cap_s=cfg.fetch_retry_cap_s,
            unit_random=self._deps.rng.random(),
        )
        at = self._deps.clock() + timedelta(seconds=delay)
        return _Later(message, at, attempt, "fetch_attempts")

    def _pause(self, message: OutboxRecord) -> _Later:
        """Due again after `breaker_retry_s`, nothing counted (no evidence about the output)."""
        at = self._deps.clock() + timedelta(seconds=self._deps.config.breaker_retry_s)
        return _Later(message, at)

    async def _apply(self, outcomes: Sequence[_Outcome]) -> None:
        """Write `outcomes` in one unit; if it raises (nothing committed), each alone. Leases
        are released once the unit that justified it committed."""
        if not outcomes:
            return
        try:
            after = await self._write(outcomes)
        except Exception as exc:
            if len(outcomes) == 1:
                raise
            log.warning(
                "output.fetch: the batch of %d rolled back (%r); writing each alone",
                len(outcomes),
                exc,
            )
            await self._apply_each(outcomes)
            return
        await after.run(self._deps.leases)

    async def _apply_each(self, outcomes: Sequence[_Outcome]) -> None:
        """Each outcome in its own unit (`_write` of one); the first failure raised at the end,
        the others' claims expire as a failed message's always did."""
        after = AfterCommit()
        first: Exception | None = None
        for outcome in outcomes:
            try:
                one = await self._write([outcome])
            except Exception as exc:
                log.warning("output.fetch message %s not written: %r", outcome.message.id, exc)
                first = first or exc
                continue
            after.release.extend(one.release)
        await after.run(self._deps.leases)
        if first is not None:
            raise first

    async def _write(self, outcomes: Sequence[_Outcome]) -> AfterCommit:
        """Every outcome in ONE unit of work: the ended tasks' attempts and tasks locked in one
        read, their moves and settlements (`end_tasks`), the probed samples' checks, the
        retries' counters and due times, and the acks of the rest in one statement."""
        deps, worker = self._deps, self._deps.config.worker_id
        after = AfterCommit()
        async with deps.db.unit(deps.clock()) as u:
            ends = [o for o in outcomes if isinstance(o, _End)]
            rows = await u.attempts_and_tasks([o.attempt_id for o in ends])
            moves: list[TaskEnd] = []
            checks: list[quality_store.NewCheck] = []
            for end in ends:
                if end.attempt_id not in rows:
                    continue
                attempt, task = rows[end.attempt_id]
                moves.append(TaskEnd(task, end.target, end.reason, end.failure, end.asset))
                checks.extend(await _checks(u, deps, task, attempt, end.checks))
                after.release.append(attempt)
            await u.end_tasks(moves)
            if checks:
                await u.record_quality_checks(checks)
            for later in outcomes:
                if not isinstance(later, _Later):
                    continue
                if later.attempt is not None and later.counter:
                    await u.bump_runtime(later.attempt.id, later.attempt.task_id, later.counter)
                await u.retry_message(later.message.id, worker, available_at=later.at)
            done = [o.message.id for o in outcomes if not isinstance(o, _Later)]
            await u.complete_messages(done, worker)
        return after

    async def _fetch_all(
        self,
        attempt: AttemptRecord,
        job: ProviderJobRecord | None,
        requests: list[FetchRequest],
        outputs: list[dict[str, object]],
    ) -> tuple[FetchResult, list[StoredAsset]] | None:
        """Fetch every sample in order, stopping at the first that is not stored: (the last
        result, the stored ones). None when the DOWNLOAD_OUTPUT breaker refused (the message is
        then due again after `breaker_retry_s`; a refusal is not a fetch attempt)."""
        stored: list[StoredAsset] = []
        result: FetchResult = OutputExpired("no output")
        for output, plain in zip(outputs, requests, strict=True):
            request = plain
            if output.get("fetch_through_adapter") and job is not None:
                request = await self._through_adapter(attempt, job, plain)
            account = await self._deps.account(attempt.provider_account_id)
            call = await self._deps.gate.begin(
                account, attempt.provider_model, Operation.DOWNLOAD_OUTPUT
            )
            if call is None:
                return None
            self.fetches += 1
            result = await self._guarded_fetch(call, request)
            if not isinstance(result, StoredAsset):
                break  # every sample or none: a retry fetches them all again
            stored.append(replace(result, sample_index=plain.sample_index))
        return result, stored

    async def _guarded_fetch(self, call: GuardedCall, request: FetchRequest) -> FetchResult:
        """Fetch, telling the breaker what the download says about the provider's endpoint."""
        try:
            result = await self._fetch(request)
        except StorageError as exc:
            await self._deps.gate.release(call)  # our storage failed, not the download
            return TransientFetchError(f"platform storage failed: {exc!r}")
        if isinstance(result, TransientFetchError):
            await self._deps.gate.end(call, TRANSPORT_FAILURE)
        elif isinstance(result, OutputExpired):
            await self._deps.gate.end(call, "OUTPUT_EXPIRED")
        elif isinstance(result, OutputInvalid):
            await self._deps.gate.end(call, "ASSET_INVALID")
        else:
            await self._deps.gate.end(call, None)
        return result

    async def _through_adapter(
        self, attempt: AttemptRecord, job: ProviderJobRecord, request: FetchRequest
    ) -> FetchRequest:
        """`request` with the adapter's FetchOutput stream as its byte source: the URI needs
        the provider's credentials, which only the sidecar holds."""
        account = await self._deps.account(attempt.provider_account_id)
        ref = job_ref(attempt, account, job.provider_job_id, job.provider_request_id or "")
        client = self._deps.adapter(account)
        source = adapter_source(client, ref, request.source_uri, request.max_bytes)
        return replace(request, source=source)

    async def _refresh(self, attempt_id: int) -> bool:
        """Ask the provider for the job again: its answer carries fresh output URLs. False when
        the call got no answer (the refresh is to be tried again, not counted)."""
        snap = await self._deps.reads.snapshot(attempt_id)
        if snap is None or snap[1] is None:
            return True
        attempt, job, _ = snap
        assert job is not None
        account = await self._deps.account(attempt.provider_account_id)
        try:
            polled = await self._deps.adapter(account).get_job(
                job_ref(attempt, account, job.provider_job_id, job.provider_request_id or "")
            )
        except Exception as exc:
            log.info("attempt %s: refresh get_job raised %r", attempt_id, exc)
            return False
        if polled.snapshot is None or not polled.snapshot.outputs:
            return True
        await self._normalizer.ingest(
            Observation(
                attempt.provider_account_id,
                job.provider_job_id,
                polled.snapshot,
                EventSource.POLL,
                self._deps.clock(),
                attempt_id,
            )
        )
        # The attempt is already SUCCEEDED, so the normalizer only stores; keep the new URLs.
        async with self._deps.db.unit(self._deps.clock()) as u:
            await u.update_job(job.id, output_locator=outputs_locator(polled.snapshot))
        return True


# ---- technical quality signals (design 9.14) ----------------------------------------------------

# Refusals that say the model made a bad video (not a transport or storage problem).
_DEFECT_OF = {
    InvalidReason.UNREADABLE_MEDIA: Defect.DECODE_ERROR,
    InvalidReason.NOT_MP4: Defect.DECODE_ERROR,
    InvalidReason.MEDIA_MISMATCH: Defect.MEDIA_MISMATCH,
}


def _asset_fields(asset: StoredAsset) -> dict[str, Any]:
    """The output document's fields of a stored sample (its quality signals are kept apart)."""
    fields = asdict(asset)
    del fields["defects"]
    return fields


def _probed(stored: list[StoredAsset]) -> list[tuple[int, tuple[Defect, ...]]]:
    return [(a.sample_index, tuple(Defect(d) for d in a.defects)) for a in stored]


async def _checks(
    u: UnitOfWork,
    deps: ExecutionDeps,
    task: TaskRecord,
    attempt: AttemptRecord,
    checks: Sequence[tuple[int, tuple[Defect, ...]]],
) -> list[quality_store.NewCheck]:
    """Each probed sample's technical check, stored in the unit that stores (or refuses) the
    output."""
    if not checks:
        return []
    account = await deps.account(attempt.provider_account_id, u)
    subject = quality_store.Subject(
        account.provider, attempt.provider_model, task.spec.mode.value, bucket_key(task.spec)
    )
    return [
        quality_store.NewCheck(task.id, attempt.id, index, subject, defects)
        for index, defects in checks
    ]


# ---- what a message's handling decided, written with its batch's others (`OutputStep._write`) --


@dataclass(frozen=True, slots=True)
class _Done:
    """Nothing to write but the ack: the message's effect is moot (the task moved on)."""

    message: OutboxRecord


@dataclass(frozen=True, slots=True)
class _Later:
    """The message is due again `at`; the attempt's runtime `counter` bumped first when the
    try counts (a fetch attempt, an output refresh), none for a refusal that is no try."""

    message: OutboxRecord
    at: datetime
    attempt: AttemptRecord | None = None
    counter: str = ""


@dataclass(frozen=True, slots=True)
class _End:
    """The task ends: SUCCEEDED with `asset`, or FAILED with `failure`; its lease released.
    `checks` are the probed samples' (index, defects)."""

    message: OutboxRecord
    attempt_id: int
    target: TaskState
    reason: str
    failure: Failure | None = None
    asset: dict[str, Any] | None = None
    checks: Sequence[tuple[int, tuple[Defect, ...]]] = ()


_Outcome = _Done | _Later | _End


def _failed(
    message: OutboxRecord,
    attempt_id: int,
    code: str,
    reason: str,
    failure_class: str = ErrorClass.INTERNAL_PERMANENT.value,
    *,
    checks: Sequence[tuple[int, tuple[Defect, ...]]] = (),
) -> _End:
    failure = Failure(failure_class, code, reason)
    return _End(message, attempt_id, TaskState.FAILED, code, failure=failure, checks=checks)


def _rounds(messages: Sequence[OutboxRecord]) -> list[list[OutboxRecord]]:
    """The batch in rounds, the k-th message of each attempt in round k (claim order): a
    later message of an attempt is judged from what the earlier one's round committed, as if
    it came in the next batch."""
    rounds: list[list[OutboxRecord]] = []
    seen: dict[object, int] = {}
    for m in messages:
        key = m.payload.get("attempt_id")
        k = seen[key] = seen.get(key, -1) + 1
        if k == len(rounds):
            rounds.append([])
        rounds[k].append(m)
    return rounds
