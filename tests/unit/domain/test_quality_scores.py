"""Quality aggregation rules (design 9.14): tag buckets, shrinkage toward the prior, intervals."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st

from controlplane.domain.quality import (
    BUCKET_VALUES,
    TAG_VALUES,
    QualityConfig,
    QualityCounts,
    QualityTable,
    bucket_key,
    estimate,
    gate_pass_rate,
    parse_bucket,
)
from vidroute_core.spec import (
    NO_TAGS,
    AssetRef,
    CameraMotion,
    ContentCategory,
    ContentTags,
    GenerationSpec,
    Mode,
    OutputSpec,
    Style,
)

REF = AssetRef(object_uri="s3://bucket/ref.png", mime_type="image/png")


def spec(  # noqa: PLR0917 - a test builder: positional defaults read best at the call sites
    width: int = 1280,
    height: int = 720,
    ms: int = 5000,
    audio: bool = False,
    refs: int = 0,
    prompt: str = "a fox",
    content: ContentTags = NO_TAGS,
) -> GenerationSpec:
    return GenerationSpec(
        tenant_id="t",
        prompt=prompt,
        mode=Mode.TEXT_TO_VIDEO,
        output=OutputSpec(width=width, height=height, duration_ms=ms, with_audio=audio),
        references=(REF,) * refs,
        content=content,
    )


tags = st.builds(
    ContentTags,
    category=st.none() | st.sampled_from(ContentCategory),
    style=st.none() | st.sampled_from(Style),
    has_human=st.none() | st.booleans(),
    camera_motion=st.none() | st.sampled_from(CameraMotion),
)
specs = st.builds(
    spec,
    width=st.integers(16, 8192),
    height=st.integers(16, 8192),
    ms=st.integers(1, 120_000),
    audio=st.booleans(),
    refs=st.integers(0, 4),
    prompt=st.text(max_size=20),
    content=tags,
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
    assert all(parts[k] in values for k, values in TAG_VALUES.items() if k in parts)
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
    """A table answers from the task's bucket only: another bucket's evidence leaves the model at
    its prior, and each model's own prior is where its score starts."""
    x, y = (
        "audio=false,duration=short,refs=0,resolution=720p",
        "audio=false,duration=medium,refs=0,resolution=720p",
    )
    table = QualityTable({("p", "a", "TEXT_TO_VIDEO", x): QualityCounts(rejected=30)})
    cands = [("p/a/acct", "p", "a", 0.5), ("p/b/acct", "p", "b", 0.8)]
    in_x = table.scores(cands, "TEXT_TO_VIDEO", x)
    assert in_x["p/a/acct"] < 0.5
    assert in_x["p/b/acct"] == 0.8
    assert table.scores(cands, "TEXT_TO_VIDEO", y) == {"p/a/acct": 0.5, "p/b/acct": 0.8}
    assert table.scores(cands, "IMAGE_TO_VIDEO", x) == {"p/a/acct": 0.5, "p/b/acct": 0.8}


def test_evidence_is_shrunk_toward_the_models_own_prior() -> None:
    """The same evidence scores higher for a model whose capability prior is higher."""
    x = "audio=false,duration=short,refs=0,resolution=720p"
    evidence = QualityCounts(accepted=3, rejected=3)
    table = QualityTable(
        {
            ("p", "a", "TEXT_TO_VIDEO", x): evidence,
            ("p", "b", "TEXT_TO_VIDEO", x): evidence,
        }
    )
    got = table.scores([("A", "p", "a", 0.3), ("B", "p", "b", 0.9)], "TEXT_TO_VIDEO", x)
    assert got["A"] < got["B"]
    assert got["A"] == pytest.approx(estimate(evidence, 0.3).score)


def test_content_tags_extend_the_bucket_key_only_when_given() -> None:
    """An untagged spec keeps its pre-tag key; each given tag appends its dimension in order."""
    base = "audio=false,duration=short,refs=0,resolution=720p"
    assert bucket_key(spec()) == base
    tagged = ContentTags(
        category=ContentCategory.PEOPLE,
        style=Style.ANIME,
        has_human=True,
        camera_motion=CameraMotion.ORBIT,
    )
    assert bucket_key(spec(content=tagged)) == (
        base + ",category=people,style=anime,human=true,camera=orbit"
    )
    assert bucket_key(spec(content=ContentTags(has_human=False))) == base + ",human=false"
    assert bucket_key(spec(content=ContentTags(style=Style.RENDER_3D))) == (
        base + ",style=render_3d"
    )


@given(tags, tags)
def test_different_tags_are_different_buckets(a: ContentTags, b: ContentTags) -> None:
    """Two specs alike but for their tags share a bucket exactly when their tags are equal."""
    assert (bucket_key(spec(content=a)) == bucket_key(spec(content=b))) == (a == b)


def test_parse_bucket_refuses_tags_out_of_order_or_vocabulary() -> None:
    """A tag outside its vocabulary, repeated or out of its fixed order is not a bucket."""
    base = "audio=false,duration=short,refs=0,resolution=720p"
    assert parse_bucket(base + ",style=anime,camera=static")["camera"] == "static"
    for bad in (
        base + ",style=watercolour",
        base + ",camera=static,style=anime",
        base + ",style=anime,style=anime",
        base + ",human=maybe",
        base + ",mood=happy",
    ):
        with pytest.raises(ValueError, match="not a quality bucket"):
            parse_bucket(bad)


def test_the_canary_gate_reads_each_well_sampled_bucket() -> None:
    """The gate's pass rate is the lowest of the overall share and each bucket's with enough
    checks: 27 of 30 clean overall, but 7 of 10 in the anime bucket, gates at 0.7; a bucket
    below the minimum speaks only through the overall share; no check is None."""
    plain, anime = "audio=false,duration=short,refs=0,resolution=720p", "...,style=anime"
    checks = [(plain, True)] * 20 + [(anime, True)] * 7 + [(anime, False)] * 3
    assert gate_pass_rate(checks, min_checks=10) == pytest.approx(0.7)
    assert gate_pass_rate(checks, min_checks=11) == pytest.approx(0.9)
    assert gate_pass_rate([], min_checks=10) is None


@given(st.lists(st.tuples(st.sampled_from("abc"), st.booleans()), min_size=1), st.integers(1, 20))
def test_the_canary_gate_is_never_above_the_overall_share(
    checks: list[tuple[str, bool]], min_checks: int
) -> None:
    """Buckets can only make the gate stricter than the pooled clean share."""
    rate = gate_pass_rate(checks, min_checks)
    assert rate is not None
    assert rate <= sum(ok for _, ok in checks) / len(checks)
