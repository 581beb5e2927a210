"""Fair dispatch order for queued generation tasks — design 9.12.

This room decides *which queued task goes next*; it holds no durable state. PostgreSQL is the
queue's source of truth (9.12.4): this structure is an accelerator that can be rebuilt from the
task rows at any time (``FairQueue.rebuild``), optionally warmed with a ``snapshot()`` of the
round-robin state (the dispatcher carries it across rounds and checkpoints it per shard, so a
new leader serves on in the same order; `parse_snapshot` reads a stored one back).

Three levels:

1. Service class. We use *class weights* (weighted deficit round robin across INTERACTIVE,
   STANDARD, BATCH; default 16:4:1) rather than strict priority. Under contention interactive
   work gets ~76% of cost units and is served almost always first, but standard and batch keep a
   guaranteed floor (~19% / ~5%) — the starvation guard is the weight itself, with no timer to tune.
   Idle classes cost nothing: DRR is work-conserving.
2. Tenant. Weighted DRR where a task's cost is ``cost_units`` (expected provider seconds ×
   resolution factor × sample count), so one long 1080p job is not "one task" like a 4 s 720p
   clip. Deficits may go negative (see ``_DrrRing``). A tenant at its max in-flight (over all
   classes, or of the class) is skipped (keeps its place and deficit), never dropped. With
   ``FairQueueConfig.tenants`` (the published tenants document, `domain.tenants`) a tenant's
   weight and in-flight cap are per class.
3. Inside a tenant. Round robin across users; within a user, highest effective priority
   ``base + project priority + min(max_aging_bonus, age / aging_interval)``, then FIFO. The
   project priority (``tenants``, 0 without) ranks the heads of a user's priority groups; a
   group itself stays FIFO, so it never reorders tasks of one (user, base priority).

Hard constraints win over everything: ``pop_next(eligible)`` only returns tasks for which the
caller's predicate holds (a candidate with capacity exists, budget, policy...). Aging only
reorders within a class, so it can never make an ineligible task run.

The dispatcher does not hand this queue the whole backlog (9.12.4): each round it pushes the
heads of every (class, tenant, user, priority) group, read from PostgreSQL, with the tenants'
in-flight counts as numbers (``rebuild(in_flight_counts=...)``). A group whose rows were cut
short is *partial*: when its loaded rows run out it stays in the queue, empty but *pending*, so
its user keeps its turn and its tenant its place and deficit. Only when a pop would have to look
at a pending group (its turn has come) does ``pop_next`` stop, with the ring state as before
that pop and ``drained`` naming the group, until the caller ``refill``s it with the group's next
rows from the database (or ends the round). So the order is exactly that of a queue holding
every row, and rows are read only for groups actually served again.
"""

from __future__ import annotations

import math
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from functools import partial
from typing import Protocol, TypedDict, cast

Clock = Callable[[], float]
Eligible = Callable[["QueuedTask"], bool]
# A group of the durable queue: service class value, tenant, user, base priority.
GroupKey = tuple[str, str, str, float]

REFERENCE_PIXELS = 1280 * 720  # a 720p frame has resolution factor 1.0
_EPS = 1e-9


class ServiceClass(StrEnum):
    INTERACTIVE = "INTERACTIVE"
    STANDARD = "STANDARD"
    BATCH = "BATCH"


@dataclass(frozen=True, slots=True)
class QueuedTask:
    task_id: str
    tenant_id: str
    user_id: str
    project_id: str
    service_class: ServiceClass
    priority: float
    cost_units: float
    enqueued_at: float

    def __post_init__(self) -> None:
        if not self.cost_units > 0:
            raise ValueError(f"task {self.task_id}: cost_units must be positive")


def estimate_cost_units(
    duration_s: float, width: int, height: int, sample_count: int, *, runtime_factor: float = 1.0
) -> float:
    """Expected provider seconds × resolution factor × samples.

    ``runtime_factor`` is the historical P50 provider seconds per output second of the model.
    The dispatcher leaves it at 1.0 on purpose (issue 21, item 2): a queued task has no model
    yet (AUTO routing picks one after the pop), and the only runtime the control plane keeps
    is each candidate's mean wall time per job, provider queueing included, so feeding it
    would charge a tenant for the provider's backlog rather than for its task's size, and an
    absolute factor would rescale every cost against the quantum. The sound form, if wanted:
    charge in `scheduling.round_charges` (where the chosen candidate is known) with the model's
    P50 *running* seconds per output second divided by the fleet's median, so an average task
    still costs its output seconds and the weights keep meaning shares of provider time.
    """
    if duration_s <= 0 or width <= 0 or height <= 0 or sample_count <= 0 or runtime_factor <= 0:
        raise ValueError("duration, size, samples and runtime_factor must be positive")
    return duration_s * runtime_factor * (width * height / REFERENCE_PIXELS) * sample_count


class TenantShares(Protocol):
    """Per-tenant, per-class shares (`domain.tenants.Tenants` is one); classes by value."""

    def weight(self, tenant_id: str, service_class: str) -> float: ...

    def max_in_flight(self, tenant_id: str, service_class: str) -> int | None: ...

    def project_priority(self, tenant_id: str, project_id: str) -> int: ...


def _default_class_weights() -> dict[ServiceClass, float]:
    return {ServiceClass.INTERACTIVE: 16.0, ServiceClass.STANDARD: 4.0, ServiceClass.BATCH: 1.0}


@dataclass(frozen=True)
class FairQueueConfig:
    class_weights: Mapping[ServiceClass, float] = field(default_factory=_default_class_weights)
    # Cost units granted per unit weight per round. Smaller is smoother, larger is burstier.
    quantum: float = 8.0
    tenant_weights: Mapping[str, float] = field(default_factory=dict)
    default_tenant_weight: float = 1.0
    tenant_max_in_flight: Mapping[str, int] = field(default_factory=dict)
    default_max_in_flight: int | None = None
    max_aging_bonus: float = 3.0
    aging_interval_s: float = 60.0
    # The tenants document: per-class weights and caps, project priorities. When set, its
    # weights replace `tenant_weights`; the caps above still apply over all classes.
    tenants: TenantShares | None = None

    def __post_init__(self) -> None:
        weights = [*self.class_weights.values(), *self.tenant_weights.values()]
        if self.quantum <= 0 or self.default_tenant_weight <= 0 or any(w <= 0 for w in weights):
            raise ValueError("quantum and weights must be positive")
        if set(self.class_weights) != set(ServiceClass):
            raise ValueError("class_weights needs a weight for every service class")
        if self.aging_interval_s <= 0 or self.max_aging_bonus < 0:
            raise ValueError("aging_interval_s must be positive and max_aging_bonus non-negative")

    def tenant_weight(self, tenant_id: str, service_class: ServiceClass | None = None) -> float:
        if self.tenants is not None and service_class is not None:
            return self.tenants.weight(tenant_id, service_class.value)
        return self.tenant_weights.get(tenant_id, self.default_tenant_weight)

    def class_max_in_flight(self, tenant_id: str, service_class: ServiceClass) -> int | None:
        return (
            None
            if self.tenants is None
            else self.tenants.max_in_flight(tenant_id, service_class.value)
        )

    def project_priority(self, task: QueuedTask) -> float:
        if self.tenants is None or not task.project_id:
            return 0.0
        return float(self.tenants.project_priority(task.tenant_id, task.project_id))

    def max_in_flight(self, tenant_id: str) -> int | None:
        return self.tenant_max_in_flight.get(tenant_id, self.default_max_in_flight)


def effective_priority(task: QueuedTask, now: float, config: FairQueueConfig) -> float:
    age = max(0.0, now - task.enqueued_at)
    aging = min(config.max_aging_bonus, age / config.aging_interval_s)
    return task.priority + config.project_priority(task) + aging


class RingState(TypedDict):
    order: list[str]
    ptr: int
    turn_open: bool
    deficits: dict[str, float]
    debts: dict[str, float]


class FairQueueSnapshot(TypedDict):
    """JSON-friendly accelerator state: what is lost when Redis is."""

    classes: RingState
    tenants: dict[str, RingState]
    users: dict[str, dict[str, list[str]]]  # class -> tenant -> user round-robin order


class _DrrRing:
    """Weighted deficit round robin over named flows, one dispatch at a time.

    Deviation from the 9.12.2 pseudo-code, on purpose: a flow serves its head whenever its deficit
    is positive and may overdraw, repaying the debt in later rounds (the fq_codel form of DRR).
    Long-run shares are the same as with "cost <= deficit" — each flow stays within one quantum
    plus one largest task of its ideal — but a light tenant's one large task is not held back for
    several rounds behind a flooding tenant. In our 80%-load simulation this lowered a light
    tenant's flood/calm p99-wait ratio from 1.5-1.9x to 1.3-1.6x.

    ``select`` brings the ring to a state where the flow under the pointer can afford its head
    and returns it without dispatching, so it is idempotent until ``charge`` is called. Flows
    with no eligible head are skipped and get no quantum, so blocked flows cannot bank credit.
    """

    def __init__(self, quantum: float, weight: Callable[[str], float]) -> None:
        self._quantum, self._weight = quantum, weight
        self.order: list[str] = []
        self.ptr = 0
        self.turn_open = False
        self.deficits: dict[str, float] = {}
        # Overdraft of flows that emptied. Credit is forfeited on leaving the ring (classic DRR)
        # but debt is kept: else a tenant that empties after each big task would never repay.
        self.debts: dict[str, float] = {}

    def __len__(self) -> int:
        return len(self.order)

    def activate(self, flow: str) -> None:
        if flow not in self.deficits:
            self.order.append(flow)
            self.deficits[flow] = self.debts.pop(flow, 0.0)

    def deactivate(self, flow: str) -> None:
        """A flow with nothing queued leaves the ring, forfeiting credit but keeping debt."""
        idx = self.order.index(flow)
        self.order.pop(idx)
        deficit = self.deficits.pop(flow)
        if deficit < 0:
            self.debts[flow] = deficit
        if idx < self.ptr:
            self.ptr -= 1
        elif idx == self.ptr:
            self.turn_open = False
        if self.ptr >= len(self.order):
            self.ptr = 0

    def charge(self, flow: str, cost: float) -> None:
        self.deficits[flow] -= cost

    def select(self, head: Callable[[str], QueuedTask | None]) -> tuple[str, QueuedTask] | None:
        if not self.order:
            return None
        cache: dict[str, QueuedTask | None] = {}

        def peek(flow: str) -> QueuedTask | None:
            if flow not in cache:
                cache[flow] = head(flow)
            return cache[flow]

        if self.turn_open:
            flow = self.order[self.ptr]
            task = peek(flow)
            if task is not None and self.deficits[flow] > _EPS:
                return flow, task
            self._advance()
        for attempt in range(2):
            for _ in range(len(self.order)):
                flow = self.order[self.ptr]
                task = peek(flow)
                if task is not None:
                    self.deficits[flow] += self._grant(flow)
                    self.turn_open = True
                    if self.deficits[flow] > _EPS:
                        return flow, task
                self._advance()
            if attempt == 0 and not self._jump(peek):
                return None
        raise AssertionError("DRR jump must make a flow ready")  # pragma: no cover

    def _jump(self, peek: Callable[[str], QueuedTask | None]) -> bool:
        """Skip the k-1 whole rounds in which no flow could afford its head, in one step."""
        ready = [(f, t) for f in self.order if (t := peek(f)) is not None]
        if not ready:
            return False
        rounds = min(math.floor(-self.deficits[f] / self._grant(f) + _EPS) + 1 for f, _ in ready)
        for flow, _ in ready:
            self.deficits[flow] += max(0, rounds - 1) * self._grant(flow)
        return True

    def _grant(self, flow: str) -> float:
        return self._quantum * self._weight(flow)

    def _advance(self) -> None:
        self.ptr = (self.ptr + 1) % len(self.order)
        self.turn_open = False

    def state(self) -> RingState:
        return RingState(
            order=list(self.order),
            ptr=self.ptr,
            turn_open=self.turn_open,
            deficits=dict(self.deficits),
            debts=dict(self.debts),
        )

    def reset(self, state: RingState) -> None:
        """Back to exactly `state` (taken by `state()` on this ring)."""
        self.order, self.ptr, self.turn_open = (
            list(state["order"]),
            state["ptr"],
            state["turn_open"],
        )
        self.deficits, self.debts = dict(state["deficits"]), dict(state["debts"])

    def load(self, state: RingState) -> None:
        """Adopt a saved state for the flows active now; new flows keep their place at the end."""
        active = set(self.order)
        saved = [f for f in state["order"] if f in active]
        known = set(saved)
        order = saved + [f for f in self.order if f not in known]
        pointed = state["order"][state["ptr"]] if 0 <= state["ptr"] < len(state["order"]) else None
        self.order = order
        self.deficits = {f: state["deficits"].get(f, 0.0) for f in order}
        self.debts = {f: d for f, d in state["debts"].items() if f not in active}
        if pointed in active:
            self.ptr, self.turn_open = order.index(pointed), state["turn_open"]
        else:
            self.ptr, self.turn_open = 0, False


class _TenantQueue:
    """One tenant's tasks in one class: user round robin, then priority buckets kept FIFO."""

    def __init__(self, service_class: ServiceClass, tenant: str) -> None:
        self.service_class, self.tenant = service_class, tenant
        # An empty bucket is a pending group: rows remain in the database (see the module doc).
        self.users: OrderedDict[str, dict[float, deque[QueuedTask]]] = OrderedDict()
        self.size = 0

    def push(self, task: QueuedTask) -> None:
        bucket = self.users.setdefault(task.user_id, {}).setdefault(task.priority, deque())
        # Same base priority + monotone aging = FIFO order is priority order, so keep it sorted
        # by enqueue time (ties keep push order; usually this is a plain append).
        idx = len(bucket)
        while idx > 0 and bucket[idx - 1].enqueued_at > task.enqueued_at:
            idx -= 1
        bucket.insert(idx, task)
        self.size += 1

    def remove(self, task: QueuedTask, *, served: bool, pending: bool) -> None:
        buckets = self.users[task.user_id]
        buckets[task.priority].remove(task)
        if not buckets[task.priority] and not pending:
            del buckets[task.priority]
        if not buckets:
            del self.users[task.user_id]
        elif served:
            self.users.move_to_end(task.user_id)  # the user's turn is over
        self.size -= 1

    def best(self, eligible: Eligible, now: float, config: FairQueueConfig) -> QueuedTask | None:
        for user, buckets in self.users.items():
            best: tuple[float, float, int, str] | None = None
            chosen: QueuedTask | None = None
            for priority, bucket in buckets.items():
                if not bucket:
                    raise _NeedRows((self.service_class.value, self.tenant, user, priority))
                task = next((t for t in bucket if eligible(t)), None)
                if task is None:
                    continue
                rank = (-effective_priority(task, now, config), *_fifo(task))
                if best is None or rank < best:
                    best, chosen = rank, task
            if chosen is not None:
                return chosen
        return None


def _always(_: QueuedTask) -> bool:
    return True


class _NeedRows(Exception):
    """A pop reached a pending group; pop_next undoes the pop's ring moves and reports it."""

    def __init__(self, group: GroupKey) -> None:
        super().__init__(group)
        self.group = group


def _fifo(task: QueuedTask) -> tuple[float, int, str]:
    """Arrival order; ties (one bulk insert) by id, numerically for decimal ids ("9" < "10")."""
    return task.enqueued_at, len(task.task_id), task.task_id


def _group(task: QueuedTask) -> GroupKey:
    return (task.service_class.value, task.tenant_id, task.user_id, task.priority)


def parse_snapshot(raw: object) -> FairQueueSnapshot | None:
    """A stored snapshot if it has the shape `restore` reads, else None (start afresh)."""

    def ring(r: object) -> bool:
        return (
            isinstance(r, dict)
            and isinstance(r.get("order"), list)
            and isinstance(r.get("ptr"), int)
            and isinstance(r.get("turn_open"), bool)
            and isinstance(r.get("deficits"), dict)
            and isinstance(r.get("debts"), dict)
            and all(isinstance(v, int | float) for v in r["deficits"].values())
            and all(isinstance(v, int | float) for v in r["debts"].values())
        )

    if not isinstance(raw, dict):
        return None
    classes, tenants, users = raw.get("classes"), raw.get("tenants"), raw.get("users")
    if not (ring(classes) and isinstance(tenants, dict) and isinstance(users, dict)):
        return None
    if not all(ring(r) for r in tenants.values()):
        return None
    for by_tenant in users.values():
        if not isinstance(by_tenant, dict) or not all(
            isinstance(order, list) for order in by_tenant.values()
        ):
            return None
    return cast(FairQueueSnapshot, raw)


class FairQueue:
    def __init__(self, config: FairQueueConfig, clock: Clock) -> None:
        self.config, self._clock = config, clock
        self._classes = _DrrRing(config.quantum, lambda c: config.class_weights[ServiceClass(c)])
        self._tenants = {
            c: _DrrRing(config.quantum, partial(config.tenant_weight, service_class=c))
            for c in ServiceClass
        }
        self._queues: dict[tuple[ServiceClass, str], _TenantQueue] = {}
        self._queued: dict[str, QueuedTask] = {}
        self._in_flight: dict[str, set[str]] = {}
        self._in_flight_base: dict[str, int] = {}  # counted by the database, ids unknown
        # Per (tenant, class value): the database's count plus this queue's pops.
        self._class_in_flight: dict[tuple[str, str], int] = {}
        self._partial: frozenset[GroupKey] = frozenset()
        self.drained: GroupKey | None = None  # a pending group a pop needs rows of

    @classmethod
    def rebuild(
        cls,
        config: FairQueueConfig,
        clock: Clock,
        queued: Iterable[QueuedTask],
        in_flight: Iterable[QueuedTask] = (),
        snapshot: FairQueueSnapshot | None = None,
        *,
        in_flight_counts: Mapping[str, int] | None = None,
        class_in_flight_counts: Mapping[tuple[str, str], int] | None = None,
        partial: Iterable[GroupKey] = (),
    ) -> FairQueue:
        """Recreate the accelerator from database rows; flows are ordered by their oldest task.

        `queued` may be only the heads of each group; `partial` names the groups that hold more
        rows than were passed. `in_flight_counts` gives running tasks per tenant as numbers,
        `class_in_flight_counts` per (tenant, service class value)."""
        queue = cls(config, clock)
        for task in sorted(queued, key=_fifo):
            queue.push(task)
        queue._class_in_flight = {k: n for k, n in (class_in_flight_counts or {}).items() if n > 0}
        for task in in_flight:
            queue._in_flight.setdefault(task.tenant_id, set()).add(task.task_id)
            queue._count_class(task, 1)
        queue._in_flight_base = {t: n for t, n in (in_flight_counts or {}).items() if n > 0}
        queue._partial = frozenset(partial)
        if snapshot is not None:
            queue.restore(snapshot)
        return queue

    def __len__(self) -> int:
        return len(self._queued)

    def __contains__(self, task_id: object) -> bool:
        return task_id in self._queued

    def in_flight(self, tenant_id: str, service_class: ServiceClass | None = None) -> int:
        """The tenant's tasks in flight, over all classes or of `service_class`."""
        if service_class is not None:
            return self._class_in_flight.get((tenant_id, service_class.value), 0)
        return self._in_flight_base.get(tenant_id, 0) + len(self._in_flight.get(tenant_id, ()))

    def _count_class(self, task: QueuedTask, delta: int) -> None:
        key = (task.tenant_id, task.service_class.value)
        n = self._class_in_flight.get(key, 0) + delta
        if n > 0:
            self._class_in_flight[key] = n
        else:
            self._class_in_flight.pop(key, None)

    def push(self, task: QueuedTask) -> None:
        if task.task_id in self._queued or task.task_id in self._in_flight.get(task.tenant_id, ()):
            raise ValueError(f"task {task.task_id} is already queued or in flight")
        key = (task.service_class, task.tenant_id)
        queue = self._queues.get(key)
        if queue is None:
            queue = self._queues[key] = _TenantQueue(*key)
        queue.push(task)
        self._queued[task.task_id] = task
        self._tenants[task.service_class].activate(task.tenant_id)
        self._classes.activate(task.service_class)

    def remove(self, task_id: str) -> QueuedTask | None:
        """Drop a queued task (cancelled, expired) without charging anyone for it."""
        task = self._queued.get(task_id)
        if task is not None:
            self._take(task, served=False)
        return task

    def pop_next(self, eligible: Eligible | None = None) -> QueuedTask | None:
        """The next task to dispatch, marked in flight; ``None`` if nothing eligible can go.

        Also ``None`` when the pop would need a pending group's rows: ``drained`` names it, and
        the pop is undone until `refill`."""
        if self.drained is not None:
            return None
        check = eligible or _always
        now = self._clock()
        inner: dict[str, tuple[str, QueuedTask] | None] = {}

        def class_head(name: str) -> QueuedTask | None:
            service_class = ServiceClass(name)

            def tenant_head(tenant: str) -> QueuedTask | None:
                limit = self.config.max_in_flight(tenant)
                if limit is not None and self.in_flight(tenant) >= limit:
                    return None
                cap = self.config.class_max_in_flight(tenant, service_class)
                if cap is not None and self.in_flight(tenant, service_class) >= cap:
                    return None
                return self._queues[(service_class, tenant)].best(check, now, self.config)

            inner[name] = self._tenants[service_class].select(tenant_head)
            picked = inner[name]
            return None if picked is None else picked[1]

        rings = self._classes.state(), {c: r.state() for c, r in self._tenants.items()}
        try:
            chosen = self._classes.select(class_head)
        except _NeedRows as need:
            self._classes.reset(rings[0])
            for c, ring in self._tenants.items():
                ring.reset(rings[1][c])
            self.drained = need.group
            return None
        if chosen is None:
            return None
        service_class, task = chosen
        self._classes.charge(service_class, task.cost_units)
        self._tenants[ServiceClass(service_class)].charge(task.tenant_id, task.cost_units)
        self._take(task, served=True)
        self._in_flight.setdefault(task.tenant_id, set()).add(task.task_id)
        self._count_class(task, 1)
        return task

    def refill(self, group: GroupKey, tasks: Iterable[QueuedTask], *, partial: bool) -> None:
        """A pending `group`'s next rows (`partial`: it may hold still more); pops resume.

        It kept its user's turn and its tenant's place meanwhile, so a refill changes no order;
        found empty after all, it leaves now as it would have when its last row was taken."""
        for task in tasks:
            self.push(task)
        self.drained = None
        if partial:
            return
        self._partial = self._partial - {group}
        service_class, tenant, user, priority = ServiceClass(group[0]), *group[1:]
        queue = self._queues.get((service_class, tenant))
        buckets = queue.users.get(str(user)) if queue is not None else None
        if queue is None or buckets is None or buckets.get(float(priority)) != deque():
            return
        del buckets[float(priority)]
        if not buckets:
            del queue.users[str(user)]
        if not queue.users:
            self._leave(service_class, tenant)

    def pop_batch(self, limit: int, eligible: Eligible | None = None) -> list[QueuedTask]:
        """Up to `limit` pops in order (one round's take)."""
        out: list[QueuedTask] = []
        while len(out) < limit and (task := self.pop_next(eligible)) is not None:
            out.append(task)
        return out

    def on_finished(self, task: QueuedTask) -> bool:
        """Release the task's in-flight slot; repeated notifications are harmless."""
        running = self._in_flight.get(task.tenant_id)
        if running is None or task.task_id not in running:
            return False
        running.discard(task.task_id)
        self._count_class(task, -1)
        if not running:
            del self._in_flight[task.tenant_id]
        return True

    def snapshot(self) -> FairQueueSnapshot:
        users: dict[str, dict[str, list[str]]] = {}
        for (service_class, tenant), queue in self._queues.items():
            users.setdefault(service_class.value, {})[tenant] = list(queue.users)
        return FairQueueSnapshot(
            classes=self._classes.state(),
            tenants={c.value: ring.state() for c, ring in self._tenants.items()},
            users=users,
        )

    def restore(self, snapshot: FairQueueSnapshot) -> None:
        self._classes.load(snapshot["classes"])
        for service_class, ring in self._tenants.items():
            if service_class.value in snapshot["tenants"]:
                ring.load(snapshot["tenants"][service_class.value])
        for (service_class, tenant), queue in self._queues.items():
            saved = snapshot["users"].get(service_class.value, {}).get(tenant, [])
            for user in reversed([u for u in saved if u in queue.users]):
                queue.users.move_to_end(user, last=False)

    def _take(self, task: QueuedTask, *, served: bool) -> None:
        key = (task.service_class, task.tenant_id)
        queue = self._queues[key]
        queue.remove(task, served=served, pending=_group(task) in self._partial)
        del self._queued[task.task_id]
        if not queue.users:
            self._leave(task.service_class, task.tenant_id)

    def _leave(self, service_class: ServiceClass, tenant: str) -> None:
        del self._queues[(service_class, tenant)]
        ring = self._tenants[service_class]
        ring.deactivate(tenant)
        if not ring:
            self._classes.deactivate(service_class)
