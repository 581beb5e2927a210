"""Quality aggregation rules (design 9.14): tag buckets, shrinkage toward the prior, intervals."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st

from controlplane.domain.quality import (
    BUCKET_VALUES,
    QualityConfig,
    QualityCounts,
    QualityTable,
    bucket_key,
    estimate,
    parse_bucket,
)
from vidroute_core.spec import AssetRef, GenerationSpec, Mode, OutputSpec

REF = AssetRef(object_uri="s3://bucket/ref.png", mime_type="image/png")


def spec(  # noqa: PLR0917 - a test builder: positional defaults read best at the call sites
    width: int = 1280,
    height: int = 720,
    ms: int = 5000,
    audio: bool = False,
    refs: int = 0,
    prompt: str = "a fox",
) -> GenerationSpec:
    return GenerationSpec(
        tenant_id="t",
        prompt=prompt,
        mode=Mode.TEXT_TO_VIDEO,
        output=OutputSpec(width=width, height=height, duration_ms=ms, with_audio=audio),
        references=(REF,) * refs,
    )


specs = st.builds(
    spec,
    width=st.integers(16, 8192),
    height=st.integers(16, 8192),
    ms=st.integers(1, 120_000),
    audio=st.booleans(),
    refs=st.integers(0, 4),
    prompt=st.text(max_size=20),
)
counts = st.builds(
    lambda a, r, g, checks, d: QualityCounts(a, r, g, checks, min(d, checks)),
    st.integers(0, 10_000),
    st.integers(0, 10_000),
    st.integers(0, 10_000),
    st.integers(0, 10_000),
    st.integers(0, 10_000),
)
priors = st.floats(0.0, 1.0)


def test_bucket_key_names_each_dimension() -> None:
    """The bucket key spells audio, duration band, reference count band and resolution band."""
    assert bucket_key(spec()) == "audio=false,duration=short,refs=0,resolution=720p"
    key = bucket_key(spec(3840, 2160, 12_000, audio=True, refs=3))
    assert key == "audio=true,duration=long,refs=2+,resolution=4k"
    assert bucket_key(spec(480, 854, 10_000, refs=1)) == (
        "audio=false,duration=medium,refs=1,resolution=480p"
    )


@given(specs)
def test_bucket_key_is_deterministic_and_parses_back(s: GenerationSpec) -> None:
    """Every spec's key parses back into one allowed value per dimension, whatever the prompt."""
    key = bucket_key(s)
    parts = parse_bucket(key)
    assert all(parts[k] in values for k, values in BUCKET_VALUES.items())
    assert bucket_key(dataclasses.replace(s, prompt=s.prompt + "!")) == key


def test_parse_bucket_refuses_foreign_keys() -> None:
    """A bucket string the key function cannot produce is a ValueError."""
    for bad in ("resolution=720p", "audio=maybe,duration=short,refs=0,resolution=720p", "x"):
        with pytest.raises(ValueError, match="not a quality bucket"):
            parse_bucket(bad)


@given(counts, priors)
def test_estimate_is_bounded_and_ordered(c: QualityCounts, prior: float) -> None:
    """Score, technical and user components stay in [0, 1] with low <= score <= high."""
    e = estimate(c, prior)
    assert 0.0 <= e.low <= e.score <= e.high <= 1.0
    assert 0.0 <= e.technical <= 1.0
    assert 0.0 <= e.user <= 1.0


@given(priors)
def test_no_signals_score_the_prior(prior: float) -> None:
    """Without any signal the score is the catalog prior."""
    assert estimate(QualityCounts(), prior).score == pytest.approx(prior)


@given(st.integers(1, 500), priors)
def test_more_rejections_never_raise_the_score(n: int, prior: float) -> None:
    """One more rejection never raises the score; one more acceptance never lowers it."""
    base = QualityCounts(accepted=n, rejected=n)
    worse = dataclasses.replace(base, rejected=n + 1)
    better = dataclasses.replace(base, accepted=n + 1)
    assert estimate(worse, prior).score <= estimate(base, prior).score
    assert estimate(better, prior).score >= estimate(base, prior).score


def test_shrinkage_few_samples_stay_near_the_prior() -> None:
    """Two rejections barely move the score; two hundred move it most of the way, and the
    interval narrows as samples grow."""
    few = estimate(QualityCounts(rejected=2), 0.5)
    many = estimate(QualityCounts(rejected=200), 0.5)
    assert 0.4 < few.score < 0.5
    assert many.score < 0.2
    assert (many.high - many.low) < (few.high - few.low)
    # The user component alone: (k * prior + accepted) / (k + verdicts), k = 10.
    assert few.user == pytest.approx(5 / 12)


def test_technical_defects_weigh_by_technical_weight() -> None:
    """Defects move the technical component only; its share of the score is the weight."""
    cfg = QualityConfig(prior_strength=10, technical_weight=0.3)
    e = estimate(QualityCounts(technical_checks=10, technical_defects=10), 0.5, cfg)
    assert e.technical == pytest.approx(5 / 20)
    assert e.user == pytest.approx(0.5)
    assert e.score == pytest.approx(0.3 * 0.25 + 0.7 * 0.5)


def test_ratios_are_zero_without_verdicts() -> None:
    """Acceptance and regeneration ratios divide by the verdicts, 0 without any."""
    assert QualityCounts().user_acceptance_ratio == 0.0
    c = QualityCounts(accepted=3, rejected=1, regenerated=4)
    assert c.user_acceptance_ratio == pytest.approx(3 / 8)
    assert c.regeneration_ratio == pytest.approx(4 / 8)


def test_counts_refuse_more_defects_than_checks() -> None:
    """Defects above checks (or negative counts) cannot be constructed."""
    with pytest.raises(ValueError, match="technical_defects must be between"):
        QualityCounts(technical_checks=1, technical_defects=2)
    with pytest.raises(ValueError, match="counts are non-negative"):
        QualityCounts(accepted=-1)


def test_table_scores_only_the_asked_bucket() -> None:
    """A table answers for the task's bucket only: another bucket of the same model is absent."""
    x, y = (
        "audio=false,duration=short,refs=0,resolution=720p",
        "audio=false,duration=medium,refs=0,resolution=720p",
    )
    table = QualityTable({("p", "a", "TEXT_TO_VIDEO", x): QualityCounts(rejected=30)})
    cands = [("p/a/acct", "p", "a"), ("p/b/acct", "p", "b")]
    in_x = table.scores(cands, "TEXT_TO_VIDEO", x, 0.5)
    assert set(in_x) == {"p/a/acct"}
    assert in_x["p/a/acct"] < 0.5
    assert table.scores(cands, "TEXT_TO_VIDEO", y, 0.5) == {}
    assert table.scores(cands, "IMAGE_TO_VIDEO", x, 0.5) == {}
