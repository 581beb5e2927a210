"""The fast decision path (issue 10): the same decisions as the interpreted pipeline, the hard
filters once per candidate per decision, and a catalog plan that follows catalog changes."""

from __future__ import annotations

import dataclasses
from datetime import timedelta
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from controlplane.domain.routing import filters, plan
from controlplane.domain.routing.candidates import (
    Candidate,
    CapacityView,
    CompileResult,
    Incumbent,
    RoutingContext,
    catalog_version,
)
from controlplane.domain.routing.decision import Outcome, RouteDecisionSnapshot
from controlplane.domain.routing.filters import Reason, screen
from controlplane.domain.routing.selection import RouterConfig, route
from controlplane.domain.scoring import ScoreWeights, example_policy
from tests.support.sizes import examples
from tests.unit.domain import routing_reference as reference
from tests.unit.domain.test_routing import (
    CATALOG,
    CFG,
    NOW,
    compile_for,
    contexts,
    make_spec,
    specs,
)
from vidroute_core.capabilities.constraints import Constraint
from vidroute_core.spec import GenerationSpec, ServiceClass

IDS = sorted(c.id for c in CATALOG)
SHADOW = dataclasses.replace(
    CFG,
    shadow_policy=dataclasses.replace(
        example_policy("shadow-v1"),
        weights={"default": ScoreWeights(0.1, 0.1, 0.1, 0.5, 0.1, 0.05, 0.05)},
    ),
)


def _dynamic(base: RoutingContext, draw: st.DrawFn) -> RoutingContext:
    """Soft exclusions, pins from failover, tenant regions, incumbents and canaries on top."""
    soft = [CATALOG[i] for i in draw(st.sets(st.integers(0, len(CATALOG) - 1), max_size=3))]
    return dataclasses.replace(
        base,
        soft_excluded={
            (c.account_id, c.model): draw(
                st.sampled_from([None, NOW - timedelta(1), NOW + timedelta(30)])
            )
            for c in soft
        },
        same_model_only=draw(st.sampled_from(["", "", CATALOG[0].model])),
        allowed_regions=draw(st.sampled_from([None, frozenset({"us"}), frozenset()])),
        preferred_regions=draw(st.sampled_from([(), ("us",), ("asia-northeast1", "us")])),
        incumbent=draw(
            st.sampled_from([None, *(Incumbent(i, NOW.timestamp() - 30) for i in IDS[:3])])
        ),
        canary_stages=draw(st.dictionaries(st.sampled_from(IDS), st.integers(0, 3), max_size=2)),
        soft_lifted=draw(st.booleans()),
    )


@st.composite
def decisions(draw: st.DrawFn) -> tuple[GenerationSpec, RoutingContext, dict[str, CompileResult]]:
    spec = draw(specs)
    spec = dataclasses.replace(
        spec,
        routing=dataclasses.replace(
            spec.routing,
            preferred_providers=draw(st.sampled_from([(), ("google",), ("runway", "self_hosted")])),
        ),
    )
    ctx = _dynamic(draw(contexts), draw)
    # The compile results the dispatcher would have: survivors compiled, some lost (timeouts).
    survivors = screen(spec, CATALOG, ctx).survivors()
    lost = draw(st.sets(st.sampled_from(IDS), max_size=2))
    compiled = {c.id: compile_for(spec, c) for c in survivors if c.id not in lost}
    for cid in draw(st.sets(st.sampled_from(IDS), max_size=1)):
        compiled[cid] = CompileResult(False, error="adapter timed out", transient=True)
    for cid in draw(st.sets(st.sampled_from(IDS), max_size=1)):
        compiled[cid] = CompileResult(False, error="sidecar refused: NOT_FOUND")
    return spec, ctx, compiled


def _explain(decision: RouteDecisionSnapshot) -> dict[str, Any]:
    data = decision.to_json()
    data.pop("facts", None)  # route replay's record, which the reference pipeline predates
    for c in data["candidates"]:
        c.pop("raw_components", None)
    data["scores"] = [(v.candidate.id, v.score) for v in decision.verdicts]  # unrounded
    data["components"] = [dict(v.components) for v in decision.verdicts]
    data["penalties"] = [dict(v.penalties) for v in decision.verdicts]
    data["shadow_scores"] = dict(decision.shadow_scores)
    return data


@settings(
    max_examples=examples(60, long=200), deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
@given(case=decisions(), cfg=st.sampled_from([CFG, SHADOW]), task=st.sampled_from(["1", "77"]))
def test_fast_path_decides_exactly_as_the_interpreted_pipeline(
    case: tuple[GenerationSpec, RoutingContext, dict[str, CompileResult]],
    cfg: RouterConfig,
    task: str,
) -> None:
    """Every verdict, reason, detail, score, component, penalty, the ranked order, the reason
    of the selection and the shadow's record equal the pre-fast-path pipeline's."""
    spec, ctx, compiled = case
    fast = route(task, spec, CATALOG, compiled, cfg=cfg, ctx=ctx, catalog_version="cat-x")
    slow = reference.route(task, spec, CATALOG, compiled, cfg=cfg, ctx=ctx, catalog_version="cat-x")
    assert _explain(fast) == _explain(slow)
    screened = screen(spec, CATALOG, dataclasses.replace(ctx, capacity={}), "cat-x")
    reused = route(
        task, spec, CATALOG, compiled, cfg=cfg, ctx=ctx, catalog_version="cat-x", screened=screened
    )
    assert _explain(reused) == _explain(slow)
    assert [c.id for c in screened.survivors(ctx.capacity)] == [
        c.id for c in reference.prefilter(spec, sorted(CATALOG, key=lambda c: c.id), ctx)
    ]


def test_hard_filters_run_once_per_candidate_per_decision(monkeypatch: pytest.MonkeyPatch) -> None:
    """The dispatcher's sequence (screen, survivors, survivors with capacity, route with the
    screen, a second pass for soft exclusions) runs the static filters once per candidate and
    each distinct capability's checks once."""
    calls = {"static": 0, "capability": 0}
    static, capability = filters._static_reject, filters._capability_reject

    def counting_static(*args: Any) -> Any:
        calls["static"] += 1
        return static(*args)

    def counting_capability(*args: Any) -> Any:
        calls["capability"] += 1
        return capability(*args)

    monkeypatch.setattr(filters, "_static_reject", counting_static)
    monkeypatch.setattr(filters, "_capability_reject", counting_capability)
    spec = make_spec()
    every = {(c.account_id, c.model): None for c in CATALOG}  # all soft: forces the second pass
    ctx = RoutingContext(now=NOW, soft_excluded=every)
    screened = screen(spec, CATALOG, ctx, "cat-once")
    survivors = screened.survivors()
    capacity = {c.id: CapacityView(1, 4) for c in survivors}
    compiled = {c.id: compile_for(spec, c) for c in screened.survivors(capacity)}
    decision = route(
        "9",
        spec,
        CATALOG,
        compiled,
        cfg=CFG,
        ctx=dataclasses.replace(ctx, capacity=capacity),
        catalog_version="cat-once",
        screened=screened,
    )
    assert decision.selection_reason.startswith("soft_exclusion_lifted")
    assert calls["static"] == len(CATALOG)
    distinct = {id(e.capability) for e in screened.plan.entries}
    assert calls["capability"] <= len(distinct) < len(CATALOG)


def test_a_screen_of_another_task_or_context_is_not_reused() -> None:
    """`route` filters afresh when the screen was taken for another spec or other exclusions."""
    spec = make_spec()
    model = CATALOG[0]
    ctx = RoutingContext(now=NOW, excluded=frozenset({(model.account_id, model.model)}))
    stale = screen(spec, CATALOG, RoutingContext(now=NOW), "cat-s")
    compiled = {c.id: compile_for(spec, c) for c in CATALOG}
    decision = route(
        "3", spec, CATALOG, compiled, cfg=CFG, ctx=ctx, catalog_version="cat-s", screened=stale
    )
    assert decision.verdict(model.id).reason == Reason.EXCLUDED_BY_FAILOVER
    other = make_spec(region="us")
    decision = route(
        "3", other, CATALOG, compiled, cfg=CFG, ctx=ctx, catalog_version="cat-s", screened=stale
    )
    assert all(
        v.candidate.region == "us" or v.reason == Reason.REGION_NOT_ALLOWED
        for v in decision.verdicts
    )


def _tightened(c: Candidate) -> Candidate:
    """`c` at a new capability version whose rules forbid every duration at 720p."""
    rule = Constraint('resolution == "720p"', "duration_seconds > 100", "no 720p in this version")
    cap = dataclasses.replace(
        c.capability, capability_version="v-next", constraints=(*c.capability.constraints, rule)
    )
    return dataclasses.replace(c, capability=cap, capability_version="v-next")


def test_a_catalog_change_invalidates_the_compiled_plan() -> None:
    """The plan is built once per catalog version; a new version (or new candidate objects under
    an old one) builds a new plan, and decisions follow the new capability at once."""
    spec = make_spec()
    ctx = RoutingContext(now=NOW)
    old_version = catalog_version(CATALOG)
    first = plan.plan_for(CATALOG, old_version)
    assert plan.plan_for(CATALOG, old_version) is first
    assert plan.plan_for(list(CATALOG), old_version) is first  # same candidates, any sequence

    eligible = {c.id for c in screen(spec, CATALOG, ctx).survivors()}
    target = next(c for c in CATALOG if c.id in eligible)
    changed = tuple(_tightened(c) if c is target else c for c in CATALOG)
    new_version = catalog_version(changed)
    assert new_version != old_version
    assert plan.plan_for(changed, new_version) is not first
    assert target.id not in {c.id for c in screen(spec, changed, ctx, new_version).survivors()}
    compiled = {c.id: compile_for(spec, c) for c in CATALOG}
    after = route("5", spec, changed, compiled, cfg=CFG, ctx=ctx, catalog_version=new_version)
    assert after.verdict(target.id).reason == Reason.RESOLUTION_DURATION_CONSTRAINT
    assert "no 720p in this version" in after.verdict(target.id).detail
    before = route("5", spec, CATALOG, compiled, cfg=CFG, ctx=ctx, catalog_version=old_version)
    assert before.verdict(target.id).eligible

    # Same version string, other objects (e.g. a reload): never the stale plan.
    assert plan.plan_for(changed, old_version) is not first
    assert plan.plan_for(changed, old_version).source == changed
    # Bounded: the oldest versions are dropped.
    for i in range(plan.PLAN_CACHE_SIZE + 1):
        plan.plan_for(CATALOG, f"cat-{i}")
    assert old_version not in plan.cached_versions()
    assert len(plan.cached_versions()) == plan.PLAN_CACHE_SIZE


def test_decision_records_the_catalog_version_and_no_capacity_outcome() -> None:
    """The fast path keeps the outcome rules: nothing free is NO_CAPACITY, with the version."""
    spec = dataclasses.replace(make_spec(), service_class=ServiceClass.BATCH)
    full = {c.id: CapacityView(0, 4) for c in CATALOG}
    ctx = RoutingContext(now=NOW, capacity=full)
    compiled = {c.id: compile_for(spec, c) for c in CATALOG}
    decision = route("8", spec, CATALOG, compiled, cfg=CFG, ctx=ctx, catalog_version="cat-full")
    assert decision.outcome is Outcome.NO_CAPACITY
    assert decision.catalog_version == "cat-full"
    assert {v.reason for v in decision.verdicts if v.reason == Reason.NO_CAPACITY}


def test_capability_tables_are_keyed_by_every_field_the_check_reads() -> None:
    """A capability's remembered verdict per task shape never leaks to a task of another shape:
    a rule on the seed, then on the negative prompt, flips the verdict back and forth."""
    first = CATALOG[0]
    rules = (
        Constraint("has_seed", "duration_seconds > 100", "no seeds here"),
        Constraint("has_negative_prompt", "duration_seconds > 100", "no negative prompts"),
    )
    cap = dataclasses.replace(first.capability, constraints=rules, capability_version="v-rules")
    only = (dataclasses.replace(first, capability=cap, capability_version="v-rules"),)
    ctx = RoutingContext(now=NOW)
    plain = make_spec()  # text to video, 1280x720, 8 s: which CATALOG[0] runs
    seeded = dataclasses.replace(plain, seed=7)
    negative = dataclasses.replace(plain, negative_prompt="blurry")
    version = catalog_version(only)

    def reason(spec: GenerationSpec) -> tuple[str, str]:
        rejected = screen(spec, only, ctx, version).rest[0]
        return ("", "") if rejected is None else (rejected[0].value, rejected[1])

    for _ in range(2):  # the second time every verdict comes from the table
        assert reason(plain) == ("", "")
        assert reason(seeded)[1] == "no seeds here"
        assert reason(negative)[1] == "no negative prompts"
    assert len(plan.plan_for(only, version).entries[0].capability.verdicts) == 3
    plan.plan_for(only, version).clear_tables()
    assert not plan.plan_for(only, version).entries[0].capability.verdicts
