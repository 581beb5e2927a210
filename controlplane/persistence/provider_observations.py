"""Read-only: the stored observations of provider jobs (``provider_events``: every poll,
callback, cancel reply and submit answer the event normalizer ingested, deduplicated by raw
status and payload), per attempt, for the console's timeline."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING

from sqlalchemy import select

from controlplane.persistence.models import provider_events as PE

if TYPE_CHECKING:
    from controlplane.persistence.database import Database

MAX_RAW_CHARS = 2000  # a payload is shown, not archived: the row keeps it whole


@dataclass(frozen=True, slots=True)
class ProviderObservation:
    attempt_id: int | None
    provider_job_id: str
    source: str  # poll | callback | cancel | submit
    job_state: str
    raw_status: str
    outcome: str  # what the normalizer did with it (APPLIED, DUPLICATE, STALE, ...)
    raw_payload: str  # at most MAX_RAW_CHARS
    received_at: datetime


class ProviderObservations:
    def __init__(self, db: Database) -> None:
        self._db = db

    async def for_attempts(
        self, attempt_ids: Sequence[int], limit: int = 500
    ) -> list[ProviderObservation]:
        """The observations of these attempts, oldest first (one statement)."""
        if not attempt_ids:
            return []
        query = (
            select(PE)
            .where(PE.c.attempt_id.in_(list(attempt_ids)))
            .order_by(PE.c.received_at, PE.c.id)
            .limit(limit)
        )
        async with self._db.reading() as conn:
            rows = (await conn.execute(query)).mappings().all()
        return [
            ProviderObservation(
                r["attempt_id"],
                r["provider_job_id"],
                r["source"],
                r["job_state"],
                r["raw_status"],
                r["outcome"],
                r["raw_payload"][:MAX_RAW_CHARS],
                r["received_at"],
            )
            for r in rows
        ]
