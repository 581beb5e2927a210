"""The lease the dispatcher would take for an attempt it already created (`lease_source`).

The execution engine's `LeaseKeeper.secure` asks for it when an attempt lost its lease before its
send (expired in a long backlog, lost with Redis's data): the attempt takes a new lease on the
same terms as the dispatcher's (its candidate's lease account and dimensions, the dispatcher's
TTL and maximum term, keyed by the attempt's client request key, so an acquire finds a lease the
store still holds for it), instead of failing unsent and going back to the queue.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from controlplane.leases.base import LeaseRequest
from controlplane.persistence.records import AttemptRecord
from controlplane.scheduling.dispatcher import Dispatcher
from controlplane.scheduling.gather import lease_dimensions

__all__ = ["lease_source"]


def lease_source(
    dispatcher: Dispatcher,
) -> Callable[[AttemptRecord], Awaitable[LeaseRequest | None]]:
    """`LeaseSource` over `dispatcher`'s catalog and lease terms."""
    config = dispatcher.config

    async def request(attempt: AttemptRecord) -> LeaseRequest | None:
        catalog = await dispatcher.catalog()
        for c in catalog.candidates:
            if c.account_id == attempt.provider_account_id and c.model == attempt.provider_model:
                return LeaseRequest(
                    attempt_id=attempt.client_request_key,
                    account=c.lease_account,
                    dimensions=lease_dimensions(c, config.default_concurrency),
                    ttl_ms=config.lease_ttl_ms,
                    max_term_ms=config.lease_max_term_ms,
                )
        return None  # its candidate left the catalog: no lease on terms nobody publishes

    return request
