"""Operation breakers around the workers' provider calls (design 9.15.1 granularity, 9.15.2).

A breaker key carries the operation, so a failing poll endpoint does not stop submits and the
other way round. The poller (POLL), the cancel worker (CANCEL), the output step
(DOWNLOAD_OUTPUT) and recovery's usage lookup (USAGE_QUERY) each ask `OperationGate.begin`
before a call and report it with `end`: a refused call is not made and the worker tries again
later (a delayed poll, a cancel or fetch message retried later, a usage step left inconclusive),
so an endpoint that is down is not hammered by every due job. HALF_OPEN admits the configured
probes like a submit does. With no breakers wired every call is admitted.

Every SUBMIT call asks too (`admit_submit`), right before it is sent: the first send of an
attempt, its retries on the same candidate and recovery's same-key re-send. The holder is the
attempt's client request key, the one the dispatcher admitted the attempt under, so a HALF_OPEN
probe slot the dispatcher took is the same slot (the ledger is idempotent per holder) and the
probe budget holds across the dispatcher, the submit worker and every replica. The outcome of
an admitted submit reaches the breaker through the submit observer (`ExecutionDeps.on_submit`),
which reports it under the same holder.

The gate never raises into a worker: a breaker backend that fails (Redis away) admits the call,
because a breaker protects the provider; it must not stop the platform observing its jobs.
"""

from __future__ import annotations

import logging
import secrets
import time
from dataclasses import dataclass
from typing import Protocol

from controlplane.domain.breaker import BreakerKey, Operation
from controlplane.persistence.records import AccountInfo, AttemptRecord
from vidroute_core.errors import ProviderError

__all__ = [
    "TRANSPORT_FAILURE",
    "GuardedCall",
    "OperationBreakers",
    "OperationGate",
    "submit_key_of",
]

log = logging.getLogger(__name__)

# What a call that raised (the sidecar unreachable, a broken stream) reports to the breaker.
TRANSPORT_FAILURE = "TRANSIENT_NETWORK"


class OperationBreakers(Protocol):
    """What the gate needs of the scheduler's `HealthMonitor`."""

    async def admit(self, key: BreakerKey, holder: str, *, fresh: bool = False) -> bool: ...

    async def release(self, key: BreakerKey, holder: str) -> None: ...

    def reopens_in(self, key: BreakerKey) -> float | None: ...

    async def record_outcome(
        self,
        key: BreakerKey,
        error_class: str | None,
        latency_s: float | None,
        *,
        holder: str | None = None,
    ) -> object: ...


def submit_key_of(account: AccountInfo, attempt: AttemptRecord) -> BreakerKey:
    """The SUBMIT breaker `attempt` is sent through (its candidate's, as the dispatcher's)."""
    return BreakerKey(
        account.provider,
        account.account_name,
        account.region,
        attempt.provider_model,
        Operation.SUBMIT,
    )


@dataclass(frozen=True, slots=True)
class GuardedCall:
    """One admitted call; hand it back to `OperationGate.end`."""

    key: BreakerKey
    holder: str
    started: float


class OperationGate:
    """Admission and outcome reporting for one worker's provider calls."""

    def __init__(self, breakers: OperationBreakers | None = None) -> None:
        self._breakers = breakers

    async def begin(
        self, account: AccountInfo, model: str, operation: Operation
    ) -> GuardedCall | None:
        """An admitted call, or None when the breaker refuses it (do not call; retry later)."""
        key = BreakerKey(account.provider, account.account_name, account.region, model, operation)
        call = GuardedCall(key, f"{operation.value}:{secrets.token_hex(8)}", time.monotonic())
        if self._breakers is None:
            return call
        try:
            admitted = await self._breakers.admit(key, call.holder)
        except Exception:
            log.warning("breaker %s: admission failed; calling anyway", key, exc_info=True)
            return call
        if not admitted:
            log.info("breaker %s refuses the call; retrying later", key)
            return None
        return call

    async def admit_submit(self, account: AccountInfo, attempt: AttemptRecord) -> bool:
        """May `attempt`'s submit be sent now? Its SUBMIT breaker (and its account's) decides,
        under the attempt's client request key; a refused submit is not sent (park it).

        Unlike the other operations, a breaker backend that fails refuses: the ledger that
        bounds HALF_OPEN probes across replicas cannot be consulted, and a submit creates paid
        work at a provider that may be down (`HealthMonitor.admit` already answers False for a
        probe it cannot record; this covers the rest)."""
        if self._breakers is None:
            return True
        key = submit_key_of(account, attempt)
        try:
            return await self._breakers.admit(key, attempt.client_request_key, fresh=True)
        except Exception:
            log.warning("breaker %s: submit admission failed; not sending now", key, exc_info=True)
            return False

    def submit_reopens_in(self, account: AccountInfo, attempt: AttemptRecord) -> float | None:
        """Seconds until `attempt`'s refusing SUBMIT breaker ends its cooldown; None when it is
        not cooling down (HALF_OPEN with every probe slot taken, or pinned open)."""
        if self._breakers is None:
            return None
        return self._breakers.reopens_in(submit_key_of(account, attempt))

    async def release_unsent(self, account: AccountInfo, attempt: AttemptRecord) -> None:
        """`attempt` ended before its submit was sent (cancelled, lease lost): give back the
        HALF_OPEN probe slot the dispatcher may have taken for it, so the next probe need not
        wait for the slot's TTL."""
        if self._breakers is None:
            return
        key = submit_key_of(account, attempt)
        try:
            await self._breakers.release(key, attempt.client_request_key)
        except Exception:
            log.warning("breaker %s: probe slot not released", key, exc_info=True)

    async def release(self, call: GuardedCall) -> None:
        """The call failed for a reason of ours (platform storage): no evidence either way."""
        if self._breakers is None:
            return
        try:
            await self._breakers.release(call.key, call.holder)
        except Exception:
            log.warning("breaker %s: admission not released", call.key, exc_info=True)

    async def end(self, call: GuardedCall, error: ProviderError | str | None) -> None:
        """Report the call: None is success, else the provider's error or a 9.9 class."""
        if self._breakers is None:
            return
        error_class = error.error_class.value if isinstance(error, ProviderError) else error
        try:
            await self._breakers.record_outcome(
                call.key, error_class, time.monotonic() - call.started, holder=call.holder
            )
        except Exception:
            log.warning("breaker %s: outcome not recorded", call.key, exc_info=True)
