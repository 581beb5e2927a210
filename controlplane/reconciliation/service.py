"""Run and read the daily reconciliation (package doc).

SQL lives in `controlplane.persistence.reconciliation_store`, the rules in
`controlplane.domain.reconciliation`."""

from __future__ import annotations

import functools
import hashlib
import logging
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, time, timedelta
from typing import Any, Protocol, runtime_checkable

from controlplane.domain.reconciliation import (
    SUBMISSION_WINDOW,
    Discrepancy,
    reconcile,
    settled_twice,
)
from controlplane.persistence import reconciliation_store as store
from controlplane.persistence.database import Database
from controlplane.reconciliation import bills
from vidroute_core.adapter import AdapterDescription, UsageRecord, UsageResult
from vidroute_core.hashing import canonical_json

__all__ = [
    "TENANT_SIDE",
    "AccountError",
    "DiscrepancyCounter",
    "NothingToReconcile",
    "ReconciliationReport",
    "RunReport",
    "UsageSource",
    "day_window",
    "delta_by_provider",
    "read_report",
    "run_day",
]

log = logging.getLogger(__name__)
#: The provider name of the tenant-side run (credit ledger settlements).
TENANT_SIDE = "credit_ledger"
DEFAULT_CURRENCY = "USD"
CONFLICT_RETRIES = 3


class UsageSource(Protocol):
    """What reconciliation needs of an adapter client (`GrpcAdapterClient.usage_result`)."""

    async def usage_result(self, account: str, start: datetime, end: datetime) -> UsageResult: ...


@runtime_checkable
class _Describing(Protocol):
    """A source that says which accounts it serves (`GrpcAdapterClient.describe`)."""

    async def describe(self) -> AdapterDescription: ...


class NothingToReconcile(Exception):
    """No provider adapter or no provider account is configured: there is no bill to read,
    which is an error, never a clean day (nothing is stored)."""


@dataclass(frozen=True, slots=True)
class RunReport:
    """One (provider, account)'s current run of the day."""

    run_id: int
    provider: str
    account: str
    billed_micros: int
    expected_micros: int
    delta_micros: int
    currency: str
    record_count: int
    status_counts: Mapping[str, int]
    discrepancies: tuple[Discrepancy, ...]
    created_at: datetime


@dataclass(frozen=True, slots=True)
class AccountError:
    """An account whose usage could not be read: nothing was stored for it (an error is never
    an empty bill)."""

    provider: str
    account: str
    error_class: str
    message: str

    @property
    def unsupported(self) -> bool:
        """The provider has no usage export at all (e.g. the Gemini API): nothing to retry."""
        return self.error_class == "UNSUPPORTED_CAPABILITY"


@dataclass(frozen=True, slots=True)
class ReconciliationReport:
    day: date
    runs: tuple[RunReport, ...]
    errors: tuple[AccountError, ...] = ()
    #: The runs this call wrote (empty on a re-run that found nothing new).
    written: tuple[int, ...] = field(default=())

    @property
    def discrepancies(self) -> tuple[Discrepancy, ...]:
        return tuple(d for run in self.runs for d in run.discrepancies)


def day_window(day: date) -> tuple[datetime, datetime]:
    start = datetime.combine(day, time(0), tzinfo=UTC)
    return start, start + timedelta(days=1)


def _record_json(r: UsageRecord) -> dict[str, Any]:
    return {
        "provider_job_id": r.provider_job_id,
        "provider_request_id": r.provider_request_id,
        "client_request_key": r.client_request_key,
        "model": r.model,
        "usage_time": r.usage_time.astimezone(UTC).isoformat() if r.usage_time else None,
        "provider_milliunits": int(r.provider_milliunits),
        "provider_unit": r.provider_unit,
        "cost_micros": int(r.cost_micros),
        "currency": r.currency,
        "raw_json": r.raw_json,
    }


def _digest(obj: object) -> str:
    return hashlib.sha256(canonical_json(obj)).hexdigest()


def _row_json(d: Discrepancy) -> dict[str, Any]:
    return {
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
        "currency": d.currency,
        "evidence": dict(d.evidence),
    }


async def run_day(
    db: Database,
    sources: Mapping[str, UsageSource],
    day: date,
    *,
    now: datetime | None = None,
    window: timedelta = SUBMISSION_WINDOW,
) -> ReconciliationReport:
    """Reconcile `day` (UTC) for every account of every provider in `sources`, and the credit
    ledger's settlements of the day; returns the day's report (package doc)."""
    now = now or datetime.now(UTC)
    start, end = day_window(day)
    if not sources:
        raise NothingToReconcile("no provider adapter is configured (VIDROUTE_ADAPTERS)")
    async with db.reads() as reads:
        accounts = await reads.billed_accounts()
    if not accounts:
        raise NothingToReconcile("no provider account is configured")
    serving, away = await _serving(sources, accounts)
    errors: list[AccountError] = []
    written: list[int] = []
    for provider, account in accounts:
        imported = await bills.imported_records(db, provider, account, day)
        if imported is not None:
            # A bill file imported for the day (Google's Cloud Billing export) is the bill.
            records: Sequence[UsageRecord] = imported[1]
        else:
            read = await _read_usage(serving, away, provider, account, day)
            if isinstance(read, AccountError):
                errors.append(read)
                continue
            records = read
        run_id = await _retrying(
            functools.partial(
                _reconcile_account, db, provider, account, day, start, end, records, now
            ),
            window,
        )
        if run_id is not None:
            written.append(run_id)
    tenant_run = await _retrying(functools.partial(_reconcile_tenants, db, day, start, end), now)
    if tenant_run is not None:
        written.append(tenant_run)
    report = await read_report(db, day)
    return ReconciliationReport(report.day, report.runs, tuple(errors), tuple(written))


async def _read_usage(
    serving: Mapping[tuple[str, str], UsageSource],
    away: Mapping[str, str],
    provider: str,
    account: str,
    day: date,
) -> Sequence[UsageRecord] | AccountError:
    """The account's usage of `day` from the adapter serving it, or why it could not be read."""
    source = serving.get((provider, account))
    if source is None:
        return _no_source(provider, account, away)
    start, end = day_window(day)
    try:
        result = await source.usage_result(account, start, end)
    except Exception as exc:  # a sidecar away: report it, store nothing
        log.warning("reconcile %s/%s %s: ListUsage failed: %r", provider, account, day, exc)
        return AccountError(provider, account, "UNAVAILABLE", str(exc)[:300])
    if result.error is not None:
        message = result.error.message[:300]
        if result.error.error_class.name == "UNSUPPORTED_CAPABILITY":
            message += " (import the provider's bill: vidroute usage import FILE)"
        return AccountError(provider, account, result.error.error_class.name, message)
    return result.records


async def _serving(
    sources: Mapping[str, UsageSource], accounts: Sequence[tuple[str, str]]
) -> tuple[dict[tuple[str, str], UsageSource], dict[str, str]]:
    """Which source serves each (provider, account): what each adapter's Describe names,
    whatever its key (``make up`` keys them ``veo`` / ``selfhosted`` while the accounts say
    ``google`` / ``self_hosted``). A source that cannot describe itself (away, or a plain
    usage source) serves the accounts of the provider its key names, if any; its failure is
    kept (adapter key -> error) to explain the accounts nobody serves."""
    serving: dict[tuple[str, str], UsageSource] = {}
    away: dict[str, str] = {}
    for key, source in sorted(sources.items()):
        described: set[tuple[str, str]] | None = None
        if isinstance(source, _Describing):
            try:
                reply = await source.describe()
                docs = reply.capability_documents
                described = {(str(d["provider"]), str(d["account"])) for d in docs}
            except Exception as exc:  # a sidecar away: its accounts are not read, and said so
                log.warning("reconcile: adapter %s did not describe itself: %r", key, exc)
                away[key] = str(exc)[:200]
        for pair in accounts:
            mine = pair in described if described is not None else pair[0] == key
            if mine:
                serving.setdefault(pair, source)
    return serving, away


def _no_source(provider: str, account: str, away: Mapping[str, str]) -> AccountError:
    if away:
        names = ", ".join(f"{k} ({v})" for k, v in sorted(away.items()))
        return AccountError(
            provider, account, "UNAVAILABLE", f"no reachable adapter serves it; away: {names}"[:300]
        )
    return AccountError(
        provider, account, "NO_ADAPTER", "no configured adapter serves this account"
    )


async def _retrying(run: Callable[[Any], Awaitable[int | None]], arg: Any) -> int | None:
    """Run one account's reconciliation; a concurrent run of the same account that committed
    first (two CronJob pods) makes this one start over, and then usually find it unchanged."""
    for _ in range(CONFLICT_RETRIES):
        try:
            return await run(arg)
        except store.RunConflict as exc:
            log.info("reconcile: %s; running the account again", exc)
    return await run(arg)


async def _reconcile_account(  # noqa: PLR0917 - one call site, all named by position
    db: Database,
    provider: str,
    account: str,
    day: date,
    start: datetime,
    end: datetime,
    records: Sequence[UsageRecord],
    now: datetime,
    window: timedelta,
) -> int | None:
    rows = [_record_json(r) for r in records]
    payload = canonical_json({"provider": provider, "account": account, "records": rows})
    sha = hashlib.sha256(payload).hexdigest()
    new = [
        store.NewRecord(
            model=r.model,
            usage_time=r.usage_time,
            provider_milliunits=int(r.provider_milliunits),
            provider_unit=r.provider_unit,
            cost_micros=int(r.cost_micros),
            currency=r.currency or DEFAULT_CURRENCY,
            raw_json=r.raw_json,
            provider_job_id=r.provider_job_id,
            provider_request_id=r.provider_request_id,
            client_request_key=r.client_request_key,
        )
        for r in records
    ]
    async with db.unit(now) as unit:
        imported = await unit.store_usage_import(
            provider=provider,
            account=account,
            window_start=start,
            window_end=end,
            payload=payload.decode("utf-8"),
            payload_sha256=sha,
            records=new,
        )
        local = await unit.usage_expectations(
            provider=provider, account=account, start=start, end=end, window=window
        )
        outcome = reconcile(imported.records, local, window=window)
        statuses = {str(rid): s.value for rid, s in sorted(outcome.statuses.items())}
        currency = next(
            (r.currency for r in imported.records if r.currency),
            next((e.currency for e in local), DEFAULT_CURRENCY),
        )
        result = {
            "import": sha,
            "statuses": statuses,
            "matched": {str(k): v for k, v in sorted(outcome.matched_attempts.items())},
            "rows": [_row_json(d) for d in outcome.discrepancies],
            "billed": outcome.billed_micros,
            "expected": outcome.expected_micros,
        }
        run, created = await unit.save_reconciliation_run(
            day=day.isoformat(),
            provider=provider,
            account=account,
            import_id=imported.id,
            result_sha256=_digest(result),
            record_count=len(imported.records),
            billed_micros=outcome.billed_micros,
            expected_micros=outcome.expected_micros,
            currency=currency,
            statuses=statuses,
            rows=outcome.discrepancies,
        )
    return run.id if created else None


async def _reconcile_tenants(
    db: Database, day: date, start: datetime, end: datetime, now: datetime
) -> int | None:
    async with db.unit(now) as unit:
        rows = settled_twice(await unit.settlements(start, end))
        result = {"rows": [_row_json(d) for d in rows]}
        run, created = await unit.save_reconciliation_run(
            day=day.isoformat(),
            provider=TENANT_SIDE,
            account="",
            import_id=None,
            result_sha256=_digest(result),
            record_count=0,
            billed_micros=sum(d.billed_micros for d in rows),
            expected_micros=0,
            currency=rows[0].currency if rows else DEFAULT_CURRENCY,
            statuses={},
            rows=rows,
        )
    return run.id if created else None


async def read_report(db: Database, day: date) -> ReconciliationReport:
    """The current runs of `day` with their rows (empty when the day was never reconciled)."""
    async with db.reads() as reads:
        runs = await reads.current_runs(day.isoformat())
        rows = await reads.discrepancies_of([r.id for r in runs])
    return ReconciliationReport(
        day,
        tuple(
            RunReport(
                run_id=r.id,
                provider=r.provider,
                account=r.account,
                billed_micros=r.billed_micros,
                expected_micros=r.expected_micros,
                delta_micros=r.delta_micros,
                currency=r.currency,
                record_count=r.record_count,
                status_counts=dict(sorted(Counter(r.statuses.values()).items())),
                discrepancies=tuple(rows.get(r.id, ())),
                created_at=r.created_at,
            )
            for r in runs
        ),
    )


async def delta_by_provider(db: Database) -> dict[str, int]:
    """Billed minus expected micros per provider, summed over its accounts' current runs of the
    latest reconciled day (``provider_reconciliation_delta_micros{provider}``)."""
    async with db.reads() as reads:
        runs = await reads.current_runs(None)
    out: dict[str, int] = {}
    for r in runs:
        if r.provider != TENANT_SIDE:
            out[r.provider] = out.get(r.provider, 0) + r.delta_micros
    return out


class DiscrepancyCounter:
    """The rows written since the last call, by (provider, kind), for the counter
    ``provider_reconciliation_discrepancies_total``: the first call counts every row stored
    (a restarted control plane's counter starts at the total; ``increase()`` sees a reset),
    later calls only the new ones (one grouped query on the row id)."""

    def __init__(self, db: Database) -> None:
        self._db = db
        self._last_id = 0

    async def __call__(self) -> dict[tuple[str, str], int]:
        async with self._db.reads() as reads:
            counts, self._last_id = await reads.discrepancy_counts(self._last_id)
        return counts
