"""Visible decisions (issue 26), on SQLite and PostgreSQL: a real dispatcher decision, read back
through ExplainRoute over gRPC and on the console's decisions page, shows every score
component with its inputs: the predicted p95 and the window it came from with that window's
sample size, the burst window's figures, the quality bucket with each candidate's prior
(capability document or default) against its evidence and the shrunk value, the cost line's
ends, the learned call baselines, and a breaker opened on slow calls.

The catalog is test_quality_routing's two comparable self-hosted models: wan-a (cheaper, the
router's default prior, 12 caller rejections in the task's bucket) and wan-b (a 0.9 prior in
its capability document, no evidence)."""

from __future__ import annotations

import math
import re
from collections.abc import AsyncIterator

import grpc
import httpx
import pytest
import pytest_asyncio

from controlplane.api.auth import Authenticator
from controlplane.api.servicer import SchedulerServicer
from controlplane.console.app import Console
from controlplane.domain.breaker import (
    BreakerConfig,
    BreakerKey,
    BreakerRegistry,
    BreakerState,
    Operation,
)
from controlplane.domain.quality import bucket_key
from controlplane.persistence.catalog import CatalogQueries
from controlplane.persistence.database import Database
from controlplane.scheduling.dispatcher import DispatchOutcome
from controlplane.scheduling.health import HealthMonitor
from controlplane.service.access import SYSTEM
from controlplane.service.console_reads import ConsoleReads
from controlplane.service.tasks import TaskService
from tests.integration.scheduling.support import NOW, dispatch_one
from tests.integration.scheduling.test_quality_routing import (
    A,
    B,
    _dispatcher,
    _documents,
    _reject,
    spec,
)
from vidroute.scheduler.v1 import scheduler_pb2 as pb
from vidroute.scheduler.v1 import scheduler_service_pb2 as api
from vidroute.scheduler.v1 import scheduler_service_pb2_grpc as api_grpc
from vidroute_core.hashing import normalized_spec_hash
from vidroute_core.spec import GenerationSpec
from vidroute_core.wire.status import DomainErrorInterceptor

pytestmark = pytest.mark.timeout(120)

SUBMIT_A = BreakerKey("self_hosted", "gpu-a", "us", "wan-a", Operation.SUBMIT)
SUBMIT_B = BreakerKey("self_hosted", "gpu-a", "us", "wan-b", Operation.SUBMIT)


@pytest_asyncio.fixture
async def stub(db: Database) -> AsyncIterator[api_grpc.SchedulerServiceAsyncStub]:
    """ExplainRoute's real server over the test's database (no authentication: SYSTEM)."""
    server = grpc.aio.server(interceptors=[DomainErrorInterceptor()])
    api_grpc.add_SchedulerServiceServicer_to_server(
        SchedulerServicer(TaskService(db), default_caller=SYSTEM), server
    )
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    try:
        yield api_grpc.SchedulerServiceStub(channel)
    finally:
        await channel.close()
        await server.stop(None)


async def _feed(monitor: HealthMonitor) -> None:
    """wan-a: 10 finished jobs, nine of 30 s and one of 300 s (a fat tail: p95 ~300 s, mean
    57 s), and 25 submits of 1 s (its SUBMIT baseline); wan-b: 5 jobs of 60 s."""
    for seconds in [30.0] * 9 + [300.0]:
        monitor.observe_generation(SUBMIT_A, succeeded=True, duration_s=seconds, cost_micros=1)
    for _ in range(25):
        await monitor.record_outcome(SUBMIT_A, None, 1.0)
    for _ in range(5):
        monitor.observe_generation(SUBMIT_B, succeeded=True, duration_s=60.0, cost_micros=1)


async def _decide(db: Database, dispatcher: object, s: GenerationSpec) -> str:
    async with db.unit(NOW) as u:
        task, _ = await u.create_task(
            s, idempotency_key=f"explain-{s.tenant_id}", spec_hash=normalized_spec_hash(s)
        )
    result = await dispatch_one(dispatcher, task)  # type: ignore[arg-type]  # the Dispatcher `_dispatcher` built
    assert result.outcome is DispatchOutcome.SELECTED
    return str(task.id)


def _by_id(decision: pb.RouteDecision) -> dict[str, pb.CandidateScore]:
    return {c.candidate_id: c for c in decision.candidates}


async def test_explain_route_shows_each_components_inputs(
    db: Database,
    catalogs: CatalogQueries,
    monitor: HealthMonitor,
    stub: api_grpc.SchedulerServiceAsyncStub,
) -> None:
    """ExplainRoute on a real decision: wan-a's p95 (~300 s, not its 57 s mean) from the 15m
    window of 10 samples, the burst window's 10, quality 0.5 (default) against 12 verdicts
    shrunk to its quality component, its 1 s SUBMIT baseline; wan-b's 0.9 from its capability
    document with no evidence; the bucket key; the cheapest estimate as the cost line's end."""
    docs = _documents({"wan-b": 0.9})
    dispatcher, _, _ = await _dispatcher(db, catalogs, monitor, docs)
    await _reject(db, spec("feed", 4), "wan-a", 12)
    await _feed(monitor)
    task = spec("explain", 4)
    task_id = await _decide(db, dispatcher, task)

    reply = await stub.ExplainRoute(api.ExplainRouteRequest(task_id=task_id), timeout=30)
    [decision] = reply.decisions
    assert decision.quality_bucket == bucket_key(task)
    assert decision.selection_reason
    a, b = _by_id(decision)[A], _by_id(decision)[B]

    assert a.health_window == b.health_window == "15m"
    assert a.inputs["window_samples"] == pytest.approx(10.0, rel=0.01)
    assert a.inputs["mean_latency_s"] == pytest.approx(57.0, rel=0.01)
    assert a.inputs["p95_latency_s"] == pytest.approx(300.0, rel=0.1)  # a streaming quantile
    assert a.inputs["burst_samples"] == pytest.approx(10.0, rel=0.1)
    assert a.inputs["burst_success_rate"] == pytest.approx(1.0)
    assert a.inputs["burst_applied"] == 0.0
    assert b.inputs["window_samples"] == pytest.approx(5.0, rel=0.01)
    assert b.inputs["p95_latency_s"] == pytest.approx(60.0, rel=0.1)
    assert a.inputs["latency_bad_s"] > a.inputs["latency_good_s"]

    assert (a.quality_prior_source, a.inputs["quality_prior"]) == ("default", 0.5)
    assert a.inputs["quality_verdicts"] == 12.0
    assert a.inputs["quality_evidence"] >= 12.0
    assert a.inputs["quality_shrunk"] == pytest.approx(a.components["quality"], abs=1e-6)
    assert a.inputs["quality_shrunk"] < 0.5  # pulled below its prior by the rejections
    assert (b.quality_prior_source, b.inputs["quality_prior"]) == ("capability_document", 0.9)
    assert (b.inputs["quality_evidence"], b.inputs["quality_shrunk"]) == (0.0, 0.9)

    estimates = {a.estimated_cost.amount_micros, b.estimated_cost.amount_micros}
    for c in (a, b):
        assert c.inputs["cost_estimate_micros"] == c.estimated_cost.amount_micros
        assert c.inputs["cost_cheapest_micros"] == min(estimates)
        assert c.inputs["capacity_maximum"] > 0

    assert a.call_baselines_s["SUBMIT"] == pytest.approx(1.0, rel=0.1)
    assert dict(b.call_baselines_s) == {}
    assert (a.breaker_opened_for, a.breaker_opened_on_slow_calls) == ("", False)


async def test_a_breaker_opened_on_slow_calls_is_named_in_explain(
    db: Database,
    catalogs: CatalogQueries,
    monitor: HealthMonitor,
    stub: api_grpc.SchedulerServiceAsyncStub,
) -> None:
    """wan-b's submits turn slow (5 s against its 1 s baseline) until its breaker opens: the
    next decision refuses it as CIRCUIT_OPEN and ExplainRoute says it opened on slow calls."""
    docs = _documents({"wan-b": 0.9})
    dispatcher, _, _ = await _dispatcher(db, catalogs, monitor, docs)
    for _ in range(30):
        await monitor.record_outcome(SUBMIT_B, None, 1.0)
    for _ in range(10):
        if monitor.registry.get(SUBMIT_B).state is BreakerState.OPEN:
            break
        await monitor.record_outcome(SUBMIT_B, None, 5.0)
    assert monitor.registry.get(SUBMIT_B).state is BreakerState.OPEN
    task_id = await _decide(db, dispatcher, spec("slow", 4))

    reply = await stub.ExplainRoute(api.ExplainRouteRequest(task_id=task_id), timeout=30)
    b = _by_id(reply.decisions[0])[B]
    assert (b.eligible, b.reject_reason) == (False, "CIRCUIT_OPEN")
    assert "slow_calls" in b.reject_detail
    assert (b.breaker_opened_for, b.breaker_opened_on_slow_calls) == ("slow_calls", True)


async def test_the_console_shows_the_same_inputs(
    db: Database, catalogs: CatalogQueries, monitor: HealthMonitor
) -> None:
    """The decisions page of the same kind of decision shows the quality bucket, wan-a's p95,
    window samples, burst, prior against evidence and cost line, and in its signals cell the
    15m window, the default prior and the SUBMIT baseline; wan-b's prior is the document's."""
    docs = _documents({"wan-b": 0.9})
    dispatcher, _, _ = await _dispatcher(db, catalogs, monitor, docs)
    await _reject(db, spec("feed", 4), "wan-a", 12)
    await _feed(monitor)
    task = spec("console", 4)
    task_id = await _decide(db, dispatcher, task)

    console = Console(Authenticator({}), ConsoleReads(TaskService(db), db))
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=console.app), base_url="http://console.test"
    ) as browser:
        page = await browser.get(f"/tasks/{task_id}/decisions")
    assert page.status_code == 200, page.text[:300]
    assert f'quality bucket <code class="quality-bucket">{bucket_key(task)}</code>' in page.text
    rows = re.findall(r"<tr class=\"[^\"]*\">(.*?)</tr>", page.text, re.S)

    def cell(row: str, css: str) -> list[str]:
        found: str = re.findall(rf"<td class=\"{css}\">(.*?)</td>", row, re.S)[0]
        return found.split("<br>")

    by_id = {re.findall(r"<td>([^<✔]+)", row)[0].strip(): row for row in rows}
    inputs_a = dict(line.split(" ", 1) for line in cell(by_id[A], "inputs"))
    assert float(inputs_a["p95_latency_s"]) == pytest.approx(300.0, rel=0.1)
    assert float(inputs_a["window_samples"]) == pytest.approx(10.0, rel=0.01)
    assert float(inputs_a["burst_samples"]) == pytest.approx(10.0, rel=0.1)
    assert (inputs_a["quality_prior"], inputs_a["quality_verdicts"]) == ("0.5", "12")
    assert float(inputs_a["quality_shrunk"]) < 0.5
    assert {"cost_estimate_micros", "cost_cheapest_micros"} <= set(inputs_a)
    signals_a = cell(by_id[A], "signals")
    assert "health_window 15m" in signals_a
    assert "quality_prior_source default" in signals_a
    assert any(line.startswith("baseline_SUBMIT ") for line in signals_a)
    assert "quality_prior_source capability_document" in cell(by_id[B], "signals")


def test_the_health_view_names_its_window_and_the_burst_it_applied() -> None:
    """With the 15-minute window decayed below one sample the figures are the 24-hour
    window's, and say so; 10 failures after 5 calm minutes are a burst beyond doubt: the
    view names the 15m window again and its success figure is the burst window's bound."""
    now = [10_000.0]
    monitor = HealthMonitor(BreakerRegistry(BreakerConfig(), lambda: now[0]), clock=lambda: now[0])
    for _ in range(40):
        monitor.observe_generation(SUBMIT_A, succeeded=True, duration_s=30.0)
    now[0] += 4_000.0
    old = monitor.health_view(A)
    assert old is not None
    assert old.window == "24h"
    assert old.samples == pytest.approx(40 * math.exp(-4_000 / 86_400))
    assert old.burst is not None
    assert not old.burst.applied

    for _ in range(40):
        monitor.observe_generation(SUBMIT_A, succeeded=True, duration_s=30.0)
    now[0] += 300.0
    for _ in range(10):
        monitor.observe_generation(SUBMIT_A, succeeded=False, duration_s=30.0)
    burst = monitor.health_view(A)
    assert burst is not None
    assert burst.burst is not None
    assert burst.window == "15m"
    assert burst.burst.samples == pytest.approx(10.0, abs=0.5)
    assert burst.burst.applied
    assert burst.success_lower_bound == burst.burst.success_lower_bound
