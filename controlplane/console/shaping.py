"""Records -> what the console's templates show: one task's timeline and its explain tables.

Pure functions over the service layer's records (no I/O), so the pages stay logic-free.

The timeline merges, in time order, every task event (state changes, requeues and their
failover reasons, progress), every attempt (created, its last state and failure), every
provider job (submitted, last polled with its raw provider status, completed, the raw failure)
and every stored observation of those jobs (each distinct poll answer and callback, raw).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from controlplane.domain.outputs import stored_samples
from controlplane.domain.routing.decision import (
    CandidateExplain,
    candidate_explain,
    candidate_inputs,
    quality_bucket,
)
from controlplane.persistence.provider_observations import ProviderObservation
from controlplane.persistence.records import RouteDecisionRecord, TaskDetail, TaskEventRecord

RAW_SHOWN = 400  # characters of a raw provider payload on the timeline


@dataclass(frozen=True, slots=True)
class Entry:
    at: datetime
    source: str  # event | attempt | job
    title: str
    detail: str
    attempt_no: int | None = None
    css: str = ""  # ok | bad | warn | ""


@dataclass(frozen=True, slots=True)
class CandidateRow:
    candidate_id: str
    eligible: bool
    reason: str
    detail: str
    score: float | None
    components: dict[str, float]
    cost: str
    selected: bool
    shadow: bool
    penalties: tuple[tuple[str, float], ...] = ()  # subtracted from the score, by name
    inputs: tuple[tuple[str, float], ...] = ()  # what the components read (`candidate_inputs`)
    # The rest of it as "name value" lines (`candidate_explain`): the health window, where
    # the quality prior came from, the call baselines and why the breaker opened.
    signals: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class ExplainTable:
    decision_no: int
    policy_version: str
    capability_version: str
    reason_code: str
    selected: str
    shadow_selected: str
    created_at: datetime
    component_names: tuple[str, ...]
    rows: tuple[CandidateRow, ...]
    selection_reason: str = ""  # why the selected one among the eligible
    quality_bucket: str = ""  # the tag bucket whose quality evidence was read (9.14)


def compact(value: Any) -> str:
    if value in (None, "", {}, []):
        return ""
    return json.dumps(value, sort_keys=True, separators=(", ", ": "), default=str)


def money(micros: int | None, currency: str = "USD") -> str:
    """Integer micros as a decimal amount, without float."""
    if micros is None:
        return ""
    sign, micros = ("-", -micros) if micros < 0 else ("", micros)
    return f"{sign}{micros // 1_000_000}.{micros % 1_000_000:06d} {currency}"


def _css_for(state: str) -> str:
    if state in ("SUCCEEDED", "ACCEPTED"):
        return "ok"
    if state in ("FAILED", "ABANDONED", "CANCELLED", "SUBMIT_UNKNOWN"):
        return "bad"
    return ""


def _event_entry(event: TaskEventRecord) -> Entry:
    payload = dict(event.payload)
    state = str(payload.get("to_state") or payload.get("state") or "")
    reason = payload.get("reason") or payload.get("failover_reason") or ""
    title = event.kind + (f" -> {state}" if state else "")
    css = _css_for(state) or ("warn" if "requeue" in event.kind else "")
    detail = compact(payload) if not reason else f"reason: {reason}  {compact(payload)}"
    return Entry(event.created_at, "event", title, detail, payload.get("attempt_no"), css)


def timeline(
    detail: TaskDetail,
    events: tuple[TaskEventRecord, ...],
    accounts: Mapping[int, str],
    observations: Sequence[ProviderObservation] = (),
) -> list[Entry]:
    entries = [_event_entry(e) for e in events]
    numbers = {a.id: a.attempt_no for a in detail.attempts}
    for o in observations:
        entries.append(
            Entry(
                o.received_at,
                o.source,
                f"{o.source}: job {o.provider_job_id} raw status {o.raw_status!r} -> {o.job_state}",
                f"{o.outcome} {o.raw_payload[:RAW_SHOWN]}".strip(),
                numbers.get(o.attempt_id) if o.attempt_id is not None else None,
                _css_for(o.job_state),
            )
        )
    for a in detail.attempts:
        where = f"{accounts.get(a.provider_account_id, a.provider_account_id)} {a.provider_model}"
        entries.append(
            Entry(
                a.created_at,
                "attempt",
                f"attempt {a.attempt_no} created on {where}",
                f"capability {a.capability_version}, price {a.price_version}, "
                f"estimate {money(a.estimated_cost_micros, a.currency)}",
                a.attempt_no,
            )
        )
        failure = a.failure
        why = f"{failure.failure_class} {failure.code}: {failure.message}" if failure else ""
        cost = f" cost {money(a.actual_cost_micros, a.currency)}" if a.actual_cost_micros else ""
        if a.transport_error_stage:
            why += f" (transport error while {a.transport_error_stage})"
        entries.append(
            Entry(
                a.updated_at,
                "attempt",
                f"attempt {a.attempt_no} {a.state.value}",
                (why + cost).strip(),
                a.attempt_no,
                _css_for(a.state.value),
            )
        )
    for j in detail.provider_jobs:
        no = numbers.get(j.attempt_id)
        entries.append(
            Entry(
                j.submitted_at,
                "job",
                f"provider job {j.provider_job_id} submitted",
                f"request id {j.provider_request_id}" if j.provider_request_id else "",
                no,
            )
        )
        if j.last_polled_at is not None:
            entries.append(
                Entry(
                    j.last_polled_at,
                    "job",
                    f"provider job {j.provider_job_id} last observed",
                    f"raw status {j.raw_status!r} -> {j.normalized_status.value}",
                    no,
                )
            )
        if j.completed_at is not None:
            entries.append(
                Entry(
                    j.completed_at,
                    "job",
                    f"provider job {j.provider_job_id} {j.normalized_status.value}",
                    f"raw status {j.raw_status!r} {compact(j.raw_failure)}".strip(),
                    no,
                    _css_for(j.normalized_status.value),
                )
            )
    origin = datetime.min.replace(tzinfo=UTC)
    return sorted(entries, key=lambda e: (e.at.astimezone(UTC) if e.at.tzinfo else origin,))


def explain(decision: RouteDecisionRecord) -> ExplainTable:
    snapshot = decision.candidate_snapshot
    shadow = str(snapshot.get("shadow_selected", "") or "")
    rows = []
    names: dict[str, None] = {}
    for c in snapshot.get("candidates", []):
        components = {str(k): float(v) for k, v in (c.get("components") or {}).items()}
        names.update(dict.fromkeys(components))
        cid = str(c.get("id", ""))
        cost = c.get("estimated_cost_micros")
        score = c.get("score")
        rows.append(
            CandidateRow(
                cid,
                bool(c.get("eligible", False)),
                str(c.get("reason", "") or ""),
                str(c.get("detail", "") or ""),
                float(score) if score is not None else None,
                components,
                money(int(cost), str(c.get("currency", "USD"))) if cost is not None else "",
                cid == decision.selected_candidate,
                bool(shadow) and cid == shadow,
                tuple(sorted((str(k), float(v)) for k, v in (c.get("penalties") or {}).items())),
                tuple(sorted(candidate_inputs(snapshot, cid).items())),
                _signal_lines(candidate_explain(snapshot, cid)),
            )
        )
    return ExplainTable(
        decision.decision_no,
        decision.policy_version,
        str(snapshot.get("capability_version", "")),
        decision.reason_code,
        decision.selected_candidate or "",
        shadow,
        decision.created_at,
        tuple(names),
        tuple(rows),
        str(snapshot.get("selection_reason", "") or ""),
        quality_bucket(snapshot),
    )


def _signal_lines(explained: CandidateExplain) -> tuple[str, ...]:
    lines = []
    if explained.window:
        lines.append(f"health_window {explained.window}")
    if explained.quality_prior_source:
        lines.append(f"quality_prior_source {explained.quality_prior_source}")
    for operation, seconds in sorted(explained.baselines_s.items()):
        lines.append(f"baseline_{operation} {seconds:.4g} s")
    if explained.breaker_opened_for:
        slow = " (slow calls)" if explained.opened_on_slow_calls else ""
        lines.append(f"breaker_opened_for {explained.breaker_opened_for}{slow}")
    return tuple(lines)


def samples(detail: TaskDetail) -> list[dict[str, Any]]:
    return stored_samples(detail.task.output_asset)
