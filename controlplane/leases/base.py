"""Domain types and the `LeaseStore` seam for provider concurrency quota (design 9.11).

Concurrency quota is a scarce resource held under a lease, not a bare counter. This module names the
pieces every implementation shares, and imports no redis:

- `Dimension`: one capacity the provider enforces: the account total, a model, a modality or a
  region.
- `LeaseRequest`: an attempt asks for `slots` in every one of its dimensions at once (all or
  nothing).
- `Lease`: what the attempt holds. `token` proves ownership and `fencing_token` grows per account.
  `unknown` tells whether the slot sits in the account's `unknown_submission_slots` budget (9.11.3).
- `HeldLease`: what PostgreSQL knows of a lease an attempt holds, so `LeaseStore.restore` can
  rebuild it after the store lost its data (a Redis flush, a restart without persistence, a
  failover to an empty replica).
- `LeaseStore`: the protocol the scheduler calls. `MemoryLeaseStore` and `RedisLeaseStore` implement
  it and pass the same behavioural suite.

Counting rules shared by both stores:

- A dimension's `used` counts every slot held in it, confirmed or unknown. A SUBMIT_UNKNOWN attempt
  may already be running at the provider, so its slots stay taken (9.11.3). `unknown_used(account)`
  counts the unknown part.
- A lease stays valid until `expires_at_ms`. After that only `release` (by its holder) or
  `reclaim_expired` (by anyone) gives its slots back, exactly once.
- A store built with `fail_closed=True` refuses every acquire in an account until `restore` has
  marked it live, and a loss of the store's data takes that mark with it. The scheduler restores
  the leases of PostgreSQL's holders first (9.11.2), so a loss can never admit more than capacity.
- Counters never go below zero. If the reconciler lowered a counter and a release then subtracts
  from it, the counter stops at zero instead of going negative. A negative counter would let
  capacity be exceeded.

Exceptions::

    LeaseError
    ├── InvalidLeaseRequest   (also ValueError) a request or argument breaks the rules above
    ├── LeaseLostError        the call needs a held lease: it is gone, expired or the token differs
    └── LeaseBackendError     the backing store failed (Redis errors are translated into this)
        └── LeaseStoreUnavailable  it cannot be reached (refused, reset, timed out): also the
                                   kernel's `Unavailable`, so an RPC answers UNAVAILABLE with a
                                   retry hint, never INTERNAL
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from controlplane.leases.windows import WindowEntry, WindowRefusal, WindowRequest, WindowUse
from vidroute_core.exceptions import Unavailable

__all__ = [
    "AccountSnapshot",
    "Dimension",
    "HeldLease",
    "InvalidLeaseRequest",
    "Lease",
    "LeaseBackendError",
    "LeaseError",
    "LeaseLostError",
    "LeaseMetrics",
    "LeaseRequest",
    "LeaseStore",
    "LeaseStoreFactory",
    "UnknownSlotsFullHook",
    "unknown_slot_cap",
]

UNKNOWN_SLOT_FLOOR = 2
UNKNOWN_SLOT_PERCENT = 5

UnknownSlotsFullHook = Callable[[str], None]
"""Called with the account name whenever `mark_unknown` leaves its unknown budget full."""


class LeaseError(Exception):
    """Root of every error raised by `controlplane.leases`."""


class InvalidLeaseRequest(LeaseError, ValueError):
    """A request or argument is malformed: no dimensions, bad TTLs, braces in an account name."""


class LeaseLostError(LeaseError):
    """The lease is not held any more: released, reclaimed, expired, or the token does not match."""


class LeaseBackendError(LeaseError):
    """The backing store (Redis) failed or answered something this package does not understand."""


class LeaseStoreUnavailable(LeaseBackendError, Unavailable):
    """The backing store cannot be reached right now; nothing may be assumed done."""

    def __init__(self, detail: str, retry_after_s: float = 1.0) -> None:
        Unavailable.__init__(self, "lease store (redis)", retry_after_s)
        self.detail = detail


def unknown_slot_cap(capacity: int) -> int:
    """Return an account's unknown-submission budget: max(2, ceil(5% of its capacity)) (9.11.3)."""
    if capacity < 0:
        raise InvalidLeaseRequest(f"capacity must be >= 0, got {capacity}")
    # Integer arithmetic: ceil(capacity * 0.05) in floats is off by one for some capacities.
    percent_cap = -(-capacity * UNKNOWN_SLOT_PERCENT // 100)
    return max(UNKNOWN_SLOT_FLOOR, percent_cap)


def validate_account(account: str) -> None:
    """Reject account names that cannot serve as a Redis Cluster hash tag."""
    if not account or "{" in account or "}" in account:
        raise InvalidLeaseRequest(f"account must be non-empty and free of braces, got {account!r}")


def validate_restore(account: str, ttl_ms: int, max_term_ms: int) -> None:
    """Reject a `LeaseStore.restore` call whose account or lease timings cannot be honoured."""
    validate_account(account)
    if ttl_ms < 1 or max_term_ms < ttl_ms:
        raise InvalidLeaseRequest("restore needs 1 <= ttl_ms <= max_term_ms")


@dataclass(frozen=True, slots=True)
class Dimension:
    """One capacity the provider enforces for an account, e.g. `Dimension("all-video", 20)`.

    `key` is unique within the account. It is not unique across accounts, because every key of one
    account shares that account's hash tag. `capacity` is the most slots that may be held at once.
    It travels with each request, so a configuration change takes effect on the next acquire.
    """

    key: str
    capacity: int

    def __post_init__(self) -> None:
        if not self.key:
            raise InvalidLeaseRequest("dimension key must be non-empty")
        if self.capacity < 0:
            raise InvalidLeaseRequest(f"dimension {self.key!r} capacity must be >= 0")


@dataclass(frozen=True, slots=True)
class LeaseRequest:
    """Ask for `slots` in every dimension of `account` for one attempt, held for `ttl_ms` at a time.

    `account` is the hash-tag scope, e.g. "runway:prod-us". List `dimensions` as account total
    first, then model, then modality or region. `unknown_slot_cap` and reconciliation read the first
    one as the account capacity. Renewals never push the expiry past `acquired_at + max_term_ms`.
    `windows`, when given, are the account's rate and budget windows (`leases.windows`), checked
    and taken in the same atomic step as the dimensions.
    """

    attempt_id: str
    account: str
    dimensions: tuple[Dimension, ...]
    slots: int = 1
    ttl_ms: int = 30_000
    max_term_ms: int = 3_600_000
    windows: WindowRequest | None = None

    def __post_init__(self) -> None:
        if not self.attempt_id:
            raise InvalidLeaseRequest("attempt_id must be non-empty")
        validate_account(self.account)
        if not self.dimensions:
            raise InvalidLeaseRequest("a lease needs at least one dimension")
        keys = [d.key for d in self.dimensions]
        if len(set(keys)) != len(keys):
            raise InvalidLeaseRequest(f"duplicate dimension keys: {keys}")
        if self.slots < 1:
            raise InvalidLeaseRequest(f"slots must be >= 1, got {self.slots}")
        if self.ttl_ms < 1:
            raise InvalidLeaseRequest(f"ttl_ms must be >= 1, got {self.ttl_ms}")
        if self.max_term_ms < self.ttl_ms:
            raise InvalidLeaseRequest("max_term_ms must be >= ttl_ms")


@dataclass(frozen=True, slots=True)
class Lease:
    """A held reservation. Treat it as a receipt: the store's record is authoritative, not this.

    `token` is random and proves ownership to release/renew/mark_unknown. `fencing_token` is
    strictly increasing per account. Send it with provider calls so a holder whose lease was
    reclaimed can be told apart from the one that holds the slot now. Times are milliseconds on the
    store's clock (Redis server TIME).
    """

    attempt_id: str
    account: str
    token: str
    fencing_token: int
    dimensions: tuple[Dimension, ...]
    slots: int
    acquired_at_ms: int
    expires_at_ms: int
    ttl_ms: int
    max_term_ms: int
    unknown: bool = False

    @property
    def term_ends_at_ms(self) -> int:
        """Latest instant any renewal may extend this lease to."""
        return self.acquired_at_ms + self.max_term_ms


@dataclass(frozen=True, slots=True)
class HeldLease:
    """A lease PostgreSQL says `attempt_id` holds: its token and fencing token from the attempt row,
    its dimensions from the catalog. `unknown` puts its slots in the unknown budget too (9.11.3).

    `sent` is False for an attempt not submitted yet. Its lease is rebuilt only in an account the
    store lost: in a live account a missing lease of an unsent attempt expired, its slot may be
    someone else's by now, and the submit worker's fencing check must refuse it, not a rebuild
    bring it back over capacity.
    """

    attempt_id: str
    account: str
    token: str
    fencing_token: int
    dimensions: tuple[Dimension, ...]
    slots: int = 1
    unknown: bool = False
    sent: bool = True


@dataclass(frozen=True, slots=True)
class AccountSnapshot:
    """One consistent read of an account's counters and lease records (reconciler, dashboards).

    `leases` includes records that have expired but are not reclaimed yet. Their slots are still
    counted until `reclaim_expired` returns them. `unknown_cap` is None until a `mark_unknown` call
    has told the store the cap.
    """

    account: str
    used: Mapping[str, int]
    capacity: Mapping[str, int]
    unknown_used: int
    unknown_cap: int | None
    accepting_new: bool
    leases: tuple[Lease, ...]


@dataclass(slots=True)
class LeaseMetrics:
    """Process-local counters of what this store instance did, for whatever exporter is wired.

    This is not a Prometheus dependency. An exporter reads the attributes and reports them.
    """

    acquired: int = 0
    reacquired: int = 0
    rejected_no_capacity: int = 0
    rejected_not_live: int = 0
    rejected_window: int = 0
    restored: int = 0
    released: int = 0
    renewed: int = 0
    renew_failed: int = 0
    reclaimed: int = 0
    unknown_marked: int = 0
    unknown_slots_full: int = 0
    counters_adjusted: int = 0


@runtime_checkable
class LeaseStore(Protocol):
    """The one seam through which the control plane reserves provider concurrency (design 9.11).

    All methods are coroutines and safe to call concurrently from many tasks and processes (for
    Redis).
    """

    metrics: LeaseMetrics

    async def now_ms(self) -> int:
        """Return the store's clock in ms: Redis server TIME, or the memory store's clock."""
        ...

    async def acquire(self, req: LeaseRequest) -> Lease | None:
        """Reserve `req.slots` in every dimension or none. None if any dimension lacks capacity,
        or if the store is fail-closed and the account is not live (see `restore`).

        Expired leases of the account are reclaimed first, in the same atomic step, so a dead
        holder's slots come back without a sweeper. If the attempt already holds a live lease in
        this account, that lease comes back unchanged (idempotent).
        """
        ...

    async def acquire_many(self, requests: Sequence[LeaseRequest]) -> list[Lease | None]:
        """`acquire` for every request, in order, in ONE round trip to the store (a dispatch
        round's batch). Each request is atomic on its own (all its dimensions or none); later
        requests see the slots earlier ones took. The answer is aligned with `requests`."""
        ...

    async def admit_many(
        self, requests: Sequence[LeaseRequest]
    ) -> list[Lease | WindowRefusal | None]:
        """`acquire_many` that says which window refused a request: a `WindowRefusal` where a
        window of the request's account is full (checked before the dimensions), None where a
        dimension is full or the account is not live."""
        ...

    async def release_many(self, leases: Sequence[Lease], *, unsent: bool = False) -> list[bool]:
        """`release` for every lease in ONE round trip; aligned with `leases`. `unsent`: nothing
        was sent under these leases (no attempt was written), so the window use their acquires
        added goes back too (`leases.windows`)."""
        ...

    async def stamp_send(self, req: LeaseRequest) -> WindowRefusal | None:
        """The attempt `req` names is being sent now: its rolling window entries count from now
        (a submit counts from when it leaves, `leases.windows`), and a window that no longer
        counts it (its admission is older than the span) must have room for it again: else the
        refusal, and nothing changes. No windows in `req`: nothing to do."""
        ...

    async def window_usage(self, account: str) -> list[WindowUse]:
        """Each window's use in `account` now (`windows.WINDOWS` order) and the limit the last
        acquire there carried (None: none set, or no acquire with windows yet)."""
        ...

    async def renew(self, lease: Lease) -> Lease | None:
        """Extend expiry to now + ttl, capped at acquired_at + max_term. None if not held.

        Held means the record's token AND fencing token are the lease's: a stale holder is refused.
        """
        ...

    async def release(self, lease: Lease) -> bool:
        """Return the slots once. True if this call released them; False if gone or not ours
        (another token or fencing token: a stale holder changes nothing)."""
        ...

    async def is_live(self, account: str) -> bool:
        """True once `restore` marked the account live and the store has not lost it since."""
        ...

    async def restore(
        self,
        account: str,
        holders: Sequence[HeldLease],
        *,
        ttl_ms: int,
        max_term_ms: int,
        unknown_cap: int | None = None,
        windows: Sequence[WindowEntry] = (),
    ) -> list[str]:
        """Rebuild the leases of `holders` that the store lacks, then mark the account live.

        In one atomic step per account: each holder without a record gets one again with its own
        token and fencing token (expiring `ttl_ms` from now) and its slots counted, unsent holders
        only if the account was not live (see `HeldLease.sent`); holders whose record exists are
        left alone; the fence counter rises past every holder's token; the
        unknown budget's cap is set when given; and, only if the account was not live, the
        `windows` entries are counted in its windows (each attempt once, those of an earlier
        month not in the spend). Returns the attempt ids whose lease was rebuilt.
        Counters the holders do not explain are the reconciler's to correct, not this call's.
        """
        ...

    async def mark_unknown(self, lease: Lease, unknown_cap: int) -> bool:
        """Move the lease's slots into the account's unknown budget (9.11.3). Idempotent.

        Return False, and leave the lease confirmed, when the budget of `unknown_cap` slots cannot
        take it. After that, and whenever the budget is full, `accepting_new(account)` is False.
        Raise LeaseLostError if the lease is not held.
        """
        ...

    async def resolve_unknown(self, lease: Lease) -> bool:
        """Move an unknown lease back to confirmed (the provider answered). False if it was not."""
        ...

    async def accepting_new(self, account: str) -> bool:
        """False while the unknown budget is full or refused a mark_unknown since it drained."""
        ...

    async def reclaim_expired(self, now_ms: int | None = None) -> list[str]:
        """Return the slots of every expired lease in every account; give back their attempt ids.

        `now_ms` overrides the store clock, for tests and replays. Production callers pass None.
        """
        ...

    async def used(self, account: str, dimension_key: str) -> int:
        """Slots currently counted in one dimension of an account (confirmed + unknown)."""
        ...

    async def unknown_used(self, account: str) -> int:
        """Slots currently counted in the account's unknown_submission_slots budget."""
        ...

    async def snapshot(self, account: str) -> AccountSnapshot:
        """Read all counters and lease records of an account in one consistent step."""
        ...

    async def accounts(self) -> list[str]:
        """Every account that has been used with this store (namespace)."""
        ...

    async def set_used(self, account: str, dimension_key: str, value: int) -> None:
        """Overwrite a dimension counter (operators, tests). The reconciler uses `adjust_used`."""
        ...

    async def adjust_used(self, account: str, dimension_key: str, delta: int) -> int:
        """Atomically add `delta` to a dimension counter, clamped at 0. Return the new value."""
        ...

    async def set_unknown_used(self, account: str, value: int) -> None:
        """Overwrite the account's unknown budget counter."""
        ...

    async def adjust_unknown_used(self, account: str, delta: int) -> int:
        """Atomically add `delta` to the unknown budget counter, clamped at 0. Return the value."""
        ...


class LeaseStoreFactory(Protocol):
    """Builds a lease store whole, with what it reports given at construction (the scheduling
    runtime passes its own hooks; both stores' classes, partially applied, are factories):

    * `fail_closed`: refuse acquires in accounts that are not live (only where something
      restores them);
    * `on_not_live`: told the account whenever a fail-closed acquire is refused there (time to
      restore it);
    * `on_freed`: told the account whenever slots there came back (a release, a reclaim of an
      expired lease, also inside an acquire): the dispatcher wakes the tasks parked on it
      (9.12).
    """

    def __call__(
        self,
        *,
        fail_closed: bool = False,
        on_not_live: Callable[[str], None] | None = None,
        on_freed: Callable[[str], None] | None = None,
    ) -> LeaseStore: ...
