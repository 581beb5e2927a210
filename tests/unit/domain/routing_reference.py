"""The routing pipeline as it was before the fast path (commit 9abec01), kept as an oracle.

`filters.hard_reject` + `selection.route` walked the interpreted constraint tree
(`constraints.violations`) and `dataclasses` per candidate; `test_fast_routing` checks that the
fast path (`filters.screen`, `plan.CatalogPlan`, compiled constraints, plain-float scoring)
makes the same decision, to the last explain field, on random specs and contexts. Not a test
module; only the imports changed from the original code, and the rules issue 20 changed:
``required_model`` is a hard filter in every mode (REQUIRED_MODEL_MISMATCH), PREFERRED prefers
``preferred_providers``, and a Compile without an answer is COMPILE_UNAVAILABLE (transient).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import fields, replace
from datetime import datetime
from enum import StrEnum
from math import gcd
from typing import TYPE_CHECKING

from controlplane.domain import scoring
from controlplane.domain.routing.candidates import (
    Candidate,
    CompileResult,
    RoutingContext,
    TransformKind,
)
from controlplane.domain.routing.decision import Outcome, RouteDecisionSnapshot, Verdict
from controlplane.domain.routing.selection import RouterConfig
from vidroute_core.capabilities.constraints import ConstraintError, violations
from vidroute_core.spec import GenerationSpec, RoutingMode

if TYPE_CHECKING:
    from vidroute_core.capabilities.loader import Capability

RESOLUTION_PX: Mapping[str, int] = {
    "480p": 480,
    "540p": 540,
    "720p": 720,
    "1080p": 1080,
    "1440p": 1440,
    "4k": 2160,
}


class Reason(StrEnum):
    """Why a candidate is not eligible (stable codes, stored in decisions)."""

    EXCLUDED_BY_FAILOVER = "EXCLUDED_BY_FAILOVER"
    RETRY_BACKOFF = "RETRY_BACKOFF"
    STRICT_MODEL_MISMATCH = "STRICT_MODEL_MISMATCH"
    REQUIRED_PROVIDER_MISMATCH = "REQUIRED_PROVIDER_MISMATCH"
    REQUIRED_MODEL_MISMATCH = "REQUIRED_MODEL_MISMATCH"
    SUNSET = "SUNSET"
    UNSUPPORTED_MODE = "UNSUPPORTED_MODE"
    UNSUPPORTED_INPUT = "UNSUPPORTED_INPUT"
    RESOLUTION_DURATION_CONSTRAINT = "RESOLUTION_DURATION_CONSTRAINT"
    REGION_NOT_ALLOWED = "REGION_NOT_ALLOWED"
    OVER_BUDGET = "OVER_BUDGET"
    CIRCUIT_OPEN = "CIRCUIT_OPEN"
    NO_CAPACITY = "NO_CAPACITY"
    COMPILE_REJECT = "COMPILE_REJECT"
    COMPILE_UNAVAILABLE = "COMPILE_UNAVAILABLE"
    DEGRADE_NOT_ALLOWED = "DEGRADE_NOT_ALLOWED"
    CANARY_NOT_ADMITTED = "CANARY_NOT_ADMITTED"


#: Reasons that may clear by themselves: a task rejected only for these waits, never fails.
TRANSIENT_REASONS = frozenset(
    {Reason.NO_CAPACITY, Reason.CIRCUIT_OPEN, Reason.RETRY_BACKOFF, Reason.COMPILE_UNAVAILABLE}
)


def aspect_label(width: int, height: int) -> str:
    d = gcd(width, height) or 1
    return f"{width // d}:{height // d}"


def pinned(spec: GenerationSpec, c: Candidate) -> bool:
    """Whether `c` is the provider/model the task names (STRICT must be)."""
    r = spec.routing
    if r.required_model and c.model != r.required_model:
        return False
    return not r.required_provider or c.provider == r.required_provider


def preferred(spec: GenerationSpec, c: Candidate) -> bool:
    """Whether a PREFERRED task prefers `c` (one of its preferred providers, or any)."""
    names = spec.routing.preferred_providers
    return not names or c.provider in names


def _is_sunset(c: Candidate, now: datetime) -> bool:
    return c.lifecycle == "sunset" or (c.sunset_at is not None and c.sunset_at <= now)


def _capability_reject(spec: GenerationSpec, cap: Capability) -> tuple[Reason, str] | None:
    if spec.mode not in cap.modes:
        return Reason.UNSUPPORTED_MODE, f"{spec.mode.value} not in {[m.value for m in cap.modes]}"
    if spec.last_frame is not None and not cap.supports_last_frame:
        return Reason.UNSUPPORTED_INPUT, "model does not accept a last frame"
    if len(spec.references) > cap.max_reference_images:
        return Reason.UNSUPPORTED_INPUT, (
            f"{len(spec.references)} reference images; model accepts {cap.max_reference_images}"
        )
    samples = max(1, spec.output.sample_count)
    if samples > cap.max_sample_count:
        return Reason.UNSUPPORTED_INPUT, f"{samples} samples; model max {cap.max_sample_count}"
    return _size_duration_reject(spec, cap)


def _size_duration_reject(spec: GenerationSpec, cap: Capability) -> tuple[Reason, str] | None:
    out, degrade_ok = spec.output, spec.routing.allow_semantic_degrade
    code = Reason.RESOLUTION_DURATION_CONSTRAINT
    aspect = aspect_label(out.width, out.height)
    if aspect not in cap.aspect_ratios:
        return code, f"aspect ratio {aspect} not offered ({', '.join(cap.aspect_ratios)})"
    ranked = sorted(cap.resolutions, key=lambda r: RESOLUTION_PX.get(r, 0))
    fitting = [r for r in ranked if RESOLUTION_PX.get(r, 0) >= min(out.width, out.height)]
    if not fitting and not degrade_ok:
        return code, f"{out.width}x{out.height} exceeds the model's best {ranked[-1]}"
    resolution = fitting[0] if fitting else ranked[-1]
    audio = (out.with_audio and cap.native_audio) or (cap.native_audio and not cap.audio_optional)
    env: dict[str, str | int | bool] = {
        "mode": spec.mode.value,
        "resolution": resolution,
        "aspect_ratio": aspect,
        "with_audio": audio,
        "sample_count": max(1, out.sample_count),
        "has_last_frame": spec.last_frame is not None,
        "reference_count": len(spec.references),
        "has_negative_prompt": bool(spec.negative_prompt),
        "has_seed": spec.seed is not None,
    }
    try:
        wanted = out.duration_ms // 1000
        exact = out.duration_ms % 1000 == 0 and wanted in cap.durations_seconds
        broken = violations(cap.constraints, {**env, "duration_seconds": wanted}) if exact else []
        if exact and not broken:
            return None  # the common case: one evaluation, no search
        legal = [
            d
            for d in cap.durations_seconds
            if not violations(cap.constraints, {**env, "duration_seconds": d})
        ]
        if legal and degrade_ok:
            return None  # the adapter records the duration change as a DEGRADE
        if exact:
            return code, "; ".join(c.describe() for c in broken)
    except ConstraintError as exc:
        return code, f"constraint evaluation failed: {exc}"
    offered = ", ".join(str(d) for d in cap.durations_seconds)
    return code, f"{out.duration_ms} ms at {resolution}: legal durations {legal or offered} s"


def hard_reject(
    spec: GenerationSpec, c: Candidate, ctx: RoutingContext
) -> tuple[Reason, str] | None:
    """Steps 3-7 for one candidate, first failing filter wins; None when it may be compiled."""
    r = spec.routing
    if (c.account_id, c.model) in ctx.excluded:
        return Reason.EXCLUDED_BY_FAILOVER, "failed earlier for this task"
    if (c.account_id, c.model) in ctx.soft_excluded:
        retry_at = ctx.soft_excluded[(c.account_id, c.model)]
        if not ctx.soft_lifted:
            return Reason.EXCLUDED_BY_FAILOVER, "endpoint failed earlier for this task (soft)"
        if retry_at is not None and retry_at > ctx.now:
            return Reason.RETRY_BACKOFF, f"no new attempt on it before {retry_at.isoformat()}"
    if r.mode is RoutingMode.STRICT_MODEL and not pinned(spec, c):
        return Reason.STRICT_MODEL_MISMATCH, (
            f"task pins {r.required_provider or '*'}/{r.required_model or '*'}"
        )
    if r.required_provider and c.provider != r.required_provider:
        # "Provider that must run the task", in every mode: a hard constraint no score overrides.
        return Reason.REQUIRED_PROVIDER_MISMATCH, f"task requires provider {r.required_provider}"
    if r.required_model and c.model != r.required_model:
        return Reason.REQUIRED_MODEL_MISMATCH, f"task requires model {r.required_model}"
    if ctx.same_model_only and c.model != ctx.same_model_only:
        return Reason.STRICT_MODEL_MISMATCH, f"failover keeps model {ctx.same_model_only}"
    if _is_sunset(c, ctx.now):
        return Reason.SUNSET, f"lifecycle {c.lifecycle}, sunset {c.sunset_at}"
    rejected = _capability_reject(spec, c.capability)
    if rejected is not None:
        return rejected
    if r.region and c.region != r.region:
        return Reason.REGION_NOT_ALLOWED, f"task requires region {r.region}, candidate {c.region}"
    if ctx.allowed_regions is not None and c.region not in ctx.allowed_regions:
        return Reason.REGION_NOT_ALLOWED, f"tenant policy excludes region {c.region}"
    over = _over_budget(spec, c.price.estimate(spec), c.price.currency)
    if over is not None:
        return Reason.OVER_BUDGET, over
    if c.id in ctx.circuit_open:
        return Reason.CIRCUIT_OPEN, ctx.circuit_open[c.id]
    cap = ctx.capacity.get(c.id)
    if cap is not None and not cap.accepting_new:
        return Reason.NO_CAPACITY, "unknown-submission budget full; not accepting new work"
    if cap is not None and cap.available <= 0:
        return Reason.NO_CAPACITY, f"0 of {cap.maximum} slots free"
    return None


def _over_budget(spec: GenerationSpec, cost: int, currency: str) -> str | None:
    limit = spec.routing.max_estimated_cost_micros
    if limit <= 0:
        return None
    if currency != spec.routing.currency:
        return f"priced in {currency}, budget in {spec.routing.currency}"
    if cost > limit:
        return f"estimated {cost} micros > budget {limit}"
    return None


def compile_reject(
    spec: GenerationSpec, c: Candidate, result: CompileResult | None
) -> tuple[Reason, str] | None:
    """The end of step 7: the adapter's compile verdict and its estimate; None when runnable."""
    if result is None:
        return Reason.COMPILE_REJECT, "not compiled"
    if result.error and result.transient:
        return Reason.COMPILE_UNAVAILABLE, f"no compile verdict: {result.error}"
    if result.error:
        return Reason.COMPILE_REJECT, f"compile failed: {result.error}"
    rejects = [f"{f}: {d}" for f, k, d in result.transformations if k is TransformKind.REJECT]
    if rejects or not result.submittable:
        detail = "; ".join(rejects) or "adapter marked the plan not submittable"
        if all("DEGRADE not permitted" in r for r in rejects) and rejects:
            return Reason.DEGRADE_NOT_ALLOWED, detail
        return Reason.COMPILE_REJECT, detail
    degrades = [f"{f}: {d}" for f, k, d in result.transformations if k is TransformKind.DEGRADE]
    if degrades and not spec.routing.allow_semantic_degrade:
        return Reason.DEGRADE_NOT_ALLOWED, "; ".join(degrades)
    if degrades and spec.routing.mode is RoutingMode.PREFERRED and not preferred(spec, c):
        return Reason.DEGRADE_NOT_ALLOWED, "a PREFERRED fallback must be equivalent: " + "; ".join(
            degrades
        )
    over = _over_budget(spec, result.estimated_cost_micros, result.currency)
    if over is not None:
        return Reason.OVER_BUDGET, over
    return None


def prefilter(
    spec: GenerationSpec, candidates: Sequence[Candidate], ctx: RoutingContext
) -> list[Candidate]:
    """Candidates that pass every static filter: the only ones worth an adapter Compile call.

    Soft exclusions are lifted here: the second pass of `route` may need those candidates."""
    lifted = replace(ctx, soft_lifted=True)
    return [c for c in candidates if hard_reject(spec, c, lifted) is None]


SOFT_LIFTED = "soft_exclusion_lifted"


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
        cost=(
            scoring.cost_score(float(v.estimated_cost_micros or 0), *cost_range)
            if cost_range[1] > 0
            else scoring.relative_cost_score(float(v.estimated_cost_micros or 0), cost_range[0])
        ),
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
    # The cheapest eligible candidate scores 1; the budget scores 0; no budget: relative.
    cost_range = (min(costs), float(budget) if budget > 0 else 0.0)
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
    slot = scoring.rendezvous(_group_key(task_id, spec), band)
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
        pinned_ids = {v.candidate.id for v in eligible if preferred(spec, v.candidate)}
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
        pinned_only = [p for p in normal if preferred(spec, snapshot.verdict(p[0]).candidate)]
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
