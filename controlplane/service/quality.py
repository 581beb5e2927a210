"""Caller feedback and the quality aggregates (design 9.14): the RoutingService's quality half.

`QualityService.submit_feedback` validates a verdict (every problem at once, as INVALID_ARGUMENT
field violations, before anything is read), then in one unit of work: the task must exist in
the caller's tenant (another tenant's task is NOT_FOUND, like a missing one) and be SUCCEEDED
(else FAILED_PRECONDITION ``TASK_NOT_SUCCEEDED`` with its state); the verdict is attributed to
the model of the adopted attempt, in the task's tag bucket (`domain.quality.bucket_key`).
`get_quality` (admin) reads the aggregates and scores each bucket against its model's prior (the
effective capability entries' ``quality_prior``, the default where none is given; when a
model's accounts give different priors, the lowest, since the aggregates are per model).

The dispatcher's cached view of the same aggregates is `controlplane.scheduling.quality_book`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime

from controlplane.domain.quality import (
    QualityConfig,
    QualityCounts,
    QualityEstimate,
    Verdict,
    bucket_key,
    estimate,
)
from controlplane.domain.states import TaskState
from controlplane.persistence import quality as store
from controlplane.persistence.catalog import CapabilityRecord, CatalogQueries
from controlplane.persistence.database import Database
from controlplane.service.access import Caller, ensure_admin, ensure_visible
from controlplane.service.tasks import parse_task_id, text_violations
from vidroute_core.exceptions import InvalidSpec, NotFound, PreconditionFailed
from vidroute_core.validation import FieldViolation

MAX_TAGS = 16
MAX_TAG_CHARS = 64
MAX_COMMENT_CHARS = 1000
DEFAULT_PRIOR = 0.5  # a model whose capability entry gives none (RouterConfig's default)


def _utcnow() -> datetime:
    return datetime.now(UTC)


@dataclass(frozen=True, slots=True)
class FeedbackInput:
    task_id: str
    verdict: Verdict | None  # None: not set on the wire
    tags: tuple[str, ...] = ()
    comment: str = ""


@dataclass(frozen=True, slots=True)
class BucketView:
    """One aggregate row with its scores, for GetQuality."""

    provider: str
    model: str
    mode: str
    bucket: str
    counts: QualityCounts
    estimate: QualityEstimate


def _violations(request: FeedbackInput) -> list[FieldViolation]:
    found: list[FieldViolation] = []
    if request.verdict is None:
        found.append(FieldViolation("verdict", "required: ACCEPTED, REJECTED or REGENERATED"))
    if len(request.tags) > MAX_TAGS:
        found.append(FieldViolation("tags", f"at most {MAX_TAGS} tags"))
    for i, tag in enumerate(request.tags):
        if not 1 <= len(tag) <= MAX_TAG_CHARS:
            found.append(FieldViolation(f"tags[{i}]", f"must be 1..{MAX_TAG_CHARS} characters"))
        else:
            found.extend(text_violations(f"tags[{i}]", tag, MAX_TAG_CHARS))
    found.extend(text_violations("comment", request.comment, MAX_COMMENT_CHARS))
    return found


class QualityService:
    """Feedback in, aggregates out (module docstring)."""

    def __init__(
        self,
        db: Database,
        *,
        prior: float = DEFAULT_PRIOR,
        config: QualityConfig | None = None,
        clock: Callable[[], datetime] = _utcnow,
    ) -> None:
        self._db, self._prior, self._clock = db, prior, clock
        self._cfg = config or QualityConfig()

    async def submit_feedback(self, request: FeedbackInput, caller: Caller) -> bool:
        """Record the verdict; False when the task already had this one (nothing changes)."""
        problems: list[FieldViolation] = []
        task_id = 0
        try:
            task_id = parse_task_id(request.task_id)
        except InvalidSpec as exc:
            problems.extend(exc.violations)
        problems.extend(_violations(request))
        if problems:
            raise InvalidSpec(problems)
        assert request.verdict is not None  # checked above
        async with self._db.unit(self._clock()) as u:
            task = await u.task(task_id)
            if task is None:
                raise NotFound("task", request.task_id)
            ensure_visible(caller, task.tenant_id, "task", request.task_id)
            if task.state is not TaskState.SUCCEEDED or task.adopted_attempt_id is None:
                raise PreconditionFailed(
                    f"task {task_id} is {task.state.value}: feedback is for SUCCEEDED tasks",
                    {"status_version": task.status_version},
                    reason="TASK_NOT_SUCCEEDED",
                    labels={"state": task.state.value},
                )
            attempt = await u.attempt(task.adopted_attempt_id, lock=False)
            if attempt is None:  # pragma: no cover - a SUCCEEDED task has its attempt
                raise NotFound("attempt", str(task.adopted_attempt_id))
            account = await u.account(attempt.provider_account_id)
            subject = store.Subject(
                account.provider, attempt.provider_model, task.spec.mode.value,
                bucket_key(task.spec),
            )  # fmt: skip
            return await u.record_feedback(
                store.NewFeedback(
                    task_id=task_id,
                    tenant_id=task.tenant_id,
                    subject=subject,
                    verdict=request.verdict,
                    tags=request.tags,
                    comment=request.comment,
                )
            )

    async def get_quality(self, model: str, caller: Caller) -> list[BucketView]:
        """Admin: every aggregate (only `model`'s when given), ordered by its key."""
        ensure_admin(caller, "GetQuality")
        if problems := text_violations("model", model, 256):
            raise InvalidSpec(problems)
        async with self._db.reads() as reads:
            rows = await reads.quality_aggregates(model)
        priors = model_priors(await CatalogQueries(self._db).effective_capabilities(self._clock()))
        return [
            BucketView(*key, counts, estimate(counts, priors.get(key[:2], self._prior), self._cfg))
            for key, counts in sorted(rows.items())
        ]


def model_priors(records: list[CapabilityRecord]) -> dict[tuple[str, str], float]:
    """``(provider, model) -> quality prior`` of the entries that give one (the lowest when a
    model's accounts disagree)."""
    out: dict[tuple[str, str], float] = {}
    for r in records:
        prior = r.document.get("quality_prior")
        if isinstance(prior, int | float):
            key = (r.account.provider, r.model)
            out[key] = min(float(prior), out.get(key, 1.0))
    return out
