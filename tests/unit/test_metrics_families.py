"""The control plane's metric families (design 9.24): names, labels, scrape-time state.

Every family registered on `ControlPlaneMetrics.registry` is checked against the id deny list,
so a family added later with a task, job or attempt id as a label fails here.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from types import SimpleNamespace

from prometheus_client import CollectorRegistry

from controlplane.domain.breaker import BreakerKey, BreakerState, Operation
from controlplane.leases import Dimension, LeaseRequest, MemoryLeaseStore, WindowRequest
from controlplane.leases.reconciler import Drift
from controlplane.metrics import (
    FORBIDDEN_LABELS,
    CircuitGauge,
    ControlPlaneMetrics,
    StateSources,
    circuit_gauges,
    drift_deltas,
    window_gauges,
)

# The 9.24 families, plus the breaker transitions and the gRPC server families.
DESIGN_FAMILIES = {
    "scheduler_decision_total",
    "scheduler_no_candidate_total",
    "scheduler_queue_age_seconds",
    "scheduler_failover_total",
    "provider_capacity_slots",
    "provider_active_leases",
    "provider_unknown_submission_slots",
    "provider_lease_reconcile_delta",
    "provider_submit_total",
    "provider_submit_latency_seconds",
    "provider_generation_latency_seconds",
    "provider_task_success_ratio",
    "provider_throttled_tasks",
    "provider_circuit_state",
    "provider_cost_per_success",
    "provider_retry_cost_micros",
    "provider_reconciliation_delta_micros",
    "provider_circuit_transitions_total",  # beyond 9.24: a transition outlives a scrape
    "provider_lease_reconcile_passes_total",  # beyond 9.24: a Redis loss measured in passes
    "tenant_limit",  # 9.12's limits beside their use
    "tenant_use",
    "provider_window_refusals_total",  # beyond 9.24: the rate and budget windows of 9.11
    "provider_window_used",
    "provider_window_limit",
    # beyond 9.24: discrepancies by kind, since the net delta hides offsetting errors
    "provider_reconciliation_discrepancies_total",
    "scheduler_route_score",  # issue 26: the selected candidate's score, no id labels
    "grpc_server_started_total",
    "grpc_server_handled_total",
    "grpc_server_handling_seconds",
    "controlplane_db_total",  # beyond 9.24: statements, transactions, round trips by stage
}


def exposed(registry: CollectorRegistry) -> Iterator[tuple[str, dict[str, str], float]]:
    for family in registry.collect():
        for sample in family.samples:
            yield sample.name, dict(sample.labels), sample.value


def sample_names(registry: CollectorRegistry) -> set[str]:
    """Exposed series names, with the histogram/counter suffixes folded to the family name."""
    names = set()
    for family in registry.collect():
        kind = family.type
        names.add(f"{family.name}_total" if kind == "counter" else family.name)
    return names


def filled() -> ControlPlaneMetrics:
    """Metrics with one event of every kind, so every family has at least one series."""
    circuits = StateSources(circuits=lambda: [CircuitGauge("runway", "gen4", "SUBMIT", "OPEN")])
    m = ControlPlaneMetrics(state=circuits)
    m.decision("runway", "gen4", "best_score")
    m.no_candidate_decision("NO_CAPACITY")
    m.failover("runway", "veo", "TRANSIENT_NETWORK")
    m.queue_ages({"STANDARD": 3.0})
    m.throttled_round({("runway", "gen4"): 2})
    m.reconcile_pass({("runway", "gen4"): -1})
    m.submit("runway", "gen4", "ACCEPTED", "", 0.2)
    m.generation("runway", "gen4", succeeded=True, seconds=40, cost_micros=500_000)
    m.generation("runway", "gen4", succeeded=False, seconds=20, cost_micros=100_000)
    m.unit_costs({("runway", "gen4"): (600_000, 100_000)})  # the ledgers' figures
    m.reconciliation_deltas({"runway": -250_000})
    m.reconciliation_discrepancies_written({("runway", "DUPLICATE_CHARGE"): 1})
    m.circuit_transition("runway", "gen4", "SUBMIT", "OPEN")
    m.tenant_limits({("acme", "STANDARD", "weight"): 2.0}, {("acme", "STANDARD", "queued"): 3.0})
    m.rpc_handled.labels("svc", "Get", "OK").inc()
    m.rpc_latency.labels("svc", "Get").observe(0.01)
    m.window_refused("runway", "prod-us", "submits_per_minute")
    m.db_work.labels("poll", "statement").inc()
    return m


def test_every_design_family_is_registered() -> None:
    assert sample_names(filled().registry) >= DESIGN_FAMILIES


def test_no_family_has_an_id_label() -> None:
    m = filled()
    for family in m.registry.collect():
        for sample in family.samples:
            bad = set(sample.labels) & FORBIDDEN_LABELS
            assert not bad, f"{sample.name} labelled by {bad}"
    # The families' declared label names too (a family without samples yet).
    for attr in vars(m).values():
        names = getattr(attr, "_labelnames", ())
        assert not set(names) & FORBIDDEN_LABELS, names


def test_two_instances_do_not_collide() -> None:
    a, b = ControlPlaneMetrics(), ControlPlaneMetrics()
    a.submit("veo", "veo-3", "UNKNOWN", "TRANSIENT_NETWORK", 1.0)
    assert a.submits.labels("veo", "veo-3", "UNKNOWN", "TRANSIENT_NETWORK")._value.get() == 1
    assert not next(iter(b.submits.collect())).samples


def test_ratios_and_retry_cost() -> None:
    m = filled()
    values = {(n, tuple(sorted(labels.items()))): v for n, labels, v in exposed(m.registry)}
    key = (("model", "gen4"), ("provider", "runway"))
    assert values[("provider_task_success_ratio", key)] == 0.5
    assert values[("provider_cost_per_success", key)] == 600_000
    assert values[("provider_retry_cost_micros", key)] == 100_000
    assert values[("provider_reconciliation_delta_micros", (("provider", "runway"),))] == -250_000
    circuit = (("model", "gen4"), ("operation", "SUBMIT"), ("provider", "runway"))
    assert values[("provider_circuit_state", circuit)] == 2.0


def test_round_gauges_fall_back_to_zero() -> None:
    m = ControlPlaneMetrics()
    m.throttled_round({("runway", "gen4"): 3})
    m.throttled_round({})
    m.queue_ages({"STANDARD": 9.0})
    m.queue_ages({})
    assert m.throttled.labels("runway", "gen4")._value.get() == 0
    assert m.queue_age.labels("STANDARD")._value.get() == 0


def test_drift_deltas_by_provider_and_model() -> None:
    drifts = [
        Drift("runway:acct", "model:gen4", 2, 3, -1),
        Drift("runway:other", "model:gen4", 1, 0, 1),
        Drift("runway:acct", "account", 2, 3, -1),
        Drift("veo:x", "model:veo-3", 0, 2, -2),
    ]
    assert drift_deltas(drifts) == {("runway", "gen4"): 0, ("veo", "veo-3"): -2}


def test_circuit_gauges_report_the_worst_state_per_label_set() -> None:
    def status(account: str, state: BreakerState) -> SimpleNamespace:
        return SimpleNamespace(
            key=BreakerKey("runway", account, "", "gen4", Operation.SUBMIT), state=state
        )

    rows = circuit_gauges([status("a", BreakerState.CLOSED), status("b", BreakerState.HALF_OPEN)])
    assert rows == [CircuitGauge("runway", "gen4", "SUBMIT", "HALF_OPEN")]


def test_cost_gauges_come_from_the_ledger_figures_only() -> None:
    """Job events never move the cost gauges; a model gone from the figures drops to 0."""
    m = ControlPlaneMetrics()
    m.generation("veo", "veo-3", succeeded=True, seconds=60, cost_micros=3_200_000)
    assert not next(iter(m.cost_per_success.collect())).samples
    m.unit_costs({("veo", "veo-3"): (3_200_000, 0), ("runway", "gen4"): (250_000, 50_000)})
    m.unit_costs({("runway", "gen4"): (260_000, 50_000)})
    assert m.cost_per_success.labels("veo", "veo-3")._value.get() == 0
    assert m.cost_per_success.labels("runway", "gen4")._value.get() == 260_000
    m.reconciliation_deltas({"veo": 5})
    m.reconciliation_deltas({})
    assert m.reconciliation_delta.labels("veo")._value.get() == 0


def test_window_gauges_report_use_and_limit_per_account_window() -> None:
    """A store's windows become provider_window_used / _limit series per (provider, account,
    window), read at scrape time on the control plane's loop; an account without windows has
    none, and a window without a limit has no limit series."""
    store = MemoryLeaseStore()

    async def fill() -> None:
        windows = WindowRequest(submits_per_minute=3, cost_micros=40)
        await store.acquire(LeaseRequest("a1", "runway:prod-us", (Dimension("account", 4),)))
        await store.acquire(
            LeaseRequest("a2", "runway:prod-us", (Dimension("account", 4),), windows=windows)
        )
        await store.acquire(LeaseRequest("b1", "veo:x", (Dimension("account", 4),)))

    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        asyncio.run_coroutine_threadsafe(fill(), loop).result(5)
        m = ControlPlaneMetrics(state=StateSources(loop=loop, windows=lambda: window_gauges(store)))
        values = {
            (n, tuple(sorted(labels.items()))): v
            for n, labels, v in exposed(m.registry)
            if n.startswith("provider_window_")
        }
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)
        loop.close()
    minute = (("account", "prod-us"), ("provider", "runway"), ("window", "submits_per_minute"))
    spend = (("account", "prod-us"), ("provider", "runway"), ("window", "spend_per_month"))
    assert values[("provider_window_used", minute)] == 1
    assert values[("provider_window_limit", minute)] == 3
    assert values[("provider_window_used", spend)] == 40
    assert ("provider_window_limit", spend) not in values
    assert not any(dict(k[1]).get("provider") == "veo" for k in values)


def test_discrepancies_are_counted_by_provider_and_kind() -> None:
    """Each pass adds the rows written since the last one; offsetting kinds both count."""
    m = ControlPlaneMetrics()
    m.reconciliation_discrepancies_written(
        {("runway", "DUPLICATE_CHARGE"): 1, ("runway", "LOCAL_SUCCESS_WITHOUT_CHARGE"): 1}
    )
    m.reconciliation_discrepancies_written({("runway", "DUPLICATE_CHARGE"): 2})
    counter = m.reconciliation_discrepancies
    assert counter.labels("runway", "DUPLICATE_CHARGE")._value.get() == 3
    assert counter.labels("runway", "LOCAL_SUCCESS_WITHOUT_CHARGE")._value.get() == 1
