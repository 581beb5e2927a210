"""The static half of routing, computed once per catalog version (design 9.10 fast path, 9.6.2).

A candidate's capability, price and identity do not change between decisions; only the task and
the dynamic facts do. `plan_for` turns a catalog's candidates into a `CatalogPlan` once per
catalog version: candidates sorted by id (the order of a decision's verdicts), each with its id,
exclusion key and price read out of the dataclasses, and a `CapabilityPlan` holding what the
hard filters test (mode set, aspect set, resolutions ranked by pixels, durations, audio flags,
the constraint rules compiled by `vidroute_core.capabilities.compiled`) and the texts of the
rejection details, so the per-decision loop reads plain attributes and never walks a dataclass.

Candidates whose capabilities have equal content (the same model served by many accounts) share
one `CapabilityPlan`, so a decision checks a capability once, not once per account; and the
plan keeps each capability's verdict per task shape (the spec fields the check reads: mode,
inputs, size, duration, audio, degrade permission), a table filled as tasks come, since a
capability's verdict depends on nothing else.

The cache is keyed by the catalog version and checked by identity against the candidates it was
built from: a catalog change (a new version, or other candidate objects under the same version)
builds a new plan; the last `PLAN_CACHE_SIZE` plans are kept. Pure: no I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING

from controlplane.domain.routing.candidates import Candidate
from vidroute_core.capabilities.compiled import CompiledRules, compile_rules

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

PLAN_CACHE_SIZE = 8
TABLE_SIZE = 512  # task shapes remembered per capability


@dataclass(frozen=True, slots=True)
class CapabilityPlan:
    """What the hard filters test of one capability content, with the texts their details use."""

    modes: frozenset[str]  # Mode values: a str hashes in C, a Mode member in Python
    modes_text: str  # "['TEXT_TO_VIDEO', ...]", as the UNSUPPORTED_MODE detail shows it
    supports_last_frame: bool
    max_reference_images: int
    max_sample_count: int
    aspect_ratios: frozenset[str]
    aspects_text: str
    ranked_resolutions: tuple[tuple[str, int], ...]  # (label, pixels), fewest pixels first
    durations: tuple[int, ...]
    offered_text: str
    native_audio: bool
    audio_optional: bool
    rules: CompiledRules
    # The capability's verdict per task shape (`filters._Task.shape`): filled as tasks come,
    # dropped with the plan when the catalog changes, cleared when it holds TABLE_SIZE shapes.
    verdicts: dict[tuple[object, ...], object] = field(
        default_factory=dict, compare=False, repr=False
    )


@dataclass(frozen=True, slots=True)
class CandidatePlan:
    """One candidate with the fields a decision reads, out of the nested dataclasses."""

    candidate: Candidate
    id: str
    account_id: int
    exclusion_key: tuple[int, str]  # (account_id, model): the failover exclusions' key
    provider: str
    account: str
    model: str
    region: str
    lifecycle: str
    sunset_at: datetime | None
    deprecated: bool
    currency: str
    micros_per_second: int
    micros_per_second_with_audio: int | None
    capability: CapabilityPlan


@dataclass(frozen=True, slots=True)
class CatalogPlan:
    """A catalog version's candidates, sorted by id, with their static parts precomputed."""

    version: str
    entries: tuple[CandidatePlan, ...]
    source: tuple[Candidate, ...]  # the candidates it was built from, in the caller's order

    def clear_tables(self) -> None:
        """Forget every capability's verdict table (as for the first task of each shape)."""
        for entry in self.entries:
            entry.capability.verdicts.clear()

    def built_from(self, candidates: Sequence[Candidate]) -> bool:
        """Whether `candidates` are the very objects this plan was built from."""
        src = self.source
        if src is candidates:  # the catalog's own tuple: the dispatcher's case
            return True
        if len(src) != len(candidates):
            return False
        for a, b in zip(src, candidates, strict=True):  # noqa: SIM110 - no generator per call
            if a is not b:
                return False
        return True


def _content_key(cap: Capability) -> tuple[object, ...]:
    return (
        cap.modes,
        cap.supports_last_frame,
        cap.max_reference_images,
        cap.max_sample_count,
        cap.aspect_ratios,
        cap.resolutions,
        cap.durations_seconds,
        cap.native_audio,
        cap.audio_optional,
        cap.constraints,
    )


def capability_plan(cap: Capability) -> CapabilityPlan:
    """The filter-relevant parts of `cap`, with its constraint rules compiled."""
    ranked = sorted(cap.resolutions, key=lambda r: RESOLUTION_PX.get(r, 0))
    return CapabilityPlan(
        modes=frozenset(m.value for m in cap.modes),
        modes_text=str([m.value for m in cap.modes]),
        supports_last_frame=cap.supports_last_frame,
        max_reference_images=cap.max_reference_images,
        max_sample_count=cap.max_sample_count,
        aspect_ratios=frozenset(cap.aspect_ratios),
        aspects_text=", ".join(cap.aspect_ratios),
        ranked_resolutions=tuple((r, RESOLUTION_PX.get(r, 0)) for r in ranked),
        durations=tuple(cap.durations_seconds),
        offered_text=", ".join(str(d) for d in cap.durations_seconds),
        native_audio=cap.native_audio,
        audio_optional=cap.audio_optional,
        rules=compile_rules(cap.constraints),
    )


def build_plan(candidates: Sequence[Candidate], version: str = "") -> CatalogPlan:
    """Precompute the static parts of every candidate (uncached; see `plan_for`)."""
    shared: dict[tuple[object, ...], CapabilityPlan] = {}
    entries = []
    for c in sorted(candidates, key=lambda c: c.id):
        key = _content_key(c.capability)
        cap = shared.get(key)
        if cap is None:
            cap = shared[key] = capability_plan(c.capability)
        entries.append(
            CandidatePlan(
                candidate=c,
                id=c.id,
                account_id=c.account_id,
                exclusion_key=(c.account_id, c.model),
                provider=c.provider,
                account=c.account,
                model=c.model,
                region=c.region,
                lifecycle=c.lifecycle,
                sunset_at=c.sunset_at,
                deprecated=c.lifecycle == "deprecated",
                currency=c.price.currency,
                micros_per_second=c.price.micros_per_second,
                micros_per_second_with_audio=c.price.micros_per_second_with_audio,
                capability=cap,
            )
        )
    return CatalogPlan(version, tuple(entries), tuple(candidates))


_PLANS: dict[str, CatalogPlan] = {}


def plan_for(candidates: Sequence[Candidate], version: str = "") -> CatalogPlan:
    """The cached plan of `candidates` under `version`; built when the catalog changed."""
    plan = _PLANS.get(version)
    if plan is not None and plan.built_from(candidates):
        return plan
    plan = build_plan(candidates, version)
    _PLANS.pop(version, None)
    _PLANS[version] = plan
    while len(_PLANS) > PLAN_CACHE_SIZE:
        del _PLANS[next(iter(_PLANS))]
    return plan


def cached_versions() -> tuple[str, ...]:
    """The catalog versions whose plans are cached, oldest first (for tests and metrics)."""
    return tuple(_PLANS)
