"""SQL of the daily reconciliation (revision 0007; design 9.23.3): raw imports, usage records,
the local facts the matcher needs, runs and their discrepancy rows.

* `store_import` writes a ListUsage answer raw (canonical JSON + sha256) with its normalized
  records, once: the same payload for the same account and window returns the stored import.
* `expectations` reads the account's attempts around a day (task_attempts, provider_jobs,
  attempt_runtime's late-found job id, and provider_usage_ledger's EXPECTED / ACTUAL rows:
  a succeeded attempt's ACTUAL wins, any other's estimate is its would-be cost and its ACTUAL
  its measured cost; the ledger's whole units become thousandths), with the billing rules and
  the other price versions of its model (`reconciliation_prices`), as
  `controlplane.domain.reconciliation.Expectation`.
* `settlements` reads the credit ledger's settlement entries of the tasks settled in a window.
* `save_run` stores a run's result unless the current run of (day, provider, account) has the
  same result digest; a different result supersedes it (``superseded_by``), in one transaction.
* `current_runs` / `discrepancies_of` read the report back; `discrepancy_counts` counts the rows
  written since a row id, by provider and kind (the metric).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import func, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import RowMapping
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncConnection

from controlplane.domain.reconciliation import (
    BILLABLE_STATES,
    UNKNOWN_STATES,
    Billed,
    Discrepancy,
    DiscrepancyKind,
    Expectation,
    Settlement,
)
from controlplane.persistence.models import attempt_runtime as RT
from controlplane.persistence.models import credit_ledger as C
from controlplane.persistence.models import generation_tasks as T
from controlplane.persistence.models import provider_accounts as PA
from controlplane.persistence.models import provider_jobs as J
from controlplane.persistence.models import provider_usage_ledger as U
from controlplane.persistence.models import provider_usage_records as PUR
from controlplane.persistence.models import raw_usage_imports as RAW
from controlplane.persistence.models import reconciliation_discrepancies as RD
from controlplane.persistence.models import reconciliation_runs as RR
from controlplane.persistence.models import task_attempts as A
from controlplane.persistence.reconciliation_prices import price_book

__all__ = [
    "NewRecord",
    "RunConflict",
    "RunRow",
    "StoredImport",
    "accounts_of",
    "current_runs",
    "discrepancies_of",
    "discrepancy_counts",
    "expectations",
    "save_run",
    "schema_ready",
    "settlements",
    "store_import",
]


IN_CHUNK = 5000
RECONCILIATION_REVISION = "0007_reconciliation"


class RunConflict(Exception):
    """Another reconciliation of the same (day, provider, account) committed a run first (the
    partial unique index on the current run); run the account again."""


@dataclass(frozen=True, slots=True)
class NewRecord:
    """A normalized usage record to store with its import."""

    model: str
    usage_time: datetime | None
    provider_milliunits: int
    provider_unit: str
    cost_micros: int
    currency: str
    raw_json: str
    provider_job_id: str = ""
    provider_request_id: str = ""
    client_request_key: str = ""


@dataclass(frozen=True, slots=True)
class StoredImport:
    id: int
    created: bool
    payload_sha256: str
    records: tuple[Billed, ...]


@dataclass(frozen=True, slots=True)
class RunRow:
    id: int
    day: str
    provider: str
    account: str
    import_id: int | None
    result_sha256: str
    record_count: int
    billed_micros: int
    expected_micros: int
    delta_micros: int
    currency: str
    statuses: Mapping[str, Any]
    created_at: datetime


def _insert_ignore(conn: AsyncConnection, table: Any, keys: list[str]) -> Any:
    dialect = postgresql if conn.dialect.name == "postgresql" else sqlite
    return dialect.insert(table).on_conflict_do_nothing(index_elements=keys)


async def store_import(
    conn: AsyncConnection,
    *,
    provider: str,
    account: str,
    window_start: datetime,
    window_end: datetime,
    payload: str,
    payload_sha256: str,
    records: Sequence[NewRecord],
    now: datetime,
) -> StoredImport:
    """The import of this payload (stored now, or the one stored before) and its records."""
    keys = ["provider", "account", "window_start", "payload_sha256"]
    inserted = await conn.execute(
        _insert_ignore(conn, RAW, keys)
        .values(
            provider=provider,
            account=account,
            window_start=window_start,
            window_end=window_end,
            payload=payload,
            payload_sha256=payload_sha256,
            record_count=len(records),
            fetched_at=now,
        )
        .returning(RAW.c.id)
    )
    new_id = inserted.scalar_one_or_none()
    created = new_id is not None
    if new_id is None:
        new_id = (
            await conn.execute(
                select(RAW.c.id).where(
                    RAW.c.provider == provider,
                    RAW.c.account == account,
                    RAW.c.window_start == window_start,
                    RAW.c.payload_sha256 == payload_sha256,
                )
            )
        ).scalar_one()
    elif records:
        await conn.execute(
            PUR.insert(),
            [
                {
                    "import_id": new_id,
                    "line_no": n,
                    "provider": provider,
                    "account": account,
                    "model": r.model,
                    "provider_job_id": r.provider_job_id,
                    "provider_request_id": r.provider_request_id,
                    "client_request_key": r.client_request_key,
                    "usage_time": r.usage_time,
                    "provider_milliunits": r.provider_milliunits,
                    "provider_unit": r.provider_unit,
                    "cost_micros": r.cost_micros,
                    "currency": r.currency,
                    "raw_json": r.raw_json,
                }
                for n, r in enumerate(records)
            ],
        )
    rows = await conn.execute(select(PUR).where(PUR.c.import_id == new_id).order_by(PUR.c.line_no))
    billed = tuple(
        Billed(
            record_id=m["id"],
            provider=m["provider"],
            account=m["account"],
            model=m["model"],
            usage_time=m["usage_time"],
            milliunits=m["provider_milliunits"],
            unit=m["provider_unit"],
            cost_micros=m["cost_micros"],
            currency=m["currency"],
            provider_job_id=m["provider_job_id"],
            provider_request_id=m["provider_request_id"],
            client_request_key=m["client_request_key"],
        )
        for m in rows.mappings()
    )
    return StoredImport(int(new_id), created, payload_sha256, billed)


async def expectations(
    conn: AsyncConnection,
    *,
    provider: str,
    account: str,
    start: datetime,
    end: datetime,
    window: timedelta,
) -> list[Expectation]:
    """The account's attempts that reached (or may have reached) the provider around
    ``[start, end)``: submitted from ``start - window`` to ``end + window``. ``in_day``: an
    attempt whose job ended in the day, or an unknown submit sent in it."""
    sent = func.coalesce(A.c.request_started_at, A.c.created_at)
    query = (
        select(
            A.c.id,
            A.c.task_id,
            A.c.status,
            A.c.provider_model,
            A.c.client_request_key,
            A.c.estimated_cost_micros,
            A.c.actual_cost_micros,
            A.c.currency,
            A.c.price_version,
            A.c.request_started_at,
            A.c.created_at,
            A.c.updated_at,
            J.c.provider_job_id,
            J.c.provider_request_id,
            J.c.submitted_at,
            J.c.completed_at,
            RT.c.late_found_job_id,
            T.c.spec,
        )
        .select_from(
            A.join(PA, PA.c.id == A.c.provider_account_id)
            .join(T, T.c.id == A.c.task_id)
            .outerjoin(J, J.c.attempt_id == A.c.id)
            .outerjoin(RT, RT.c.attempt_id == A.c.id)
        )
        .where(
            PA.c.provider == provider,
            PA.c.account_name == account,
            sent >= start - window,
            sent < end + window,
            A.c.request_started_at.is_not(None) | J.c.id.is_not(None),
        )
        .order_by(A.c.id)
    )
    rows = list((await conn.execute(query)).mappings())
    ledger = await _ledger_of(conn, [r["id"] for r in rows])
    prices = await price_book(conn, provider, account)
    out = []
    for r in rows:
        state = str(r["status"])
        entries = ledger.get(r["id"], {})
        measured = entries.get("ACTUAL", {})
        # What the provider should bill: a succeeded attempt's ACTUAL cost (else EXPECTED, else
        # the estimate); any other attempt's would-be cost is its estimate (what a wrongful
        # charge would amount to), never its ACTUAL 0.
        kinds = ("ACTUAL", "EXPECTED") if state in BILLABLE_STATES else ("EXPECTED",)
        entry = next((entries[k] for k in kinds if k in entries), {})
        amount = entry.get("amount_micros")
        if amount is None:
            amount = (
                r["actual_cost_micros"]
                if r["actual_cost_micros"] is not None and state in BILLABLE_STATES
                else r["estimated_cost_micros"]
            )
        # The ledger counts whole units of its rate's unit (`money.units_for`); records count
        # thousandths.
        units = entry.get("provider_units")
        version = str(entry.get("price_version") or r["price_version"] or "")
        submitted = r["submitted_at"] or r["request_started_at"] or r["created_at"]
        ended = r["completed_at"] or r["updated_at"]
        moment = submitted if state in UNKNOWN_STATES else ended
        out.append(
            Expectation(
                attempt_id=r["id"],
                task_id=r["task_id"],
                provider=provider,
                account=account,
                model=r["provider_model"],
                state=state,
                submitted_at=submitted,
                expected_micros=int(amount),
                currency=r["currency"],
                in_day=moment is not None and start <= moment < end,
                provider_job_id=r["provider_job_id"] or r["late_found_job_id"] or "",
                provider_request_id=r["provider_request_id"] or "",
                client_request_key=r["client_request_key"] or "",
                expected_milliunits=int(units) * 1000 if units else 0,
                unit=str(
                    entry.get("provider_unit_name") or measured.get("provider_unit_name") or ""
                ),
                price_version=version,
                conversion_rate_version=str(entry.get("conversion_rate_version") or ""),
                rules=prices.rules(r["provider_model"], version),
                measured_micros=measured.get("amount_micros"),
                measured_milliunits=int(measured.get("provider_units") or 0) * 1000,
                alternatives=prices.alternatives(r["provider_model"], version, r["spec"]),
            )
        )
    return out


async def _ledger_of(
    conn: AsyncConnection, attempt_ids: list[int]
) -> dict[int, dict[str, dict[str, Any]]]:
    """Per attempt, its EXPECTED and ACTUAL provider usage entries by kind (the first of each)."""
    out: dict[int, dict[str, dict[str, Any]]] = {}
    # In chunks: a driver takes at most 32,767 parameters per statement.
    for at in range(0, len(attempt_ids), IN_CHUNK):
        rows = await conn.execute(
            select(U)
            .where(
                U.c.attempt_id.in_(attempt_ids[at : at + IN_CHUNK]),
                U.c.kind.in_(("EXPECTED", "ACTUAL")),
            )
            .order_by(U.c.id)
        )
        for m in rows.mappings():
            out.setdefault(m["attempt_id"], {}).setdefault(m["kind"], dict(m))
    return out


async def settlements(conn: AsyncConnection, start: datetime, end: datetime) -> list[Settlement]:
    """Every settlement entry of the tasks that had one created in ``[start, end)``."""
    settling = ("CHARGE", "RELEASE")
    tasks = (
        select(C.c.task_id)
        .where(C.c.kind.in_(settling), C.c.created_at >= start, C.c.created_at < end)
        .scalar_subquery()
    )
    rows = await conn.execute(
        select(C).where(C.c.kind.in_(settling), C.c.task_id.in_(tasks)).order_by(C.c.id)
    )
    return [
        Settlement(
            entry_id=m["id"],
            tenant_id=m["tenant_id"],
            task_id=m["task_id"],
            kind=m["kind"],
            amount_micros=m["amount_micros"],
            currency=m["currency"],
        )
        for m in rows.mappings()
    ]


def _run(m: RowMapping) -> RunRow:
    return RunRow(
        id=m["id"],
        day=m["day"],
        provider=m["provider"],
        account=m["account"],
        import_id=m["import_id"],
        result_sha256=m["result_sha256"],
        record_count=m["record_count"],
        billed_micros=m["billed_micros"],
        expected_micros=m["expected_micros"],
        delta_micros=m["delta_micros"],
        currency=m["currency"],
        statuses=dict(m["statuses"] or {}),
        created_at=m["created_at"],
    )


async def _current(conn: AsyncConnection, day: str, provider: str, account: str) -> RunRow | None:
    found = (
        (
            await conn.execute(
                select(RR).where(
                    RR.c.day == day,
                    RR.c.provider == provider,
                    RR.c.account == account,
                    RR.c.superseded_by.is_(None),
                )
            )
        )
        .mappings()
        .first()
    )
    return None if found is None else _run(found)


async def _insert_run(conn: AsyncConnection, *, now: datetime, **values: Any) -> int:
    values["statuses"] = dict(values["statuses"])
    values["delta_micros"] = values["billed_micros"] - values["expected_micros"]
    new_id = (
        await conn.execute(RR.insert().values(**values, created_at=now).returning(RR.c.id))
    ).scalar_one()
    return int(new_id)


async def save_run(
    conn: AsyncConnection,
    *,
    day: str,
    provider: str,
    account: str,
    import_id: int | None,
    result_sha256: str,
    record_count: int,
    billed_micros: int,
    expected_micros: int,
    currency: str,
    statuses: Mapping[str, Any],
    rows: Sequence[Discrepancy],
    now: datetime,
) -> tuple[RunRow, bool]:
    """The current run of (day, provider, account): the stored one when its result digest is
    the same (nothing written), else a new run superseding it. ``(run, created)``."""
    current = await _current(conn, day, provider, account)
    if current is not None and current.result_sha256 == result_sha256:
        return current, False
    if current is not None:
        # Park the old run first (the partial unique index allows one current run), then
        # point it at the new one.
        await conn.execute(update(RR).where(RR.c.id == current.id).values(superseded_by=-1))
    try:
        new_id = await _insert_run(
            conn,
            day=day,
            provider=provider,
            account=account,
            import_id=import_id,
            result_sha256=result_sha256,
            record_count=record_count,
            billed_micros=billed_micros,
            expected_micros=expected_micros,
            currency=currency,
            statuses=statuses,
            now=now,
        )
    except IntegrityError as exc:
        raise RunConflict(f"{day} {provider}/{account}: a concurrent run won") from exc
    if current is not None:
        await conn.execute(update(RR).where(RR.c.id == current.id).values(superseded_by=new_id))
    if rows:
        await conn.execute(
            RD.insert(),
            [
                {
                    "run_id": new_id,
                    "seq": n,
                    "kind": d.kind.value,
                    "provider": d.provider,
                    "account": d.account,
                    "model": d.model,
                    "attempt_id": d.attempt_id,
                    "task_id": d.task_id,
                    "provider_job_id": d.provider_job_id,
                    "record_ids": list(d.record_ids),
                    "billed_micros": d.billed_micros,
                    "expected_micros": d.expected_micros,
                    "delta_micros": d.delta_micros,
                    "currency": d.currency or currency,
                    "evidence": dict(d.evidence),
                    "suggested_action": d.suggested_action,
                }
                for n, d in enumerate(rows)
            ],
        )
    run = await _current(conn, day, provider, account)
    assert run is not None
    return run, True


async def current_runs(conn: AsyncConnection, day: str | None = None) -> list[RunRow]:
    """The current run of every (provider, account) of `day` (None: the latest day run)."""
    if day is None:
        day = (await conn.execute(select(func.max(RR.c.day)))).scalar_one_or_none()
        if day is None:
            return []
    rows = await conn.execute(
        select(RR)
        .where(RR.c.day == day, RR.c.superseded_by.is_(None))
        .order_by(RR.c.provider, RR.c.account)
    )
    return [_run(m) for m in rows.mappings()]


async def discrepancies_of(
    conn: AsyncConnection, run_ids: Sequence[int]
) -> dict[int, list[Discrepancy]]:
    """The rows of each run, in report order."""
    if not run_ids:
        return {}
    rows = await conn.execute(
        select(RD).where(RD.c.run_id.in_(list(run_ids))).order_by(RD.c.run_id, RD.c.seq)
    )
    out: dict[int, list[Discrepancy]] = {rid: [] for rid in run_ids}
    for m in rows.mappings():
        out[m["run_id"]].append(
            Discrepancy(
                kind=DiscrepancyKind(m["kind"]),
                provider=m["provider"],
                account=m["account"],
                model=m["model"],
                billed_micros=m["billed_micros"],
                expected_micros=m["expected_micros"],
                currency=m["currency"],
                attempt_id=m["attempt_id"],
                task_id=m["task_id"],
                provider_job_id=m["provider_job_id"],
                record_ids=tuple(m["record_ids"] or ()),
                evidence=dict(m["evidence"] or {}),
                row_id=int(m["id"]),
            )
        )
    return out


async def accounts_of(conn: AsyncConnection) -> list[tuple[str, str]]:
    """(provider, account name) of every configured provider account, sorted: the accounts a
    day's reconciliation must read, whatever adapter serves them."""
    rows = await conn.execute(
        select(PA.c.provider, PA.c.account_name)
        .distinct()
        .order_by(PA.c.provider, PA.c.account_name)
    )
    return [(str(p), str(a)) for p, a in rows.all()]


async def discrepancy_counts(
    conn: AsyncConnection, after_id: int
) -> tuple[dict[tuple[str, str], int], int]:
    """Rows written after row `after_id`, counted by (the run's provider, kind), and the last
    row id seen (`after_id` when none): one grouped query, however many rows."""
    rows = await conn.execute(
        select(RR.c.provider, RD.c.kind, func.count(), func.max(RD.c.id))
        .select_from(RD.join(RR, RR.c.id == RD.c.run_id))
        .where(RD.c.id > after_id)
        .group_by(RR.c.provider, RD.c.kind)
    )
    counts: dict[tuple[str, str], int] = {}
    last = after_id
    for provider, kind, n, top in rows.all():
        counts[(str(provider), str(kind))] = int(n)
        last = max(last, int(top))
    return counts, last


async def schema_ready(url: str) -> bool:
    """Whether the database at `url` has revision 0007 (the reconciliation tables) applied."""
    from alembic.script import ScriptDirectory

    from controlplane.persistence.migrate import alembic_config, current_revision

    revision = await current_revision(url)
    if revision is None:
        return False
    script = ScriptDirectory.from_config(alembic_config())
    return any(
        r.revision == RECONCILIATION_REVISION for r in script.iterate_revisions(revision, "base")
    )
