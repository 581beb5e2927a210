"""The hard constraints of routing (design 9.10 steps 3-7): which candidates may run a task at all.

The order is the design's, first failing filter wins:

3. capability: failover exclusions (hard ones always; soft ones, see below), STRICT/PREFERRED
   pinning, ``routing.required_provider`` (a hard filter in every routing mode), lifecycle (no
   new work on SUNSET), mode, inputs (last frame, references, samples),
   aspect/resolution/duration through the capability's constraint expressions;
4. region and tenant policy;
5. budget against the catalog price (and again against the compiled estimate);
6. circuit breaker (OPEN refuses; HALF_OPEN probes are admitted by execution);
7. capacity (lease pre-check: no free slot, or the unknown-submit budget is full); then the
   adapter's compile verdict (`compile_reject`): REJECT is ineligible, DEGRADE needs
   ``allow_semantic_degrade`` (and a PREFERRED fallback must be exact/lossless).

Soft exclusions (`RoutingContext.soft_excluded`, 9.15 / `controlplane.domain.failover`): a
candidate that failed this task for its endpoint's health is passed over while any other
candidate is eligible; when none is, `selection.route` decides again with the soft exclusions
lifted: the candidate is eligible again once its ``retry_at`` has passed (before that it is
RETRY_BACKOFF, a transient reason) and its breaker admits it.

A candidate refused only for a `TRANSIENT_REASONS` reason may become eligible by itself: the task
waits (NO_CAPACITY) rather than fails.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from datetime import datetime
from enum import StrEnum
from math import gcd
from typing import TYPE_CHECKING

from controlplane.domain.routing.candidates import (
    Candidate,
    CompileResult,
    RoutingContext,
    TransformKind,
)
from vidroute_core.capabilities.constraints import ConstraintError, violations
from vidroute_core.spec import GenerationSpec, RoutingMode

if TYPE_CHECKING:  # the loader pulls in YAML/JSON Schema; the domain only reads the fields
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
    SUNSET = "SUNSET"
    UNSUPPORTED_MODE = "UNSUPPORTED_MODE"
    UNSUPPORTED_INPUT = "UNSUPPORTED_INPUT"
    RESOLUTION_DURATION_CONSTRAINT = "RESOLUTION_DURATION_CONSTRAINT"
    REGION_NOT_ALLOWED = "REGION_NOT_ALLOWED"
    OVER_BUDGET = "OVER_BUDGET"
    CIRCUIT_OPEN = "CIRCUIT_OPEN"
    NO_CAPACITY = "NO_CAPACITY"
    COMPILE_REJECT = "COMPILE_REJECT"
    DEGRADE_NOT_ALLOWED = "DEGRADE_NOT_ALLOWED"
    CANARY_NOT_ADMITTED = "CANARY_NOT_ADMITTED"


#: Reasons that may clear by themselves: a task rejected only for these waits, never fails.
TRANSIENT_REASONS = frozenset({Reason.NO_CAPACITY, Reason.CIRCUIT_OPEN, Reason.RETRY_BACKOFF})


def aspect_label(width: int, height: int) -> str:
    d = gcd(width, height) or 1
    return f"{width // d}:{height // d}"


def pinned(spec: GenerationSpec, c: Candidate) -> bool:
    """Whether `c` is the provider/model the task names (STRICT must be, PREFERRED wins if so)."""
    r = spec.routing
    if r.required_model and c.model != r.required_model:
        return False
    return not r.required_provider or c.provider == r.required_provider


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
    if degrades and spec.routing.mode is RoutingMode.PREFERRED and not pinned(spec, c):
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
