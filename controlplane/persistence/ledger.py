"""The two money books in SQL (design 9.23.1): the credit ledger and the provider usage ledger.

Read seams (shared with the billing RPCs and the reconciliation; names per the money schema
contract):

* `balance(conn, tenant_id, currency)` -> `Balance` (balance, reserved, available, as of the
  newest entry id). Derived: balance = CREDIT - CHARGE + REFUND; reserved = the RESERVE entries
  whose task has no settlement (CHARGE or RELEASE) yet. The balance is served from the
  ``credit_balances`` cache while it is as of the newest CREDIT/CHARGE/REFUND entry, the held
  amount from the live tasks' reservations; else both are summed (`derived_balance`, the truth).
* `list_entries(conn, tenant_id, after_id, limit)` -> `CreditEntry` list, oldest first.
* `append_credit(conn, tenant_id, amount_micros, currency, idempotency_key, actor, reason, now)`
  -> ``(CreditEntry, created)``; a replay of the key returns the stored entry, the key reused
  for another amount or currency raises `CreditKeyConflict`.
* `usage_entries_between(conn, start, end, provider=None)` -> `ProviderUsageEntry` list whose
  ``created_at`` is in ``[start, end)``; `usage_of_task(conn, task_id)`.
* `unit_rate(conn, provider, unit_name, at)` -> the `UnitRate` effective at `at`;
  `rate_version(conn, provider, version)` -> the rate stored under a version (publication
  stores each model's rate under its price version, so ``conversion_rate_version`` of an
  ACTUAL entry names the price version it was converted with).

Writes (called by the unit of work inside its transaction): `lock_tenant` + `reserve` at
CreateTask, `settle_task` at a task's terminal transition (its PLATFORM_LOSS rows too;
`settle_tasks` for many tasks ended in one transaction, set-based),
`record_usage` for EXPECTED / ACTUAL rows, `put_unit_rate`. Every write is insert-once on its
idempotency key (``ON CONFLICT DO NOTHING``), and the partial UNIQUE indexes of revision 0006
refuse a second reserve or settlement of a task even from a writer that skips these functions.
Idempotency keys: ``reserve:<task_id>``, ``settle:<task_id>``, ``expected:<attempt_id>``,
``actual:<attempt_id>``, ``loss:<attempt_id>``, ``underpriced:<attempt_id>`` (the delivered
attempt's cost beyond its charge).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, cast

from sqlalchemy import and_, case, exists, func, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import RowMapping
from sqlalchemy.ext.asyncio import AsyncConnection
from sqlalchemy.sql import Select

from controlplane.domain.money import (
    AttemptBill,
    CreditKind,
    LossCause,
    Reservation,
    Settlement,
    UsageKind,
    check_reserve,
    platform_losses,
    settle,
    underpriced_loss,
)
from controlplane.domain.states import TASK_MACHINE, AttemptState, TaskState
from controlplane.persistence.advisory import xact_lock
from controlplane.persistence.models import credit_balances as B
from controlplane.persistence.models import credit_ledger as C
from controlplane.persistence.models import generation_tasks as T
from controlplane.persistence.models import provider_accounts as PA
from controlplane.persistence.models import provider_jobs as J
from controlplane.persistence.models import provider_unit_rates as R
from controlplane.persistence.models import provider_usage_ledger as U
from controlplane.persistence.models import task_attempts as A
from vidroute_core.exceptions import DomainError

__all__ = [
    "SYSTEM_ACTOR",
    "Balance",
    "CreditEntry",
    "CreditKeyConflict",
    "NewUsage",
    "ProviderUsageEntry",
    "Settle",
    "UnitRate",
    "append_credit",
    "balance",
    "check_and_lock",
    "derived_balance",
    "list_entries",
    "lock_tenant",
    "put_unit_rate",
    "rate_version",
    "record_usage",
    "reservation_of",
    "reserve",
    "settle_task",
    "settle_tasks",
    "settlement_of",
    "unit_rate",
    "usage_entries_between",
    "usage_of_task",
]

SYSTEM_ACTOR = "system"
_SETTLE_KINDS = (CreditKind.CHARGE.value, CreditKind.RELEASE.value)
_BALANCE_KINDS = (CreditKind.CREDIT.value, CreditKind.CHARGE.value, CreditKind.REFUND.value)
# In declaration order, the order of ix_generation_tasks_open_tenant's predicate (so the
# planner can prove the index applies).
_LIVE_TASK_STATES = tuple(s.value for s in TaskState if not TASK_MACHINE.is_terminal(s))


class CreditKeyConflict(DomainError):
    """An idempotency key already names a credit entry with another amount or currency."""

    def __init__(self, key: str, stored: CreditEntry) -> None:
        super().__init__(
            f"idempotency key {key!r} already credited {stored.amount_micros} {stored.currency} "
            "micros"
        )
        self.key = key
        self.stored = stored


@dataclass(frozen=True, slots=True)
class Balance:
    """A tenant's derived balance in one currency; `as_of_entry_id` 0 means no entries."""

    tenant_id: str
    currency: str
    balance_micros: int
    reserved_micros: int
    available_micros: int
    as_of_entry_id: int


@dataclass(frozen=True, slots=True)
class CreditEntry:
    id: int
    tenant_id: str
    kind: CreditKind
    amount_micros: int
    currency: str
    task_id: int | None
    attempt_id: int | None
    idempotency_key: str
    actor: str
    reason: str
    created_at: datetime

    @property
    def balance_effect_micros(self) -> int:
        """What this entry adds to the balance (reservations change only `available`)."""
        if self.kind in (CreditKind.CREDIT, CreditKind.REFUND):
            return self.amount_micros
        if self.kind is CreditKind.CHARGE:
            return -self.amount_micros
        return 0


@dataclass(frozen=True, slots=True)
class ProviderUsageEntry:
    id: int
    attempt_id: int
    task_id: int
    provider: str
    provider_account_id: int
    model: str
    provider_job_id: str | None
    kind: UsageKind
    amount_micros: int
    currency: str
    provider_units: int | None
    provider_unit_name: str | None
    price_version: str
    conversion_rate_version: str | None
    evidence: Mapping[str, Any]
    idempotency_key: str
    created_at: datetime


@dataclass(frozen=True, slots=True)
class NewUsage:
    """A provider usage entry to write (`record_usage`)."""

    attempt_id: int
    task_id: int
    provider: str
    provider_account_id: int
    model: str
    kind: UsageKind
    amount_micros: int
    currency: str
    price_version: str
    idempotency_key: str
    provider_job_id: str | None = None
    provider_units: int | None = None
    provider_unit_name: str | None = None
    conversion_rate_version: str | None = None
    evidence: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class UnitRate:
    """micros of one unit = micros_per_unit / unit_divisor, in `currency`."""

    provider: str
    unit_name: str
    rate_version: str
    micros_per_unit: int
    unit_divisor: int
    currency: str
    effective_from: datetime
    effective_to: datetime | None


def _credit(m: RowMapping) -> CreditEntry:
    return CreditEntry(
        id=m["id"],
        tenant_id=m["tenant_id"],
        kind=CreditKind(m["kind"]),
        amount_micros=m["amount_micros"],
        currency=m["currency"],
        task_id=m["task_id"],
        attempt_id=m["attempt_id"],
        idempotency_key=m["idempotency_key"],
        actor=m["actor"],
        reason=m["reason"],
        created_at=m["created_at"],
    )


def _usage(m: RowMapping) -> ProviderUsageEntry:
    return ProviderUsageEntry(
        id=m["id"],
        attempt_id=m["attempt_id"],
        task_id=m["task_id"],
        provider=m["provider"],
        provider_account_id=m["provider_account_id"],
        model=m["model"],
        provider_job_id=m["provider_job_id"],
        kind=UsageKind(m["kind"]),
        amount_micros=m["amount_micros"],
        currency=m["currency"],
        provider_units=m["provider_units"],
        provider_unit_name=m["provider_unit_name"],
        price_version=m["price_version"],
        conversion_rate_version=m["conversion_rate_version"],
        evidence=dict(m["evidence"] or {}),
        idempotency_key=m["idempotency_key"],
        created_at=m["created_at"],
    )


def _rate(m: RowMapping) -> UnitRate:
    return UnitRate(
        provider=m["provider"],
        unit_name=m["unit_name"],
        rate_version=m["rate_version"],
        micros_per_unit=m["micros_per_unit"],
        unit_divisor=m["unit_divisor"],
        currency=m["currency"],
        effective_from=m["effective_from"],
        effective_to=m["effective_to"],
    )


# ---- reads ---------------------------------------------------------------------------------


async def balance(conn: AsyncConnection, tenant_id: str, currency: str) -> Balance:
    """The tenant's balance in `currency` (see the module docstring).

    The balance comes from ``credit_balances`` while its `last_entry_id` is the newest
    CREDIT / CHARGE / REFUND entry's, the held amount from the reservations of the tenant's live
    tasks (a settlement ends a task's hold in the transaction that ends the task): index
    lookups, whatever the ledger's length. Without a current cache: `derived_balance`."""
    cached = (
        (await conn.execute(select(B).where(B.c.tenant_id == tenant_id, B.c.currency == currency)))
        .mappings()
        .first()
    )
    if cached is None or cached["last_entry_id"] != await _newest_id(conn, tenant_id, currency):
        return await derived_balance(conn, tenant_id, currency)
    settled = C.alias("settled")
    held = int(
        await conn.scalar(
            select(func.coalesce(func.sum(C.c.amount_micros), 0))
            .select_from(T.join(C, C.c.task_id == T.c.id))
            .where(
                T.c.tenant_id == tenant_id,
                T.c.status.in_(_LIVE_TASK_STATES),
                C.c.kind == CreditKind.RESERVE.value,
                C.c.currency == currency,
                ~exists().where(settled.c.task_id == T.c.id, settled.c.kind.in_(_SETTLE_KINDS)),
            )
        )
        or 0
    )
    newest = int(
        await conn.scalar(
            select(C.c.id)
            .where(C.c.tenant_id == tenant_id, C.c.currency == currency)
            .order_by(C.c.id.desc())
            .limit(1)
        )
        or 0
    )
    total = int(cached["balance_micros"])
    return Balance(tenant_id, currency, total, held, total - held, newest)


async def _newest_id(
    conn: AsyncConnection, tenant_id: str, currency: str, *, besides: Sequence[int] = ()
) -> int:
    """The newest balance-changing (CREDIT / CHARGE / REFUND) entry's id, 0 if none.

    ORDER BY id DESC LIMIT 1, not max(id): one step down ix_credit_ledger_balance_entries
    whatever the planner's row estimate."""
    query = (
        select(C.c.id)
        .where(C.c.tenant_id == tenant_id, C.c.currency == currency, C.c.kind.in_(_BALANCE_KINDS))
        .order_by(C.c.id.desc())
        .limit(1)
    )
    if besides:
        query = query.where(C.c.id.not_in(besides))
    return int(await conn.scalar(query) or 0)


async def derived_balance(conn: AsyncConnection, tenant_id: str, currency: str) -> Balance:
    """The balance summed from the entries themselves: the truth the cache must equal."""
    effect = case(
        (C.c.kind.in_([CreditKind.CREDIT.value, CreditKind.REFUND.value]), C.c.amount_micros),
        (C.c.kind == CreditKind.CHARGE.value, -C.c.amount_micros),
        else_=0,
    )
    mine = and_(C.c.tenant_id == tenant_id, C.c.currency == currency)
    row = (
        await conn.execute(
            select(func.coalesce(func.sum(effect), 0), func.coalesce(func.max(C.c.id), 0)).where(
                mine
            )
        )
    ).one()
    settled = C.alias("settled")
    reserved = await conn.scalar(
        select(func.coalesce(func.sum(C.c.amount_micros), 0)).where(
            mine,
            C.c.kind == CreditKind.RESERVE.value,
            ~exists().where(settled.c.task_id == C.c.task_id, settled.c.kind.in_(_SETTLE_KINDS)),
        )
    )
    total, as_of = int(row[0]), int(row[1])
    held = int(reserved or 0)
    return Balance(tenant_id, currency, total, held, total - held, as_of)


async def list_entries(
    conn: AsyncConnection,
    tenant_id: str,
    after_id: int = 0,
    limit: int = 100,
    *,
    task_id: int | None = None,
    start: datetime | None = None,
    end: datetime | None = None,
) -> list[CreditEntry]:
    """The tenant's entries with ``id > after_id`` (of `task_id`, written in ``[start, end)``
    when given), oldest first, at most `limit`."""
    query = select(C).where(C.c.tenant_id == tenant_id, C.c.id > after_id)
    if task_id is not None:
        query = query.where(C.c.task_id == task_id)
    if start is not None:
        query = query.where(C.c.created_at >= start)
    if end is not None:
        query = query.where(C.c.created_at < end)
    rows = await conn.execute(query.order_by(C.c.id).limit(max(0, limit)))
    return [_credit(m) for m in rows.mappings()]


async def reservation_of(conn: AsyncConnection, task_id: int) -> CreditEntry | None:
    return await _one_entry(conn, C.c.task_id == task_id, C.c.kind == CreditKind.RESERVE.value)


async def settlement_of(conn: AsyncConnection, task_id: int) -> CreditEntry | None:
    return await _one_entry(conn, C.c.task_id == task_id, C.c.kind.in_(_SETTLE_KINDS))


async def _one_entry(conn: AsyncConnection, *where: Any) -> CreditEntry | None:
    found = (await conn.execute(select(C).where(*where))).mappings().first()
    return None if found is None else _credit(found)


def _usage_query() -> Select[Any]:
    return select(U).order_by(U.c.id)


async def usage_entries_between(
    conn: AsyncConnection, start: datetime, end: datetime, provider: str | None = None
) -> list[ProviderUsageEntry]:
    """Provider usage entries created in ``[start, end)``, optionally of one provider."""
    query = _usage_query().where(U.c.created_at >= start, U.c.created_at < end)
    if provider is not None:
        query = query.where(U.c.provider == provider)
    return [_usage(m) for m in (await conn.execute(query)).mappings()]


async def usage_of_task(conn: AsyncConnection, task_id: int) -> list[ProviderUsageEntry]:
    rows = await conn.execute(_usage_query().where(U.c.task_id == task_id))
    return [_usage(m) for m in rows.mappings()]


async def unit_rate(
    conn: AsyncConnection, provider: str, unit_name: str, at: datetime
) -> UnitRate | None:
    """The rate of `unit_name` effective at `at` (the latest effective_from wins)."""
    found = (
        (
            await conn.execute(
                select(R)
                .where(
                    R.c.provider == provider,
                    R.c.unit_name == unit_name,
                    R.c.effective_from <= at,
                    (R.c.effective_to.is_(None)) | (R.c.effective_to > at),
                )
                .order_by(R.c.effective_from.desc(), R.c.id.desc())
                .limit(1)
            )
        )
        .mappings()
        .first()
    )
    return None if found is None else _rate(found)


async def rate_version(conn: AsyncConnection, provider: str, version: str) -> UnitRate | None:
    """The provider's conversion rate stored under `version` (publication names it after the
    price version it came with), whatever its unit."""
    found = (
        (
            await conn.execute(
                select(R)
                .where(R.c.provider == provider, R.c.rate_version == version)
                .order_by(R.c.id)
                .limit(1)
            )
        )
        .mappings()
        .first()
    )
    return None if found is None else _rate(found)


async def _account_for(
    conn: AsyncConnection,
    entry_ids: Sequence[int],
    tenant_id: str,
    currency: str,
    *,
    d_balance: int,
    now: datetime,
) -> None:
    """Fold the CREDIT / CHARGE / REFUND entries just written (`entry_ids`, of one tenant and
    currency, `d_balance` their sum) into the tenant's cached balance, in their transaction.
    The row is locked (PostgreSQL), so concurrent writers apply one at a time; a cache that
    misses an entry (none yet, or a writer that bypassed this module) is rebuilt from the
    entries instead of being moved by the delta. Several entries at once leave the row as one
    call per entry would: each call's check passes once the first's has (its entry is then the
    newest but the next), and a rebuild sums every entry written so far either way."""
    mine = and_(B.c.tenant_id == tenant_id, B.c.currency == currency)
    row = (await conn.execute(select(B).where(mine).with_for_update())).mappings().first()
    if row is not None and row["last_entry_id"] == await _newest_id(
        conn, tenant_id, currency, besides=entry_ids
    ):
        newest = max(row["last_entry_id"], *entry_ids)
        await conn.execute(
            update(B)
            .where(mine)
            .values(
                balance_micros=B.c.balance_micros + d_balance,
                last_entry_id=newest,
                updated_at=now,
            )
        )
        return
    truth = await derived_balance(conn, tenant_id, currency)
    values = {
        "balance_micros": truth.balance_micros,
        "last_entry_id": await _newest_id(conn, tenant_id, currency),
        "updated_at": now,
    }
    if row is None:
        await conn.execute(
            _insert_once(conn, B, ["tenant_id", "currency"]).values(
                tenant_id=tenant_id, currency=currency, **values
            )
        )
    else:
        await conn.execute(update(B).where(mine).values(**values))


# ---- writes --------------------------------------------------------------------------------


def _insert_once(conn: AsyncConnection, table: Any, keys: list[str]) -> Any:
    """An INSERT that does nothing when the row's idempotency key already exists."""
    dialect = postgresql if conn.dialect.name == "postgresql" else sqlite
    return dialect.insert(table).on_conflict_do_nothing(index_elements=keys)


async def lock_tenant(conn: AsyncConnection, tenant_id: str) -> None:
    """Serialise this transaction's reserve with every other one of the tenant's.

    PostgreSQL: a transaction-scoped advisory lock on a hash of the tenant; SQLite's
    ``BEGIN IMMEDIATE`` already serialises writers."""
    await xact_lock(conn, f"credit:{tenant_id}")


async def check_and_lock(
    conn: AsyncConnection, tenant_id: str, reservation: Reservation
) -> Balance | None:
    """Lock the tenant and raise `InsufficientCredit` unless its policy allows `reservation`.

    A policy without a floor (postpaid, unlimited) allows everything: no lock, no read, and
    the returned balance is None."""
    if reservation.policy.floor_micros() is None:
        return None
    await lock_tenant(conn, tenant_id)
    current = await balance(conn, tenant_id, reservation.currency)
    check_reserve(
        tenant_id,
        reservation.policy,
        balance_micros=current.balance_micros,
        available_micros=current.available_micros,
        amount_micros=reservation.amount_micros,
        currency=reservation.currency,
    )
    return current


async def reserve(
    conn: AsyncConnection,
    task_id: int,
    tenant_id: str,
    reservation: Reservation,
    now: datetime,
    *,
    reason: str = "",
) -> CreditEntry:
    """The task's one RESERVE entry (call `check_and_lock` first, in the same transaction).

    It does not touch the cached balance row: a tenant's CreateTasks do not queue on it."""
    await conn.scalar(
        _insert_once(conn, C, ["tenant_id", "idempotency_key"])
        .values(
            tenant_id=tenant_id,
            kind=CreditKind.RESERVE.value,
            amount_micros=reservation.amount_micros,
            currency=reservation.currency,
            task_id=task_id,
            idempotency_key=f"reserve:{task_id}",
            actor=SYSTEM_ACTOR,
            reason=reason or f"estimate ({reservation.policy.describe()})",
            created_at=now,
        )
        .returning(C.c.id)
    )
    stored = await reservation_of(conn, task_id)
    assert stored is not None
    return stored


async def append_credit(  # noqa: PLR0917 (the positional signature of the money schema contract)
    conn: AsyncConnection,
    tenant_id: str,
    amount_micros: int,
    currency: str,
    idempotency_key: str,
    actor: str,
    reason: str,
    now: datetime,
) -> tuple[CreditEntry, bool]:
    """A CREDIT entry, once per (tenant, key): ``(entry, created)`` (module docstring)."""
    if amount_micros < 0:
        raise ValueError("a credit is never negative")
    inserted = (
        (
            await conn.execute(
                _insert_once(conn, C, ["tenant_id", "idempotency_key"])
                .values(
                    tenant_id=tenant_id,
                    kind=CreditKind.CREDIT.value,
                    amount_micros=amount_micros,
                    currency=currency,
                    idempotency_key=idempotency_key,
                    actor=actor,
                    reason=reason,
                    created_at=now,
                )
                .returning(C)
            )
        )
        .mappings()
        .first()
    )
    if inserted is not None:
        entry = _credit(inserted)
        await _account_for(conn, [entry.id], tenant_id, currency, d_balance=amount_micros, now=now)
        return entry, True
    stored = await _one_entry(
        conn, C.c.tenant_id == tenant_id, C.c.idempotency_key == idempotency_key
    )
    assert stored is not None
    if (
        stored.kind is not CreditKind.CREDIT
        or stored.amount_micros != amount_micros
        or stored.currency != currency
    ):
        raise CreditKeyConflict(idempotency_key, stored)
    return stored, False


async def record_usage(conn: AsyncConnection, usage: NewUsage, now: datetime) -> bool:
    """Write a provider usage entry once per idempotency key; True if this call wrote it."""
    return await record_usages(conn, [usage], now) == 1


async def record_usages(conn: AsyncConnection, usages: Sequence[NewUsage], now: datetime) -> int:
    """`record_usage` for many in ONE statement (an entry whose key is stored, or comes earlier
    in `usages`, is not written); how many were written."""
    if not usages:
        return 0
    rows = [
        {
            "attempt_id": usage.attempt_id,
            "task_id": usage.task_id,
            "provider": usage.provider,
            "provider_account_id": usage.provider_account_id,
            "model": usage.model,
            "provider_job_id": usage.provider_job_id,
            "kind": usage.kind.value,
            "amount_micros": max(0, usage.amount_micros),
            "currency": usage.currency,
            "provider_units": usage.provider_units,
            "provider_unit_name": usage.provider_unit_name,
            "price_version": usage.price_version,
            "conversion_rate_version": usage.conversion_rate_version,
            "evidence": dict(usage.evidence),
            "idempotency_key": usage.idempotency_key,
            "created_at": now,
        }
        for usage in usages
    ]
    inserted = await conn.execute(
        _insert_once(conn, U, ["idempotency_key"]).values(rows).returning(U.c.id)
    )
    return len(inserted.all())


async def put_unit_rate(conn: AsyncConnection, rate: UnitRate) -> bool:
    """Store a conversion rate version once (an existing version is never changed)."""
    inserted = (
        await conn.execute(
            _insert_once(conn, R, ["provider", "unit_name", "rate_version"])
            .values(
                provider=rate.provider,
                unit_name=rate.unit_name,
                rate_version=rate.rate_version,
                micros_per_unit=rate.micros_per_unit,
                unit_divisor=rate.unit_divisor,
                currency=rate.currency,
                effective_from=rate.effective_from,
                effective_to=rate.effective_to,
            )
            .returning(R.c.id)
        )
    ).first()
    return inserted is not None


@dataclass(frozen=True, slots=True)
class Settle:
    """A task entering terminal `target`, to be settled in that move's transaction.

    `adopted`: the task's ``adopted_attempt_id`` as the move that ended it wrote it (a 1-tuple,
    so None can be told from "not known"); not known, it is read."""

    task_id: int
    target: TaskState
    adopted: tuple[int | None] | None = None


async def settle_task(
    conn: AsyncConnection,
    task_id: int,
    target: TaskState,
    now: datetime,
    *,
    adopted: tuple[int | None] | None = None,
) -> CreditEntry | None:
    """Settle one task entering terminal `target` (`settle_tasks` of one): its settlement entry."""
    settled = await settle_tasks(conn, [Settle(task_id, target, adopted)], now)
    return settled.get(task_id)


async def settle_tasks(
    conn: AsyncConnection, items: Sequence[Settle], now: datetime
) -> dict[int, CreditEntry | None]:
    """Settle tasks entering terminal states, in the transaction of those moves.

    Each task gets its one CHARGE or RELEASE entry (`controlplane.domain.money.settle`) and a
    PLATFORM_LOSS usage entry per other attempt a provider billed or may have billed
    (`platform_losses`). A task without a reservation (created before the ledger) settles
    nothing; a settled one is left as it is. Returns each task's settlement entry.

    Set-based whatever the number of tasks: the reservations, the adopted attempts not given
    and the attempts are read in one statement each, the entries written in one INSERT, and
    each (tenant, currency)'s cached balance moved once by the sum of its CHARGEs (`_account_for`
    with all of them, which leaves the row as one call per entry would), and the platform-loss
    entries of all of them in one more INSERT. One task is `settle_task`; the two are compared row
    for row by tests/integration/execution/test_output_batches.py."""
    ids = [s.task_id for s in items]
    if len(set(ids)) != len(ids):
        raise ValueError("a task is settled once per call")
    held, attempts = await _reservations_and_attempts(conn, ids)
    out: dict[int, CreditEntry | None] = dict.fromkeys(ids)
    unheld = [i for i in ids if i not in held]
    if unheld:
        out.update(await _entries_of(conn, unheld, *_SETTLE_KINDS))
    todo = [s for s in items if s.task_id in held]
    if not todo:
        return out
    adopted = {s.task_id: s.adopted[0] for s in todo if s.adopted is not None}
    unknown = [s.task_id for s in todo if s.adopted is None]
    if unknown:
        found = await conn.execute(
            select(T.c.id, T.c.adopted_attempt_id).where(T.c.id.in_(unknown))
        )
        adopted.update({int(t): a for t, a in found})
    plans = [
        _settlement(s, held[s.task_id], adopted.get(s.task_id), attempts.get(s.task_id, []))
        for s in todo
    ]
    written = await _insert_settlements(conn, plans, now)
    raced = [p.item.task_id for p in plans if p.item.task_id not in written]
    if raced:  # settled already (a racing writer)
        out.update(await _entries_of(conn, raced, *_SETTLE_KINDS))
    charges: dict[tuple[str, str], list[CreditEntry]] = {}
    for p in plans:
        entry = written.get(p.item.task_id)
        if entry is None:
            continue
        out[p.item.task_id] = entry
        if entry.kind is CreditKind.CHARGE:  # a RELEASE changes no balance, only the hold
            charges.setdefault((entry.tenant_id, entry.currency), []).append(entry)
    for (tenant_id, currency), entries in sorted(charges.items()):
        await _account_for(
            conn,
            [e.id for e in entries],
            tenant_id,
            currency,
            d_balance=-sum(e.amount_micros for e in entries),
            now=now,
        )
    losses = [usage for p in plans if p.item.task_id in written for usage in _losses(p)]
    await record_usages(conn, losses, now)
    return out


@dataclass(frozen=True, slots=True)
class _Plan:
    """A task's settlement as decided from its reservation and attempts (`settle_tasks`)."""

    item: Settle
    held: CreditEntry
    outcome: Settlement
    rows: list[RowMapping]
    delivered: RowMapping | None
    cost: int | None


def _settlement(
    item: Settle, held: CreditEntry, adopted: int | None, rows: list[RowMapping]
) -> _Plan:
    delivered_id = adopted if item.target is TaskState.SUCCEEDED else None
    delivered = next((r for r in rows if r["id"] == delivered_id), None)
    cost = None
    if delivered is not None:
        actual = delivered["actual_cost_micros"]
        cost = actual if actual is not None else delivered["estimated_cost_micros"]
    outcome = settle(
        item.target,
        held.amount_micros,
        delivered_attempt_id=delivered["id"] if delivered is not None else None,
        delivered_cost_micros=cost,
    )
    return _Plan(item, held, outcome, rows, delivered, cost)


async def _reservations_and_attempts(
    conn: AsyncConnection, task_ids: Sequence[int]
) -> tuple[dict[int, CreditEntry], dict[int, list[RowMapping]]]:
    """The reserved tasks' RESERVE entries and their attempts (each with its job id and
    provider, in attempt order), by task, in ONE statement: the reservation outer-joined to the
    attempts, so a task with none still has its entry."""
    parts = [c.label(f"c__{c.name}") for c in C.c] + [c.label(f"a__{c.name}") for c in A.c]
    attempts = A.join(PA, PA.c.id == A.c.provider_account_id).outerjoin(J, J.c.attempt_id == A.c.id)
    query = (
        select(
            *parts,
            J.c.provider_job_id.label("a__provider_job_id"),
            PA.c.provider.label("a__provider"),
        )
        .select_from(C.outerjoin(attempts, A.c.task_id == C.c.task_id))
        .where(C.c.task_id.in_(task_ids), C.c.kind == CreditKind.RESERVE.value)
        .order_by(C.c.task_id, A.c.attempt_no)
    )
    held: dict[int, CreditEntry] = {}
    by_task: dict[int, list[RowMapping]] = {}
    for m in (await conn.execute(query)).mappings():
        task_id = int(m["c__task_id"])
        held.setdefault(task_id, _credit(_part(m, "c__")))
        if m["a__id"] is not None:
            by_task.setdefault(task_id, []).append(_part(m, "a__"))
    return held, by_task


def _part(m: RowMapping, prefix: str) -> RowMapping:
    """The columns of one table of a joined row, by their own names."""
    return cast(RowMapping, {k[len(prefix) :]: v for k, v in m.items() if k.startswith(prefix)})


async def _entries_of(
    conn: AsyncConnection, task_ids: Sequence[int], *kinds: str
) -> dict[int, CreditEntry]:
    """The tasks' entries of `kinds` by task (a task has at most one reservation and one
    settlement: revision 0006's partial UNIQUE indexes)."""
    found = await conn.execute(select(C).where(C.c.task_id.in_(task_ids), C.c.kind.in_(kinds)))
    return {int(m["task_id"]): _credit(m) for m in found.mappings()}


async def _insert_settlements(
    conn: AsyncConnection, plans: Sequence[_Plan], now: datetime
) -> dict[int, CreditEntry]:
    """The plans' entries in one INSERT, each once per its key: the written ones, by task."""
    values = [
        {
            "tenant_id": p.held.tenant_id,
            "kind": p.outcome.kind.value,
            "amount_micros": p.outcome.amount_micros,
            "currency": p.held.currency,
            "task_id": p.item.task_id,
            "attempt_id": p.outcome.attempt_id,
            "idempotency_key": f"settle:{p.item.task_id}",
            "actor": SYSTEM_ACTOR,
            "reason": f"task {p.item.target.value}: {p.outcome.reason}",
            "created_at": now,
        }
        for p in plans
    ]
    rows = await conn.execute(
        _insert_once(conn, C, ["tenant_id", "idempotency_key"]).values(values).returning(C)
    )
    # the entries as written (RETURNING), not read again
    return {int(m["task_id"]): _credit(m) for m in rows.mappings()}


def _losses(p: _Plan) -> list[NewUsage]:
    """The PLATFORM_LOSS entries of a settled task: each other attempt a provider billed or may
    have billed, and the delivered attempt's cost beyond its charge."""
    target, outcome, held, delivered, cost = p.item.target, p.outcome, p.held, p.delivered, p.cost
    bills = [
        AttemptBill(
            attempt_id=r["id"],
            state=AttemptState(r["status"]),
            estimated_cost_micros=r["estimated_cost_micros"],
            actual_cost_micros=r["actual_cost_micros"],
            provider_job_id=r["provider_job_id"],
        )
        for r in p.rows
    ]
    by_id = {r["id"]: r for r in p.rows}
    out: list[NewUsage] = []
    for loss in platform_losses(bills, outcome.attempt_id):
        r = by_id[loss.attempt_id]
        out.append(
            NewUsage(
                attempt_id=r["id"],
                task_id=p.item.task_id,
                provider=r["provider"],
                provider_account_id=r["provider_account_id"],
                model=r["provider_model"],
                kind=UsageKind.PLATFORM_LOSS,
                amount_micros=loss.amount_micros,
                currency=r["currency"],
                price_version=r["price_version"],
                idempotency_key=f"loss:{r['id']}",
                provider_job_id=r["provider_job_id"],
                evidence={
                    "cause": loss.cause.value,
                    "task_state": target.value,
                    "attempt_state": r["status"],
                    "delivered_attempt_id": outcome.attempt_id,
                    "client_request_key": r["client_request_key"],
                    "amount_is_actual": loss.actual,
                    "transport_error_stage": r["transport_error_stage"],
                },
            ),
        )
    if delivered is not None and cost is not None and outcome.kind is CreditKind.CHARGE:
        short = underpriced_loss(cost, outcome.amount_micros)
        if short > 0:
            out.append(
                NewUsage(
                    attempt_id=delivered["id"],
                    task_id=p.item.task_id,
                    provider=delivered["provider"],
                    provider_account_id=delivered["provider_account_id"],
                    model=delivered["provider_model"],
                    kind=UsageKind.PLATFORM_LOSS,
                    amount_micros=short,
                    currency=delivered["currency"],
                    price_version=delivered["price_version"],
                    idempotency_key=f"underpriced:{delivered['id']}",
                    provider_job_id=delivered["provider_job_id"],
                    evidence={
                        "cause": LossCause.UNDERPRICED.value,
                        "cost_micros": cost,
                        "charged_micros": outcome.amount_micros,
                        "reserved_micros": held.amount_micros,
                        "amount_is_actual": delivered["actual_cost_micros"] is not None,
                    },
                ),
            )
    return out
