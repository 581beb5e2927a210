"""The polling worker (design 9.18.2): asks providers about jobs that are due.

Due attempts (``attempt_runtime.next_poll_at <= now`` and a pollable state: ACCEPTED, PROVIDER_
QUEUED, PROVIDER_THROTTLED, RUNNING, CANCEL_REQUESTED) are claimed with ``FOR UPDATE SKIP
LOCKED`` by pushing their due time past a claim lease, so replicas never poll the same job twice
at once and a crashed poller's claim simply expires. The snapshot goes to the one
`EventNormalizer`; the next due time comes from the pure `controlplane.domain.polling` schedule.
A job past its plausible duration is flagged stuck (``stuck_since``) and still polled, slowly.
The provider's p95 and that plausible duration are learned per candidate from the scheduler's
health windows when it has enough finished jobs (`polling.learned_durations`), else configured.
A NOT_FOUND for the job we hold goes to `controlplane.execution.lost_jobs`, never to a status.
While the POLL breaker of the job's endpoint refuses, the poll is not made and is due again
after ``breaker_retry_s`` (9.15).

A claimed batch is polled side by side (at most `concurrency` calls at once, no transaction
open during a call), and its observations are written in groups as they come (`GroupWrites`
over `EventNormalizer.ingest_each`, at most `write_units` transactions at once): a poll that
finds a unit free is written at once, the polls answered meanwhile go together in the next
transaction, each with its next due time. In the engine's loop the next round is claimed while
they are written (a claimed row is not due again before its claim lease ends), unless more
than a round's observations still wait; a round that finds nothing due waits for them all.
So a round's writes share a few transactions and a slow provider call holds back no one.
"""

from __future__ import annotations

import logging
from datetime import timedelta

from controlplane.domain.breaker import Operation
from controlplane.domain.observation import IngestOutcome, poll_phase_of
from controlplane.domain.polling import JobDurations, PollPhase, learned_durations, next_poll_delay
from controlplane.domain.states import ATTEMPT_MACHINE, POLLABLE_ATTEMPT_STATES
from controlplane.execution.batching import GroupWrites, run_batch
from controlplane.execution.breakers import TRANSPORT_FAILURE
from controlplane.execution.events import EventNormalizer, EventSource, Observation, Then
from controlplane.execution.lost_jobs import is_job_not_found, on_job_not_found, on_job_seen
from controlplane.execution.outcomes import ExecutionDeps, job_ref
from controlplane.persistence.execution import Snapshot
from controlplane.persistence.ports import UnitOfWork
from controlplane.persistence.records import AttemptRecord
from vidroute_core.adapter import PollResult
from vidroute_core.logs import add_ids, bind_ids, ids_of

__all__ = ["Poller"]

log = logging.getLogger(__name__)


class Poller:
    """Polls due jobs; `polls` counts `get_job` calls, `stuck_flags` newly stuck jobs."""

    def __init__(self, deps: ExecutionDeps, normalizer: EventNormalizer) -> None:
        self._deps = deps
        self._normalizer = normalizer
        self._writes: GroupWrites[tuple[Observation, Then | None], IngestOutcome] = GroupWrites(
            normalizer.ingest_each, units=deps.config.write_units
        )
        self.polls = 0
        self.stuck_flags = 0
        self.refused = 0  # polls the POLL breaker refused

    async def run_once(self, *, settle: bool = True) -> int:
        """Poll one claimed round; how many were claimed. `settle`: return once the round's
        observations are written; else (the engine's loop) only when more than a round's wait
        or none was due, so the next round is polled while they are written."""
        cfg = self._deps.config
        # The claim is one statement on PostgreSQL: no BEGIN/COMMIT around it.
        async with self._deps.db.unit(self._deps.clock(), one_statement=True) as u:
            ids = await u.claim_polls(
                cfg.worker_id, limit=cfg.batch_size, lease_s=cfg.claim_lease_s
            )
        if not ids:
            await self.settle()  # idle only once the rounds' observations are written
            return 0
        # The claimed batch's rows in one joined read, not one read per poll. A row that
        # moves meanwhile is re-read under its lock by whatever writes it.
        snaps = await self._deps.reads.snapshots(ids)

        async def poll_one(attempt_id: int) -> None:
            with bind_ids(attempt_id=attempt_id):
                await self.poll(attempt_id, snaps.get(attempt_id), self._writes)

        await run_batch(ids, poll_one, key=lambda i: i, limit=cfg.concurrency)
        if settle or self._writes.waiting > cfg.batch_size:
            await self.settle()  # no more than a round's observations wait to be written
        return len(ids)

    async def run_round(self) -> int:
        """`run_once` for the engine's loop: the next round polled while this one's
        observations are written."""
        return await self.run_once(settle=False)

    async def settle(self) -> None:
        """Until every observation polled so far is written (the first error raised)."""
        await self._writes.wait()

    async def poll(
        self,
        attempt_id: int,
        snap: Snapshot | None = None,
        writes: GroupWrites[tuple[Observation, Then | None], IngestOutcome] | None = None,
    ) -> None:
        """Poll one claimed attempt; `snap` is its rows as read at claim time (else read now);
        its observation is put to `writes` (written after this returns: `GroupWrites.wait`),
        else written in a transaction of its own before this returns."""
        if snap is None:
            snap = await self._deps.reads.snapshot(attempt_id)
        if snap is None:
            return
        attempt, job, runtime = snap
        add_ids(**ids_of(attempt, job))
        if job is None or attempt.state not in POLLABLE_ATTEMPT_STATES:
            return
        account = await self._deps.account(attempt.provider_account_id)
        await self._deps.leases.renew(attempt)
        call = await self._deps.gate.begin(account, attempt.provider_model, Operation.POLL)
        if call is None:
            self.refused += 1
            now = self._deps.clock()
            async with self._deps.db.unit(now) as u:
                delay = timedelta(seconds=self._deps.config.breaker_retry_s)
                await u.set_runtime(attempt.id, attempt.task_id, next_poll_at=now + delay)
            return
        self.polls += 1
        try:
            result = await self._deps.adapter(account).get_job(
                job_ref(attempt, account, job.provider_job_id, job.provider_request_id or "")
            )
        except Exception as exc:
            log.info("attempt %s: get_job raised %r", attempt.id, exc)
            result = PollResult(None)
            await self._deps.gate.end(call, TRANSPORT_FAILURE)
        else:
            # A job the provider does not know says nothing about the endpoint's health.
            outcome = None if is_job_not_found(result.error) else result.error
            await self._deps.gate.end(call, outcome)
        if is_job_not_found(result.error):
            # Never "cancelled by the provider", never a fail-over by itself (`lost_jobs`).
            await on_job_not_found(self._deps, self._normalizer, attempt, job, runtime)
        elif result.snapshot is not None:
            await on_job_seen(self._deps, attempt, runtime)

            async def reschedule(u: UnitOfWork, ended: set[int]) -> None:
                # An attempt that ended here had its polls stopped by the same transaction.
                if attempt_id not in ended:
                    await self._reschedule_in(u, attempt_id)

            # The next due time is written in the observation's own transaction (one commit
            # per poll, not two), from the rows as that transaction left them.
            obs = Observation(
                attempt.provider_account_id,
                job.provider_job_id,
                result.snapshot,
                EventSource.POLL,
                self._deps.clock(),
                attempt.id,
            )
            if writes is None:
                await self._normalizer.ingest(obs, then=reschedule)
            else:
                writes.put((obs, reschedule))
            return
        await self._reschedule(attempt_id)

    async def _reschedule(self, attempt_id: int) -> None:
        async with self._deps.db.unit(self._deps.clock()) as u:
            await self._reschedule_in(u, attempt_id)

    async def _durations(self, u: UnitOfWork, attempt: AttemptRecord) -> JobDurations:
        """The p95 and max plausible duration of `attempt`'s candidate: learned from the
        health windows, else the configured ones."""
        cfg = self._deps.config
        evidence = None
        if self._deps.durations is not None:
            account = await self._deps.account(attempt.provider_account_id, u)
            evidence = self._deps.durations.job_durations(
                account.provider, account.account_name, attempt.provider_model
            )
        return learned_durations(
            cfg.polling,
            evidence,
            configured_p95_s=cfg.expected_p95_s.get(attempt.provider_model),
            configured_max_s=cfg.max_plausible_s,
        )

    async def _reschedule_in(self, u: UnitOfWork, attempt_id: int) -> None:
        """Set the attempt's next poll (none once it left the pollable states) in unit `u`."""
        cfg = self._deps.config
        attempt = await u.attempt(attempt_id)
        if attempt is None:
            return
        runtime = await u.runtime(attempt_id)
        if (
            ATTEMPT_MACHINE.is_terminal(attempt.state)
            or attempt.state not in POLLABLE_ATTEMPT_STATES
        ):
            await u.set_runtime(attempt_id, attempt.task_id, next_poll_at=None)
            return
        phase = poll_phase_of(attempt.state) or PollPhase.RUNNING
        same_phase = runtime is not None and runtime.poll_phase == phase.value
        polls_in_phase = runtime.polls_in_phase if runtime and same_phase else 0
        since = (runtime.accepted_at if runtime else None) or attempt.created_at
        durations = await self._durations(u, attempt)
        plan = next_poll_delay(
            cfg.polling,
            phase,
            polls_in_phase=polls_in_phase,
            elapsed_since_submit_s=(u.now - since).total_seconds(),
            unit_random=self._deps.rng.random(),
            expected_p95_s=durations.expected_p95_s,
            max_plausible_s=durations.max_plausible_s,
        )
        stuck_since = runtime.stuck_since if runtime else None
        if plan.stuck and stuck_since is None:
            stuck_since = u.now
            self.stuck_flags += 1
            log.warning("attempt %s looks stuck at the provider", attempt.id)
        await u.set_runtime(
            attempt_id,
            attempt.task_id,
            next_poll_at=u.now + timedelta(seconds=plan.delay_s),
            poll_phase=phase.value,
            polls_in_phase=polls_in_phase + 1,
            poll_count=(runtime.poll_count if runtime else 0) + 1,
            last_polled_at=u.now,
            stuck_since=stuck_since if plan.stuck else None,
        )
