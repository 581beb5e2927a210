"""The control plane's Prometheus metrics (design 9.24): the families, their one registry, /metrics.

`ControlPlaneMetrics` owns its own `CollectorRegistry` (never the process-global one), so tests
and several control planes in one process never collide. Events are counted where they happen
(the dispatcher's decisions and failovers, the submit observer, the attempt-end observer); state
(capacity, active leases, unknown slots, breaker states) is read at scrape time by a collector
callback from the lease store and the breaker registry, so a gauge is never stale or forgotten.

Labels are bounded by configuration (provider, model, reason, outcome, error class, operation,
service class, gRPC method and code): never a task, job or attempt id (9.24: those belong in logs
and trace attributes; `tests/unit/test_metrics_families.py` checks every family).

`serve_metrics` exposes the registry over HTTP (prometheus_client's threaded WSGI server, the
fewest moving parts); the composition root starts it when ``VIDROUTE_METRICS_LISTEN`` is set.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import grpc
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from controlplane.execution.outcomes import AttemptEndObserver, SubmitObserver
from controlplane.leases.base import LeaseStore
from controlplane.leases.reconciler import Drift
from controlplane.persistence.records import AccountInfo, AttemptRecord
from vidroute_core.adapter import JobSnapshot, JobState, SubmitOutcome

log = logging.getLogger(__name__)

# Seconds buckets from a fast submit to a long generation (Veo takes minutes).
_SUBMIT_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
_GENERATION_BUCKETS = (5, 15, 30, 60, 120, 300, 600, 1200, 3600)
_RPC_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)
# Breaker states as numbers an alert can compare (0 closed, 1 half open, 2 open).
CIRCUIT_VALUES = {"CLOSED": 0.0, "HALF_OPEN": 1.0, "OPEN": 2.0}
# Labels that would make one series per task: refused in every family.
FORBIDDEN_LABELS = frozenset(
    {"task_id", "attempt_id", "job_id", "provider_job_id", "provider_request_id",
     "client_request_key", "route_decision_id", "request_id", "trace_id", "idempotency_key"}
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class LeaseGauge:
    """One (provider, model) row of lease state read at scrape time."""

    provider: str
    model: str
    capacity: int
    active: int
    unknown: int


@dataclass(frozen=True, slots=True)
class CircuitGauge:
    provider: str
    model: str
    operation: str
    state: str


@dataclass
class StateSources:
    """Where the scrape-time gauges come from; each is optional (an API-only replica has none)."""

    leases: Callable[[], Awaitable[Sequence[LeaseGauge]]] | None = None
    circuits: Callable[[], Sequence[CircuitGauge]] | None = None
    loop: asyncio.AbstractEventLoop | None = None
    timeout_s: float = 2.0


class _StateCollector(Collector):
    """Reads lease and breaker state when Prometheus scrapes (on the HTTP server's thread)."""

    def __init__(self, sources: StateSources) -> None:
        self.sources = sources
        self._last_leases: Sequence[LeaseGauge] = ()

    def describe(self) -> Iterable[Any]:
        return list(self._families([], []))  # names only, so registration checks duplicates

    def collect(self) -> Iterable[Any]:
        return list(self._families(self._leases(), self._circuits()))

    def _leases(self) -> Sequence[LeaseGauge]:
        src = self.sources
        if src.leases is None or src.loop is None or src.loop.is_closed():
            return self._last_leases
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is src.loop:  # scraped from the loop itself: cannot wait on it, use the last
            return self._last_leases
        try:
            future = asyncio.run_coroutine_threadsafe(_call(src.leases), src.loop)
            self._last_leases = future.result(src.timeout_s)
        except Exception:  # a slow or failing store never fails the scrape
            log.warning("lease state for metrics unavailable", exc_info=True)
        return self._last_leases

    def _circuits(self) -> Sequence[CircuitGauge]:
        if self.sources.circuits is None:
            return ()
        try:
            return self.sources.circuits()
        except Exception:
            log.warning("breaker state for metrics unavailable", exc_info=True)
            return ()

    @staticmethod
    def _families(
        leases: Sequence[LeaseGauge], circuits: Sequence[CircuitGauge]
    ) -> Iterator[GaugeMetricFamily]:
        pm = ["provider", "model"]
        capacity = GaugeMetricFamily(
            "provider_capacity_slots", "Concurrency slots configured", labels=pm
        )
        active = GaugeMetricFamily("provider_active_leases", "Leases held now", labels=pm)
        unknown = GaugeMetricFamily(
            "provider_unknown_submission_slots", "Slots held by SUBMIT_UNKNOWN attempts", labels=pm
        )
        for row in leases:
            capacity.add_metric([row.provider, row.model], row.capacity)
            active.add_metric([row.provider, row.model], row.active)
            unknown.add_metric([row.provider, row.model], row.unknown)
        circuit = GaugeMetricFamily(
            "provider_circuit_state",
            "Breaker state: 0 closed, 1 half open, 2 open",
            labels=["provider", "model", "operation"],
        )
        for c in circuits:
            circuit.add_metric([c.provider, c.model, c.operation], CIRCUIT_VALUES.get(c.state, 2.0))
        yield from (capacity, active, unknown, circuit)


async def _call(
    source: Callable[[], Awaitable[Sequence[LeaseGauge]]],
) -> Sequence[LeaseGauge]:
    return await source()


@dataclass
class _Ratios:
    finished: defaultdict[tuple[str, str], int] = field(default_factory=lambda: defaultdict(int))
    succeeded: defaultdict[tuple[str, str], int] = field(default_factory=lambda: defaultdict(int))
    cost: defaultdict[tuple[str, str], int] = field(default_factory=lambda: defaultdict(int))


class ControlPlaneMetrics:
    """Every family of 9.24 the control plane reports, on a registry of its own."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r, pm = self.registry, ["provider", "model"]
        self.decisions = Counter(
            "scheduler_decision", "Routing decisions", ["provider", "model", "reason"], registry=r
        )
        self.no_candidate = Counter(
            "scheduler_no_candidate", "Decisions without a candidate", ["reason"], registry=r
        )
        self.queue_age = Gauge(
            "scheduler_queue_age_seconds",
            "Age of the oldest queued task",
            ["service_class"],
            registry=r,
        )
        self.failovers = Counter(
            "scheduler_failover",
            "Requeued tasks routed again",
            ["from", "to", "reason"],
            registry=r,
        )
        self.reconcile_delta = Gauge(
            "provider_lease_reconcile_delta",
            "Last lease reconciliation's correction (expected - counted slots)",
            pm,
            registry=r,
        )
        self.submits = Counter(
            "provider_submit",
            "Submit calls by outcome",
            ["provider", "model", "outcome", "error_class"],
            registry=r,
        )
        self.submit_latency = Histogram(
            "provider_submit_latency_seconds",
            "Submit call latency",
            pm,
            buckets=_SUBMIT_BUCKETS,
            registry=r,
        )
        self.generation_latency = Histogram(
            "provider_generation_latency_seconds",
            "Request start to terminal state of provider jobs",
            pm,
            buckets=_GENERATION_BUCKETS,
            registry=r,
        )
        self.success_ratio = Gauge(
            "provider_task_success_ratio", "Succeeded / finished provider jobs", pm, registry=r
        )
        self.throttled = Gauge(
            "provider_throttled_tasks",
            "Tasks of the last dispatch round held back for lack of capacity",
            pm,
            registry=r,
        )
        self.cost_per_success = Gauge(
            "provider_cost_per_success",
            "Provider cost (micros) of all finished jobs per succeeded job",
            pm,
            registry=r,
        )
        # A gauge that only grows, so the series keeps the design's name (no ``_total``).
        self.retry_cost = Gauge(
            "provider_retry_cost_micros",
            "Provider cost of jobs that did not succeed (the price of retrying)",
            pm,
            registry=r,
        )
        self.circuit_transitions = Counter(
            "provider_circuit_transitions",
            "Breaker state changes this replica made",
            ["provider", "model", "operation", "to"],
            registry=r,
        )
        self.rpc_handled = Counter(
            "grpc_server_handled",
            "RPCs completed on the server",
            ["grpc_service", "grpc_method", "grpc_code"],
            registry=r,
        )
        self.rpc_latency = Histogram(
            "grpc_server_handling_seconds",
            "RPC handling time on the server",
            ["grpc_service", "grpc_method"],
            buckets=_RPC_BUCKETS,
            registry=r,
        )
        self.state = StateSources()
        r.register(_StateCollector(self.state))
        self._ratios = _Ratios()
        self._lock = threading.Lock()
        self._queue_classes: set[str] = set()
        self._throttled_keys: set[tuple[str, str]] = set()
        self._delta_keys: set[tuple[str, str]] = set()

    # ---- events --------------------------------------------------------------------------

    def decision(self, provider: str, model: str, reason: str) -> None:
        self.decisions.labels(provider, model, reason).inc()

    def no_candidate_decision(self, reason: str) -> None:
        self.no_candidate.labels(reason).inc()

    def failover(self, from_provider: str, to_provider: str, reason: str) -> None:
        self.failovers.labels(from_provider, to_provider, reason or "UNSPECIFIED").inc()

    def queue_ages(self, oldest_by_class: Mapping[str, float]) -> None:
        """One dispatch round's oldest queued task per service class (0 for an emptied class)."""
        for cls in self._queue_classes - set(oldest_by_class):
            self.queue_age.labels(cls).set(0)
        for cls, age in oldest_by_class.items():
            self.queue_age.labels(cls).set(max(0.0, age))
        self._queue_classes |= set(oldest_by_class)

    def throttled_round(self, counts: Mapping[tuple[str, str], int]) -> None:
        for key in self._throttled_keys - set(counts):
            self.throttled.labels(*key).set(0)
        for key, n in counts.items():
            self.throttled.labels(*key).set(n)
        self._throttled_keys |= set(counts)

    def reconcile_pass(self, deltas: Mapping[tuple[str, str], int]) -> None:
        for key in self._delta_keys - set(deltas):
            self.reconcile_delta.labels(*key).set(0)
        for key, delta in deltas.items():
            self.reconcile_delta.labels(*key).set(delta)
        self._delta_keys |= set(deltas)

    def submit(
        self, provider: str, model: str, outcome: str, error_class: str, seconds: float
    ) -> None:
        self.submits.labels(provider, model, outcome, error_class).inc()
        self.submit_latency.labels(provider, model).observe(max(0.0, seconds))

    def generation(
        self, provider: str, model: str, *, succeeded: bool, seconds: float, cost_micros: int
    ) -> None:
        key = (provider, model)
        self.generation_latency.labels(*key).observe(max(0.0, seconds))
        if not succeeded and cost_micros > 0:
            self.retry_cost.labels(*key).inc(cost_micros)
        with self._lock:
            r = self._ratios
            r.finished[key] += 1
            r.succeeded[key] += int(succeeded)
            r.cost[key] += max(0, cost_micros)
            self.success_ratio.labels(*key).set(r.succeeded[key] / r.finished[key])
            if r.succeeded[key]:
                self.cost_per_success.labels(*key).set(r.cost[key] / r.succeeded[key])

    def circuit_transition(self, provider: str, model: str, operation: str, to: str) -> None:
        self.circuit_transitions.labels(provider, model, operation, to).inc()

    # ---- gRPC ----------------------------------------------------------------------------

    def interceptor(self) -> grpc.aio.ServerInterceptor:
        """Counts and times every RPC (outermost, so it sees the code the client sees)."""
        return _RpcMetricsInterceptor(self)


def _split(method: str) -> tuple[str, str]:
    service, _, name = method.lstrip("/").rpartition("/")
    return service or "unknown", name or "unknown"


def _code_name(context: Any, default: grpc.StatusCode) -> str:
    code = context.code()
    if code is None:
        return default.name
    if isinstance(code, grpc.StatusCode):
        return code.name
    by_value = {c.value[0]: c.name for c in grpc.StatusCode}
    return by_value.get(int(code), default.name)


class _RpcMetricsInterceptor(grpc.aio.ServerInterceptor):
    def __init__(self, metrics: ControlPlaneMetrics) -> None:
        self._m = metrics

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[Any]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> Any:
        handler = await continuation(handler_call_details)
        if handler is None:
            return handler
        service, name = _split(handler_call_details.method)
        m = self._m

        def done(started: float, context: Any, default: grpc.StatusCode) -> None:
            m.rpc_handled.labels(service, name, _code_name(context, default)).inc()
            m.rpc_latency.labels(service, name).observe(time.perf_counter() - started)

        if handler.unary_unary is not None:
            inner = handler.unary_unary

            async def unary(request: Any, context: Any) -> Any:
                started, default = time.perf_counter(), grpc.StatusCode.UNKNOWN
                try:
                    response = await inner(request, context)
                    default = grpc.StatusCode.OK
                    return response
                finally:
                    done(started, context, default)

            return grpc.unary_unary_rpc_method_handler(
                unary,
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
        if handler.unary_stream is not None:
            inner_stream = handler.unary_stream

            async def stream(request: Any, context: Any) -> None:
                started, default = time.perf_counter(), grpc.StatusCode.UNKNOWN
                try:
                    produced = inner_stream(request, context)
                    if hasattr(produced, "__aiter__"):
                        async for item in produced:
                            await context.write(item)
                    else:
                        await produced
                    default = grpc.StatusCode.OK
                except asyncio.CancelledError:
                    default = grpc.StatusCode.CANCELLED
                    raise
                finally:
                    done(started, context, default)

            return grpc.unary_stream_rpc_method_handler(
                stream,
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
        return handler


def split_lease_account(account: str) -> str:
    """The provider of a lease account scope ``provider:account``."""
    return account.partition(":")[0]


def _model_of(dimension: str) -> str | None:
    """The model of a lease dimension ``model:<name>``; None for the account total."""
    kind, sep, model = dimension.partition(":")
    return model if sep and kind == "model" else None


def drift_deltas(drifts: Iterable[Drift]) -> dict[tuple[str, str], int]:
    """A reconciliation pass's model-dimension corrections by (provider, model)."""
    out: dict[tuple[str, str], int] = defaultdict(int)
    for d in drifts:
        model = _model_of(d.dimension)
        if model is not None:
            out[(split_lease_account(d.account), model)] += d.delta
    return dict(out)


async def lease_gauges(store: LeaseStore) -> list[LeaseGauge]:
    """Capacity, held and unknown slots per (provider, model), summed over the accounts."""
    rows: dict[tuple[str, str], list[int]] = defaultdict(lambda: [0, 0, 0])
    for account in await store.accounts():
        snap = await store.snapshot(account)
        provider = split_lease_account(account)
        for dimension, capacity in snap.capacity.items():
            if (model := _model_of(dimension)) is not None:
                row = rows[(provider, model)]
                row[0] += capacity
                row[1] += snap.used.get(dimension, 0)
        for lease in snap.leases:
            if lease.unknown:
                for dim in lease.dimensions:
                    if (model := _model_of(dim.key)) is not None:
                        rows[(provider, model)][2] += lease.slots
    return [LeaseGauge(p, m, c, a, u) for (p, m), (c, a, u) in sorted(rows.items())]


def submit_observer(metrics: ControlPlaneMetrics) -> SubmitObserver:
    """The execution engine's submit hook -> provider_submit_total and its latency."""

    async def observe(
        account: AccountInfo, attempt: AttemptRecord, result: SubmitOutcome, took_s: float
    ) -> None:
        error = "" if result.error is None else result.error.error_class.value
        metrics.submit(account.provider, attempt.provider_model, result.kind.value, error, took_s)

    return observe


def attempt_end_observer(metrics: ControlPlaneMetrics) -> AttemptEndObserver:
    """Finished provider jobs -> generation latency, success ratio, cost per success."""

    async def observe(account: AccountInfo, attempt: AttemptRecord, snapshot: JobSnapshot) -> None:
        started = attempt.request_started_at or attempt.created_at
        metrics.generation(
            account.provider,
            attempt.provider_model,
            succeeded=snapshot.state is JobState.SUCCEEDED,
            seconds=(attempt.updated_at - started).total_seconds(),
            cost_micros=snapshot.actual_cost_micros or 0,
        )

    return observe


def circuit_gauges(statuses: Iterable[Any]) -> list[CircuitGauge]:
    """`HealthMonitor.statuses()` rows -> provider_circuit_state rows (worst state per labels)."""
    worst: dict[tuple[str, str, str], str] = {}
    for status in statuses:
        key = (status.key.provider, status.key.model, status.key.operation.value)
        state = str(status.state.value)
        if CIRCUIT_VALUES.get(state, 2.0) >= CIRCUIT_VALUES.get(worst.get(key, "CLOSED"), 0.0):
            worst[key] = state
    return [CircuitGauge(p, m, o, s) for (p, m, o), s in sorted(worst.items())]


def chain(*observers: Callable[..., Awaitable[None]]) -> Callable[..., Awaitable[None]]:
    """One observer that calls each of `observers` in turn (e.g. breakers, then metrics)."""

    async def observe(*args: Any) -> None:
        for observer in observers:
            await observer(*args)

    return observe
