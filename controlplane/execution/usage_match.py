"""When a usage record names the job of an unknown submit (design 9.17.4 step 6), and when not.

A usage record adopts a job only when it identifies ONE job of THIS attempt: it carries a
non-empty provider job id AND a request identity of the attempt (the attempt's client request
key, or the provider request id we recorded for it), and exactly one job id has both. Anything
else is evidence, never a job:

* an aggregate (no job id, e.g. Runway's daily credits per model) says money was spent, not by
  which request;
* a record with a job id but no identity of ours may be any request of the account;
* two job ids claiming our identity cannot both be ours.

`match_usage` is pure; the recovery worker records the evidence and stays INCONCLUSIVE.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from controlplane.execution.evidence import EvidenceKind
from vidroute_core.adapter import UsageRecord

__all__ = ["UsageMatch", "match_usage"]


@dataclass(frozen=True, slots=True)
class UsageMatch:
    """The one job the records identify (``""``: none) and the evidence to keep otherwise."""

    job_id: str = ""
    evidence: tuple[tuple[EvidenceKind, dict[str, Any]], ...] = ()


def _ours(record: UsageRecord, client_request_key: str, provider_request_id: str) -> bool:
    by_key = bool(client_request_key) and record.client_request_key == client_request_key
    by_request = bool(provider_request_id) and record.provider_request_id == provider_request_id
    return bool(record.provider_job_id) and (by_key or by_request)


def _rows(records: Iterable[UsageRecord]) -> list[dict[str, Any]]:
    return [
        {
            "job": r.provider_job_id,
            "model": r.model,
            "at": r.usage_time.isoformat() if r.usage_time else None,
            "milliunits": r.provider_milliunits,
            "unit": r.provider_unit,
            "cost_micros": r.cost_micros,
            "currency": r.currency,
        }
        for r in records
    ]


def match_usage(
    records: Sequence[UsageRecord],
    *,
    model: str,
    client_request_key: str,
    provider_request_id: str = "",
) -> UsageMatch:
    """The job the records identify for one attempt, or the evidence they are (module doc)."""
    of_model = [r for r in records if r.model in ("", model)]
    ours = [r for r in of_model if _ours(r, client_request_key, provider_request_id)]
    job_ids = sorted({r.provider_job_id for r in ours})
    if len(job_ids) == 1:
        return UsageMatch(job_id=job_ids[0])
    evidence: list[tuple[EvidenceKind, dict[str, Any]]] = []
    if len(job_ids) > 1:
        evidence.append((EvidenceKind.USAGE_AMBIGUOUS, {"jobs": job_ids, "rows": _rows(ours)}))
    aggregates = [r for r in of_model if not r.provider_job_id]
    if aggregates:
        evidence.append(
            (
                EvidenceKind.USAGE_AGGREGATE,
                {
                    "model": model,
                    "milliunits": sum(r.provider_milliunits for r in aggregates),
                    "cost_micros": sum(r.cost_micros for r in aggregates),
                    "rows": _rows(aggregates),
                },
            )
        )
    strangers = [r for r in of_model if r.provider_job_id and r not in ours]
    if strangers:
        evidence.append(
            (
                EvidenceKind.USAGE_UNIDENTIFIED,
                {"jobs": sorted({r.provider_job_id for r in strangers}), "rows": _rows(strangers)},
            )
        )
    return UsageMatch(evidence=tuple(evidence))
