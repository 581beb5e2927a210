"""Evidence about an attempt that is not a state change: kept for reconciliation (9.17.5, 9.23).

Some observations must not move an attempt yet must not be lost either: a usage aggregate
(Runway's daily credits per model) or several candidate records during recovery, polls of a
held job answering NOT_FOUND, what the background lookup of an ABANDONED attempt found. They
are stored as ``provider_events`` rows of the attempt with ``outcome = EVIDENCE`` and the kind
in ``raw_status``, so the money reconciliation reads one place and nothing applies them: the
normalizer only replays UNMATCHED events, recovery only adopts UNMATCHED callbacks. The usual
dedup key (account, job id, kind, payload hash) stores each distinct piece of evidence once.
"""

from __future__ import annotations

import enum
import hashlib
import json
from collections.abc import Mapping
from typing import Any

from controlplane.persistence.ports import UnitOfWork
from controlplane.persistence.records import AttemptRecord, ProviderEventRecord

__all__ = ["EVIDENCE_OUTCOME", "EvidenceKind", "is_evidence", "record_evidence"]

EVIDENCE_OUTCOME = "EVIDENCE"


class EvidenceKind(enum.Enum):
    """What an evidence row says (its ``raw_status``)."""

    # Usage rows of the attempt's model in its window that name no job (daily totals).
    USAGE_AGGREGATE = "usage_aggregate"
    # Usage rows naming jobs but no request identity of this attempt: maybe ours, maybe not.
    USAGE_UNIDENTIFIED = "usage_unidentified"
    # More than one job claims this attempt's request identity: we cannot tell which.
    USAGE_AMBIGUOUS = "usage_ambiguous"
    # The provider answered NOT_FOUND for the job we hold (first of a streak).
    JOB_NOT_FOUND = "job_not_found"
    # The background lookup of an ABANDONED attempt found its job (never applied).
    LATE_FOUND = "late_found"


def is_evidence(event: ProviderEventRecord) -> bool:
    return event.outcome == EVIDENCE_OUTCOME


async def record_evidence(
    u: UnitOfWork,
    attempt: AttemptRecord,
    kind: EvidenceKind,
    details: Mapping[str, Any],
    *,
    job_id: str = "",
) -> bool:
    """Store one piece of evidence for `attempt`; False when the same was stored before."""
    payload = json.dumps(dict(details), sort_keys=True, separators=(",", ":"), default=str)
    [event_id] = await u.insert_events(
        [
            {
                "provider_account_id": attempt.provider_account_id,
                "provider_job_id": job_id,
                "attempt_id": attempt.id,
                "source": "evidence",
                "job_state": "EVIDENCE",
                "raw_status": kind.value,
                "payload_hash": hashlib.sha256(f"{attempt.id}:{payload}".encode()).hexdigest(),
                "raw_payload": payload,
                "outcome": EVIDENCE_OUTCOME,
                "received_at": u.now,
            }
        ]
    )
    return event_id is not None
