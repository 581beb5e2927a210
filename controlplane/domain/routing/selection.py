"""Choosing among the eligible candidates (design 9.10 step 8, 9.13): scores, then one choice.

`route` runs the whole of steps 3-8 for a task: the `filters` verdict of every candidate, canary
admission (never for STRICT or high-value tasks), scores among the eligible only (9.13.1: no weight
can resurrect a rejected candidate), then hysteresis/dwell against the routing group's incumbent,
consistent-hash bucketing of near-ties, and an optional shadow policy that is recorded, never run.
When soft exclusions leave nothing eligible, the decision is taken again without them and its
``selection_reason`` says so. Deterministic for equal inputs; no I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields, replace

from controlplane.domain import scoring
from controlplane.domain.routing.candidates import Candidate, CompileResult, RoutingContext
from controlplane.domain.routing.decision import Outcome, RouteDecisionSnapshot, Verdict
from controlplane.domain.routing.filters import (
    TRANSIENT_REASONS,
    Reason,
    compile_reject,
    hard_reject,
    pinned,
)
from vidroute_core.spec import GenerationSpec, RoutingMode

SOFT_LIFTED = "soft_exclusion_lifted"


@dataclass(frozen=True)
class RouterConfig:
    """The versioned policy plus the thresholds the scoring needs."""

    policy: scoring.RoutingPolicy
    shadow_policy: scoring.RoutingPolicy | None = None
    latency_good_s: float = 60.0
    latency_bad_s: float = 900.0
    deprecated_penalty: float = 0.05
    default_quality: float = 0.5


def _components(
    v: Verdict,
    spec: GenerationSpec,
    cfg: RouterConfig,
    ctx: RoutingContext,
    cost_range: tuple[float, float],
) -> scoring.ScoreComponents:
    c = v.candidate
    health = ctx.health.get(c.id)
    latency = 0.5
    if health is not None and health.mean_latency_s is not None:
        latency = scoring.latency_score(
            health.mean_latency_s, cfg.latency_good_s, cfg.latency_bad_s
        )
    cap = ctx.capacity.get(c.id)
    preferred = spec.routing.preferred_providers
    return scoring.ScoreComponents(
        quality=min(1.0, max(0.0, ctx.quality.get(c.id, cfg.default_quality))),
        success=health.success_lower_bound if health is not None else 0.0,
        latency=latency,
        cost=scoring.cost_score(float(v.estimated_cost_micros or 0), *cost_range),
        capacity=scoring.capacity_score(cap.available, cap.maximum) if cap else 1.0,
        region=scoring.region_score(c.region, ctx.preferred_regions),
        preference=scoring.preference_score(c.provider, preferred) if preferred else 0.5,
    )


def _score_all(
    eligible: Sequence[Verdict],
    spec: GenerationSpec,
    cfg: RouterConfig,
    ctx: RoutingContext,
    policy: scoring.RoutingPolicy,
) -> dict[str, scoring.ScoreBreakdown]:
    weights = policy.weights_for(spec.service_class.value)
    out: dict[str, scoring.ScoreBreakdown] = {}
    costs = [float(e.estimated_cost_micros or 0) for e in eligible] or [0.0]
    budget = spec.routing.max_estimated_cost_micros
    # The cheapest eligible candidate scores 1; the budget (or 1.5x the dearest) scores 0.
    cost_range = (min(costs), float(budget) if budget > 0 else max(costs) * 1.5 + 1.0)
    for v in eligible:
        penalties = []
        if v.candidate.lifecycle == "deprecated":
            penalties.append(scoring.Penalty("DEPRECATED", cfg.deprecated_penalty))
        out[v.candidate.id] = scoring.score(
            _components(v, spec, cfg, ctx, cost_range), weights, penalties
        )
    return out


def _group_key(task_id: str, spec: GenerationSpec) -> str:
    return spec.tenant_id or task_id


def _select(
    task_id: str,
    spec: GenerationSpec,
    ranked: list[tuple[str, float]],
    cfg: RouterConfig,
    ctx: RoutingContext,
) -> tuple[str, str, int | None]:
    """(chosen id, why, bucket) among non-canary eligible candidates ranked by score."""
    now_s = ctx.now.timestamp()
    inc = ctx.incumbent
    if inc is not None and inc.candidate_id in dict(ranked):
        decision = scoring.choose_with_hysteresis(
            ranked,
            inc.candidate_id,
            delta=cfg.policy.hysteresis_delta,
            dwell_s=cfg.policy.min_dwell_s,
            now=now_s,
            incumbent_since=inc.since_s,
        )
        return decision.chosen, decision.reason, None
    best = ranked[0][1]
    band = [cid for cid, s in ranked if s >= best - cfg.policy.hysteresis_delta]
    if len(band) == 1:
        return band[0], "best_score", None
    slot = scoring.bucket(_group_key(task_id, spec), len(band))
    return band[slot], "bucketed_near_tie", slot


def route(
    task_id: str,
    spec: GenerationSpec,
    candidates: Sequence[Candidate],
    compiled: Mapping[str, CompileResult],
    *,
    cfg: RouterConfig,
    ctx: RoutingContext,
    catalog_version: str = "",
) -> RouteDecisionSnapshot:
    """Run steps 3-8 and return the decision; deterministic for equal inputs.

    When soft exclusions leave nothing eligible, the decision is taken again without them."""
    first = _route_once(
        task_id, spec, candidates, compiled, cfg=cfg, ctx=ctx, catalog=catalog_version
    )
    if first.outcome is Outcome.SELECTED or not ctx.soft_excluded or ctx.soft_lifted:
        return first
    second = _route_once(
        task_id,
        spec,
        candidates,
        compiled,
        cfg=cfg,
        ctx=replace(ctx, soft_lifted=True),
        catalog=catalog_version,
    )
    why = f"{SOFT_LIFTED}:{second.selection_reason}" if second.selection_reason else SOFT_LIFTED
    return replace(second, selection_reason=why)


def _route_once(
    task_id: str,
    spec: GenerationSpec,
    candidates: Sequence[Candidate],
    compiled: Mapping[str, CompileResult],
    *,
    cfg: RouterConfig,
    ctx: RoutingContext,
    catalog: str,
) -> RouteDecisionSnapshot:
    verdicts: list[Verdict] = []
    for c in sorted(candidates, key=lambda c: c.id):
        rejected = hard_reject(spec, c, ctx)
        result = compiled.get(c.id)
        if rejected is None:
            rejected = compile_reject(spec, c, result)
        cost = result.estimated_cost_micros if result and not result.error else None
        if cost is None:
            cost = c.price.estimate(spec)
        if rejected is not None:
            verdicts.append(
                Verdict(
                    c,
                    False,
                    rejected[0].value,
                    rejected[1],
                    estimated_cost_micros=cost,
                    compile=result,
                )
            )
        else:
            verdicts.append(Verdict(c, True, estimated_cost_micros=cost, compile=result))
    verdicts = _apply_canary(task_id, spec, verdicts, ctx)
    eligible = [v for v in verdicts if v.eligible]
    scores = _score_all(eligible, spec, cfg, ctx, cfg.policy)
    verdicts = [
        replace(
            v,
            score=scores[v.candidate.id].total,
            components=_rounded(scores[v.candidate.id].components),
            penalties={p.code: p.amount for p in scores[v.candidate.id].penalties},
        )
        if v.candidate.id in scores
        else v
        for v in verdicts
    ]
    snapshot = RouteDecisionSnapshot(
        task_id=task_id,
        outcome=Outcome.NO_ELIGIBLE_CANDIDATE,
        policy_version=cfg.policy.version,
        catalog_version=catalog,
        verdicts=tuple(verdicts),
        ranked=(),
    )
    snapshot = _with_shadow(snapshot, eligible, spec, cfg, ctx)
    if not eligible:
        transient = any(v.reason in TRANSIENT_REASONS for v in verdicts)
        outcome = Outcome.NO_CAPACITY if transient else Outcome.NO_ELIGIBLE_CANDIDATE
        return replace(snapshot, outcome=outcome)
    return _choose(task_id, spec, snapshot, scores, cfg=cfg, ctx=ctx)


def _rounded(components: scoring.ScoreComponents) -> dict[str, float]:
    return {f.name: round(getattr(components, f.name), 6) for f in fields(components)}


def _ranked(
    ids: Sequence[str], scores: Mapping[str, scoring.ScoreBreakdown]
) -> list[tuple[str, float]]:
    return sorted(((i, scores[i].total) for i in ids), key=lambda p: (-p[1], p[0]))


def _choose(
    task_id: str,
    spec: GenerationSpec,
    snapshot: RouteDecisionSnapshot,
    scores: Mapping[str, scoring.ScoreBreakdown],
    *,
    cfg: RouterConfig,
    ctx: RoutingContext,
) -> RouteDecisionSnapshot:
    eligible = [v for v in snapshot.verdicts if v.eligible]
    canaries = [v.candidate.id for v in eligible if v.canary]
    normal = _ranked([v.candidate.id for v in eligible if not v.canary], scores)
    if spec.routing.mode is RoutingMode.PREFERRED:
        # The pinned model wins whenever it is eligible; others only as an equivalent fallback.
        pinned_ids = {v.candidate.id for v in eligible if pinned(spec, v.candidate)}
        normal = [p for p in normal if p[0] in pinned_ids] + [
            p for p in normal if p[0] not in pinned_ids
        ]
    canary_ranked = _ranked(canaries, scores)
    if canary_ranked:
        order = [canary_ranked[0][0]] + [cid for cid, _ in normal]
        return replace(
            snapshot,
            outcome=Outcome.SELECTED,
            ranked=tuple(order),
            selection_reason="canary_admitted",
        )
    head = normal
    if spec.routing.mode is RoutingMode.PREFERRED:
        pinned_only = [p for p in normal if pinned(spec, snapshot.verdict(p[0]).candidate)]
        head = pinned_only or normal
    chosen, why, slot = _select(task_id, spec, head, cfg, ctx)
    order = [chosen] + [cid for cid, _ in normal if cid != chosen]
    return replace(
        snapshot, outcome=Outcome.SELECTED, ranked=tuple(order), selection_reason=why, bucket=slot
    )


def _apply_canary(
    task_id: str, spec: GenerationSpec, verdicts: list[Verdict], ctx: RoutingContext
) -> list[Verdict]:
    """Canary candidates take only admitted traffic: a bucketed share, never STRICT/high-value."""
    if not ctx.canary_stages:
        return verdicts
    plan = scoring.CanaryPlan()
    strict = spec.routing.mode is RoutingMode.STRICT_MODEL
    out = []
    for v in verdicts:
        stage = ctx.canary_stages.get(v.candidate.id)
        if stage is None or not v.eligible:
            out.append(v)
            continue
        value = max(v.estimated_cost_micros or 0, spec.routing.max_estimated_cost_micros)
        if plan.admits(task_id, stage, strict, value):
            out.append(replace(v, canary=True))
        else:
            why = "STRICT task" if strict else f"not in the stage-{stage} share or high value"
            out.append(
                replace(
                    v,
                    eligible=False,
                    reason=Reason.CANARY_NOT_ADMITTED.value,
                    detail=why,
                    canary=True,
                )
            )
    return out


def _with_shadow(
    snapshot: RouteDecisionSnapshot,
    eligible: Sequence[Verdict],
    spec: GenerationSpec,
    cfg: RouterConfig,
    ctx: RoutingContext,
) -> RouteDecisionSnapshot:
    """Score the eligible set with the shadow policy (9.25.4): recorded, never executed."""
    shadow = cfg.shadow_policy
    if shadow is None:
        return snapshot
    scores = _score_all(eligible, spec, cfg, ctx, shadow)
    ranked = _ranked(list(scores), scores)
    return replace(
        snapshot,
        shadow_policy_version=shadow.version,
        shadow_selected=ranked[0][0] if ranked else "",
        shadow_scores={cid: round(s, 6) for cid, s in ranked},
    )
