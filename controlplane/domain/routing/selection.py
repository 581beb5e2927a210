"""Choosing among the eligible candidates (design 9.10 step 8, 9.13): scores, then one choice.

`route` runs the whole of steps 3-8 for a task: the `filters` verdict of every candidate, canary
admission (never for STRICT or high-value tasks), scores among the eligible only (9.13.1: no weight
can resurrect a rejected candidate), then hysteresis/dwell against the routing group's incumbent,
consistent-hash bucketing of near-ties, and an optional shadow policy that is recorded, never run.
When soft exclusions leave nothing eligible, the decision is taken again without them and its
``selection_reason`` says so. Deterministic for equal inputs; no I/O, no clock.

The fast path (issue 10): the hard filters come from one `filters.Screen` (the dispatcher's, or
one made here), so no filter runs twice; the second pass only recombines it. Scores are plain
floats in one loop per decision (the same arithmetic as `scoring.score`, whose dataclasses are
the explain vocabulary); the main and the shadow policy share the components; verdicts are
built once with their final fields and the snapshot once at the end. The rounded components
dict of the explain view is made when read (`decision.Components`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from math import fsum
from operator import itemgetter, mul
from types import MappingProxyType

from controlplane.domain import scoring
from controlplane.domain.routing.candidates import (
    Candidate,
    CompileResult,
    RoutingContext,
    TransformKind,
)
from controlplane.domain.routing.decision import (
    Components,
    DecisionFacts,
    Outcome,
    RouteDecisionSnapshot,
    Verdict,
    round6,
)
from controlplane.domain.routing.filters import (
    NOT_SOFT,
    SOFT_DETAIL,
    TRANSIENT_REASONS,
    Reason,
    Screen,
    capacity_reject,
    compile_reject,
    pinned,
    screen,
)
from controlplane.domain.routing.load import PENALTY as LOAD_PENALTY
from controlplane.domain.routing.load import LoadView
from controlplane.domain.routing.plan import CandidatePlan
from vidroute_core.spec import GenerationSpec, RoutingMode

SOFT_LIFTED = "soft_exclusion_lifted"
_REJECT, _DEGRADE = TransformKind.REJECT, TransformKind.DEGRADE
_NONE: Mapping[str, float] = MappingProxyType({})


@dataclass(frozen=True)
class RouterConfig:
    """The versioned policy plus the thresholds the scoring needs."""

    policy: scoring.RoutingPolicy
    shadow_policy: scoring.RoutingPolicy | None = None
    latency_good_s: float = 60.0
    latency_bad_s: float = 900.0
    deprecated_penalty: float = 0.05
    default_quality: float = 0.5


class _Row:
    """An eligible candidate while its decision is made; becomes its `Verdict` at the end."""

    __slots__ = ("canary", "cost", "dep_cut", "entry", "load_cut", "parts", "penalty", "result")

    def __init__(self, entry: CandidatePlan, cost: int, result: CompileResult | None) -> None:
        self.entry, self.cost, self.result = entry, cost, result
        self.canary = False
        self.parts: tuple[float, ...] = ()
        self.penalty = 0.0
        self.load_cut = 0.0  # the part of `penalty` that is the GPU utilisation's
        self.dep_cut = 0.0  # with a load cut: the deprecation's, as added (replay sums both)

    def penalties(self) -> Mapping[str, float]:
        """The named parts of `penalty` (the explain view; replay sums them)."""
        if not self.load_cut:
            return {"DEPRECATED": self.penalty} if self.entry.deprecated else _NONE
        out = {}
        if self.entry.deprecated:
            out["DEPRECATED"] = self.dep_cut  # the configured amount, not penalty - load_cut
        if self.load_cut:
            out[LOAD_PENALTY] = self.load_cut
        return out


def _with_load(
    view: LoadView, latency_s: float | None, free: float, bad: float, span: float
) -> tuple[float, float]:
    """(latency, capacity) components with a model server's load (`load`): the predicted
    latency adds its cold start and queue wait; capacity is the smaller of lease and server."""
    if span <= 0:
        raise ValueError("latency bad must exceed good")
    if latency_s is not None:
        lat = (bad - (latency_s + view.extra_s)) / span
    else:
        lat = 0.5 - view.extra_s / span
    if not 0.0 <= lat <= 1.0:
        lat = 1.0 if lat > 1.0 else 0.0
    return lat, free if free <= view.free else view.free


def weight_vector(policy: scoring.RoutingPolicy, scenario: str) -> tuple[tuple[float, ...], float]:
    """The policy's weights for a scenario in `decision.COMPONENT_NAMES` order, and their sum."""
    w = policy.weights_for(scenario)
    vector = (w.quality, w.success, w.latency, w.cost, w.capacity, w.region, w.preference)
    return vector, fsum(vector)


def scenario_for(policy: scoring.RoutingPolicy, spec: GenerationSpec, ctx: RoutingContext) -> str:
    """The weight set that scores `spec` under `policy` (9.13): the tenant's routing scenario
    when the policy has a set of that name, else the service class's (itself falling back to
    ``default`` in `RoutingPolicy.weights_for`). Decisions record it; replay re-weights by it."""
    scenario = ctx.scenario
    return scenario if scenario and scenario in policy.weights else spec.service_class.value


def _weights(
    policy: scoring.RoutingPolicy, spec: GenerationSpec, ctx: RoutingContext
) -> tuple[tuple[float, ...], float]:
    return weight_vector(policy, scenario_for(policy, spec, ctx))


def weighted_total(
    parts: tuple[float, ...], weights: tuple[float, ...], cap: float, cut: float
) -> float:
    """A candidate's score: min(sum of weighted components, sum of weights) - penalty.
    (fsum is correctly rounded, so the order of the terms does not change the result.)"""
    gross = fsum(map(mul, parts, weights))
    return (gross if gross < cap else cap) - cut


def _score(  # noqa: PLR0915 - one loop per decision on purpose: the hot path
    eligible: Sequence[_Row],
    spec: GenerationSpec,
    cfg: RouterConfig,
    ctx: RoutingContext,
) -> tuple[dict[str, float], dict[str, float] | None]:
    """Each eligible row's components (9.13.2, `scoring`'s normalisers) and its total under
    the policy and the shadow policy: min(sum of weighted parts, sum of weights) - penalty."""
    costs = [float(r.cost) for r in eligible] or [0.0]
    budget = spec.routing.max_estimated_cost_micros
    # The cheapest eligible candidate scores 1. Under a budget, 9.13.2's line from there to
    # the budget (0); without one, `scoring.relative_cost_score`: in proportion to price.
    lo = min(costs)
    hi = float(budget) if budget > 0 else 0.0
    span = hi - lo
    good, bad = cfg.latency_good_s, cfg.latency_bad_s
    health, capacity, quality, load = ctx.health, ctx.capacity, ctx.quality, ctx.load
    default_quality = cfg.default_quality
    preferred = spec.routing.preferred_providers
    regions: dict[str, float] = {}
    penalty = cfg.deprecated_penalty
    if penalty < 0 and any(r.entry.deprecated for r in eligible):
        raise ValueError("penalties are non-negative amounts")
    w_main, cap_w = _weights(cfg.policy, spec, ctx)
    shadow = cfg.shadow_policy
    w_shadow, cap_s = _weights(shadow or cfg.policy, spec, ctx)
    totals: dict[str, float] = {}
    shadow_totals: dict[str, float] = {}
    latency_span = bad - good
    # Clamps are written out (`x if 0 <= x <= 1 else ...`): min/max calls were a third of the
    # loop. NaN clamps to 0 as min(1, max(0, nan)) does.
    for row in eligible:
        e = row.entry
        cid = e.id
        h = health.get(cid)
        lat = 0.5
        ok = 0.0
        if h is not None:
            ok = h.success_lower_bound
            if not 0.0 <= ok <= 1.0:
                raise ValueError(f"component success={ok} outside [0, 1]")
            predicted = h.latency_s  # the window's p95 (9.13.2), else its mean
            if predicted is not None:
                if latency_span <= 0:
                    raise ValueError("latency bad must exceed good")
                lat = (bad - predicted) / latency_span
                if not 0.0 <= lat <= 1.0:
                    lat = 1.0 if lat > 1.0 else 0.0
        if budget <= 0:
            cost = lo / row.cost if row.cost > lo else 1.0
        elif span <= 0:
            cost = 1.0 if row.cost <= hi else 0.0
        else:
            cost = (hi - row.cost) / span
            if not 0.0 <= cost <= 1.0:
                cost = 1.0 if cost > 1.0 else 0.0
        view = capacity.get(cid)
        free = 1.0
        if view is not None:
            m = view.maximum
            if m > 0:
                free = view.available / m
                if not 0.0 <= free <= 1.0:
                    free = 1.0 if free > 1.0 else 0.0
                free *= free
            else:
                free = 0.0
        region = regions.get(e.region)
        if region is None:
            region = regions[e.region] = scoring.region_score(e.region, ctx.preferred_regions)
        q = quality.get(cid, default_quality)
        if not 0.0 <= q <= 1.0:
            q = 1.0 if q > 1.0 else 0.0
        pref = 0.5
        if preferred and e.provider in preferred:
            pref = 1.0
        cut = penalty if e.deprecated else 0.0
        if load and (view_load := load.get(cid)) is not None:
            lat, free = _with_load(
                view_load, None if h is None else h.latency_s, free, bad, latency_span
            )
            row.load_cut, row.dep_cut = view_load.penalty, cut
            cut += view_load.penalty
        row.parts = parts = (q, ok, lat, cost, free, region, pref)
        row.penalty = cut
        totals[cid] = weighted_total(parts, w_main, cap_w, cut)
        if shadow is not None:
            shadow_totals[cid] = weighted_total(parts, w_shadow, cap_s, cut)
    return totals, shadow_totals if shadow is not None else None


def _ranked(scores: Mapping[str, float], ids: Sequence[str]) -> list[tuple[str, float]]:
    """Best score first, ties by id. `ids` come in id order (the plan's), and a reversed sort
    keeps equal elements in their order, so sorting on the score alone is enough."""
    return sorted([(i, scores[i]) for i in ids], key=itemgetter(1), reverse=True)


def _group_key(task_id: str, spec: GenerationSpec) -> str:
    return spec.tenant_id or task_id


def _select(
    facts: DecisionFacts, ranked: list[tuple[str, float]], policy: scoring.RoutingPolicy
) -> tuple[str, str, int | None]:
    """(chosen id, why, bucket) among non-canary eligible candidates ranked by score."""
    inc = facts.incumbent
    if inc is not None and any(cid == inc.candidate_id for cid, _ in ranked):
        decision = scoring.choose_with_hysteresis(
            ranked,
            inc.candidate_id,
            delta=policy.hysteresis_delta,
            dwell_s=policy.min_dwell_s,
            now=facts.now.timestamp(),
            incumbent_since=inc.since_s,
        )
        return decision.chosen, decision.reason, None
    best = ranked[0][1]
    band = [cid for cid, s in ranked if s >= best - policy.hysteresis_delta]
    if len(band) == 1:
        return band[0], "best_score", None
    slot = scoring.rendezvous(facts.group_key, band)
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
    screened: Screen | None = None,
) -> RouteDecisionSnapshot:
    """Run steps 3-8 and return the decision; deterministic for equal inputs.

    `screened` is the dispatcher's `filters.screen` of this task (taken before capacity was
    gathered); it is used when it matches `spec`, the candidates and `ctx`, else the hard
    filters run here. When soft exclusions leave nothing eligible, the decision is taken again
    without them."""
    if screened is None or not screened.matches(spec, candidates, catalog_version, ctx):
        screened = screen(spec, candidates, ctx, catalog_version)
    first = _route_once(
        task_id,
        spec=spec,
        screened=screened,
        compiled=compiled,
        cfg=cfg,
        ctx=ctx,
        lifted=ctx.soft_lifted,
        why_prefix="",
    )
    if first.outcome is Outcome.SELECTED or not ctx.soft_excluded or ctx.soft_lifted:
        return first
    return _route_once(
        task_id,
        spec=spec,
        screened=screened,
        compiled=compiled,
        cfg=cfg,
        ctx=ctx,
        lifted=True,
        why_prefix=SOFT_LIFTED,
    )


def _rows(
    spec: GenerationSpec,
    screened: Screen,
    compiled: Mapping[str, CompileResult],
    ctx: RoutingContext,
    lifted: bool,
) -> list[_Row | Verdict]:
    """Every candidate in id order: a final `Verdict` when it is rejected, else a `_Row`."""
    units, audio, now = screened.task.price_units, screened.task.with_audio, ctx.now
    capacity, budget = ctx.capacity, spec.routing.max_estimated_cost_micros
    out: list[_Row | Verdict] = []
    # `Screen.reject` inlined: this loop runs once per candidate per decision.
    for e, head, retry_at, rest in zip(
        screened.plan.entries, screened.head, screened.soft, screened.rest, strict=True
    ):
        rejected = head
        if rejected is None and retry_at is not NOT_SOFT:
            if not lifted:
                rejected = Reason.EXCLUDED_BY_FAILOVER, SOFT_DETAIL
            elif isinstance(retry_at, datetime) and retry_at > now:
                rejected = (
                    Reason.RETRY_BACKOFF,
                    f"no new attempt on it before {retry_at.isoformat()}",
                )
        if rejected is None:
            rejected = rest
        if rejected is None and capacity:
            rejected = capacity_reject(capacity.get(e.id))
        result = compiled.get(e.id)
        if rejected is None:
            # `compile_reject` answers None for a plan without REJECT/DEGRADE under no budget;
            # only other plans pay for the call (and its lists).
            full = budget > 0 or result is None or bool(result.error) or not result.submittable
            if not full and result is not None:
                for transformation in result.transformations:
                    kind = transformation[1]
                    if kind is _REJECT or kind is _DEGRADE:
                        full = True
                        break
            if full:
                rejected = compile_reject(spec, e.candidate, result)
        if result is not None and not result.error:
            cost = result.estimated_cost_micros
        else:
            per_s = e.micros_per_second
            if audio and e.micros_per_second_with_audio is not None:
                per_s = e.micros_per_second_with_audio
            cost = per_s * units
        if rejected is None:
            out.append(_Row(e, cost, result))
        else:
            out.append(
                Verdict(
                    e.candidate,
                    False,
                    str(rejected[0]),  # the code as a plain str (StrEnum's __str__)
                    rejected[1],
                    None,
                    _NONE,
                    _NONE,
                    cost,
                    result,
                    False,
                )
            )
    return out


def _route_once(
    task_id: str,
    *,
    spec: GenerationSpec,
    screened: Screen,
    compiled: Mapping[str, CompileResult],
    cfg: RouterConfig,
    ctx: RoutingContext,
    lifted: bool,
    why_prefix: str,
) -> RouteDecisionSnapshot:
    rows = _rows(spec, screened, compiled, ctx, lifted)
    if ctx.canary_stages:
        _apply_canary(task_id, spec, rows, ctx, cfg.policy)
    eligible = [r for r in rows if isinstance(r, _Row)]
    scores, shadow_totals = _score(eligible, spec, cfg, ctx)
    shadow_version, shadow_selected = "", ""
    shadow_scores: Mapping[str, float] = _NONE
    if cfg.shadow_policy is not None and shadow_totals is not None:  # 9.25.4: never executed
        shadow_version = cfg.shadow_policy.version
        shadow_ranked = _ranked(shadow_totals, list(scores))
        shadow_selected = shadow_ranked[0][0] if shadow_ranked else ""
        shadow_scores = {cid: round6(s) for cid, s in shadow_ranked}
    verdicts: list[Verdict] = []
    for r in rows:
        if isinstance(r, _Row):  # eligible: its final verdict, scored
            e = r.entry
            verdicts.append(
                Verdict(
                    e.candidate,
                    True,
                    "",
                    "",
                    scores[e.id],
                    Components(r.parts),
                    r.penalties(),
                    r.cost,
                    r.result,
                    r.canary,
                )
            )
        else:
            verdicts.append(r)
    ranked: tuple[str, ...] = ()
    outcome, why, slot = Outcome.NO_ELIGIBLE_CANDIDATE, "", None
    facts = None
    if eligible:
        outcome = Outcome.SELECTED
        scenario = scenario_for(cfg.policy, spec, ctx)
        facts = _facts(task_id, spec, eligible, ctx, scenario=scenario, cfg=cfg)
        ranked, why, slot = choose(
            facts, [(r.entry.id, r.canary) for r in eligible], scores, cfg.policy
        )
    elif any(v.reason in TRANSIENT_REASONS for v in verdicts):
        outcome = Outcome.NO_CAPACITY
    if why_prefix:
        why = f"{why_prefix}:{why}" if why else why_prefix
    return RouteDecisionSnapshot(
        task_id=task_id,
        outcome=outcome,
        policy_version=cfg.policy.version,
        catalog_version=screened.plan.version,
        verdicts=tuple(verdicts),
        ranked=ranked,
        selection_reason=why,
        bucket=slot,
        shadow_policy_version=shadow_version,
        shadow_selected=shadow_selected,
        shadow_scores=shadow_scores,
        facts=facts,
    )


def _facts(
    task_id: str,
    spec: GenerationSpec,
    eligible: Sequence[_Row],
    ctx: RoutingContext,
    *,
    scenario: str,
    cfg: RouterConfig,
) -> DecisionFacts:
    """The facts the decision read, held by reference (rendered only when it is stored)."""
    mode = spec.routing.mode
    pinned_ids: frozenset[str] = frozenset()
    if mode is RoutingMode.PREFERRED:
        pinned_ids = frozenset(r.entry.id for r in eligible if pinned(spec, r.entry.candidate))
    return DecisionFacts(
        scenario,
        _group_key(task_id, spec),
        mode.value,
        ctx.now,
        ctx.incumbent,
        pinned_ids,
        ctx.health,
        load=ctx.load,
        quality_bucket=ctx.quality_bucket,
        quality=ctx.quality_evidence,
        cheapest_cost_micros=min(r.cost for r in eligible),  # `_score`'s cost line starts here
        budget_micros=spec.routing.max_estimated_cost_micros,
        latency_good_s=cfg.latency_good_s,
        latency_bad_s=cfg.latency_bad_s,
        capacity=ctx.capacity,
    )


def choose(
    facts: DecisionFacts,
    eligible: Sequence[tuple[str, bool]],
    scores: Mapping[str, float],
    policy: scoring.RoutingPolicy,
) -> tuple[tuple[str, ...], str, int | None]:
    """(lease fall-through order, why, bucket) among the eligible (id, is canary) pairs in id
    order, given their scores; route replay calls this with recorded facts and a new policy."""
    canaries = [cid for cid, canary in eligible if canary]
    normal = _ranked(scores, [cid for cid, canary in eligible if not canary])
    preferred = facts.mode == RoutingMode.PREFERRED.value
    pinned_ids = facts.pinned
    if preferred:
        # The pinned model wins whenever it is eligible; others only as an equivalent fallback.
        normal = [p for p in normal if p[0] in pinned_ids] + [
            p for p in normal if p[0] not in pinned_ids
        ]
    if canaries:
        head_canary = _ranked(scores, canaries)[0][0]
        return (head_canary, *(cid for cid, _ in normal)), "canary_admitted", None
    head = normal
    if preferred:
        head = [p for p in normal if p[0] in pinned_ids] or normal
    chosen, why, slot = _select(facts, head, policy)
    return (chosen, *(cid for cid, _ in normal if cid != chosen)), why, slot


def _apply_canary(
    task_id: str,
    spec: GenerationSpec,
    rows: list[_Row | Verdict],
    ctx: RoutingContext,
    policy: scoring.RoutingPolicy,
) -> None:
    """Canary candidates take only admitted traffic: a bucketed share of their stage (the
    policy's stages for that candidate), never STRICT/high-value; a negative stage is a rolled
    back canary, which takes none."""
    strict = spec.routing.mode is RoutingMode.STRICT_MODEL
    for i, row in enumerate(rows):
        if not isinstance(row, _Row):
            continue  # already rejected
        stage = ctx.canary_stages.get(row.entry.id)
        if stage is None:
            continue
        row.canary = True
        plan = scoring.CanaryPlan(policy.canaries.get(row.entry.id, policy.canary))
        value = max(row.cost or 0, spec.routing.max_estimated_cost_micros)
        if stage < 0 or stage >= len(plan.config.shares):
            admitted, why = False, "canary rolled back"
        else:
            admitted = plan.admits(task_id, stage, strict, value)
            why = "STRICT task" if strict else f"not in the stage-{stage} share or high value"
        if not admitted:
            rows[i] = Verdict(
                row.entry.candidate,
                False,
                Reason.CANARY_NOT_ADMITTED.value,
                why,
                None,
                _NONE,
                _NONE,
                row.cost,
                row.result,
                True,
            )
