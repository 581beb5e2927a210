"""Provider concurrency quota held as leases (design 9.11): the `LeaseStore` seam and its stores.

Nothing else in the control plane touches Redis for quota. The scheduler talks to a `LeaseStore`,
and the composition root picks `RedisLeaseStore` when Redis is configured and `MemoryLeaseStore`
otherwise. Importing this package does not import redis. Import `controlplane.leases.redis_store`
for that.
"""

from controlplane.leases.base import (
    AccountSnapshot,
    Dimension,
    HeldLease,
    InvalidLeaseRequest,
    Lease,
    LeaseBackendError,
    LeaseError,
    LeaseLostError,
    LeaseMetrics,
    LeaseRequest,
    LeaseStore,
    UnknownSlotsFullHook,
    unknown_slot_cap,
)
from controlplane.leases.memory_store import MemoryLeaseStore
from controlplane.leases.reconciler import (
    IN_FLIGHT_STATES,
    CounterKind,
    Drift,
    InFlightAttempt,
    compute_drift,
    reconcile,
)
from controlplane.leases.windows import WindowEntry, WindowRefusal, WindowRequest, WindowUse

__all__ = [
    "IN_FLIGHT_STATES",
    "AccountSnapshot",
    "CounterKind",
    "Dimension",
    "Drift",
    "HeldLease",
    "InFlightAttempt",
    "InvalidLeaseRequest",
    "Lease",
    "LeaseBackendError",
    "LeaseError",
    "LeaseLostError",
    "LeaseMetrics",
    "LeaseRequest",
    "LeaseStore",
    "MemoryLeaseStore",
    "UnknownSlotsFullHook",
    "WindowEntry",
    "WindowRefusal",
    "WindowRequest",
    "WindowUse",
    "compute_drift",
    "reconcile",
    "unknown_slot_cap",
]
