"""The control plane's Prometheus metrics (design 9.24): the families and their one registry.

`ControlPlaneMetrics` owns its own `CollectorRegistry` (never the process-global one), so tests
and several control planes in one process never collide. Split by concern:

* here: the families events feed -- the dispatcher's decisions and failovers, the submit and
  generation outcomes, lease reconciliation, breaker transitions;
* `controlplane.metrics_state`: the gauges read at scrape time from the lease store and the
  breakers (capacity, active leases, unknown slots, breaker states);
* `controlplane.metrics_observers`: the execution engine's hooks that feed the families;
* `controlplane.service.cost_gauges`: the cost families (cost per success, retry cost,
  reconciliation delta), computed from the ledgers once per period, never per scrape;
* `vidroute_core.wire.grpc_metrics`: the gRPC server families and interceptor, shared with the
  sidecars.

Labels are bounded by configuration (provider, model, reason, outcome, error class, operation,
service class, gRPC method and code): never a task, job or attempt id (9.24: those belong in logs
and trace attributes; `tests/unit/test_metrics_families.py` checks every family).

`vidroute_core.metrics_http.serve_metrics` exposes the registry over HTTP; the composition root
starts it when ``VIDROUTE_METRICS_LISTEN`` is set.
"""

from __future__ import annotations

import threading
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field

import grpc
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from controlplane.metrics_observers import attempt_end_observer, chain, submit_observer
from controlplane.metrics_state import (
    CIRCUIT_VALUES,
    CircuitGauge,
    LeaseGauge,
    StateCollector,
    StateSources,
    WindowGauge,
    circuit_gauges,
    drift_deltas,
    lease_gauges,
    split_lease_account,
    window_gauges,
)
from vidroute_core.wire.grpc_metrics import GrpcServerMetrics

__all__ = [
    "CIRCUIT_VALUES",
    "FORBIDDEN_LABELS",
    "CircuitGauge",
    "ControlPlaneMetrics",
    "LeaseGauge",
    "StateCollector",
    "StateSources",
    "WindowGauge",
    "attempt_end_observer",
    "chain",
    "circuit_gauges",
    "drift_deltas",
    "lease_gauges",
    "split_lease_account",
    "submit_observer",
    "window_gauges",
]

# Seconds buckets from a fast submit to a long generation (Veo takes minutes).
_SUBMIT_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
_SCORE_BUCKETS = (0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)  # shipped weights sum to 1
_GENERATION_BUCKETS = (5, 15, 30, 60, 120, 300, 600, 1200, 3600)
# Labels that would make one series per task: refused in every family.
FORBIDDEN_LABELS = frozenset(
    {"task_id", "attempt_id", "job_id", "provider_job_id", "provider_request_id",
     "client_request_key", "route_decision_id", "request_id", "trace_id", "idempotency_key"}
)  # fmt: skip


@dataclass
class _Ratios:
    finished: defaultdict[tuple[str, str], int] = field(default_factory=lambda: defaultdict(int))
    succeeded: defaultdict[tuple[str, str], int] = field(default_factory=lambda: defaultdict(int))


class ControlPlaneMetrics:
    """Every family of 9.24 the control plane reports, on a registry of its own."""

    def __init__(
        self, registry: CollectorRegistry | None = None, *, state: StateSources | None = None
    ) -> None:
        """`state`: where the scrape-time gauges (leases, windows, accounts, breakers) are read,
        registered as a `StateCollector` (None: none here; the composition root registers one
        once the parts it reads are built, since they take these metrics themselves)."""
        self.registry = registry or CollectorRegistry()
        r, pm = self.registry, ["provider", "model"]
        self.decisions = Counter(
            "scheduler_decision", "Routing decisions", ["provider", "model", "reason"], registry=r
        )
        self.no_candidate = Counter(
            "scheduler_no_candidate", "Decisions without a candidate", ["reason"], registry=r
        )
        # The selected candidate's total score (9.24, issue 26): a model whose scores drift
        # down is losing on some component before it loses traffic. No id labels.
        self.route_score = Histogram(
            "scheduler_route_score",
            "Total score of the selected candidate of each routing decision",
            pm,
            buckets=_SCORE_BUCKETS,
            registry=r,
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
        # Beyond 9.24: the gauge above only shows the last pass; this says passes are running
        # (a stalled reconciler leaves it flat) and lets a Redis loss be measured in passes.
        self.reconcile_passes = Counter(
            "provider_lease_reconcile_passes",
            "Lease reconciliation passes completed (periodic, and rebuilds after a lost store)",
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
        # The three cost families come from the ledgers (controlplane.service.cost_gauges sets
        # them once per period via `unit_costs` / `reconciliation_deltas`), not from events.
        self.cost_per_success = Gauge(
            "provider_cost_per_success",
            "Unit cost of successful delivery (micros, 9.23) over the last 24 h of the ledger",
            pm,
            registry=r,
        )
        self.retry_cost = Gauge(
            "provider_retry_cost_micros",
            "Provider cost of failed and cancelled jobs over the last 24 h of the usage ledger",
            pm,
            registry=r,
        )
        self.reconciliation_delta = Gauge(
            "provider_reconciliation_delta_micros",
            "Billed minus expected provider cost (micros) of the latest reconciled day",
            ["provider"],
            registry=r,
        )
        # Beyond 9.24: the net delta hides offsetting errors (a duplicate charge and a missing
        # one net 0); alerts read every discrepancy row by kind instead.
        self.reconciliation_discrepancies = Counter(
            "provider_reconciliation_discrepancies",
            "Discrepancy rows written by the daily reconciliation, by provider and kind",
            ["provider", "kind"],
            registry=r,
        )
        # Caller verdicts of each model's whole mode (9.14), set by the dispatcher's quality book
        # on each read of the aggregates (`quality_ratios`).
        pmm = ["provider", "model", "mode"]
        self.user_acceptance = Gauge(
            "model_user_acceptance_ratio",
            "Accepted / caller verdicts (accepted, rejected, regenerated) of a model's mode",
            pmm,
            registry=r,
        )
        self.regeneration = Gauge(
            "model_regeneration_ratio",
            "Regenerated / caller verdicts of a model's mode",
            pmm,
            registry=r,
        )
        # Each tenant's limits and use (9.12; `service.tenant_limits`): labels bounded by the
        # tenants document (unnamed tenants are "(default)", past 100 named ones "(other)");
        # service_class "" for a tenant-wide figure (the CreateTask rate).
        tcl = ["tenant", "service_class"]
        self.tenant_limit = Gauge(
            "tenant_limit",
            "A tenant's configured limit: weight, max_in_flight, max_queued, create_per_second",
            [*tcl, "limit"],
            registry=r,
        )
        self.tenant_use = Gauge(
            "tenant_use",
            "A tenant's current use: in_flight and queued tasks, create_per_second (last minute)",
            [*tcl, "use"],
            registry=r,
        )
        self.circuit_transitions = Counter(
            "provider_circuit_transitions",
            "Breaker state changes this replica made",
            ["provider", "model", "operation", "to"],
            registry=r,
        )
        # Beyond 9.24: how often an account's rate or budget window (9.11) refused an acquire;
        # the windows' use and limits are scrape-time gauges (`metrics_state.window_gauges`).
        self.window_refusals = Counter(
            "provider_window_refusals",
            "Lease acquires refused because an account's rate or budget window was full",
            ["provider", "account", "window"],
            registry=r,
        )
        # grpc_server_started_total / _handled_total / _handling_seconds, as every server has.
        # Beyond 9.24: what each stage costs the database (`persistence.statement_tally`), so
        # a benchmark reads statements, transactions and round trips per stage per task.
        self.db_work = Counter(
            "controlplane_db",
            "Statements, transactions and round trips sent to the database, by stage",
            ["stage", "kind"],
            registry=r,
        )
        self.grpc = GrpcServerMetrics(r)
        self.rpc_handled = self.grpc.handled
        self.rpc_latency = self.grpc.handling
        if state is not None:
            r.register(StateCollector(state))
        self._ratios = _Ratios()
        self._lock = threading.Lock()
        self._queue_classes: set[str] = set()
        self._throttled_keys: set[tuple[str, str]] = set()
        self._delta_keys: set[tuple[str, str]] = set()
        self._cost_keys: set[tuple[str, str]] = set()
        self._recon_providers: set[str] = set()

    # ---- events --------------------------------------------------------------------------

    def decision(self, provider: str, model: str, reason: str, score: float | None = None) -> None:
        self.decisions.labels(provider, model, reason).inc()
        if score is not None:
            self.route_score.labels(provider, model).observe(score)

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
        self.reconcile_passes.inc()
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
        """A finished provider job. `cost_micros` is not counted here: cost is the ledgers'
        (`unit_costs`), so every replica reports the same figure and a restart loses none."""
        key = (provider, model)
        self.generation_latency.labels(*key).observe(max(0.0, seconds))
        with self._lock:
            r = self._ratios
            r.finished[key] += 1
            r.succeeded[key] += int(succeeded)
            self.success_ratio.labels(*key).set(r.succeeded[key] / r.finished[key])

    def unit_costs(self, figures: Mapping[tuple[str, str], tuple[int, int]]) -> None:
        """``(provider, model) -> (cost per success, retry cost)`` micros; others drop to 0."""
        for key in self._cost_keys - set(figures):
            self.cost_per_success.labels(*key).set(0)
            self.retry_cost.labels(*key).set(0)
        for key, (per_success, retry) in figures.items():
            self.cost_per_success.labels(*key).set(per_success)
            self.retry_cost.labels(*key).set(retry)
        self._cost_keys |= set(figures)

    def reconciliation_deltas(self, deltas: Mapping[str, int]) -> None:
        """``provider -> billed - expected`` micros of the latest reconciled day."""
        for provider in self._recon_providers - set(deltas):
            self.reconciliation_delta.labels(provider).set(0)
        for provider, delta in deltas.items():
            self.reconciliation_delta.labels(provider).set(delta)
        self._recon_providers |= set(deltas)

    def tenant_limits(
        self,
        limits: Mapping[tuple[str, str, str], float],
        uses: Mapping[tuple[str, str, str], float],
    ) -> None:
        """``(tenant, class, name) -> value`` of every limit and use; a series that left the
        figures (a limit removed, a tenant dropped from the document) is removed, not frozen."""
        for gauge, figures in ((self.tenant_limit, limits), (self.tenant_use, uses)):
            gauge.clear()
            for key, value in figures.items():
                gauge.labels(*key).set(value)

    def reconciliation_discrepancies_written(self, counts: Mapping[tuple[str, str], int]) -> None:
        """``(provider, kind) -> rows`` written since the last call."""
        for (provider, kind), n in counts.items():
            self.reconciliation_discrepancies.labels(provider, kind).inc(n)

    def quality_ratios(self, figures: Mapping[tuple[str, str, str], tuple[float, float]]) -> None:
        """``(provider, model, mode) -> (user acceptance, regeneration)`` ratios; series that
        left the figures keep their last value (verdicts are never deleted)."""
        for key, (accepted, regenerated) in figures.items():
            self.user_acceptance.labels(*key).set(accepted)
            self.regeneration.labels(*key).set(regenerated)

    def window_refused(self, provider: str, account: str, window: str) -> None:
        self.window_refusals.labels(provider, account, window).inc()

    def circuit_transition(self, provider: str, model: str, operation: str, to: str) -> None:
        self.circuit_transitions.labels(provider, model, operation, to).inc()

    # ---- gRPC ----------------------------------------------------------------------------

    def interceptor(self) -> grpc.aio.ServerInterceptor:
        """Counts and times every RPC (outermost, so it sees the code the client sees)."""
        return self.grpc.interceptor()
