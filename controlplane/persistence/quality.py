"""Quality signals in the database (design 9.14): writes inside a caller's transaction, one read.

Every write takes the connection of a transaction the unit of work opened (callers reach them
through the unit: ``u.record_quality_checks``, ``u.record_feedback``), so a signal and its
counters commit together with the step that produced it: the technical check with the stored
output (or the refused one), the verdict alone in its own unit.
Each signal bumps one counter row of ``quality_aggregates``, its tag bucket's, by one upsert
(``ON CONFLICT DO UPDATE``, both databases; a step's checks of one subject by one upsert
together). A model's whole mode (bucket ``""``) is not stored: `aggregates` sums its buckets
(every task has exactly one), so no row is shared by every signal of a model, which each
transaction storing an output would hold locked until its commit (revision 0015 removed the
stored ones).

Idempotency: a check is unique per (attempt, sample), so a redelivered step counts nothing
twice; a task holds one verdict, the latest: the same verdict again changes nothing (`False`),
a different one replaces it and moves the counters from the old verdict to the new.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncConnection

from controlplane.domain.quality import WHOLE_MODE, BucketId, Defect, QualityCounts, Verdict
from controlplane.persistence.models import quality_aggregates as Q
from controlplane.persistence.models import quality_checks as C
from controlplane.persistence.models import quality_feedback as F

_COUNTERS = ("accepted", "rejected", "regenerated", "technical_checks", "technical_defects")
_VERDICT_COLUMN = {
    Verdict.ACCEPTED: "accepted",
    Verdict.REJECTED: "rejected",
    Verdict.REGENERATED: "regenerated",
}


@dataclass(frozen=True, slots=True)
class Subject:
    """Whose quality a signal speaks of: the model that made the output, in the task's bucket."""

    provider: str
    model: str
    mode: str
    bucket: str


@dataclass(frozen=True, slots=True)
class NewCheck:
    """The technical check of one probed sample."""

    task_id: int
    attempt_id: int
    sample_index: int
    subject: Subject
    defects: tuple[Defect, ...] = ()


@dataclass(frozen=True, slots=True)
class NewFeedback:
    """A caller's verdict on a task's output."""

    task_id: int
    tenant_id: str
    subject: Subject
    verdict: Verdict
    tags: tuple[str, ...] = ()
    comment: str = ""


def _insert(conn: AsyncConnection, table: Any) -> Any:
    return (postgresql.insert if conn.dialect.name == "postgresql" else sqlite.insert)(table)


async def _bump(
    conn: AsyncConnection, subject: Subject, deltas: dict[str, int], now: datetime
) -> None:
    """Add `deltas` to the subject's bucket counters."""
    values = {c: deltas.get(c, 0) for c in _COUNTERS}
    stmt = _insert(conn, Q).values(
        provider=subject.provider,
        model=subject.model,
        mode=subject.mode,
        bucket=subject.bucket,
        updated_at=now,
        **values,
    )
    changed = {c: Q.c[c] + stmt.excluded[c] for c in _COUNTERS if values[c]}
    await conn.execute(
        stmt.on_conflict_do_update(
            index_elements=[Q.c.provider, Q.c.model, Q.c.mode, Q.c.bucket],
            set_={**changed, "updated_at": stmt.excluded.updated_at},
        )
    )


async def record_checks(conn: AsyncConnection, checks: Sequence[NewCheck], now: datetime) -> int:
    """Store each check once (per attempt and sample) and count it; returns how many were new.

    The checks go in ONE INSERT whatever their number (a check already stored, or named twice,
    is skipped, as one INSERT per check would), then one upsert per subject, in subject order
    (two batches bump shared counter rows in the same order)."""
    first: dict[tuple[int, int], NewCheck] = {}
    for c in checks:
        first.setdefault((c.attempt_id, c.sample_index), c)
    unique = list(first.values())
    if not unique:
        return 0
    stmt = (
        _insert(conn, C)
        .values(
            [
                {
                    "task_id": check.task_id,
                    "attempt_id": check.attempt_id,
                    "sample_index": check.sample_index,
                    "provider": check.subject.provider,
                    "model": check.subject.model,
                    "mode": check.subject.mode,
                    "bucket": check.subject.bucket,
                    "defects": [d.value for d in check.defects],
                    "created_at": now,
                }
                for check in unique
            ]
        )
        .on_conflict_do_nothing(index_elements=[C.c.attempt_id, C.c.sample_index])
        .returning(C.c.attempt_id, C.c.sample_index)
    )
    written = {(int(a), int(n)) for a, n in (await conn.execute(stmt)).all()}
    deltas: dict[Subject, dict[str, int]] = {}
    for check in unique:
        if (check.attempt_id, check.sample_index) not in written:
            continue
        counts = deltas.setdefault(check.subject, {"technical_checks": 0, "technical_defects": 0})
        counts["technical_checks"] += 1
        counts["technical_defects"] += 1 if check.defects else 0
    for subject in sorted(deltas, key=lambda s: (s.provider, s.model, s.mode, s.bucket)):
        await _bump(conn, subject, deltas[subject], now)
    return len(written)


async def record_feedback(conn: AsyncConnection, fb: NewFeedback, now: datetime) -> bool:
    """Record the task's verdict (module docstring); False when it was already the same."""
    s = fb.subject
    row = {
        "tenant_id": fb.tenant_id,
        "provider": s.provider,
        "model": s.model,
        "mode": s.mode,
        "bucket": s.bucket,
        "verdict": fb.verdict.value,
        "tags": list(fb.tags),
        "comment": fb.comment,
        "updated_at": now,
    }
    inserted = await conn.execute(
        _insert(conn, F)
        .values(task_id=fb.task_id, created_at=now, **row)
        .on_conflict_do_nothing(index_elements=[F.c.task_id])
        .returning(F.c.task_id)
    )
    if inserted.first() is not None:
        await _bump(conn, s, {_VERDICT_COLUMN[fb.verdict]: 1}, now)
        return True
    query = select(F).where(F.c.task_id == fb.task_id)
    if conn.dialect.name == "postgresql":
        query = query.with_for_update()
    old = (await conn.execute(query)).mappings().one()
    before = Verdict(old["verdict"])
    if before is fb.verdict:
        return False
    await conn.execute(F.update().where(F.c.task_id == fb.task_id).values(**row))
    old_subject = Subject(old["provider"], old["model"], old["mode"], old["bucket"])
    await _bump(conn, old_subject, {_VERDICT_COLUMN[before]: -1}, now)
    await _bump(conn, s, {_VERDICT_COLUMN[fb.verdict]: 1}, now)
    return True


async def aggregates(conn: AsyncConnection, model: str = "") -> dict[BucketId, QualityCounts]:
    """Every bucket's counters (only `model`'s when given), by (provider, model, mode, bucket),
    with each model's whole mode (bucket ``""``): the sum of its buckets."""
    query = select(Q).where(Q.c.bucket != WHOLE_MODE)
    if model:
        query = query.where(Q.c.model == model)
    out: dict[BucketId, QualityCounts] = {}
    whole: dict[BucketId, dict[str, int]] = {}
    for r in (await conn.execute(query)).mappings():
        values = {c: int(r[c]) for c in _COUNTERS}
        out[(r["provider"], r["model"], r["mode"], r["bucket"])] = QualityCounts(**values)
        total = whole.setdefault((r["provider"], r["model"], r["mode"], WHOLE_MODE), {})
        for c, v in values.items():
            total[c] = total.get(c, 0) + v
    out.update((key, QualityCounts(**values)) for key, values in whole.items())
    return out
