"""Self-hosted model-server load in routing (design 9.21): cold start and queue wait lengthen the
predicted latency, busy slots cut capacity, a hot GPU costs a penalty, and explain shows it."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

from adapter_sidecars.common.compiling import resolve
from controlplane.api import views as api_views
from controlplane.domain.routing.candidates import (
    Candidate,
    CompileResult,
    HealthView,
    RoutingContext,
    TransformKind,
)
from controlplane.domain.routing.decision import RouteDecisionSnapshot
from controlplane.domain.routing.load import PENALTY, LoadScoring, LoadView, load_view
from controlplane.domain.routing.replay import Recorded, replay_one
from controlplane.domain.routing.selection import RouterConfig, route
from controlplane.domain.scoring import example_policy
from controlplane.persistence.records import RouteDecisionRecord
from vidroute_core.adapter import ModelLoad
from vidroute_core.capabilities.loader import expand_for_accounts, load_file
from vidroute_core.spec import GenerationSpec, Mode, OutputSpec

ROOT = Path(__file__).resolve().parents[3]
NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
CFG = RouterConfig(policy=example_policy("router-load"))
HEALTH = HealthView(success_lower_bound=0.9, samples=200.0, mean_latency_s=120.0)


def _twins() -> tuple[Candidate, ...]:
    """The same self-hosted model on two GPU clusters: equal in everything but their load."""
    entries = [
        e
        for e in load_file(
            ROOT / "adapter_sidecars/selfhosted/capabilities/selfhosted-2026-06.yaml"
        )
        if e.model == "wan2.2-t2v"
    ]
    pairs = expand_for_accounts(entries, [("gpu-a", "us"), ("gpu-b", "us")])
    out = [Candidate.from_capability(cap, i + 1) for i, cap in enumerate(pairs)]
    return tuple(out)


TWINS = _twins()
A, B = TWINS
SPEC = GenerationSpec(
    tenant_id="tenant-a",
    prompt="a fox",
    mode=Mode.TEXT_TO_VIDEO,
    output=OutputSpec(width=1280, height=720, duration_ms=5000),
)


def _compiled(c: Candidate) -> CompileResult:
    resolved, draft = resolve(SPEC, c.capability)
    cost = c.capability.commercial.micros_per_second(resolved.generate_audio)
    return CompileResult(
        submittable=draft.submittable,
        transformations=tuple(
            (t.field, TransformKind(t.kind.value), t.detail) for t in draft.items
        ),
        estimated_cost_micros=cost * resolved.duration_seconds,
        currency=c.capability.commercial.currency,
        request_hash="sha256:" + "0" * 64,
    )


WARM_IDLE = ModelLoad(
    "wan2.2-t2v", warm=True, cold_start_s=300.0, available_slots=2, ready_replicas=2
)
COLD = ModelLoad("wan2.2-t2v", warm=False, cold_start_s=300.0, available_slots=2)
SATURATED = ModelLoad(
    "wan2.2-t2v", queue_length=6, warm=True, gpu_utilization=0.98, ready_replicas=2
)


def _decide(load: dict[str, ModelLoad], task_id: str = "1") -> RouteDecisionSnapshot:
    views = {cid: load_view(m, HEALTH.mean_latency_s) for cid, m in load.items()}
    ctx = RoutingContext(now=NOW, health={c.id: HEALTH for c in TWINS}, load=views)
    return route(task_id, SPEC, TWINS, {c.id: _compiled(c) for c in TWINS}, cfg=CFG, ctx=ctx)


@pytest.mark.parametrize(("warm", "cold"), [(A, B), (B, A)])
def test_cold_model_loses_to_warm_one(warm: Candidate, cold: Candidate) -> None:
    """A model that must load first (300 s cold start) loses to the same model already warm,
    whichever cluster is which: its predicted latency carries the cold start."""
    d = _decide({warm.id: WARM_IDLE, cold.id: COLD})
    assert d.selected == warm.id
    assert d.selection_reason == "best_score"
    lat_warm = d.verdict(warm.id).components["latency"]
    lat_cold = d.verdict(cold.id).components["latency"]
    span = CFG.latency_bad_s - CFG.latency_good_s
    assert lat_warm - lat_cold == pytest.approx(300.0 / span, abs=1e-5)


@pytest.mark.parametrize(("idle", "busy"), [(A, B), (B, A)])
def test_saturated_model_loses_to_warm_idle_one(idle: Candidate, busy: Candidate) -> None:
    """No free slot, six queued jobs and a 98% busy GPU: capacity 0, the queue wait in the
    predicted latency and a GPU_UTILIZATION penalty; the warm idle twin wins."""
    d = _decide({idle.id: WARM_IDLE, busy.id: SATURATED})
    assert d.selected == idle.id
    v = d.verdict(busy.id)
    assert v.components["capacity"] == 0.0
    assert d.verdict(idle.id).components["capacity"] == 1.0
    expected_cut = 0.1 * (0.98 - 0.85) / 0.15
    assert v.penalties[PENALTY] == pytest.approx(expected_cut)
    assert PENALTY not in d.verdict(idle.id).penalties
    # queue wait: 6 jobs x 120 s mean generation / 2 ready replicas = 360 s more
    span = CFG.latency_bad_s - CFG.latency_good_s
    lat_idle = d.verdict(idle.id).components["latency"]
    assert lat_idle - v.components["latency"] == pytest.approx(360.0 / span, abs=1e-5)


def test_load_is_what_decides_the_twins() -> None:
    """Without load the twins are a near tie (bucketed by tenant); with the other one cold the
    warm one wins on its score, for every task."""
    unloaded = _decide({})
    assert unloaded.selection_reason == "bucketed_near_tie"
    other = B if unloaded.selected == A.id else A
    for task in ("1", "2", "3"):
        d = _decide({unloaded.selected or "": COLD, other.id: WARM_IDLE}, task)
        assert d.selected == other.id


def test_explain_shows_the_load_and_replay_keeps_the_penalty() -> None:
    """The stored decision names each candidate's load (warm, queue, predicted extra seconds)
    and the GPU penalty; replaying it under its own policy reproduces the pick."""
    d = _decide({A.id: WARM_IDLE, B.id: SATURATED})
    doc = d.to_json()
    load = doc["facts"]["load"]
    assert load[B.id]["queue_length"] == 6
    assert load[B.id]["warm"] is True
    assert load[B.id]["predicted_extra_s"] == pytest.approx(360.0)
    assert load[A.id]["predicted_extra_s"] == 0.0
    busy = next(c for c in doc["candidates"] if c["id"] == B.id)
    assert busy["penalties"][PENALTY] > 0
    record = RouteDecisionRecord(1, 1, 1, CFG.policy.version, d.selected, doc, "SELECTED", NOW)
    shown = {c.candidate_id: c for c in api_views.route_decision(record).candidates}
    assert shown[B.id].penalties[PENALTY] == pytest.approx(busy["penalties"][PENALTY])
    assert dict(shown[A.id].penalties) == {}
    again = replay_one(Recorded("1", 1, doc), CFG.policy)
    assert again is not None
    assert again.selected == d.selected
    assert again.ranked == d.ranked


def test_load_view_scoring_rules() -> None:
    """The view's numbers: cold start only when not warm, queue wait per ready replica (at
    least one), capacity from slots vs queue, no penalty at or below the busy threshold."""
    cfg = LoadScoring(busy_utilization=0.8, max_penalty=0.2, default_generation_s=50.0)
    cold = load_view(
        ModelLoad("m", queue_length=3, cold_start_s=40.0, available_slots=1), None, cfg
    )
    assert cold.extra_s == pytest.approx(40.0 + 3 * 50.0)
    assert cold.free == pytest.approx((1 / 4) ** 2)
    assert cold.penalty == 0.0
    warm = load_view(
        ModelLoad(
            "m", queue_length=4, warm=True, cold_start_s=40.0, ready_replicas=2, gpu_utilization=0.9
        ),
        10.0,
        cfg,
    )
    assert warm.extra_s == pytest.approx(4 * 10.0 / 2)
    assert warm.free == 0.0
    assert warm.penalty == pytest.approx(0.2 * 0.1 / 0.2)
    assert isinstance(warm, LoadView)
