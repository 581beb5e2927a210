"""A capability release's samples, diff and serving check (`controlplane.capabilities`), pure."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from controlplane.capabilities.publish import canonical_document, documents_from_file
from controlplane.capabilities.release import (
    ADDED,
    CHANGED,
    REMOVED,
    UNCHANGED,
    Entry,
    breaking,
    diff,
    release_version,
)
from controlplane.capabilities.samples import MAX_SAMPLES, sample_specs, unrequestable
from controlplane.domain.routing.filters import aspect_label
from vidroute_core.capabilities.loader import Capability, load_file
from vidroute_core.spec import Mode

ROOT = Path(__file__).resolve().parents[3]
RUNWAY = ROOT / "adapter_sidecars/runway/capabilities/runway-2026-06.yaml"


def _gen45() -> Capability:
    return next(c for c in load_file(RUNWAY) if c.model == "gen4.5")


def test_samples_cover_every_requestable_shape_the_constraints_allow() -> None:
    """gen4.5's samples name every requestable ratio and every duration, in both modes, and
    none breaks its constraint (text-to-video is 16:9 or 9:16 only)."""
    cap = _gen45()
    samples = sample_specs(cap)
    ratios = {aspect_label(s.spec.output.width, s.spec.output.height) for s in samples}
    assert ratios == set(cap.aspect_ratios) - set(unrequestable(cap))
    assert unrequestable(cap) == ["21:9"]  # reduces to 7:3: no request can name it
    assert {s.spec.output.duration_ms // 1000 for s in samples} == set(cap.durations_seconds)
    assert {s.spec.mode for s in samples} == {Mode.TEXT_TO_VIDEO, Mode.IMAGE_TO_VIDEO}
    t2v = {
        aspect_label(s.spec.output.width, s.spec.output.height)
        for s in samples
        if s.spec.mode is Mode.TEXT_TO_VIDEO
    }
    assert t2v == {"16:9", "9:16"}
    assert all(s.spec.first_frame for s in samples if s.spec.mode is Mode.IMAGE_TO_VIDEO)


def test_a_huge_value_space_gets_a_covering_set() -> None:
    """Past MAX_SAMPLES shapes, every value of every axis still appears at least once."""
    cap = dataclasses.replace(_gen45(), durations_seconds=tuple(range(1, 200)), constraints=())
    samples = sample_specs(cap)
    assert len(samples) < MAX_SAMPLES
    assert {s.spec.output.duration_ms // 1000 for s in samples} == set(range(1, 200))


def _entry(model: str = "gen4.5", **changes: object) -> Entry:
    doc = dict(canonical_document({**documents_from_file(RUNWAY)[0], "account": "a"}))
    base = Entry("runway", "a", model, "v1", "stable", doc, "p1", 120000)
    return dataclasses.replace(base, **changes)  # type: ignore[arg-type]  # test fields


def test_the_diff_names_what_changed_per_model() -> None:
    """A new price is CHANGED with the price field named; an identical entry is UNCHANGED; a
    model the catalog lacks is ADDED; a complete catalog without a model REMOVES it."""
    old = _entry()
    doc = {**old.document, "commercial": {**old.document["commercial"], "price_version": "p2"}}
    dearer = dataclasses.replace(old, document=doc, price_version="p2", price_micros=132000)
    new_model = _entry("gen5")
    kinds = {c.model: c for c in diff([old], [dearer, new_model])}
    assert kinds["gen4.5"].kind == CHANGED
    assert kinds["gen4.5"].fields == ("commercial.price_version",)
    assert (kinds["gen4.5"].old_price_micros, kinds["gen4.5"].new_price_micros) == (120000, 132000)
    assert kinds["gen5"].kind == ADDED
    assert [c.kind for c in diff([old], [old])] == [UNCHANGED]
    assert [c.kind for c in diff([old], [], complete=True)] == [REMOVED]


def test_only_serving_models_that_would_break_are_named() -> None:
    """Retired, removed and failing-sample serving models are named with why; a model that
    does not serve today, or one untouched, is not."""
    serving, other = _entry(), _entry("gen4_turbo")
    gone = _entry("veo3.1", lifecycle="sunset")  # does not serve: never "breaks"
    retired = dataclasses.replace(serving, lifecycle="sunset")
    assert breaking([serving, other, gone], {serving.key: retired}, {}) == [
        "runway/gen4.5@a: retired (status sunset)"
    ]
    assert breaking([serving], {serving.key: None}, {}) == [
        "runway/gen4.5@a: removed from the catalog"
    ]
    failing = breaking([serving], {serving.key: serving}, {serving.key: ["4:3: no ratio"]})
    assert failing == ["runway/gen4.5@a: sample compile fails (4:3: no ratio)"]
    assert breaking([gone], {gone.key: None}, {}) == []


def test_a_release_is_named_by_its_text() -> None:
    """The same text names the same release (a retry); another text another one."""
    assert release_version("a: 1\n") == release_version("a: 1\n")
    assert release_version("a: 1\n") != release_version("a: 2\n")
