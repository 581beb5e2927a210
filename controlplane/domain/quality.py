"""Quality that routing reads (design 9.14): tag buckets, signal counts and their scores.

Quality depends on the task: a model good at 720p five-second clips may not be at 1080p with
reference images. Signals are therefore counted per (provider, model, mode, tag bucket), and a
task reads the scores of its own bucket only.

**Tag bucket** (`bucket_key`): derived from the `GenerationSpec` alone, deterministically, from
the 9.14 dimensions the spec carries: four from the output asked for, always present,

    audio=<true|false>,duration=<short|medium|long>,refs=<0|1|2+>,resolution=<480p|720p|1080p|4k>

then the caller's content tags (`GenerationSpec.content`), each only when it was given, in this
order: ``category=<...>,style=<...>,human=<true|false>,camera=<...>`` (the lower-cased values
of the spec's closed vocabularies, `TAG_VALUES`). An untagged spec therefore keeps the key it
had before tags existed (its stored evidence still counts), and "not said" is its own value:
a task tagged ``style=anime`` never reads the evidence of untagged tasks, nor they its.

``duration``: short up to 5 s, medium up to 10 s, long beyond; ``refs``: the reference images;
``resolution``: the output's short side (<=480, <=720, <=1080, beyond). The order is fixed, so
the same spec always lands in the same bucket and a bucket string parses back (`parse_bucket`).
The whole-mode aggregate has the empty bucket ``""`` (for the gauges and GetQuality): the sum of
the mode's buckets, computed when the counters are read (none is stored).

**Signals**: the output probe's technical check of every stored (or refused) output, defective
or clean; the caller's verdict (accepted, rejected, regenerated: one per task, the latest).

**Scores** (`estimate`), each a Beta posterior whose prior is the model's quality prior (its
capability document's ``quality_prior``, else the router's default 0.5) with the strength of
`QualityConfig.prior_strength` pseudo-observations (shrinkage: few samples stay near the prior,
many speak for themselves):

    technical_quality_score = (k * prior + clean outputs) / (k + checks)
    user_acceptance_score   = (k * prior + accepted) / (k + verdicts)
    score = w * technical + (1 - w) * user            (w = technical_weight, 0.3)

and the interval is the same combination of each component's normal-approximation interval
(``mean -+ z * sd`` of its Beta posterior, clamped to [0, 1]). Without signals the score is the
prior, with an interval as wide as k pseudo-observations allow. No I/O here.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from vidroute_core.spec import CameraMotion, ContentCategory, GenerationSpec, Style

WHOLE_MODE = ""  # the bucket of a model's whole mode


class Verdict(enum.Enum):
    """A caller's verdict on a task's output."""

    ACCEPTED = "ACCEPTED"
    REJECTED = "REJECTED"
    REGENERATED = "REGENERATED"


class Defect(enum.Enum):
    """What the technical probe found wrong with an output."""

    DECODE_ERROR = "DECODE_ERROR"  # not a playable video
    MEDIA_MISMATCH = "MEDIA_MISMATCH"  # duration, aspect or audio not as asked
    FROZEN_FRAMES = "FROZEN_FRAMES"  # the sampled frames do not change
    BLACK_FRAMES = "BLACK_FRAMES"  # the sampled frames are (nearly) black


# ---- tag buckets ------------------------------------------------------------------------------

BUCKET_DIMENSIONS = ("audio", "duration", "refs", "resolution")
_RESOLUTIONS = ((480, "480p"), (720, "720p"), (1080, "1080p"))
_DURATIONS = ((5_000, "short"), (10_000, "medium"))
BUCKET_VALUES: Mapping[str, tuple[str, ...]] = {
    "audio": ("false", "true"),
    "duration": ("short", "medium", "long"),
    "refs": ("0", "1", "2+"),
    "resolution": ("480p", "720p", "1080p", "4k"),
}
# The content tags' dimensions, in key order; each appears only when the spec gives the tag.
TAG_DIMENSIONS = ("category", "style", "human", "camera")
TAG_VALUES: Mapping[str, tuple[str, ...]] = {
    "category": tuple(c.value.lower() for c in ContentCategory),
    "style": tuple(s.value.lower() for s in Style),
    "human": ("false", "true"),
    "camera": tuple(c.value.lower() for c in CameraMotion),
}


def _band(value: int, bands: tuple[tuple[int, str], ...], beyond: str) -> str:
    for limit, name in bands:
        if value <= limit:
            return name
    return beyond


def bucket_key(spec: GenerationSpec) -> str:
    """The task's tag bucket (module docstring); the same spec always gives the same key."""
    out = spec.output
    refs = len(spec.references)
    values = {
        "audio": "true" if out.with_audio else "false",
        "duration": _band(out.duration_ms, _DURATIONS, "long"),
        "refs": "2+" if refs >= 2 else str(refs),
        "resolution": _band(min(out.width, out.height), _RESOLUTIONS, "4k"),
    }
    key = ",".join(f"{k}={values[k]}" for k in BUCKET_DIMENSIONS)
    tags = spec.content
    given = (
        ("category", None if tags.category is None else tags.category.value.lower()),
        ("style", None if tags.style is None else tags.style.value.lower()),
        ("human", None if tags.has_human is None else str(tags.has_human).lower()),
        ("camera", None if tags.camera_motion is None else tags.camera_motion.value.lower()),
    )
    return key + "".join(f",{k}={v}" for k, v in given if v is not None)


def parse_bucket(key: str) -> dict[str, str]:
    """A bucket key's dimensions; ValueError for anything `bucket_key` cannot produce."""
    if key == WHOLE_MODE:
        return {}
    pairs = [p.partition("=")[::2] for p in key.split(",")]
    parts = dict(pairs)
    names = tuple(parts)
    base, tags = names[: len(BUCKET_DIMENSIONS)], names[len(BUCKET_DIMENSIONS) :]
    if (
        len(parts) != len(pairs)
        or base != BUCKET_DIMENSIONS
        or tags != tuple(d for d in TAG_DIMENSIONS if d in tags)
        or any(v not in {**BUCKET_VALUES, **TAG_VALUES}[k] for k, v in parts.items())
    ):
        raise ValueError(f"not a quality bucket: {key!r}")
    return parts


# ---- counts and scores ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class QualityCounts:
    """Signals of one (provider, model, mode, bucket)."""

    accepted: int = 0
    rejected: int = 0
    regenerated: int = 0
    technical_checks: int = 0
    technical_defects: int = 0

    def __post_init__(self) -> None:
        if min(self.accepted, self.rejected, self.regenerated, self.technical_defects) < 0:
            raise ValueError("counts are non-negative")
        if not 0 <= self.technical_defects <= self.technical_checks:
            raise ValueError("technical_defects must be between 0 and technical_checks")

    @property
    def verdicts(self) -> int:
        return self.accepted + self.rejected + self.regenerated

    @property
    def user_acceptance_ratio(self) -> float:
        """accepted / verdicts; 0 without verdicts."""
        return self.accepted / self.verdicts if self.verdicts else 0.0

    @property
    def regeneration_ratio(self) -> float:
        """regenerated / verdicts; 0 without verdicts."""
        return self.regenerated / self.verdicts if self.verdicts else 0.0


@dataclass(frozen=True, slots=True)
class QualityConfig:
    """How signals become a score (module docstring)."""

    prior_strength: float = 10.0  # k: pseudo-observations the prior is worth
    technical_weight: float = 0.3  # w: the technical share; the rest is user acceptance
    z: float = 1.96  # interval width, standard deviations (95%)

    def __post_init__(self) -> None:
        if not self.prior_strength > 0:
            raise ValueError("prior_strength must be positive")
        if not 0.0 <= self.technical_weight <= 1.0:
            raise ValueError("technical_weight must be within [0, 1]")
        if not self.z >= 0:
            raise ValueError("z must be non-negative")


@dataclass(frozen=True, slots=True)
class QualityEstimate:
    """A bucket's scores; every figure within [0, 1], low <= score <= high."""

    score: float
    low: float
    high: float
    technical: float  # technical_quality_score
    user: float  # user_acceptance_score


def _beta(
    successes: int, trials: int, prior: float, k: float, z: float
) -> tuple[float, float, float]:
    a = k * prior + successes
    b = k * (1.0 - prior) + (trials - successes)
    n = a + b
    mean = a / n
    sd = math.sqrt(a * b / (n * n * (n + 1.0)))
    return mean, max(0.0, mean - z * sd), min(1.0, mean + z * sd)


def estimate(
    counts: QualityCounts, prior: float, cfg: QualityConfig = QualityConfig()
) -> QualityEstimate:
    """The bucket's scores, shrunk toward `prior` by sample count (module docstring)."""
    if not 0.0 <= prior <= 1.0:
        raise ValueError(f"prior {prior} outside [0, 1]")
    k, z, w = cfg.prior_strength, cfg.z, cfg.technical_weight
    clean = counts.technical_checks - counts.technical_defects
    t, t_lo, t_hi = _beta(clean, counts.technical_checks, prior, k, z)
    u, u_lo, u_hi = _beta(counts.accepted, counts.verdicts, prior, k, z)
    score = w * t + (1.0 - w) * u
    low = min(score, w * t_lo + (1.0 - w) * u_lo)
    high = max(score, w * t_hi + (1.0 - w) * u_hi)
    return QualityEstimate(score=score, low=low, high=high, technical=t, user=u)


def gate_pass_rate(checks: Iterable[tuple[str, bool]], min_checks: int) -> float | None:
    """The canary quality gate's figure (9.13.5) over the routing buckets: the share of clean
    technical checks, overall and in every bucket with at least `min_checks` checks, whichever
    is lowest; None without any check. A canary good on untagged clips and poor at, say, anime
    is judged by its anime, not by an average its untagged traffic dilutes; a bucket with fewer
    checks speaks only through the overall share (a few defects there are noise)."""
    per_bucket: dict[str, list[int]] = {}
    for bucket, clean in checks:
        tally = per_bucket.setdefault(bucket, [0, 0])
        tally[0] += int(clean)
        tally[1] += 1
    total = sum(n for _, n in per_bucket.values())
    if not total:
        return None
    rates = [sum(c for c, _ in per_bucket.values()) / total]
    rates += [c / n for c, n in per_bucket.values() if n >= min_checks]
    return min(rates)


BucketId = tuple[str, str, str, str]  # (provider, model, mode, bucket)


@dataclass(frozen=True, slots=True)
class QualityEvidence:
    """What one candidate's quality component was made of (the explain view): its model's
    prior (`from_document`: the capability document's ``quality_prior``, else the router's
    default), the signals of the task's bucket (technical checks, caller verdicts) and the
    score they shrank to (the prior itself without any)."""

    prior: float
    from_document: bool
    checks: int
    verdicts: int
    score: float


class QualityTable:
    """The aggregates of one read, with each bucket's score computed once (pure, immutable).

    `scores` is what the dispatcher asks per task: the quality of each candidate's model in the
    task's bucket, the model's prior where nothing was recorded."""

    def __init__(
        self,
        counts: Mapping[BucketId, QualityCounts],
        cfg: QualityConfig = QualityConfig(),
        version: str = "",
    ) -> None:
        self.counts = dict(counts)
        self.cfg = cfg
        self.version = version
        self._index: dict[tuple[str, str], dict[tuple[str, str], QualityCounts]] = {}
        for (provider, model, mode, bucket), c in self.counts.items():
            self._index.setdefault((mode, bucket), {})[(provider, model)] = c
        self._memo: dict[tuple[str, str, float], dict[tuple[str, str], float]] = {}

    def _bucket(self, mode: str, bucket: str, prior: float) -> dict[tuple[str, str], float]:
        """``(provider, model) -> score`` of one bucket, computed once per table and prior."""
        key = (mode, bucket, prior)
        hit = self._memo.get(key)
        if hit is None:
            rows = self._index.get((mode, bucket), {})
            hit = {pm: estimate(c, prior, self.cfg).score for pm, c in rows.items()}
            self._memo[key] = hit
        return hit

    def score(self, provider: str, model: str, mode: str, bucket: str, prior: float) -> float:
        return self._bucket(mode, bucket, prior).get((provider, model), prior)

    def evidence(
        self,
        candidates: Iterable[tuple[str, str, str, float, bool]],
        mode: str,
        bucket: str,
    ) -> dict[str, QualityEvidence]:
        """``candidate id -> QualityEvidence`` for (id, provider, model, prior, the prior is
        the document's) in one bucket: `scores` with what each score was made of."""
        rows = self._index.get((mode, bucket), {})
        out: dict[str, QualityEvidence] = {}
        for cid, provider, model, prior, from_document in candidates:
            c = rows.get((provider, model))
            if c is None:
                out[cid] = QualityEvidence(prior, from_document, 0, 0, prior)
            else:
                score = self._bucket(mode, bucket, prior)[(provider, model)]
                out[cid] = QualityEvidence(
                    prior, from_document, c.technical_checks, c.verdicts, score
                )
        return out

    def scores(
        self,
        candidates: Iterable[tuple[str, str, str, float]],
        mode: str,
        bucket: str,
    ) -> dict[str, float]:
        """``candidate id -> quality`` for (id, provider, model, prior) in one bucket: the
        bucket's evidence shrunk toward the model's own prior, the prior itself where the model
        has no signal in this bucket (another bucket's evidence never counts here)."""
        rows = self._index.get((mode, bucket), {})
        out: dict[str, float] = {}
        for cid, provider, model, prior in candidates:
            out[cid] = (
                self._bucket(mode, bucket, prior).get((provider, model), prior)
                if (provider, model) in rows
                else prior
            )
        return out
