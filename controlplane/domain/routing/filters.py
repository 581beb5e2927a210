"""The hard constraints of routing (design 9.10 steps 3-7): which candidates may run a task at all.

The order is the design's, first failing filter wins:

3. capability: failover exclusions (hard ones always; soft ones, see below), STRICT pinning,
   ``routing.required_provider`` and ``routing.required_model`` (hard filters in every routing
   mode: "must run the task", never a preference), lifecycle (no
   new work on SUNSET), mode, inputs (last frame, references, samples),
   aspect/resolution/duration through the capability's constraint expressions;
4. account (disabled by the accounts document: ACCOUNT_DISABLED), region and tenant policy
   (the task's region, the tenant's allowed regions, the account's regions);
5. budget against the catalog price (and again against the compiled estimate);
6. circuit breaker (OPEN refuses; HALF_OPEN probes are admitted by execution);
7. capacity (lease pre-check: no free slot, or the unknown-submit budget is full); then the
   adapter's compile verdict (`compile_reject`): REJECT is ineligible, DEGRADE needs
   ``allow_semantic_degrade`` (and a PREFERRED fallback must be exact/lossless). Only the
   sidecar's own answer is a verdict: a Compile that timed out or never reached it (the sidecar
   stopped, restarting, overloaded) is COMPILE_UNAVAILABLE, a transient reason like NO_CAPACITY.

Soft exclusions (`RoutingContext.soft_excluded`, 9.15 / `controlplane.domain.failover`): a
candidate that failed this task for its endpoint's health is passed over while any other
candidate is eligible; when none is, `selection.route` decides again with the soft exclusions
lifted: the candidate is eligible again once its ``retry_at`` has passed (before that it is
RETRY_BACKOFF, a transient reason) and its breaker admits it.

A candidate refused only for a `TRANSIENT_REASONS` reason may become eligible by itself: the task
waits (NO_CAPACITY) rather than fails.

Fast path: `screen` runs steps 3-6 of every candidate ONCE per decision over the catalog's
`plan.CatalogPlan` (static parts precomputed per catalog version, constraint rules compiled,
equal capabilities checked once); the dispatcher gathers capacity for the survivors and hands
the `Screen` to `selection.route`, which adds the capacity check and the compile verdict and
combines the soft-exclusion passes without filtering again. `hard_reject` is the same code for
one candidate.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from enum import StrEnum
from math import gcd

from controlplane.domain.routing.candidates import (
    Candidate,
    CapacityView,
    CompileResult,
    RoutingContext,
    TransformKind,
)
from controlplane.domain.routing.plan import (
    TABLE_SIZE,
    CandidatePlan,
    CapabilityPlan,
    CatalogPlan,
    build_plan,
    plan_for,
)
from vidroute_core.capabilities.constraints import ConstraintError
from vidroute_core.spec import GenerationSpec, RoutingMode


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
    ACCOUNT_DISABLED = "ACCOUNT_DISABLED"


#: Reasons that may clear by themselves: a task rejected only for these waits, never fails.
TRANSIENT_REASONS = frozenset(
    {Reason.NO_CAPACITY, Reason.CIRCUIT_OPEN, Reason.RETRY_BACKOFF, Reason.COMPILE_UNAVAILABLE}
)

Rejection = tuple[Reason, str]
_CONSTRAINT = Reason.RESOLUTION_DURATION_CONSTRAINT
_UNKNOWN = object()
SOFT_DETAIL = "endpoint failed earlier for this task (soft)"


def aspect_label(width: int, height: int) -> str:
    d = gcd(width, height) or 1
    return f"{width // d}:{height // d}"


def pinned(spec: GenerationSpec, c: Candidate) -> bool:
    """Whether a PREFERRED task prefers `c`: one of its ``preferred_providers`` (any candidate
    when it names none). Preferred candidates win whenever eligible; the others are a fallback
    that must be equivalent. ``required_provider`` / ``required_model`` are no preference: they
    are hard filters in every mode, so every candidate asked about here already matches them."""
    preferred = spec.routing.preferred_providers
    return not preferred or c.provider in preferred


class _Task:
    """The task's side of the filters, read out of the spec once per decision."""

    __slots__ = (
        "aspect",
        "budget",
        "budget_currency",
        "degrade_ok",
        "duration_ms",
        "env",
        "has_last_frame",
        "height",
        "mode_value",
        "price_units",
        "references",
        "region",
        "required_model",
        "required_provider",
        "samples",
        "shape",
        "short_side",
        "strict",
        "strict_detail",
        "wanted_s",
        "whole_seconds",
        "width",
        "with_audio",
    )

    def __init__(self, spec: GenerationSpec) -> None:
        out, r = spec.output, spec.routing
        self.mode_value = spec.mode.value
        self.has_last_frame = spec.last_frame is not None
        self.references = len(spec.references)
        self.samples = max(1, out.sample_count)
        self.width, self.height = out.width, out.height
        self.short_side = min(out.width, out.height)
        self.aspect = aspect_label(out.width, out.height)
        self.duration_ms = out.duration_ms
        self.wanted_s = out.duration_ms // 1000
        self.whole_seconds = out.duration_ms % 1000 == 0
        self.with_audio = out.with_audio
        self.degrade_ok = r.allow_semantic_degrade
        self.strict = r.mode is RoutingMode.STRICT_MODEL
        self.strict_detail = f"task pins {r.required_provider or '*'}/{r.required_model or '*'}"
        self.required_provider, self.required_model, self.region = (
            r.required_provider,
            r.required_model,
            r.region,
        )
        self.budget, self.budget_currency = r.max_estimated_cost_micros, r.currency
        # Price.estimate: whole seconds (rounded up) x samples x the per-second price.
        self.price_units = -(-out.duration_ms // 1000) * self.samples
        # Everything `_capability_reject` reads of the task: the key of a capability's table.
        self.shape = (
            self.mode_value,
            self.has_last_frame,
            self.references,
            self.samples,
            out.width,
            out.height,
            out.duration_ms,
            out.with_audio,
            self.degrade_ok,
            bool(spec.negative_prompt),
            spec.seed is not None,
        )
        self.env: dict[str, str | int | bool] = {
            "mode": self.mode_value,
            "aspect_ratio": self.aspect,
            "sample_count": self.samples,
            "has_last_frame": self.has_last_frame,
            "reference_count": self.references,
            "has_negative_prompt": bool(spec.negative_prompt),
            "has_seed": spec.seed is not None,
        }

    def over_budget(self, cost: int, currency: str) -> str | None:
        limit = self.budget
        if limit <= 0:
            return None
        if currency != self.budget_currency:
            return f"priced in {currency}, budget in {self.budget_currency}"
        if cost > limit:
            return f"estimated {cost} micros > budget {limit}"
        return None


def _capability_reject(t: _Task, cap: CapabilityPlan) -> Rejection | None:
    if t.mode_value not in cap.modes:
        return Reason.UNSUPPORTED_MODE, f"{t.mode_value} not in {cap.modes_text}"
    if t.has_last_frame and not cap.supports_last_frame:
        return Reason.UNSUPPORTED_INPUT, "model does not accept a last frame"
    if t.references > cap.max_reference_images:
        return Reason.UNSUPPORTED_INPUT, (
            f"{t.references} reference images; model accepts {cap.max_reference_images}"
        )
    if t.samples > cap.max_sample_count:
        return Reason.UNSUPPORTED_INPUT, f"{t.samples} samples; model max {cap.max_sample_count}"
    if t.aspect not in cap.aspect_ratios:
        return _CONSTRAINT, f"aspect ratio {t.aspect} not offered ({cap.aspects_text})"
    ranked = cap.ranked_resolutions
    resolution = next((label for label, px in ranked if px >= t.short_side), None)
    if resolution is None:
        if not t.degrade_ok:
            return _CONSTRAINT, f"{t.width}x{t.height} exceeds the model's best {ranked[-1][0]}"
        resolution = ranked[-1][0]
    audio = (t.with_audio and cap.native_audio) or (cap.native_audio and not cap.audio_optional)
    return _duration_reject(t, cap, resolution, audio)


def _duration_reject(
    t: _Task, cap: CapabilityPlan, resolution: str, audio: bool
) -> Rejection | None:
    env = dict(t.env)
    env["resolution"] = resolution
    env["with_audio"] = audio
    rules = cap.rules
    legal: list[int] = []
    try:
        exact = t.whole_seconds and t.wanted_s in cap.durations
        if exact:
            env["duration_seconds"] = t.wanted_s
            if rules.holds(env):
                return None  # the common case: one evaluation, no search
            broken = rules.violations(env)
        for d in cap.durations:
            env["duration_seconds"] = d
            if rules.holds(env):
                legal.append(d)
        if legal and t.degrade_ok:
            return None  # the adapter records the duration change as a DEGRADE
        if exact:
            return _CONSTRAINT, "; ".join(c.describe() for c in broken)
    except ConstraintError as exc:
        return _CONSTRAINT, f"constraint evaluation failed: {exc}"
    shown = legal or cap.offered_text
    return _CONSTRAINT, f"{t.duration_ms} ms at {resolution}: legal durations {shown} s"


def _static_reject(
    t: _Task,
    e: CandidatePlan,
    ctx: RoutingContext,
    seen: dict[int, Rejection | None],
) -> Rejection | None:
    """The filters between the soft exclusion and capacity, first failing wins."""
    pins = (not t.required_model or e.model == t.required_model) and (
        not t.required_provider or e.provider == t.required_provider
    )
    if t.strict and not pins:
        return Reason.STRICT_MODEL_MISMATCH, t.strict_detail
    if t.required_provider and e.provider != t.required_provider:
        # "Provider that must run the task", in every mode: a hard constraint no score overrides.
        return Reason.REQUIRED_PROVIDER_MISMATCH, f"task requires provider {t.required_provider}"
    if t.required_model and e.model != t.required_model:
        # "Model that must run the task", likewise (issue 20: AUTO used to ignore it).
        return Reason.REQUIRED_MODEL_MISMATCH, f"task requires model {t.required_model}"
    if ctx.same_model_only and e.model != ctx.same_model_only:
        return Reason.STRICT_MODEL_MISMATCH, f"failover keeps model {ctx.same_model_only}"
    if e.lifecycle == "sunset" or (e.sunset_at is not None and e.sunset_at <= ctx.now):
        return Reason.SUNSET, f"lifecycle {e.lifecycle}, sunset {e.sunset_at}"
    account = None if ctx.accounts is None else ctx.accounts.entry(e.provider, e.account)
    if account is not None and not account.enabled:
        return Reason.ACCOUNT_DISABLED, (
            f"account {e.provider}/{e.account} is disabled (accounts {ctx.accounts_version})"
        )
    cap = e.capability
    key = id(cap)  # candidates of equal capability content share one check
    if key in seen:
        rejected = seen[key]
    else:
        table = cap.verdicts  # and tasks of one shape share it across decisions
        found = table.get(t.shape, _UNKNOWN)
        if found is _UNKNOWN:
            found = _capability_reject(t, cap)
            if len(table) >= TABLE_SIZE:
                table.clear()
            table[t.shape] = found
        rejected = seen[key] = found  # type: ignore[assignment]  # the table holds Rejections
    if rejected is not None:
        return rejected
    if t.region and e.region != t.region:
        return Reason.REGION_NOT_ALLOWED, f"task requires region {t.region}, candidate {e.region}"
    if ctx.allowed_regions is not None and e.region not in ctx.allowed_regions:
        return Reason.REGION_NOT_ALLOWED, f"tenant policy excludes region {e.region}"
    if account is not None and account.regions and e.region not in account.regions:
        return Reason.REGION_NOT_ALLOWED, (
            f"account {e.provider}/{e.account} runs in {', '.join(account.regions)} only"
        )
    if t.budget > 0:
        per_s = e.micros_per_second
        if t.with_audio and e.micros_per_second_with_audio is not None:
            per_s = e.micros_per_second_with_audio
        over = t.over_budget(per_s * t.price_units, e.currency)
        if over is not None:
            return Reason.OVER_BUDGET, over
    if e.id in ctx.circuit_open:
        return Reason.CIRCUIT_OPEN, ctx.circuit_open[e.id]
    return None


NOT_SOFT = object()  # `Screen.soft` of a candidate without a soft exclusion


def capacity_reject(cap: CapacityView | None) -> Rejection | None:
    """The last hard filter, the lease pre-check; None when a slot is free (or unknown)."""
    if cap is None:
        return None
    if cap.closed:
        return Reason.NO_CAPACITY, cap.closed
    if not cap.accepting_new:
        return Reason.NO_CAPACITY, "unknown-submission budget full; not accepting new work"
    if cap.available <= 0:
        return Reason.NO_CAPACITY, f"0 of {cap.maximum} slots free"
    return None


class Screen:
    """Every candidate's hard filters for one task, run once; `reject` reads them per pass.

    Capacity is gathered after the screen (only for its survivors), so it is checked in
    `reject`, last, as in the design's order; a soft exclusion applies or is lifted per pass.
    """

    __slots__ = ("ctx", "head", "lifted", "plan", "rest", "soft", "spec", "task")

    def __init__(
        self, spec: GenerationSpec, plan: CatalogPlan, ctx: RoutingContext, task: _Task
    ) -> None:
        self.spec, self.plan, self.ctx, self.task = spec, plan, ctx, task
        head: list[Rejection | None] = []
        soft: list[object] = []
        rest: list[Rejection | None] = []
        seen: dict[int, Rejection | None] = {}
        lifted: list[int] = []
        excluded, soft_excluded, now = ctx.excluded, ctx.soft_excluded, ctx.now
        for i, e in enumerate(plan.entries):
            if e.exclusion_key in excluded:
                head.append((Reason.EXCLUDED_BY_FAILOVER, "failed earlier for this task"))
                soft.append(NOT_SOFT)
                rest.append(None)
                continue
            head.append(None)
            retry_at = soft_excluded.get(e.exclusion_key, NOT_SOFT) if soft_excluded else NOT_SOFT
            soft.append(retry_at)
            rejected = _static_reject(task, e, ctx, seen)
            rest.append(rejected)
            # `reject(i, lifted=True, no capacity)`, inlined: the survivors' list.
            if rejected is None and not (isinstance(retry_at, datetime) and retry_at > now):
                lifted.append(i)
        # Per entry: the hard exclusion, the soft one (retry_at or NOT_SOFT), the other filters;
        # and the entries that pass all but capacity with soft exclusions lifted.
        self.head, self.soft, self.rest, self.lifted = head, soft, rest, lifted

    def matches(
        self,
        spec: GenerationSpec,
        candidates: Sequence[Candidate],
        catalog_version: str,
        ctx: RoutingContext,
    ) -> bool:
        """Whether this screen holds for `spec` and `candidates` under `ctx` (whose capacity
        and health may be newer: they are read after the screen)."""
        s = self.ctx
        return (
            self.spec is spec
            and self.plan.version == catalog_version
            and self.plan.built_from(candidates)
            and s.now == ctx.now
            and s.excluded == ctx.excluded
            and s.soft_excluded == ctx.soft_excluded
            and s.same_model_only == ctx.same_model_only
            and s.allowed_regions == ctx.allowed_regions
            and s.accounts is ctx.accounts
            and s.circuit_open == ctx.circuit_open
        )

    def reject(
        self, i: int, lifted: bool, capacity: Mapping[str, CapacityView]
    ) -> Rejection | None:
        """Entry `i`'s verdict, soft exclusions applied unless `lifted`; None when compilable."""
        head = self.head[i]
        if head is not None:
            return head
        retry_at = self.soft[i]
        if retry_at is not NOT_SOFT:
            if not lifted:
                return Reason.EXCLUDED_BY_FAILOVER, SOFT_DETAIL
            if isinstance(retry_at, datetime) and retry_at > self.ctx.now:
                return Reason.RETRY_BACKOFF, f"no new attempt on it before {retry_at.isoformat()}"
        rest = self.rest[i]
        if rest is not None:
            return rest
        return capacity_reject(capacity.get(self.plan.entries[i].id)) if capacity else None

    def survivors(self, capacity: Mapping[str, CapacityView] | None = None) -> list[Candidate]:
        """Candidates worth an adapter Compile call (soft exclusions lifted: the second pass
        of `route` may need them), in id order."""
        cap = capacity if capacity is not None else self.ctx.capacity
        entries, lifted = self.plan.entries, self.lifted
        if not cap:
            return [entries[i].candidate for i in lifted]
        return [
            e.candidate for i in lifted if capacity_reject(cap.get((e := entries[i]).id)) is None
        ]


def screen(
    spec: GenerationSpec,
    candidates: Sequence[Candidate],
    ctx: RoutingContext,
    catalog_version: str = "",
) -> Screen:
    """Run the hard filters of every candidate once (the catalog plan is cached per version)."""
    return Screen(spec, plan_for(candidates, catalog_version), ctx, _Task(spec))


def hard_reject(spec: GenerationSpec, c: Candidate, ctx: RoutingContext) -> Rejection | None:
    """Steps 3-7 for one candidate, first failing filter wins; None when it may be compiled."""
    one = Screen(spec, build_plan([c]), ctx, _Task(spec))
    return one.reject(0, ctx.soft_lifted, ctx.capacity)


def compile_reject(
    spec: GenerationSpec, c: Candidate, result: CompileResult | None
) -> Rejection | None:
    """The end of step 7: the adapter's compile verdict and its estimate; None when runnable."""
    if result is None:
        return Reason.COMPILE_REJECT, "not compiled"
    if result.error and result.transient:
        return Reason.COMPILE_UNAVAILABLE, f"no compile verdict: {result.error}"
    if result.error:
        return Reason.COMPILE_REJECT, f"compile failed: {result.error}"
    rejects: list[str] = []
    degrades: list[str] = []
    for f, k, d in result.transformations:
        if k is TransformKind.REJECT:
            rejects.append(f"{f}: {d}")
        elif k is TransformKind.DEGRADE:
            degrades.append(f"{f}: {d}")
    if rejects or not result.submittable:
        detail = "; ".join(rejects) or "adapter marked the plan not submittable"
        if rejects and all("DEGRADE not permitted" in r for r in rejects):
            return Reason.DEGRADE_NOT_ALLOWED, detail
        return Reason.COMPILE_REJECT, detail
    r = spec.routing
    if degrades and not r.allow_semantic_degrade:
        return Reason.DEGRADE_NOT_ALLOWED, "; ".join(degrades)
    if degrades and r.mode is RoutingMode.PREFERRED and not pinned(spec, c):
        return Reason.DEGRADE_NOT_ALLOWED, "a PREFERRED fallback must be equivalent: " + "; ".join(
            degrades
        )
    limit = r.max_estimated_cost_micros
    if limit > 0:
        if result.currency != r.currency:
            return Reason.OVER_BUDGET, f"priced in {result.currency}, budget in {r.currency}"
        if result.estimated_cost_micros > limit:
            return Reason.OVER_BUDGET, (
                f"estimated {result.estimated_cost_micros} micros > budget {limit}"
            )
    return None


def prefilter(
    spec: GenerationSpec, candidates: Sequence[Candidate], ctx: RoutingContext
) -> list[Candidate]:
    """Candidates that pass every static filter: the only ones worth an adapter Compile call.

    Soft exclusions are lifted here: the second pass of `route` may need those candidates.
    In id order; the dispatcher keeps the `screen` instead and hands it to `route`."""
    return screen(spec, candidates, ctx).survivors()
