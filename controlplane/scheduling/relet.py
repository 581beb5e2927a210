"""The lease the dispatcher would take for an attempt it already created (`lease_source`).

The execution engine's `LeaseKeeper.secure` asks for it when an attempt lost its lease before its
send (expired in a long backlog, lost with Redis's data): the attempt takes a new lease on the
same terms as the dispatcher's (its candidate's lease account and dimensions, the dispatcher's
TTL and maximum term, its account's windows, keyed by the attempt's client request key, so an
acquire finds a lease the store still holds for it), instead of failing unsent and going back
to the queue.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from controlplane.leases.base import LeaseRequest
from controlplane.persistence.records import AttemptRecord
from controlplane.scheduling.dispatcher import Dispatcher

__all__ = ["lease_source", "usage_declared"]


def lease_source(
    dispatcher: Dispatcher,
) -> Callable[[AttemptRecord], Awaitable[LeaseRequest | None]]:
    """`LeaseSource` over `dispatcher`'s catalog and lease terms."""

    async def request(attempt: AttemptRecord) -> LeaseRequest | None:
        catalog = await dispatcher.catalog()
        for c in catalog.candidates:
            if c.account_id == attempt.provider_account_id and c.model == attempt.provider_model:
                # The task's modality is a dimension only where the account limits modalities
                # (`lease_dimensions`): its task is read only then, not at every send's stamp.
                limited = dispatcher.limits_for(c.provider, c.account).modality_concurrency
                key = attempt.client_request_key
                mode = await dispatcher.attempt_mode(key) if limited else ""
                # Its windows too: still counted from its admission (keyed by the same attempt),
                # or, admitted longer ago than a span, counted again now that it is sent.
                return dispatcher.lease_request(c, key, 1, attempt.estimated_cost_micros, mode=mode)
        return None  # its candidate left the catalog: no lease on terms nobody publishes

    return request


def usage_declared(dispatcher: Dispatcher) -> Callable[[AttemptRecord], Awaitable[bool]]:
    """Whether an attempt's candidate declares usage records (Describe's
    `operations.usage_records`, as published in the catalog), for recovery: a candidate that
    left the catalog declares nothing, so its provider is not asked."""

    async def declared(attempt: AttemptRecord) -> bool:
        catalog = await dispatcher.catalog()
        for c in catalog.candidates:
            if c.account_id == attempt.provider_account_id and c.model == attempt.provider_model:
                return c.capability.operations.usage_records
        return False

    return declared
