"""The execution engine's knobs, one frozen dataclass (the composition root fills it in).

Product and risk decisions are named fields with a documented default, so changing one is a
reviewed configuration change rather than a code edit:

* `allow_new_attempt_after_abandon` (False): after recovery gives up on an unknown submit the
  task FAILS with SUBMISSION_UNKNOWN, because a new attempt may pay for a second video (9.17.5).
* `deliver_if_succeeded_during_cancel` (True): when the provider finishes the job before it
  confirms a cancel, the output is delivered. The provider ran and charged; a cancel is a
  request, not a fact (9.18.3). False cancels the task and keeps the output only for billing.
* `idempotent_providers` ({"self_hosted"}): providers whose submit honours the client request
  key, so recovery may re-send the same submit with the same key (9.17.4 step 1). An
  ``attempt.submit`` payload may override per attempt with ``supports_idempotency_key``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from controlplane.domain.failover import FailoverLimits
from controlplane.domain.polling import PollingPolicy
from controlplane.domain.progress import ProgressThrottle

__all__ = ["ExecutionConfig"]


@dataclass(frozen=True, slots=True)
class ExecutionConfig:
    """Timings are seconds; every delay is real time (tests shrink `polling.scale` instead)."""

    worker_id: str = "exec-1"
    callback_base_url: str = ""
    batch_size: int = 32
    # Items of one claimed batch handled side by side (sidecar calls in flight per worker loop);
    # one attempt's items never run side by side (`controlplane.execution.batching`).
    concurrency: int = 16
    # Transactions a poll round writes its observations in at once (`batching.GroupWrites`):
    # what arrives while they are all open goes together into the next.
    write_units: int = 2
    claim_lease_s: float = 30.0
    idle_sleep_s: float = 0.5

    limits: FailoverLimits = field(default_factory=FailoverLimits)
    polling: PollingPolicy = field(default_factory=PollingPolicy)
    # Which provider progress readings become ``provider.progress`` task events.
    progress: ProgressThrottle = field(default_factory=ProgressThrottle)
    # Per model: the provider's p95 job duration, and the longest a job can plausibly take.
    # Both are learned per candidate from the health windows once they hold enough finished
    # jobs (`polling.learned_durations`); until then these hold, and `max_plausible_s` stays
    # the floor of the learned one.
    expected_p95_s: Mapping[str, float] = field(default_factory=lambda: MappingProxyType({}))
    max_plausible_s: float = 1800.0

    # A SUBMITTING attempt older than this with no provider job is a crashed submit (9.17).
    submitting_grace_s: float = 120.0

    idempotent_providers: frozenset[str] = frozenset({"self_hosted"})
    recovery_base_s: float = 2.0
    recovery_cap_s: float = 120.0
    unknown_recovery_deadline_s: float = 1800.0
    max_recovery_queries: int = 20
    max_unknown_age_s: float = 3600.0
    # Usage records are the last resort (9.17.4 step 6), consulted after this many queries.
    usage_lookup_after_queries: int = 3
    allow_new_attempt_after_abandon: bool = False
    # A held job the provider answers NOT_FOUND for is polled on (backing off) for this long,
    # then treated like a lost job: ABANDONED, the task by `allow_new_attempt_after_abandon`,
    # never a fail-over by itself. A cancel we sent that then reads NOT_FOUND is cancelled.
    job_not_found_abandon_after_s: float = 3600.0
    # Background lookup of ABANDONED attempts (9.17.5): every period, for at most this long
    # after the abandonment; the result is recorded, never applied to the task.
    abandoned_lookup_period_s: float = 900.0
    abandoned_lookup_for_s: float = 21600.0

    deliver_if_succeeded_during_cancel: bool = True
    cancel_retry_s: float = 5.0
    max_cancel_calls: int = 5

    # A call its operation breaker refuses (9.15) is tried again after this long, not at once.
    # A refused submit waits parked (READY_TO_SUBMIT, its lease kept) for the rest of the
    # breaker's cooldown, at most this long, then asks again.
    breaker_retry_s: float = 30.0
    # A READY_TO_SUBMIT attempt's lease is renewed this often while it waits for a submit
    # worker (`WaitingLeases`): well inside the dispatcher's lease TTL (600 s), so a backlog
    # longer than one lease term keeps its leases (a third of it leaves two renewals to miss).
    waiting_lease_renew_s: float = 200.0
    # An attempt whose lease was lost before its send and that found no new one (capacity
    # taken meanwhile) asks again after this long; it waits unsent, it is not failed.
    lease_wait_retry_s: float = 5.0

    fetch_retry_base_s: float = 2.0
    fetch_retry_cap_s: float = 120.0
    max_fetch_attempts: int = 8
    max_output_refreshes: int = 3
    max_output_bytes: int = 2 * 1024 * 1024 * 1024
