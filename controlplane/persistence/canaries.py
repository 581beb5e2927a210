"""Canaries in the database (design 9.13.5): each candidate's state and every transition, and
the finished attempts a gate evaluation reads.

Writes take the connection of their caller's unit: a publication starts the canaries it names in
its own unit (`controlplane.service.routing_policies`); a transition updates the state only if it
is still the one evaluated (status ACTIVE at that stage), so two leaders never apply one step
twice (`controlplane.scheduling.canary_gates`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import ColumnElement, and_, func, or_, select, update
from sqlalchemy.ext.asyncio import AsyncConnection

from controlplane.domain.routing.canary import CanaryStatus
from controlplane.persistence.models import canary_states as C
from controlplane.persistence.models import canary_transitions as T
from controlplane.persistence.models import provider_accounts as A
from controlplane.persistence.models import quality_checks as Q
from controlplane.persistence.models import task_attempts as TA

# Attempts of a canary window read at most (newest first); gates need tens, not thousands.
MAX_WINDOW_ATTEMPTS = 5_000
FINISHED = ("SUCCEEDED", "FAILED")


@dataclass(frozen=True, slots=True)
class CanaryRow:
    candidate_id: str
    policy_version: str
    config_key: str
    stages: tuple[float, ...]  # percents
    stage: int
    status: CanaryStatus
    gates: dict[str, bool]
    stage_started_at: datetime
    updated_at: datetime


@dataclass(frozen=True, slots=True)
class TransitionRow:
    candidate_id: str
    action: str
    reason: str
    from_percent: float
    to_percent: float
    observed: dict[str, float]
    at: datetime


@dataclass(frozen=True, slots=True)
class WindowAttempt:
    status: str
    failure_class: str | None
    created_at: datetime
    updated_at: datetime
    cost_micros: int


def _canary(r: Any) -> CanaryRow:
    return CanaryRow(
        r.candidate_id,
        r.policy_version,
        r.config_key,
        tuple(float(p) for p in r.stages),
        r.stage,
        CanaryStatus(r.status),
        dict(r.gates),
        r.stage_started_at,
        r.updated_at,
    )


async def canaries(conn: AsyncConnection) -> list[CanaryRow]:
    return [_canary(r) for r in await conn.execute(select(C).order_by(C.c.candidate_id))]


async def start_canary(
    conn: AsyncConnection,
    candidate_id: str,
    *,
    policy_version: str,
    config_key: str,
    stages: Sequence[float],
    now: datetime,
    reason: str = "published",
) -> None:
    """(Re)start `candidate_id`'s canary at stage 0 and record it (with `reason`)."""
    await conn.execute(C.delete().where(C.c.candidate_id == candidate_id))
    await conn.execute(
        C.insert().values(
            candidate_id=candidate_id,
            policy_version=policy_version,
            config_key=config_key,
            stages=list(stages),
            stage=0,
            status=CanaryStatus.ACTIVE.value,
            gates={},
            stage_started_at=now,
            updated_at=now,
        )
    )
    await record_transition(
        conn,
        candidate_id,
        policy_version=policy_version,
        action="STARTED",
        reason=reason,
        from_percent=0.0,
        to_percent=stages[0],
        observed={},
        now=now,
    )


async def start_changed(
    conn: AsyncConnection,
    wanted: Mapping[str, tuple[str, Sequence[float]]],
    *,
    policy_version: str,
    now: datetime,
    reason: str,
) -> list[str]:
    """Start each of `wanted` (candidate id -> (config key, stage percents)) that has no state
    or a state of another config key; an unchanged one keeps its state. Returns those started."""
    keys = {c.candidate_id: c.config_key for c in await canaries(conn)}
    started = []
    for cid, (key, stages) in wanted.items():
        if keys.get(cid) != key:
            await start_canary(
                conn,
                cid,
                policy_version=policy_version,
                config_key=key,
                stages=stages,
                now=now,
                reason=reason,
            )
            started.append(cid)
    return started


async def record_transition(
    conn: AsyncConnection,
    candidate_id: str,
    *,
    policy_version: str,
    action: str,
    reason: str,
    from_percent: float,
    to_percent: float,
    observed: dict[str, float],
    now: datetime,
) -> None:
    detail = {"from_percent": from_percent, "to_percent": to_percent, "observed": observed}
    await conn.execute(
        T.insert().values(
            candidate_id=candidate_id,
            policy_version=policy_version,
            action=action,
            reason=reason,
            detail=detail,
            at=now,
        )
    )


def _still_at(row: CanaryRow) -> ColumnElement[bool]:
    """The guard of every write judged on `row`: the canary is still ACTIVE at the stage read."""
    return and_(
        C.c.candidate_id == row.candidate_id,
        C.c.status == CanaryStatus.ACTIVE.value,
        C.c.stage == row.stage,
    )


async def move_canary(
    conn: AsyncConnection,
    row: CanaryRow,
    *,
    stage: int,
    status: CanaryStatus,
    gates: dict[str, bool],
    now: datetime,
) -> bool:
    """Move `row` on if it is still ACTIVE at ``row.stage``; False if someone moved it first."""
    values: dict[str, Any] = {"stage": stage, "status": status.value, "gates": gates}
    values["updated_at"] = now
    if stage != row.stage:
        values["stage_started_at"] = now
    done = await conn.execute(update(C).where(_still_at(row)).values(**values))
    return bool(done.rowcount)


async def note_gates(
    conn: AsyncConnection, row: CanaryRow, gates: dict[str, bool], now: datetime
) -> bool:
    """Keep the last evaluation of a canary that holds (no transition), if it is still ACTIVE
    at ``row.stage``; False if another evaluation moved it first (its gates stand)."""
    done = await conn.execute(update(C).where(_still_at(row)).values(gates=gates, updated_at=now))
    return bool(done.rowcount)


async def transitions(conn: AsyncConnection) -> list[TransitionRow]:
    rows = await conn.execute(select(T).order_by(T.c.candidate_id, T.c.id))
    return [
        TransitionRow(
            r.candidate_id,
            r.action,
            r.reason,
            float(r.detail.get("from_percent", 0.0)),
            float(r.detail.get("to_percent", 0.0)),
            {k: float(v) for k, v in (r.detail.get("observed") or {}).items()},
            r.at,
        )
        for r in rows
    ]


def _of_candidates(ids: Sequence[str]) -> Any:
    """A filter on the attempts of the candidates `ids` (``provider/model/account``; a model
    may hold a slash, a provider or an account does not)."""
    terms = []
    for cid in ids:
        provider, _, rest = cid.partition("/")
        model, _, account = rest.rpartition("/")
        terms.append(
            and_(
                A.c.provider == provider, TA.c.provider_model == model, A.c.account_name == account
            )
        )
    return or_(*terms)


async def window_by_candidate(
    conn: AsyncConnection,
    since: datetime,
    exclude: Sequence[str] = (),
    *,
    only: Sequence[str] = (),
) -> dict[str, list[WindowAttempt]]:
    """Finished attempts since `since` of every candidate (``provider/model/account``) but the
    excluded ones: the incumbents a canary is compared with; of the candidates `only` when
    given: the canaries' own, read apart so that the incumbents' traffic (the newest
    `MAX_WINDOW_ATTEMPTS` of all) never crowds a 0.5 % canary's attempts out of its window."""
    query = (
        select(
            A.c.provider,
            A.c.account_name,
            TA.c.provider_model,
            TA.c.status,
            TA.c.failure_class,
            TA.c.created_at,
            TA.c.updated_at,
            func.coalesce(TA.c.actual_cost_micros, TA.c.estimated_cost_micros).label("cost"),
        )
        .select_from(TA.join(A, A.c.id == TA.c.provider_account_id))
        .where(and_(TA.c.created_at >= since, TA.c.status.in_(FINISHED)))
        .order_by(TA.c.id.desc())
        .limit(MAX_WINDOW_ATTEMPTS)
    )
    if only:
        query = query.where(_of_candidates(only))
    out: dict[str, list[WindowAttempt]] = {}
    for r in await conn.execute(query):
        cid = f"{r.provider}/{r.provider_model}/{r.account_name}"
        if cid in exclude:
            continue
        out.setdefault(cid, []).append(
            WindowAttempt(r.status, r.failure_class, r.created_at, r.updated_at, int(r.cost))
        )
    return out


async def quality_by_candidate(
    conn: AsyncConnection, since: datetime, *, only: Sequence[str] = ()
) -> dict[str, list[tuple[datetime, bool, str]]]:
    """The output probe's technical checks since `since` per candidate (only those of `only`
    when given): (checked at, clean, quality bucket), newest first; the canary's quality
    evidence (9.14, 9.13.5)."""
    query = (
        select(
            A.c.provider,
            A.c.account_name,
            TA.c.provider_model,
            Q.c.created_at,
            Q.c.defects,
            Q.c.bucket,
        )
        .select_from(
            Q.join(TA, TA.c.id == Q.c.attempt_id).join(A, A.c.id == TA.c.provider_account_id)
        )
        .where(Q.c.created_at >= since)
        .order_by(Q.c.id.desc())
        .limit(MAX_WINDOW_ATTEMPTS)
    )
    if only:
        query = query.where(_of_candidates(only))
    out: dict[str, list[tuple[datetime, bool, str]]] = {}
    for r in await conn.execute(query):
        cid = f"{r.provider}/{r.provider_model}/{r.account_name}"
        out.setdefault(cid, []).append((r.created_at, not r.defects, r.bucket))
    return out
